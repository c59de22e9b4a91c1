"""The ONNX I/O contract, as data (torch-free). Exporter, verifier, runtime and benchmarks all
read the names, dtypes and symbolic axes from here. Names follow Hugging Face Optimum's, so
its ORTModelForCausalLM and similar loops understand tinyt's graphs.

    decoder:    input_ids [B, S], attention_mask [B, P+S], position_ids [B, S],
                past_key_values.{i}.key/.value [B, nkv, P, hs]
             -> logits [B, S, vocab], present.{i}.key/.value [B, nkv, P+S, hs]
    classifier: input_ids [B, S], attention_mask [B, S] -> logits [B, num_labels]
"""
from __future__ import annotations

from dataclasses import dataclass

from tinyt.config import ModelConfig
from tinyt.errors import ConfigError

ONNX_FILE = "model.onnx"  # an artifact's graph (a package may hold model.ort instead)

# Graph kinds, as manifest.json's "kind" names them (the values are the artifact format).
DECODER_WITH_PAST = "decoder_with_past"  # the contract decoder: prefill and decode, Optimum's I/O
SHARED_CACHE_KIND = "decoder_gqa"  # the shared-cache variant (`--target gqa`): one KV buffer
DECODER = "decoder"  # no KV cache: every pass reads the whole sequence
CLASSIFIER = "classifier"
KINDS = (DECODER_WITH_PAST, SHARED_CACHE_KIND, DECODER, CLASSIFIER)

BATCH = "batch_size"
SEQ = "sequence_length"
PAST = "past_sequence_length"
TOTAL = "past_sequence_length + sequence_length"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[str | int, ...]  # a str is a symbolic axis


def kv_shape(cfg: ModelConfig, batch: int, length: int) -> tuple[int, int, int, int]:
    """One layer's key (or value) cache: (batch, kv_heads, length, head_dim) — the only place
    that order is written."""
    return (batch, cfg.kv_heads, length, cfg.head_dim)


def kv_axes(cfg: ModelConfig, length: str) -> tuple[str | int, ...]:
    """The same shape with symbolic batch and length axes, as the graphs declare it."""
    return (BATCH, cfg.kv_heads, length, cfg.head_dim)


def past_names(n_layer: int) -> list[str]:
    return [f"past_key_values.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]


def present_names(n_layer: int) -> list[str]:
    return [f"present.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]


def past_name(present: str) -> str:
    """The input a present output feeds at the next step: present.3.key -> past_key_values.3.key."""
    return present.replace("present", "past_key_values", 1)


def decoder_inputs(cfg: ModelConfig, *, with_past: bool = True,
                   kv_dtype: str = "float32") -> list[TensorSpec]:
    if not with_past:
        return [TensorSpec("input_ids", "int64", (BATCH, SEQ)),
                TensorSpec("attention_mask", "int64", (BATCH, SEQ))]
    kv = kv_axes(cfg, PAST)
    return [
        TensorSpec("input_ids", "int64", (BATCH, SEQ)),
        TensorSpec("attention_mask", "int64", (BATCH, TOTAL)),
        TensorSpec("position_ids", "int64", (BATCH, SEQ)),
        *(TensorSpec(n, kv_dtype, kv) for n in past_names(cfg.n_layer)),
    ]


def decoder_outputs(cfg: ModelConfig, *, with_past: bool = True,
                    kv_dtype: str = "float32") -> list[TensorSpec]:
    logits = TensorSpec("logits", "float32", (BATCH, SEQ, cfg.vocab_size))
    if not with_past:
        return [logits]
    kv = kv_axes(cfg, TOTAL)
    return [logits, *(TensorSpec(n, kv_dtype, kv) for n in present_names(cfg.n_layer))]


CAPACITY = "max_sequence_length"


def shared_cache_inputs(cfg: ModelConfig) -> list[TensorSpec]:
    """The shared-cache variant: right-padded chunks, one buffer per cache."""
    kv = kv_axes(cfg, CAPACITY)
    return [TensorSpec("input_ids", "int64", (BATCH, SEQ)),
            TensorSpec("position_ids", "int64", (BATCH, SEQ)),
            TensorSpec("seqlens_k", "int32", (BATCH,)),
            TensorSpec("total_sequence_length", "int32", ()),
            TensorSpec("query_seqlens", "int32", (BATCH,)),
            *(TensorSpec(n, "float32", kv) for n in past_names(cfg.n_layer))]


def shared_cache_outputs(cfg: ModelConfig) -> list[TensorSpec]:
    kv = kv_axes(cfg, CAPACITY)
    return [TensorSpec("logits", "float32", (BATCH, 1, cfg.vocab_size)),
            *(TensorSpec(n, "float32", kv) for n in present_names(cfg.n_layer))]


def classifier_inputs(cfg: ModelConfig) -> list[TensorSpec]:
    return [TensorSpec("input_ids", "int64", (BATCH, SEQ)),
            TensorSpec("attention_mask", "int64", (BATCH, SEQ))]


def classifier_outputs(cfg: ModelConfig) -> list[TensorSpec]:
    return [TensorSpec("logits", "float32", (BATCH, cfg.num_labels))]


def contract_for(cfg: ModelConfig, kind: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(inputs, outputs) of a graph kind: the one place the runtime, the exporter and the
    verifier take them from."""
    if kind == CLASSIFIER:
        return classifier_inputs(cfg), classifier_outputs(cfg)
    if kind == SHARED_CACHE_KIND:
        return shared_cache_inputs(cfg), shared_cache_outputs(cfg)
    if kind not in KINDS:
        raise ConfigError(f"graph kind {kind!r} is not one of {', '.join(KINDS)}")
    with_past = kind == DECODER_WITH_PAST
    return (decoder_inputs(cfg, with_past=with_past),
            decoder_outputs(cfg, with_past=with_past))
