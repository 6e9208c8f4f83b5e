"""The role pools: their URLs may differ, but they must reach one database."""

from __future__ import annotations

import pytest

from engine.db.database import DatabaseUrls, open_database
from engine.db.resolve import scratch_database
from engine.errors import ConfigError


async def test_roles_may_use_other_urls_for_the_same_database(db_url: str) -> None:
    # Another host name and another application name: other pools, the same database.
    alias = db_url.replace("127.0.0.1", "localhost") + "?application_name=engine-other"
    assert alias != db_url
    urls = DatabaseUrls(tasks=db_url, coordination=alias, queue=db_url)
    async with open_database(urls) as db:
        assert len(db.distinct_pools()) == 2
        assert await db.coordination.fetchval("SELECT 1") == 1


@pytest.mark.parametrize("role", ["coordination", "queue"])
async def test_a_role_on_another_database_is_refused_naming_its_setting(
    db_url: str, pg_admin_url: str, role: str
) -> None:
    async with scratch_database(pg_admin_url, "engine_other_") as other:
        urls = DatabaseUrls(
            tasks=db_url,
            coordination=other if role == "coordination" else db_url,
            queue=other if role == "queue" else db_url,
        )
        with pytest.raises(ConfigError) as info:
            async with open_database(urls):
                pass
    assert len(info.value.problems) == 1
    problem = info.value.problems[0]
    assert problem.startswith(f"database.{role}_url (")
    assert "reaches another database than the tasks URL" in problem
    assert f"point database.{role}_url at the same database, or unset it" in problem
