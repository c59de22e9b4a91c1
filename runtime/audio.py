"""Audio in, for speech models (torch-free): a file or samples -> mono float32 at 16 kHz ->
Whisper's log-mel features, equal to transformers' WhisperFeatureExtractor.

    load_audio(path | samples, sampling_rate)
        a file: read by soundfile (libsndfile: WAV, FLAC, OGG / Vorbis and Opus, MP3 where the
        library is 1.1 or later, AIFF, ...); channels averaged; resampled to 16 kHz by soxr
        (the SoX resampler, 'HQ'); checked: not empty, finite, at most MAX_SECONDS
    log_mel(audio, n_mels=80 | 128)  ->  float32 [n_mels, 3000] (30 s: padded with silence or
        cut), Whisper's recipe: periodic Hann window of 400 samples every 160 (10 ms), centred
        (reflect-padded) frames, power spectrum, Slaney-normalised mel filters from 0 to 8 kHz,
        log10 floored at 1e-10, then clipped 8 below its maximum and mapped by (x + 4) / 4

soundfile and soxr are the `audio` extra (`pip install tinyt[audio]`); samples already at 16 kHz
need neither.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tinyt.errors import DataError

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE  # 480,000: one window of the encoder
N_FRAMES = N_SAMPLES // HOP  # 3,000
MAX_SECONDS = 4 * 3600  # a longer input is refused, not read into memory
MEL_BINS = (80, 128)  # Whisper v1-v3 / large-v3 and -turbo


def _audio_modules():
    try:
        import soundfile
        import soxr
    except ImportError as e:
        raise DataError(f"reading an audio file needs soundfile and soxr ({e.name} is missing): "
                        "pip install 'tinyt[audio]'; or pass 16 kHz samples as a numpy "
                        "array") from None
    return soundfile, soxr


def load_audio(source: str | os.PathLike | np.ndarray, sampling_rate: int | None = None,
               ) -> np.ndarray:
    """Mono float32 samples at SAMPLE_RATE from a file, or from samples (1-D, or [frames,
    channels]) at `sampling_rate` (required for samples)."""
    if isinstance(source, (str, os.PathLike)):
        if sampling_rate is not None:
            raise DataError("sampling_rate is read from the file; pass it with samples only")
        samples, sampling_rate = _read_file(Path(source))
    else:
        if sampling_rate is None:
            raise DataError("samples need their sampling_rate (Hz), e.g. "
                            "load_audio(x, sampling_rate=44100)")
        samples = np.asarray(source)
        if samples.dtype.kind not in "fiu" or samples.ndim not in (1, 2):
            raise DataError(f"samples must be a 1-D array, or 2-D [frames, channels], of numbers; "
                            f"got {samples.dtype} with shape {samples.shape}")
        if samples.dtype.kind in "iu":  # PCM integers: full scale is 1.0
            info = np.iinfo(samples.dtype)
            samples = (samples.astype(np.float64) - (info.min + info.max + 1) / 2) \
                / ((info.max - info.min + 1) / 2)
    if not (isinstance(sampling_rate, int) and not isinstance(sampling_rate, bool)
            and 1_000 <= sampling_rate <= 768_000):
        raise DataError(f"sampling_rate={sampling_rate!r} is invalid: an integer number of "
                        "samples a second, 1,000 to 768,000")
    return _prepared(samples, sampling_rate)


def _read_file(path: Path) -> tuple[np.ndarray, int]:
    soundfile, _ = _audio_modules()
    if not path.is_file():
        raise DataError(f"{path} is not a file")
    try:
        info = soundfile.info(str(path))
    except (RuntimeError, soundfile.LibsndfileError) as e:  # not audio libsndfile reads
        kinds = ", ".join(sorted(soundfile.available_formats()))
        raise DataError(f"{path} is not audio this machine's libsndfile reads ({e}); it reads: "
                        f"{kinds}") from None
    if info.frames / max(info.samplerate, 1) > MAX_SECONDS:
        raise DataError(f"{path} lasts {info.frames / info.samplerate / 3600:.1f} h; at most "
                        f"{MAX_SECONDS // 3600} h are read at once (split it)")
    try:
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError) as e:
        raise DataError(f"{path} could not be decoded: {e}") from None
    return samples, int(rate)


def _prepared(samples: np.ndarray, rate: int) -> np.ndarray:
    """Checked, mono, resampled to SAMPLE_RATE, float32."""
    if samples.ndim == 2:
        samples = samples.mean(axis=1)
    if samples.size == 0:
        raise DataError("the audio is empty (0 samples)")
    if samples.size / rate > MAX_SECONDS:
        raise DataError(f"the audio lasts {samples.size / rate / 3600:.1f} h; at most "
                        f"{MAX_SECONDS // 3600} h are read at once (split it)")
    if not np.isfinite(samples).all():
        bad = int((~np.isfinite(samples)).sum())
        raise DataError(f"the audio holds {bad} non-finite sample(s) (NaN or infinity)")
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    if rate != SAMPLE_RATE:
        _, soxr = _audio_modules()
        samples = soxr.resample(samples, rate, SAMPLE_RATE, quality="HQ").astype(np.float32)
    return samples


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear to 1 kHz (15 mels there), logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    log_region = f >= 1000.0
    mel = 3.0 * f / 200.0
    mel[log_region] = 15.0 + np.log(f[log_region] / 1000.0) * 27.0 / np.log(6.4)
    return mel


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    log_region = m >= 15.0
    f = 200.0 * m / 3.0
    f[log_region] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (m[log_region] - 15.0))
    return f


def mel_filters(n_mels: int) -> np.ndarray:
    """[n_fft/2 + 1, n_mels] triangular filters, Slaney-normalised (each of area ~1)."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array([0.0]))[0],
                                   _hz_to_mel(np.array([SAMPLE_RATE / 2]))[0], n_mels + 2))
    bins = np.linspace(0, SAMPLE_RATE // 2, 1 + N_FFT // 2)
    slopes = edges[None, :] - bins[:, None]
    width = np.diff(edges)
    down, up = -slopes[:, :-2] / width[:-1], slopes[:, 2:] / width[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:n_mels + 2] - edges[:n_mels]))


def log_mel(audio: np.ndarray, n_mels: int = 80, *, whole: bool = False) -> np.ndarray:
    """Whisper's input features [n_mels, N_FRAMES] (float32) of 16 kHz mono samples: the first
    30 s, padded with silence to 30 s. whole=True: every sample's, [n_mels, samples // HOP]
    (long-form transcription's, as WhisperFeatureExtractor with truncation=False and
    padding="longest": the floor 8 below the maximum of the whole)."""
    if n_mels not in MEL_BINS:
        raise DataError(f"n_mels={n_mels!r} is invalid; Whisper's encoders take "
                        f"{' or '.join(map(str, MEL_BINS))} mel bins")
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise DataError(f"log_mel takes mono samples (1-D); got shape {audio.shape}")
    if whole and audio.size < N_FFT:
        raise DataError(f"log_mel(whole=True) needs at least {N_FFT} samples; got {audio.size}")
    n = audio.size if whole else N_SAMPLES
    x = np.zeros(n, dtype=np.float32)
    x[:min(audio.size, n)] = audio[:n]
    x = np.pad(x, N_FFT // 2, mode="reflect")  # centred frames
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP][:n // HOP]
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
    logs = np.empty((len(frames), n_mels), dtype=np.float32)  # (4 h at 128 bins: 0.7 GB)
    for a in range(0, len(frames), N_FRAMES):  # a window's frames at a time: 4 h of audio
        b = a + N_FRAMES  # would need ~7 GB of spectra at once, a window ~15 MB
        power = np.abs(np.fft.rfft(frames[a:b] * window, axis=-1)) ** 2  # [frames, 201]
        mel = power @ _filters(n_mels)  # [frames, n_mels]
        logs[a:b] = np.log10(np.maximum(mel, 1e-10))
    np.maximum(logs, logs.max() - np.float32(8.0), out=logs)
    logs += np.float32(4.0)
    logs /= np.float32(4.0)
    return np.ascontiguousarray(logs.T)


_FILTERS: dict[int, np.ndarray] = {}


def _filters(n_mels: int) -> np.ndarray:
    if n_mels not in _FILTERS:
        _FILTERS[n_mels] = mel_filters(n_mels)
    return _FILTERS[n_mels]
