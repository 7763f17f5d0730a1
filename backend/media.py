"""Turn user images and audio clips into the exact inputs Inkling's towers expect.

Images follow transformers' `InklingImageProcessor` (default settings) and audio follows
`InklingFeatureExtractor` plus `InklingProcessor._extract_dmel_bins`, re-implemented here so the
engine needs neither torchvision nor transformers. Untrusted files are checked before decoding:
only listed formats are opened, image size and clip length are read from the header first.
"""
from __future__ import annotations

import hashlib
import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError


class MediaError(ValueError):
    """Bad media; the message says what to fix."""


@dataclass(frozen=True)
class ImageFeatures:
    pixel_values: torch.Tensor  # [num_patches, 2, P, P, 3] float32
    num_tokens: int  # ceil(H/P) * (floor(W/P) + 1), one token per patch
    content_hash: bytes  # sha256 of the RGB pixels fed to the model + size (prefix-cache key)
    size: tuple[int, int]  # (height, width) fed to the model
    original_size: tuple[int, int]  # (height, width) as decoded
    downscaled: bool  # True if shrunk to respect max_tokens


@dataclass(frozen=True)
class AudioFeatures:
    bins: torch.Tensor  # [num_frames, 80] int64 dMel bin indices 0..15
    num_tokens: int  # num_frames (20 per second)
    content_hash: bytes  # sha256 of the 16 kHz mono float32 waveform
    seconds: float  # length of the clip as given


# ---------------------------------------------------------------- images

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MAX_IMAGE_PIXELS = 50_000_000  # well below Pillow's own bomb limit (~89 MP), so we refuse first
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # transformers' OPENAI_CLIP_MEAN
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)  # transformers' OPENAI_CLIP_STD
_PAD_VALUE = -1.0  # patches are padded on the 0..255 scale, before normalising


def image_tokens(height: int, width: int, patch_size: int = 40) -> int:
    """Tokens for an image of this size: the processor always adds one (partly padded) column."""
    return math.ceil(height / patch_size) * (width // patch_size + 1)


def _path_or_bytes(source, kind: str, fix: str) -> Path | bytes:
    """A path that names a non-empty file, or non-empty bytes; otherwise a MediaError ending in `fix`."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise MediaError(f"No {kind} file at {str(path)!r}; {fix}.")
        if path.stat().st_size == 0:
            raise MediaError(f"The {kind} file is empty (0 bytes); {fix}.")
        return path
    if len(source) == 0:
        raise MediaError(f"The {kind} file is empty (0 bytes); {fix}.")
    return bytes(source)


def _open_image(source) -> Image.Image:
    """Open lazily (header only) from a path, bytes or PIL image, allowing only IMAGE_FORMATS."""
    if isinstance(source, Image.Image):
        if source.format is not None and source.format not in IMAGE_FORMATS + ("MPO",):
            raise MediaError(f"{source.format} images are not supported; use {', '.join(IMAGE_FORMATS)}.")
        return source
    if not isinstance(source, (str, Path, bytes, bytearray, memoryview)):
        raise MediaError(f"Cannot read an image from a {type(source).__name__}; pass a path, bytes or a PIL image.")
    found = _path_or_bytes(source, "image", "upload the image again")
    fp = found if isinstance(found, Path) else io.BytesIO(found)
    try:
        # formats= makes Pillow try only these decoders, whatever the file name says
        return Image.open(fp, formats=list(IMAGE_FORMATS))
    except UnidentifiedImageError:
        raise MediaError(f"This is not a {', '.join(IMAGE_FORMATS)} image (or it is damaged); "
                         "save it as PNG or JPEG and try again.") from None


def _checked_rgb(img: Image.Image) -> Image.Image:
    """Refuse oversized images from the header, then decode and convert like transformers' convert_to_rgb."""
    width, height = img.size  # known from the header: nothing is decoded yet
    if width * height > MAX_IMAGE_PIXELS:
        raise MediaError(f"The image is {width}x{height} ({width * height / 1e6:.1f} megapixels); the limit "
                         f"is {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels. Resize it and try again.")
    if width < 1 or height < 1:
        raise MediaError("The image has no pixels; upload a different image.")
    if getattr(img, "is_animated", False) and img.tell() != 0:
        img.seek(0)  # animated GIF/WEBP: the model sees the first frame
    img.load()  # decoding happens here; errors surface as OSError/SyntaxError/ValueError
    # transformers composites any transparency (alpha band or palette/tRNS transparency) onto white
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")  # palette, L, I;16 (clipped at 255 by Pillow), CMYK, ...


def _fit_size(height: int, width: int, patch_size: int, max_tokens: int) -> tuple[int, int]:
    """Largest (h, w) with the same aspect ratio whose token count is at most max_tokens."""
    long_edge, short_edge = max(height, width), min(height, width)

    def size_for(long_len: int) -> tuple[int, int]:
        short_len = max(1, round(short_edge * long_len / long_edge))
        return (long_len, short_len) if height >= width else (short_len, long_len)

    lo, hi = 1, long_edge  # tokens grow with the long edge; a 1-pixel edge always fits (1 token)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if image_tokens(*size_for(mid), patch_size) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return size_for(lo)


def _image_patches(rgb: np.ndarray, patch_size: int) -> torch.Tensor:
    """[H, W, 3] uint8 -> [N, 2, P, P, 3] float32, bit-identical to InklingImageProcessor."""
    height, width, _ = rgb.shape
    rows, cols = math.ceil(height / patch_size), width // patch_size + 1
    # a -1 canvas with the image in its top-left corner is the same as padding each patch
    canvas = torch.full((3, rows * patch_size, cols * patch_size), _PAD_VALUE, dtype=torch.float32)
    canvas[:, :height, :width] = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float()
    patches = canvas.reshape(3, rows, patch_size, cols, patch_size).permute(1, 3, 0, 2, 4)
    patches = patches.reshape(rows * cols, 3, patch_size, patch_size)  # row-major patch order
    # the processor fuses rescale into normalize: mean and std are multiplied by 1 / (1/255) in float32
    mean = torch.tensor(_CLIP_MEAN, dtype=torch.float32) * (1.0 / (1 / 255))
    std = torch.tensor(_CLIP_STD, dtype=torch.float32) * (1.0 / (1 / 255))
    patches = (patches - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)  # sub then div, as tvF.normalize
    return patches.unsqueeze(1).expand(-1, 2, -1, -1, -1).permute(0, 1, 3, 4, 2).contiguous()


def load_image(source, *, patch_size: int = 40, max_tokens: int = 1024) -> ImageFeatures:
    """Read, check, convert and patchify one image; see ImageFeatures."""
    if patch_size < 1 or max_tokens < 1:
        raise ValueError("patch_size and max_tokens must be positive")
    with warnings.catch_warnings():  # Pillow's bomb warning becomes an error (not thread-scoped in 3.11;
        warnings.simplefilter("error", Image.DecompressionBombWarning)  # our smaller limit still holds)
        try:
            img = _open_image(source)
            try:
                rgb_img = _checked_rgb(img)
            finally:
                if img is not source:
                    img.close()  # release files we opened; the caller's PIL image is theirs
        except MediaError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise MediaError(f"The image is too large to open safely ({exc}); the limit is "
                             f"{MAX_IMAGE_PIXELS / 1e6:.0f} megapixels. Resize it and try again.") from None
        except (OSError, SyntaxError, ValueError, EOFError, IndexError) as exc:
            raise MediaError(f"The image file is truncated or damaged ({exc}); "
                             "re-save or re-upload the image.") from None
    width, height = rgb_img.size
    original = (height, width)
    size, downscaled = original, False
    if image_tokens(height, width, patch_size) > max_tokens:
        size, downscaled = _fit_size(height, width, patch_size, max_tokens), True
        rgb_img = rgb_img.resize((size[1], size[0]), Image.LANCZOS)
    rgb = np.array(rgb_img, dtype=np.uint8)  # a writable copy for torch
    digest = hashlib.sha256(b"inkling-image\0%d,%d,%d\0" % (size[0], size[1], patch_size))
    digest.update(rgb.tobytes())
    return ImageFeatures(pixel_values=_image_patches(rgb, patch_size), num_tokens=image_tokens(*size, patch_size),
                         content_hash=digest.digest(), size=size, original_size=original, downscaled=downscaled)


# ---------------------------------------------------------------- audio

AUDIO_FORMATS = ("WAV", "WAVEX", "FLAC", "OGG")
SAMPLE_RATE = 16_000
HOP, N_FFT, N_MELS = 800, 1600, 80  # 50 ms hop = 20 tokens per second, 100 ms Hann window
DMEL_MIN, DMEL_MAX, DMEL_BINS = -7.0, 2.0, 16
_FILTERS: dict[str, torch.Tensor] = {}


def resample(x: np.ndarray, rate_in: int, rate_out: int = SAMPLE_RATE) -> np.ndarray:
    """Polyphase windowed-sinc resampler (float64, 1-D), the same filter design as scipy's resample_poly:
    a Kaiser(beta=5) sinc low-pass of 2*10*max(up, down)+1 taps on the upsampled grid, zero outside the clip."""
    g = math.gcd(rate_in, rate_out)
    up, down = rate_out // g, rate_in // g
    if up == down:
        return x.astype(np.float64, copy=True)
    max_rate, half = max(up, down), 10 * max(up, down)
    taps = np.arange(-half, half + 1)
    h = np.kaiser(2 * half + 1, 5.0) * np.sinc(taps / max_rate)
    h *= up / h.sum()  # unit DC gain after inserting up-1 zeros between samples
    n_in, n_out = len(x), -(-len(x) * up // down)
    width = 2 * half // up + 1  # most input samples under the filter for one output
    out = np.empty(n_out, dtype=np.float64)
    step = max(1, 1_000_000 // width)  # bounded memory per chunk
    for start in range(0, n_out, step):
        pos = np.arange(start, min(start + step, n_out), dtype=np.int64) * down  # on the upsampled grid
        k = -((half - pos) // up)[:, None] + np.arange(width)[None, :]  # first input index is ceil((pos-half)/up)
        offset = pos[:, None] - k * up
        ok = (np.abs(offset) <= half) & (k >= 0) & (k < n_in)
        terms = x[np.clip(k, 0, n_in - 1)] * h[np.clip(offset + half, 0, 2 * half)]
        out[start:start + len(pos)] = np.where(ok, terms, 0.0).sum(axis=1)
    return out


def _slaney_mel_filters() -> torch.Tensor:
    """[80, 801] Slaney-scale, Slaney-normalised triangular filters over 0..8 kHz (float64 -> float32)."""
    if "mel" not in _FILTERS:
        log_step = 27.0 / np.log(6.4)  # Slaney: linear below 1 kHz, logarithmic above

        def hz_to_mel(f):
            return 3.0 * f / 200.0 if f < 1000.0 else 15.0 + np.log(f / 1000.0) * log_step

        mels = np.linspace(hz_to_mel(0.0), hz_to_mel(SAMPLE_RATE / 2.0), N_MELS + 2)
        hz = np.where(mels >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels - 15.0)), 200.0 * mels / 3.0)
        fft_hz = np.linspace(0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
        rising = (fft_hz[:, None] - hz[None, :-2]) / np.diff(hz)[None, :-1]
        falling = (hz[None, 2:] - fft_hz[:, None]) / np.diff(hz)[None, 1:]
        tri = np.maximum(0.0, np.minimum(rising, falling))
        tri *= 2.0 / (hz[2:] - hz[:-2])[None, :]  # equal area per filter
        _FILTERS["mel"] = torch.from_numpy(np.ascontiguousarray(tri.T, dtype=np.float32))
        _FILTERS["hann"] = torch.hann_window(N_FFT, periodic=True, dtype=torch.float32)
        _FILTERS["centres"] = torch.linspace(DMEL_MIN, DMEL_MAX, DMEL_BINS, dtype=torch.float64).float()
    return _FILTERS["mel"]


def log_mel(wave: torch.Tensor) -> torch.Tensor:
    """[n] float32 at 16 kHz -> [ceil(n/800), 80] log10 mel, the same ops as InklingFeatureExtractor."""
    filters = _slaney_mel_filters()
    n = wave.shape[-1]
    # 800 zeros on the left, right-pad to a whole hop: frame t covers samples [800(t-1), 800(t+1))
    padded = torch.nn.functional.pad(wave[None], (N_FFT - HOP, math.ceil(n / HOP) * HOP - n))
    spec = torch.stft(padded, N_FFT, hop_length=HOP, win_length=N_FFT, window=_FILTERS["hann"],
                      center=False, return_complex=True)
    magnitude = torch.view_as_real(spec).pow(2).sum(-1).clamp_min(1e-10).sqrt()
    mel = (filters @ magnitude).clamp_min(1e-10).log10()  # batch of one, as the extractor does
    return mel.transpose(1, 2)[0]


def dmel_bins(mel: torch.Tensor) -> torch.Tensor:
    """Quantise clamped log-mel values to the nearest of 16 centres (first one on exact ties)."""
    _slaney_mel_filters()
    clamped = mel.clamp(min=DMEL_MIN, max=DMEL_MAX)
    return (clamped.unsqueeze(-1) - _FILTERS["centres"]).abs().argmin(dim=-1).to(torch.int64)


def _read_audio_file(source, max_seconds: float) -> tuple[np.ndarray, int]:
    """Path or bytes -> ([n, channels] float64 in [-1, 1], sample rate), length checked from the header."""
    import soundfile as sf  # only needed for files

    found = _path_or_bytes(source, "audio", "record or upload the clip again")
    opener = (lambda: str(found)) if isinstance(found, Path) else (lambda: io.BytesIO(found))
    try:
        info = sf.info(opener())  # header only
    except RuntimeError as exc:  # soundfile's LibsndfileError
        raise MediaError(f"This is not a WAV, FLAC or OGG audio file ({exc}); "
                         "convert it to WAV and try again.") from None
    if info.format not in AUDIO_FORMATS:
        raise MediaError(f"{info.format} audio is not supported; convert the clip to WAV, FLAC or OGG and try again.")
    _check_header(info.frames, info.samplerate, max_seconds)
    try:
        samples, rate = sf.read(opener(), dtype="float64", always_2d=True)  # ints scaled to [-1, 1]
    except RuntimeError as exc:
        raise MediaError(f"The audio file is damaged ({exc}); re-export it and try again.") from None
    return samples, rate


def _check_header(frames: int, rate: int, max_seconds: float) -> None:
    """Refuse empty, oddly sampled or over-long clips before any sample is converted."""
    if frames <= 0:
        raise MediaError("The audio clip is empty; record or upload a clip with sound in it.")
    if not (4000 <= rate <= 192_000):  # also bounds the resampler's filter table
        raise MediaError(f"A sample rate of {rate} Hz is not supported; use 4 kHz to 192 kHz (16 kHz is best).")
    if frames / rate > max_seconds:
        raise MediaError(f"The clip is {frames / rate:.1f} s; the limit is {max_seconds:g} s. Trim it and try again.")


def _from_array(rate, array, max_seconds: float) -> tuple[np.ndarray, int]:
    """(sample_rate, array) as Gradio's microphone gives -> ([n, channels] float64 in [-1, 1], rate)."""
    if not isinstance(rate, (int, np.integer)):
        raise MediaError(f"The sample rate must be an integer number of Hz, got {rate!r}.")
    array = np.asarray(array)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or array.shape[1] > 8:
        raise MediaError(f"Expected audio shaped [samples] or [samples, channels], got {list(array.shape)}.")
    _check_header(array.shape[0], int(rate), max_seconds)
    # the same scaling soundfile applies when it reads integer PCM as float
    scale = {np.dtype(np.int16): 32768.0, np.dtype(np.int32): 2147483648.0}.get(array.dtype)
    if scale is not None:
        return array / scale, int(rate)
    if array.dtype == np.uint8:  # 8-bit PCM is unsigned around 128
        return (array.astype(np.float64) - 128.0) / 128.0, int(rate)
    if array.dtype.kind == "f":
        return array.astype(np.float64), int(rate)
    raise MediaError(f"Unsupported sample type {array.dtype}; use int16 or float32 samples.")


def decode_audio(source, *, max_seconds: float = 60.0) -> tuple[np.ndarray, float]:
    """Read and check a clip -> (16 kHz mono float32 waveform, length in seconds as given)."""
    if isinstance(source, tuple) and len(source) == 2:
        samples, rate = _from_array(source[0], source[1], max_seconds)
    elif isinstance(source, (str, Path, bytes, bytearray, memoryview)):
        samples, rate = _read_audio_file(source, max_seconds)
    else:
        raise MediaError(f"Cannot read audio from a {type(source).__name__}; pass a path, bytes "
                         "or a (sample_rate, samples) tuple.")
    if not np.isfinite(samples).all():
        raise MediaError("The audio contains NaN or infinite samples; re-record or re-export the clip.")
    mono = samples.mean(axis=1)  # stereo -> mono by averaging the channels
    return resample(mono, rate).astype(np.float32), samples.shape[0] / rate


def load_audio(source, *, max_seconds: float = 60.0) -> AudioFeatures:
    """Read, check, mix to mono, resample to 16 kHz and quantise one clip; see AudioFeatures."""
    wave, seconds = decode_audio(source, max_seconds=max_seconds)
    digest = hashlib.sha256(b"inkling-audio\0")
    digest.update(wave.tobytes())
    bins = dmel_bins(log_mel(torch.from_numpy(wave)))
    return AudioFeatures(bins=bins, num_tokens=bins.shape[0], content_hash=digest.digest(), seconds=seconds)
