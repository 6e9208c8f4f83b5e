"""The user's providers: load the ``app`` setting and check what it gives.

``app`` names a Python object as ``package.module:attribute`` (the attribute may be dotted,
``module:registry.PROVIDERS``). :func:`load_app` imports it; :func:`open_providers` turns it
into the providers for the engine's lifetime. The object may be any of::

    PROVIDERS = {"echo": EchoProvider()}             a mapping of model name to provider
    def make_providers(): return {...}               a function (sync or async) returning one
    class Providers: async def __aenter__ ...        an async context manager yielding one
    @asynccontextmanager
    async def open_app(): ... yield {...} ...        a function returning such a manager

A context manager is entered when the providers are opened and exited when they are closed
(at shutdown, or when the block raises), so a provider can open its own HTTP client inside the
service's nursery and close it on the way out.

:func:`check_providers` is the check every provider map goes through, whoever built it: each
provider must have async ``prepare``, ``submit``, ``poll``, ``finalize`` and ``cancel``, and a
``poll_interval`` in seconds >= 0. Checking when providers are registered, not when a task
first needs one, matters: a provider without ``poll`` would otherwise fail only after its
``submit`` had already reached the upstream.

Every mistake is an :class:`~engine.errors.AppError` (loading) or an
:class:`~engine.errors.InvalidProvider` (checking), both configuration errors, with one line
per problem that names it and the fix. Errors raised by the user's own code (a factory, a
context manager's ``__aenter__``) are the user's and propagate unchanged.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import reprlib
import types
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeGuard, cast

from engine.errors import AppError, InvalidProvider
from engine.providers.base import Provider

__all__ = ["check_provider", "check_providers", "load_app", "open_providers"]

#: The provider methods the engine calls, in the order a run calls them.
METHODS = ("prepare", "submit", "poll", "finalize", "cancel")

_SHAPE = "set app to 'package.module:attribute', e.g. 'myapp.providers:PROVIDERS'"
_ACCEPTED = (
    "expected a mapping of model name to provider, a function (sync or async) returning one, "
    "an async context manager yielding one, or a function returning such a context manager"
)
_NEEDS = (
    "a provider needs async prepare, submit, poll, finalize and cancel, "
    "and a poll_interval in seconds >= 0"
)
#: How many of a module's names an "attribute missing" message lists.
_SHOWN_NAMES = 8

_repr = reprlib.Repr()
_repr.maxstring = 40
_repr.maxother = 40


# ---------------------------------------------------------------------------------------------
# load_app


def load_app(spec: str) -> object:
    """Import ``package.module:attribute`` and return the attribute (which may be dotted).

    Raises:
        AppError: the spec is malformed, the module is missing or fails to import, or the
            attribute is missing. The failure from importing is kept as ``__cause__``.
    """
    module_name, attr = _split(spec)
    module = _import(spec, module_name)
    return _resolve(spec, module, attr)


def _split(spec: str) -> tuple[str, str]:
    module_name, colon, attr = spec.partition(":")
    if not colon:
        problem = "no ':' between the module and the attribute"
    elif not module_name:
        problem = "the module before ':' is empty"
    elif not attr:
        problem = "the attribute after ':' is empty"
    elif not _dotted(module_name):
        problem = f"{module_name!r} is not a dotted Python name"
    elif not _dotted(attr):
        problem = f"{attr!r} is not a dotted Python name"
    else:
        return module_name, attr
    raise AppError(f"app {spec!r}: {problem}; {_SHAPE}")


def _dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _import(spec: str, module_name: str) -> types.ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Missing is the module itself or a package on its path; any other name is something
        # the module imports, which is an error inside the module.
        if exc.name is not None and (
            exc.name == module_name or module_name.startswith(exc.name + ".")
        ):
            which = "" if exc.name == module_name else f" (no module named {exc.name!r})"
            raise AppError(
                f"app {spec!r}: module {module_name!r} not found{which}; check the spelling, "
                "and that it is importable where the engine runs (installed, or its "
                "directory on PYTHONPATH)"
            ) from exc
        raise _import_failed(spec, module_name, exc) from exc
    except Exception as exc:
        raise _import_failed(spec, module_name, exc) from exc


def _import_failed(spec: str, module_name: str, exc: Exception) -> AppError:
    return AppError(
        f"app {spec!r}: importing module {module_name!r} raised {type(exc).__name__}: {exc}; "
        f'fix the module (python -c "import {module_name}" shows the traceback)'
    )


def _resolve(spec: str, module: types.ModuleType, attr: str) -> object:
    obj: object = module
    parts = attr.split(".")
    for i, part in enumerate(parts):
        owner = f"module {module.__name__!r}" if i == 0 else repr(".".join(parts[:i]))
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            names = _public_names(obj)
            raise AppError(
                f"app {spec!r}: {owner} has no attribute {part!r}{_suggest(part, names)}; "
                f"{_listing(names)}"
            ) from exc
        except Exception as exc:
            raise AppError(
                f"app {spec!r}: getting {part!r} from {owner} raised {type(exc).__name__}: {exc}"
            ) from exc
    return obj


def _public_names(obj: object) -> list[str]:
    """The names worth suggesting: public, and for a module what it defines, not imports."""
    if not isinstance(obj, types.ModuleType):
        return sorted(n for n in dir(obj) if not n.startswith("_"))
    names = []
    for name, value in vars(obj).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        home = getattr(value, "__module__", None)
        if (
            isinstance(home, str)
            and home != obj.__name__
            and not home.startswith(obj.__name__ + ".")
        ):
            continue  # imported from elsewhere (typing.Any, a base class, __future__ flags)
        names.append(name)
    return sorted(names)


def _suggest(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _listing(names: list[str]) -> str:
    if not names:
        return "it has no public names"
    shown = ", ".join(names[:_SHOWN_NAMES])
    more = f", … ({len(names)} in all)" if len(names) > _SHOWN_NAMES else ""
    return f"it has {shown}{more}"


# ---------------------------------------------------------------------------------------------
# open_providers


@asynccontextmanager
async def open_providers(app: object) -> AsyncIterator[dict[str, Provider]]:
    """Open the providers ``app`` gives, checked, for the block.

    ``app`` is a mapping of model name to provider, a function (sync or async) returning one,
    an async context manager yielding one, or a function returning such a context manager.
    A context manager is entered before the block and exited after it, also when the block
    raises (the exception goes through it).

    Raises:
        AppError: ``app`` is none of those, a function needs arguments, or what it gives is not
            a mapping.
        InvalidProvider: a model name or a provider fails :func:`check_providers` (a context
            manager is exited first).
    """
    source = app
    label = _describe(app)
    if _is_factory(app):
        _check_callable_without_arguments(app, label)
        label = f"{label}()"
        source = app()
        if inspect.isawaitable(source):
            source = await source
        if not isinstance(source, Mapping) and not _is_async_cm(source):
            raise AppError(
                f"app: {label} returned {_describe(source)}{_hint(source)}; expected a mapping "
                "of model name to provider or an async context manager yielding one"
            )
    if isinstance(source, Mapping):
        yield check_providers(source)
        return
    if not _is_async_cm(source):
        raise AppError(f"app: got {label}{_hint(source)}; {_ACCEPTED}")
    async with cast(Any, source) as opened:
        if not isinstance(opened, Mapping):
            raise AppError(
                f"app: {label} yielded {_describe(opened)}; expected a mapping of model name "
                "to provider"
            )
        yield check_providers(opened)


def _is_async_cm(obj: object) -> bool:
    # Looked up on the type, as ``async with`` does: a class that defines __aenter__ is itself
    # not a context manager, but a factory of them.
    return hasattr(type(obj), "__aenter__") and hasattr(type(obj), "__aexit__")


def _is_factory(obj: object) -> TypeGuard[Callable[[], object]]:
    # contextlib's context managers are callable too (they double as decorators): a context
    # manager is never called, only entered (or, when synchronous, refused).
    return (
        callable(obj)
        and not isinstance(obj, Mapping)
        and not _is_async_cm(obj)
        and not hasattr(type(obj), "__enter__")
    )


def _check_callable_without_arguments(app: Any, label: str) -> None:
    try:
        signature = inspect.signature(app)
    except (TypeError, ValueError):
        return  # no signature to read (some builtins): calling it will tell
    try:
        signature.bind()
    except TypeError as exc:
        raise AppError(
            f"app: {label} cannot be called without arguments ({exc}); the engine calls it "
            "with none, so give a function that takes none"
        ) from None


def _hint(obj: object) -> str:
    """Why a common wrong object is wrong, in parentheses."""
    if inspect.iscoroutine(obj):
        # Refused, so never awaited: close it, or it warns when garbage collected.
        obj.close()
        return " (name the async function itself, without calling it)"
    if hasattr(type(obj), "__enter__"):
        return " (a synchronous context manager: make it async, e.g. with @asynccontextmanager)"
    return ""


#: Types whose repr is short and says what the value is.
_PLAIN = (int, float, str, bytes, list, tuple, dict, set, frozenset)


def _describe(obj: object) -> str:
    """A short name for ``obj`` in a message: a function or class by its dotted name, a plain
    value by its type and repr, anything else by its type."""
    if obj is None:
        return "None"
    kind: str = type(obj).__qualname__
    if inspect.isroutine(obj) or inspect.isclass(obj):
        module = getattr(obj, "__module__", None)
        name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
        if name is None:
            return _an(kind)
        return f"{module}.{name}" if module else str(name)
    if inspect.iscoroutine(obj):
        return f"coroutine {obj.__qualname__}"
    if isinstance(obj, _PLAIN):
        return f"{kind} {_repr.repr(obj)}"
    return _an(kind)


def _an(type_name: str) -> str:
    """``an EchoProvider object``, ``a Session object``."""
    article = "an" if type_name[:1].lower() in "aeiou" else "a"
    return f"{article} {type_name} object"


# ---------------------------------------------------------------------------------------------
# check_provider(s)


def check_providers(providers: Mapping[str, object]) -> dict[str, Provider]:
    """Check every model name and provider in ``providers`` and return them as a dict.

    Raises:
        InvalidProvider: ``providers`` is not a mapping, a model name is not a non-empty
            string, or a provider fails :func:`check_provider`; every problem at once.
    """
    given: object = providers
    if not isinstance(given, Mapping):
        raise InvalidProvider(
            [f"providers must be a mapping of model name to provider, not {_describe(given)}"]
        )
    problems: list[str] = []
    checked: dict[str, Provider] = {}
    for key, provider in given.items():
        name: object = key
        if not isinstance(name, str) or not name:
            problems.append(
                f"model name {name!r} ({type(name).__qualname__}) is not a non-empty string"
            )
            continue
        problem = _provider_problem(name, provider)
        if problem is None:
            checked[name] = cast(Provider, provider)
        else:
            problems.append(problem)
    if problems:
        raise InvalidProvider(problems)
    return checked


def check_provider(name: str, provider: object) -> Provider:
    """Return ``provider`` if it can serve model ``name``: async ``prepare``, ``submit``,
    ``poll``, ``finalize`` and ``cancel``, and ``poll_interval`` a number >= 0.

    Raises:
        InvalidProvider: naming the model, the provider's class and everything it lacks.
    """
    problem = _provider_problem(name, provider)
    if problem is not None:
        raise InvalidProvider([problem])
    return cast(Provider, provider)


def _provider_problem(name: str, provider: object) -> str | None:
    missing: list[str] = []
    not_async: list[str] = []
    for method in METHODS:
        value = getattr(provider, method, None)
        if value is None:
            missing.append(method)
        elif not _is_async(value):
            not_async.append(method)
    faults: list[str] = []
    interval = getattr(provider, "poll_interval", None)
    if interval is None:
        missing.append("poll_interval")
    elif not _is_interval(interval):
        faults.append(f"has poll_interval {_repr.repr(interval)} ({type(interval).__qualname__})")
    if missing:
        faults.insert(0, f"is missing {_and(missing)}")
    if not_async:
        faults.insert(1 if missing else 0, f"has non-async {_and(not_async)}")
    if not faults:
        return None
    return f"provider for model {name!r} ({type(provider).__qualname__}) {_and(faults)}; {_NEEDS}"


def _is_async(method: object) -> bool:
    # A bound ``async def`` or a partial of one, or an object whose __call__ is ``async def``.
    # (__call__ looked up on the type, as a call does.)
    return inspect.iscoroutinefunction(method) or inspect.iscoroutinefunction(type(method).__call__)


def _is_interval(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _and(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
