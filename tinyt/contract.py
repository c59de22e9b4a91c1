"""The ONNX I/O contract, as data (torch-free). Exporter, verifier, runtime and benchmarks all
read the names, dtypes and symbolic axes from here. Names follow Hugging Face Optimum's, so
its ORTModelForCausalLM and similar loops understand tinyt's graphs.

    decoder:    input_ids [B, S], attention_mask [B, P+S], position_ids [B, S],
                past_key_values.{i}.key/.value [B, nkv, P, hs]
             -> logits [B, S, vocab], present.{i}.key/.value [B, nkv, P+S, hs]
    classifier: input_ids [B, S], attention_mask [B, S] (, token_type_ids [B, S])
             -> logits [B, num_labels]  (a token classifier's: [B, S, num_labels])
    encoder:    input_ids [B, S], attention_mask [B, S] (, token_type_ids [B, S])
             -> last_hidden_state [B, S, C] (, sentence_embedding [B, C])
    seq2seq:    three graphs, Optimum's ORTModelForSeq2SeqLM layout (SEQ2SEQ_FILES):
      encoder_model.onnx           input_ids [B, E], attention_mask [B, E]
                                -> last_hidden_state [B, E, C]
      decoder_model.onnx           encoder_attention_mask [B, E], input_ids [B, T],
                                   encoder_hidden_states [B, E, C]
                                -> logits [B, T, vocab], present.{i}.decoder.key/.value
                                   [B, nkv, T, hs], present.{i}.encoder.key/.value [B, nkv, E, hs]
      decoder_with_past_model.onnx encoder_attention_mask, input_ids [B, T],
                                   past_key_values.{i}.decoder.key/.value [B, nkv, P, hs],
                                   past_key_values.{i}.encoder.key/.value [B, nkv, E, hs]
                                -> logits, present.{i}.decoder.key/.value [B, nkv, P+T, hs]
      speech (Whisper's, Optimum's ORTModelForSpeechSeq2Seq layout): the encoder reads
                                   input_features [B, n_mels, 2 x source_positions]
                                -> last_hidden_state [B, source_positions, C]; the decoders
                                   take no encoder_attention_mask (every frame is attended)
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
SEQ2SEQ = "seq2seq"  # an encoder-decoder's three graphs (SEQ2SEQ_FILES)
ENCODER = "encoder"  # hidden states and a sentence embedding (Optimum's feature extraction)
TOKEN_CLASSIFIER = "token_classifier"  # a label per token (Optimum's token classification)
KINDS = (DECODER_WITH_PAST, SHARED_CACHE_KIND, DECODER, CLASSIFIER, ENCODER, TOKEN_CLASSIFIER)

# The shared-cache graphs' lm_head reads each row's last position only; the hidden states it
# picks from are an output too, and HEAD_INPUT is where the head's own nodes start (a caller
# scoring every position runs those nodes alone: runtime/score.py).
HIDDEN_OUTPUT = "hidden_states"
HEAD_INPUT = "/lm_head/last/hidden"

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
# The shared-cache graph's windowed layers (a sliding window shorter than the context) keep
# only the window's tokens and some slack in buffers of their own: their tokens and positions
# come in as inputs of their own (runtime/cache.py moves the window's tokens to the front of
# the buffer when the slack is used up; GroupQueryAttention takes their positions from
# position_ids).
WINDOW_CAPACITY = "window_sequence_length"
WINDOW_INPUTS = ("window_seqlens_k", "window_total_sequence_length")


def window_slack(window: int) -> int:
    """Tokens a windowed layer's buffer holds past its window before the window's tokens are
    moved to its front: a quarter of the window, at least 64 (a copy of the window every
    slack steps; attention over at most window + slack keys)."""
    return max(64, window // 4)


def compact_window_layers(cfg: ModelConfig) -> tuple[int, ...]:
    """The layers whose shared-cache buffers hold the window, not the context: the windowed
    layers of a model whose window and its slack are shorter than its context (Gemma 3's 15 of
    18 at 512 of 32,768; none of Phi-3's, whose 262,144 window is past its context)."""
    window = cfg.sliding_window
    if window is None or window + window_slack(window) >= cfg.block_size:
        return ()
    return tuple(i for i in range(cfg.n_layer) if cfg.windowed(i))


def _cache_specs(cfg: ModelConfig, names: list[str], compact: bool) -> list[TensorSpec]:
    layers = set(compact_window_layers(cfg)) if compact else set()
    return [TensorSpec(n, "float32", kv_axes(cfg, WINDOW_CAPACITY if int(n.split(".")[1])
                                             in layers else CAPACITY)) for n in names]


def shared_cache_inputs(cfg: ModelConfig, compact: bool = True) -> list[TensorSpec]:
    """The shared-cache variant: right-padded chunks, one buffer per cache. compact=False: the
    form tinyt made before windowed layers had buffers of their own (every layer at
    CAPACITY), which the runtime still reads."""
    window = [TensorSpec(WINDOW_INPUTS[0], "int32", (BATCH,)),
              TensorSpec(WINDOW_INPUTS[1], "int32", ())] \
        if compact and compact_window_layers(cfg) else []
    return [TensorSpec("input_ids", "int64", (BATCH, SEQ)),
            TensorSpec("position_ids", "int64", (BATCH, SEQ)),
            TensorSpec("seqlens_k", "int32", (BATCH,)),
            TensorSpec("total_sequence_length", "int32", ()),
            TensorSpec("query_seqlens", "int32", (BATCH,)),
            *window, *_cache_specs(cfg, past_names(cfg.n_layer), compact)]


def shared_cache_outputs(cfg: ModelConfig, compact: bool = True,
                         hidden: bool = True) -> list[TensorSpec]:
    """hidden=False: the form made before the hidden states were an output (no prompt
    scoring), which the runtime still reads."""
    return [TensorSpec("logits", "float32", (BATCH, 1, cfg.vocab_size)),
            *_cache_specs(cfg, present_names(cfg.n_layer), compact),
            *([TensorSpec(HIDDEN_OUTPUT, "float32", (BATCH, SEQ, cfg.n_embd))] if hidden
              else [])]


def classifier_inputs(cfg: ModelConfig) -> list[TensorSpec]:
    """A token-type input only where the table has rows to choose from (with one, as
    RoBERTa's, row 0 is always added: Optimum exports no input for it)."""
    types = [TensorSpec("token_type_ids", "int64", (BATCH, SEQ))] \
        if cfg.type_vocab_size >= 2 else []
    return [TensorSpec("input_ids", "int64", (BATCH, SEQ)),
            TensorSpec("attention_mask", "int64", (BATCH, SEQ)), *types]


def classifier_outputs(cfg: ModelConfig) -> list[TensorSpec]:
    if cfg.task == "token_classifier":
        return [TensorSpec("logits", "float32", (BATCH, SEQ, cfg.num_labels))]
    return [TensorSpec("logits", "float32", (BATCH, cfg.num_labels))]


def encoder_inputs(cfg: ModelConfig) -> list[TensorSpec]:
    return classifier_inputs(cfg)


def encoder_outputs(cfg: ModelConfig) -> list[TensorSpec]:
    pooled = [TensorSpec("sentence_embedding", "float32", (BATCH, cfg.n_embd))] \
        if cfg.pooling is not None else []
    return [TensorSpec("last_hidden_state", "float32", (BATCH, SEQ, cfg.n_embd)), *pooled]


def contract_for(cfg: ModelConfig, kind: str, compact: bool = True, hidden: bool = True
                 ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(inputs, outputs) of a graph kind: the one place the runtime, the exporter and the
    verifier take them from."""
    if kind in (CLASSIFIER, TOKEN_CLASSIFIER):
        return classifier_inputs(cfg), classifier_outputs(cfg)
    if kind == ENCODER:
        return encoder_inputs(cfg), encoder_outputs(cfg)
    if kind == SHARED_CACHE_KIND:
        return shared_cache_inputs(cfg, compact), shared_cache_outputs(cfg, compact, hidden)
    if kind not in KINDS:
        raise ConfigError(f"graph kind {kind!r} is not one of {', '.join(KINDS)}")
    with_past = kind == DECODER_WITH_PAST
    return (decoder_inputs(cfg, with_past=with_past),
            decoder_outputs(cfg, with_past=with_past))


# The encoder-decoder's graphs, by role, under Optimum's file names (its ORTModelForSeq2SeqLM
# loads the directory as it loads an Optimum export; transformers.js reads Optimum's merged
# decoder instead of the two decoder graphs).
# Beside a speech (Whisper) checkpoint's and artifact's files: its special tokens' ids and
# generation settings ({"tokens", "generation_config", "config"}: tinyt/hf/speech.py)
SPEECH_FILE = "speech.json"
SEQ2SEQ_FILES = {"encoder": "encoder_model.onnx", "decoder": "decoder_model.onnx",
                 "decoder_with_past": "decoder_with_past_model.onnx"}
# An ORT-format package's (`tinyt package --format ort`): the same graphs in ONNX Runtime's format
SEQ2SEQ_ORT_FILES = {role: file.removesuffix(".onnx") + ".ort"
                     for role, file in SEQ2SEQ_FILES.items()}
SOURCE = "encoder_sequence_length"
TARGET = "decoder_sequence_length"
TARGET_PAST = "past_decoder_sequence_length"
TARGET_TOTAL = "past_decoder_sequence_length + decoder_sequence_length"


def seq2seq_cache_names(n_layer: int, prefix: str, stacks: tuple[str, ...]) -> list[str]:
    """`{prefix}.{i}.{stack}.key/value` per layer, in Optimum's order: the layer's decoder
    (self-attention) pair, then its encoder (cross-attention) pair."""
    return [f"{prefix}.{i}.{stack}.{kv}" for i in range(n_layer) for stack in stacks
            for kv in ("key", "value")]


def refuse_speech(cfg: ModelConfig, what: str) -> None:
    """A speech (Whisper) artifact, refused by name where tinyt does not run its graphs yet."""
    if cfg.n_mels is not None:
        raise ConfigError(f"{what} of a speech (Whisper) artifact is not built yet (issue 52): "
                          "Optimum's ORTModelForSpeechSeq2Seq runs its three graphs as they "
                          "are, and tinyt export-hf writes the checkpoint for transformers")


def seq2seq_contract(cfg: ModelConfig) -> dict[str, tuple[list[TensorSpec], list[TensorSpec]]]:
    """(inputs, outputs) of each of an encoder-decoder's graphs, by role (SEQ2SEQ_FILES)."""
    n = cfg.decoder_layers

    def caches(prefix: str, stacks: tuple[str, ...], length: str) -> list[TensorSpec]:
        return [TensorSpec(name, "float32", (BATCH, cfg.kv_heads, SOURCE if ".encoder." in name
                                             else length, cfg.head_dim))
                for name in seq2seq_cache_names(n, prefix, stacks)]

    source = [TensorSpec("encoder_attention_mask", "int64", (BATCH, SOURCE)),
              TensorSpec("input_ids", "int64", (BATCH, TARGET))]
    encoder = ([TensorSpec("input_ids", "int64", (BATCH, SOURCE)),
                TensorSpec("attention_mask", "int64", (BATCH, SOURCE))],
               [TensorSpec("last_hidden_state", "float32", (BATCH, SOURCE, cfg.n_embd))])
    if cfg.n_mels is not None and cfg.source_positions is not None:  # speech: features in,
        frames = cfg.source_positions  # a fixed number of frames out (the config checks both)
        source = source[1:]
        encoder = ([TensorSpec("input_features", "float32", (BATCH, cfg.n_mels, 2 * frames))],
                   [TensorSpec("last_hidden_state", "float32", (BATCH, frames, cfg.n_embd))])
    logits = TensorSpec("logits", "float32", (BATCH, TARGET, cfg.vocab_size))
    return {
        "encoder": encoder,
        "decoder": ([*source, TensorSpec("encoder_hidden_states", "float32",
                                         (BATCH, SOURCE, cfg.n_embd))],
                    [logits, *caches("present", ("decoder", "encoder"), TARGET)]),
        "decoder_with_past": ([*source, *caches("past_key_values", ("decoder", "encoder"),
                                                TARGET_PAST)],
                              [logits, *caches("present", ("decoder",), TARGET_TOTAL)]),
    }


# decoder_with_past's metadata key (its value: the attentions rewritten) where its cross-
# attention takes each source's cached keys / values once for the k rows of that source, the
# rows of a source consecutive (export/cross_groups.py); without it, a cache a row
CROSS_GROUPS = "tinyt.cross_attention_groups"

# Optimum's merged decoder, the one transformers.js runs (`tinyt package --format
# transformers-js`): the two decoder graphs as the branches of one If on USE_CACHE_BRANCH
SEQ2SEQ_MERGED_FILE = "decoder_model_merged.onnx"
USE_CACHE_BRANCH = "use_cache_branch"


def seq2seq_merged_contract(cfg: ModelConfig) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(inputs, outputs) of decoder_model_merged.onnx: every input of the two decoder graphs
    and USE_CACHE_BRANCH bool [1] (False: the first step, the caches fed empty; True: a cached
    step, the hidden states fed but unread); the first decoder graph's outputs, the
    cross-attention ones empty on a cached step (the caller keeps the first step's)."""
    graphs = seq2seq_contract(cfg)
    first, cached = graphs["decoder"][0], graphs["decoder_with_past"][0]
    names = {s.name for s in first}
    return ([*first, *(s for s in cached if s.name not in names),
             TensorSpec(USE_CACHE_BRANCH, "bool", (1,))], graphs["decoder"][1])
