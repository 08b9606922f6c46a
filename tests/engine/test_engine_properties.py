"""Any model shape and workload: a correct store round-trips bit-exact, a wrong-prefix store is caught."""

from __future__ import annotations

from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from capkv import ConfigError
from capkv.engine import Engine, ModelShape, VerificationError, Workload
from capkv.engine._request import Request
from tests.engine.connectors import BlockStore, FailingLoads, OffByOne


@st.composite
def shapes(draw: st.DrawFn) -> ModelShape:
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    return ModelShape(
        num_layers=draw(st.integers(1, 5)),
        pattern=draw(st.text(alphabet="FS", min_size=1, max_size=4)),
        sliding_window=draw(st.integers(1, 70)),
        num_kv_heads=draw(st.integers(1, 2)),
        head_dim=draw(st.sampled_from([1, 4])),
        block_size=block_size,
        sliding_block_size=draw(st.sampled_from([None, block_size, 2 * block_size])),
        num_blocks=draw(st.sampled_from([40, 100, 1500])),
    )


workloads = st.builds(
    Workload,
    num_requests=st.integers(1, 6),
    num_prefixes=st.integers(1, 3),
    prefix_len=st.integers(0, 80),
    suffix_len=st.integers(1, 20),
    max_tokens=st.integers(1, 6),
    seed=st.integers(0, 100),
)

def add_all_or_reject(engine: Engine, requests: list[Request]) -> None:
    """Add the requests; an example whose requests cannot fit the pool is not a valid example."""
    for request in requests:
        try:
            engine.add_request(request)
        except ConfigError as error:
            assert "the pool has" in str(error)
            reject()


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(shape=shapes(), workload=workloads, kind=st.sampled_from([BlockStore, FailingLoads]),
       save=st.sampled_from(["layer", "finish"]), load_async=st.booleans(), max_num_seqs=st.integers(1, 4))
def test_correct_stores_always_verify(
    shape: ModelShape, workload: Workload, kind: type[BlockStore], save: str, load_async: bool, max_num_seqs: int
) -> None:
    """A store that loads right, or reports what it failed to load, never trips verification."""
    store = kind(shape.kv_spec(), save=save, load_async=load_async)
    engine = Engine(shape, store, max_num_seqs=max_num_seqs)
    add_all_or_reject(engine, workload.requests("cold"))
    engine.run([])
    engine.reset_prefix_cache()
    engine.run(workload.requests("warm"))
    assert engine.stats.requests_finished == 2 * workload.num_requests
    assert engine.pool.num_used == 0


@SETTINGS
@given(shape=shapes(), workload=workloads)
def test_wrong_prefix_loads_never_pass(shape: ModelShape, workload: Workload) -> None:
    store = OffByOne(shape.kv_spec())
    engine = Engine(shape, store)
    add_all_or_reject(engine, workload.requests("cold"))
    try:
        engine.run([])
        engine.reset_prefix_cache()
        engine.run(workload.requests("warm"))
        caught = False
    except VerificationError:
        caught = True
    assert caught == (store.shifted_loads > 0)
