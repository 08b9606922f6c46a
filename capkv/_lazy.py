"""Package fronts that import nothing until a name is used (PEP 562, as attrs does).

``import capkv`` then loads no implementation, and ``import capkv.mypy`` (inside
every mypy run) or ``capkv check`` never loads torch unless a connector it names
does. A front lists its names three times, each for one reader: an
``if TYPE_CHECKING:`` import block for type checkers (exact types, no
``__getattr__`` visible to them), ``__all__``, and the ``exports`` map given to
:func:`attach` for the interpreter; ``tests/test_exports.py`` checks that the
three agree.

A front also serves the names that left it (:mod:`capkv._deprecations`): each
read warns with the name's new home. :func:`deprecated_module` does the same for
capkv 0.1.0's modules kept as shims.

This module imports nothing of capkv's layers: what must happen before an
implementation module loads (dev mode's type checks) is registered by the root
front with :func:`before_loading`.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Mapping

from capkv import _homes

__all__ = ["attach", "before_loading", "deprecated_module", "load"]

_hooks: list[Callable[[], None]] = []
_exported: dict[str, frozenset[str]] = {}
"""Front -> the names it exports."""


def before_loading(hook: Callable[[], None]) -> None:
    """Call ``hook()`` each time a front is about to take a name from an implementation module."""
    _hooks.append(hook)


def load(module: str) -> types.ModuleType:
    """Import ``module`` for a front, after the :func:`before_loading` hooks."""
    for hook in _hooks:
        hook()
    return importlib.import_module(module)


class _Front(types.ModuleType):
    """A front's module type: importing a submodule never rebinds a name the front serves.

    ``import capkv.devmode.instrument`` (capkv 0.1.0's module, now a shim) would
    otherwise replace the function ``capkv.devmode.instrument`` with the module
    for the whole process; 0.1.0 kept the function there too.
    """

    def __setattr__(self, name: str, value: object) -> None:
        if (
            isinstance(value, types.ModuleType)
            and hasattr(value, "__deprecated__")  # a shim: never rebinds a name the front serves
            and value.__name__ == f"{self.__name__}.{name}"
            and (name in _exported.get(self.__name__, ()) or name in _table().DEPRECATED.get(self.__name__, {}))
        ):
            return
        super().__setattr__(name, value)


def attach(
    package: str, exports: Mapping[str, Iterable[str]], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of front ``package``.

    ``exports`` maps each defining module to the names the front takes from it;
    ``submodules`` are fronts below this one, reachable as attributes
    (``capkv.devmode``) — importing a front loads nothing, so they need no check.
    ``dir()`` lists exactly these (and the dunders the module sets itself).
    """
    where_defined = {name: module for module, names in exports.items() for name in names}
    below = frozenset(submodules)
    _homes.register(package, exports)
    _exported[package] = frozenset(where_defined)
    front = sys.modules[package]
    front.__class__ = _Front

    def __getattr__(name: str) -> object:
        if name in below:
            return importlib.import_module(f"{package}.{name}")
        where = where_defined.get(name)
        if where is None:
            return _deprecated(package, name)
        value = getattr(load(where), name)
        setattr(front, name, value)  # later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        dunders = [name for name in vars(front) if name.startswith("__") and name.endswith("__")]
        return sorted({*dunders, *where_defined, *below})

    return __getattr__, __dir__


def deprecated_module(module: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``module``, a capkv 0.1.0 module kept as a shim."""
    _deprecations = _table()
    sys.modules[module].__deprecated__ = (  # type: ignore[attr-defined]
        f"{module} is deprecated since capkv {_deprecations.SINCE} and will be removed in "
        f"{_deprecations.REMOVED_IN}: import from capkv's fronts"
    )

    def __getattr__(name: str) -> object:
        return _deprecated(module, name)

    names = sorted(_deprecations.DEPRECATED.get(module, ()))

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__


def _table() -> types.ModuleType:
    """:mod:`capkv._deprecations`, loaded on the first deprecated read (fronts import without it)."""
    return importlib.import_module("capkv._deprecations")


def _deprecated(module: str, name: str) -> object:
    """A name that left ``module``: its value, with a ``DeprecationWarning`` naming its new home.

    Called from a module ``__getattr__``, whose caller the warning points at. A
    ``from package import name`` asks twice — importlib first probes the package
    with ``hasattr`` — so the probe gets the value without a warning.
    """
    if name.startswith("_"):  # private names were never public: nothing to say about them
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _deprecations = _table()
    removed = _deprecations.REMOVED.get(module, {})
    if name in removed:
        raise ImportError(_deprecations.removal(module, name), name=module)
    target = _deprecations.DEPRECATED.get(module, {}).get(name)
    if target is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    value = getattr(load(target), name)
    frame = inspect.currentframe()
    caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    if caller is None or caller.f_code.co_name != "_handle_fromlist":
        warnings.warn(_deprecations.message(module, name), DeprecationWarning, stacklevel=3)
    return value
