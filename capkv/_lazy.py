"""Package fronts that import nothing until a name is used (PEP 562, as attrs does).

So ``import capkv`` loads no implementation, and ``import capkv.mypy`` (inside every mypy run) or ``capkv
check`` never loads torch unless a connector it names does.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Iterable, Mapping

from capkv import _homes

__all__ = ["attach", "before_loading", "load"]

_hooks: list[Callable[[], None]] = []


def before_loading(hook: Callable[[], None]) -> None:
    """Call ``hook()`` each time a front is about to take a name from an implementation module.

    This module imports nothing of capkv's layers: what must happen before an implementation module loads (dev
    mode's type checks) is registered by the root front here.
    """
    _hooks.append(hook)


def load(module: str) -> types.ModuleType:
    """Import ``module`` for a front, after the :func:`before_loading` hooks."""
    for hook in _hooks:
        hook()
    return importlib.import_module(module)


def attach(
    package: str, exports: Mapping[str, Iterable[str]], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of front ``package``.

    ``exports`` maps each defining module to the names the front takes from it;
    ``submodules`` are fronts below this one, reachable as attributes
    (``capkv.devmode``) — importing a front loads nothing, so they need no check.
    ``dir()`` lists exactly these (and the dunders the module sets itself).

    A front lists its names three times, each for one reader: an ``if TYPE_CHECKING:`` import block for type
    checkers (exact types, no ``__getattr__`` visible to them), ``__all__``, and the ``exports`` map given
    here for the interpreter; ``tests/test_exports.py`` checks that the three agree.
    """
    where_defined = {name: module for module, names in exports.items() for name in names}
    below = frozenset(submodules)
    _homes.register(package, exports)
    front = sys.modules[package]

    def __getattr__(name: str) -> object:
        if name in below:
            return importlib.import_module(f"{package}.{name}")
        where = where_defined.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(load(where), name)
        setattr(front, name, value)  # later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        dunders = [name for name in vars(front) if name.startswith("__") and name.endswith("__")]
        return sorted({*dunders, *where_defined, *below})

    return __getattr__, __dir__
