"""The one error tree of engine.

Every error engine raises on purpose derives from :class:`EngineError`; the message defaults to
the class docstring, so ``raise LeaseUnavailable()`` still says something useful::

    EngineError
    ├── ConfigError                 invalid configuration; lists every bad field
    │   ├── AddressInUse            a server's configured address (metrics.port) is taken
    │   ├── AppError                the ``app`` setting does not load or does not give providers
    │   └── InvalidProvider         a provider lacks an async method or a valid poll_interval
    ├── EmbeddedPostgresError       the private server could not be found, started or stopped
    │   └── DataDirError            the data directory is unusable as it is (also a ConfigError)
    ├── DatabaseError               a database call failed (asyncpg error kept as __cause__)
    │   ├── ConnectionLost          the server went away or could not be reached
    │   ├── LockTimeout             SQLSTATE 55P03, lock_timeout exceeded
    │   ├── UniqueViolation         SQLSTATE 23505; carries constraint_name
    │   ├── QueryCanceled           SQLSTATE 57014, statement_timeout or a cancel request
    │   └── TransactionConflict     SQLSTATE 40P01/40001: rolled back, safe to run again
    ├── MigrationError              a migration could not be applied
    ├── UnknownQuery                a named SQL query does not exist
    ├── JobError                    queue-level misuse (bad insert options, unknown kind)
    └── TaskError                   task-level outcomes callers branch on
        ├── InvalidTask             submit input rejected before anything was stored
        ├── TaskNotFound
        ├── LeaseUnavailable        another live execution token holds the task
        └── ManualReview            an ambiguous upstream submission; needs a human

Using an engine object after it was closed raises ``RuntimeError`` (our own misuse), while a
peer or database failure raises a :class:`DatabaseError` (trio's Closed vs Broken distinction).

Every class says whether the same call may succeed if made again, in ``retryable``: True for
:class:`ConnectionLost`, :class:`LockTimeout`, :class:`QueryCanceled` and
:class:`TransactionConflict` (the database was unavailable or busy: wait and call again),
False for everything else, :class:`InvalidTask` and :class:`ConfigError` above all (the input
or the settings must change first). A plain :class:`DatabaseError` is not retryable: the
server refused the statement itself.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = [
    "AddressInUse",
    "AppError",
    "ConfigError",
    "ConnectionLost",
    "DataDirError",
    "DatabaseError",
    "EmbeddedPostgresError",
    "EngineError",
    "InvalidProvider",
    "InvalidTask",
    "JobError",
    "LeaseUnavailable",
    "LockTimeout",
    "ManualReview",
    "MigrationError",
    "QueryCanceled",
    "TaskError",
    "TaskNotFound",
    "TransactionConflict",
    "UniqueViolation",
    "UnknownQuery",
    "leaves",
]


class EngineError(Exception):
    """An engine error."""

    #: Whether making the same call again may succeed (the module docstring).
    retryable: bool = False

    def __init__(self, message: str | None = None) -> None:
        self.message = message or (self.__doc__ or type(self).__name__).strip().splitlines()[0]
        super().__init__(self.message)


class ConfigError(EngineError):
    """The configuration is invalid."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid configuration ({len(self.problems)} problem(s)):\n{lines}")


class AppError(ConfigError):
    """The ``app`` setting could not be loaded, or what it names gives no providers.

    It holds one problem, and its message is that one line (naming ``app`` and the fix).
    """

    def __init__(self, problem: str) -> None:
        super().__init__([problem])
        self.message = problem
        self.args = (problem,)


class AddressInUse(ConfigError):
    """The address a server is configured to listen on is taken.

    A configuration error (not retried, CLI exit 2) whose message is one line naming the address
    and the setting to change.
    """

    def __init__(self, problem: str) -> None:
        super().__init__([problem])
        self.message = problem
        self.args = (problem,)


class InvalidProvider(ConfigError):
    """A provider does not have what the engine calls: async ``prepare``, ``submit``, ``poll``,
    ``finalize`` and ``cancel``, and a ``poll_interval`` >= 0; or a model name is not a
    non-empty string.

    A configuration error, so a service start does not retry it and the CLI exits 2. One
    problem per provider; the message is the problem when there is one, else a list.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems)
        if len(self.problems) == 1:
            self.message = self.problems[0]
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            self.message = f"invalid providers ({len(self.problems)} problems):\n{lines}"
        self.args = (self.message,)


class EmbeddedPostgresError(EngineError):
    """The embedded PostgreSQL server could not be found, started or stopped."""


class DataDirError(EmbeddedPostgresError, ConfigError):
    """The data directory cannot hold engine's embedded server as it is (not engine's, not a
    directory, damaged, from a newer engine or another PostgreSQL); it was left untouched.
    Trying again does not help: choose another directory (``data_dir``) or fix this one."""

    def __init__(self, message: str) -> None:
        ConfigError.__init__(self, [message])
        self.message = message
        self.args = (message,)


class DatabaseError(EngineError):
    """A database call failed."""

    sqlstate: str | None = None


class ConnectionLost(DatabaseError):
    """The database connection was lost or could not be opened."""

    retryable = True


class LockTimeout(DatabaseError):
    """A lock could not be acquired within lock_timeout (SQLSTATE 55P03)."""

    sqlstate = "55P03"
    retryable = True


class UniqueViolation(DatabaseError):
    """A unique constraint was violated (SQLSTATE 23505)."""

    sqlstate = "23505"

    def __init__(self, message: str | None = None, constraint_name: str | None = None) -> None:
        super().__init__(message)
        self.constraint_name = constraint_name


class QueryCanceled(DatabaseError):
    """A statement was cancelled by statement_timeout or a cancel request (SQLSTATE 57014)."""

    sqlstate = "57014"
    retryable = True


class TransactionConflict(DatabaseError):
    """The server rolled the statement back to break a deadlock or a serialization conflict
    (SQLSTATE 40P01 or 40001); nothing was written, and running it again is safe."""

    retryable = True


class MigrationError(EngineError):
    """A migration could not be applied."""


class UnknownQuery(EngineError):
    """No SQL query is registered under that name."""


class JobError(EngineError):
    """A job could not be inserted or worked as asked."""


class TaskError(EngineError):
    """A task-level error."""


class InvalidTask(TaskError):
    """The task input was rejected; nothing was stored."""


class TaskNotFound(TaskError):
    """No task has that id."""


class LeaseUnavailable(TaskError):
    """Another live execution holds the task's lease."""


class ManualReview(TaskError):
    """The task was submitted upstream with no recorded outcome; it needs manual review."""


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside ``exc``, with every (nested) exception group flattened: what a
    nursery raised, as the errors its tasks raised."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc
