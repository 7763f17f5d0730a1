"""Bad input ends in a sentence that says what to fix, and the engine keeps serving."""
import json
import shutil

import pytest
from conftest import assert_all_free, run_engine

from backend import Error, Request, SamplingParams, Step, load_engine
from backend.config import ConfigError
from backend.loader import CheckpointError

TINY = "assets/inkling-tiny"


@pytest.fixture(scope="module")
def engine():
    return load_engine(TINY, max_model_len=512)


def only_error(engine, request) -> str:
    events = engine.add_request(request)
    assert len(events) == 1 and isinstance(events[0], Error), events
    return events[0].message


@pytest.mark.parametrize("request_kwargs, phrase", [
    (dict(messages=[{"role": "user", "content": ""}]), "empty"),
    (dict(messages=[{"role": "user", "content": [{"type": "text", "text": "   "}]}]), "empty"),
    (dict(prompt_ids=[]), "empty"),
    (dict(prompt_ids=[30] * 600), "shorten the prompt"),
    (dict(prompt_ids=[1, 2, 999999]), "outside the vocabulary"),
    (dict(prompt_ids=[1, -4]), "outside the vocabulary"),
    (dict(prompt_ids=["a", 2]), "whole-number"),
    (dict(prompt_ids=[1, 2], sampling=SamplingParams(max_tokens=0)), "at least 1"),
    (dict(prompt_ids=[1, 2], sampling=SamplingParams(max_tokens=10**12)), "at most 510 new tokens"),
    (dict(prompt_ids=[1, 2], sampling=SamplingParams(temperature=-1.0)), "temperature"),
    (dict(prompt_ids=[1, 2], sampling=SamplingParams(top_p=0.0)), "top_p"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), "role"),
    (dict(), "neither messages nor prompt_ids"),
])
def test_bad_requests_get_a_fix_it_message_and_the_engine_keeps_serving(engine, request_kwargs, phrase):
    message = only_error(engine, Request(**request_kwargs))
    assert phrase in message
    good = Request(messages=[{"role": "user", "content": "Hello"}], sampling=SamplingParams(max_tokens=4))
    out = run_engine(engine, [good])[good.request_id]
    assert len(out[0]) == 4
    assert_all_free(engine)


def test_a_prompt_one_token_short_of_the_context_is_served(engine):
    events = engine.add_request(Request(prompt_ids=[30] * 511, sampling=SamplingParams(max_tokens=1)))
    assert not isinstance(events[0], Error)
    while engine.has_work():
        engine.step()
    assert_all_free(engine)


def test_nan_logits_fail_that_request_only(engine, monkeypatch):
    """A request whose logits go bad ends in an Error; its neighbour in the batch finishes normally."""
    import torch
    bad = Request(prompt_ids=[7, 8, 9], sampling=SamplingParams(max_tokens=8), request_id="bad")
    good = Request(prompt_ids=[7, 8, 10], sampling=SamplingParams(max_tokens=8), request_id="good")
    execute = engine.runner.execute

    def poisoned(scheduled):
        hidden, logits = execute(scheduled)
        if "bad" in logits:
            logits["bad"] = torch.full_like(logits["bad"], float("nan"))
        return hidden, logits
    monkeypatch.setattr(engine.runner, "execute", poisoned)
    out = run_engine(engine, [bad, good])
    assert isinstance(out["bad"][1][-1], Error) and "NaN" in out["bad"][1][-1].message
    assert len(out["good"][0]) == 8
    assert_all_free(engine)


def copy_tiny(tmp_path):
    target = tmp_path / "model"
    shutil.copytree(TINY, target)
    return target


def shards(model) -> list:
    """The checkpoint's shard files, in index order."""
    return sorted(set(json.loads((model / "model.safetensors.index.json").read_text())["weight_map"].values()))


def test_missing_shard_names_the_file(tmp_path):
    model = copy_tiny(tmp_path)
    (model / shards(model)[1]).unlink()
    with pytest.raises(CheckpointError, match=f"{shards(model)[1]}, which is missing"):
        load_engine(str(model))


def test_truncated_safetensors_says_copy_again(tmp_path):
    model = copy_tiny(tmp_path)
    shard = model / shards(model)[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_engine(str(model))


def test_garbage_safetensors_header(tmp_path):
    model = copy_tiny(tmp_path)
    (model / shards(model)[-1]).write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError, match="truncated or not a safetensors file"):
        load_engine(str(model))


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file
    model = copy_tiny(tmp_path)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    key = "model.llm.layers.3.attn.wq_du.weight"
    shard = model / index["weight_map"].pop(key)
    tensors = load_file(shard)
    del tensors[key]
    save_file(tensors, shard)
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"lacks 'layers.3.attn.wq'"):
        load_engine(str(model))


def test_unexpected_tensor_is_named(tmp_path):
    import torch
    from safetensors.torch import save_file
    model = copy_tiny(tmp_path)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    save_file({"model.llm.layers.0.attn.mystery.weight": torch.zeros(2)}, model / "extra.safetensors")
    index["weight_map"]["model.llm.layers.0.attn.mystery.weight"] = "extra.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="Unexpected tensor 'model.llm.layers.0.attn.mystery.weight'"):
        load_engine(str(model))


def test_config_of_another_architecture(tmp_path):
    model = copy_tiny(tmp_path)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ConfigError, match="type 'llama'.*Inkling"):
        load_engine(str(model))


def test_quantized_checkpoint_is_refused_by_name(tmp_path):
    model = copy_tiny(tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="quantized checkpoint \\(modelopt\\)"):
        load_engine(str(model))


def test_config_that_is_not_json(tmp_path):
    model = copy_tiny(tmp_path)
    (model / "config.json").write_text("{ nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_engine(str(model))


def test_checkpoint_without_tokenizer_runs_on_prompt_ids(tmp_path):
    model = copy_tiny(tmp_path)
    (model / "tokenizer.json").unlink()
    engine = load_engine(str(model))
    assert "tokenizer.json" in only_error(engine, Request(messages=[{"role": "user", "content": "hi"}]))
    request = Request(prompt_ids=[30, 31, 32], sampling=SamplingParams(max_tokens=3))
    out = run_engine(engine, [request])[request.request_id]
    assert len(out[0]) == 3 and all(isinstance(e, Step) and e.text == "" for e in out[1][1:-1])


def test_impossible_engine_settings():
    from backend import SpecConfig
    with pytest.raises(ValueError, match="between 1 and 8"):
        SpecConfig(method="mtp", num_tokens=9)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        load_engine(TINY, dtype="float16")
