"""Specification of load_app: what ``app = 'package.module:attribute'`` resolves to, and the one
line each mistake gets."""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.errors import AppError, ConfigError
from engine.providers.app import load_app
from engine_tests.providers import sample_app

SAMPLE = "engine_tests.providers.sample_app"
SHAPE = "set app to 'package.module:attribute', e.g. 'myapp.providers:PROVIDERS'"
NOT_FOUND = (
    "check the spelling, and that it is importable where the engine runs "
    "(installed, or its directory on PYTHONPATH)"
)


def whole(message: str) -> str:
    """A ``match`` pattern for exactly this message."""
    return "^" + re.escape(message) + "$"


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Write a top-level module with this source; returns its (unique) name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(source: str) -> str:
        name = f"engine_app_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        importlib.invalidate_caches()
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


# --- what it loads ---------------------------------------------------------------------------


@pytest.mark.parametrize("attr", ["PROVIDERS", "make_providers", "open_app", "Session"])
def test_loads_the_attribute(attr: str) -> None:
    assert load_app(f"{SAMPLE}:{attr}") is getattr(sample_app, attr)


def test_a_dotted_attribute_is_followed() -> None:
    assert load_app(f"{SAMPLE}:REGISTRY.providers") is sample_app.REGISTRY.providers


def test_the_module_is_imported_when_needed(write_module: Callable[[str], str]) -> None:
    name = write_module("PROVIDERS = {}\n")
    assert name not in sys.modules
    assert load_app(f"{name}:PROVIDERS") == {}


# --- the spec's shape ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (SAMPLE, "no ':' between the module and the attribute"),
        ("", "no ':' between the module and the attribute"),
        (":PROVIDERS", "the module before ':' is empty"),
        (f"{SAMPLE}:", "the attribute after ':' is empty"),
        ("my-app:PROVIDERS", "'my-app' is not a dotted Python name"),
        (".relative:PROVIDERS", "'.relative' is not a dotted Python name"),
        ("myapp..providers:PROVIDERS", "'myapp..providers' is not a dotted Python name"),
        (" myapp:PROVIDERS", "' myapp' is not a dotted Python name"),
        ("myapp:a:b", "'a:b' is not a dotted Python name"),
        ("myapp:PROVIDERS.", "'PROVIDERS.' is not a dotted Python name"),
    ],
)
def test_a_malformed_spec_says_the_expected_shape(spec: str, problem: str) -> None:
    with pytest.raises(AppError, match=whole(f"app {spec!r}: {problem}; {SHAPE}")):
        load_app(spec)


# --- the module ------------------------------------------------------------------------------


def test_a_missing_module() -> None:
    spec = "engine_tests.providers.no_such_module:PROVIDERS"
    message = f"app {spec!r}: module 'engine_tests.providers.no_such_module' not found; {NOT_FOUND}"
    with pytest.raises(AppError, match=whole(message)) as info:
        load_app(spec)
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_a_missing_package_names_the_missing_part() -> None:
    spec = "no_such_package_for_engine.providers:PROVIDERS"
    message = (
        f"app {spec!r}: module 'no_such_package_for_engine.providers' not found "
        f"(no module named 'no_such_package_for_engine'); {NOT_FOUND}"
    )
    with pytest.raises(AppError, match=whole(message)):
        load_app(spec)


def test_a_module_under_a_plain_module_is_missing() -> None:
    spec = f"{SAMPLE}.inner:PROVIDERS"
    message = f"app {spec!r}: module '{SAMPLE}.inner' not found; {NOT_FOUND}"
    with pytest.raises(AppError, match=whole(message)):
        load_app(spec)


def test_a_missing_import_inside_the_module_is_the_modules_error(
    write_module: Callable[[str], str],
) -> None:
    # The module exists; what it imports does not. That is not "module not found".
    name = write_module("import no_such_dependency_for_engine\nPROVIDERS = {}\n")
    message = (
        f"app '{name}:PROVIDERS': importing module {name!r} raised ModuleNotFoundError: "
        f"No module named 'no_such_dependency_for_engine'; "
        f'fix the module (python -c "import {name}" shows the traceback)'
    )
    with pytest.raises(AppError, match=whole(message)) as info:
        load_app(f"{name}:PROVIDERS")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_an_import_error_inside_the_module(write_module: Callable[[str], str]) -> None:
    name = write_module("from os import no_such_name\n")
    message = (
        f"app '{name}:PROVIDERS': importing module {name!r} raised ImportError: "
        f"cannot import name 'no_such_name' from 'os' "
    )
    with pytest.raises(AppError, match="^" + re.escape(message)):
        load_app(f"{name}:PROVIDERS")


def test_an_exception_while_importing(write_module: Callable[[str], str]) -> None:
    name = write_module("raise RuntimeError('no API key in the environment')\n")
    message = (
        f"app '{name}:PROVIDERS': importing module {name!r} raised RuntimeError: "
        "no API key in the environment; "
        f'fix the module (python -c "import {name}" shows the traceback)'
    )
    with pytest.raises(AppError, match=whole(message)) as info:
        load_app(f"{name}:PROVIDERS")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert name not in sys.modules


def test_a_syntax_error_in_the_module(write_module: Callable[[str], str]) -> None:
    name = write_module("PROVIDERS = {\n")
    pattern = (
        "^"
        + re.escape(f"app '{name}:PROVIDERS': importing module {name!r} raised SyntaxError: ")
        + r".*\("
        + re.escape(f"{name}.py")
        + r", line 1\); fix the module"
    )
    with pytest.raises(AppError, match=pattern):
        load_app(f"{name}:PROVIDERS")


# --- the attribute ---------------------------------------------------------------------------


def test_a_missing_attribute_suggests_and_lists_what_the_module_defines() -> None:
    spec = f"{SAMPLE}:PROVIDER"
    message = (
        f"app {spec!r}: module {SAMPLE!r} has no attribute 'PROVIDER' "
        "(did you mean 'PROVIDERS'?); it has BROKEN, EVENTS, EchoProvider, NoPollProvider, "
        "PROVIDERS, REGISTRY, Registry, Session, … (12 in all)"
    )
    with pytest.raises(AppError, match=whole(message)) as info:
        load_app(spec)
    assert isinstance(info.value.__cause__, AttributeError)


def test_the_listing_leaves_out_imports_and_private_names(
    write_module: Callable[[str], str],
) -> None:
    name = write_module(
        """\
        from __future__ import annotations
        import json
        from typing import Any
        from collections import OrderedDict
        _private = 1
        PROVIDERS: dict[str, Any] = {}
        def make_providers() -> dict[str, Any]:
            return {}
        class Local(OrderedDict):
            pass
        """
    )
    message = (
        f"app '{name}:nothing_like_it': module {name!r} has no attribute 'nothing_like_it'; "
        "it has Local, PROVIDERS, make_providers"
    )
    with pytest.raises(AppError, match=whole(message)):
        load_app(f"{name}:nothing_like_it")


def test_a_module_with_no_public_names() -> None:
    spec = "engine_tests.providers:PROVIDERS"
    message = (
        f"app {spec!r}: module 'engine_tests.providers' has no attribute 'PROVIDERS'; "
        "it has no public names"
    )
    with pytest.raises(AppError, match=whole(message)):
        load_app(spec)


def test_a_missing_attribute_further_down_a_dotted_path() -> None:
    spec = f"{SAMPLE}:REGISTRY.provider"
    message = (
        f"app {spec!r}: 'REGISTRY' has no attribute 'provider' (did you mean 'providers'?); "
        "it has providers"
    )
    with pytest.raises(AppError, match=whole(message)):
        load_app(spec)


def test_an_attribute_that_raises(write_module: Callable[[str], str]) -> None:
    name = write_module(
        """\
        def __getattr__(name):
            raise KeyError(name)
        """
    )
    message = (
        f"app '{name}:PROVIDERS': getting 'PROVIDERS' from module {name!r} raised "
        "KeyError: 'PROVIDERS'"
    )
    with pytest.raises(AppError, match=whole(message)):
        load_app(f"{name}:PROVIDERS")


# --- the error -------------------------------------------------------------------------------


def test_app_error_is_a_one_line_configuration_error() -> None:
    # A ConfigError: the CLI exits 2 on it and a service start does not retry it.
    with pytest.raises(ConfigError) as info:
        load_app("myapp")
    assert isinstance(info.value, AppError)
    assert "\n" not in str(info.value)
    assert info.value.problems == [str(info.value)]
    assert info.value.message == str(info.value)
