"""Package fronts that import nothing until a name is used (PEP 562, as attrs does).

``import capkv`` then costs microseconds, and ``import capkv.mypy`` (inside every
mypy run) or ``capkv check`` never loads torch unless a connector it names does.
A front lists its names three times, each for one reader: an ``if TYPE_CHECKING:``
import block for type checkers (exact types, no ``__getattr__`` visible to them),
``__all__``, and the ``exports`` map given to :func:`attach` for the interpreter;
``tests/test_exports.py`` checks that the three agree.

The first name taken from any front also puts capkv under beartype in dev mode
(:func:`capkv.devmode._mode.check_capkv_types`), before an implementation module
loads; a process that takes no name (mypy with the plugin) never turns it on.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping

__all__ = ["attach"]


def attach(
    package: str, exports: Mapping[str, Iterable[str]], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of front ``package``.

    ``exports`` maps each defining module to the names the front takes from it;
    ``submodules`` are fronts below this one, reachable as attributes
    (``capkv.devmode``) — importing a front loads nothing, so they need no check.
    """
    where_defined = {name: module for module, names in exports.items() for name in names}
    below = frozenset(submodules)

    def __getattr__(name: str) -> object:
        if name in below:
            return importlib.import_module(f"{package}.{name}")
        where = where_defined.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _types_checked_first()
        value = getattr(importlib.import_module(where), name)
        setattr(sys.modules[package], name, value)  # later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where_defined, *below})

    return __getattr__, __dir__


def _types_checked_first() -> None:
    # Imported here: capkv.devmode is itself a front built by attach().
    from capkv.devmode._mode import check_capkv_types

    check_capkv_types()
