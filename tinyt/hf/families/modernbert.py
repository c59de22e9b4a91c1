"""ModernBERT (ModernBertModel and its classifiers): rotary, GeGLU, pre-norm, local layers
(a window either side) between global ones, no norm before block 0 (the embeddings' is it).
"""
from __future__ import annotations

from typing import Any

from tinyt.config import ModelConfig
from tinyt.errors import ConversionError
from tinyt.hf.common import no_pooling
from tinyt.hf.family import Family, Head, Spelling
from tinyt.hf.tensors import LAYER, weights
from tinyt.hf.tokens import encoder_special_tokens, read_encoder_tokenizer

MODERNBERT_WEIGHTS = weights({
    "token_embd": "model.embeddings.tok_embeddings.weight",
    "embd_norm": "model.embeddings.norm.{w}",
    "attn_norm": LAYER + "attn_norm.{w}",  # none in layer 0
    "attn_qkv": LAYER + "attn.Wqkv.{w}",  # rows q | k | v, as tinyt's
    "attn_out": LAYER + "attn.Wo.{w}",
    "ffn_norm": LAYER + "mlp_norm.{w}",
    "ffn_up": LAYER + "mlp.Wi.{w}",  # the activated half first, as tinyt's
    "ffn_down": LAYER + "mlp.Wo.{w}",
    "output_norm": "model.final_norm.{w}",
})


def read_modernbert(hf: dict[str, Any]) -> dict[str, Any]:
    """One bias setting for every projection and norm (tinyt's `bias`); the global layers,
    every `global_attn_every_n_layers`-th from layer 0; the rest see `local_attention` // 2
    tokens either side."""
    biases = {k: hf.get(k, False) for k in ("attention_bias", "mlp_bias", "norm_bias")}
    if len(set(biases.values())) != 1:
        raise ConversionError(f"{biases}: tinyt's model has biases everywhere or nowhere")
    every = hf.get("global_attn_every_n_layers", 3)
    layers = hf.get("num_hidden_layers")
    if not (isinstance(every, int) and every >= 1 and isinstance(layers, int)):
        raise ConversionError(f"global_attn_every_n_layers={every!r} must be an integer >= 1")
    out = {"bias": biases["norm_bias"],
           "full_attention_layers": tuple(i for i in range(layers) if i % every == 0)}
    params = hf.get("rope_parameters")  # transformers 5: each layer type's base in here
    if isinstance(params, dict):
        for kind, field in (("full_attention", "rope_theta"),
                            ("sliding_attention", "rope_local_theta")):
            theta = params.get(kind, {}).get("rope_theta") \
                if isinstance(params.get(kind), dict) else None
            if theta is not None:
                out[field] = float(theta)
    return out


def read_modernbert_head(hf: dict[str, Any]) -> dict[str, Any]:
    """The head: classifier_pooling, classifier_activation, and its dense layer's bias, which
    tinyt's pooler shares with the model's."""
    pooling = hf.get("classifier_pooling", "cls")
    act = hf.get("classifier_activation", "gelu")
    if pooling not in ("cls", "mean"):
        raise ConversionError(f"classifier_pooling={pooling!r}: tinyt pools cls or mean")
    if act not in ("gelu", "tanh", "relu"):
        raise ConversionError(f"classifier_activation={act!r} is not implemented by tinyt's "
                              "head; allowed: gelu, tanh, relu")
    if hf.get("classifier_bias", False) != hf.get("norm_bias", False):
        raise ConversionError(f"classifier_bias={hf.get('classifier_bias')!r} with "
                              f"norm_bias={hf.get('norm_bias')!r}: tinyt's head has the "
                              "model's bias setting")
    return {"pooling": pooling, "pooler_activation": act}


def modernbert_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    every = cfg.full_attention_layers[1] if len(cfg.full_attention_layers) > 1 else cfg.n_layer
    head = {"classifier_pooling": cfg.pooling or "cls",
            "classifier_activation": cfg.pooler_activation, "classifier_bias": cfg.bias} \
        if cfg.pooler_activation else {}
    return {"attention_bias": cfg.bias, "mlp_bias": cfg.bias, "norm_bias": cfg.bias,
            "global_attn_every_n_layers": every, "embedding_dropout": 0.0,
            "attention_dropout": 0.0, "mlp_dropout": 0.0, **head}


def modernbert_rope(hf: dict[str, Any]) -> str | None:
    """ModernBERT's rotary is the default one; a scaling (rope_scaling, or a type in
    transformers 5's rope_parameters) would turn it otherwise: refused, not ignored."""
    scaling = hf.get("rope_scaling")
    params = hf.get("rope_parameters")
    kinds = [scaling.get("rope_type", scaling.get("type"))] if isinstance(scaling, dict) else \
        [scaling] if scaling is not None else []
    if isinstance(params, dict):
        kinds += [p.get("rope_type") for p in params.values() if isinstance(p, dict)]
        kinds.append(params.get("rope_type"))
    odd = [k for k in kinds if k not in (None, "default")]
    return f"rope scaling {odd[0]!r} is not implemented for ModernBertModel by tinyt" \
        if odd else None


def modernbert_misfit(cfg: ModelConfig) -> str | None:
    layers = cfg.full_attention_layers
    every = layers[1] if len(layers) > 1 else cfg.n_layer
    if layers != tuple(range(0, cfg.n_layer, every)):
        return f"ModernBertModel's global layers are every n-th from 0; these are {layers}"
    return None


_MB_HEAD = weights({"pooler": "head.dense.{w}", "pooler_norm": "head.norm.{w}",
                    "classifier": "classifier.{w}"})


MODERNBERT = Family(  # ModernBertModel: rotary, GeGLU, local / global layers, pre-norm
    model_type="modernbert", architecture="ModernBertModel",
    keys={"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
          "num_attention_heads": "n_head", "intermediate_size": "n_inner",
          "max_position_embeddings": "block_size", "vocab_size": "vocab_size",
          "norm_eps": "norm_eps", "global_rope_theta": "rope_theta",
          "local_rope_theta": "rope_local_theta", "local_attention": "sliding_window"},
    defaults={"norm_eps": 1e-5, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
              "local_attention": 128, "max_position_embeddings": 8192},
    spelled={"hidden_activation": Spelling("activation", {"gelu": "geglu"}, default="gelu",
                                           why=" (its MLP is GeGLU with the exact GELU)")},
    features={"task": "encoder", "norm": "layernorm", "pos_encoding": "rotary",
              "norm_placement": "pre", "embedding_norm": True, "first_block_norm": False,
              "tie_weights": False},
    reads=(read_modernbert, no_pooling), refuses=(modernbert_rope,),
    holds=frozenset({"sliding_window", "full_attention_layers", "rope_local_theta",
                     "normalize", "pooler_norm", "pooler_activation", "first_block_norm",
                     "embedding_norm", "norm_placement"}),
    misfit=modernbert_misfit,
    weights=MODERNBERT_WEIGHTS, base="model.",
    read_tokenizer=read_encoder_tokenizer, special_tokens=encoder_special_tokens,
    written=modernbert_written, task="encoder",
    heads=(Head("ModernBertForSequenceClassification", "classifier",
                {"task": "classifier", "pooler_norm": True}, _MB_HEAD,
                outside=("head.", "classifier."), reads=(read_modernbert_head,)),
           Head("ModernBertForTokenClassification", "token_classifier",
                {"task": "token_classifier", "pooling": None, "pooler_norm": True}, _MB_HEAD,
                outside=("head.", "classifier."),
                reads=(lambda hf: {"pooler_activation": read_modernbert_head(
                    {**hf, "classifier_pooling": "cls"})["pooler_activation"]},))),
)
