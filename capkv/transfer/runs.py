"""capkv 0.1.0's ``capkv.transfer.runs``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.transfer import _runs
    from capkv.transfer._runs import LayerRuns as LayerRuns
    from capkv.transfer._runs import WORD_DTYPES as WORD_DTYPES

    @deprecated("capkv.transfer.runs.layer_runs is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_runs.layer_runs)
    def layer_runs() -> None: ...

    @deprecated("capkv.transfer.runs.storage_words is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_runs.storage_words)
    def storage_words() -> None: ...

    @deprecated("capkv.transfer.runs.widest_word is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_runs.widest_word)
    def widest_word() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
