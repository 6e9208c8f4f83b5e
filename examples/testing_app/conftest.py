"""The example app's fixtures: its schema in the template, its provider, a scripted upstream.

engine's pytest plugin (loaded by its entry point) provides the ``engine_*`` fixtures; an app
overrides two of them: ``engine_template_setup`` (its own migrations, once per session) and
``engine_providers`` (its providers, per test).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

import engine
from engine.testing.server import TemplateSetup

from .app import MODEL, InMemoryUpstream, SummaryProvider, install_schema


@pytest.fixture(scope="session")
def engine_template_setup() -> TemplateSetup:
    """The app's table, in every test database."""
    return install_schema


@pytest.fixture
def upstream() -> InMemoryUpstream:
    """The summarizer, in memory, scripted by each test."""
    return InMemoryUpstream()


@pytest.fixture
def provider(upstream: InMemoryUpstream) -> SummaryProvider:
    """The app's provider on the scripted upstream; no pause between polls."""
    return SummaryProvider(upstream, poll_interval=0.0, max_wait=5.0)


@pytest.fixture
def engine_providers(provider: SummaryProvider) -> Mapping[str, engine.Provider]:
    """The engines of the tests run the app's model with the app's provider."""
    return {MODEL: provider}
