"""One wording for every contract violation: who, which call, where, what, and what was expected."""

from __future__ import annotations

import reprlib

from capkv._torch import is_tensor
from capkv.errors import ContractError

__all__ = ["contract_error"]

class _Short(reprlib.Repr):
    """Short reprs; a tensor by its metadata, since printing values would read (and sync) the device."""

    def repr1(self, x: object, level: int) -> str:
        if is_tensor(x):
            return f"<tensor {tuple(x.shape)} {x.dtype} on {x.device}>"
        return super().repr1(x, level)


_short = _Short()
_short.maxlist = _short.maxtuple = _short.maxdict = 8
_short.maxstring = _short.maxother = 80


def contract_error(
    connector: str,
    method: str,
    subject: str,
    *,
    value: object,
    problem: str,
    expected: str,
    group: int | None = None,
    position: int | None = None,
) -> ContractError:
    """``Plain.update_state_after_alloc: blocks group 1, position 3: 4096 is outside the pool; expected ...``."""
    where = "" if group is None else f" group {group}"
    if position is not None:
        where += f", position {position}" if where else f" position {position}"
    return ContractError(
        f"{connector}.{method}: {subject}{where}: {_short.repr(value)} {problem}; expected {expected}",
        connector=connector,
        method=method,
        group=group,
        value=value,
        position=position,
        expected=expected,
    )
