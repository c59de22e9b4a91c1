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


# A Whisper small enough for the page and package tests: tiny's vocabulary, special tokens, 80
# mel bins and 1,500 frames, at a quarter of its width and one layer a stack
SMALL = dict(d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=1, decoder_layers=1)


def exported_whisper(root: Path, quantized: tuple[int, ...] = ()) -> dict[str, Path]:
    """SMALL imported, exported and quantized at each of `quantized`'s bits (the quantize
    stage's speech report needs espeak-ng): {"fp32": ..., "int8": ..., "int4": ...}; also
    "hf", the Hugging Face directory it was made from."""
    import torch

    from tinyt.export import export_onnx
    from tinyt.export.quantize import quantize
    from tinyt.hf import import_hf

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine
    try:
        save_whisper("tiny", root / "hf", **SMALL)
        made = {"hf": root / "hf",
                "fp32": export_onnx(import_hf(root / "hf", root / "ck"), root / "onnx")}
        for bits in quantized:
            made[f"int{bits}"] = quantize(made["fp32"], root / f"int{bits}", bits=bits)
        return made
    finally:
        torch.set_num_threads(before)
