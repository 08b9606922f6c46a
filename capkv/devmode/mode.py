"""capkv 0.1.0's ``capkv.devmode.mode``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.devmode` now; its other names are internal. Reading a
name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.devmode import _mode
    from capkv.devmode._mode import ENV_VAR as ENV_VAR

    @deprecated("capkv.devmode.mode.check_capkv_types is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_mode.check_capkv_types)
    def check_capkv_types() -> None: ...

    @deprecated("capkv.devmode.mode.dev_mode is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.dev_mode")
    @signature_of(_mode.dev_mode)
    def dev_mode() -> None: ...

    @deprecated("capkv.devmode.mode.enabled is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.enabled")
    @signature_of(_mode.enabled)
    def enabled() -> None: ...

    @deprecated("capkv.devmode.mode.forced_off is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.forced_off")
    @signature_of(_mode.forced_off)
    def forced_off() -> None: ...

    @deprecated("capkv.devmode.mode.set_dev_mode is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.set_dev_mode")
    @signature_of(_mode.set_dev_mode)
    def set_dev_mode() -> None: ...

    @deprecated("capkv.devmode.mode.types_checked is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.types_checked")
    @signature_of(_mode.types_checked)
    def types_checked() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
