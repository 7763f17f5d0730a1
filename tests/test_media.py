"""backend/media.py: image patches equal to stored transformers goldens, audio dMel bins equal to
transformers' live feature extractor, and every bad input refused with a useful MediaError."""
import io
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image, ImageFile

from backend import media
from backend.media import MediaError, image_tokens, load_audio, load_image
from media_samples import GOLDEN_PATCH_SIZES, make_image_samples

GOLDENS = Path(__file__).parent / "data" / "image_goldens.npz"
SAMPLES = make_image_samples()


def _png_bytes(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims width x height but carries almost no data: only the header is real."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


# ------------------------------------------------------------------ images

@pytest.mark.parametrize("height,width,patch,expected", [
    (40, 40, 40, 2), (1, 1, 40, 1), (37, 53, 40, 2), (81, 40, 40, 6), (123, 250, 8, 16 * 32), (80, 79, 40, 4)])
def test_token_count(height, width, patch, expected):
    assert image_tokens(height, width, patch) == expected == math.ceil(height / patch) * (width // patch + 1)
    feats = load_image(Image.new("RGB", (width, height), (1, 2, 3)), patch_size=patch, max_tokens=10**6)
    assert feats.num_tokens == expected and feats.pixel_values.shape == (expected, 2, patch, patch, 3)
    assert feats.pixel_values.dtype == torch.float32 and feats.size == (height, width) and not feats.downscaled


def _goldens():
    if not GOLDENS.exists():  # fail, never skip: without goldens the image path is unchecked
        pytest.fail(f"{GOLDENS} is missing. Generate it on a machine with torch + torchvision + "
                    "transformers==5.23.0: `python3 scripts/make_image_goldens.py`", pytrace=False)
    return np.load(GOLDENS)


@pytest.mark.parametrize("patch", GOLDEN_PATCH_SIZES)
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_image_matches_transformers_golden(name, patch):
    goldens = _goldens()
    data = goldens[f"{name}/file"].tobytes()  # the exact bytes the processor read
    expected = torch.from_numpy(goldens[f"{name}@{patch}/pixel_values"])
    feats = load_image(data, patch_size=patch, max_tokens=10**6)
    assert feats.num_tokens == int(goldens[f"{name}@{patch}/num_patches"].sum()) == expected.shape[0]
    assert feats.pixel_values.shape == expected.shape
    diff = (feats.pixel_values - expected).abs().max().item()
    assert torch.equal(feats.pixel_values, expected), f"{name} P={patch}: max diff {diff} ({goldens['versions']})"


def test_goldens_describe_the_current_samples():
    """media_samples.py and the stored goldens hold the same pictures (regenerate goldens after editing it)."""
    stored = _goldens()
    assert sorted(k[:-len("/file")] for k in stored.files if k.endswith("/file")) == sorted(SAMPLES)
    for name, data in SAMPLES.items():
        if name.endswith(".jpg"):
            continue  # lossy: another libjpeg may encode differently; the goldens keep their own bytes
        ours, theirs = (Image.open(io.BytesIO(b)) for b in (data, stored[f"{name}/file"].tobytes()))
        assert ours.mode == theirs.mode and np.array_equal(np.asarray(ours), np.asarray(theirs)), name


def test_patch_layout_and_padding():
    """Row-major patches, pad value -1 on the 0..255 scale before CLIP normalisation, two equal frames."""
    rgb = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    feats = load_image(Image.fromarray(rgb, "RGB"), patch_size=4)
    assert feats.num_tokens == 2 * 2
    mean = np.array(media._CLIP_MEAN) * 255
    std = np.array(media._CLIP_STD) * 255
    px = feats.pixel_values.numpy()
    assert np.array_equal(px[:, 0], px[:, 1])
    np.testing.assert_allclose(px[0, 0], (rgb[:4, :4] - mean) / std, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(px[3, 0, 0, 0], (rgb[4, 4] - mean) / std, rtol=1e-6, atol=1e-6)  # row 1, col 1
    np.testing.assert_allclose(px[3, 0, 1, 3], (-1 - mean) / std, rtol=1e-6)  # padding


def test_rgba_is_composited_on_white():
    rgba = np.zeros((2, 3, 4), dtype=np.uint8)
    rgba[0, 0] = (10, 20, 30, 0)  # fully transparent -> white
    rgba[0, 1] = (10, 20, 30, 255)  # opaque -> itself
    rgba[0, 2] = (0, 0, 0, 128)  # half -> mid grey
    px = load_image(_png_bytes(Image.fromarray(rgba, "RGBA")), patch_size=4).pixel_values[0, 0].numpy()
    rgb = np.rint(px * np.array(media._CLIP_STD) * 255 + np.array(media._CLIP_MEAN) * 255)
    assert rgb[0, 0].tolist() == [255, 255, 255] and rgb[0, 1].tolist() == [10, 20, 30]
    assert 125 <= rgb[0, 2][0] <= 128


def test_gif_uses_first_frame():
    feats = load_image(SAMPLES["anim_20x45.gif"], patch_size=8)
    first = Image.open(io.BytesIO(SAMPLES["anim_20x45.gif"])).convert("RGB")
    assert torch.equal(feats.pixel_values, load_image(first, patch_size=8).pixel_values)
    blue = load_image(Image.new("RGB", (45, 20), (0, 0, 255)), patch_size=8)
    assert not torch.equal(feats.pixel_values, blue.pixel_values)


def test_downscale_respects_max_tokens_and_aspect_ratio():
    rng = np.random.default_rng(0)
    big = Image.fromarray(rng.integers(0, 256, (1500, 2000, 3), dtype=np.uint8), "RGB")
    feats = load_image(big, patch_size=40, max_tokens=1024)
    height, width = feats.size
    assert feats.downscaled and feats.original_size == (1500, 2000)
    assert feats.num_tokens == image_tokens(height, width, 40) <= 1024
    assert abs(height - round(width * 1500 / 2000)) <= 1  # aspect ratio kept
    # the largest such size: one more pixel on the long edge no longer fits
    bigger_h = round((width + 1) * 1500 / 2000)
    assert image_tokens(bigger_h, width + 1, 40) > 1024
    resized = big.resize((width, height), Image.LANCZOS)
    assert torch.equal(feats.pixel_values, load_image(resized, max_tokens=10**6).pixel_values)
    # tall image, tiny budget
    tall = load_image(Image.new("RGB", (30, 900), (9, 9, 9)), patch_size=8, max_tokens=12)
    assert tall.downscaled and tall.num_tokens <= 12 and tall.size[0] > tall.size[1]
    assert abs(tall.size[1] - tall.size[0] * 30 / 900) <= 1
    small = load_image(Image.new("RGB", (30, 20)), patch_size=8, max_tokens=12)
    assert not small.downscaled and small.num_tokens == 12


def test_content_hash():
    rgb = Image.fromarray(np.random.default_rng(1).integers(0, 256, (21, 34, 3), dtype=np.uint8), "RGB")
    as_png, as_bmp = _png_bytes(rgb, "PNG"), _png_bytes(rgb, "BMP")
    assert as_png != as_bmp
    hashes = {load_image(src).content_hash for src in (as_png, as_bmp, rgb)}
    assert len(hashes) == 1 and len(next(iter(hashes))) == 32
    changed = np.asarray(rgb).copy()
    changed[3, 4, 1] ^= 1
    assert load_image(Image.fromarray(changed, "RGB")).content_hash not in hashes
    assert load_image(SAMPLES["rgb_37x53.png"]).content_hash != load_image(SAMPLES["rgb_1x1.png"]).content_hash


def test_image_from_path(tmp_path):
    path = tmp_path / "photo.png"
    path.write_bytes(SAMPLES["rgb_37x53.png"])
    assert torch.equal(load_image(path).pixel_values, load_image(str(path)).pixel_values)
    assert load_image(path).content_hash == load_image(SAMPLES["rgb_37x53.png"]).content_hash


@pytest.mark.parametrize("case", ["truncated", "text", "empty", "tiff", "missing"])
def test_bad_image_files(tmp_path, case):
    path = tmp_path / "upload.png"
    if case == "truncated":
        path.write_bytes(SAMPLES["rgb_123x250.png"][:2000])
        expect = "truncated"
    elif case == "text":
        path.write_text("hello, I am not a picture\n")
        expect = "not a PNG"
    elif case == "empty":
        path.write_bytes(b"")
        expect = "empty"
    elif case == "tiff":
        path.write_bytes(_png_bytes(Image.new("RGB", (8, 8)), "TIFF"))
        expect = "not a PNG"
    else:
        path = tmp_path / "nope.png"
        expect = "No image file"
    assert_refused(load_image, path, expect)


def assert_refused(load, path, expect: str) -> None:
    """`load` refuses the file with a message matching `expect`, given its path and (if it exists) its bytes."""
    with pytest.raises(MediaError, match=expect):
        load(path)
    if path.exists():
        with pytest.raises(MediaError, match=expect):
            load(path.read_bytes())


def test_huge_image_refused_before_decoding(monkeypatch):
    def no_decoding(self, *args, **kwargs):
        raise AssertionError("decoded a huge image")
    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    with pytest.raises(MediaError, match=r"8000x8000 \(64.0 megapixels\); the limit is 50"):
        load_image(_png_header(8000, 8000))  # our own guard, below Pillow's limit
    with pytest.raises(MediaError, match="too large"):
        load_image(_png_header(10_000, 10_000))  # Pillow's DecompressionBombWarning, made an error
    with pytest.raises(MediaError, match="too large"):
        load_image(_png_header(30_000, 30_000))  # Pillow's DecompressionBombError


def test_huge_pil_image_refused():
    with pytest.raises(MediaError, match="megapixels"):
        load_image(Image.new("1", (9000, 6000)))


# ------------------------------------------------------------------ audio

@pytest.fixture(scope="module")
def reference():
    """transformers' InklingFeatureExtractor and InklingProcessor._extract_dmel_bins, run live."""
    from transformers.models.inkling.feature_extraction_inkling import InklingFeatureExtractor
    from transformers.models.inkling.processing_inkling import InklingProcessor
    from transformers.processing_utils import ProcessorMixin

    class Tokenizer:  # the processor only asks for token ids in __init__
        def encode(self, text, add_special_tokens=False):
            return [0]
    saved = ProcessorMixin.__init__
    ProcessorMixin.__init__ = lambda self, *args, **kwargs: None  # skip sub-processor type checks
    try:
        processor = InklingProcessor(tokenizer=Tokenizer())
    finally:
        ProcessorMixin.__init__ = saved
    extractor = InklingFeatureExtractor()

    def bins(wave: np.ndarray) -> torch.Tensor:
        feats = extractor(wave, sampling_rate=16000, return_tensors="pt")
        assert bool(feats["input_features_mask"].all())
        return processor._extract_dmel_bins(feats["input_features"])[0]
    bins.extractor = extractor
    return bins


def _clip(rate: int, seconds: float, channels: int, seed: int, peak: float = 0.9) -> np.ndarray:
    """A chirp with a level sweep over four decades, noise and a silent gap: exercises most dMel bins."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(rate * seconds))) / rate
    level = 10 ** np.linspace(-4, 0, len(t))
    wave = level * np.sin(2 * np.pi * (100 + 1500 * t) * t) + 1e-3 * level * rng.standard_normal(len(t))
    wave[len(t) // 3: len(t) // 3 + rate // 20] = 0.0
    wave = peak * wave / np.abs(wave).max()
    if channels == 2:
        wave = np.stack([wave, 0.5 * np.roll(wave, 7)], axis=1)
    return wave


CLIPS = [  # (rate, seconds, channels, file format, subtype)
    (16000, 1.0, 1, "WAV", "PCM_16"),
    (22050, 2.7, 2, "FLAC", "PCM_16"),
    (44100, 0.3, 1, "OGG", "VORBIS"),
    (8000, 1.0, 2, "WAV", "FLOAT"),
    (48000, 0.77, 2, "WAV", "PCM_24"),
]


@pytest.mark.parametrize("rate,seconds,channels,fmt,subtype", CLIPS)
def test_audio_matches_transformers(tmp_path, reference, rate, seconds, channels, fmt, subtype):
    path = tmp_path / f"clip.{fmt.lower()}"
    sf.write(path, _clip(rate, seconds, channels, seed=rate), rate, format=fmt, subtype=subtype)
    feats = load_audio(path)
    wave, got_seconds = media.decode_audio(path)
    assert wave.dtype == np.float32 and wave.ndim == 1
    assert len(wave) == math.ceil(sf.info(str(path)).frames * 16000 / rate)
    assert got_seconds == pytest.approx(seconds, abs=1 / rate) and feats.seconds == got_seconds
    expected = reference(wave)
    assert feats.bins.dtype == torch.int64 and feats.bins.shape == expected.shape == (math.ceil(len(wave) / 800), 80)
    assert feats.num_tokens == expected.shape[0]
    assert torch.equal(feats.bins, expected.long()), f"{int((feats.bins != expected).sum())} bins differ"
    assert len(torch.unique(feats.bins)) >= 8  # the clip really spans the quantiser
    assert load_audio(path.read_bytes()).content_hash == feats.content_hash


def test_loud_and_silent_audio_hit_both_ends(reference):
    rate = 16000
    wave = np.concatenate([np.zeros(rate // 2), 30.0 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)])
    feats = load_audio((rate, wave.astype(np.float32)))
    assert torch.equal(feats.bins, reference(wave.astype(np.float32)).long())
    # silence bottoms out at the magnitude floor (sqrt(1e-10)), about bin 2; loud input clamps to 15
    assert feats.bins.min() <= 2 and feats.bins.max() == 15


def test_mel_filters_equal_transformers(reference):
    assert torch.equal(media._slaney_mel_filters(), reference.extractor.mel_filters)


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000, 16001])
def test_resampler_matches_scipy(rate):
    from scipy.signal import resample_poly
    x = np.random.default_rng(rate).standard_normal(int(rate * 0.9) + 3)
    g = math.gcd(rate, 16000)
    np.testing.assert_allclose(media.resample(x, rate), resample_poly(x, 16000 // g, rate // g), atol=1e-12)


def test_resampler_on_a_sine():
    rate = 44100
    t = np.arange(2 * rate) / rate
    y = media.resample(np.sin(2 * np.pi * 1000 * t), rate)
    assert len(y) == 32000
    expected = np.sin(2 * np.pi * 1000 * np.arange(len(y)) / 16000)
    assert np.abs(y - expected)[800:-800].max() < 2e-3  # Kaiser(5) pass-band ripple; edges see the zeros
    assert np.array_equal(media.resample(t, 16000), t)  # 16 kHz passes through untouched


def test_microphone_tuples(tmp_path, reference):
    rate = 22050
    stereo = _clip(rate, 1.3, 2, seed=5)
    as_int16 = np.round(stereo * 32767).astype(np.int16)
    from_int16 = load_audio((rate, as_int16))
    path = tmp_path / "same.wav"
    sf.write(path, as_int16, rate, subtype="PCM_16")
    from_file = load_audio(path)
    assert torch.equal(from_int16.bins, from_file.bins) and from_int16.content_hash == from_file.content_hash
    from_float = load_audio((rate, (as_int16 / 32768.0).astype(np.float32)))
    assert torch.equal(from_float.bins, from_int16.bins)
    wave, _ = media.decode_audio((rate, as_int16))
    assert torch.equal(from_int16.bins, reference(wave).long())
    mono = load_audio((rate, as_int16[:, 0]))
    assert mono.num_tokens == from_int16.num_tokens == math.ceil(math.ceil(len(stereo) * 16000 / rate) / 800)
    assert mono.content_hash != from_int16.content_hash
    assert from_int16.seconds == pytest.approx(1.3, abs=1e-4)


def _long_silent_wav(path: Path, seconds: int, rate: int = 16000) -> None:
    """A real 16-bit WAV of silence, written as a sparse file: the header plus a hole."""
    data_bytes = seconds * rate * 2
    header = (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE"
              + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)  # PCM, mono, 16-bit
              + b"data" + struct.pack("<I", data_bytes))
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + data_bytes)


def test_long_audio_refused_from_header(tmp_path, monkeypatch):
    path = tmp_path / "meeting.wav"
    _long_silent_wav(path, 20 * 60)
    assert sf.info(str(path)).duration == 1200.0
    monkeypatch.setattr(sf, "read", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read the samples")))
    with pytest.raises(MediaError, match=r"The clip is 1200.0 s; the limit is 60 s"):
        load_audio(path)
    with pytest.raises(MediaError, match=r"1200.0 s; the limit is 600 s"):
        load_audio(path, max_seconds=600)
    with pytest.raises(MediaError, match=r"the limit is 60 s"):
        load_audio((16000, np.zeros(16000 * 61, dtype=np.int16)))


@pytest.mark.parametrize("case", ["empty", "text", "mp3", "png", "missing"])
def test_bad_audio_files(tmp_path, case):
    path = tmp_path / "clip.wav"
    if case == "empty":
        path.write_bytes(b"")
        expect = "empty"
    elif case == "text":
        path.write_text("this is not audio\n" * 20)
        expect = "not a WAV, FLAC or OGG"
    elif case == "mp3":
        buf = io.BytesIO()
        sf.write(buf, np.zeros(16000), 16000, format="MP3")
        path = tmp_path / "clip.mp3"
        path.write_bytes(buf.getvalue())
        expect = "MP3 audio is not supported"
    elif case == "png":
        path.write_bytes(SAMPLES["rgb_1x1.png"])
        expect = "not a WAV, FLAC or OGG"
    else:
        path = tmp_path / "nope.wav"
        expect = "No audio file"
    assert_refused(load_audio, path, expect)


def test_empty_wav_with_a_header(tmp_path):
    path = tmp_path / "silence.wav"
    sf.write(path, np.zeros(0), 16000)
    with pytest.raises(MediaError, match="empty"):
        load_audio(path)


@pytest.mark.parametrize("array,expect", [
    (np.array([0.1, np.nan, 0.2], dtype=np.float32), "NaN or infinite"),
    (np.array([[0.1, 0.1], [np.inf, 0.0]]), "NaN or infinite"),
    (np.zeros(0, dtype=np.int16), "empty"),
    (np.zeros((4, 3, 2), dtype=np.int16), "Expected audio shaped"),
    (np.zeros(100, dtype=np.complex64), "Unsupported sample type"),
])
def test_bad_microphone_arrays(array, expect):
    with pytest.raises(MediaError, match=expect):
        load_audio((16000, array))


def test_bad_sample_rate_and_source_type():
    for rate in (0, 1_000_000, 16000.5):
        with pytest.raises(MediaError, match="sample rate"):
            load_audio((rate, np.zeros(10, dtype=np.int16)))
    with pytest.raises(MediaError, match="Cannot read audio"):
        load_audio(12345)
    with pytest.raises(MediaError, match="Cannot read an image"):
        load_image(12345)
