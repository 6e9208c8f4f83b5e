"""Browser tests: headless Chromium (Debian's ``chromium``) driven by Playwright.

They run in ``nox -s browser`` (``pytest -m browser engine_tests/browser``) and are skipped by
any run whose ``-m`` expression does not name ``browser``, so the default ``nox -s tests``
leaves them out. Screenshots go to ``browser-artifacts/`` (``ENGINE_BROWSER_ARTIFACTS``).
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "browser" in (config.option.markexpr or ""):
        return
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.skip(reason="browser test: run nox -s browser"))
