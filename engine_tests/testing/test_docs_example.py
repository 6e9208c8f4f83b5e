"""docs/testing.md shows the example app's code as it is: every block it marks as taken from a
file is, verbatim, in that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"
_BLOCK = re.compile(r"^<!-- (\S+) -->\n```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

BLOCKS = _BLOCK.findall(DOC.read_text(encoding="utf-8"))


def test_the_page_takes_code_from_the_example() -> None:
    assert len(BLOCKS) >= 6
    assert {source for source, _ in BLOCKS} == {
        "examples/testing_app/app.py",
        "examples/testing_app/conftest.py",
        "examples/testing_app/test_app.py",
    }


@pytest.mark.parametrize(("source", "code"), BLOCKS, ids=[f"{s}:{c[:30]}" for s, c in BLOCKS])
def test_each_block_is_in_its_file(source: str, code: str) -> None:
    assert code in (ROOT / source).read_text(encoding="utf-8"), (
        f"docs/testing.md has a block that is not in {source} (copy it from there again)"
    )
