"""The conformance kit: serve a connector through the reference engine and report what held.

Every layout and placement that connectors get wrong, cold then warm, verified bit for bit; an early free is
told apart from wrong bytes (docs/internals.md, "The conformance kit"); judged by what
landed (:mod:`capkv.testing._findings`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch

from capkv._homes import publish
from capkv.capabilities._hma import describe, supports_hma
from capkv.composite._multi import MultiConnector
from capkv.connectors._cpu_offload import CPUOffloadConnector
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import ComputedTokenRequest
from capkv.contracts._spec import KVSpec
from capkv.contracts._tiers import loads_slices
from capkv.devmode._mode import dev_mode
from capkv.engine._engine import Engine
from capkv.engine._model import ModelShape
from capkv.engine._verify import VerificationError
from capkv.engine._workload import Workload
from capkv.errors import ConfigError
from capkv.engine._diagnosis import LoggedCauses
from capkv.testing._findings import ALONE, BEHIND, FIRST, SECOND, Served, explain, judge
from capkv.testing._layouts import DEFAULT_LAYOUTS, DEFAULT_WORKLOAD, describe_layout
from capkv.testing._report import ConformanceFailure, ConformanceReport, ScenarioResult

__all__ = ["ConformanceFactory", "assert_conformant", "check_connector"]

ConformanceFactory = Callable[[KVSpec], KVConnector[Any]]
"""Builds a fresh connector, with empty storage, for the engine's KV cache."""

_ALONE, _FIRST, _SECOND, _BEHIND = ALONE, FIRST, SECOND, BEHIND
_IDLE_STEPS = 3
"""Idle engine steps between the cold and the warm run: worker reports reach the scheduler side."""


@dataclass(frozen=True)
class _Options:
    workload: Workload
    require_loads: bool
    dev: bool
    transfer_timeout_s: float
    before_warm: Callable[[Any], object] | None


class _Failed(Exception):
    """A scenario failed; ``verification`` when the engine saw wrong bytes."""

    def __init__(self, message: str, *, verification: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.verification = verification


def check_connector(
    factory: ConformanceFactory,
    *,
    layouts: Sequence[ModelShape] = DEFAULT_LAYOUTS,
    stacks: bool = True,
    workload: Workload = DEFAULT_WORKLOAD,
    require_loads: bool = True,
    dev: bool = True,
    transfer_timeout_s: float = 10.0,
    threads: int = 1,
    before_warm: Callable[[Any], object] | None = None,
) -> ConformanceReport:
    """Serve connectors from ``factory`` on every layout, alone and in stacks; never raises for a failure.

    ``factory(spec)`` must return a fresh connector with empty storage each call.
    A connector that is not HMA-capable is served on the 1-group layouts only.
    Every hit the connector offers must load (a load error fails the scenario,
    naming the group, the count and the first cause the connector logged or raised).
    ``require_loads``: the warm run's hits must cover every prompt token that a
    store holding every block the cold run computed covers, and a first tier must
    load in every group (turn it off only for a connector that stores nothing). ``dev`` runs the
    engine in dev mode (every block id and KV tensor handed over is checked).
    ``transfer_timeout_s`` bounds how long the engine waits for a transfer the
    connector started. ``threads``: torch's intra-op threads while serving
    (restored afterwards); more is slower for this engine's small ops.
    ``before_warm(connector)`` is called with your connector between the runs,
    for one whose saves land in the background (e.g. ``FileStoreConnector.flush``);
    the engine then steps idle a few times, so reports of saves that landed
    reach the scheduler side, as they would with traffic still arriving.
    """
    if threads < 1:
        raise ConfigError(f"check_connector: threads must be at least 1, got {threads}", method="check_connector", value=threads)
    options = _Options(workload, require_loads, dev, transfer_timeout_s, before_warm)
    results: list[ScenarioResult] = []
    not_served: list[str] = []
    name, hma = "", False
    with _torch_threads(threads):
        for shape in layouts:
            layout = describe_layout(shape)
            try:
                probe = factory(shape.kv_spec())
            except Exception as error:  # the author's code: any failure is a finding
                results.append(_failed(layout, _ALONE, shape, workload, f"the factory raised {explain(error)}"))
                continue
            name, hma = describe(probe), supports_hma(probe)
            if not hma and len(shape.groups) > 1:
                _shutdown_quietly(probe)
                not_served.append(f"{layout}: {name} is not HMA-capable (no request_finished_all_groups)")
                continue
            placements: tuple[str, ...] = (_ALONE, _FIRST, _SECOND) if stacks else (_ALONE,)
            if stacks and loads_slices(probe):
                placements += (_BEHIND,)
            for placement in placements:
                connector = probe if placement == _ALONE else None
                results.append(_scenario(factory, shape, placement, options, connector))
    return ConformanceReport(name, hma, tuple(results), tuple(not_served))


def assert_conformant(factory: ConformanceFactory, **options: Any) -> ConformanceReport:
    """:func:`check_connector`, raising :class:`ConformanceFailure` (an ``AssertionError``) unless every scenario passed."""
    report = check_connector(factory, **options)
    if not report.ok:
        raise ConformanceFailure(report)
    return report


# ---- one scenario -------------------------------------------------------------------------


def _scenario(
    factory: ConformanceFactory, shape: ModelShape, placement: str, options: _Options, connector: KVConnector[Any] | None
) -> ScenarioResult:
    layout = describe_layout(shape)
    try:
        served = _serve(factory, shape, placement, options, connector, scrub=True)
    except _Failed as failure:
        message = failure.message
        if failure.verification and _passes_unscrubbed(factory, shape, placement, options):
            message = (
                f"early free: {message}. The same scenario passes when the engine leaves released blocks "
                "intact, so the connector read blocks after the engine was free to reuse them: return "
                "delay_free=True from request_finished(_all_groups) and report the request in finished_sending "
                "only once every copy from its blocks is done (or finish copies in wait_for_save)"
            )
        return _failed(layout, placement, shape, options.workload, message)
    verdict = judge(served, placement, require_loads=options.require_loads, head=_head(shape, options.workload))
    return ScenarioResult(
        layout, placement, tuple(g.loaded_tokens for g in served.cold.groups),
        tuple(g.loaded_tokens for g in served.warm.groups), served.warm.prompt_tokens, verdict,
    )


def _serve(
    factory: ConformanceFactory,
    shape: ModelShape,
    placement: str,
    options: _Options,
    connector: KVConnector[Any] | None,
    *,
    scrub: bool,
) -> Served:
    """Cold and warm runs: the engine's statistics of each, the tokens the warm run loaded from the
    author's connector when it sits in a stack, the first cause it logged, and what shutting down raised."""
    with LoggedCauses() as causes:
        spec = shape.kv_spec()
        try:
            connector = connector if connector is not None else factory(spec)
            stack = _place(connector, spec, placement, _head(shape, options.workload))
        except Exception as error:  # the author's code
            raise _Failed(f"building the connector failed: {explain(error)}") from error
        phase = "before serving"
        try:
            with dev_mode(True if options.dev else None):
                engine = Engine(shape, stack, transfer_timeout_s=options.transfer_timeout_s, scrub_released_blocks=scrub)
            phase = "cold run"
            engine.run(options.workload.requests("cold"))
            cold = engine.stats.snapshot()
            phase = "between the runs"
            raised: list[str] = []
            if options.before_warm is not None:
                try:
                    options.before_warm(connector)
                except Exception as error:  # noqa: BLE001 - a finding (a store raising its kept failures), judged with the runs
                    raised.append(f"before_warm raised {explain(error)}")
            for _ in range(_IDLE_STEPS):
                engine.step()
            engine.stats.reset()
            engine.reset_prefix_cache()
            phase, logged = "warm run", len(causes.messages)
            before = _loaded_by_children(engine.connector)
            engine.run(options.workload.requests("warm"))
            warm = engine.stats.snapshot()
            after = _loaded_by_children(engine.connector)
        except VerificationError as error:
            _shutdown_quietly(stack)
            raise _Failed(f"{phase}: {_mismatch(error)}{_logged(causes)}", verification=True) from error
        except Exception as error:  # the author's code, or the engine refusing it
            _shutdown_quietly(stack)
            raise _Failed(f"{phase}: {explain(error)}{_logged(causes)}") from error
        try:
            engine.shutdown()
        except Exception as error:  # noqa: BLE001 - a finding, judged with the runs
            raised.append(f"shutdown raised {explain(error)}")
    position = 0 if placement == _FIRST else 1
    yours = after[position] - before[position] if len(after) > position else 0
    return Served(cold, warm, yours, (causes.first(0, logged), causes.first(logged)), tuple(raised))


def _logged(causes: LoggedCauses) -> str:
    return f"; the first warning logged: {causes.messages[0]}" if causes.messages else ""


def _loaded_by_children(stack: object) -> tuple[int, ...]:
    loaded: object = getattr(stack, "loaded_tokens", ())
    return cast("tuple[int, ...]", loaded) if isinstance(loaded, tuple) else ()


def _place(connector: KVConnector[Any], spec: KVSpec, placement: str, head: int) -> KVConnector[Any]:
    if placement == _ALONE:
        return connector
    if placement == _BEHIND:
        return MultiConnector(_FrontTier(spec, head=head), connector)
    capkv_side = CPUOffloadConnector(spec, capacity_blocks=2048)
    if placement == _FIRST:
        return MultiConnector(connector, capkv_side)
    return MultiConnector(capkv_side, connector)


def _head(shape: ModelShape, workload: Workload) -> int:
    """How much of each prefix the front tier offers: about half, on a boundary of every group's blocks."""
    step = math.lcm(*(group.block_size for group in shape.groups))
    return max(step, workload.prefix_len // 2 // step * step)


class _FrontTier(CPUOffloadConnector):
    """A host pool that offers only each prompt's first ``head`` tokens: a small front tier, so the
    connector behind it is asked for the rest — a slice that starts beyond the engine's local hit."""

    def __init__(self, spec: KVSpec, *, head: int) -> None:
        super().__init__(spec, capacity_blocks=2048)
        self._head = head

    def get_num_new_matched_tokens(self, request: ComputedTokenRequest, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        tokens, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if tokens is None:
            return tokens, load_async
        return max(0, min(tokens, self._head - num_computed_tokens)), load_async


def _passes_unscrubbed(factory: ConformanceFactory, shape: ModelShape, placement: str, options: _Options) -> bool:
    try:
        _serve(factory, shape, placement, options, None, scrub=False)
    except _Failed:
        return False
    return True


def _mismatch(error: VerificationError) -> str:
    mismatch = error.mismatch
    why = (
        "the connector loaded bytes that differ from what the engine computed for this prefix"
        if mismatch.when == "after load"
        else "a block the request holds changed after it was computed (a load into the wrong block, "
        "or a write into blocks the connector was not loading)"
    )
    if mismatch.group > 0:
        why += (
            f"; group {mismatch.group} is not group 0: a connector that handles group 0 only, or reads every "
            "group's blocks through group 0's table, fails this way"
        )
    return f"wrong KV in group {mismatch.group}: {mismatch.describe()}; {why}"


def _failed(layout: str, placement: str, shape: ModelShape, workload: Workload, message: str) -> ScenarioResult:
    zeros = tuple(0 for _ in shape.groups)
    return ScenarioResult(layout, placement, zeros, zeros, workload.prompt_tokens, message)


def _shutdown_quietly(connector: KVConnector[Any]) -> None:
    """Release a connector that already failed; its shutdown error would hide the first one."""
    try:
        connector.shutdown()
    except Exception:  # noqa: BLE001 - the failure being reported is the first one
        return


@contextmanager
def _torch_threads(count: int) -> Generator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


publish(__name__)
