"""Continuous batching, preemption, abort and prefix reuse, as a user of the engine sees them."""
import threading

import pytest
import torch
from conftest import assert_all_free, run_engine

from backend import Finished, Request, SamplingParams, Step, load_engine
from backend.events import Metrics, Started

PROMPT_LENGTHS = [1, 5, 17, 33, 64, 128, 200, 300]
ARRIVALS = [0, 0, 1, 3, 5, 8, 13, 20]


def make_requests(vocab, max_tokens=24):
    gen = torch.Generator().manual_seed(11)
    requests = []
    for i, n in enumerate(PROMPT_LENGTHS):
        sampling = SamplingParams(max_tokens=max_tokens, seed=100 + i,
                                  temperature=0.0 if i % 2 == 0 else 0.9, top_k=0 if i % 4 else 50,
                                  top_p=1.0 if i % 3 else 0.9)
        requests.append(Request(prompt_ids=torch.randint(0, vocab, (n,), generator=gen).tolist(),
                                sampling=sampling, request_id=f"r{i}"))
    return requests


def alone(engine, request):
    clone = Request(prompt_ids=request.prompt_ids, sampling=request.sampling, request_id=request.request_id + "-alone")
    return run_engine(engine, [clone])[clone.request_id][0]


@pytest.fixture(scope="module")
def engine_and_solo(checkpoints):
    path, model = checkpoints("logscale_mixed")
    engine = load_engine(str(path), max_batched_tokens=64)
    requests = make_requests(model.config.text_config.unpadded_vocab_size)
    solo = {r.request_id: alone(engine, r) for r in requests}
    return path, engine, requests, solo


def test_staggered_batch_matches_each_request_alone(engine_and_solo):
    """Eight prompts of 1..300 tokens joining at different steps (long ones prefilled in 64-token
    chunks beside others' decoding) give exactly their solo tokens, greedy and seeded sampling alike."""
    _, engine, requests, solo = engine_and_solo
    out = run_engine(engine, requests, ARRIVALS)
    for r in requests:
        assert out[r.request_id][0] == solo[r.request_id], r.request_id
        assert len(solo[r.request_id]) == 24
    assert_all_free(engine)


def test_small_pool_preempts_and_still_finishes_correctly(engine_and_solo):
    path, _, requests, solo = engine_and_solo
    engine = load_engine(str(path), num_blocks=30, block_size=16, max_batched_tokens=64)
    out = run_engine(engine, requests, ARRIVALS)
    for r in requests:
        assert out[r.request_id][0] == solo[r.request_id], r.request_id
        assert isinstance(out[r.request_id][1][-1], Finished)
    assert engine.scheduler.num_preemptions > 0
    assert_all_free(engine)


def test_abort_mid_stream_frees_blocks_and_engine_keeps_serving(engine_and_solo):
    _, engine, requests, solo = engine_and_solo
    long = Request(prompt_ids=requests[5].prompt_ids, sampling=SamplingParams(max_tokens=500), request_id="long")
    seen, finished = [], []
    for event in engine.stream(long):
        if isinstance(event, Step):
            seen.append(event)
            if len(seen) == 3:
                used = sum(engine.pool.usage()["used"].values())
                assert used > 0
                engine.abort("long")
        if isinstance(event, Finished):
            finished.append(event)
    assert finished[0].reason == "abort" and finished[0].usage["completion_tokens"] < 500
    assert_all_free(engine)
    # the engine still serves: a request after the abort gets its solo answer
    r = requests[2]
    tokens = [t for e in engine.stream(Request(prompt_ids=r.prompt_ids, sampling=r.sampling))
              if isinstance(e, Step) for t in e.emitted]
    assert tokens == solo[r.request_id]
    engine.close()
    assert_all_free(engine)


def test_closing_a_stream_early_aborts_its_request(engine_and_solo):
    _, engine, requests, _ = engine_and_solo
    stream = engine.stream(Request(prompt_ids=requests[4].prompt_ids, sampling=SamplingParams(max_tokens=400)))
    for event in stream:
        if isinstance(event, Step):
            break
    stream.close()   # the browser tab went away
    for _ in range(200):
        with engine._lock:
            if not engine.has_work():
                break
        threading.Event().wait(0.01)
    engine.close()   # stop the stream thread: the next tests drive step() by hand
    assert_all_free(engine)


def test_identical_prompt_reuses_cached_prefix_blocks(engine_and_solo):
    _, engine, requests, solo = engine_and_solo
    r = requests[6]   # 200 tokens: 12 full blocks of 16
    first = run_engine(engine, [Request(prompt_ids=r.prompt_ids, sampling=r.sampling, request_id="p1")])["p1"]
    hits_before = engine.pool.num_prefix_hit_blocks
    run2 = run_engine(engine, [Request(prompt_ids=r.prompt_ids, sampling=r.sampling, request_id="p2")])
    second = run2["p2"]
    assert first[0] == second[0] == solo[r.request_id]
    finished = second[1][-1]
    assert finished.usage["cached_tokens"] >= 192
    assert engine.pool.num_prefix_hit_blocks - hits_before >= 12
    assert run2["metrics"][-1].kv["prefix_hit_blocks"] >= 12 and run2["metrics"][-1].kv["prefix_hit_rate"] > 0
    assert_all_free(engine)


def test_stream_events_follow_the_contract(engine_and_solo):
    _, engine, requests, solo = engine_and_solo
    r = requests[3]
    events = list(engine.stream(Request(prompt_ids=r.prompt_ids, sampling=r.sampling)))
    assert isinstance(events[0], Started) and events[0].prompt_tokens == len(r.prompt_ids)
    assert isinstance(events[-1], Finished) and events[-1].reason == "length"
    steps = [e for e in events if isinstance(e, Step)]
    assert [e.step for e in steps] == list(range(len(steps)))
    assert [t for e in steps for t in e.emitted] == solo[r.request_id]
    assert any(isinstance(e, Metrics) for e in events)
    metrics = next(e for e in events if isinstance(e, Metrics)).to_dict()
    assert set(metrics["kv"]["groups"]) == {"full_attention", "sliding_window"}
    assert events[-1].timings["ttft_s"] > 0 and events[-1].usage["completion_tokens"] == 24
    for e in events:
        assert isinstance(e.to_dict(), dict)
    engine.close()


def test_astream_yields_the_same_tokens(engine_and_solo):
    import asyncio
    _, engine, requests, solo = engine_and_solo
    r = requests[1]

    async def collect():
        return [t async for e in engine.astream(Request(prompt_ids=r.prompt_ids, sampling=r.sampling))
                if isinstance(e, Step) for t in e.emitted]
    assert asyncio.run(collect()) == solo[r.request_id]
    engine.close()
