"""The collector's settings while a worker's service runs (``worker.gc_tuning``)."""

from __future__ import annotations

import gc

import pytest

import engine
from engine.db.database import DatabaseUrls
from engine.service.collector import TUNED_THRESHOLD, tuned_collector
from engine_tests.tasks.conftest import make_config


def test_the_last_holder_to_leave_puts_the_settings_back() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with tuned_collector(True):
        tuned = gc.get_threshold()
        assert tuned == (TUNED_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > frozen
        with tuned_collector(True):
            assert gc.get_threshold() == tuned
        assert gc.get_threshold() == tuned  # the first holder still runs
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen


def test_disabled_it_changes_nothing() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with tuned_collector(False):
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == frozen


@pytest.mark.parametrize(
    ("overrides", "tuned"),
    [
        ({}, True),
        ({"worker.gc_tuning": "false"}, False),
        ({"worker.mode": "client"}, False),  # runs no jobs
    ],
)
async def test_a_worker_service_tunes_the_collector_while_it_runs(
    db_url: str, overrides: dict[str, str], tuned: bool
) -> None:
    before = gc.get_threshold()
    async with engine.open(make_config(**overrides), urls=DatabaseUrls.single(db_url)):
        assert (gc.get_threshold()[0] == TUNED_THRESHOLD) is tuned
    assert gc.get_threshold() == before
