"""A child that is not a ``KVConnector``: every checker refuses it; the plugin says which member differs, and how.

Plain mypy lists every overload of ``MultiConnector`` (eighteen) and, for a
renamed parameter, nothing more; with ``capkv.mypy`` the one error per child
names the member and the difference, in the runtime refusal's words. The call
is then ``Any``, so no second error follows where it is used.
"""

from __future__ import annotations

from typing import Any

from capkv import KVConnector, MultiConnector, SupportsHMA
from tests.typing_cases._connectors import Disk, Offload


class Renamed(Offload):
    """One parameter of save_kv_layer renamed: the engine passes it by name."""

    def save_kv_layer(self, name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...  # type: ignore[override]


class WrongReturn(Offload):
    def wait_for_save(self) -> int: return 0  # type: ignore[override]


class Several(Offload):
    def start_load_kv(self, forward_context: Any) -> None: ...  # type: ignore[override]
    def wait_for_layer_load(self, layer_name: int, /) -> None: ...  # type: ignore[override]
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, extra: int, **kwargs: Any) -> None: ...  # type: ignore[override]


class Stranger:
    """Not written against the contract at all."""

    def wait_for_save(self) -> None: ...


def needs_hma(connector: SupportsHMA) -> None: ...
def needs_connector(connector: KVConnector) -> None: ...


hma, plain = Offload(), Disk()

MultiConnector(hma, Renamed())  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #2 "Renamed" is not a KVConnector (save_kv_layer: parameter "layer_name" is named "name")  [capkv-connector]
needs_connector(MultiConnector(Renamed(), plain))  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #1 "Renamed" is not a KVConnector (save_kv_layer: parameter "layer_name" is named "name")  [capkv-connector]
needs_hma(MultiConnector(hma, WrongReturn()))  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #2 "WrongReturn" is not a KVConnector (wait_for_save: returns "int", the contract needs "None")  [capkv-connector]
stack = MultiConnector(Several())  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #1 "Several" is not a KVConnector (save_kv_layer: requires parameter "extra", which the engine does not pass; start_load_kv: takes no **kwargs; wait_for_layer_load: parameter 1 takes "int", the engine passes "str")  [capkv-connector]
MultiConnector(plain, Stranger(), 3)  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #2 "Stranger" is not a KVConnector (missing bind_connector_metadata, build_connector_meta, build_connector_worker_meta and 21 more)  [capkv-connector]
# ^ mypy+plugin: MultiConnector: sub-connector #3 "int" is not a KVConnector (it has none of the contract's members)  [capkv-connector]
MultiConnector(hma, hma, hma, hma, hma, hma, hma, hma, hma, Renamed())  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #10 "Renamed" is not a KVConnector (save_kv_layer: parameter "layer_name" is named "name")  [capkv-connector]
MultiConnector(hma, MultiConnector(WrongReturn()))  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #1 "WrongReturn" is not a KVConnector (wait_for_save: returns "int", the contract needs "None")  [capkv-connector]
MultiConnector(*[Renamed()])  # expect-error
# ^ mypy+plugin: MultiConnector: an unpacked sub-connector "Renamed" is not a KVConnector (save_kv_layer: parameter "layer_name" is named "name")  [capkv-connector]
