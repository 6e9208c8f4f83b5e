"""The embedded server is kept up: killed under a running engine, it is logged with why and
started again, and the engine goes on."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import trio

from engine import embedded
from engine.domain.tasks import TaskStatus
from engine.service.root import open as open_engine
from engine_tests.tasks.conftest import make_config, request


@pytest.mark.slow
async def test_a_killed_embedded_server_is_started_again_and_the_engine_goes_on(
    private_data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="engine.db.watch")
    config = make_config(
        data_dir=str(private_data_dir),
        **{"database.migrate_on_start": "true", "database.embedded_check_interval": "0.2"},
    )
    async with open_engine(config) as eng:
        await eng.set_model("sim-model")
        pid = (await trio.to_thread.run_sync(embedded.status, private_data_dir)).pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the postmaster: no clean shutdown, as a crash
        with trio.fail_after(30):
            while not [r for r in caplog.records if r.event == "embedded_server_restarted"]:
                await trio.sleep(0.05)
        task_id = await eng.submit(request())
        assert (await eng.wait(task_id, timeout=30)).status is TaskStatus.SUCCEEDED
    (record,) = [r for r in caplog.records if r.event == "embedded_server_restarted"]
    assert record.server_log  # the tail of the server's log: why it stopped
