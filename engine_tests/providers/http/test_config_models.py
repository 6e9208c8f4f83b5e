"""``[[http_models]]`` in the engine's own configuration file: the service serves them."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import load_config
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, TaskRequest, TaskStatus
from engine.errors import ConfigError
from engine.providers.http.fake import fake_http_model
from engine.providers.simulated import SimulatedProvider
from engine.service.root import open as open_engine
from engine_tests.providers.http.conftest import Served

#: The test suite's usual settings (the template is migrated; one fixed generation).
_FAST = {
    "database.migrate_on_start": "false",
    "worker.capacity": "fixed",
    "worker.shutdown_drain_timeout": "0",
    "metrics.enabled": "false",
    "queue.fetch_poll_interval": "0.2",
}

TOML = """
[[http_models]]
model = "fake-model"
poll_interval = 0.05
error_path = "error.message"
progress_path = "progress"

[http_models.submit]
url = "{url}/jobs"
body = "{{{{ payload }}}}"

[http_models.poll]
method = "GET"
url = "{url}/jobs/{{{{ upstream_id }}}}"
"""


def _config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "engine.toml"
    path.write_text(TOML.format(url=url))
    return path


async def test_http_models_are_read_from_the_engines_file(
    tmp_path: Path, upstream: Served
) -> None:
    config = load_config(env={}, toml_path=_config(tmp_path, upstream.url))
    (model,) = config.http_models
    assert model == fake_http_model(upstream.url, cancel=None)


def test_a_bad_http_model_is_named_at_load(tmp_path: Path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text('[[http_models]]\nmodel = "m"\n[http_models.poll]\nurl = "http://x/"\n')
    with pytest.raises(ConfigError, match=r"http_models\[0\] \(m\)"):
        load_config(env={}, toml_path=path)


async def test_the_service_runs_the_files_http_models(
    tmp_path: Path, upstream: Served, db_url: str
) -> None:
    config = load_config(env={}, toml_path=_config(tmp_path, upstream.url), overrides=_FAST)
    async with open_engine(config, urls=DatabaseUrls.single(db_url)) as eng:
        await eng.set_model("fake-model")
        task_id = await eng.submit(
            TaskRequest(
                model="fake-model",
                payload={"prompt": "a cat"},
                identity=Identity(tenant_id="t", user_id="u"),
            )
        )
        task = await eng.wait(task_id, timeout=20)
    assert task.status is TaskStatus.SUCCEEDED, task.error
    assert len(upstream.fake.accepted) == 1


async def test_a_model_with_a_provider_and_an_http_model_is_refused(
    tmp_path: Path, upstream: Served, db_url: str
) -> None:
    config = load_config(env={}, toml_path=_config(tmp_path, upstream.url), overrides=_FAST)
    with pytest.raises(ConfigError, match="'fake-model' also has a provider from the app"):
        async with open_engine(
            config,
            urls=DatabaseUrls.single(db_url),
            providers={"fake-model": SimulatedProvider()},
        ):
            pass
