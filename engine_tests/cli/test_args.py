"""The command line's argument types, in-process, and the rate round trip through the CLI."""

from __future__ import annotations

import argparse
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from engine.cli.args import (
    MAX_SUBMIT_COUNT,
    before_arg,
    count_arg,
    format_interval,
    join_dash_values,
    payload_arg,
    rate_arg,
)
from engine.cli.main import build_parser

from .conftest import Cli


@pytest.mark.parametrize(
    ("limit", "interval"),
    [(10, 1.0), (30, 60.0), (30, 0.5), (5, 2.0), (7, 0.001), (1, 1234567.0), (3, 31622400.0),
     (9, 0.1), (2, 86400.0), (4, 1.25)],
)  # fmt: skip
def test_a_rate_as_printed_reads_back_as_the_same_rate(limit: int, interval: float) -> None:
    printed = f"{limit}/{format_interval(interval)}s"  # what `models list` prints
    assert "e" not in printed  # no exponent: 1234567 s is not 1.23457e+06
    assert rate_arg(printed) == (limit, interval)
    assert rate_arg(printed.removesuffix("s")) == (limit, interval)


def test_a_negative_rate_is_a_usage_error_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    for bad in (["--rate", "-1/1"], ["--rate=-1/1"], ["--rate", "-1"], ["--rate", "10/-1"]):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(join_dash_values(["models", "set", "m", *bad]))
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "argument --rate: expected N/S" in err, (bad, err)
        assert "expected one argument" not in err
    # Another option after --rate is still an option.
    assert join_dash_values(["--rate", "--no-rate"]) == ["--rate", "--no-rate"]
    assert join_dash_values(["--rate", "-1/1", "x"]) == ["--rate=-1/1", "x"]


def test_count_is_capped_with_a_message_naming_the_cap() -> None:
    assert count_arg("1") == 1 and count_arg(str(MAX_SUBMIT_COUNT)) == MAX_SUBMIT_COUNT
    for bad in (str(MAX_SUBMIT_COUNT + 1), "0", "-3"):
        with pytest.raises(argparse.ArgumentTypeError, match="from 1 to 1,000,000"):
            count_arg(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="positive integer"):
        count_arg("ten")


def test_payload_from_text_a_file_or_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert payload_arg('{"a": 1}') == {"a": 1}
    assert payload_arg("-1") == -1  # JSON, not stdin
    path = tmp_path / "p.json"
    path.write_text('{"prompt": "a cat"}', encoding="utf-8")
    assert payload_arg(f"@{path}") == {"prompt": "a cat"}
    with pytest.raises(argparse.ArgumentTypeError, match="cannot read"):
        payload_arg(f"@{tmp_path / 'missing.json'}")
    path.write_text("{nope", encoding="utf-8")
    with pytest.raises(argparse.ArgumentTypeError, match=f"not valid JSON .*from {path}"):
        payload_arg(f"@{path}")

    import io

    monkeypatch.setattr("sys.stdin", io.StringIO('["x"]'))
    assert payload_arg("-") == ["x"]


def test_before_is_a_task_id_or_a_timestamp() -> None:
    task_id = uuid.uuid4()
    assert before_arg(str(task_id)) == task_id
    assert before_arg("2026-12-01T10:00:00Z") == datetime(2026, 12, 1, 10, tzinfo=UTC)
    local = before_arg("2026-12-01T10:00:00")
    assert isinstance(local, datetime) and local.tzinfo is not None
    with pytest.raises(argparse.ArgumentTypeError, match="task id or an ISO 8601"):
        before_arg("yesterday")


async def test_models_list_rates_are_accepted_by_rate_as_printed(cli: Cli) -> None:
    for n, rate in enumerate(["10/1", "30/0.5", "7/0.001", "1/1234567", "4/1.25"]):
        (await cli("models", "set", f"m{n}", "--rate", rate)).ok()
    table = (await cli("models", "list")).ok()
    printed = re.findall(r"^(m\d)\s+yes\s+unlimited\s+(\S+)\s", table, re.MULTILINE)
    assert len(printed) == 5, table
    before = (await cli("models", "list", "--json")).json()["models"]
    for name, rate in printed:
        # Set each model's rate to what the table printed: nothing changes.
        (await cli("models", "set", name, "--rate", rate)).ok()
    after = (await cli("models", "list", "--json")).json()["models"]
    assert [(m["rate_limit"], m["rate_interval"]) for m in after] == [
        (m["rate_limit"], m["rate_interval"]) for m in before
    ]
    assert [(m["rate_limit"], m["rate_interval"]) for m in after] == [
        (10, 1.0), (30, 0.5), (7, 0.001), (1, 1234567.0), (4, 1.25)
    ]  # fmt: skip
    err = (await cli("models", "set", "m0", "--rate", "-1/1")).error(2)
    assert "argument --rate: expected N/S" in err and "expected one argument" not in err
