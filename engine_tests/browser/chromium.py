"""Launch Debian's Chromium through Playwright (never a browser Playwright downloads)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import BrowserContext, sync_playwright

CHROMIUM = os.environ.get("ENGINE_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def artifacts() -> Path:
    """Where screenshots go (made if missing)."""
    root = Path(__file__).resolve().parents[2]
    path = Path(os.environ.get("ENGINE_BROWSER_ARTIFACTS", root / "browser-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def chromium(**context: object) -> Iterator[BrowserContext]:
    """A browser context with a fresh user-data dir, closed (and the dir removed) after."""
    with tempfile.TemporaryDirectory(prefix="engine-chromium-") as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport={"width": 1400, "height": 900},
            **context,  # type: ignore[arg-type]
        )
        try:
            ctx.set_default_timeout(15_000)
            yield ctx
        finally:
            ctx.close()
