"""The shipped model loads in transformers 5.23 and in our engine with identical greedy output."""
import torch
from conftest import run_engine

from backend import Request, SamplingParams, SpecConfig, load_engine
from backend.events import Finished

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


def _answer(engine, content, spec=None) -> tuple[str, dict]:
    request = Request(messages=[{"role": "user", "content": content}], sampling=SamplingParams(max_tokens=48),
                      spec=spec or SpecConfig("none"))
    tokens, events = run_engine(engine, [request])[request.request_id]
    finished = next(e for e in events if isinstance(e, Finished))
    return engine.tokenizer.decode(tokens), finished.spec_summary


def test_the_example_presets_get_right_answers():
    """What a new user tries first: the example picture, the example clip (a voice held out from
    training) and MTP speculation on the explanation preset."""
    engine = load_engine(TINY)
    text, _ = _answer(engine, [{"type": "image", "path": "assets/examples/two-shapes.png"},
                               {"type": "text", "text": "What shapes and colours are in this picture?"}])
    assert all(word in text.lower() for word in ("orange", "cross", "purple", "triangle")), text
    text, _ = _answer(engine, [{"type": "audio", "path": "assets/examples/hat.flac"},
                               {"type": "text", "text": "What does the speaker say?"}])
    assert "red hat" in text.lower(), text
    text, spec = _answer(engine, "Explain in a paragraph why the sky is blue.", SpecConfig("mtp", 3))
    assert "blue" in text.lower() and spec["mean_acceptance_length"] > 2.5, (text, spec)
