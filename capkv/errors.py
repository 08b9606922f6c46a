"""capkv's exceptions.

Every refusal is a :class:`CapkvError`, so an engine catches capkv's in one place, and reads the facts to fix
the stack (connector, method, group, value) as attributes as well as in the message.
"""

import copyreg as _copyreg

__all__ = [
    "ArgumentError",
    "CapabilityError",
    "CapkvError",
    "ConfigError",
    "ConflictError",
    "ContractError",
    "FinishError",
    "MetadataError",
    "SubConnectorError",
]

_NEW_OBJECT: object = vars(_copyreg)["__newobj__"]  # pickle writes it as NEWOBJ (typeshed omits the name)


class CapkvError(Exception):
    """Base class of every error capkv raises.

    Each carries the facts a person needs to fix the stack — which connector, which method, which KV-cache
    group, which value — both in its message and as attributes, so engines can log or react to them
    structurally.
    """

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

    def __reduce__(self) -> tuple[object, ...]:
        """Errors cross process boundaries (engines run workers in other processes): keep every field.

        Rebuilt without calling ``__init__`` (whose required fields differ by subclass), then given
        the message and fields back; the pickle names the error's class and nothing else of capkv.
        """
        return (_NEW_OBJECT, (type(self),), {**self.__dict__, "args": self.args})


class CapabilityError(CapkvError, ValueError):
    """A connector (or a child of a stack) lacks a capability the engine needs.

    Raised before serving by :func:`capkv.check_stack`, and by
    :func:`capkv.finish_request` instead of silently truncating to group 0. A
    ``ValueError`` too, as vLLM's own refusal of a connector that cannot serve its
    hybrid allocator is.
    """


class ConflictError(CapkvError, ValueError):
    """Children of a stack disagree where the engine needs one answer.

    KV-cache layouts, finished counts, memory pools, or ``kv_transfer_params`` keys.
    A ``ValueError`` too, as vLLM's composite raises for the same conflicts (code
    that catches vLLM's error catches capkv's).
    """


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


class SubConnectorError(CapkvError):
    """Sub-connectors of a stack failed during a call that still reached every child.

    A composite calls every child even when one raises (a child left uncalled
    would never save, load or release what it holds), keeps what the others
    handed over, and then raises this one error. ``exceptions`` holds each
    failing child's exception (or capkv's :class:`ContractError` about its
    answer), in stack order; ``connector`` names those children. The message
    says where the other children's results went: returned by the next call of
    the same method, or attached as :attr:`partial`.
    """

    exceptions: tuple[Exception, ...]
    """The children's exceptions, in stack order."""
    partial: object
    """What the call built from the other children, for calls whose result cannot wait
    for the next call (``build_connector_meta``: ship it as this step's metadata);
    ``None`` otherwise."""

    def __init__(
        self,
        message: str,
        exceptions: tuple[Exception, ...],
        *,
        connector: str | None = None,
        method: str | None = None,
        partial: object = None,
    ) -> None:
        super().__init__(message, connector=connector, method=method, value=exceptions)
        self.exceptions = exceptions
        self.partial = partial


class FinishError(SubConnectorError):
    """Finishing a request failed in a stack; :attr:`delay_free` says what to do with its blocks.

    ``delay_free=True``: some child had already accepted an asynchronous save of
    the request, so the engine must keep its blocks until the request comes
    back in ``finished_sending`` (the stack waits for exactly those children).
    ``delay_free=False``: no child is reading the blocks; free them.
    """

    delay_free: bool
    """Whether the engine must keep the request's blocks (required: never guessed)."""
    kv_transfer_params: dict[str, object] | None
    """The transfer parameters the children returned, merged (first one wins a clash)."""

    def __init__(
        self,
        message: str,
        exceptions: tuple[Exception, ...],
        *,
        delay_free: bool,
        kv_transfer_params: dict[str, object] | None = None,
        connector: str | None = None,
        method: str | None = None,
    ) -> None:
        super().__init__(message, exceptions, connector=connector, method=method)
        self.delay_free = delay_free
        self.kv_transfer_params = kv_transfer_params
