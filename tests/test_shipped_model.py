"""The shipped model loads in transformers 5.23 and in our engine with identical greedy output."""
import torch
from conftest import run_engine

from backend import Request, SamplingParams, load_engine

TINY = "assets/inkling-tiny"


def test_shipped_model_greedy_output_equals_transformers():
    from transformers import InklingForConditionalGeneration
    engine = load_engine(TINY)
    request = Request(messages=[{"role": "user", "content": "Tell me a story about a brave little fox."}],
                      sampling=SamplingParams(max_tokens=40))
    ids = engine.prompt_ids(request)
    tokens = run_engine(engine, [request])[request.request_id][0]
    model = InklingForConditionalGeneration.from_pretrained(TINY, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False,
                             eos_token_id=engine.config.eos_token_ids[0])
    assert tokens == out[0, len(ids):].tolist()
    assert len(engine.tokenizer.decode(tokens).split()) >= 5   # it writes words
