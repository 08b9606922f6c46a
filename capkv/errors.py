"""capkv's exceptions.

Every error capkv raises is a :class:`CapkvError`, so an engine can catch capkv's
refusals in one place. Each carries the facts a person needs to fix the stack —
which connector, which method, which KV-cache group, which value — both in its
message and as attributes, so engines can log or react to them structurally.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "CapabilityError",
    "CapkvError",
    "ConfigError",
    "ConflictError",
    "ContractError",
    "MetadataError",
]


class CapkvError(Exception):
    """Base class of every error capkv raises."""

    connector: str | None
    """Name (class, or position and class inside a stack) of the connector at fault."""
    method: str | None
    """The connector method during which the problem was found."""
    group: int | None
    """The KV-cache group index concerned, when one is."""
    value: object
    """The offending value, when there is one."""

    def __init__(
        self,
        message: str,
        *,
        connector: str | None = None,
        method: str | None = None,
        group: int | None = None,
        value: object = None,
    ) -> None:
        super().__init__(message)
        self.connector = connector
        self.method = method
        self.group = group
        self.value = value


class CapabilityError(CapkvError):
    """A connector (or a child of a stack) lacks a capability the engine needs.

    Raised before serving by :func:`capkv.check_stack`, and by
    :func:`capkv.finish_request` instead of silently truncating to group 0.
    """


class ConflictError(CapkvError):
    """Children of a stack disagree where the engine needs one answer.

    KV-cache layouts, finished counts, memory pools, or ``kv_transfer_params`` keys.
    """

    delay_free: bool | None = None
    """Raised while finishing a request: whether a child had already accepted an
    asynchronous save, so the engine must keep the request's blocks until it is
    reported in ``finished_sending`` (``None`` elsewhere)."""


class ConfigError(CapkvError, ValueError):
    """A description capkv was given (a KV spec, a stack configuration) is malformed."""


class MetadataError(CapkvError):
    """A composite was handed metadata that it did not build (wrong type or arity)."""


class ContractError(CapkvError):
    """A dev-mode contract was violated by a transfer call (block ids or KV tensors).

    In dev mode, a call into capkv that breaks capkv's own type hints raises it too.
    """

    position: int | None
    """Where in the value: a block id's index in its group, a tensor's dimension."""
    expected: str | None
    """What the contract expected there, in words."""

    def __init__(
        self,
        message: str,
        *,
        connector: str | None = None,
        method: str | None = None,
        group: int | None = None,
        value: object = None,
        position: int | None = None,
        expected: str | None = None,
    ) -> None:
        super().__init__(message, connector=connector, method=method, group=group, value=value)
        self.position = position
        self.expected = expected


class ArgumentError(ConfigError, TypeError):
    """A public constructor or entry point was given a bad argument.

    Raised in production, not only in dev mode, before anything is built or
    stored. It is a :class:`ConfigError` (so a ``ValueError``) *and* a
    ``TypeError``, so callers that catch either builtin for a bad argument —
    a wrong type or a value out of range — catch it, and ``except CapkvError``
    catches every refusal at once. :attr:`parameter` names the argument;
    :attr:`value` holds what was passed.
    """

    parameter: str | None
    """The argument at fault, as the signature names it (``num_blocks``, ``groups[1].block_size``)."""

    def __init__(
        self,
        message: str,
        *,
        parameter: str | None = None,
        connector: str | None = None,
        method: str | None = None,
        group: int | None = None,
        value: object = None,
    ) -> None:
        super().__init__(message, connector=connector, method=method, group=group, value=value)
        self.parameter = parameter
