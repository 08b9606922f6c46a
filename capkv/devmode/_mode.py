"""The dev-mode switch, read once — never per call.

An optimised interpreter (``python -O``) is production, where the checks must cost nothing: dev mode is off
there whatever the environment says.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator
from contextlib import contextmanager

from capkv._homes import publish

__all__ = [
    "ENV_VAR",
    "check_capkv_types",
    "dev_mode",
    "enabled",
    "forced_off",
    "set_dev_mode",
    "types_checked",
]

ENV_VAR = "CAPKV_DEV"
"""``CAPKV_DEV=1`` turns dev mode on; ``0``, ``false``, ``no`` or ``off`` turns it off even under ``-X dev``."""

_OFF_VALUES = frozenset({"0", "false", "no", "off"})

_UNCHECKED = (
    "capkv.devmode",
    "capkv.testing",
    "capkv.contracts._arguments",
    "capkv.contracts._block_ids",
    "capkv.contracts._id_scan",
    "capkv.contracts._kv_tensors",
    "capkv.contracts._violation",
    "capkv.adapters.vllm._composite_rule",
    "capkv.adapters.vllm._host",
    "capkv.adapters.vllm._host_class",
    "capkv.adapters.vllm._host_facts",
    "capkv.adapters.vllm._host_stats",
    "capkv.adapters.vllm._host_worker",
    "capkv.adapters.vllm._members",
    "capkv.adapters.vllm._drop_in",
    "capkv.adapters.vllm._stand_ins",
    "capkv.adapters.vllm._vllm_calls",
)
"""Modules left out of dev mode's beartype: validators that check every element of what they get,
capkv.testing, whose fakes answer whatever a test sets (wrong types included) so the checks under test
catch them, and the vLLM hosts' members, which take whatever vLLM hands a connector (vLLM's own tests hand
mocks) and pass it to the hosted stack, which dev mode instruments (:func:`capkv.devmode.instrument`)."""

_override: bool | None = None
_types_checked = False
_types_decided = False


def forced_off() -> bool:
    """Whether the interpreter runs with ``-O``, which forces dev mode off."""
    return sys.flags.optimize > 0


def enabled() -> bool:
    """Whether dev mode is on now: the override if set, else the environment; never under ``-O``.

    Dev mode is on with ``CAPKV_DEV=1`` or ``python -X dev`` (``PYTHONDEVMODE=1``); engines and tests may
    override the environment with :func:`set_dev_mode` or :func:`dev_mode`.

    Two things read the switch: :func:`capkv.devmode.instrument`, once per connector when it wraps one, and
    the first name a process takes from a capkv front (``capkv.MultiConnector``, ``from capkv.connectors
    import ...``), which puts capkv's own functions under beartype when dev mode is on at that moment
    (:func:`check_capkv_types`). A process that only imports ``capkv.mypy`` (mypy, with the plugin) takes no
    name, so dev mode never puts beartype inside mypy.
    """
    if forced_off():
        return False
    if _override is not None:
        return _override
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value:
        return value not in _OFF_VALUES
    return bool(sys.flags.dev_mode)


def set_dev_mode(on: bool | None) -> None:
    """Override the environment (``None`` returns to it).

    Under ``python -O`` the override is recorded but dev mode stays off. Only
    later :func:`capkv.devmode.instrument` calls see the change: connectors already
    instrumented, and capkv's own type checks (fixed at import), keep theirs.
    """
    global _override
    _override = on


@contextmanager
def dev_mode(on: bool | None = True) -> Generator[bool]:
    """Override the switch inside a ``with`` block (``None``: the environment); yields whether dev mode is in effect."""
    global _override
    saved = _override
    _override = on
    try:
        yield enabled()
    finally:
        _override = saved


def types_checked() -> bool:
    """Whether capkv's own functions run under beartype in this process (dev mode at import)."""
    return _types_checked


def check_capkv_types() -> None:
    """Put the rest of capkv under beartype when dev mode is on; the fronts call this first.

    Type-hint violations in calls into capkv then raise :class:`~capkv.ContractError`,
    like every other dev-mode contract. Modules imported before this call are left as
    they are, so the fronts (:mod:`capkv._lazy`) run it before they import an
    implementation module. ``capkv.devmode`` itself and the contract validators
    (:data:`_UNCHECKED`) are skipped: they take ``object`` and judge every element
    themselves, and beartype around them would only slow down every checked call;
    so is the mypy plugin, which runs inside mypy.
    """
    global _types_checked, _types_decided
    if _types_decided:  # decided once per process, by the switch at the first call
        return
    _types_decided = True
    if not enabled():
        return
    from beartype import BeartypeConf
    from beartype.claw import beartype_package

    from capkv.errors import ContractError

    conf = BeartypeConf(violation_type=ContractError, claw_skip_package_names=(*_UNCHECKED, "capkv.mypy"))
    beartype_package("capkv", conf=conf)
    _types_checked = True


publish(__name__)
