"""The documentation cannot drift from the code.

- ``docs/configuration.md`` is exactly what ``python -m engine.cli.docs`` prints, and names every
  setting and its environment variable;
- the README's library example and docs/queue.md's queue program run, against a real database,
  and print what they promise;
- the README lists every command of ``python -m engine``;
- relative links in the README and ``docs/`` point at files (and headings) that exist.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import trio

from engine.cli.docs import configuration_markdown
from engine.cli.main import build_parser
from engine.config import FieldInfo, iter_fields

ROOT = Path(__file__).resolve().parent.parent
CONFIGURATION = ROOT / "docs" / "configuration.md"
README = ROOT / "README.md"
MARKDOWN = [README, *sorted((ROOT / "docs").glob("*.md"))]

_FIELDS = list(iter_fields())


def _configuration_text() -> str:
    return CONFIGURATION.read_text(encoding="utf-8")


@pytest.mark.parametrize("field", _FIELDS, ids=[f.name for f in _FIELDS])
def test_every_setting_is_in_the_configuration_reference(field: FieldInfo) -> None:
    text = _configuration_text()
    assert f"`{field.name}`" in text, (
        f"{field.name} is missing from docs/configuration.md; "
        "regenerate it: python -m engine.cli.docs > docs/configuration.md"
    )
    assert f"`{field.env_var}`" in text, (
        f"{field.env_var} is missing from docs/configuration.md; "
        "regenerate it: python -m engine.cli.docs > docs/configuration.md"
    )


def test_configuration_reference_is_the_generated_text() -> None:
    assert _configuration_text() == configuration_markdown(), (
        "docs/configuration.md is stale; regenerate it: "
        "python -m engine.cli.docs > docs/configuration.md"
    )


def test_docs_module_prints_the_configuration_reference() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "engine.cli.docs"],
        capture_output=True,
        check=True,
        cwd=ROOT,
        timeout=60,
    ).stdout
    assert out.decode("utf-8") == configuration_markdown()


def _block(page: Path, heading: str, language: str = "python") -> str:
    """The first ``language`` code block under ``heading`` (a whole heading line) of ``page``."""
    text = page.read_text(encoding="utf-8")
    assert f"\n{heading}\n" in text, f"{page.name} has no heading {heading!r}"
    section = text.split(f"\n{heading}\n", 1)[1]
    match = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert match is not None, f"{page.name}, {heading!r}: no {language} block"
    return match.group(1)


def _readme_example() -> str:
    """The first Python block under the README's "Using it as a library"."""
    return _block(README, "## Using it as a library")


def _without_trio_run(source: str, page: str) -> str:
    """The example without its last line, ``trio.run(main)``: the test is inside trio already,
    so it awaits ``main`` itself."""
    body, sep, _ = source.rpartition("trio.run(main)")
    assert sep, f"the {page} example should end with trio.run(main)"
    return body


async def test_readme_library_example_runs(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    body = _without_trio_run(_readme_example(), "README")
    monkeypatch.delenv("ENGINE_CONFIG", raising=False)
    monkeypatch.setenv("ENGINE_DATABASE_URL", db_url)
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(body, "README.md", "exec"), namespace)
    await namespace["main"]()  # type: ignore[operator]
    assert capsys.readouterr().out == "succeeded {'echo': 'hello'}\n"


async def test_queue_example_runs_and_prints_what_the_page_says(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/queue.md's program, as it stands on the page, against this test's database: it
    prints the page's "It prints" block, so its four jobs ran and their rows read completed."""
    page = ROOT / "docs" / "queue.md"
    heading = "## The queue on its own"
    body = _without_trio_run(_block(page, heading), "docs/queue.md")
    printed = _block(page, heading, "text")
    monkeypatch.delenv("ENGINE_CONFIG", raising=False)
    monkeypatch.setenv("ENGINE_DATABASE_URL", db_url)
    # A module of its own, as the program's __main__ is: attrs and cattrs look its names up
    # there. dont_inherit: this file's `from __future__ import annotations` is not the page's.
    module = types.ModuleType("queue_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(body, "docs/queue.md", "exec", dont_inherit=True), module.__dict__)
    with trio.fail_after(60):
        await module.main()
    assert capsys.readouterr().out == printed


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def test_readme_lists_every_command() -> None:
    text = README.read_text(encoding="utf-8")
    table = text.split("## Command line", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in _commands(build_parser()) if f"| `{name}" not in table]
    assert not missing, f"commands missing from the README's command table: {missing}"


_LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of ``page``: lower case, punctuation dropped, spaces → ``-``."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("page", MARKDOWN, ids=[p.name for p in MARKDOWN])
def test_relative_links_point_at_files_and_headings(page: Path) -> None:
    broken = []
    for target, anchor in _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        if "://" in target or target.startswith("mailto:"):
            continue
        linked = page.parent / target if target else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{page.name} has broken links: {broken}"
