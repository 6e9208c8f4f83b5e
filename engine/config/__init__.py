"""Engine configuration: typed settings, four sources, one error listing every problem.

Every setting is a field of a frozen attrs class. Each section lives with the service that owns
it, which is the one home of its defaults and field docs: ``[database]``
(:mod:`engine.db.config`), ``[queue]`` (:mod:`engine.queue.config`), ``[worker]``
(:mod:`engine.capacity.config`), ``[load]`` (:mod:`engine.load.config`), ``[recovery]``
(:mod:`engine.recovery.config`), ``[admission]`` (:mod:`engine.admission.config`), ``[tasks]``
(:mod:`engine.tasks.config`), ``[metrics]`` and ``[dashboard]`` (:mod:`engine.web.config`) and
``[logging]`` (:mod:`engine.logs`). They are built from :mod:`engine.settings` and import
nothing of this package. :class:`EngineConfig` (:mod:`engine.config.engine`) holds the
top-level fields, one field per section, and the rules between sections.

:func:`load_config` (:mod:`engine.config.sources`) merges four sources, a later one winning for
the same field:

1. the defaults written on the fields;
2. an optional TOML file (``toml_path``, else the file named by ``ENGINE_CONFIG``), with one
   table per section: ``[queue]`` / ``fetch_cooldown = 0.01``;
3. environment variables ``ENGINE_<SECTION>_<FIELD>`` (``ENGINE_QUEUE_FETCH_COOLDOWN``), and
   ``ENGINE_<FIELD>`` for top-level fields (``ENGINE_DATA_DIR``);
4. overrides with dotted keys (``queue.fetch_cooldown``), which the CLI fills from
   ``--set section.field=value`` and a few flags.

Text from the environment and the command line is converted by the field's type: booleans take
``true/false/1/0/yes/no/on/off``, lists are comma-separated, and the empty string means "unset"
(None) for optional fields (also accepted in TOML, which has no null). Unknown ``ENGINE_*``
variables (except ``ENGINE_CONFIG`` and ``ENGINE_TEST_*``) and unknown TOML keys are errors with
a "did you mean" hint. All problems from all sources are collected and raised as one
:class:`~engine.errors.ConfigError`; the CLI prints it and exits with
:data:`config_problems_exit_code`.

Each field's ``metadata["doc"]`` is its user documentation (what it does in engine, its unit,
and why its default is what it is where that matters); :func:`config_reference_markdown`
(:mod:`engine.config.reference`) renders them into ``docs/configuration.md``.
"""

from engine.admission.config import AdmissionConfig
from engine.capacity.config import WorkerConfig
from engine.config.engine import EngineConfig
from engine.config.fields import FieldInfo, iter_fields
from engine.config.reference import config_reference_markdown
from engine.config.sources import config_as_dict, config_problems_exit_code, load_config
from engine.db.config import DatabaseConfig
from engine.load.config import LoadConfig
from engine.logs import LoggingConfig
from engine.queue.config import QueueConfig
from engine.recovery.config import RecoveryConfig
from engine.tasks.config import TasksConfig
from engine.web.config import DashboardConfig, MetricsConfig

__all__ = [
    "AdmissionConfig",
    "DashboardConfig",
    "DatabaseConfig",
    "EngineConfig",
    "FieldInfo",
    "LoadConfig",
    "LoggingConfig",
    "MetricsConfig",
    "QueueConfig",
    "RecoveryConfig",
    "TasksConfig",
    "WorkerConfig",
    "config_as_dict",
    "config_problems_exit_code",
    "config_reference_markdown",
    "iter_fields",
    "load_config",
]
