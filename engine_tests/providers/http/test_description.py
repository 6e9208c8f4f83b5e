"""HTTP model descriptions: built in Python, read from [[http_models]] TOML tables, checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ConfigError
from engine.providers.http.description import (
    HttpModel,
    HttpRequestSpec,
    StatusKind,
    http_models_from_tables,
    load_http_models,
)
from engine.providers.http.provider import HttpProvider, open_http_providers
from engine.providers.http.template import TemplateContext, render
from engine.testing.factories import make_task

TOML = """
[[http_models]]
model = "acme-video"
poll_interval = 10
idempotency_header = "Idempotency-Key"
id_path = "job.id"
progress_path = "progress"
result_path = "output"
error_path = "error.message"
status_map = { queued = "pending", done = "succeeded", error = "failed" }

[http_models.submit]
url = "https://api.acme.example/v1/jobs"
headers = { Authorization = "Bearer {{ env.ACME_API_KEY }}" }
body = { prompt = "{{ payload.prompt }}", seconds = "{{ payload.seconds }}" }

[http_models.poll]
method = "get"
url = "https://api.acme.example/v1/jobs/{{ upstream_id }}"
timeout = 5
"""


def test_a_toml_file_describes_models(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(TOML)
    [model] = load_http_models(path)
    assert model == HttpModel(
        model="acme-video",
        poll_interval=10,
        idempotency_header="Idempotency-Key",
        id_path="job.id",
        progress_path="progress",
        result_path="output",
        error_path="error.message",
        status_map={"queued": "pending", "done": "succeeded", "error": "failed"},
        submit=HttpRequestSpec(
            url="https://api.acme.example/v1/jobs",
            headers={"Authorization": "Bearer {{ env.ACME_API_KEY }}"},
            body={"prompt": "{{ payload.prompt }}", "seconds": "{{ payload.seconds }}"},
        ),
        poll=HttpRequestSpec(
            url="https://api.acme.example/v1/jobs/{{ upstream_id }}", method="GET", timeout=5
        ),
    )
    assert model.idempotent  # an idempotency header makes it so
    assert model.status_map["done"] is StatusKind.SUCCEEDED
    assert model.env_names() == {"ACME_API_KEY"}


def test_every_problem_is_named_with_its_table_and_key() -> None:
    tables = [
        {"model": "a", "submit": {"url": "http://u/jobs"}, "poll": {"url": "http://u/x"}},
        {"model": "b", "submit": {"url": "http://u/{{ upstream_id }}"}, "poll": {"url": "x"}},
        {"model": "c", "sumbit": {}, "poll_interval": "soon", "status_map": {"x": "maybe"}},
        {
            "model": "d",
            "submit": {"url": "http://u", "method": "BREW", "body": "{{ secrets.key }}"},
            "poll": {"url": "http://u/{{ upstream_id }}"},
        },
    ]
    models, problems = http_models_from_tables(tables, "from t.toml")
    assert models == []
    assert problems == [
        "http_models[0] (a).poll: the URL, headers or body must use {{ upstream_id }} "
        "(from t.toml)",
        "http_models[1] (b).submit: {{ upstream_id }} is known only after the submit (from t.toml)",
        "http_models[1] (b).poll: the URL, headers or body must use {{ upstream_id }} "
        "(from t.toml)",
        "http_models[2] (c).sumbit: unknown key (from t.toml)",
        "http_models[2] (c).submit: must be set (from t.toml)",
        "http_models[2] (c).poll: must be set (from t.toml)",
        "http_models[2] (c).poll_interval: must be a number (from t.toml)",
        "http_models[2] (c).status_map: a table of status = pending|succeeded|failed (from t.toml)",
        "http_models[3] (d).submit.method = 'BREW': one of "
        "['DELETE', 'GET', 'PATCH', 'POST', 'PUT'] (from t.toml)",
        "http_models[3] (d).submit: unknown template value {{ secrets.key }} (from t.toml)",
    ]


def test_duplicates_and_unknown_top_level_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text("x = 1\n" + TOML + TOML)  # a top-level key must come before any table
    with pytest.raises(ConfigError) as raised:
        load_http_models(path)
    assert raised.value.problems == [
        f"http_models: model 'acme-video' is described twice (from {path})",
        f"x (from {path}): unknown key",
    ]


def test_a_missing_secret_stops_the_start_not_a_task() -> None:
    model = HttpModel(
        model="m",
        submit=HttpRequestSpec(url="http://u/jobs", headers={"X-Key": "{{ env.NOT_SET_KEY }}"}),
        poll=HttpRequestSpec(url="http://u/jobs/{{ upstream_id }}", method="GET"),
    )
    with pytest.raises(ConfigError, match="environment variable NOT_SET_KEY is not set"):
        HttpProvider(model, environ={})


async def test_open_http_providers_reports_every_models_problems() -> None:
    bad = HttpModel(
        model="m",
        submit=HttpRequestSpec(url="http://u/jobs"),
        poll=HttpRequestSpec(url="http://u/jobs", method="GET"),
        poll_interval=-1,
    )
    with pytest.raises(ConfigError) as raised:
        async with open_http_providers([bad, bad], environ={}):
            pass  # pragma: no cover
    assert raised.value.problems == [
        "http model 'm': described twice",
        "http model 'm': poll: the URL, headers or body must use {{ upstream_id }}",
        "http model 'm': poll_interval: must be >= 0",
        "http model 'm': poll: the URL, headers or body must use {{ upstream_id }}",
        "http model 'm': poll_interval: must be >= 0",
    ]


def test_templates_keep_json_types_whole_and_write_text_inside_strings() -> None:
    task = make_task(payload={"n": 3, "tags": ["a"], "nested": {"k": "v"}})
    context = TemplateContext(task, upstream_id="job-9", environ={"TOKEN": "t"})
    template = {
        "n": "{{ payload.n }}",
        "tags": "{{payload.tags}}",
        "first_tag": "{{ payload.tags.0 }}",
        "text": "n={{ payload.n }} k={{ payload.nested.k }} {{{{ literal }}",
        "ids": ["{{ task.id }}", "{{ upstream_id }}", "{{ idempotency_key }}"],
        "auth": "Bearer {{ env.TOKEN }}",
        "kept": 1.5,
    }
    assert render(template, context) == {
        "n": 3,
        "tags": ["a"],
        "first_tag": "a",
        "text": "n=3 k=v {{ literal }}",
        "ids": [str(task.id), "job-9", str(task.id)],
        "auth": "Bearer t",
        "kept": 1.5,
    }
