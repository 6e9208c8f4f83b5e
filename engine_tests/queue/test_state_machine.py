"""Job transitions against a model: hypothesis drives inserts, claims, outcomes, cancels and
the scheduler on a real database, and after every step the rows must match the model.

Hypothesis's state machines are synchronous, so the machine runs in a worker thread and each
rule calls back into the test's trio loop (``trio.from_thread.run``), where the real queries and
the executor's outcome mapping run.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from engine.db.bridge import Connection
from engine.db.sqlfiles import QUERIES
from engine.queue.completer import write_completions
from engine.queue.executor import Completion, _failed, snoozed
from engine.queue.insert import insert_tx, prepare
from engine.queue.job import InsertOpts, Job
from engine.queue.states import JobState

FINAL = {"completed", "cancelled", "discarded"}


@attrs.define
class ModelJob:
    state: str
    max_attempts: int
    attempt: int = 0
    errors: int = 0
    snoozes: int = 0
    cancel_requested: bool = False
    due: bool = True


def make_machine(conn: Connection, token: trio.lowlevel.TrioToken) -> type[RuleBasedStateMachine]:
    def run(fn: Any, *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=token)

    class JobMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            run(conn.execute, "TRUNCATE river_job")
            self.model: dict[int, ModelJob] = {}

        def ids(self, *states: str) -> list[int]:
            return sorted(i for i, j in self.model.items() if j.state in states)

        @rule(max_attempts=st.integers(1, 3), scheduled=st.booleans())
        def insert(self, max_attempts: int, scheduled: bool) -> None:
            at = datetime.now(UTC) + timedelta(hours=1) if scheduled else None
            params = prepare(
                {"v": 1}, InsertOpts(max_attempts=max_attempts, scheduled_at=at), kind="m"
            )
            (result,) = run(insert_tx, conn, [params])
            self.model[result.job.id] = ModelJob(
                "scheduled" if scheduled else "available", max_attempts, due=not scheduled
            )

        @rule(limit=st.integers(1, 4))
        def claim(self, limit: int) -> None:
            available = self.ids("available")
            due = [i for i in available if self.model[i].due]
            rows = run(
                conn.fetch,
                QUERIES["job_get_available_completing"],
                "default",
                limit,
                "client",
                None,
                [],
                None,
                None,
            )
            claimed = [r["id"] for r in rows]
            # Jobs due for sure must be claimed; an available job not known to be due (a retry
            # a second away) may or may not be, depending on the clock.
            assert min(limit, len(due)) <= len(claimed) <= min(limit, len(available))
            assert set(claimed) <= set(available)
            for job_id in claimed:
                job = self.model[job_id]
                job.state = "running"
                job.attempt += 1

        @rule(
            data=st.data(),
            outcome=st.sampled_from(["ok", "snooze0", "snooze_long", "error", "cancel"]),
        )
        def complete(self, data: st.DataObject, outcome: str) -> None:
            running = self.ids("running")
            if not running:
                return
            job_id = data.draw(st.sampled_from(running))
            row = run(conn.fetchrow, QUERIES["job_get_by_id"], job_id)
            job = Job.from_record(row)
            m = self.model[job_id]
            completion: Completion
            if outcome == "ok":
                completion = Completion(job.id, job.queue, JobState.COMPLETED)
                target = "completed"
            elif outcome in ("snooze0", "snooze_long"):
                completion = snoozed(job, 0 if outcome == "snooze0" else 60)
                target = "available" if outcome == "snooze0" else "scheduled"
                m.attempt -= 1
                m.snoozes += 1
            elif outcome == "error":
                completion = _failed(job, "boom")
                m.errors += 1
                if m.attempt >= m.max_attempts:
                    target = "discarded"
                else:
                    # (errors+1)^4 s: the first retry (1 s) is due at once, later ones wait.
                    target = "available" if m.errors == 1 else "retryable"
            else:
                completion = Completion(job.id, job.queue, JobState.CANCELLED)
                target = "cancelled"
            if m.cancel_requested and target in ("available", "retryable", "scheduled"):
                target = "cancelled"
            changed = run(write_completions, conn, [completion])
            assert [r["id"] for r in changed] == [job_id]
            m.state = target
            m.due = outcome == "snooze0"

        @rule()
        def time_passes(self) -> None:
            run(
                conn.execute,
                "UPDATE river_job SET scheduled_at = scheduled_at - interval '2 hours'"
                " WHERE finalized_at IS NULL",
            )
            for m in self.model.values():
                m.due = True

        @rule(data=st.data())
        def cancel(self, data: st.DataObject) -> None:
            if not self.model:
                return
            job_id = data.draw(st.sampled_from(sorted(self.model)))
            run(conn.fetchrow, QUERIES["job_cancel"], job_id, datetime.now(UTC))
            m = self.model[job_id]
            if m.state in ("available", "scheduled", "retryable", "pending"):
                m.state = "cancelled"
            elif m.state == "running":
                m.cancel_requested = True

        @rule()
        def complete_twice_is_a_no_op(self) -> None:
            done = self.ids(*FINAL)
            if not done:
                return
            changed = run(
                write_completions, conn, [Completion(done[0], "default", JobState.COMPLETED)]
            )
            assert changed == []

        @rule()
        def scheduler_runs(self) -> None:
            run(conn.fetch, QUERIES["job_schedule"], None, 1000)
            for m in self.model.values():
                if m.state in ("scheduled", "retryable") and m.due:
                    m.state = "available"

        @invariant()
        def rows_match_model(self) -> None:
            rows = run(conn.fetch, "SELECT * FROM river_job ORDER BY id")
            assert [r["id"] for r in rows] == sorted(self.model)
            for r in rows:
                m = self.model[r["id"]]
                assert (
                    r["state"],
                    r["attempt"],
                    len(r["errors"] or ()),
                    r["metadata"].get("snoozes", 0),
                ) == (m.state, m.attempt, m.errors, m.snoozes), r["id"]
                assert (r["finalized_at"] is not None) == (m.state in FINAL)

    return JobMachine


async def test_job_transitions_match_the_model(conn: Connection) -> None:
    machine = make_machine(conn, trio.lowlevel.current_trio_token())
    config = settings(
        max_examples=50,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    await trio.to_thread.run_sync(lambda: run_state_machine_as_test(machine, settings=config))
