"""The chaos tests' marker (``nox -s chaos`` runs ``pytest -m chaos``)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``chaos`` marker (``--strict-markers`` rejects unknown ones)."""
    config.addinivalue_line("markers", "chaos: crash scenarios (nox -s chaos)")
