"""Specification of check_provider(s): what a provider must have, checked when it is registered,
and a message that lists everything it lacks at once."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import pytest

from engine.errors import ConfigError, EngineError, InvalidProvider
from engine.providers.app import METHODS, check_provider, check_providers
from engine.providers.simulated import SimulatedProvider, SimulationConfig
from engine_tests.providers.sample_app import EchoProvider, NoPollProvider

NEEDS = (
    "a provider needs async prepare, submit, poll, finalize and cancel, "
    "and a poll_interval in seconds >= 0"
)
_UNSET = object()


def whole(message: str) -> str:
    """A ``match`` pattern for exactly this message."""
    return "^" + re.escape(message) + "$"


async def _async_method(self: object, *args: object) -> None:
    """An async provider method."""


def _sync_method(self: object, *args: object) -> None:
    """A provider method someone forgot to make async."""


def provider(
    name: str = "Custom",
    *,
    drop: tuple[str, ...] = (),
    sync: tuple[str, ...] = (),
    poll_interval: object = 0.5,
) -> object:
    """An instance of a provider class ``name``: every method async unless dropped or sync."""
    namespace: dict[str, Any] = {}
    for method in METHODS:
        if method not in drop:
            namespace[method] = _sync_method if method in sync else _async_method
    if poll_interval is not _UNSET:
        namespace["poll_interval"] = poll_interval
    return type(name, (), namespace)()


# --- what passes -----------------------------------------------------------------------------


def test_the_simulated_provider_passes() -> None:
    sim = SimulatedProvider(SimulationConfig(poll_interval=0.25))
    assert check_provider("sim", sim) is sim
    assert check_providers({"sim": sim}) == {"sim": sim}


def test_a_complete_provider_passes_and_comes_back_as_given() -> None:
    echo = EchoProvider()
    checked = check_providers({"echo": echo, "other": echo})
    assert checked == {"echo": echo, "other": echo}
    assert type(checked) is dict


@pytest.mark.parametrize("interval", [0, 0.0, 2, 1.5])
def test_a_poll_interval_is_any_number_at_least_zero(interval: float) -> None:
    p = provider(poll_interval=interval)
    assert check_provider("m", p) is p


def test_partials_and_async_callables_count_as_async_methods() -> None:
    async def poll(task: object, ref: str, *, verbose: bool) -> None:
        """Takes an extra option, bound with a partial."""

    class Canceller:
        async def __call__(self, task: object, ref: str) -> None:
            """An object whose call is async."""

    p: Any = provider(drop=("poll", "cancel"))
    p.poll = functools.partial(poll, verbose=True)
    p.cancel = Canceller()
    assert check_provider("m", p) is p


def test_an_empty_mapping_passes() -> None:
    assert check_providers({}) == {}


# --- what fails ------------------------------------------------------------------------------


def test_a_provider_missing_poll() -> None:
    message = f"provider for model 'echo' (NoPollProvider) is missing poll; {NEEDS}"
    with pytest.raises(InvalidProvider, match=whole(message)):
        check_provider("echo", NoPollProvider())


def test_a_sync_method() -> None:
    message = f"provider for model 'echo' (Custom) has non-async submit; {NEEDS}"
    with pytest.raises(InvalidProvider, match=whole(message)):
        check_provider("echo", provider(sync=("submit",)))


def test_a_method_that_is_not_callable() -> None:
    p: Any = provider()
    p.poll = "later"
    message = f"provider for model 'echo' (Custom) has non-async poll; {NEEDS}"
    with pytest.raises(InvalidProvider, match=whole(message)):
        check_provider("echo", p)


def test_everything_wrong_is_named_at_once() -> None:
    p = provider(
        "Upstream", drop=("poll", "cancel"), sync=("prepare", "finalize"), poll_interval=-1
    )
    message = (
        "provider for model 'echo' (Upstream) is missing poll and cancel, has non-async "
        f"prepare and finalize and has poll_interval -1 (int); {NEEDS}"
    )
    with pytest.raises(InvalidProvider, match=whole(message)):
        check_provider("echo", p)


def test_something_that_is_no_provider_at_all() -> None:
    message = (
        "provider for model 'echo' (NoneType) is missing prepare, submit, poll, finalize, "
        f"cancel and poll_interval; {NEEDS}"
    )
    with pytest.raises(InvalidProvider, match=whole(message)):
        check_provider("echo", None)


def test_a_missing_poll_interval() -> None:
    message = f"provider for model 'echo' (Custom) is missing poll_interval; {NEEDS}"
    with pytest.raises(InvalidProvider, match=whole(message)):
        check_provider("echo", provider(poll_interval=_UNSET))


@pytest.mark.parametrize(
    ("interval", "shown"),
    [
        (-0.5, "-0.5 (float)"),
        (True, "True (bool)"),
        ("1s", "'1s' (str)"),
        (math.nan, "nan (float)"),
        (math.inf, "inf (float)"),
    ],
)
def test_a_bad_poll_interval(interval: object, shown: str) -> None:
    message = f"provider for model 'echo' (Custom) has poll_interval {shown}; {NEEDS}"
    with pytest.raises(InvalidProvider, match=whole(message)):
        check_provider("echo", provider(poll_interval=interval))


def test_every_bad_provider_and_name_is_listed() -> None:
    providers: dict[Any, object] = {
        "echo": EchoProvider(),
        "no-poll": NoPollProvider(),
        "": EchoProvider(),
        None: EchoProvider(),
        "late": provider(poll_interval=_UNSET),
    }
    message = (
        "invalid providers (4 problems):\n"
        f"  - provider for model 'no-poll' (NoPollProvider) is missing poll; {NEEDS}\n"
        "  - model name '' (str) is not a non-empty string\n"
        "  - model name None (NoneType) is not a non-empty string\n"
        f"  - provider for model 'late' (Custom) is missing poll_interval; {NEEDS}"
    )
    with pytest.raises(InvalidProvider, match=whole(message)) as info:
        check_providers(providers)
    assert len(info.value.problems) == 4


def test_providers_must_be_a_mapping() -> None:
    message = "providers must be a mapping of model name to provider, not list ['echo']"
    with pytest.raises(InvalidProvider, match=whole(message)):
        check_providers(["echo"])  # type: ignore[arg-type]


def test_invalid_provider_is_a_configuration_error() -> None:
    # Not retried by a service start, exit status 2 from the CLI.
    with pytest.raises(ConfigError) as info:
        check_provider("echo", NoPollProvider())
    assert isinstance(info.value, InvalidProvider)
    assert isinstance(info.value, EngineError)
    assert info.value.problems == [str(info.value)]
    assert "\n" not in str(info.value)
