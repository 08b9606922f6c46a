"""capkv 0.1.0's ``capkv.devmode.scan``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.contracts import _id_scan
    from capkv.contracts._id_scan import BadId as BadId

    @deprecated("capkv.devmode.scan.all_valid is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_id_scan.all_valid)
    def all_valid() -> None: ...

    @deprecated("capkv.devmode.scan.expected_id is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_id_scan.expected_id)
    def expected_id() -> None: ...

    @deprecated("capkv.devmode.scan.first_bad_id is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_id_scan.first_bad_id)
    def first_bad_id() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
