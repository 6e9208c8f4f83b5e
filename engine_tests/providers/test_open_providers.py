"""Specification of open_providers: every form ``app`` may take, the context manager's lifetime,
and the message for each wrong object."""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio

from engine.errors import AppError, InvalidProvider
from engine.providers.app import load_app, open_providers
from engine_tests.providers import sample_app
from engine_tests.providers.sample_app import EVENTS, EchoProvider

SAMPLE = "engine_tests.providers.sample_app"
ACCEPTED = (
    "expected a mapping of model name to provider, a function (sync or async) returning one, "
    "an async context manager yielding one, or a function returning such a context manager"
)
NO_POLL = (
    "provider for model 'no-poll' (NoPollProvider) is missing poll; a provider needs async "
    "prepare, submit, poll, finalize and cancel, and a poll_interval in seconds >= 0"
)


def whole(message: str) -> str:
    """A ``match`` pattern for exactly this message."""
    return "^" + re.escape(message) + "$"


@pytest.fixture(autouse=True)
def fresh_events() -> Iterator[None]:
    EVENTS.clear()
    yield
    EVENTS.clear()


async def opened(app: object) -> dict[str, Any]:
    """The providers ``app`` opens, after the block closed them again."""
    async with open_providers(app) as providers:
        return providers


def assert_echo(providers: dict[str, Any]) -> None:
    assert list(providers) == ["echo"]
    assert isinstance(providers["echo"], EchoProvider)


# --- the accepted forms ----------------------------------------------------------------------


async def test_a_mapping() -> None:
    async with open_providers(sample_app.PROVIDERS) as providers:
        assert providers == sample_app.PROVIDERS
        assert providers["echo"] is sample_app.PROVIDERS["echo"]
        assert providers is not sample_app.PROVIDERS  # a dict of our own


async def test_a_sync_factory() -> None:
    assert_echo(await opened(sample_app.make_providers))


async def test_an_async_factory() -> None:
    assert_echo(await opened(sample_app.make_providers_async))


async def test_a_function_returning_an_async_context_manager() -> None:
    async with open_providers(sample_app.open_app) as providers:
        assert_echo(providers)
        assert EVENTS == ["entered"]
    assert EVENTS == ["entered", "exited"]


async def test_an_async_context_manager() -> None:
    async with open_providers(sample_app.open_app()) as providers:
        assert_echo(providers)
        assert EVENTS == ["entered"]
    assert EVENTS == ["entered", "exited"]


async def test_a_class_based_async_context_manager_and_its_class() -> None:
    # The class defines __aenter__ but is not itself a context manager: it is the factory.
    for app in (sample_app.Session(), sample_app.Session):
        EVENTS.clear()
        async with open_providers(app) as providers:
            assert_echo(providers)
            assert EVENTS == ["entered"]
        assert EVENTS == ["entered", "exited"]


@pytest.mark.parametrize(
    "attr", ["PROVIDERS", "make_providers", "make_providers_async", "open_app", "Session"]
)
async def test_what_load_app_loads_opens(attr: str) -> None:
    assert_echo(await opened(load_app(f"{SAMPLE}:{attr}")))


async def test_an_empty_mapping_is_no_providers() -> None:
    assert await opened({}) == {}


# --- the context manager's lifetime ----------------------------------------------------------


async def test_an_error_in_the_block_goes_through_the_context_manager() -> None:
    with pytest.raises(RuntimeError, match=r"^the service failed$"):
        async with open_providers(sample_app.open_app):
            raise RuntimeError("the service failed")
    assert EVENTS == ["entered", "exited with RuntimeError"]


async def test_a_cancellation_of_the_block_goes_through_the_context_manager() -> None:
    with trio.move_on_after(10) as scope:
        async with open_providers(sample_app.Session):
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert EVENTS == ["entered", "exited with Cancelled"]


async def test_invalid_providers_from_a_context_manager_close_it() -> None:
    with pytest.raises(InvalidProvider, match=whole(NO_POLL)):
        async with open_providers(sample_app.open_broken_app):
            pytest.fail("the block must not run")
    assert EVENTS == ["entered", "exited with InvalidProvider"]


async def test_errors_of_the_users_code_propagate_unchanged() -> None:
    def factory() -> dict[str, Any]:
        raise LookupError("ECHO_URL is not set")

    with pytest.raises(LookupError, match=r"^ECHO_URL is not set$"):
        await opened(factory)


# --- what is checked -------------------------------------------------------------------------


async def test_the_providers_are_checked() -> None:
    with pytest.raises(InvalidProvider, match=whole(NO_POLL)):
        await opened({"no-poll": sample_app.NoPollProvider()})


async def test_model_names_must_be_non_empty_strings() -> None:
    message = (
        "invalid providers (2 problems):\n"
        "  - model name '' (str) is not a non-empty string\n"
        "  - model name 7 (int) is not a non-empty string"
    )
    with pytest.raises(InvalidProvider, match=whole(message)):
        await opened(lambda: {"": EchoProvider(), 7: EchoProvider(), "echo": EchoProvider()})


# --- what is refused -------------------------------------------------------------------------


@contextmanager
def sync_app() -> Iterator[dict[str, Any]]:
    yield {"echo": EchoProvider()}


@asynccontextmanager
async def yields_a_list() -> AsyncIterator[list[str]]:
    yield ["echo"]


def returns_a_provider() -> EchoProvider:
    return EchoProvider()


def needs_a_client(client: object) -> dict[str, Any]:
    return {}


async def async_factory() -> dict[str, Any]:
    return {}


HERE = __name__


@pytest.mark.parametrize(
    ("app", "message"),
    [
        (42, f"app: got int 42; {ACCEPTED}"),
        (None, f"app: got None; {ACCEPTED}"),
        ("echo", f"app: got str 'echo'; {ACCEPTED}"),
        (["echo"], f"app: got list ['echo']; {ACCEPTED}"),
        (EchoProvider(), f"app: got an EchoProvider object; {ACCEPTED}"),
        (
            sync_app(),
            "app: got a _GeneratorContextManager object (a synchronous context manager: make it "
            f"async, e.g. with @asynccontextmanager); {ACCEPTED}",
        ),
        (
            sync_app,
            f"app: {HERE}.sync_app() returned a _GeneratorContextManager object (a synchronous "
            "context manager: make it async, e.g. with @asynccontextmanager); expected a "
            "mapping of model name to provider or an async context manager yielding one",
        ),
        (
            returns_a_provider,
            f"app: {HERE}.returns_a_provider() returned an EchoProvider object; expected a "
            "mapping of model name to provider or an async context manager yielding one",
        ),
        (
            lambda: [],
            f"app: {HERE}.<lambda>() returned list []; expected a mapping of model name to "
            "provider or an async context manager yielding one",
        ),
        (
            needs_a_client,
            f"app: {HERE}.needs_a_client cannot be called without arguments (missing a required "
            "argument: 'client'); the engine calls it with none, so give a function that takes "
            "none",
        ),
        (
            yields_a_list,
            f"app: {HERE}.yields_a_list() yielded list ['echo']; expected a "
            "mapping of model name to provider",
        ),
    ],
    ids=[
        "int",
        "None",
        "str",
        "list",
        "provider",
        "sync-cm",
        "sync-cm-factory",
        "factory-of-provider",
        "factory-of-list",
        "factory-with-arguments",
        "cm-of-list",
    ],
)
async def test_a_wrong_app_names_what_was_given_and_what_is_accepted(
    app: object, message: str
) -> None:
    with pytest.raises(AppError, match=whole(message)):
        await opened(app)


async def test_a_coroutine_is_refused_and_closed() -> None:
    coroutine = async_factory()
    message = (
        "app: got coroutine async_factory (name the async function itself, without calling it); "
        f"{ACCEPTED}"
    )
    with pytest.raises(AppError, match=whole(message)):
        await opened(coroutine)
    # Closed: it does not warn "never awaited" (which this suite turns into an error).
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
