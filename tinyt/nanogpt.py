"""Import a nanoGPT checkpoint (`ckpt.pt` as karpathy/nanoGPT's train.py writes it).

The file is read with `torch.load(weights_only=True)`: tensors and plain containers only, no
arbitrary objects unpickled. tinyt uses nanoGPT's parameter names, so the weights map by name
once `torch.compile`'s `_orig_mod.` prefix is removed.
"""
from __future__ import annotations

from pathlib import Path

import torch

from tinyt.checkpoint import load_weights, save_checkpoint
from tinyt.config import ModelConfig
from tinyt.errors import CheckpointError, ConfigError
from tinyt.model import TinyTransformer
from tinyt.tokenizer import Tokenizer

REQUIRED_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
OPTIONAL_ARGS = ("bias", "dropout")
COMPILE_PREFIX = "_orig_mod."


def _load(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"nanoGPT checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
        raise CheckpointError(
            f"{path} could not be read as a nanoGPT checkpoint with weights_only=True "
            f"(tensors and plain containers only): {str(e).splitlines()[0]}"
        ) from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        keys = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(
            f"{path} is not a nanoGPT checkpoint: expected a dict with 'model' and 'model_args', "
            f"found {keys}"
        )
    return ckpt


def config_from_model_args(args: dict, tie_weights: bool) -> ModelConfig:
    missing = [k for k in REQUIRED_ARGS if k not in args]
    unknown = sorted(set(args) - set(REQUIRED_ARGS) - set(OPTIONAL_ARGS))
    if missing or unknown:
        raise CheckpointError(
            f"nanoGPT model_args: missing {missing}, unexpected {unknown}; expected "
            f"{list(REQUIRED_ARGS)} and optionally {list(OPTIONAL_ARGS)}"
        )
    try:
        return ModelConfig(
            block_size=args["block_size"], vocab_size=args["vocab_size"],
            n_layer=args["n_layer"], n_head=args["n_head"], n_embd=args["n_embd"],
            bias=args.get("bias", True), dropout=float(args.get("dropout", 0.0)),
            pos_encoding="learned", tie_weights=tie_weights,
        )
    except ConfigError as e:
        raise CheckpointError(f"nanoGPT model_args are not a valid model: {e}") from None


def import_nanogpt(ckpt_path: str | Path, out: str | Path, *, tokenizer: str) -> Path:
    """Write a tinyt checkpoint directory from nanoGPT's ckpt.pt. `tokenizer` is the path of a
    tokenizer.json for the model's vocabulary, or 'byte' for tinyt's 256-byte tokenizer."""
    ckpt_path, out = Path(ckpt_path), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"output directory {out} exists and is not empty; choose a new one")
    tok = Tokenizer.byte_level() if tokenizer == "byte" else Tokenizer.from_file(tokenizer)
    ckpt = _load(ckpt_path)
    state = {}
    for key, value in ckpt["model"].items():
        key = key[len(COMPILE_PREFIX):] if key.startswith(COMPILE_PREFIX) else key
        if key.endswith(".attn.bias") and value.dim() == 4:
            continue  # the causal-mask buffer of nanoGPT's non-flash path, not a weight
        state[key] = value
    wte, head = state.get("transformer.wte.weight"), state.get("lm_head.weight")
    tied = wte is not None and (head is None or torch.equal(wte, head))
    if tied:
        state.pop("lm_head.weight", None)
    cfg = config_from_model_args(dict(ckpt["model_args"]), tie_weights=tied)
    if tok.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"the tokenizer has {tok.vocab_size} tokens but the model's vocab_size is "
            f"{cfg.vocab_size}; pass the tokenizer.json the model was trained with"
        )
    model = TinyTransformer(cfg)
    load_weights(model, state, f"nanoGPT checkpoint {ckpt_path}")
    best = ckpt.get("best_val_loss")
    metrics = {
        "imported_from": "nanoGPT", "source_file": str(ckpt_path.resolve()),
        "iter_num": int(ckpt["iter_num"]) if "iter_num" in ckpt else None,
        "best_val_loss": float(best) if best is not None else None,
        "parameters": model.num_parameters(),
    }
    return save_checkpoint(out, model, tok, metrics=metrics)
