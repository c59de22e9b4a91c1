"""Checkpoint directories: safetensors + JSON, never pickle.

    checkpoint/
      model.safetensors        weights; a tied matrix is stored once
      config.json              format, ModelConfig, labels (classifier), metrics
      tokenizer.json           Hugging Face tokenizer
      train_state.safetensors  optimizer moments and torch RNG state   } present while a run
      train_state.json         step, TrainConfig, history              } can be resumed

A checkpoint is written whole into a temporary directory and renamed into place.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tinyt import __version__
from tinyt.config import ModelConfig, TrainConfig
from tinyt.errors import CheckpointError, ConfigError, NonFiniteError
from tinyt.finite import describe
from tinyt.fsutil import atomic_dir, write_json
from tinyt.model import build_model
from tinyt.tokenizer import Tokenizer

FORMAT = "tinyt-checkpoint"
FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
STATE_FILE = "train_state.safetensors"
STATE_JSON = "train_state.json"
REQUIRED_FILES = (MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE)


@dataclass
class TrainState:
    """What a resumed run needs beyond the weights."""

    step: int
    train_config: TrainConfig
    optimizer: torch.optim.Optimizer
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Checkpoint:
    model: nn.Module
    config: ModelConfig
    tokenizer: Tokenizer
    labels: list[str] | None
    meta: dict[str, Any]
    path: Path


def unique_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """state_dict with each shared tensor once, under its first name (tied lm_head dropped)."""
    out, seen = {}, set()
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().contiguous().cpu()
    return out


def check_finite(tensors: dict[str, torch.Tensor], source: str) -> None:
    """Raise NonFiniteError naming the first floating-point tensor that holds NaN or +-inf."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            counts = (int(torch.isnan(t).sum()), int(torch.isposinf(t).sum()),
                      int(torch.isneginf(t).sum()))
            raise NonFiniteError(f"{source}: {describe(name, *counts, t.numel())}; weights must "
                                 "be finite (the model diverged in training or the file is "
                                 "damaged)")


def check_tokenizer_fits(tokenizer: Tokenizer, cfg: ModelConfig, source: str) -> None:
    """A tokenizer with more ids than the model's vocabulary is the wrong tokenizer."""
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(f"{source} has {tokenizer.vocab_size} tokens but the model's "
                              f"vocab_size is {cfg.vocab_size}; use the tokenizer the model "
                              "was trained with")


def check_import_target(out: Path) -> None:
    """An importer writes a new checkpoint directory, never into a used one."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"output directory {out} exists and is not empty; choose a new one")


def save_import(out: Path, cfg: ModelConfig, tokenizer: Tokenizer,
                state: dict[str, torch.Tensor], *, source: str, metrics: dict[str, Any],
                log: Callable[[str], None], labels: list[str] | None = None,
                files: Callable[[Path], None] | None = None) -> Path:
    """Every importer's tail (Hugging Face's and nanoGPT's, each having checked that its
    tokenizer fits): a model of cfg holding `state` (refused by name if it does not fit),
    written as a checkpoint with `metrics` and its parameter count, and a word on a padded
    vocabulary. files(tmp): writes what else the directory holds (a GGUF import's blocks)
    before it is renamed into place."""
    model = build_model(cfg)
    load_weights(model, state, source)
    path = save_checkpoint(out, model, tokenizer, labels=labels, files=files,
                           metrics={**metrics, "parameters": model.num_parameters()})
    note = padding_note(cfg, tokenizer)
    if note:
        log(note)
    return path


def padding_note(cfg: ModelConfig, tokenizer: Tokenizer) -> str | None:
    """What an importer says about a vocabulary padded beyond its tokenizer, else None."""
    if tokenizer.vocab_size >= cfg.vocab_size:
        return None
    return (f"the model's vocabulary has {cfg.vocab_size} ids and the tokenizer "
            f"{tokenizer.vocab_size}: ids {tokenizer.vocab_size}..{cfg.vocab_size - 1} are "
            "padding, kept for speed and never sampled (recorded as vocab_padding in "
            "config.json)")


def save_checkpoint(out: str | Path, model: nn.Module, tokenizer: Tokenizer, *,
                    labels: list[str] | None = None, metrics: dict[str, Any] | None = None,
                    run: dict[str, Any] | None = None, state: TrainState | None = None,
                    files: Callable[[Path], None] | None = None) -> Path:
    """Write a complete checkpoint directory atomically; returns its path. `run` records how
    the run was made (data path) so that a resume uses the same inputs; files(tmp) writes
    more files into the directory before it is renamed into place."""
    cfg: ModelConfig = model.config
    weights = unique_state_dict(model)
    check_finite(weights, f"refusing to write checkpoint {out}")
    padding = cfg.vocab_size - tokenizer.vocab_size
    with atomic_dir(out) as tmp:
        save_file(weights, str(tmp / MODEL_FILE))
        tokenizer.save(tmp / TOKENIZER_FILE)
        write_json(tmp / CONFIG_FILE, {
            "format": FORMAT, "format_version": FORMAT_VERSION, "tinyt_version": __version__,
            "model": cfg.to_dict(), "labels": labels, "metrics": metrics or {},
            "run": run or {}, "vocab_padding": padding,
        })
        if state is not None:
            _save_train_state(tmp, model, state)
        if files is not None:
            files(tmp)
    return Path(out)


def _save_train_state(tmp: Path, model: nn.Module, state: TrainState) -> None:
    tensors = {"rng.torch": torch.get_rng_state()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in state.optimizer.param_groups:
        for p in group["params"]:
            for key, value in state.optimizer.state.get(p, {}).items():
                tensors[f"optim.{names[id(p)]}.{key}"] = value.detach().contiguous().cpu()
    save_file(tensors, str(tmp / STATE_FILE))
    write_json(tmp / STATE_JSON, {
        "step": state.step, "train_config": state.train_config.to_dict(),
        "history": state.history,
    })


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not readable JSON: {e}") from None


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file: {e}") from None


def read_config(path: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    """The ModelConfig and raw config.json of a checkpoint directory (torch not touched)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is missing {', '.join(missing)}; a checkpoint directory holds "
            f"{', '.join(REQUIRED_FILES)} (written by 'tinyt train' or 'tinyt import-nanogpt')"
        )
    meta = _read_json(path / CONFIG_FILE)
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{path / CONFIG_FILE} is not a tinyt checkpoint config (format={meta.get('format')!r},"
            f" expected {FORMAT!r})"
        )
    try:
        cfg = ModelConfig.from_dict(meta.get("model"))
    except ConfigError as e:
        raise CheckpointError(f"{path / CONFIG_FILE}: {e}") from None
    return cfg, meta


def load_weights(model: nn.Module, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Copy `tensors` into `model`, refusing missing, unexpected or mis-shaped entries."""
    expected = unique_state_dict(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not match the model: missing {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
            f"{' ...' if len(unexpected) > 8 else ''}"
        )
    bad = [f"{k}: file {tuple(tensors[k].shape)} vs model {tuple(v.shape)}"
           for k, v in expected.items() if tuple(tensors[k].shape) != tuple(v.shape)]
    if bad:
        raise CheckpointError(f"{source} has shapes that do not match its config: {bad[:8]}")
    check_finite(tensors, source)
    with torch.no_grad():
        params = dict(model.named_parameters())
        params.update(dict(model.named_buffers()))
        for k, t in tensors.items():
            params[k].copy_(t.to(params[k].dtype))


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load a checkpoint directory; the model is returned in eval mode."""
    path = Path(path)
    cfg, meta = read_config(path)
    tokenizer = Tokenizer.from_file(path / TOKENIZER_FILE)
    check_tokenizer_fits(tokenizer, cfg, str(path / TOKENIZER_FILE))
    labels = meta.get("labels")
    if cfg.task in ("classifier", "token_classifier") and (
            not isinstance(labels, list) or len(labels) != cfg.num_labels):
        raise CheckpointError(
            f"{path / CONFIG_FILE}: a classifier needs 'labels', a list of {cfg.num_labels} names"
        )
    model = build_model(cfg)
    load_weights(model, read_safetensors(path / MODEL_FILE), str(path / MODEL_FILE))
    model.eval()
    return Checkpoint(model, cfg, tokenizer, labels, meta, path)


def has_train_state(path: str | Path) -> bool:
    return (Path(path) / STATE_FILE).is_file() and (Path(path) / STATE_JSON).is_file()


def load_train_state(path: str | Path, model: nn.Module,
                     optimizer: torch.optim.Optimizer) -> tuple[int, TrainConfig, list]:
    """Restore optimizer moments and the torch RNG; returns (step, TrainConfig, history)."""
    path = Path(path)
    if not has_train_state(path):
        raise CheckpointError(
            f"{path} has no {STATE_FILE} / {STATE_JSON}: it cannot be resumed (a finished run "
            "keeps them; an imported checkpoint has none)"
        )
    info = _read_json(path / STATE_JSON)
    train_config = read_train_config(path)
    tensors = read_safetensors(path / STATE_FILE)
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            prefix = f"optim.{names[id(p)]}."
            entry = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
            if entry:
                optimizer.state[p] = entry
    torch.set_rng_state(tensors["rng.torch"])
    try:
        return int(info["step"]), train_config, info["history"]
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path / STATE_JSON} is malformed: {e}") from None


def read_train_config(path: str | Path) -> TrainConfig:
    """The TrainConfig of the run saved in a checkpoint directory (its train_state.json)."""
    path = Path(path) / STATE_JSON
    try:
        return TrainConfig.from_dict(_read_json(path)["train_config"])
    except (KeyError, TypeError, ValueError, ConfigError) as e:
        raise CheckpointError(f"{path} is malformed: {e}") from None
