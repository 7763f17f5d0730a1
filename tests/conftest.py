import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiny_models import TEXT_CONFIGS, build_checkpoint  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="needs a CUDA GPU"))]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> (directory, transformers model), built lazily once per session."""
    built = {}

    def get(name: str, text_only: bool = False):
        key = (name, text_only)
        if key not in built:
            path = tmp_path_factory.mktemp(f"{name}{'_text' if text_only else ''}")
            built[key] = (path, build_checkpoint(path, name, seed=len(built) + 1, text_only=text_only))
        return built[key]
    return get


def run_engine(engine, requests, arrival_steps=None):
    """Drive engine.step() by hand; request i joins at step arrival_steps[i].
    Returns {id: (tokens, events)} plus "metrics": the engine-wide Metrics events."""
    from backend.events import Error, Finished, Step
    arrival_steps = arrival_steps or [0] * len(requests)
    out = {r.request_id: ([], []) for r in requests}
    out["metrics"] = []
    step = 0
    pending = sorted(zip(arrival_steps, range(len(requests))))
    while pending or engine.has_work():
        while pending and pending[0][0] <= step:
            _, i = pending.pop(0)
            for e in engine.add_request(requests[i]):
                out[e.request_id][1].append(e)
        for e in engine.step():
            if not hasattr(e, "request_id"):
                out["metrics"].append(e)
            else:
                out[e.request_id][1].append(e)
                if isinstance(e, Step):
                    out[e.request_id][0].extend(e.emitted)
        step += 1
        assert step < 100000
    return out


def assert_all_free(engine):
    assert not engine.scheduler.running and not engine.scheduler.waiting
    usage = engine.pool.usage()
    assert sum(usage["used"].values()) == 0, usage
    assert len(engine.scheduler.free_conv_slots) == engine.scheduler.max_num_seqs
