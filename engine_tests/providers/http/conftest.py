"""Fixtures for the HTTP provider kit: the fake upstream, served on a real loopback socket."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest

from engine.providers.http.fake import FakeUpstream, serve_upstream


@attrs.frozen
class Served:
    """A fake upstream and the base URL it listens on."""

    fake: FakeUpstream
    url: str


@pytest.fixture
async def upstream() -> AsyncIterator[Served]:
    """A :class:`FakeUpstream` on 127.0.0.1 (any free port), for the test."""
    fake = FakeUpstream()
    async with serve_upstream(fake) as url:
        yield Served(fake, url)
