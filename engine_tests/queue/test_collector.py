"""The collector's settings while a process runs jobs (``queue.gc_tuning``)."""

from __future__ import annotations

import gc

import pytest

import engine
from engine.db.database import Database, DatabaseUrls
from engine.queue import Workers, open_queue
from engine.queue.collector import TUNED_THRESHOLD, tuned_collector
from engine.queue.config import QueueConfig
from engine_tests.tasks.conftest import make_config


def test_the_last_holder_to_leave_puts_the_settings_back() -> None:
    gc.unfreeze()  # some interpreters start with objects frozen; begin from none
    before = gc.get_threshold()
    with tuned_collector(True):
        tuned = gc.get_threshold()
        assert tuned == (TUNED_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
        with tuned_collector(True):
            assert gc.get_threshold() == tuned
        assert gc.get_threshold() == tuned  # the first holder still runs
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_objects_frozen_before_it_stay_frozen() -> None:
    gc.freeze()  # as an application that tunes the collector itself, or the interpreter, may
    frozen = gc.get_freeze_count()
    try:
        with tuned_collector(True):
            assert gc.get_freeze_count() >= frozen
        # It cannot tell its objects from the others': unfreezing would undo the other freeze.
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()  # the rest of the suite runs with nothing frozen


def test_disabled_it_changes_nothing() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with tuned_collector(False):
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == frozen


@pytest.mark.parametrize("enabled", [True, False])
async def test_a_queue_tunes_the_collector_while_a_generation_runs(
    database: Database, enabled: bool
) -> None:
    before = gc.get_threshold()
    config = QueueConfig(gc_tuning=enabled)
    async with open_queue(database, config, workers=Workers(), stop_timeout=1) as client:
        # Opening the client runs no jobs: nothing changes until a generation starts.
        assert gc.get_threshold() == before
        first = await client.start_generation({"default": 4})
        assert (gc.get_threshold()[0] == TUNED_THRESHOLD) is enabled
        # A resize runs the new generation beside the old: the settings hold across it.
        second = await client.start_generation({"default": 8})
        first.stop("resized")
        await first.stopped.wait()
        assert (gc.get_threshold()[0] == TUNED_THRESHOLD) is enabled
        second.stop("closing")
        await second.stopped.wait()
        assert gc.get_threshold() == before
    assert gc.get_threshold() == before


@pytest.mark.parametrize(
    ("overrides", "tuned"),
    [
        ({}, True),
        ({"queue.gc_tuning": "false"}, False),
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
