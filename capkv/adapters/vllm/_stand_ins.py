"""capkv connectors as vLLM connectors, for vLLM's own composite rules only: a stand-in per capkv class.

vLLM's rules ask a child class through its factory (by name and module path: this module) and a child
instance directly; a stand-in answers by its capkv connector's own member, else vLLM's base.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, cast

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = ["MODULE", "stand_in", "stand_in_class", "stand_in_name"]

MODULE = __name__
"""The ``kv_connector_module_path`` that names a stand-in."""


def stand_in_name(cls: type[Any]) -> str:
    """The ``kv_connector`` that names ``cls``'s stand-in in :data:`MODULE`."""
    return f"{cls.__module__}:{cls.__qualname__}"


def __getattr__(name: str) -> type[KVConnectorBase_V1]:
    """vLLM's factory looks the stand-in up by name (``"package.module:Class"``)."""
    module, colon, qualname = name.partition(":")
    if not colon:
        raise AttributeError(name)
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return stand_in_class(target)


def stand_in_class(cls: type[Any]) -> type[KVConnectorBase_V1]:
    """A vLLM connector class answering for capkv class ``cls``: each public member of vLLM's base that
    ``cls`` also has is ``cls``'s (class-level members called with vLLM's arguments where they take them)."""
    made = _made.get(cls)
    if made is None:
        made = _made[cls] = _make(cls)
    return made


_made: dict[type[Any], type[KVConnectorBase_V1]] = {}


def _make(cls: type[Any]) -> type[KVConnectorBase_V1]:
    namespace: dict[str, Any] = {"__module__": MODULE, "__qualname__": stand_in_name(cls), "capkv_class": cls}
    for name in dir(KVConnectorBase_V1):
        if name.startswith("_") or name == "role" or not hasattr(cls, name):
            continue
        member: object = inspect.getattr_static(cls, name)
        if isinstance(member, classmethod | staticmethod):
            namespace[name] = classmethod(_class_level(name))
        elif isinstance(member, property) or not callable(member):
            namespace[name] = property(_attribute(name))
        else:
            namespace[name] = _instance(name)
    made: Any = type(cls.__name__, (KVConnectorBase_V1,), namespace)
    made.__abstractmethods__ = frozenset()  # never served: it only answers vLLM's composite rules
    return cast("type[KVConnectorBase_V1]", made)


def stand_in(leaf: object, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> Any:
    """``leaf`` (a built capkv connector) as a vLLM connector with vLLM's base state (``_vllm_config``, ...)."""
    cls = stand_in_class(cast("type[Any]", type(leaf)))
    made: Any = cls.__new__(cls)
    KVConnectorBase_V1.__init__(made, vllm_config, role, kv_cache_config)
    made.capkv_leaf = leaf
    return made


def _class_level(name: str) -> Any:
    def answer(stand: type[Any], *args: Any, **kwargs: Any) -> Any:
        own: Any = getattr(stand.capkv_class, name)
        return own(*args, **kwargs) if _takes(own, args, kwargs) else own()

    answer.__name__ = name
    return answer


def _instance(name: str) -> Any:
    def answer(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.capkv_leaf, name)(*args, **kwargs)

    answer.__name__ = name
    return answer


def _attribute(name: str) -> Any:
    def answer(self: Any) -> Any:
        return getattr(self.capkv_leaf, name)

    return answer


def _takes(member: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        inspect.signature(member).bind(*args, **kwargs)
    except TypeError:
        return False
    except ValueError:  # no signature to read
        return True
    return True
