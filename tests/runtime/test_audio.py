"""runtime/audio.py: audio files and samples in (mono, 16 kHz, checked), and Whisper's log-mel
features equal to transformers' WhisperFeatureExtractor.

The bound, 1e-4 on features in [-1.5, 1.5]: both sides compute a float32 power spectrum, whose
rounding error is relative to the frame's strongest bins (~u·√n_fft of them); a mel bin 8
decades (the clip) below the strongest carries a relative error up to ~1e4 times larger, which
log10 and the /4 turn into ~1e-4 at the most. Measured: 4.6e-5 on a chirp (the steepest
spectrum here), ~1e-6 on noise and speech."""
import shutil
import subprocess

import numpy as np
import pytest

from tinyt.errors import DataError
from tinyt.runtime import audio as A

sf = pytest.importorskip("soundfile", reason="the audio extra: pip install 'tinyt[audio]'")
FEATURES_BOUND = 1e-4


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """A sentence spoken by espeak-ng (22,050 Hz WAV), read and resampled by load_audio."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (scripts/setup.sh installs it with apt)")
    path = tmp_path_factory.mktemp("speech") / "said.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "The quick brown fox jumps over the lazy "
                    "dog, then counts to twelve."], check=True, timeout=60)
    return path


def _cases(speech_samples):
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 7) / 16000
    return {"speech": speech_samples,
            "chirp": (0.5 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32),
            "silence": np.zeros(16000, np.float32),
            "clipped": np.clip(rng.standard_normal(12345).astype(np.float32) * 3, -1, 1),
            "past 30 s": rng.standard_normal(16000 * 31 + 7).astype(np.float32) * 0.05,
            "one frame and a sample": rng.standard_normal(401).astype(np.float32)}


@pytest.mark.parametrize("n_mels", A.MEL_BINS)
def test_features_equal_whisper_feature_extractor(speech, n_mels):
    from transformers import WhisperFeatureExtractor
    fe = WhisperFeatureExtractor(feature_size=n_mels)
    assert np.array_equal(A.mel_filters(n_mels), fe.mel_filters)
    for name, x in _cases(A.load_audio(speech)).items():
        ref = fe(x, sampling_rate=16000, return_tensors="np").input_features[0]
        ours = A.log_mel(x, n_mels)
        assert ours.shape == ref.shape == (n_mels, A.N_FRAMES) and ours.dtype == np.float32
        assert np.abs(ours - ref).max() <= FEATURES_BOUND, name


@pytest.mark.parametrize("n_mels", A.MEL_BINS)
def test_whole_features_equal_the_extractor_without_truncation(speech, n_mels):
    """Long-form features (whole=True, computed a window's frames at a time): the extractor
    with truncation=False, padding="longest", over speech, 20 s of silence, speech and noise
    (over 30 s: more than one window of frames, one floor 8 below the whole's maximum)."""
    from transformers import WhisperFeatureExtractor
    rng = np.random.default_rng(1)
    said = A.load_audio(speech)
    x = np.concatenate([said, np.zeros(20 * 16000, np.float32), said,
                        rng.standard_normal(16000 * 9 + 77).astype(np.float32) * 0.01])
    ref = WhisperFeatureExtractor(feature_size=n_mels)(
        x, sampling_rate=16000, truncation=False, padding="longest",
        return_tensors="np").input_features[0]
    ours = A.log_mel(x, n_mels, whole=True)
    assert ours.shape == ref.shape == (n_mels, x.size // A.HOP) and ours.shape[1] > A.N_FRAMES
    assert np.abs(ours - ref).max() <= FEATURES_BOUND
    with pytest.raises(DataError, match="needs at least 400 samples; got 399"):
        A.log_mel(x[:399], n_mels, whole=True)


def test_files_are_read_mixed_down_and_resampled(speech, tmp_path):
    said = A.load_audio(speech)
    rate = sf.info(str(speech)).samplerate
    assert rate == 22050 and said.dtype == np.float32
    assert abs(said.size - round(sf.info(str(speech)).frames * 16000 / rate)) <= 1
    assert said.size / 16000 > 2.0 and np.abs(said).max() > 0.1  # seconds of speech
    # a 1 kHz tone in one channel, silence in the other, at 44.1 kHz in three formats
    t = np.arange(44100) / 44100
    tone = np.stack([0.8 * np.sin(2 * np.pi * 1000 * t), np.zeros_like(t)], axis=1)
    kinds = [("wav", "PCM_16"), ("flac", "PCM_16"), ("ogg", "VORBIS")]
    if "MP3" in sf.available_formats():
        kinds.append(("mp3", "MPEG_LAYER_III"))
    for suffix, subtype in kinds:
        path = tmp_path / f"tone.{suffix}"
        sf.write(str(path), tone, 44100, subtype=subtype)
        mono = A.load_audio(path)
        assert abs(mono.size - 16000) <= 1600 if suffix == "mp3" else abs(mono.size - 16000) <= 1
        middle = mono[4000:12000]  # clear of the ends (codec and resampler edges)
        peak_hz = np.argmax(np.abs(np.fft.rfft(middle))) * 16000 / middle.size
        assert abs(peak_hz - 1000) <= 2, suffix  # the tone kept its pitch
        assert 0.3 < np.abs(middle).max() < 0.45, suffix  # 0.8 averaged with silence
    # samples in: integers are PCM (full scale 1), channels averaged, the rate required
    pcm = (tone * 32767).astype(np.int16)
    from_pcm = A.load_audio(pcm, sampling_rate=44100)
    assert np.abs(from_pcm - A.load_audio(tone, sampling_rate=44100)).max() < 1e-4
    assert np.array_equal(A.load_audio(said, sampling_rate=16000), said)  # 16 kHz as it is


@pytest.mark.parametrize("make,says", [
    (lambda p: p / "none.wav", "is not a file"),
    (lambda p: _write(p / "text.wav", b"not audio at all"), "is not audio this machine's "
                                                           "libsndfile reads"),
    (lambda p: _write(p / "cut.wav", _wav_bytes()[:40]), "No .data. chunk"),  # cut short
    (lambda p: _silent_wav(p / "empty.wav", 0), "the audio is empty"),
])
def test_bad_files_get_a_clear_error(make, says, tmp_path):
    with pytest.raises(DataError, match=says):
        A.load_audio(make(tmp_path))


@pytest.mark.parametrize("samples,rate,says", [
    (np.zeros(100, np.float32), None, "samples need their sampling_rate"),
    (np.zeros(100, np.float32), 8.5, "sampling_rate=8.5 is invalid"),
    (np.zeros(100, np.float32), 100, "sampling_rate=100 is invalid"),
    (np.array([0.0, np.nan, np.inf], np.float32), 16000, "2 non-finite sample"),
    (np.zeros((2, 3, 4), np.float32), 16000, "1-D array, or 2-D"),
    (np.array(["a", "b"]), 16000, "of numbers"),
    (np.zeros(0, np.float32), 16000, "the audio is empty"),
    (np.zeros(A.MAX_SECONDS * 1000 + 1000, np.int8), 1000, "at most 4 h"),
])
def test_bad_samples_get_a_clear_error(samples, rate, says):
    with pytest.raises(DataError, match=says):
        A.load_audio(samples, sampling_rate=rate)


def test_bad_feature_requests_get_a_clear_error():
    with pytest.raises(DataError, match="n_mels=81 is invalid; Whisper's encoders take 80 or 128"):
        A.log_mel(np.zeros(16000, np.float32), 81)
    with pytest.raises(DataError, match="mono samples"):
        A.log_mel(np.zeros((16000, 2), np.float32))


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _wav_bytes() -> bytes:
    import io
    buf = io.BytesIO()
    sf.write(buf, np.zeros(1000, np.float32), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _silent_wav(path, frames: int):
    sf.write(str(path), np.zeros(frames, np.float32), 16000, subtype="PCM_16")
    return path
