"""capkv 0.1.0's ``capkv.connectors.block_file``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. ``HEADER_SIZE``, ``ReadResult``, ``block_path``,
``read_block_file``, ``tensor_memory``, ``write_block_file`` are gone (an ``ImportError`` says why).
Reading a name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.connectors import _block_file
    from capkv.connectors._block_file import TEMP_SUFFIX as TEMP_SUFFIX

    @deprecated("capkv.connectors.block_file.sweep_temporary_files is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_block_file.sweep_temporary_files)
    def sweep_temporary_files() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
