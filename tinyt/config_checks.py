"""ModelConfig's checks, group by group as its fields are declared (tinyt.config), and the
rope_scaling types tinyt computes. Torch-free. Each failure names the field, its value and
what is allowed (ConfigError).
"""
from __future__ import annotations

import math
from typing import Any

from tinyt.errors import ConfigError

# rotary: Llama's, from position_ids; relative: T5's bias on the attention logits;
# sinusoidal_fairseq: the sinusoid at tensor2tensor's spacing (M2M100, NLLB)
POS_ENCODINGS = ("learned", "sinusoidal", "rotary", "relative", "sinusoidal_fairseq")
# The MLP: exact (erf) GELU; its tanh approximation (GPT-2's); SwiGLU (Llama's gated SiLU)
ACTIVATIONS = ("gelu", "gelu_tanh", "swiglu", "geglu_tanh", "geglu", "relu", "silu")
# ReLU (T5, M2M100, NLLB) and SiLU (Marian) are the encoder-decoder families' MLPs: the other
# tasks' exports, optimizer fusions and peers are proven with the GELU and gated ones only
SEQ2SEQ_ACTIVATIONS = ("relu", "silu")
# gated MLPs: act(gate) * up (SiLU: Llama's; GELU-tanh: Gemma's; exact GELU: ModernBERT's)
GATED = ("swiglu", "geglu_tanh", "geglu")
NORMS = ("layernorm", "rmsnorm")
# encoder: hidden states and a sentence embedding; token_classifier: a label per token;
# seq2seq: an encoder and a decoder that attends over its output (translation, summaries)
TASKS = ("causal_lm", "classifier", "encoder", "token_classifier", "seq2seq")
POOLER_ACTIVATIONS = ("tanh", "relu", "gelu")  # a classifier's dense layer on the pooled token
NORM_PLACEMENTS = ("pre", "post")  # post: BERT's x = norm(x + branch(x)), no final norm
POOLINGS = ("mean", "cls", "last")  # a sentence from its tokens: masked mean, first, last real
TOKENIZER_KINDS = ("bpe", "byte")
DEVICES = ("cpu", "cuda")
QK_NORMS = ("head", "projection")  # q/k RMSNorm over each head (Qwen3) or the whole (OLMo-2)


def _require(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r} is invalid: {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """A finite int or float: NaN and +-inf are never a valid setting."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_model(cfg: Any) -> None:
    """Every group's checks, in the order its fields are declared."""
    for check in (check_shape, check_attention, check_positions, check_norms,
                  check_mlp_and_embeddings, check_head, check_seq2seq):
        check(cfg)


def check_shape(cfg: Any) -> None:
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        v = getattr(cfg, name)
        _require(_is_int(v) and v >= 1, name, v, "must be an integer >= 1")
    _require(cfg.vocab_size >= 2, "vocab_size", cfg.vocab_size, "must be >= 2")
    _require(_is_number(cfg.dropout) and 0.0 <= cfg.dropout < 1.0, "dropout", cfg.dropout,
             "must be a finite number in [0, 1)")
    _require(isinstance(cfg.bias, bool), "bias", cfg.bias, "must be true or false")
    _require(cfg.task in TASKS, "task", cfg.task, f"allowed: {', '.join(TASKS)}")
    if cfg.task in ("classifier", "token_classifier"):
        _require(_is_int(cfg.num_labels) and cfg.num_labels >= 2, "num_labels",
                 cfg.num_labels, f"a {cfg.task} needs an integer >= 2")
    else:
        _require(cfg.num_labels == 0, "num_labels", cfg.num_labels,
                 f"must be 0 for task={cfg.task!r} (labels belong to the classifier)")
    v = cfg.residual_multiplier
    _require(_is_number(v) and v != 0, "residual_multiplier", v,
             "must be a finite number other than 0")

def check_attention(cfg: Any) -> None:
    _require(cfg.head_size is None or (_is_int(cfg.head_size) and cfg.head_size >= 1),
             "head_size", cfg.head_size, "must be null (n_embd / n_head) or an integer >= 1")
    _require(cfg.head_size is not None or cfg.n_embd % cfg.n_head == 0, "n_embd",
             cfg.n_embd, f"must be divisible by n_head={cfg.n_head} (head_dim = n_embd / "
             "n_head), or head_size set")
    _require(cfg.n_kv_head is None or (_is_int(cfg.n_kv_head) and cfg.n_kv_head >= 1
                                        and cfg.n_head % cfg.n_kv_head == 0),
             "n_kv_head", cfg.n_kv_head,
             f"must be null (= n_head) or an integer >= 1 that divides n_head={cfg.n_head}")
    _require(cfg.qkv_bias is None or isinstance(cfg.qkv_bias, bool), "qkv_bias",
             cfg.qkv_bias, "must be null (= bias), true or false")
    _require(cfg.qk_norm is None or cfg.qk_norm in QK_NORMS, "qk_norm", cfg.qk_norm,
             f"must be null (none) or one of {', '.join(QK_NORMS)} (true: 'head')")
    _require(not cfg.qk_norm or cfg.norm == "rmsnorm", "qk_norm", cfg.qk_norm,
             "q/k norms are RMSNorms: they need norm='rmsnorm'")
    _require(cfg.attention_multiplier is None or (_is_number(cfg.attention_multiplier)
                                                   and cfg.attention_multiplier > 0),
             "attention_multiplier", cfg.attention_multiplier,
             "must be null (1 / sqrt(head_dim)) or a finite number > 0")
    v = cfg.attn_softcap
    _require(v is None or (_is_number(v) and v > 0), "attn_softcap", v,
             "must be null (no cap) or a finite number > 0")
    window = cfg.sliding_window
    _require(window is None or (_is_int(window) and window >= 1), "sliding_window", window,
             "must be null (the whole context) or an integer >= 1")
    check_layers(cfg, "full_attention_layers")
    _require(window is not None or not cfg.full_attention_layers, "full_attention_layers",
             cfg.full_attention_layers, "only means something with a sliding_window")

def check_layers(cfg: Any, name: str) -> None:
    v = getattr(cfg, name)
    _require(isinstance(v, tuple) and all(_is_int(i) and 0 <= i < cfg.n_layer for i in v)
             and list(v) == sorted(set(v)), name, v,
             f"must be increasing layer indices in 0..{cfg.n_layer - 1}")

def check_positions(cfg: Any) -> None:
    rotary = cfg.pos_encoding == "rotary"
    _require(cfg.pos_encoding in POS_ENCODINGS, "pos_encoding", cfg.pos_encoding,
             f"allowed: {', '.join(POS_ENCODINGS)}")
    if cfg.pos_encoding.startswith("sinusoidal"):
        _require(cfg.n_embd % 2 == 0 and (cfg.n_embd > 2 or cfg.pos_encoding == "sinusoidal"),
                 "n_embd", cfg.n_embd, "must be even (and > 2 for sinusoidal_fairseq) for "
                 "sinusoidal positions")
    if cfg.pos_encoding == "relative":
        _require(cfg.task == "seq2seq", "pos_encoding", cfg.pos_encoding,
                 "T5's relative bias is built for task='seq2seq'")
    for name in ("relative_buckets", "relative_max_distance"):
        v = getattr(cfg, name)
        _require(_is_int(v) and v >= 4, name, v, "must be an integer >= 4")
    _require(cfg.relative_max_distance > cfg.relative_buckets // 2, "relative_max_distance",
             cfg.relative_max_distance, "must be > relative_buckets / 2 (the exact ones)")
    _require(_is_number(cfg.rope_theta) and cfg.rope_theta > 0, "rope_theta",
             cfg.rope_theta, "must be a finite number > 0")
    if rotary:
        _require(cfg.head_dim % 2 == 0, "n_embd", cfg.n_embd,
                 f"must give an even head_dim for rotary positions (n_embd / n_head = "
                 f"{cfg.n_embd / cfg.n_head:g})")
    if cfg.rope_scaling is not None:
        _require(rotary, "rope_scaling", cfg.rope_scaling,
                 "scales rotary positions: it needs pos_encoding='rotary'")
        rope_parameters(cfg)  # validates the dict, naming the key
    check_layers(cfg, "nope_layers")
    _require(rotary or not cfg.nope_layers, "nope_layers", cfg.nope_layers,
             "only means something with pos_encoding='rotary'")
    yarn = cfg.rope_scaling is not None and rope_parameters(cfg)[0] == "yarn"
    local = cfg.rope_local_theta
    _require(local is None or (_is_number(local) and local > 0), "rope_local_theta", local,
             "must be null (the rope_theta of every layer) or a finite number > 0")
    _require(local is None or (rotary and cfg.sliding_window is not None),
             "rope_local_theta", local, "is the windowed layers' rotary base: it needs "
             "pos_encoding='rotary' and a sliding_window")
    _require(local is None or not yarn, "rope_local_theta", local,
             "with yarn's rope_scaling is not implemented: yarn's attention factor would "
             "scale the windowed layers' unscaled rotary too")
    rd = cfg.rotary_dim
    _require(rd is None or (rotary and _is_int(rd) and rd >= 2 and rd % 2 == 0
                            and rd <= cfg.head_dim), "rotary_dim", rd,
             f"must be null (head_dim) or an even integer from 2 to head_dim={cfg.head_dim}"
             ", with pos_encoding='rotary'")
    _require(rd is None or not yarn, "rotary_dim", rd, "with yarn's rope_scaling is not "
             "implemented: tinyt folds yarn's attention factor into q.k's scale, which "
             "would scale the dims rotary leaves too")
    _require(_is_int(cfg.position_offset) and cfg.position_offset >= 0,
             "position_offset", cfg.position_offset, "must be an integer >= 0")
    _require(cfg.position_offset == 0 or cfg.pos_encoding in ("learned", "sinusoidal",
                                                               "sinusoidal_fairseq"),
             "position_offset", cfg.position_offset, "shifts a learned position table or the "
             "sinusoid: it needs pos_encoding='learned', 'sinusoidal' or 'sinusoidal_fairseq'")

def check_norms(cfg: Any) -> None:
    _require(cfg.norm in NORMS, "norm", cfg.norm, f"allowed: {', '.join(NORMS)}")
    _require(_is_number(cfg.norm_eps) and 0 < cfg.norm_eps < 1, "norm_eps", cfg.norm_eps,
             "must be a finite number in (0, 1)")
    _require(_is_number(cfg.norm_offset), "norm_offset", cfg.norm_offset,
             "must be a finite number")
    _require(cfg.norm_offset == 0 or cfg.norm == "rmsnorm", "norm_offset",
             cfg.norm_offset, "offsets an RMSNorm's gain: it needs norm='rmsnorm'")
    _require(cfg.norm_placement in NORM_PLACEMENTS, "norm_placement", cfg.norm_placement,
             f"allowed: {', '.join(NORM_PLACEMENTS)}")
    _require(cfg.norm_placement == "pre" or (not cfg.post_norms
                                               and cfg.residual_multiplier == 1.0),
             "norm_placement", cfg.norm_placement,
             "'post' normalises each sum itself: it takes neither post_norms nor a "
             "residual_multiplier")
    for name in ("pre_norms", "post_norms", "embedding_norm", "first_block_norm"):
        _require(isinstance(getattr(cfg, name), bool), name, getattr(cfg, name),
                 "must be true or false")
    _require(cfg.pre_norms or (cfg.post_norms and cfg.norm_placement == "pre"),
             "pre_norms", cfg.pre_norms, "false leaves each branch's input unnormalised: "
             "it needs post_norms (the branches' outputs normalised, OLMo-2's) and "
             "norm_placement='pre'")
    _require(cfg.first_block_norm or (cfg.norm_placement == "pre" and cfg.embedding_norm
                                       and cfg.pre_norms),
             "first_block_norm", cfg.first_block_norm,
             "false leaves block 0 without its first norm, which the embeddings' norm takes "
             "over: it needs norm_placement='pre' and embedding_norm")

def check_mlp_and_embeddings(cfg: Any) -> None:
    _require(cfg.activation in ACTIVATIONS, "activation", cfg.activation,
             f"allowed: {', '.join(ACTIVATIONS)}")
    others = [a for a in ACTIVATIONS if a not in SEQ2SEQ_ACTIVATIONS]
    _require(cfg.task == "seq2seq" or cfg.activation not in SEQ2SEQ_ACTIVATIONS, "activation",
             cfg.activation, f"{cfg.activation} is an encoder-decoder's (task='seq2seq'); "
             f"task={cfg.task!r} allows: {', '.join(others)}")
    _require(cfg.n_inner is None or (_is_int(cfg.n_inner) and cfg.n_inner >= 1),
             "n_inner", cfg.n_inner, "must be null (4 * n_embd) or an integer >= 1")
    _require(isinstance(cfg.tie_weights, bool), "tie_weights", cfg.tie_weights,
             "must be true or false")
    v = cfg.embedding_multiplier
    _require(_is_number(v) and v != 0, "embedding_multiplier", v,
             "must be a finite number other than 0")
    _require(_is_int(cfg.type_vocab_size) and cfg.type_vocab_size >= 0, "type_vocab_size",
             cfg.type_vocab_size, "must be an integer >= 0 (0: no token-type table)")

def check_head(cfg: Any) -> None:
    v = cfg.logits_scaling
    _require(_is_number(v) and v != 0, "logits_scaling", v,
             "must be a finite number other than 0")
    v = cfg.final_softcap
    _require(v is None or (_is_number(v) and v > 0), "final_softcap", v,
             "must be null (no cap) or a finite number > 0")
    encoder, per_token = cfg.task == "encoder", cfg.task == "token_classifier"
    _require(cfg.pooling in POOLINGS or (cfg.task in ("encoder", "token_classifier")
                                          and cfg.pooling is None), "pooling",
             cfg.pooling, f"allowed: {', '.join(POOLINGS)}"
             + (", or null (hidden states only)" if encoder else
                ", or null" if per_token else
                " (null only for task='encoder' or 'token_classifier')"))
    _require(cfg.pooler_activation is None or (
        cfg.pooler_activation in POOLER_ACTIVATIONS
        and cfg.task in ("classifier", "token_classifier")),
        "pooler_activation", cfg.pooler_activation,
        f"is a classifier's dense layer before its head: null or one of "
        f"{', '.join(POOLER_ACTIVATIONS)}, with task='classifier' or 'token_classifier'")
    _require(isinstance(cfg.pooler_norm, bool) and (not cfg.pooler_norm
                                                     or cfg.pooler_activation is not None),
             "pooler_norm", cfg.pooler_norm,
             "normalises the pooler's output: it needs a pooler_activation")
    _require(not per_token or cfg.pooling is None, "pooling", cfg.pooling,
             "a token_classifier labels each token: it pools nothing (null)")
    _require(cfg.task != "causal_lm" or cfg.pooling == "mean", "pooling", cfg.pooling,
             "pools a classifier's or an encoder's tokens: a causal LM keeps the default")
    _require(isinstance(cfg.normalize, bool), "normalize", cfg.normalize,
             "must be true or false")
    _require(not cfg.normalize or (encoder and cfg.pooling is not None), "normalize",
             cfg.normalize, "scales an encoder's sentence embedding: it needs "
             "task='encoder' and a pooling")

    _require(isinstance(cfg.final_logits_bias, bool), "final_logits_bias",
             cfg.final_logits_bias, "must be true or false")
    _require(not cfg.final_logits_bias or cfg.task in ("causal_lm", "seq2seq"),
             "final_logits_bias", cfg.final_logits_bias, "is a bias on a language model's "
             "logits: it needs task='causal_lm' or 'seq2seq'")

def check_seq2seq(cfg: Any) -> None:
    seq2seq = cfg.task == "seq2seq"
    v = cfg.n_decoder_layer
    _require(v is None or (seq2seq and _is_int(v) and v >= 1), "n_decoder_layer", v,
             "must be null (= n_layer) or, with task='seq2seq', an integer >= 1")
    v = cfg.decoder_start_id
    _require(_is_int(v) and 0 <= v < cfg.vocab_size, "decoder_start_id", v,
             f"must be a token id in 0..{cfg.vocab_size - 1}")
    _require(isinstance(cfg.shared_embeddings, bool), "shared_embeddings",
             cfg.shared_embeddings, "must be true or false")
    v = cfg.forced_bos_id
    _require(v is None or (_is_int(v) and 0 <= v < cfg.vocab_size), "forced_bos_id", v,
             f"must be null (none forced) or a token id in 0..{cfg.vocab_size - 1}")
    v = cfg.bad_word_ids
    _require(isinstance(v, tuple) and all(_is_int(i) and 0 <= i < cfg.vocab_size for i in v),
             "bad_word_ids", v, f"must be a list of token ids in 0..{cfg.vocab_size - 1}")
    for name, off in (("decoder_start_id", 0), ("shared_embeddings", True),
                      ("forced_bos_id", None), ("bad_word_ids", ())):
        _require(seq2seq or getattr(cfg, name) == off, name, getattr(cfg, name),
                 f"is an encoder-decoder's: it needs task='seq2seq' (else {off!r})")
    check_audio(cfg)
    _require(not seq2seq or cfg.pooling == "mean", "pooling", cfg.pooling,
             "pools an encoder's tokens: a seq2seq model keeps the default")
    _require(not seq2seq or not cfg.sliding_window, "sliding_window", cfg.sliding_window,
             "is not built for task='seq2seq'")
    _require(not seq2seq or cfg.type_vocab_size == 0, "type_vocab_size",
             cfg.type_vocab_size, "is not built for task='seq2seq'")


def check_audio(cfg: Any) -> None:
    """An audio encoder (n_mels, source_positions: Whisper's) goes with an encoder-decoder
    whose encoder has no token table and a position table of its own."""
    mels, frames = cfg.n_mels, cfg.source_positions
    _require(mels is None or (cfg.task == "seq2seq" and _is_int(mels) and mels >= 1),
             "n_mels", mels, "must be null (the source is token ids) or, with "
             "task='seq2seq', an integer >= 1 (Whisper's 80, large-v3's 128)")
    _require((frames is None) == (mels is None) and (frames is None or (
        _is_int(frames) and frames >= 1)), "source_positions", frames,
             "is an audio encoder's position table: an integer >= 1 with n_mels, else null")
    if mels is None:
        return
    _require(cfg.pos_encoding == "learned", "pos_encoding", cfg.pos_encoding,
             "an audio encoder-decoder's positions are tables (Whisper's): 'learned'")
    _require(not cfg.shared_embeddings, "shared_embeddings", cfg.shared_embeddings,
             "an audio encoder has no token table to share: false")
    _require(cfg.position_offset == 0, "position_offset", cfg.position_offset,
             "must be 0 with an audio encoder")


# rope_scaling's types as transformers computes them (modeling_rope_utils): each type's
# required and optional keys. `dynamic` changes nothing within max_position_embeddings, the
# context tinyt runs to: its frequencies are the default ones there.
ROPE_KEYS = {
    "linear": ({"factor"}, set()),
    "dynamic": ({"factor"}, set()),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"}, set()),
    "yarn": ({"factor"}, {"attention_factor", "beta_fast", "beta_slow", "mscale",
                          "mscale_all_dim", "original_max_position_embeddings", "truncate"}),
    # Phi-3 / Phi-4-mini: per-frequency factors, the long ones past the original context;
    # factor = max_position_embeddings / original as read at import (the attention factor's
    # source, kept whatever context tinyt keeps)
    "longrope": ({"long_factor", "short_factor", "original_max_position_embeddings", "factor"},
                 {"attention_factor"}),
}


def rope_parameters(cfg: Any) -> tuple[str, dict[str, Any]]:
    """rope_scaling's type and its other keys, checked: a type transformers has that tinyt does
    not compute, an unknown key or a bad value is a ConfigError naming it."""
    scaling = cfg.rope_scaling
    if not isinstance(scaling, dict):
        raise ConfigError(f"rope_scaling={scaling!r} is invalid: must be null or an object")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in ROPE_KEYS:
        raise ConfigError(f"rope_scaling type {kind!r} is not one tinyt computes; allowed: "
                          f"{', '.join(ROPE_KEYS)}")
    params = {k: v for k, v in scaling.items() if k not in ("rope_type", "type")}
    required, optional = ROPE_KEYS[kind]
    if required - set(params):
        raise ConfigError(f"rope_scaling {kind!r} lacks {sorted(required - set(params))}")
    if set(params) - required - optional:
        raise ConfigError(f"rope_scaling {kind!r} has {sorted(set(params) - required - optional)}"
                          f"; allowed keys: {sorted(required | optional)}")
    for key, v in params.items():
        if key in ("long_factor", "short_factor"):
            half = cfg.rotary_dims // 2
            _require(isinstance(v, (list, tuple)) and len(v) == half
                     and all(_is_number(f) and f > 0 for f in v), f"rope_scaling.{key}",
                     v, f"must be {half} finite numbers > 0 (one per rotated frequency)")
        elif key == "truncate":
            _require(isinstance(v, bool), "rope_scaling.truncate", v, "must be true or false")
        elif key == "original_max_position_embeddings":
            _require(_is_int(v) and v >= 1, f"rope_scaling.{key}", v, "must be an integer >= 1")
        elif v is not None or key not in optional:
            _require(_is_number(v) and v > 0, f"rope_scaling.{key}", v,
                     "must be a finite number > 0")
    if kind in ("linear", "dynamic", "llama3"):
        _require(params["factor"] >= 1, "rope_scaling.factor", params["factor"], "must be >= 1")
    if kind == "llama3":
        _require(params["high_freq_factor"] > params["low_freq_factor"],
                 "rope_scaling.high_freq_factor", params["high_freq_factor"],
                 f"must be > low_freq_factor={params['low_freq_factor']}")
    return kind, params
