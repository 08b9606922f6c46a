"""Arguments of public constructors and entry points, checked in production.

Configuration files and untyped callers reach past static types; a wrong value fails here, as an
:class:`~capkv.errors.ArgumentError` naming the owner, the parameter and the value, not later and far away.
"""

from __future__ import annotations

import math
import reprlib
import sys
from collections.abc import Callable
from typing import Any, cast

from capkv.errors import ArgumentError

__all__ = [
    "argument_error",
    "is_finite_number",
    "require_callable",
    "require_instance",
    "require_device",
    "require_dtype",
    "require_int",
    "require_names",
    "require_optional_int",
    "require_shape",
    "require_str",
]

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 80
_short.maxlist = _short.maxtuple = 8


def argument_error(
    owner: str,
    parameter: str,
    value: object,
    expected: str,
    *,
    connector: str | None = None,
    method: str | None = None,
    group: int | None = None,
) -> ArgumentError:
    """``KVSpec: num_blocks must be an int >= 1, got 1.5 (float)``."""
    shown = _short.repr(value)
    kind = type(value).__name__
    return ArgumentError(
        f"{owner}: {parameter} must be {expected}, got {shown} ({kind})",
        parameter=parameter, connector=connector, method=method or owner, group=group, value=value,
    )


def _range_words(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an int in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an int >= {minimum}"
    if maximum is not None:
        return f"an int <= {maximum}"
    return "an int"


def require_int(
    value: object,
    owner: str,
    parameter: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    connector: str | None = None,
    method: str | None = None,
    group: int | None = None,
) -> int:
    """``value`` when it is an ``int`` (not a ``bool``, not a float however whole) in range.

    Integer-like objects that are not ``bool`` (numpy integers) are accepted
    through ``__index__``, and returned as a plain ``int``.

    Configuration and untyped callers pass ``True`` (``bool`` *is* an ``int`` to Python), ``1.5`` or ``inf``
    for a count: each would be accepted and fail later, or silently mean something else.
    """
    number: int | None = None
    if type(value) is int:
        number = value
    elif not isinstance(value, bool | float | str | bytes) and hasattr(type(value), "__index__"):
        try:
            number = int(cast(Any, value).__index__())
        except Exception:  # a broken __index__ is a bad value like any other
            number = None
    if number is None or (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise argument_error(
            owner, parameter, value, _range_words(minimum, maximum), connector=connector, method=method, group=group
        )
    return number


def require_optional_int(
    value: object,
    owner: str,
    parameter: str,
    *,
    minimum: int | None = None,
    connector: str | None = None,
    method: str | None = None,
    group: int | None = None,
) -> int | None:
    """``None``, or :func:`require_int`."""
    if value is None:
        return None
    return require_int(value, owner, parameter, minimum=minimum, connector=connector, method=method, group=group)


def require_str(
    value: object,
    owner: str,
    parameter: str,
    *,
    empty: bool = True,
    connector: str | None = None,
    method: str | None = None,
) -> str:
    """``value`` when it is a ``str`` (non-empty unless ``empty``)."""
    if not isinstance(value, str) or (not empty and not value):
        expected = "a str" if empty else "a non-empty str"
        raise argument_error(owner, parameter, value, expected, connector=connector, method=method)
    return value


def require_names(
    value: object, owner: str, parameter: str, *, group: int | None = None, method: str | None = None
) -> tuple[str, ...]:
    """A tuple or list of distinct non-empty ``str`` names, as a tuple; a lone ``str`` is refused.

    A ``str`` is a sequence of one-letter names to Python: ``"abc"`` would otherwise pass as three names.
    """
    expected = "a tuple of distinct non-empty str names"
    if not isinstance(value, tuple | list):
        raise argument_error(owner, parameter, value, expected, group=group, method=method)
    names = tuple(cast("tuple[object, ...] | list[object]", value))
    for index, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise argument_error(owner, f"{parameter}[{index}]", name, "a non-empty str", group=group, method=method)
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise argument_error(owner, parameter, names, f"{expected} ({twice!r} is there twice)", group=group, method=method)
    return cast("tuple[str, ...]", names)


def require_shape(
    value: object, owner: str, parameter: str, *, group: int | None = None, method: str | None = None
) -> tuple[int, ...]:
    """A non-empty tuple or list of ints >= 1 (a tensor shape), as a tuple."""
    given: object = value
    if not isinstance(given, tuple | list) or not given:
        raise argument_error(owner, parameter, value, "a non-empty tuple of ints >= 1", group=group, method=method)
    dims = cast("tuple[object, ...] | list[object]", given)
    return tuple(
        require_int(dim, owner, f"{parameter}[{index}]", minimum=1, group=group, method=method)
        for index, dim in enumerate(dims)
    )


def require_dtype(value: object, owner: str, parameter: str = "dtype", *, optional: bool = True) -> Any:
    """``value`` when it is a ``torch.dtype`` (or ``None`` when ``optional``); a dtype's *name* is refused.

    torch is not imported for the check: a value can only be a ``torch.dtype`` if torch is already imported.
    """
    if value is None and optional:
        return None
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.dtype):
        hint = f" (torch.{value})" if isinstance(value, str) else ""
        raise argument_error(
            owner, parameter, value, f"a torch.dtype{hint}{' or None' if optional else ''}"
        )
    return value


def require_device(value: object, owner: str, parameter: str = "device") -> Any:
    """``None``, a ``torch.device``, or a device string such as ``"cpu"`` / ``"cuda:0"`` (made a ``torch.device``)."""
    if value is None:
        return None
    if isinstance(value, str):
        import torch  # a device string needs torch to be parsed

        try:
            return torch.device(value)
        except (RuntimeError, ValueError) as exc:
            raise argument_error(owner, parameter, value, f"a torch.device or a device name ({exc})") from None
    torch_module = sys.modules.get("torch")
    if torch_module is None or not isinstance(value, torch_module.device):
        raise argument_error(owner, parameter, value, "a torch.device, a device name, or None")
    return value


def require_instance(value: object, cls: type[Any] | tuple[type[Any], ...], owner: str, parameter: str, expected: str, **where: Any) -> None:
    """Refuse ``value`` unless it is a ``cls``: for arguments typed ``cls`` that untyped callers may get wrong."""
    if not isinstance(value, cls):
        raise argument_error(owner, parameter, value, expected, **where)


def require_callable(value: object, owner: str, parameter: str, *, connector: str | None = None) -> Callable[..., Any]:
    """``value`` when it is callable."""
    if not callable(value):
        raise argument_error(owner, parameter, value, "a callable", connector=connector, method="__init__")
    return cast("Callable[..., Any]", value)


def is_finite_number(value: object) -> bool:
    """Whether ``value`` is a real, finite ``int`` or ``float`` (not a ``bool``)."""
    return type(value) is int or (type(value) is float and math.isfinite(value))
