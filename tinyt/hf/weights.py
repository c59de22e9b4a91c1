"""Hugging Face weight files in, and tinyt's tensors under an entry's names both ways (torch).

    model.safetensors | index + shards ──read_hf_weights──▶ {HF name: tensor}
    {HF name: tensor} ──state_from_hf(family)──▶ {tinyt name: tensor}  (checked, then loaded)
    tinyt model ──hf_state(family)──▶ {HF name: tensor}

An entry's `weights` pair each tinyt tensor with the HF tensors it is made of: one is the same
tensor (transposed for GPT-2's Conv1D, stored [in, out]); several are stacked by rows, as tinyt
fuses q, k, v into c_attn [(nh + 2 nkv) * hs, C] and gate, up into c_fc [2 I, C]. The pairs
are made from the model a config builds (on the meta device: names and shapes, no memory), so
a tensor the entry has no place for, or an HF tensor tinyt's model would drop, is an error and
never a silent loss.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tinyt.checkpoint import read_safetensors, unique_state_dict
from tinyt.config import ModelConfig
from tinyt.errors import CheckpointError, ConversionError
from tinyt.hf.family import Family
from tinyt.model import build_model

SAFETENSORS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
# the table a tied head is: a decoder-only model's, an encoder-decoder's decoder's (the
# encoder's where the two stacks share it, and tinyt holds it once)
EMBEDDINGS = ("transformer.wte.weight", "decoder.wte.weight", "encoder.wte.weight")


def qkv_rows(cfg: ModelConfig) -> tuple[int, ...]:
    """c_attn's rows: q [nh * hs], then k and v [nkv * hs] each."""
    kv = cfg.kv_heads * cfg.head_dim
    return cfg.n_head * cfg.head_dim, kv, kv


def gate_up_rows(cfg: ModelConfig) -> tuple[int, ...]:
    """A gated c_fc's rows: the gate [I], then the up projection [I]."""
    return cfg.mlp_width, cfg.mlp_width


def kv_rows(cfg: ModelConfig) -> tuple[int, ...]:
    """Cross-attention's c_kv rows: k, then v [nkv * hs] each."""
    kv = cfg.kv_heads * cfg.head_dim
    return kv, kv


@dataclass(frozen=True)
class Pair:
    """One tinyt tensor and its HF tensors, for one config. `ours` None is a zero bias that
    HF's class keeps and tinyt's bias-free model has not; its `rows` are its width."""
    ours: str | None
    theirs: tuple[str, ...]
    rows: tuple[int, ...] | None  # each HF tensor's rows, when several are stacked
    conv1d: bool


def tinyt_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors a tinyt model of cfg holds, a tied head once (as the embedding)."""
    with torch.device("meta"):
        model = build_model(cfg)
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            out[name] = tuple(t.shape)
    return out


def pairs(family: Family, cfg: ModelConfig) -> list[Pair]:
    """Every tinyt tensor of cfg with its HF names; a tensor without one is refused."""
    have = tinyt_shapes(cfg)
    out = []
    for weight in family.weights:
        if weight.when is not None and not weight.when(cfg):
            continue
        layers = cfg.decoder_layers if weight.ours.startswith("decoder.") else cfg.n_layer
        blocks = range(layers) if "{i}" in weight.ours else (0,)
        kinds = ("weight", "bias") if "{w}" in weight.ours else ("",)
        rows = weight.rows(cfg) if weight.rows else None
        for i in blocks:
            for w in kinds:
                ours = weight.ours.format(i=i, w=w)
                theirs = tuple(t.format(i=i, w=w) for t in weight.theirs)
                if ours in have:
                    out.append(Pair(ours, theirs, rows, weight.conv1d))
                elif family.zero_biases and w == "bias":  # one entry per row of its weight
                    width = have[ours.removesuffix("bias") + "weight"][0]
                    out.append(Pair(None, theirs, (width,), False))
    homeless = sorted(set(have) - {p.ours for p in out})
    if homeless:
        raise ConversionError(f"{family.architecture} has no place for tinyt's {homeless[:8]}")
    return out


def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards its index names; pickles refused."""
    if (directory / SAFETENSORS).is_file():
        return read_safetensors(directory / SAFETENSORS)
    if (directory / SHARD_INDEX).is_file():
        try:
            weight_map = json.loads((directory / SHARD_INDEX).read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{directory / SHARD_INDEX} is not a shard index: {e}") \
                from None
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            if Path(shard).name != shard:
                raise CheckpointError(f"{directory / SHARD_INDEX} names shard {shard!r} outside "
                                      "the directory")
            tensors.update(read_safetensors(directory / shard))
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise CheckpointError(f"{directory / SHARD_INDEX} lists {absent[:5]} but no shard "
                                  "holds them")
        return tensors
    pickles = sorted(p.name for p in directory.glob("pytorch_model*.bin"))
    if pickles:
        try:  # the directory's own class, so the save keeps its head (an encoder's, an LM's)
            arch = json.loads((directory / "config.json").read_text())["architectures"][0]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            arch = "AutoModelForCausalLM"
        arch = arch if isinstance(arch, str) and arch.isidentifier() else "AutoModel"
        raise CheckpointError(
            f"{directory} holds {pickles[0]}, a pickle, and no {SAFETENSORS}: tinyt does not "
            "unpickle model files. Convert it where you trust it: python -c \"from "
            f"transformers import {arch} as M; "
            f"M.from_pretrained('{directory}').save_pretrained('{directory}', "
            "safe_serialization=True)\"")
    raise CheckpointError(f"{directory} has no {SAFETENSORS} nor {SHARD_INDEX}")


def state_from_hf(family: Family, tensors: dict[str, torch.Tensor], cfg: ModelConfig,
                  source: str) -> dict[str, torch.Tensor]:
    """HF tensors of `family` under tinyt's names and layouts, for a model of cfg."""
    sd, original = {}, {}
    for name, value in tensors.items():
        if name.endswith(family.buffers + family.drops):  # causal-mask buffers, a pooler
            continue
        key = name
        if key.endswith((".gamma", ".beta")) and "LayerNorm" in key:  # old BERT saves' names,
            key = key.removesuffix(".gamma") + ".weight" if key.endswith(".gamma") \
                else key.removesuffix(".beta") + ".bias"  # as transformers renames them
        if key != family.head and not key.startswith(family.base) \
                and not key.startswith(family.outside):
            key = family.base + key  # a base-model save (GPT2Model, LlamaModel)
        sd[key], original[key] = value, name
    used: set[str] = set()
    if family.shared and cfg.shared_embeddings:
        used |= _one_table(family.shared, sd, source)

    def take(key: str) -> torch.Tensor:
        if key not in sd:
            raise CheckpointError(f"{source} lacks {key!r}")
        used.add(key)
        return sd[key]

    state, paired = {}, {}
    for p in pairs(family, cfg):
        parts = [torch.zeros(p.rows[j]) if p.rows and name.endswith(family.absent)
                 and name not in sd else take(name) for j, name in enumerate(p.theirs)]
        if p.conv1d:
            parts = [t.t() for t in parts]  # Conv1D [in, out] -> Linear [out, in]
        if p.ours is None:
            if bool(parts[0].any()):
                raise CheckpointError(f"{source}: config.json says the model is bias-free but "
                                      f"{p.theirs[0]} is not zero")
            continue
        paired[p.ours] = p.theirs[0]
        state[p.ours] = parts[0] if len(parts) == 1 else torch.cat(parts)  # rows stacked
    embedding = next((paired[t] for t in EMBEDDINGS if t in paired), None)
    head = family.head
    if cfg.tie_weights and head in sd and embedding is not None:
        used.add(head)
        if not torch.equal(sd[head], sd[embedding]):
            raise CheckpointError(f"{source}: tie_word_embeddings is true but {head} differs "
                                  f"from {embedding}")
    unexpected = sorted(original[k] for k in set(sd) - used)  # as the file names them
    if unexpected:  # a weight tinyt would drop is a model tinyt does not implement
        raise CheckpointError(f"{source} holds weights tinyt's model has no place for: "
                              f"{unexpected[:8]}")
    return {k: v.contiguous() for k, v in state.items()}


def _one_table(names: tuple[str, ...], sd: dict[str, torch.Tensor], source: str) -> set[str]:
    """An encoder-decoder's shared embedding table under each of its names (a save holds one
    or more of them: they must be one tensor); returns the names it held."""
    held = [n for n in names if n in sd]
    if not held:
        raise CheckpointError(f"{source} lacks the shared embedding table (any of {list(names)})")
    table = sd[held[0]]
    for name in held[1:]:
        if not torch.equal(sd[name], table):
            raise CheckpointError(f"{source}: the stacks share their embeddings but {name} "
                                  f"differs from {held[0]}")
    sd.update({n: table for n in names})
    return set(names)


def hf_state(family: Family, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A tinyt model's weights under `family`'s names and layouts (stacks split by rows)."""
    sd = unique_state_dict(model)
    out = {}
    for p in pairs(family, model.config):
        if p.ours is None:
            out[p.theirs[0]] = torch.zeros(p.rows or ())  # a bias-free model's bias
            continue
        parts = sd[p.ours].split(list(p.rows)) if p.rows else (sd[p.ours],)
        for name, t in zip(p.theirs, parts):
            if p.rows and name.endswith(family.absent):  # not in the class (softmax-exact)
                continue
            out[name] = (t.t() if p.conv1d else t).contiguous().clone()  # Linear -> Conv1D
    return out
