"""``StoreConnector``: a prefix store for every KV-cache group over any :class:`~capkv.stores.Backend`.

Keys, value checks, step saves, pins, the background writer and the worker's reports are all here, so a
backend only stores bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from capkv._homes import publish
from capkv.contracts._arguments import argument_error, require_str
from capkv.contracts._engine import BlockIds, ComputedTokenRequest, KVTransferParams
from capkv.contracts._spec import KVSpec
from capkv.stores._backend import Backend
from capkv.stores._base import PrefixStoreConnector, require_store_spec
from capkv.stores._index import BackendIndex
from capkv.stores._worker import StoreWorker

if TYPE_CHECKING:
    import torch

__all__ = ["StoreConnector", "require_backend"]

_MEMBERS = ("contains", "get", "put", "delete", "close")


def require_backend(backend: object, owner: str) -> Backend:
    """``backend``, when it has every member of the :class:`~capkv.stores.Backend` contract."""
    missing = [name for name in _MEMBERS if not callable(getattr(backend, name, None))]
    if isinstance(backend, type):
        missing = ["an instance, not the class"]
    if missing:
        raise argument_error(
            owner, "backend", backend,
            f"a capkv.stores.Backend (missing {', '.join(missing)})", connector=owner, method="__init__",
        )
    return cast("Backend", backend)  # every member checked above


class StoreConnector(PrefixStoreConnector):
    """A prefix cache for every KV-cache group (HMA-capable), its blocks kept by ``backend``.

    ``spec`` describes the engine's KV cache (every group's layers, block size,
    sliding window, per-layer shape; the dtype). ``namespace`` separates models
    that share layer names and shapes. ``background``: write saves on the
    writer's threads (a backend whose ``put`` takes time: files, a network), or
    in the engine's step (``False``), or only when the KV cache is on CUDA
    (``None``). The connector owns the backend: ``close()`` (or ``with``)
    finishes the saves, raises the failures not raised yet, and closes it.
    """

    def __init__(self, spec: KVSpec, backend: Backend, *, namespace: str = "", background: bool | None = True) -> None:
        name = type(self).__name__
        require_store_spec(spec, name)
        require_backend(backend, name)
        require_str(namespace, name, "namespace", connector=name, method="__init__")
        if background not in (True, False, None):
            raise argument_error(name, "background", background, "True, False or None", connector=name, method="__init__")
        self.backend: Backend = backend
        """Where the blocks live."""
        self.index: BackendIndex = BackendIndex(backend, spec, owner=name)
        """The scheduler side's view of the backend's contents."""
        self._store = StoreWorker(spec, backend, owner=name, background=background)
        super().__init__(spec, self.index, self._store, namespace=namespace)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        super().register_kv_caches(kv_caches)
        self.index.set_layout(self._store.fingerprints, self.spec.shard.index)  # both sides here: no need to wait

    def request_finished_all_groups(
        self, request: ComputedTokenRequest, block_ids: BlockIds, /
    ) -> tuple[bool, KVTransferParams | None]:
        """Save the request's computed full blocks not saved yet; hold them until they are gathered."""
        return self._finish(request, block_ids, "request_finished_all_groups")


publish(__name__)
