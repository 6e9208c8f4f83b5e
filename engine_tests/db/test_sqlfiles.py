"""Named queries and the fragments they share: written once in sql/, composed at load."""

from __future__ import annotations

import re

import pytest

from engine.db.sqlfiles import QUERIES, compose, parse_queries, sql_root
from engine.errors import UnknownQuery

_FILE = """
-- fragment: keep_duplicate
-- River's unique insert.
ON CONFLICT (unique_key) DO UPDATE SET kind = EXCLUDED.kind

-- fragment: insert_rows
INSERT INTO t SELECT * FROM input
{{keep_duplicate}}

-- name: t_insert
-- Insert. $1 rows.
WITH input AS (SELECT 1),
inserted AS (
    {{insert_rows}}
    RETURNING *
)
SELECT * FROM inserted;
"""


def test_a_query_takes_its_fragments_indented_as_the_line_that_names_them() -> None:
    queries, fragments = parse_queries(_FILE, "t.sql")
    assert set(queries) == {"t_insert"} and set(fragments) == {"keep_duplicate", "insert_rows"}
    assert compose(queries, fragments)["t_insert"] == (
        "-- Insert. $1 rows.\n"
        "WITH input AS (SELECT 1),\n"
        "inserted AS (\n"
        "    INSERT INTO t SELECT * FROM input\n"
        "    -- River's unique insert.\n"
        "    ON CONFLICT (unique_key) DO UPDATE SET kind = EXCLUDED.kind\n"
        "    RETURNING *\n"
        ")\n"
        "SELECT * FROM inserted;"
    )


def test_an_unknown_or_self_using_fragment_is_an_error() -> None:
    with pytest.raises(
        UnknownQuery, match=re.escape("'q' uses {{missing}}, a fragment not defined")
    ):
        compose({"q": "SELECT 1\n{{missing}}"}, {})
    with pytest.raises(UnknownQuery, match="fragment 'loop' uses itself"):
        compose({"q": "{{loop}}"}, {"loop": "SELECT 1\n{{loop}}"})


def test_a_fragment_defined_twice_is_an_error() -> None:
    with pytest.raises(UnknownQuery, match="fragment 'f' is defined twice"):
        parse_queries("-- fragment: f\nSELECT 1\n-- fragment: f\nSELECT 2\n", "t.sql")


def test_every_statement_that_inserts_jobs_takes_river_s_unique_insert() -> None:
    """The queue's insert and the task submissions share River's unique insert, composed."""
    text = (sql_root() / "queries" / "river_job.sql").read_text("utf-8")
    _, fragments = parse_queries(text, "river_job.sql")
    conflict = fragments["river_job_keep_live_duplicate"].splitlines()[-1].strip()
    for name in ("job_insert_many", "task_submit_many", "task_submit_one"):
        assert conflict in QUERIES[name]
        assert "{{" not in QUERIES[name]
