"""The test suite's Whisper (benchmarks/whisper_shape.py makes it: random weights at the real
models' shapes, Whisper's special-token layout, its generation_config.json) with the layers cut,
and speech from espeak-ng through runtime/audio.log_mel."""
from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import numpy as np

from tinyt.benchmarks.whisper_shape import (  # noqa: F401 (the fixtures' API)
    COMMON,
    ORDINARY,
    STD,
    TASK_TOKENS,
    WHISPER,
    generation_config,
    languages,
    save_whisper,
    special_ids,
    whisper_config,
    whisper_model,
    whisper_tokenizer,
)


@functools.lru_cache(maxsize=2)
def speech_features(n_mels: int, text: str = "The quick brown fox jumps over the lazy dog.",
                    ) -> np.ndarray:
    """Log-mel features (n_mels, 3000) of `text` spoken by espeak-ng (None without it)."""
    from tinyt.runtime.audio import load_audio, log_mel

    if shutil.which("espeak-ng") is None:
        return None
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "said.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, timeout=60)
        return log_mel(load_audio(wav), n_mels=n_mels)
