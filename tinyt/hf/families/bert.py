"""The BERT encoders: BertModel, RobertaModel, XLMRobertaModel, DistilBertModel, and their
sequence and token classifiers.

    entry        model_type   class            tinyt features
    BERT         bert         BertModel        post-norm, learned positions, token types
    ROBERTA      roberta      RobertaModel     positions from pad_token_id + 1
    XLM_ROBERTA  xlm-roberta  XLMRobertaModel  RoBERTa under another name
    DISTILBERT   distilbert   DistilBertModel  no token types, q/k/v_lin

The base model's pooler is dropped (no sentence embedding uses it); a classifier's head keeps
its own (BertForSequenceClassification's pooler, RoBERTa's classifier.dense).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tinyt.config import ModelConfig
from tinyt.errors import ConversionError
from tinyt.hf.common import no_pooling
from tinyt.hf.family import Family, Head, Spelling, Weight
from tinyt.hf.tensors import weights
from tinyt.hf.tokens import encoder_special_tokens, read_encoder_tokenizer


def bert_weights(prefix: str) -> tuple[Weight, ...]:
    """BertModel's tensors (RoBERTa's and XLM-R's the same under their prefix)."""
    emb, layer = prefix + "embeddings.", prefix + "encoder.layer.{i}."
    return weights({
        "token_embd": emb + "word_embeddings.weight",
        "pos_embd": emb + "position_embeddings.weight",
        "type_embd": emb + "token_type_embeddings.weight",
        "embd_norm": emb + "LayerNorm.{w}",
        "attn_qkv": (layer + "attention.self.query.{w}", layer + "attention.self.key.{w}",
                     layer + "attention.self.value.{w}"),
        "attn_out": layer + "attention.output.dense.{w}",
        "attn_norm": layer + "attention.output.LayerNorm.{w}",  # post-norm: after the sum
        "ffn_up": layer + "intermediate.dense.{w}",
        "ffn_down": layer + "output.dense.{w}",
        "ffn_norm": layer + "output.LayerNorm.{w}",
    })


_DISTIL, _DLAYER = "distilbert.embeddings.", "distilbert.transformer.layer.{i}."
DISTILBERT_WEIGHTS = weights({
    "token_embd": _DISTIL + "word_embeddings.weight",
    "pos_embd": _DISTIL + "position_embeddings.weight",
    "embd_norm": _DISTIL + "LayerNorm.{w}",
    "attn_qkv": (_DLAYER + "attention.q_lin.{w}", _DLAYER + "attention.k_lin.{w}",
                 _DLAYER + "attention.v_lin.{w}"),
    "attn_out": _DLAYER + "attention.out_lin.{w}",
    "attn_norm": _DLAYER + "sa_layer_norm.{w}",
    "ffn_up": _DLAYER + "ffn.lin1.{w}",
    "ffn_down": _DLAYER + "ffn.lin2.{w}",
    "ffn_norm": _DLAYER + "output_layer_norm.{w}",
})


def read_roberta_positions(hf: dict[str, Any]) -> dict[str, Any]:
    """RoBERTa numbers a row's real tokens from pad_token_id + 1 (rows 0..pad of its table
    are never read by them): tinyt's context is the table less those rows."""
    pad = hf.get("pad_token_id", 1)
    if not (isinstance(pad, int) and pad >= 0):
        raise ConversionError(f"pad_token_id={pad!r} must be an integer >= 0")
    offset, table = pad + 1, hf.get("max_position_embeddings", 514)
    if not (isinstance(table, int) and table > offset + 1):
        raise ConversionError(f"max_position_embeddings={table!r} leaves no position after "
                              f"the {offset} rows RoBERTa's positions start from")
    return {"block_size": table - offset, "position_offset": offset}


def roberta_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {"max_position_embeddings": cfg.block_size + cfg.position_offset,
            "pad_token_id": cfg.position_offset - 1, **bert_written(cfg, eos_id)}


def bert_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


_BERT_KEYS = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
              "num_attention_heads": "n_head", "intermediate_size": "n_inner",
              "max_position_embeddings": "block_size", "vocab_size": "vocab_size",
              "layer_norm_eps": "norm_eps", "type_vocab_size": "type_vocab_size"}


_GELU = {"hidden_act": Spelling("activation", {
    "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}, default="gelu")}


_ENCODER = {"task": "encoder", "norm": "layernorm", "pos_encoding": "learned",
            "norm_placement": "post", "embedding_norm": True, "bias": True,
            "tie_weights": False}


_SEQUENCE = {"task": "classifier", "pooling": "cls"}  # every one of these pools [CLS] / <s>


_TOKENS = {"task": "token_classifier", "pooling": None}


_TOKEN_HEAD = weights({"classifier": "classifier.{w}"})


def bert_heads(name: str, prefix: str) -> tuple[Head, ...]:
    """BERT's and RoBERTa's sequence and token classifiers: the sequence head a dense + tanh
    on [CLS] (BERT's pooler; RoBERTa's classifier.dense) then the label projection."""
    pooler, out = (("classifier.dense.{w}", "classifier.out_proj.{w}") if name != "Bert" else
                   (prefix + "pooler.dense.{w}", "classifier.{w}"))
    return (Head(f"{name}ForSequenceClassification", "classifier",
                 {**_SEQUENCE, "pooler_activation": "tanh"},
                 weights({"pooler": pooler, "classifier": out}),
                 keeps_pooler=name == "Bert"),  # RoBERTa's head is its own: a saved base
                 #                                pooler is dropped, as transformers does
            Head(f"{name}ForTokenClassification", "token_classifier", _TOKENS, _TOKEN_HEAD))


_BERT_LIKE = dict(
    spelled=_GELU, features=_ENCODER,
    fixed={"position_embedding_type": "absolute", "is_decoder": False,
           "add_cross_attention": False},
    holds=frozenset({"type_vocab_size", "normalize", "position_offset"}),
    buffers=("embeddings.position_ids", "embeddings.token_type_ids"),
    # the base model's pooler (tanh of [CLS]'s dense): no sentence embedding of sentence-
    # transformers' uses it, nor tinyt's contract; dropped by name, and said
    drops=("pooler.dense.weight", "pooler.dense.bias"),
    read_tokenizer=read_encoder_tokenizer, special_tokens=encoder_special_tokens,
    task="encoder",
)


BERT = Family(  # BertModel: the encoder of all-MiniLM, bge, e5 and sentence-transformers' kin
    model_type="bert", architecture="BertModel", keys=_BERT_KEYS,
    defaults={"layer_norm_eps": 1e-12, "type_vocab_size": 2},
    weights=bert_weights("bert."), base="bert.", written=bert_written,
    heads=bert_heads("Bert", "bert."), reads=(no_pooling,),
    misfit=lambda cfg: ("BertModel's positions start at row 0" if cfg.position_offset else
                        "BertModel has a token-type table" if not cfg.type_vocab_size
                        else None),
    **_BERT_LIKE,
)


def roberta_misfit(arch: str) -> Callable[[ModelConfig], str | None]:
    return lambda cfg: None if cfg.position_offset else \
        f"{arch}'s positions start after its padding row (position_offset >= 1)"


ROBERTA = Family(  # RobertaModel: BERT's layout, positions from pad_token_id + 1
    model_type="roberta", architecture="RobertaModel", keys=_BERT_KEYS,
    defaults={"layer_norm_eps": 1e-12, "type_vocab_size": 1},
    reads=(read_roberta_positions, no_pooling), weights=bert_weights("roberta."),
    base="roberta.", written=roberta_written, heads=bert_heads("Roberta", "roberta."),
    misfit=roberta_misfit("RobertaModel"), **_BERT_LIKE,
)


XLM_ROBERTA = dataclasses.replace(
    ROBERTA, model_type="xlm-roberta", architecture="XLMRobertaModel",
    heads=bert_heads("XLMRoberta", "roberta."), misfit=roberta_misfit("XLMRobertaModel"))


DISTILBERT = Family(  # DistilBertModel: no token types, eps fixed at 1e-12, q/k/v_lin
    model_type="distilbert", architecture="DistilBertModel",
    keys={"dim": "n_embd", "n_layers": "n_layer", "n_heads": "n_head",
          "hidden_dim": "n_inner", "max_position_embeddings": "block_size",
          "vocab_size": "vocab_size"},
    defaults={"max_position_embeddings": 512},
    spelled={"activation": Spelling("activation", {"gelu": "gelu"}, default="gelu",
                                    why=" (its MLP's GELU; ReLU is not one of tinyt's)")},
    features={**_ENCODER, "norm_eps": 1e-12}, reads=(no_pooling,),
    holds=frozenset({"normalize"}),
    weights=DISTILBERT_WEIGHTS, base="distilbert.",
    heads=(Head("DistilBertForSequenceClassification", "classifier",
                {**_SEQUENCE, "pooler_activation": "relu"},
                weights({"pooler": "pre_classifier.{w}", "classifier": "classifier.{w}"}),
                outside=("classifier.", "pre_classifier.")),
           Head("DistilBertForTokenClassification", "token_classifier", _TOKENS, _TOKEN_HEAD)),
    buffers=("embeddings.position_ids",),
    read_tokenizer=read_encoder_tokenizer, special_tokens=encoder_special_tokens,
    written=lambda cfg, eos: {"dropout": 0.0, "attention_dropout": 0.0,
                              "sinusoidal_pos_embds": False},
    misfit=lambda cfg: ("DistilBertModel has no token-type table" if cfg.type_vocab_size
                        else "DistilBertModel's positions start at row 0"
                        if cfg.position_offset else None),
    task="encoder",
)
