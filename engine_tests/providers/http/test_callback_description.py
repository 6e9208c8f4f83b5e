"""The callback section of an HTTP model, and HttpProvider.parse_callback, without a server."""

from __future__ import annotations

import json

import pytest

from engine.errors import ConfigError
from engine.providers.base import CallbackRefused, callback_poll_interval
from engine.providers.http.description import HttpCallback, http_model_from_table
from engine.providers.http.fake import fake_http_model
from engine.providers.http.provider import HttpProvider
from engine.providers.http.signing import delivery_key, sign

NOW = 1_800_000_000.0
ENVIRON = {"HOOK_SECRET": "s"}


def provider(**callback: object) -> HttpProvider:
    section = HttpCallback(secret_env="HOOK_SECRET", **callback)  # type: ignore[arg-type]
    return HttpProvider(
        fake_http_model("http://upstream.invalid", callback=section), environ=ENVIRON
    )


def headers(body: bytes, *, at: float = NOW, secret: str = "s", prefix: str = "") -> dict[str, str]:
    stamp = str(int(at))
    return {"X-Webhook-Timestamp": stamp, "X-Webhook-Signature": prefix + sign(secret, stamp, body)}


def test_a_callback_section_from_toml() -> None:
    table = {
        "model": "m",
        "submit": {"url": "https://x.invalid/jobs", "body": {"hook": "{{ callback_url }}"}},
        "poll": {"url": "https://x.invalid/jobs/{{ upstream_id }}", "method": "GET"},
        "callback": {"secret_env": "HOOK_SECRET", "poll_interval": 90, "base_url": "{{ env.URL }}"},
    }
    model, problems = http_model_from_table(table, "http_models[0]")
    assert problems == [] and model is not None
    assert model.callback == HttpCallback(
        secret_env="HOOK_SECRET", poll_interval=90, base_url="{{ env.URL }}"
    )
    assert model.env_names() == {"HOOK_SECRET", "URL"}


def test_callback_problems_are_reported() -> None:
    table = {
        "model": "m",
        "submit": {"url": "https://x.invalid/jobs", "body": {"hook": "{{ callback_url }}"}},
        "poll": {"url": "https://x.invalid/jobs/{{ upstream_id }}", "method": "GET"},
    }
    _, problems = http_model_from_table(table, "w")
    assert any("callback_url" in p and "callback section" in p for p in problems)
    bad = {**table, "callback": {"tolerance": 0, "base_url": "{{ payload.x }}", "extra": 1}}
    _, problems = http_model_from_table(bad, "w")
    assert "w.callback.extra: unknown key" in problems
    assert "w.callback.secret_env: must be set" in problems
    with pytest.raises(ConfigError, match="HOOK_SECRET is not set"):
        HttpProvider(
            fake_http_model("http://u.invalid", callback=HttpCallback(secret_env="HOOK_SECRET")),
            environ={},
        )


def test_parse_callback_reads_a_signed_body() -> None:
    hook = provider()
    assert callback_poll_interval(hook) == 60.0
    body = json.dumps({"id": "job-7", "status": "succeeded", "result": {"x": 1}}).encode()
    callback = hook.parse_callback(headers(body, prefix="sha256="), body, now=NOW)
    assert callback.result.done and callback.result.result == {"x": 1}
    assert callback.upstream_id == "job-7"
    assert callback.delivery == delivery_key(headers(body)["X-Webhook-Signature"])
    pending = json.dumps({"id": "job-7", "status": "running", "progress": 0.25}).encode()
    assert hook.parse_callback(headers(pending), pending, now=NOW).result.progress == 0.25


@pytest.mark.parametrize(
    ("body", "sent", "now", "status", "reason"),
    [
        (b'{"status": "succeeded"}', {"secret": "wrong"}, NOW, 401, "bad signature"),
        (b'{"status": "succeeded"}', {}, NOW + 301, 401, "stale timestamp"),
        (b'{"status": "succeeded"}', {}, NOW - 301, 401, "timestamp in the future"),
        (b"not json", {}, NOW, 400, "not JSON"),
        (b'{"status": "weird"}', {}, NOW, 400, "unknown upstream status"),
    ],
)
def test_parse_callback_refuses(
    body: bytes, sent: dict[str, str], now: float, status: int, reason: str
) -> None:
    with pytest.raises(CallbackRefused, match=reason) as refused:
        provider().parse_callback(headers(body, **sent), body, now=now)  # type: ignore[arg-type]
    assert refused.value.status == status


def test_a_model_without_callbacks_takes_none() -> None:
    plain = HttpProvider(fake_http_model("http://upstream.invalid"))
    assert callback_poll_interval(plain) is None
    with pytest.raises(CallbackRefused) as refused:
        plain.parse_callback({}, b"{}")
    assert refused.value.status == 404
