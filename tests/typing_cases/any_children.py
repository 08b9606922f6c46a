"""Policy for children typed ``Any``: an unknown child does not prove the stack HMA-capable.

pyright follows the policy without help, and so does mypy with the
``capkv.mypy`` plugin. Plain mypy answers ``Any`` for an overloaded call with an
``Any`` argument, so it accepts the lines marked ``divergence`` — the one
documented disagreement between the checkers, and the reason to enable the
plugin. At run time the real children decide, and ``check_stack`` rejects a
non-HMA stack before serving.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import assert_type

from capkv import HMAMultiConnector, KVConnector, MultiConnector, SupportsHMA
from tests.typing_cases._connectors import Offload

unknown: Any = Offload()


def needs_hma(connector: SupportsHMA) -> None: ...
def needs_connector(connector: KVConnector) -> None: ...


needs_hma(MultiConnector(unknown, Offload()))  # expect-error[pyright, mypy+plugin]  # divergence: plain mypy types the stack Any
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Any" is not known to implement SupportsHMA (its type is unknown); an HMA stack needs every child to  [capkv-hma]
needs_hma(MultiConnector(Offload(), unknown))  # expect-error[pyright, mypy+plugin]  # divergence: plain mypy types the stack Any
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #2 "Any" is not known to implement SupportsHMA (its type is unknown); an HMA stack needs every child to  [capkv-hma]
MultiConnector(unknown).request_finished_all_groups  # expect-error[pyright, mypy+plugin]  # divergence: plain mypy types the stack Any
# ^ mypy+plugin: "MultiConnector" has no request_finished_all_groups: sub-connector #1 "Any" is not known to implement SupportsHMA (its type is unknown); an HMA stack needs every child to  [capkv-hma]
needs_hma(MultiConnector(MultiConnector(Offload(), unknown)))  # expect-error[pyright, mypy+plugin]  # divergence: plain mypy types the stack Any
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1.2 "Any" is not known to implement SupportsHMA (its type is unknown); an HMA stack needs every child to  [capkv-hma]
needs_connector(MultiConnector(unknown, Offload()))

# With the plugin, mypy keeps the children's types and says "not proven HMA".
assert_type(MultiConnector(unknown, Offload()), MultiConnector[Any, Offload])  # expect-error[mypy, pyright]  (pyright: the variadic fallback)
unknown_list: list[Any] = [Offload()]
assert_type(MultiConnector(*unknown_list), MultiConnector[*tuple[Any, ...]])  # expect-error[mypy]
needs_hma(MultiConnector(*unknown_list))  # expect-error[pyright, mypy+plugin]  # divergence: plain mypy types the stack Any
# ^ mypy+plugin: Argument 1 to "needs_hma" has incompatible type "MultiConnector[*tuple[Any, ...]]"; expected "SupportsHMA[Any]"  [arg-type]
# A stack of known HMA children stays HMA everywhere.
assert_type(MultiConnector(Offload(), Offload()), HMAMultiConnector[Offload, Offload])
