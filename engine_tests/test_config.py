"""Specification of engine.config: defaults, precedence, text conversion and error messages."""

import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from engine.config import (
    DashboardConfig,
    EngineConfig,
    QueueConfig,
    WorkerConfig,
    config_as_dict,
    config_problems_exit_code,
    config_reference_markdown,
    iter_fields,
    load_config,
)
from engine.config.engine import SECTION_CLASSES
from engine.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def only(problem: str) -> str:
    """A ``match`` pattern for a ConfigError holding exactly this one problem."""
    return r"\A.*\(1 problem\(s\)\):\n  - " + re.escape(problem) + r"\Z"


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engine.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults -------------------------------------------------------------------------------


def test_defaults_are_the_reference_constants() -> None:
    config = EngineConfig()
    # the gateway's constants
    assert config.queue.name == "gateway_tasks"
    assert config.queue.job_kind == "gateway_task_run"
    assert config.recovery.interval == 15.0
    assert config.recovery.stale_after == 45.0
    assert config.admission.stale_after == 45.0
    assert config.recovery.batch_size == 100
    assert config.worker.startup_attempts == 3
    assert config.worker.startup_retry_delay == 2.0
    assert config.recovery.recoverable_task_limit == 1000
    assert config.queue.insert_max_attempts == 1000
    assert config.queue.insert_priority == 2
    assert config.queue.insert_tags == ("gateway-task",)
    assert config.queue.job_timeout is None
    assert config.queue.completed_retention == 24 * 3600
    assert config.worker.heartbeat_stale_factor == 6
    assert config.worker.drain_timeout == 3600.0
    assert config.worker.stop_timeout == 10.0
    assert config.worker.mark_draining_timeout == 5.0
    assert config.worker.enqueue_rollback_timeout == 5.0
    assert config.load.retry_base == 0.25
    assert config.load.retry_spread_ms == 501
    assert config.worker.lock_timeout_requeue_delay == 1.0
    # River defaults the gateway does not override
    assert config.queue.fetch_poll_interval == 1.0
    assert config.queue.scheduler_interval == 5.0
    assert config.queue.cleaner_interval == 30.0
    assert config.queue.cancelled_retention == 24 * 3600
    assert config.queue.discarded_retention == 7 * 24 * 3600
    assert config.queue.leader_elect_interval == 5.0
    assert config.queue.leader_ttl == 15.0
    assert config.queue.completer_tick == 0.05
    assert config.queue.completer_flush_size == 100
    assert config.queue.completer_max_batch == 5000
    assert config.queue.completer_backpressure_high == 10000
    assert config.queue.completer_backpressure_low == 5000
    assert config.queue.hot_operation_timeout == 10.0
    assert config.queue.default_max_attempts == 25
    # Deliberate deviation: River's FetchCooldown is 100 ms; we use Oban's 5 ms.
    assert config.queue.fetch_cooldown == 0.005


def test_proposed_defaults() -> None:
    config = EngineConfig()
    assert config.data_dir is None
    assert config.instance_name is None
    assert config.database.url is None
    assert config.database.tasks_url is None
    assert config.database.coordination_url is None
    assert config.database.queue_url is None
    assert (config.database.pool_min_size, config.database.pool_max_size) == (1, 10)
    assert config.database.statement_cache_size == 100
    assert config.database.migrate_on_start is True
    assert config.worker.mode == "worker"
    assert config.worker.refresh_interval == 5.0
    assert config.worker.hard_limit == 100
    assert config.worker.instance_hard_limit == 0
    assert config.load.mode == "legacy"
    assert (config.load.cpu_elevated, config.load.cpu_critical) == (0.80, 0.95)
    assert (config.load.memory_elevated, config.load.memory_critical) == (0.75, 0.90)
    assert (config.load.db_connections_elevated, config.load.db_connections_critical) == (
        0.70,
        0.90,
    )
    assert config.tasks.max_payload_bytes == 1_000_000
    # Unset: on for `python -m engine run`, off for an embedded engine.
    assert (config.metrics.enabled, config.metrics.host, config.metrics.port) == (
        None,
        "127.0.0.1",
        9464,
    )
    assert (config.logging.format, config.logging.level) == ("kv", "INFO")


def test_no_sources_gives_the_defaults() -> None:
    assert load_config(env={}) == EngineConfig()


def test_config_is_frozen() -> None:
    config = EngineConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.queue.name = "other"  # type: ignore[misc]


def test_exit_code_constant() -> None:
    assert config_problems_exit_code == 2


# --- precedence -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_toml", "in_env", "in_override", "expected"),
    [
        (False, False, False, 1.0),
        (True, False, False, 3.0),
        (True, True, False, 4.0),
        (False, True, False, 4.0),
        (True, True, True, 5.0),
        (True, False, True, 5.0),
        (False, True, True, 5.0),
        (False, False, True, 5.0),
    ],
)
def test_precedence_cli_over_env_over_toml_over_default(
    tmp_path: Path, in_toml: bool, in_env: bool, in_override: bool, expected: float
) -> None:
    toml = write_toml(tmp_path, "[queue]\nfetch_poll_interval = 3\n") if in_toml else None
    env = {"ENGINE_QUEUE_FETCH_POLL_INTERVAL": "4"} if in_env else {}
    overrides = {"queue.fetch_poll_interval": "5"} if in_override else {}
    config = load_config(env=env, toml_path=toml, overrides=overrides)
    assert config.queue.fetch_poll_interval == expected
    assert isinstance(config.queue.fetch_poll_interval, float)


def test_sources_combine_field_by_field(tmp_path: Path) -> None:
    toml = write_toml(
        tmp_path, 'instance_name = "from-toml"\n[worker]\nhard_limit = 7\nrefresh_interval = 2\n'
    )
    config = load_config(
        env={"ENGINE_WORKER_HARD_LIMIT": "8", "ENGINE_METRICS_PORT": "0"},
        toml_path=toml,
        overrides={"worker.instance_hard_limit": "3"},
    )
    assert config.instance_name == "from-toml"
    assert config.worker.refresh_interval == 2.0
    assert config.worker.hard_limit == 8
    assert config.metrics.port == 0
    assert config.worker.instance_hard_limit == 3
    assert config.worker.stop_timeout == 10.0


def test_toml_file_named_by_engine_config(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "[queue]\nname = 'named_by_env'\n")
    assert load_config(env={"ENGINE_CONFIG": str(toml)}).queue.name == "named_by_env"


def test_explicit_toml_path_beats_engine_config(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "[queue]\nname = 'explicit'\n")
    env = {"ENGINE_CONFIG": str(tmp_path / "missing.toml")}
    assert load_config(env=env, toml_path=toml).queue.name == "explicit"


def test_empty_engine_config_means_no_file() -> None:
    assert load_config(env={"ENGINE_CONFIG": ""}) == EngineConfig()


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ENGINE_") and not name.startswith("ENGINE_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ENGINE_QUEUE_NAME", "from_os_environ")
    assert load_config().queue.name == "from_os_environ"


# --- text conversion ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("1", True),
        ("yes", True),
        ("ON", True),
        ("false", False),
        ("0", False),
        ("No", False),
        (" off ", False),
    ],
)
def test_boolean_text(text: str, expected: bool) -> None:
    config = load_config(env={"ENGINE_METRICS_ENABLED": text})
    assert config.metrics.enabled is expected


def test_empty_env_var_unsets_an_optional_field() -> None:
    config = load_config(
        env={"ENGINE_DATABASE_URL": "", "ENGINE_QUEUE_JOB_TIMEOUT": "", "ENGINE_DATA_DIR": ""}
    )
    assert config.database.url is None
    assert config.queue.job_timeout is None
    assert config.data_dir is None


def test_empty_override_unsets_what_a_lower_source_set() -> None:
    config = load_config(
        env={"ENGINE_DATABASE_LOCK_TIMEOUT": "2.5"}, overrides={"database.lock_timeout": ""}
    )
    assert config.database.lock_timeout is None


def test_empty_toml_string_unsets_an_optional_field(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, '[admission]\nqueue_timeout = ""\n')
    assert load_config(env={}, toml_path=toml).admission.queue_timeout is None


def test_optional_number_set_from_text() -> None:
    config = load_config(env={"ENGINE_QUEUE_JOB_TIMEOUT": "90"})
    assert config.queue.job_timeout == 90.0


def test_list_from_comma_separated_text() -> None:
    config = load_config(overrides={"queue.insert_tags": "gateway-task, tenant_42 ,"}, env={})
    assert config.queue.insert_tags == ("gateway-task", "tenant_42")


def test_list_from_toml_array(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, '[queue]\ninsert_tags = ["one", "two"]\n')
    assert load_config(env={}, toml_path=toml).queue.insert_tags == ("one", "two")


def test_choices_are_case_insensitive() -> None:
    config = load_config(env={"ENGINE_LOGGING_LEVEL": "debug", "ENGINE_LOAD_MODE": "Adaptive"})
    assert config.logging.level == "DEBUG"
    assert config.load.mode == "adaptive"


def test_paths_expand_the_home_directory() -> None:
    config = load_config(env={"ENGINE_DATA_DIR": "~/engine-data"})
    assert config.data_dir == Path.home() / "engine-data"


def test_database_url_from_env() -> None:
    url = "postgresql://app:secret@db.internal:5432/app"
    assert load_config(env={"ENGINE_DATABASE_URL": url}).database.url == url


def test_test_and_foreign_variables_are_ignored() -> None:
    env = {
        "ENGINE_TEST_DATABASE_URL": "postgresql://localhost/test",
        "ENGINE_TEST_ANYTHING": "x",
        "PATH": "/usr/bin",
        "engine_queue_name": "lower-case is not ours",
    }
    assert load_config(env=env) == EngineConfig()


# --- error messages -------------------------------------------------------------------------


def test_bad_number() -> None:
    problem = (
        "queue.fetch_cooldown = 'fast' (from ENGINE_QUEUE_FETCH_COOLDOWN): must be a number >= 0"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_QUEUE_FETCH_COOLDOWN": "fast"})


def test_number_out_of_range() -> None:
    problem = (
        "queue.fetch_cooldown = '-1' (from ENGINE_QUEUE_FETCH_COOLDOWN): must be a number >= 0"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_QUEUE_FETCH_COOLDOWN": "-1"})


@pytest.mark.parametrize("text", ["5", "0", "2.5", "high"])
def test_priority_range(text: str) -> None:
    problem = f"queue.insert_priority = '{text}' (from --set): must be an integer from 1 to 4"
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, overrides={"queue.insert_priority": text})


def test_non_finite_number() -> None:
    problem = (
        "worker.drain_timeout = 'inf' (from ENGINE_WORKER_DRAIN_TIMEOUT): must be a number > 0"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_WORKER_DRAIN_TIMEOUT": "inf"})


def test_bad_optional_number_says_empty_is_allowed() -> None:
    problem = (
        "queue.job_timeout = '0' (from ENGINE_QUEUE_JOB_TIMEOUT): must be a number > 0, "
        "or empty for none"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_QUEUE_JOB_TIMEOUT": "0"})


def test_empty_text_for_a_required_field() -> None:
    problem = (
        "worker.hard_limit = '' (from ENGINE_WORKER_HARD_LIMIT): must be an integer from 0 to "
        "2147483647"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_WORKER_HARD_LIMIT": ""})


def test_bad_enum() -> None:
    problem = "worker.mode = 'boss' (from ENGINE_WORKER_MODE): must be one of 'worker', 'client'"
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_WORKER_MODE": "boss"})


def test_bad_boolean() -> None:
    problem = "metrics.enabled = 'maybe' (from --set): must be true or false, or empty for none"
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, overrides={"metrics.enabled": "maybe"})


def test_bad_tag() -> None:
    problem = (
        "queue.insert_tags = 'ok-tag,-bad' (from ENGINE_QUEUE_INSERT_TAGS): must be a list of "
        "tags, each 3 to 255 characters of letters, digits, '_' and '-', not starting or ending "
        "with '-'"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_QUEUE_INSERT_TAGS": "ok-tag,-bad"})


def test_queue_name_length() -> None:
    problem = f"queue.name = '{'q' * 128}' (from --set): must be a string of 1 to 127 characters"
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, overrides={"queue.name": "q" * 128})


def test_bad_url_hides_the_password() -> None:
    problem = (
        "database.url = 'mysql://app:***@db/app' (from ENGINE_DATABASE_URL): must be a "
        "postgresql:// or postgres:// URL, each port a number from 1 to 65535, or empty for none"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_DATABASE_URL": "mysql://app:hunter2@db/app"})


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@db:abc/app",
        "postgresql://app@db:99999/app",
        "postgresql://app@db:0/app",
        "postgresql://app@db1:5432,db2:x/app",
        "postgresql://app@[::1]:65536/app",
    ],
)
def test_a_url_port_that_no_server_can_have_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match=r"database\.queue_url = .*each port a number"):
        load_config(env={"ENGINE_DATABASE_QUEUE_URL": url})


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@db/app",
        "postgresql://app@db:5432/app",
        "postgresql://app@db1:5432,db2:5433/app",
        "postgresql://app@[::1]:5432/app",
        "postgresql:///app?host=/run/postgresql",
    ],
)
def test_urls_libpq_accepts_are_accepted(url: str) -> None:
    assert load_config(env={"ENGINE_DATABASE_URL": url}).database.url == url


def test_config_as_dict_hides_passwords() -> None:
    url = "postgresql://app:hunter2@db/app"
    data = config_as_dict(load_config(env={"ENGINE_DATABASE_QUEUE_URL": url}))
    assert data["database"]["queue_url"] == "postgresql://app:***@db/app"
    assert data["queue"]["fetch_cooldown"] == 0.005
    tables = {"schedules", "http_models"}  # arrays of tables, not settings
    assert set(data) == {info.name.split(".")[0] for info in iter_fields()} | tables
    assert data["schedules"] == [] and data["http_models"] == []
    shown = config_as_dict(load_config(env={"ENGINE_DATABASE_QUEUE_URL": url}), redact=False)
    assert shown["database"]["queue_url"] == url


def test_unknown_env_var_with_suggestion() -> None:
    problem = (
        "ENGINE_QUEUE_FETCH_COOLDOWNN (environment variable): unknown setting; did you mean "
        "ENGINE_QUEUE_FETCH_COOLDOWN?"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_QUEUE_FETCH_COOLDOWNN": "1"})


def test_unknown_env_var_without_suggestion() -> None:
    problem = "ENGINE_QWXZJK (environment variable): unknown setting"
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_QWXZJK": "1"})


def test_unknown_override_with_suggestion() -> None:
    problem = "worker.hard_limt (from --set): unknown setting; did you mean worker.hard_limit?"
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, overrides={"worker.hard_limt": "5"})


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        # A setting that moved to another section is found by its own name.
        ("worker.gc_tuning", "; did you mean queue.gc_tuning?"),
        ("ENGINE_WORKER_GC_TUNING", "; did you mean ENGINE_QUEUE_GC_TUNING?"),
        # The section two names share makes neither close to the other.
        ("queue.bogus", ""),
        ("ENGINE_QUEUE_BOGUS", ""),
    ],
)
def test_suggestions_compare_what_the_names_do_not_share(key: str, hint: str) -> None:
    env, overrides = ({key: "1"}, {}) if key.startswith("ENGINE_") else ({}, {key: "1"})
    where = "environment variable" if env else "from --set"
    problem = f"{key} ({where}): unknown setting{hint}"
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env=env, overrides=overrides)


def test_unknown_toml_key(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "[queue]\nfetch_coolodwn = 0.5\n")
    problem = (
        f"queue.fetch_coolodwn (from {toml}): unknown setting; did you mean queue.fetch_cooldown?"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, toml_path=toml)


def test_unknown_toml_section(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "[queu]\nname = 'x'\n")
    problem = f"[queu] (from {toml}): unknown section; did you mean [queue]?"
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, toml_path=toml)


def test_toml_section_that_is_not_a_table(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "queue = 5\n")
    problem = (
        f"queue = 5 (from {toml}): must be a table; write [queue] and put its settings under it"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, toml_path=toml)


def test_bad_toml_syntax_names_the_file(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "[queue\nname = 'x'\n")
    problem = (
        f"{toml}: not valid TOML: Expected ']' at the end of a table declaration "
        "(at line 1, column 7)"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, toml_path=toml)


def test_missing_file_named_by_engine_config(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    problem = (
        f"{missing} (from ENGINE_CONFIG): cannot read the configuration file: "
        "No such file or directory"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_CONFIG": str(missing)})


def test_wrong_toml_types(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, '[queue]\nfetch_cooldown = "0.5"\n[worker]\nhard_limit = true\n')
    with pytest.raises(ConfigError) as caught:
        load_config(env={}, toml_path=toml)
    assert caught.value.problems == [
        f"queue.fetch_cooldown = '0.5' (from {toml}): must be a number >= 0",
        f"worker.hard_limit = True (from {toml}): must be an integer from 0 to 2147483647",
    ]


def test_cross_field_rule_explains_the_hazard() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={"ENGINE_WORKER_REFRESH_INTERVAL": "30"})
    assert caught.value.problems == [
        "recovery.stale_after = 45.0 (default), worker.refresh_interval = '30' "
        "(from ENGINE_WORKER_REFRESH_INTERVAL): recovery.stale_after must be more than twice "
        "worker.refresh_interval: a worker writes its heartbeat only once per refresh, so with "
        "a shorter threshold a live worker looks dead and recovery takes its running jobs away "
        "while it is still working",
        "admission.stale_after = 45.0 (default), worker.refresh_interval = '30' "
        "(from ENGINE_WORKER_REFRESH_INTERVAL): admission.stale_after must be more than twice "
        "worker.refresh_interval: a worker writes its heartbeat only once per refresh, so with "
        "a shorter threshold a live worker looks dead and its admitted tasks are yielded while "
        "it is still working",
    ]


def test_cross_field_rule_within_a_section(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "[database]\npool_min_size = 20\n")
    problem = (
        f"database.pool_min_size = 20 (from {toml}), database.pool_max_size = '5' (from --set): "
        "database.pool_min_size must not exceed database.pool_max_size"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, toml_path=toml, overrides={"database.pool_max_size": "5"})


def test_cooldown_must_not_exceed_poll_interval() -> None:
    problem = (
        "queue.fetch_cooldown = '2' (from ENGINE_QUEUE_FETCH_COOLDOWN), "
        "queue.fetch_poll_interval = 1.0 (default): "
        "queue.fetch_cooldown must not exceed queue.fetch_poll_interval"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_QUEUE_FETCH_COOLDOWN": "2"})


def test_load_thresholds_must_be_ordered() -> None:
    assert load_config(env={"ENGINE_LOAD_CPU_ELEVATED": "0.95"}).load.cpu_elevated == 0.95
    problem = (
        "load.db_connections_elevated = 0.95 (from --set), load.db_connections_critical = 0.9 "
        "(default): load.db_connections_elevated must not exceed load.db_connections_critical"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={}, overrides={"load.db_connections_elevated": 0.95})


def test_cross_field_rule_is_skipped_when_a_field_is_invalid() -> None:
    problem = (
        "worker.refresh_interval = '-30' (from ENGINE_WORKER_REFRESH_INTERVAL): "
        "must be a number > 0"
    )
    with pytest.raises(ConfigError, match=only(problem)):
        load_config(env={"ENGINE_WORKER_REFRESH_INTERVAL": "-30"})


def test_every_problem_in_one_error(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "[queue]\nfetch_cooldown = -1\nbogus = 1\n")
    header = r"\Ainvalid configuration \(6 problem\(s\)\):\n"
    with pytest.raises(ConfigError, match=header) as caught:
        load_config(
            env={"ENGINE_WORKER_MODE": "boss", "ENGINE_QUEUE_INSERT_PRIORITY": "9"},
            toml_path=toml,
            overrides={"metrics.port": "70000", "queue.fetch_cooldown": "-2"},
        )
    assert caught.value.problems == [
        f"queue.bogus (from {toml}): unknown setting",
        # A bad value is reported even where a higher source overrides it.
        f"queue.fetch_cooldown = -1 (from {toml}): must be a number >= 0",
        "queue.insert_priority = '9' (from ENGINE_QUEUE_INSERT_PRIORITY): "
        "must be an integer from 1 to 4",
        "worker.mode = 'boss' (from ENGINE_WORKER_MODE): must be one of 'worker', 'client'",
        "metrics.port = '70000' (from --set): must be an integer from 0 to 65535",
        "queue.fetch_cooldown = '-2' (from --set): must be a number >= 0",
    ]


# --- direct construction --------------------------------------------------------------------


def test_direct_construction_validates_fields() -> None:
    with pytest.raises(ValueError, match=r"\Afetch_cooldown = -1\.0: must be a number >= 0\Z"):
        QueueConfig(fetch_cooldown=-1.0)


def test_direct_construction_validates_rules() -> None:
    with pytest.raises(ValueError, match=r"\Arecovery\.stale_after must be more than twice"):
        EngineConfig(worker=WorkerConfig(refresh_interval=30.0))


def test_a_section_made_alone_checks_its_own_rules() -> None:
    with pytest.raises(
        ValueError, match=r"\Aqueue\.fetch_cooldown must not exceed queue\.fetch_poll_interval\Z"
    ):
        QueueConfig(fetch_cooldown=2.0)
    with pytest.raises(ValueError, match=r"\Adashboard\.username and dashboard\.password go"):
        DashboardConfig(username="admin")


# --- where the sections live ----------------------------------------------------------------


def test_a_sections_rules_name_only_its_own_fields() -> None:
    """A section checks its rules when made alone, so they may name nothing outside it; a rule
    between sections belongs to EngineConfig."""
    for section, cls in SECTION_CLASSES.items():
        own = {f"{section}.{a.name}" for a in attrs.fields(cls)}
        for rule in getattr(cls, "rules", ()):
            assert set(rule.names) <= own, (section, rule.text)
    for rule in EngineConfig.rules:
        assert len({name.split(".")[0] for name in rule.names}) > 1, rule.text


@pytest.mark.parametrize("module", sorted({cls.__module__ for cls in SECTION_CLASSES.values()}))
def test_a_section_module_does_not_import_the_engine_config(module: str) -> None:
    """Each service's config module is a lower layer: importing it must not load
    engine.config, which imports every section (a cycle, and every service at once)."""
    code = (
        f"import sys, {module}\n"
        "print(sorted(m for m in sys.modules if m == 'engine.config' "
        "or m.startswith('engine.config.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", f"{module} imports {done.stdout.strip()}"


def test_field_docs_name_only_files_of_the_repository() -> None:
    for info in iter_fields():
        for name in re.findall(r"[\w./-]+\.(?:md|py|go|toml|txt)\b", info.doc):
            assert (ROOT / name).exists() or (ROOT / "docs" / name).exists(), (info.name, name)


# --- field listing and the reference document -----------------------------------------------


def test_env_var_naming() -> None:
    infos = list(iter_fields())
    assert len({info.env_var for info in infos}) == len(infos)
    for info in infos:
        if info.section is None:
            assert info.env_var == "ENGINE_" + info.key.upper()
            assert info.name == info.key
        else:
            assert info.env_var == f"ENGINE_{info.section.upper()}_{info.key.upper()}"
            assert info.name == f"{info.section}.{info.key}"
    by_name = {info.name: info for info in infos}
    assert by_name["database.url"].env_var == "ENGINE_DATABASE_URL"
    assert by_name["data_dir"].env_var == "ENGINE_DATA_DIR"
    assert by_name["queue.fetch_cooldown"].type == "float"
    assert by_name["queue.job_timeout"].type == "float | None"
    assert by_name["logging.format"].type == "'kv' | 'json'"
    assert by_name["queue.insert_tags"].default == '["gateway-task"]'


def test_every_field_is_documented() -> None:
    for info in iter_fields():
        assert info.doc.endswith("."), info.name
        assert len(info.doc) > 20, info.name
        assert info.requirement, info.name


def test_time_fields_are_named_by_unit() -> None:
    suffixes = ("_interval", "_timeout", "_ttl", "_delay", "_after", "_retention", "_cooldown")
    named_in_the_brief = {"recovery.interval", "queue.completer_tick", "load.retry_base"}
    for info in iter_fields():
        if "seconds" in info.doc.lower() and info.type.startswith("float"):
            assert info.key.endswith(suffixes) or info.name in named_in_the_brief, info.name


def test_every_field_in_the_markdown_reference() -> None:
    text = config_reference_markdown()
    for info in iter_fields():
        row = f"| `{info.name}` |"
        assert row in text, info.name
        assert f"`{info.env_var}`" in text, info.name
    for section in ("database", "queue", "worker", "load", "recovery", "admission", "tasks"):
        assert f"## `[{section}]`" in text
    assert "recovery.stale_after must be more than twice worker.refresh_interval" in text


def test_markdown_table_cells_escape_pipes() -> None:
    text = config_reference_markdown()
    row = next(line for line in text.splitlines() if line.startswith("| `logging.format` |"))
    assert "'kv' \\| 'json'" in row
    assert len(re.findall(r"(?<!\\)\|", row)) == 7
