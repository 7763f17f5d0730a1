"""scripts/build_data.py --smoke: a tiny offline build whose outputs have the schema the trainer reads.

Needs no network and no apt packages: missing text sources, synthesisers or scikit-image are skipped by
the builder (and named in manifest["notes"]); the procedural stories, chats and images are always there.
"""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("build_data", ROOT / "scripts" / "build_data.py")
build_data = importlib.util.module_from_spec(spec)
sys.modules["build_data"] = build_data
spec.loader.exec_module(build_data)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    assert build_data.main(["--smoke", "--out", str(out), "--workers", "1"]) == 0
    return out, json.loads((out / "manifest.json").read_text())


def segments(flat, offsets):
    return [flat[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def test_tokenizer_has_the_wire_format_ids_first(built):
    out, manifest = built
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    for i, token in enumerate(build_data.SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i
    assert tok.get_vocab_size() == manifest["tokenizer"]["vocab_size"] <= build_data.VOCAB_SIZE
    assert tok.decode(tok.encode("The little fox ran home.").ids) == "The little fox ran home."


def test_text_pack_holds_documents_and_wire_format_chats(built):
    out, manifest = built
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    index = np.load(out / "pack" / "text_index.npz")
    for split in ("train", "val"):
        ids = np.fromfile(out / "pack" / f"text_{split}.bin", dtype=np.uint16)
        offsets, lengths = index[f"{split}_offsets"], index[f"{split}_lengths"]
        assert len(offsets) == manifest["text"]["stats"][split]["documents"] > 0
        assert ids.max() < manifest["tokenizer"]["vocab_size"]
        assert (ids[offsets + lengths] == build_data.PAD_ID).all()  # every document ends with the separator
        chats = np.flatnonzero(index[f"{split}_is_chat"])
        assert len(chats) > 0
        text = tok.decode(ids[offsets[chats[0]]:offsets[chats[0]] + lengths[chats[0]]].tolist(), skip_special_tokens=False)
        assert text.startswith("<|message_")
        assert text.endswith("<|end_message|><|content_model_end_sampling|>")
        assert "<|message_model|><|content_" in text
    sources = list(index["sources"])
    assert {"stories", "chats"} <= set(sources)
    meta = json.loads((out / "pack" / "meta.json").read_text())
    assert meta["vocab_size"] == manifest["tokenizer"]["vocab_size"] <= meta["vocab_size_padded"]
    assert meta["special"]["eos"] == 10 and meta["special"]["image"] == 11 and meta["special"]["audio"] == 12
    # held-out documents are whole documents that never appear in training
    train = {json.loads(line).get("text") for line in (out / "text" / "train.jsonl").open()}
    val = [json.loads(line) for line in (out / "text" / "val.jsonl").open()]
    assert any(v["source"] == "stories" for v in val)
    assert not any(v.get("text") in train for v in val if v.get("text"))
    assert manifest["pack"]["pack_tar_xz_bytes"] == (out / "pack.tar.xz").stat().st_size


def test_image_pack_matches_placeholder_counts(built):
    out, manifest = built
    for name, heldout in (("images_train.npz", False), ("images_heldout.npz", True)):
        pack = np.load(out / "pack" / name)
        pixels = segments(pack["pixels"], pack["pixel_offsets"])
        ids = segments(pack["input_ids"], pack["id_offsets"])
        assert len(pixels) == len(ids) == len(pack["heights"]) > 0
        for px, seq, h, w in zip(pixels, ids, pack["heights"], pack["widths"]):
            assert px.size == h * w * 3
            n_image = int((seq == 11).sum())
            assert n_image == -(-h // 8) * (w // 8 + 1)
            assert seq[0] == 0  # <|message_user|>
            assert seq[-1] == (1 if heldout else 10)  # generation prompt / end of a finished model turn
        if heldout:
            labels = [json.loads(s) for s in pack["labels"]]
            assert all(label["shape"] in build_data.SHAPES and label["colour"] in build_data.COLOURS for label in labels)
    held = [json.loads(line) for line in (out / "images" / "heldout.jsonl").open()]
    assert len(held) == manifest["images"]["heldout"]
    assert all((out / "images" / "heldout" / row["file"]).is_file() for row in held)


def test_audio_pack_matches_frames_or_says_why_not(built):
    out, manifest = built
    if not build_data.available_speech_engines():
        assert any("speech skipped" in note for note in manifest["notes"])
        pytest.skip("no speech synthesiser installed; the builder said so in manifest notes")
    pack = np.load(out / "pack" / "audio_train.npz")
    frames = segments(pack["bins_packed"], pack["frame_offsets"])
    ids = segments(pack["input_ids"], pack["id_offsets"])
    assert len(frames) == len(ids) == manifest["speech"]["train"] > 0
    for packed, seq in zip(frames, ids):
        assert packed.shape[1] == 40
        bins = build_data.unpack_nibbles(packed)
        assert bins.shape[1] == 80 and bins.max() <= 15
        assert int((seq == 12).sum()) == len(bins)
    held_voices = set(manifest["speech"]["heldout"])
    assert held_voices and not held_voices & set(manifest["speech"]["voices"])
    for name in held_voices:
        rows = [json.loads(line) for line in (out / "audio" / f"heldout_{name}.jsonl").open()]
        assert all((out / "audio" / row["file"]).is_file() for row in rows)
        train_texts = set(pack["texts"])
        assert not any(row["text"] in train_texts for row in rows)


def test_nibble_packing_round_trips():
    rng = np.random.default_rng(0)
    bins = rng.integers(0, 16, size=(7, 80), dtype=np.uint8)
    assert (build_data.unpack_nibbles(build_data.pack_nibbles(bins)) == bins).all()


def test_without_source_packages_only_procedural_text_remains(tmp_path, monkeypatch):
    def missing():
        raise build_data.SourceMissing("not installed here")
    monkeypatch.setattr(build_data, "PROSE_SOURCES", {k: (missing, v[1]) for k, v in build_data.PROSE_SOURCES.items()})
    notes = []
    train, val, stats = build_data.build_text(build_data.Sizes.smoke(), 1, notes)
    assert {d.source for d in train + val} == {"stories", "chats"}
    assert stats == {} and len(notes) == len(build_data.PROSE_SOURCES)
    assert all("not installed here" in note for note in notes)


def test_builds_are_reproducible():
    import random
    def chat(seed):
        story_rng = random.Random(seed + 1)
        return build_data.make_chat(random.Random(seed), lambda: build_data.make_story(story_rng))
    a = [build_data.make_story(random.Random("7"))[0], [chat(s) for s in range(20)]]
    b = [build_data.make_story(random.Random("7"))[0], [chat(s) for s in range(20)]]
    assert a == b
    img_a, _ = build_data.render_shape(random.Random("9"))
    img_b, _ = build_data.render_shape(random.Random("9"))
    assert np.array_equal(np.asarray(img_a), np.asarray(img_b))
