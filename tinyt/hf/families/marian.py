"""Marian (MarianMTModel: the Opus-MT translators): BART's layout, post-norm, with the sinusoid
for positions, embeddings scaled by sqrt(d_model), SiLU ("swish"), a bias on the logits, and
the decoder starting at the padding.

    positions   sin of every frequency then cos, 10000^(-2i / d_model) (tinyt's "sinusoidal"),
                computed: an older save's model.{en,de}coder.embed_positions.weight is that
                table, skipped on import and never written
    embeddings  one table for both stacks (share_encoder_decoder_embeddings), tied to the head;
                with share_encoder_decoder_embeddings false the decoder has its own table
                (shared_embeddings=False), tied to the head; a target vocabulary of another
                size (decoder_vocab_size) is refused by name

Generation: decoder_start_token_id (the pad, 58100 in Opus-MT en-de) is
ModelConfig.decoder_start_id; the end (</s>, 0) is the tokenizer's EOS and the padding its
<pad>. Opus-MT's generation_config bans the pad (bad_words_ids: ModelConfig.bad_word_ids, in
the export's generation_config.json, which the runtime reads) and beams 4 (tinyt translate's
default is greedy: --beams 4 as Opus-MT). Its tokenizer must be a tokenizer.json
(tinyt/hf/tokens.py says why).
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
    decoder_vocab,
    embedding_scale,
    same_stacks,
    scale_misfit,
)
from tinyt.hf.family import Family
from tinyt.hf.tensors import bart_layout, bart_shared, weights
from tinyt.hf.tokens import read_seq2seq_tokenizer, seq2seq_special_tokens

MARIAN = Family(
    model_type="marian", architecture="MarianMTModel",
    keys={**BART_KEYS, "share_encoder_decoder_embeddings": "shared_embeddings"},
    defaults={**BART_DEFAULTS, "share_encoder_decoder_embeddings": True},
    spelled={"activation_function": ACT_FN},
    features={"task": "seq2seq", "norm": "layernorm", "norm_eps": 1e-5, "bias": True,
              "pos_encoding": "sinusoidal", "norm_placement": "post",
              "final_logits_bias": True},
    refuses=(same_stacks, decoder_vocab),
    reads=(bad_words, decoder_layers("encoder_layers", "decoder_layers"), embedding_scale(False),
           decoder_start(lambda hf: hf.get("pad_token_id", 58100))),  # MarianConfig's
    holds=SEQ2SEQ_HOLDS | {"embedding_multiplier", "shared_embeddings"}, misfit=scale_misfit,
    written=lambda cfg, eos: {**bart_written(cfg, eos), "decoder_vocab_size": cfg.vocab_size,
                              "bos_token_id": None},
    weights=weights(bart_layout()), base="model.", outside=("final_logits_bias",),
    shared=bart_shared(), buffers=("embed_positions.weight",),
    read_tokenizer=read_seq2seq_tokenizer, special_tokens=seq2seq_special_tokens,
    task="seq2seq",
)
