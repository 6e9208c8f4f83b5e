"""Developer sessions: ``nox -s tests`` (default), ``tests_pg15``, ``lint``, ``typecheck``,
``bench``, ``chaos``, ``browser``.

Sessions run on the interpreter nox itself runs on (3.11-3.13 are supported), so a fresh machine
needs nothing but ``pip install nox``. ``tests_all`` runs the suite on every supported Python
that is installed.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite against a real PostgreSQL (embedded unless ENGINE_TEST_DATABASE_URL)."""
    session.install("-e", ".[test]")
    # The crash and benchmark scenarios (several engine processes each) run in `nox -s chaos`.
    session.run("pytest", *(session.posargs or ["-q", "-m", "not chaos and not scenario"]))
    if not session.posargs:
        # The testing kit's example app (docs/testing.md): its own session, as an app's suite
        # is, with engine's pytest plugin loaded by its entry point.
        session.run("pytest", "-q", "examples/testing_app")


#: The binaries of Debian's PostgreSQL 15 (`apt-get install postgresql-15`).
PG15_BINDIR = "/usr/lib/postgresql/15/bin"


@nox.session
def tests_pg15(session: nox.Session) -> None:
    """The queue, task, query, schedule and migration tests on PostgreSQL 15: a private server
    from Debian's binaries (ENGINE_TEST_PG_BINDIR), started and removed like the embedded one."""
    session.install("-e", ".[test]")
    session.run(
        "pytest",
        *(
            session.posargs
            or [
                "-q",
                "-m",
                "not chaos and not scenario",
                "engine_tests/queue",
                "engine_tests/tasks",
                "engine_tests/db",
                "engine_tests/schedules",
                "engine_tests/admission",
                "engine_tests/capacity",
            ]
        ),
        env={"ENGINE_TEST_PG_BINDIR": PG15_BINDIR},
    )


@nox.session(python=["3.11", "3.12", "3.13"])
def tests_all(session: nox.Session) -> None:
    """The suite on each supported interpreter found on this machine."""
    session.install("-e", ".[test]")
    session.run("pytest", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and the import contract (import-linter: the layers of docs/architecture.md, no
    cycles; configured in pyproject.toml)."""
    session.install("ruff>=0.8,<1")
    session.run("ruff", "check", "engine", "engine_tests", "examples", "noxfile.py")
    # import-linter finds the package through the import system and reads its source (nothing
    # is imported), so the package goes in without its dependencies.
    session.install("import-linter>=2.1,<3")
    session.install("--no-deps", "-e", ".")
    session.run("lint-imports", "--no-cache")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy, strict, over the package and the example app."""
    session.install("-e", ".[test]", "mypy>=1.13,<3", "types-croniter>=6.0,<8")
    session.run("mypy")


@nox.session
def chaos(session: nox.Session) -> None:
    """Crash and benchmark scenarios against real engine processes (``bench chaos``, ``resize``
    and ``load`` at quick sizes), as tests."""
    session.install("-e", ".[test]")
    session.run(
        "pytest",
        "-m",
        "chaos or scenario",
        "engine_tests/chaos",
        "engine_tests/bench",
        *session.posargs,
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark scenario and write one markdown table to bench-results.md."""
    session.install("-e", ".")
    session.run("python", "-m", "engine", "bench", "all", "--markdown", "bench-results.md")


@nox.session
def browser(session: nox.Session) -> None:
    """The dashboard in headless Chromium: Debian's ``chromium`` (``/usr/bin/chromium``,
    ``ENGINE_TEST_CHROMIUM``) driven by Playwright; screenshots in ``browser-artifacts/``.
    Playwright's own browser download is never used."""
    session.install("-e", ".[test,browser]")
    session.run("pytest", "-m", "browser", "engine_tests/browser", *session.posargs)
