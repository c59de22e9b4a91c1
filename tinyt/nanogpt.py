"""Import a nanoGPT checkpoint (`ckpt.pt` as karpathy/nanoGPT's train.py writes it).

The file is read with `torch.load(weights_only=True)`: tensors and plain containers only, no
arbitrary objects unpickled. tinyt uses nanoGPT's parameter names, so the weights map by name
once `torch.compile`'s `_orig_mod.` prefix is removed.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from tinyt.checkpoint import check_import_target, check_tokenizer_fits, save_import
from tinyt.config import ModelConfig
from tinyt.errors import CheckpointError, ConfigError
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
            activation="gelu", norm_eps=1e-5,  # nanoGPT: nn.GELU() (exact), F.layer_norm 1e-5
        )
    except ConfigError as e:
        raise CheckpointError(f"nanoGPT model_args are not a valid model: {e}") from None


def _tokenizer(tokenizer: str, vocab_size: int) -> Tokenizer:
    if tokenizer != "byte":
        return Tokenizer.from_file(tokenizer)
    if vocab_size < 256:
        raise CheckpointError(
            f"the model's vocab_size is {vocab_size}, fewer than the byte tokenizer's 256 ids; "
            "a character-level nanoGPT model (meta.pkl) needs a tokenizer.json of its own "
            "characters: pass it with --tokenizer")
    # A byte-level nanoGPT model of exactly 256 ids has no end-of-text token.
    return Tokenizer.byte_level(end_of_text=vocab_size > 256)


def import_nanogpt(ckpt_path: str | Path, out: str | Path, *, tokenizer: str,
                   log: Callable[[str], None] = lambda s: None) -> Path:
    """Write a tinyt checkpoint directory from nanoGPT's ckpt.pt. `tokenizer` is the path of a
    tokenizer.json for the model's vocabulary, or 'byte' for the 256 bytes (with an
    end-of-text id 256 when the model has room for it). A vocabulary padded beyond the
    tokenizer (nanoGPT pads GPT-2's 50257 to 50304) stays padded; the padded ids are never
    sampled, and the checkpoint records the padding (config.json 'vocab_padding')."""
    ckpt_path, out = Path(ckpt_path), Path(out)
    check_import_target(out)
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
    tok = _tokenizer(tokenizer, cfg.vocab_size)
    check_tokenizer_fits(tok, cfg, "the tokenizer")
    best = ckpt.get("best_val_loss")
    metrics = {
        "imported_from": "nanoGPT", "source_file": str(ckpt_path.resolve()),
        "iter_num": int(ckpt["iter_num"]) if "iter_num" in ckpt else None,
        "best_val_loss": float(best) if best is not None else None,
    }
    return save_import(out, cfg, tok, state, source=f"nanoGPT checkpoint {ckpt_path}",
                        metrics=metrics, log=log)
