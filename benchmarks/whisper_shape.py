"""Whisper as users bring it, made offline (no download): transformers'
WhisperForConditionalGeneration on random weights at the real models' widths, heads, mel bins,
positions and vocabularies, a tokenizer.json with Whisper's special-token layout and a
generation_config.json with its keys. The test suite's Whisper fixtures
(tests/whisper_fixtures.py, layers cut) and the Whisper peer benchmark
(benchmarks/peers/whisper_peers.py, the real layers: peer_whisper) are both made here.

The tokenizer is not Whisper's: its 50,257 ordinary ids are the 256 byte-level characters in
GPT-2's order (id 220 the space, "Ġ", as in Whisper's) and filler pieces, without Whisper's
merges; after them come the added tokens exactly as the real files number them:

    50257 <|endoftext|>  50258 <|startoftranscript|>  50259.. languages (99; v3: 100, <|yue|>)
    then <|translate|> <|transcribe|> <|startoflm|> <|startofprev|> <|nocaptions|>
    <|notimestamps|>, then 1,501 timestamps <|0.00|> .. <|30.00|>   (51,865 ids; v3: 51,866)
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

# name: (WhisperConfig settings, the real model's layers): each at its real width, heads, FFN,
# mel bins, positions and vocabulary, with 2 + 2 layers (large-v3-turbo: 1 + 1)
WHISPER = {
    "tiny": (dict(d_model=384, encoder_attention_heads=6, decoder_attention_heads=6,
                  encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80,
                  vocab_size=51865, encoder_layers=2, decoder_layers=2), (4, 4)),
    "base": (dict(d_model=512, encoder_attention_heads=8, decoder_attention_heads=8,
                  encoder_ffn_dim=2048, decoder_ffn_dim=2048, num_mel_bins=80,
                  vocab_size=51865, encoder_layers=2, decoder_layers=2), (6, 6)),
    "small": (dict(d_model=768, encoder_attention_heads=12, decoder_attention_heads=12,
                   encoder_ffn_dim=3072, decoder_ffn_dim=3072, num_mel_bins=80,
                   vocab_size=51865, encoder_layers=2, decoder_layers=2), (12, 12)),
    "large-v3-turbo": (dict(d_model=1280, encoder_attention_heads=20,
                            decoder_attention_heads=20, encoder_ffn_dim=5120,
                            decoder_ffn_dim=5120, num_mel_bins=128, vocab_size=51866,
                            encoder_layers=1, decoder_layers=1), (32, 4)),
}
# the settings every Whisper shares (openai/whisper-* config.json)
COMMON = dict(max_source_positions=1500, max_target_positions=448, pad_token_id=50257,
              bos_token_id=50257, eos_token_id=50257, decoder_start_token_id=50258,
              activation_function="gelu", scale_embedding=False, begin_suppress_tokens=None)
STD = 0.1  # the weights' spread: logits of size ~10, each step's choice clear
ORDINARY = 50257  # the byte-level BPE's ids before <|endoftext|>
TASK_TOKENS = ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
               "<|nocaptions|>", "<|notimestamps|>")


def languages(vocab_size: int) -> list[str]:
    """Whisper's language codes in id order (transformers' table; <|yue|> is large-v3's)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    codes = list(LANGUAGES)
    return codes if vocab_size == 51866 else [c for c in codes if c != "yue"]


def special_ids(vocab_size: int) -> dict[str, int]:
    """Each added token's id, in the real files' order."""
    names = ["<|endoftext|>", "<|startoftranscript|>",
             *(f"<|{c}|>" for c in languages(vocab_size)), *TASK_TOKENS,
             *(f"<|{i * 0.02:.2f}|>" for i in range(1501))]
    return {name: ORDINARY + i for i, name in enumerate(names)}


@functools.lru_cache(maxsize=2)
def whisper_tokenizer(vocab_size: int = 51865):
    """A tokenizers.Tokenizer with the layout above (special_ids)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    from tinyt.tokenizer import bytes_to_unicode

    table = bytes_to_unicode()  # GPT-2's order: printable bytes first, so " " is 220
    order = [*range(33, 127), *range(161, 173), *range(174, 256)]
    order += [b for b in range(256) if b not in order]
    vocab = {table[b]: i for i, b in enumerate(order)}
    vocab.update({f"x{i}q": i for i in range(256, ORDINARY)})
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    ids = special_ids(vocab_size)
    timestamps = [t for t in ids if t[2:-2].replace(".", "").isdigit()]
    tok.add_special_tokens([t for t in ids if t not in timestamps])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in timestamps])
    assert tok.get_vocab_size() == vocab_size
    assert tok.token_to_id("Ġ") == 220
    return tok


def generation_config(vocab_size: int, decoder_layers: int) -> dict:
    """generation_config.json's keys as openai/whisper-* hold them: the language and task ids,
    the suppressed tokens (a list of the real file's kind: punctuation-like ids and the
    special ones), the begin-suppressed space and end, the no-timestamps id, the alignment
    heads (of the layers the fixture has)."""
    ids = special_ids(vocab_size)
    langs = {f"<|{c}|>": ids[f"<|{c}|>"] for c in languages(vocab_size)}
    return {
        "alignment_heads": [[decoder_layers - 1, 0], [decoder_layers - 1, 2]],
        "begin_suppress_tokens": [220, 50257],
        "bos_token_id": 50257, "decoder_start_token_id": 50258, "eos_token_id": 50257,
        "pad_token_id": 50257,
        "forced_decoder_ids": [[1, None], [2, ids["<|transcribe|>"]]],
        "is_multilingual": True, "lang_to_id": langs,
        "max_initial_timestamp_index": 50, "max_length": 448,
        "no_timestamps_token_id": ids["<|notimestamps|>"],
        "prev_sot_token_id": ids["<|startofprev|>"], "return_timestamps": False,
        "suppress_tokens": [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62,
                            63, 90, 91, 92, 93, 359, 503, 522, 542, 873, 893, 902, 918, 922,
                            931, 1350, 1853, 1982, 2460, 2627, 3246, 3253, 3268, 3536, 3846,
                            3961, 4183, 4667, 6585, 6647, 7273, 9061, 9383, 10428, 10929,
                            11938, 12033, 12331, 12562, 13793, 14157, 14635, 15265, 15618,
                            16553, 16604, 18362, 18956, 20075, 21675, 22520, 26130, 26161,
                            26435, 28279, 29464, 31650, 32302, 32470, 36865, 42863, 47425,
                            49870, 50254, 50258, *(ids[t] for t in TASK_TOKENS[:-1])],
        "task_to_id": {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
    }


def whisper_config(name: str, **overrides):
    from transformers import WhisperConfig

    return WhisperConfig(**{**COMMON, **WHISPER[name][0], **overrides})


def whisper_model(name: str, std: float = STD, seed: int = 0, **overrides):
    """transformers' Whisper `name` on random weights drawn from `seed`: std `std` (norm gains
    around 1), the convolutions at 1/sqrt(fan-in) (features of size 1 in, size 1 out), the
    encoder's sinusoid as Whisper makes it."""
    import torch
    from transformers import WhisperForConditionalGeneration

    config = whisper_config(name, **overrides)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config)
    for pname, p in model.named_parameters():
        if "encoder.embed_positions" in pname:
            continue
        if ".conv" in pname and pname.endswith("weight"):
            torch.nn.init.normal_(p, std=(p.shape[1] * p.shape[2]) ** -0.5)
            continue
        gain = pname.endswith("weight") and "norm" in pname
        torch.nn.init.normal_(p, mean=1.0 if gain else 0.0, std=std)
    return model.eval()


def save_whisper(name: str, path: Path, **overrides):
    """The fixture `name` saved as a Hub directory (model.safetensors, config.json,
    generation_config.json, tokenizer.json, tokenizer_config.json); returns the model."""
    from transformers import GenerationConfig

    path = Path(path)
    model = whisper_model(name, **overrides)
    model.generation_config = GenerationConfig(**generation_config(
        model.config.vocab_size, model.config.decoder_layers))
    model.save_pretrained(path, safe_serialization=True)
    whisper_tokenizer(model.config.vocab_size).save(str(path / "tokenizer.json"))
    end = "<|endoftext|>"
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "model_max_length": 1024, "eos_token": end,
        "bos_token": end, "unk_token": end, "pad_token": end}))
    return model


def peer_whisper(name: str, path: Path, **overrides):
    """The peer benchmark's Whisper `name` (tiny, base, ...): the fixture at the real model's
    layers (or `overrides`' settings: a test's fewer layers, another seed), saved to `path`,
    with the head's rows of the special tokens no prompt reads (the end, the languages but
    English, the task tokens but <|transcribe|>, the timestamps) zero.
    Random rows there make a random model's greedy tokens mostly timestamps and end words
    early; a zero row's logit is 0, below the largest of 50,257 random ones, so every engine
    writes ordinary tokens up to the length asked: the same work (hf_shape's rule). The head
    is tied to the decoder's embedding, and no zeroed token is ever fed."""
    import torch

    encoder, decoder = WHISPER[name][1]
    model = save_whisper(name, path, **{"encoder_layers": encoder, "decoder_layers": decoder,
                                        **overrides})
    ids = special_ids(model.config.vocab_size)
    keep = {ids[t] for t in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                             "<|notimestamps|>")}
    with torch.no_grad():
        rows = [i for i in range(ORDINARY, model.config.vocab_size) if i not in keep]
        model.get_output_embeddings().weight[rows] = 0.0
    model.save_pretrained(path, safe_serialization=True)
    return model
