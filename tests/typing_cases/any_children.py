"""Policy for children typed ``Any``: an unknown child does not prove the stack HMA-capable.

pyright follows the policy without help; plain mypy answers ``Any`` for an
overloaded call with an ``Any`` argument, so it accepts these lines (the
``capkv.mypy`` plugin makes mypy follow the policy too). At run time the real
children decide, and ``check_stack`` rejects a non-HMA stack before serving.
"""

from __future__ import annotations

from typing import Any

from capkv import KVConnector, MultiConnector, SupportsHMA
from tests.typing_cases._connectors import Offload

unknown: Any = Offload()


def needs_hma(connector: SupportsHMA) -> None: ...
def needs_connector(connector: KVConnector) -> None: ...


needs_hma(MultiConnector(unknown, Offload()))  # expect-error[pyright]
needs_hma(MultiConnector(Offload(), unknown))  # expect-error[pyright]
MultiConnector(unknown).request_finished_all_groups  # expect-error[pyright]
needs_connector(MultiConnector(unknown, Offload()))
