"""MultiConnector's static type follows its children: HMA iff every child is."""

from __future__ import annotations

from typing import Any

from typing_extensions import assert_type

from capkv import HMAConnector, HMAMultiConnector, KVConnector, MultiConnector, SupportsHMA

from tests.typing_cases._connectors import Disk, Offload, PrefixStore

hma, plain, tok = Offload(), Disk(), PrefixStore()


def needs_hma(connector: SupportsHMA) -> None: ...
def needs_hma_connector(connector: HMAConnector) -> None: ...
def needs_connector(connector: KVConnector) -> None: ...


# All HMA, any order and arity: an HMA stack that keeps its children's types.
assert_type(MultiConnector(hma), HMAMultiConnector[Offload])
assert_type(MultiConnector(hma, hma), HMAMultiConnector[Offload, Offload])
assert_type(MultiConnector(hma, tok), HMAMultiConnector[Offload, PrefixStore])
assert_type(
    MultiConnector(hma, hma, hma, hma, hma, hma, hma, tok),
    HMAMultiConnector[Offload, Offload, Offload, Offload, Offload, Offload, Offload, PrefixStore],
)
needs_hma(MultiConnector(hma, tok))
needs_hma_connector(MultiConnector(hma, hma))
MultiConnector(hma, hma).request_finished_all_groups

# One non-HMA child, in either position: a plain stack.
assert_type(MultiConnector(plain), MultiConnector[Disk])
assert_type(MultiConnector(hma, plain), MultiConnector[Offload, Disk])
assert_type(MultiConnector(plain, hma), MultiConnector[Disk, Offload])
assert_type(MultiConnector(hma, hma, hma, plain), MultiConnector[Offload, Offload, Offload, Disk])
needs_connector(MultiConnector(hma, plain))
needs_hma(MultiConnector(hma, plain))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_hma(MultiConnector(plain, hma))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_hma(MultiConnector(plain))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_hma_connector(MultiConnector(plain, plain))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
MultiConnector(hma, plain).request_finished_all_groups  # expect-error
# ^ mypy+plugin: "MultiConnector" has no request_finished_all_groups: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
MultiConnector(plain, hma).request_finished_all_groups  # expect-error
# ^ mypy+plugin: "MultiConnector" has no request_finished_all_groups: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]

# Nesting: the rule applies at every level.
assert_type(MultiConnector(MultiConnector(hma, tok), hma), HMAMultiConnector[HMAMultiConnector[Offload, PrefixStore], Offload])
assert_type(MultiConnector(MultiConnector(hma, plain), hma), MultiConnector[MultiConnector[Offload, Disk], Offload])
needs_hma(MultiConnector(MultiConnector(hma, hma), MultiConnector(hma)))
needs_hma(MultiConnector(MultiConnector(hma, plain), hma))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1.2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_hma(MultiConnector(hma, MultiConnector(MultiConnector(plain))))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #2.1.1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]

# Beyond the fixed arities, and over a list: the element type decides.
# (The overloads forget the children's types past eight; the plugin keeps them.)
nine_hma = MultiConnector(hma, hma, hma, hma, hma, hma, hma, hma, hma)
assert_type(nine_hma, HMAMultiConnector[*tuple[Any, ...]])  # expect-error[mypy+plugin]
assert_type(nine_hma, HMAMultiConnector[Offload, Offload, Offload, Offload, Offload, Offload, Offload, Offload, Offload])  # expect-error[mypy, pyright]
needs_hma(nine_hma)
nine_mixed = MultiConnector(hma, hma, hma, hma, hma, hma, hma, hma, plain)
assert_type(nine_mixed, MultiConnector[*tuple[Any, ...]])  # expect-error[mypy+plugin]
assert_type(nine_mixed, MultiConnector[Offload, Offload, Offload, Offload, Offload, Offload, Offload, Offload, Disk])  # expect-error[mypy, pyright]
needs_hma(nine_mixed)  # expect-error
# ^ mypy+plugin: Argument 1 to "needs_hma" has incompatible type "MultiConnector[Offload, Offload, Offload, Offload, Offload, Offload, Offload, Offload, Disk]"; expected "SupportsHMA[Any]"  [arg-type]
needs_hma(MultiConnector(hma, hma, hma, hma, hma, hma, hma, hma, hma, plain))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #10 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
hma_list: list[Offload] = [hma, hma]
plain_list: list[Disk] = [plain]
mixed_list: list[Offload | Disk] = [hma, plain]
assert_type(MultiConnector(*hma_list), HMAMultiConnector[*tuple[Any, ...]])
assert_type(MultiConnector(*plain_list), MultiConnector[*tuple[Any, ...]])
assert_type(MultiConnector(*mixed_list), MultiConnector[*tuple[Any, ...]])
needs_hma(MultiConnector(*hma_list))
needs_hma(MultiConnector(*mixed_list))  # expect-error
# ^ mypy+plugin: Argument 1 to "needs_hma" has incompatible type "MultiConnector[*tuple[Any, ...]]"; expected "SupportsHMA[Any]"  [arg-type]

# The children's types are kept.
assert_type(MultiConnector(hma, plain).children, tuple[Offload, Disk])

# Not connectors, or no children at all.
MultiConnector()  # expect-error
# ^ mypy+plugin: All overload variants of "MultiConnector" require at least one argument  [call-overload]
MultiConnector(1)  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #1 "int" is not a KVConnector (it has none of the contract's members)  [capkv-connector]
MultiConnector(hma, "disk")  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #2 "str" is not a KVConnector (it has none of the contract's members)  [capkv-connector]
MultiConnector(object())  # expect-error
# ^ mypy+plugin: MultiConnector: sub-connector #1 "object" is not a KVConnector (it has none of the contract's members)  [capkv-connector]

# promote=: the stack's own option keeps its children's types and capability.
assert_type(MultiConnector(hma, tok, promote=True), HMAMultiConnector[Offload, PrefixStore])
assert_type(MultiConnector(hma, plain, promote=False), MultiConnector[Offload, Disk])
needs_hma(MultiConnector(hma, plain, promote=True))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_hma(MultiConnector(MultiConnector(hma, plain, promote=True), hma))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1.2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
