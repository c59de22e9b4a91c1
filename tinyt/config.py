"""Model and training configuration: frozen, validated dataclasses and named presets.

Torch-free: the runtime reads these on machines that have no torch.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from tinyt.config_checks import (  # noqa: F401  (the constants are tinyt.config's API too)
    ACTIVATIONS,
    DEVICES,
    GATED,
    NORM_PLACEMENTS,
    NORMS,
    POOLER_ACTIVATIONS,
    POOLINGS,
    POS_ENCODINGS,
    QK_NORMS,
    ROPE_KEYS,
    TASKS,
    TOKENIZER_KINDS,
    _is_int,
    _is_number,
    _require,
    check_model,
    rope_parameters,
)
from tinyt.errors import ConfigError


class _JsonMixin:
    """JSON round trip for a flat frozen dataclass; unknown keys are an error, not ignored."""

    def to_dict(self) -> dict[str, Any]:
        """JSON's own types: a tuple field (layer indices) as a list, as it reads back."""
        data = dataclasses.asdict(self)  # type: ignore[call-overload]  # a mixin of dataclasses
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown {cls.__name__} field(s) {unknown}; allowed fields: {sorted(known)}"
            )
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{cls.__name__} JSON is malformed: {e}") from None
        return cls.from_dict(data)


# The groups ModelConfig's fields fall in (`ModelConfig.group(name)` reads one at a time).
GROUPS = ("shape", "attention", "positions", "norms", "mlp", "embeddings", "head", "seq2seq")


def _opt(default: Any, group: str) -> Any:
    """A field of ModelConfig in its group: its default, stated once (family_options and the
    catalogue's checks read the defaults from here)."""
    return dataclasses.field(default=default, metadata={"group": group})


@dataclass(frozen=True)
class ModelConfig(_JsonMixin):
    """Shape of a TinyTransformer, its fields grouped by what they describe. Validated on
    construction; errors name the bad field. Every option beyond the first ones (GPT-2's and
    Llama's) defaults to "off": a family turns on what it has (tinyt/hf/families/)."""

    # -- shape: the sizes, the task and the biases --------------------------------------------
    block_size: int = _opt(128, "shape")  # longest sequence (positions) the model handles
    vocab_size: int = _opt(4096, "shape")
    n_layer: int = _opt(4, "shape")
    n_head: int = _opt(4, "shape")
    n_embd: int = _opt(128, "shape")
    dropout: float = _opt(0.0, "shape")
    bias: bool = _opt(True, "shape")  # biases in Linear and LayerNorm, as GPT-2
    task: str = _opt("causal_lm", "shape")
    num_labels: int = _opt(0, "shape")  # classifier only
    residual_multiplier: float = _opt(1.0, "shape")  # each branch's output times this (Granite)
    # -- attention ------------------------------------------------------------------------------
    n_kv_head: int | None = _opt(None, "attention")  # key/value heads; None = n_head, 1 = MQA
    qkv_bias: bool | None = _opt(None, "attention")  # None = `bias` (Qwen2: bias=False, True)
    head_size: int | None = _opt(None, "attention")  # None = n_embd / n_head (Qwen3: 128)
    qk_norm: str | None = _opt(None, "attention")  # RMSNorm of q and k before rotary: over
    #                   each head ("head", Qwen3, Gemma 3) or the whole projection ("projection",
    #                   OLMo-2); older configs' true is "head"
    attention_multiplier: float | None = _opt(None, "attention")  # q.k scale; None: 1/sqrt(hd)
    attn_softcap: float | None = _opt(None, "attention")  # logits -> cap*tanh(./cap) (Gemma 2)
    sliding_window: int | None = _opt(None, "attention")  # a query sees the last
    #                   `sliding_window` keys (Mistral); in an encoder those within
    #                   sliding_window // 2 either side (ModernBERT's local_attention)
    full_attention_layers: tuple[int, ...] = _opt((), "attention")  # layers the window leaves
    # -- positions ------------------------------------------------------------------------------
    pos_encoding: str = _opt("learned", "positions")
    rope_theta: float = _opt(10000.0, "positions")  # rotary positions' base
    rope_scaling: dict | None = _opt(None, "positions")  # transformers' rope_scaling: linear,
    #                   dynamic, llama3, yarn, longrope
    rope_local_theta: float | None = _opt(None, "positions")  # windowed layers' base (Gemma 3)
    rotary_dim: int | None = _opt(None, "positions")  # each head's rotated dims, the first
    #                   ones; None = head_dim (Phi-4-mini's partial_rotary_factor 0.75)
    nope_layers: tuple[int, ...] = _opt((), "positions")  # layers without rotary (SmolLM3)
    position_offset: int = _opt(0, "positions")  # the learned table's row of position 0
    #                   (RoBERTa's pad id + 1; BART's 2), or the sinusoid's (M2M100's pad + 1)
    relative_buckets: int = _opt(32, "positions")  # T5's relative bias: distance buckets
    relative_max_distance: int = _opt(128, "positions")  # ... and the last one's distance
    # -- norms ----------------------------------------------------------------------------------
    norm: str = _opt("layernorm", "norms")  # or rmsnorm (no mean, no bias)
    norm_eps: float = _opt(1e-5, "norms")  # GPT-2's layer_norm_epsilon, Llama's rms_norm_eps
    norm_offset: float = _opt(0.0, "norms")  # an RMSNorm's gain is offset + weight (Gemma: 1)
    norm_placement: str = _opt("pre", "norms")  # "post": x = ln_1(x + attn(x)), BERT's
    pre_norms: bool = _opt(True, "norms")  # norms of each branch's input (ln_1, ln_2);
    #                   false: OLMo-2's, only the branches' outputs normalised (post_norms)
    post_norms: bool = _opt(False, "norms")  # norms of each branch's output (Gemma's 4 a
    #                   block with the pre-norms; OLMo-2's 2 without them)
    first_block_norm: bool = _opt(True, "norms")  # false: block 0 has no ln_1 (ModernBERT)
    embedding_norm: bool = _opt(False, "norms")  # a norm of the embeddings' sum (BERT's)
    # -- mlp ------------------------------------------------------------------------------------
    activation: str = _opt("gelu", "mlp")  # gelu (exact), gelu_tanh, swiglu, geglu(_tanh)
    n_inner: int | None = _opt(None, "mlp")  # MLP width (intermediate_size); None = 4 * n_embd
    # -- embeddings -----------------------------------------------------------------------------
    tie_weights: bool = _opt(True, "embeddings")  # lm_head shares the token-embedding matrix
    embedding_multiplier: float = _opt(1.0, "embeddings")  # token embeddings times this
    type_vocab_size: int = _opt(0, "embeddings")  # rows of a token-type (segment) table
    # -- head: the logits, or the sentence / label an encoder makes -------------------------------
    logits_scaling: float = _opt(1.0, "head")  # logits divided by this (Granite)
    final_softcap: float | None = _opt(None, "head")  # logits -> cap*tanh(./cap) (Gemma 2 / 3)
    pooling: str | None = _opt("mean", "head")  # the classifier's / encoder's sentence from
    #                   its tokens; None: an encoder with hidden states only
    normalize: bool = _opt(False, "head")  # the encoder's sentence embedding at unit L2 norm
    pooler_activation: str | None = _opt(None, "head")  # a classifier's dense + activation
    #                   before its head (BERT's pooler: tanh; DistilBERT's: relu)
    pooler_norm: bool = _opt(False, "head")  # a norm after the pooler's activation (ModernBERT)
    final_logits_bias: bool = _opt(False, "head")  # a bias on the logits (BART's, Marian's)
    # -- seq2seq: the encoder-decoder's own ---------------------------------------------------
    n_decoder_layer: int | None = _opt(None, "seq2seq")  # decoder blocks; None = n_layer
    decoder_start_id: int = _opt(0, "seq2seq")  # the decoder's first token (Marian's pad,
    #                   BART's </s>, T5's pad)
    shared_embeddings: bool = _opt(True, "seq2seq")  # the decoder reads the encoder's table
    forced_bos_id: int | None = _opt(None, "seq2seq")  # the first token generated, forced
    #                   (BART-large-CNN's <s>; M2M100's / NLLB's target language); None: chosen
    bad_word_ids: tuple[int, ...] = _opt((), "seq2seq")  # ids never generated (Opus-MT's
    #                   generation_config bans its pad: bad_words_ids [[58100]])
    n_mels: int | None = _opt(None, "seq2seq")  # the source is log-mel features (B, n_mels,
    #                   2 * source_positions frames) through two convolutions with GELU, the
    #                   second of stride 2 (Whisper's audio encoder); None: token ids
    source_positions: int | None = _opt(None, "seq2seq")  # an audio encoder's position table
    #                   (Whisper's max_source_positions, 1,500: 30 s); None: no audio

    def group(self, name: str) -> dict[str, Any]:
        """The fields of one group (GROUPS) and their values."""
        if name not in GROUPS:
            raise ConfigError(f"group {name!r} is not one of ModelConfig's: {', '.join(GROUPS)}")
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata["group"] == name}

    def __post_init__(self) -> None:
        for name in ("full_attention_layers", "nope_layers", "bad_word_ids"):
            if isinstance(getattr(self, name), list):  # JSON's spelling of a tuple
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if isinstance(self.rope_scaling, dict):  # a copy: the caller's dict may change after
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
        if self.qk_norm is True or self.qk_norm is False:  # the older spelling
            object.__setattr__(self, "qk_norm", "head" if self.qk_norm else None)
        check_model(self)  # tinyt/config_checks.py, group by group

    @property
    def rotary_dims(self) -> int:
        """The dims of each head that rotary turns (the first ones)."""
        return self.rotary_dim or self.head_dim

    @property
    def norms_per_block(self) -> int:
        """The norms of the residual stream in a block: ln_1 and ln_2 (pre_norms), the
        branches' outputs' (post_norms), or BERT's two sums'; q/k norms not counted."""
        if self.norm_placement == "post":
            return 2
        return 2 * self.pre_norms + 2 * self.post_norms

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head

    @property
    def q_width(self) -> int:
        """Width of the query heads together (n_embd unless head_size says otherwise)."""
        return self.n_head * self.head_dim

    def windowed(self, layer: int) -> bool:
        """Whether `layer` attends through the sliding window."""
        return self.sliding_window is not None and layer not in self.full_attention_layers

    def rotary_layer(self, layer: int) -> bool:
        return self.pos_encoding == "rotary" and layer not in self.nope_layers

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP is gated (c_fc makes the gate and the up projection)."""
        return self.activation in GATED

    def rope_base(self, layer: int) -> float:
        """The rotary base of `layer`: rope_local_theta for a windowed one where it is set."""
        if self.rope_local_theta is not None and self.windowed(layer):
            return self.rope_local_theta
        return self.rope_theta

    @property
    def mlp_width(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @property
    def decoder_layers(self) -> int:
        """An encoder-decoder's decoder blocks."""
        return self.n_layer if self.n_decoder_layer is None else self.n_decoder_layer

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def llama_options(self) -> list[str]:
        """The Llama-family options this config uses (empty for a GPT-2-style model)."""
        return [name for name, on in (
            ("norm='rmsnorm'", self.norm == "rmsnorm"),
            ("pos_encoding='rotary'", self.pos_encoding == "rotary"),
            (f"activation={self.activation!r}", self.gated_mlp),
            (f"n_kv_head={self.n_kv_head}", self.kv_heads != self.n_head),
            (f"qkv_bias={self.qkv_bias}", self.qkv_bias not in (None, self.bias))) if on] + \
            self.family_options

    @property
    def family_options(self) -> list[str]:
        """The options beyond Llama's this config uses (head_size, qk_norm, rope_scaling, the
        window, nope layers, Granite's multipliers), as name=value."""
        return [f"{name}={getattr(self, name)!r}" for name, off in FAMILY_OPTIONS.items()
                if getattr(self, name) != off]

    def kv_cache_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Bytes the KV cache grows by per token: keys and values of every layer."""
        return self.n_layer * 2 * self.kv_heads * self.head_dim * dtype_bytes


# GPT-2's and Llama's options (llama_options names Llama's) and the task's own: every other
# field is an option of the families beyond them, "off" at its default, and a catalogue entry
# writes a model using one only where it says it holds it (a new field is refused until then)
BASE_OPTIONS = frozenset({"block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout",
                          "bias", "pos_encoding", "tie_weights", "task", "num_labels",
                          "activation", "norm_eps", "n_inner", "norm", "n_kv_head", "rope_theta",
                          "qkv_bias", "pooling"})
FAMILY_OPTIONS = {f.name: f.default for f in dataclasses.fields(ModelConfig)
                  if f.name not in BASE_OPTIONS}  # name -> its "off"

@dataclass(frozen=True)
class TrainConfig(_JsonMixin):
    """How to train. The learning rate warms up linearly, then decays by a cosine to min_lr."""

    max_steps: int = 1000
    batch_size: int = 32  # global batch, split across data-parallel ranks
    learning_rate: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1  # matrices (dim >= 2) only; biases and LayerNorm gains are not
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global grad norm; 0 disables
    eval_interval: int = 100  # steps between validation (and checkpoint) passes
    eval_batches: int = 8
    seed: int = 1337
    tokenizer: str = "bpe"
    device: str = "cpu"
    max_target_tokens: int = 32  # seq2seq: targets cut to this many tokens, EOS included (and
    #                   to block_size); greedy evaluation makes at most this many

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "eval_interval", "eval_batches"):
            v = getattr(self, name)
            _require(_is_int(v) and v >= 1, name, v, "must be an integer >= 1")
        v = self.max_target_tokens
        _require(_is_int(v) and v >= 2, "max_target_tokens", v,
                 "must be an integer >= 2 (a token and the EOS)")
        for name in ("warmup_steps", "seed"):
            v = getattr(self, name)
            _require(_is_int(v) and v >= 0, name, v, "must be an integer >= 0")
        for name in ("learning_rate", "min_lr", "weight_decay", "grad_clip"):
            v = getattr(self, name)
            _require(_is_number(v) and v >= 0, name, v, "must be a finite number >= 0")
        _require(self.learning_rate > 0, "learning_rate", self.learning_rate, "must be > 0")
        _require(
            self.min_lr <= self.learning_rate, "min_lr", self.min_lr,
            f"must be <= learning_rate={self.learning_rate}",
        )
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            _require(_is_number(v) and 0 <= v < 1, name, v, "must be a finite number in [0, 1)")
        _require(
            self.tokenizer in TOKENIZER_KINDS, "tokenizer", self.tokenizer,
            f"allowed: {', '.join(TOKENIZER_KINDS)}",
        )
        _require(self.device in DEVICES, "device", self.device, f"allowed: {', '.join(DEVICES)}")


# Presets: keyword arguments for ModelConfig and TrainConfig. vocab_size is the tokenizer's
# target size; the trained tokenizer's actual size is what the model gets.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # Seconds on a CPU; for tests and smoke runs.
    "test": {
        "model": dict(block_size=32, vocab_size=512, n_layer=2, n_head=2, n_embd=32),
        "train": dict(max_steps=20, batch_size=8, warmup_steps=2, eval_interval=10,
                      eval_batches=2),
    },
    # The default: trains in about 5 minutes on 2 CPU cores and writes recognisable Python.
    "demo": {
        "model": dict(block_size=128, vocab_size=2048, n_layer=4, n_head=4, n_embd=128),
        "train": dict(max_steps=600, batch_size=32, warmup_steps=30, eval_interval=100,
                      eval_batches=8),
    },
    # The demo's parameter count in the Llama family's form: RMSNorm, rotary positions, SwiGLU
    # (n_inner 3 * n_embd: the MLP's three matrices hold what GELU's two of 4 * n_embd do) and
    # 2 key/value heads for 4 query heads (half the KV cache). Same training settings.
    "llama-demo": {
        "model": dict(block_size=128, vocab_size=2048, n_layer=4, n_head=4, n_kv_head=2,
                      n_embd=128, n_inner=384, norm="rmsnorm", pos_encoding="rotary",
                      activation="swiglu", bias=False),
        "train": dict(max_steps=600, batch_size=32, warmup_steps=30, eval_interval=100,
                      eval_batches=8),
    },
    # The test preset in the Llama form (multi-query: one key/value head for two query heads).
    "llama-test": {
        "model": dict(block_size=32, vocab_size=512, n_layer=2, n_head=2, n_kv_head=1,
                      n_embd=32, n_inner=64, norm="rmsnorm", pos_encoding="rotary",
                      activation="swiglu", bias=False),
        "train": dict(max_steps=20, batch_size=8, warmup_steps=2, eval_interval=10,
                      eval_batches=2),
    },
    # The encoder-decoder: code summarization, a stdlib function's code -> the first sentence
    # of its docstring (tinyt/seq2seq_data.py). 3 + 3 pre-norm blocks, learned positions. A
    # third of the LM's learning rate: at 3e-3 cross-attention stays unused far longer (a
    # toy reversal task learns at 1e-3 and not at 3e-3). Figures in docs/model.md.
    "seq2seq-demo": {
        "model": dict(task="seq2seq", block_size=128, vocab_size=2048, n_layer=3,
                      n_decoder_layer=3, n_head=4, n_embd=192),
        "train": dict(max_steps=800, batch_size=32, learning_rate=1e-3, min_lr=1e-4,
                      warmup_steps=40, eval_interval=200, eval_batches=8,
                      max_target_tokens=40),
    },
    # Seconds on a CPU; for tests.
    "seq2seq-test": {
        "model": dict(task="seq2seq", block_size=32, vocab_size=512, n_layer=2, n_head=2,
                      n_embd=32),
        "train": dict(max_steps=20, batch_size=8, learning_rate=1e-3, min_lr=1e-4,
                      warmup_steps=2, eval_interval=10, eval_batches=2, max_target_tokens=16),
    },
    # The shape of the seed article's model (4 layers, 4 heads, 768 wide). Slow on a CPU.
    "article": {
        "model": dict(block_size=256, vocab_size=8192, n_layer=4, n_head=4, n_embd=768),
        "train": dict(max_steps=2000, batch_size=16, learning_rate=6e-4, min_lr=6e-5,
                      warmup_steps=100, eval_interval=250, eval_batches=16),
    },
    # GPT-2 small's shape (124 M parameters with GPT-2's 50257 ids; the vocabulary is what the
    # tokenizer reaches). For the deployment chain at real size; training it takes a GPU.
    "gpt2-small": {
        "model": dict(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768,
                      activation="gelu_tanh"),
        "train": dict(max_steps=5000, batch_size=8, learning_rate=6e-4, min_lr=6e-5,
                      warmup_steps=200, eval_interval=500, eval_batches=4),
    },
}
DEFAULT_PRESET = "demo"


def preset(name: str, **overrides: Any) -> tuple[ModelConfig, TrainConfig]:
    """The named preset's (ModelConfig, TrainConfig); overrides go to whichever owns the key."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; available presets: {', '.join(PRESETS)}")
    model_kw = dict(PRESETS[name]["model"])
    train_kw = dict(PRESETS[name]["train"])
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in model_fields:
            model_kw[key] = value
        elif key in train_fields:
            train_kw[key] = value
        else:
            raise ConfigError(
                f"unknown setting {key!r}; allowed: {sorted(model_fields | train_fields)}"
            )
    return ModelConfig(**model_kw), TrainConfig(**train_kw)


__all__ = ["ModelConfig", "TrainConfig", "PRESETS", "DEFAULT_PRESET", "preset"]
