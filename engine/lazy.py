"""Names a package exports but loads on first use (PEP 562), so importing the package is cheap.

``engine``, ``engine.db`` and ``engine.testing`` export names from modules that pull in trio,
asyncpg or the whole service; each keeps a table of name → module and answers its module-level
``__getattr__`` and ``__dir__`` with a :class:`LazyExports`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

__all__ = ["LazyExports"]


class LazyExports:
    """The lazily loaded names of one package.

    Args:
        package: the package's name (``__name__``), for the error of an unknown name.
        modules: each exported name → the module that defines it.
        namespace: the package's ``globals()``; a loaded name is stored there, so later lookups
            do not come back here.
    """

    def __init__(
        self, package: str, modules: Mapping[str, str], namespace: MutableMapping[str, Any]
    ) -> None:
        self._package = package
        self._modules = modules
        self._namespace = namespace

    def load(self, name: str) -> Any:
        """The value of ``name``, imported from its module now.

        Raises:
            AttributeError: the package exports no such name.
        """
        module = self._modules.get(name)
        if module is None:
            raise AttributeError(f"module {self._package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        self._namespace[name] = value
        return value

    def names(self, exported: Iterable[str]) -> list[str]:
        """The package's names for ``dir()``: what it holds and what it exports."""
        return sorted({*self._namespace, *exported})
