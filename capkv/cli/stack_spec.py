"""capkv 0.1.0's ``capkv.cli.stack_spec``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. ``StackTree``, ``build_stack``, ``render_stack`` are gone (an
``ImportError`` says why). Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.cli import _stack_spec

    @deprecated("capkv.cli.stack_spec.parse_stack is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_stack_spec.parse_stack)
    def parse_stack() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
