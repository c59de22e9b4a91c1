"""GGUF files in (llama.cpp's format): `tinyt import-hf MODEL.gguf OUT` (the `gguf` package).

    MODEL.gguf ──read_gguf──▶ metadata (llama.*) ──▶ config.json's keys ──▶ ModelConfig (LLAMA)
                             tokenizer.ggml.*    ──▶ tokenizer.json (gguf_tokens.py)
                             tensors (Q4_0 ...)  ──dequantize, Q/K rows unpermuted──▶ HF names
        ──the Hugging Face import's tail (state_from_hf, save_import)──▶ tinyt checkpoint
                                                   + gguf_blocks.safetensors (the raw blocks)

A GGUF is read as the Hugging Face directory llama.cpp's convert_hf_to_gguf.py made it from:
the metadata become that directory's config.json keys, the tensors its names, and the family's
entry (tinyt/hf/families/llama.py) reads and refuses them as it does a directory's. Weights are
dequantized to fp32 exactly (gguf.quants.dequantize: d·q, d·q + m, in fp32). The Q4_0 / Q4_1 /
Q8_0 matrices' blocks are kept as they are, in tinyt's names and row order, for the quantize
stage to carry into MatMulNBits without quantizing again (export/gguf_blocks.py).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tinyt.errors import CheckpointError, ConversionError

MAGIC = b"GGUF"
BLOCKS_FILE = "gguf_blocks.safetensors"  # beside the checkpoint's model.safetensors
CARRIED = ("Q4_0", "Q4_1", "Q8_0")  # the block types the quantize stage carries as they are
ACCEPTED = ("llama",)  # general.architecture values read; the catalogue entry is LLAMA

# llama.cpp's tensor names -> Hugging Face Llama's (gguf-py's tensor_mapping.py, one family)
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    name: str  # llama.cpp's
    kind: str  # its GGML type's name: F32, F16, Q4_0, Q4_1, Q8_0, Q6_K, ...
    data: np.ndarray  # as stored: [rows, bytes a row] for block types, the values otherwise


def read_gguf(path: str | os.PathLike) -> tuple[dict[str, Any], list[GGUFTensor]]:
    """(metadata key -> value, tensors) of a GGUF file; a file that is not one, is cut short,
    or holds a type the gguf package does not know is refused by name."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    if head != MAGIC:
        raise CheckpointError(f"{path} is not a GGUF file (it begins {head!r}, not {MAGIC!r}); "
                              "import-hf reads a Hugging Face directory or a .gguf file")
    try:
        import gguf
    except ImportError:
        raise ConversionError("reading a GGUF file needs the gguf package: pip install "
                              "'tinyt[gguf]' (or pip install gguf)") from None
    try:
        reader = gguf.GGUFReader(path, "r")
        fields = {k: _value(f) for k, f in reader.fields.items()}
        tensors = [GGUFTensor(t.name, t.tensor_type.name, t.data) for t in reader.tensors]
    except (ValueError, KeyError, IndexError, OSError, TypeError) as e:
        raise CheckpointError(f"{path} is not a readable GGUF file (cut short, or a tensor "
                              f"type the gguf package does not know): {e}") from None
    return fields, tensors


def _value(field) -> Any:
    import gguf

    if not field.types:
        return None
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        return [_plain(v) for v in field.contents()]
    return _plain(field.contents())


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


# -- metadata -> config.json's keys --------------------------------------------------------------
def hf_config_of(fields: dict[str, Any], names: set[str], source: str) -> dict[str, Any]:
    """The config.json a Hugging Face LlamaForCausalLM of this GGUF's metadata has (the keys
    convert_hf_to_gguf.py wrote them from); `names`: the file's tensor names."""
    arch = fields.get("general.architecture")
    if arch not in ACCEPTED:
        raise ConversionError(f"{source}: general.architecture={arch!r}; tinyt reads GGUF files "
                              f"of {', '.join(ACCEPTED)} (other families: import their Hugging "
                              "Face directory)")

    def key(name: str, default: Any = KeyError) -> Any:
        value = fields.get(f"{arch}.{name}", default)
        if value is KeyError:
            raise ConversionError(f"{source} lacks {arch}.{name}")
        return value

    heads = key("attention.head_count")
    width = key("embedding_length")
    head_dim = key("attention.key_length", width // heads if isinstance(heads, int) and heads
                   else None)
    if key("rope.dimension_count", head_dim) != head_dim:
        raise ConversionError(f"{source}: {arch}.rope.dimension_count="
                              f"{key('rope.dimension_count')} rotates part of each head of "
                              f"{head_dim}; a Llama rotates all of it")
    if "rope_freqs.weight" in names:
        raise ConversionError(f"{source} holds rope_freqs.weight, Llama 3.1's rope scaling as a "
                              "table of frequency factors, which tinyt does not read from a "
                              "GGUF; import the model's Hugging Face directory")
    tokens = fields.get("tokenizer.ggml.tokens") or []
    hf = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
          "num_hidden_layers": key("block_count"), "hidden_size": width,
          "intermediate_size": key("feed_forward_length"), "num_attention_heads": heads,
          "num_key_value_heads": key("attention.head_count_kv", heads), "head_dim": head_dim,
          "max_position_embeddings": key("context_length"),
          "rope_theta": key("rope.freq_base", 10000.0),
          "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
          "vocab_size": key("vocab_size", len(tokens)),
          "tie_word_embeddings": "output.weight" not in names,
          "attention_bias": "blk.0.attn_q.bias" in names, "mlp_bias": "blk.0.ffn_up.bias" in names,
          "hidden_act": "silu", "rope_scaling": _rope_scaling(key, source)}
    for role in ("bos", "eos"):
        hf[f"{role}_token_id"] = fields.get(f"tokenizer.ggml.{role}_token_id")
    return hf


def _rope_scaling(key: Callable[..., Any], source: str) -> dict[str, Any] | None:
    kind = key("rope.scaling.type", "none")
    if kind == "none":
        return None
    factor = key("rope.scaling.factor")
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        return {"rope_type": "yarn", "factor": factor,
                "original_max_position_embeddings": key("rope.scaling.original_context_length")}
    raise ConversionError(f"{source}: rope.scaling.type={kind!r}; tinyt reads none, linear, yarn")


# -- tensors -------------------------------------------------------------------------------------
def hf_name(name: str, source: str) -> str:
    """The Hugging Face Llama name of a llama.cpp tensor name; others refused by name."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ConversionError(f"{source} holds tensor {name!r}, which a GGUF Llama tinyt reads does "
                          f"not have (known: {', '.join(GLOBAL_NAMES)}, blk.N.{{"
                          f"{', '.join(LAYER_NAMES)}}}.weight)")


def unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert_hf_to_gguf.py permute() of q / k rows (rows [n_head*hs, ...]):
    it stores each head's rotary pairs interleaved, (x0, x_hs/2, x1, ...), where Hugging Face
    keeps the halves apart. Rows only: a block-quantized matrix's rows move with their blocks."""
    half = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def hf_tensors(tensors: list[GGUFTensor], hf: dict[str, Any], source: str
               ) -> tuple[dict[str, np.ndarray], dict[str, tuple[str, np.ndarray]]]:
    """(fp32 values, raw blocks) by Hugging Face name: every tensor dequantized, q / k rows
    unpermuted; the CARRIED block types' raw rows too ([rows, bytes a row], the same order)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    values: dict[str, np.ndarray] = {}
    blocks: dict[str, tuple[str, np.ndarray]] = {}
    for t in tensors:
        name = hf_name(t.name, source)
        try:
            w = dequantize(t.data, GGMLQuantizationType[t.kind]).astype(np.float32, copy=False)
        except NotImplementedError:
            raise ConversionError(f"{source}: tensor {t.name} is {t.kind}, a type the gguf "
                                  "package cannot dequantize") from None
        raw = t.data if t.kind in CARRIED and w.ndim == 2 else None
        heads = {"q_proj": hf["num_attention_heads"], "k_proj": hf["num_key_value_heads"]}
        proj = name.split(".")[-2]
        if proj in heads:
            w = unpermute(w, heads[proj])
            raw = None if raw is None else unpermute(raw, heads[proj])
        values[name] = np.array(w, copy=not w.flags.writeable or not w.flags.c_contiguous)
        if raw is not None:
            blocks[name] = (t.kind, np.ascontiguousarray(raw))
    return values, blocks


def blocks_in_our_names(blocks: dict[str, tuple[str, np.ndarray]], cfg) -> dict[str, tuple]:
    """The raw blocks under tinyt's names: a fused matrix (c_attn = q, k, v; c_fc = gate, up)
    is its parts' rows stacked, where every part is stored in one block type (else it is left
    to the quantize stage's own recipe)."""
    from tinyt.hf.catalogue import LLAMA
    from tinyt.hf.weights import pairs

    out = {}
    for p in pairs(LLAMA, cfg):
        parts = [blocks.get(name) for name in p.theirs]
        if p.ours is None or any(part is None for part in parts) \
                or len({kind for kind, _ in parts}) != 1:
            continue
        out[p.ours] = (parts[0][0], np.concatenate([rows for _, rows in parts]))
    return out


@dataclasses.dataclass(frozen=True)
class GGUFModel:
    """What a GGUF file holds, read for the Hugging Face import's tail (tinyt.hf.convert)."""
    config: Any  # ModelConfig
    tokenizer: Any  # tinyt.tokenizer.Tokenizer
    state: dict  # tinyt name -> fp32 torch tensor
    blocks: dict[str, tuple[str, np.ndarray]]  # tinyt name -> (GGUF type, raw rows)
    metrics: dict[str, Any]  # what the checkpoint records of the file


def read_gguf_model(path: Path, log: Callable[[str], None]) -> GGUFModel:
    """A GGUF file of a Llama as tinyt's config, tokenizer and fp32 weights: the config from
    its metadata, the tokenizer from tokenizer.ggml.*, the weights dequantized, and the Q4_0 /
    Q4_1 / Q8_0 matrices' blocks under tinyt's names."""
    import torch

    from tinyt.checkpoint import check_tokenizer_fits
    from tinyt.hf.catalogue import LLAMA
    from tinyt.hf.family import config_from_hf
    from tinyt.hf.gguf_tokens import gguf_tokenizer
    from tinyt.hf.weights import state_from_hf

    source = f"GGUF file {path}"
    fields, tensors = read_gguf(path)
    hf = hf_config_of(fields, {t.name for t in tensors}, source)
    cfg = config_from_hf(LLAMA, hf, source)
    tok = gguf_tokenizer(fields, source)
    check_tokenizer_fits(tok, cfg, "the tokenizer")
    values, blocks = hf_tensors(tensors, hf, source)
    state = state_from_hf(LLAMA, {k: torch.from_numpy(v) for k, v in values.items()}, cfg,
                          source)
    carried = blocks_in_our_names(blocks, cfg)
    kinds = sorted({t.kind for t in tensors})
    log(f"GGUF {fields.get('general.name', path.name)!r}: tensor types {', '.join(kinds)}; "
        f"{len(carried)} matrices' blocks kept for the quantize stage")
    return GGUFModel(cfg, tok, state, carried, {
        "imported_from": "gguf", "architecture": LLAMA.architecture,
        "source_file": str(path.resolve()), "gguf_types": kinds})


def write_blocks(path: Path, carried: dict[str, tuple[str, np.ndarray]]) -> None:
    """BLOCKS_FILE: each matrix's raw blocks (uint8 [rows, bytes a row]) under tinyt's name,
    its GGUF type in the metadata under the same name."""
    from safetensors.numpy import save_file

    if carried:
        save_file({k: rows for k, (_, rows) in carried.items()}, str(path),
                  metadata={k: kind for k, (kind, _) in carried.items()})


def read_blocks(checkpoint_dir: str | os.PathLike) -> dict[str, tuple[str, np.ndarray]]:
    """A GGUF import's kept blocks by tinyt name: (GGUF type, uint8 [rows, bytes a row]);
    {} for any other checkpoint."""
    from safetensors import safe_open

    path = Path(checkpoint_dir) / BLOCKS_FILE
    if not path.is_file():
        return {}
    with safe_open(str(path), framework="numpy") as f:
        kinds = f.metadata() or {}
        return {k: (kinds[k], f.get_tensor(k)) for k in f.keys()}
