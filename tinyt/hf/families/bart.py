"""BART and mBART (BartForConditionalGeneration, MBartForConditionalGeneration): fairseq's
encoder-decoder with learned positions from row 2, a LayerNorm of the embeddings, one table
read by both stacks and tied to the head, and a bias on the logits.

    entry  model_type  class                          tinyt features
    BART   bart        BartForConditionalGeneration   post-norm (x = ln(x + branch(x))), GELU
    MBART  mbart       MBartForConditionalGeneration  pre-norm, each stack's final layer_norm

Generation: decoder_start_token_id (BART's </s>) is ModelConfig.decoder_start_id and
forced_bos_token_id (BART-large-CNN's <s>, mBART-50's target language) forced_bos_id; the end
is the tokenizer's EOS and the padding its <pad>, as for every encoder-decoder
(tinyt/hf/tokens.py). forced_eos_token_id (the end forced at max_length) is written back as
the classes set it, and not run by tinyt's greedy.
"""
from __future__ import annotations

from tinyt.hf.common import (
    ACT_FN,
    BART_DEFAULTS,
    BART_KEYS,
    SEQ2SEQ_HOLDS,
    bad_words,
    bart_written,
    decoder_layers,
    decoder_start,
    embedding_scale,
    same_stacks,
    scale_misfit,
)
from tinyt.hf.family import Family
from tinyt.hf.tensors import bart_layout, bart_shared, weights
from tinyt.hf.tokens import read_seq2seq_tokenizer, seq2seq_special_tokens

BART_WEIGHTS = weights(bart_layout())
# BART's and mBART's positions: a learned table whose first 2 rows no token reads
LEARNED = {"task": "seq2seq", "norm": "layernorm", "norm_eps": 1e-5, "bias": True,
           "pos_encoding": "learned", "position_offset": 2, "embedding_norm": True,
           "final_logits_bias": True, "shared_embeddings": True}
BART_LIKE = dict(
    keys=BART_KEYS, defaults=BART_DEFAULTS, spelled={"activation_function": ACT_FN},
    refuses=(same_stacks,), misfit=scale_misfit, written=bart_written,
    holds=SEQ2SEQ_HOLDS | {"embedding_multiplier"},
    weights=BART_WEIGHTS, base="model.", outside=("final_logits_bias",), shared=bart_shared(),
    read_tokenizer=read_seq2seq_tokenizer, special_tokens=seq2seq_special_tokens,
    task="seq2seq",
)

BART = Family(
    model_type="bart", architecture="BartForConditionalGeneration",
    features={**LEARNED, "norm_placement": "post"},
    reads=(bad_words, decoder_layers("encoder_layers", "decoder_layers"), embedding_scale(False),
           decoder_start(lambda hf: 2)),  # BartConfig's </s>
    **BART_LIKE,
)


MBART = Family(  # mBART: BART pre-norm, with each stack's final layer_norm
    model_type="mbart", architecture="MBartForConditionalGeneration",
    features={**LEARNED, "norm_placement": "pre"},
    reads=(bad_words, decoder_layers("encoder_layers", "decoder_layers"), embedding_scale(False),
           decoder_start(lambda hf: None)),  # MBartConfig has none: its bos_token_id
    **BART_LIKE,
)
