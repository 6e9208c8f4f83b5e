"""The CPU figures of ``bench tasks``: the server's CPU is read from /proc, and it counts the
backends that have exited as well as the live ones."""

from __future__ import annotations

import os

import trio

from engine.bench.cpu import postmaster_of, sample_cpu, server_cpu_seconds
from engine.db.bridge import connect

# A query that keeps one backend busy for a few tenths of a second.
_BURN = "SELECT count(*) FROM generate_series(1, 3000000)"


def _children(postmaster: int) -> set[int]:
    found = set()
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == postmaster:
            found.add(int(name))
    return found


async def test_the_server_cpu_counts_a_backend_that_worked_and_exited(
    db_url: str,
) -> None:
    conn = await connect(db_url)
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    postmaster = postmaster_of(backend)
    # The test server runs on this host: its postmaster is found, and is the backend's parent.
    assert postmaster is not None and backend in _children(postmaster)
    before = sample_cpu(postmaster)
    await conn.fetchval(_BURN)
    busy = sample_cpu(postmaster) - before
    await conn.close()
    # Once the postmaster reaps the backend, its time moves to the postmaster's cutime/cstime.
    with trio.fail_after(10):
        while backend in _children(postmaster):
            await trio.sleep(0.01)
    after = sample_cpu(postmaster) - before
    assert busy.postgres is not None and busy.postgres > 0.05
    # Nothing of the exited backend's time is lost (a clock tick of slack for each reading).
    assert after.postgres is not None and after.postgres >= busy.postgres - 0.02
    assert after.python > 0


def test_no_postmaster_without_a_process() -> None:
    # A pid above the kernel's maximum is never a process: no /proc entry, no figure.
    assert postmaster_of(2**31 - 1) is None
    assert server_cpu_seconds(2**31 - 1) is None
