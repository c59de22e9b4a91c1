"""Tokenizer files of a Hugging Face directory, read and written for an entry.

Two kinds exist: GPT-2's (tokenizer.json or vocab.json + merges.txt, beginning, ending and
padding at <|endoftext|>) and the Hub's now usual one (tokenizer.json with the end, begin and
chat template in tokenizer_config.json, the end the model stops at in generation_config.json).
An encoder-decoder's is the second kind, its padding the tokenizer's <pad> (Tokenizer.pad_id).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tinyt.errors import CheckpointError, ConversionError
from tinyt.tokenizer import EOS_TOKEN, Tokenizer, read_settings


# -- GPT-2 ----------------------------------------------------------------------------------------
def read_gpt2_tokenizer(directory: Path, hf_cfg: dict[str, Any],
                        log: Callable[[str], None]) -> Tokenizer:
    """tokenizer.json, or GPT-2's vocab.json + merges.txt as a byte-level BPE; config.json's
    end-of-text id must be the tokenizer's <|endoftext|>."""
    tok = _gpt2_files(directory)
    eos = hf_cfg.get("eos_token_id")
    if eos is not None and eos != tok.eos_id:
        raise ConversionError(f"config.json's eos_token_id={eos} is not the tokenizer's "
                              f"{EOS_TOKEN} ({tok.eos_id}); tinyt ends text at {EOS_TOKEN}")
    return tok


def _gpt2_files(directory: Path) -> Tokenizer:
    if (directory / "tokenizer.json").is_file():
        return Tokenizer.from_file(directory / "tokenizer.json")
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise CheckpointError(f"{directory} has no tokenizer.json nor vocab.json + merges.txt")
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    try:
        hf = HFTokenizer(models.BPE.from_file(str(vocab), str(merges)))
        known = json.loads(vocab.read_text(encoding="utf-8"))
    except Exception as e:  # the Rust parser raises a bare Exception
        raise CheckpointError(f"{vocab} / {merges} are not a BPE vocabulary: {e}") from None
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    if EOS_TOKEN in known:
        hf.add_special_tokens([EOS_TOKEN])
    return Tokenizer(hf)


def gpt2_special_tokens(tok: Tokenizer) -> dict[str, Any]:
    return {"eos_token": EOS_TOKEN, "bos_token": EOS_TOKEN,
            "unk_token": EOS_TOKEN} if tok.eos_id is not None else {}


# -- the Hub's tokenizer.json + tokenizer_config.json -------------------------------------------
def _token(tok, idx) -> str | None:
    return tok.id_to_token(idx) if isinstance(idx, int) else None


def read_tokenizer(directory: Path, hf_cfg: dict[str, Any],
                   log: Callable[[str], None]) -> Tokenizer:
    """tokenizer.json with its tokenizer_config.json; the end-of-text token is the one the
    model's generation_config.json (else config.json) declares, as transformers' generate
    stops at it."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        model = " (only a SentencePiece tokenizer.model)" if \
            (directory / "tokenizer.model").is_file() else ""
        raise CheckpointError(
            f"{directory} has no tokenizer.json{model}; write one where transformers is "
            "installed: python -c \"from transformers import AutoTokenizer as T; "
            f"T.from_pretrained('{directory}').save_pretrained('{directory}')\"")
    base = Tokenizer.from_file(path)
    own = hf_cfg.get("tinyt", {}).get("tokenizer") if isinstance(hf_cfg.get("tinyt"), dict) \
        else None
    if isinstance(own, dict):  # written by export-hf: tinyt's own settings, exactly
        return Tokenizer(base.hf, **own)
    settings = read_settings(directory)
    gen = {}
    if (directory / "generation_config.json").is_file():
        gen = json.loads((directory / "generation_config.json").read_text(encoding="utf-8"))
    declared = gen.get("eos_token_id", hf_cfg.get("eos_token_id"))
    ids = declared if isinstance(declared, list) else [declared] if declared is not None else []
    named = settings.get("eos_token")
    if ids:  # the tokenizer's own eos if the model declares it, else the model's first
        chosen = named if named is not None and base.hf.token_to_id(named) in ids else \
            _token(base.hf, ids[0])
        if chosen is None:
            raise ConversionError(f"{directory}: eos_token_id {ids[0]} is not in the tokenizer")
        if len(ids) > 1:
            log(f"the model declares {len(ids)} end-of-text ids {ids}; tinyt stops at one, "
                f"{chosen!r} ({base.hf.token_to_id(chosen)})")
        settings["eos_token"] = chosen
    if "bos_token" not in settings and _token(base.hf, hf_cfg.get("bos_token_id")):
        settings["bos_token"] = _token(base.hf, hf_cfg.get("bos_token_id"))
    return Tokenizer(base.hf, **settings)


def special_tokens(tok: Tokenizer) -> dict[str, Any]:
    """tinyt's settings (chat template, end, begin) and a pad and BOS, which CTranslate2 needs:
    the end-of-text token where the model has none of its own."""
    return {**tok.settings, "eos_token": tok.eos_token, "pad_token": tok.eos_token,
            "bos_token": tok.bos_token or tok.eos_token}


def phi3_special_tokens(tok: Tokenizer) -> dict[str, Any]:
    """special_tokens, and GPT2Tokenizer as the class of a byte-level BPE tokenizer (Phi-4-mini's
    own): llama.cpp's converter reads a Phi-3 directory's vocabulary from the SentencePiece
    tokenizer.model (Phi-3-mini's kind, which tinyt does not keep) unless the class is that one.
    transformers' GPT2TokenizerFast reads tokenizer.json as it is (no prefix space, no BOS)."""
    data = tok.to_json_dict()
    pre = data.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    byte_level = (data.get("model") or {}).get("type") == "BPE" and \
        any(p.get("type") == "ByteLevel" for p in parts if isinstance(p, dict))
    return {**special_tokens(tok), **({"tokenizer_class": "GPT2Tokenizer"} if byte_level else {})}


# -- encoders: tokenizer.json as it is (WordPiece, Unigram, BPE), its [CLS] / [SEP] post-processor
def read_encoder_tokenizer(directory: Path, hf_cfg: dict[str, Any],
                           log: Callable[[str], None]) -> Tokenizer:
    """An encoder's tokenizer.json with its own normalizer, pre-tokenizer and post-processor
    (BERT's lower-casing WordPiece, [CLS] ... [SEP]); no end-of-text token: an encoder does
    not generate."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no tokenizer.json (an encoder's vocab.txt alone is not read); "
            "write one where transformers is installed: python -c \"from transformers import "
            f"AutoTokenizer as T; T.from_pretrained('{directory}').save_pretrained("
            f"'{directory}')\"")
    tok = Tokenizer.from_file(path)
    config = directory / "tokenizer_config.json"
    if config.is_file():  # transformers' BERT tokenizers rebuild the normalizer from these
        settings = json.loads(config.read_text(encoding="utf-8"))
        norm = json.loads(tok.hf.to_str()).get("normalizer") or {}
        if norm.get("type") == "BertNormalizer":
            for key, ours in (("do_lower_case", "lowercase"), ("strip_accents", "strip_accents"),
                              ("tokenize_chinese_chars", "handle_chinese_chars")):
                if key in settings and settings[key] is not None \
                        and settings[key] != norm.get(ours):
                    raise ConversionError(
                        f"{config}: {key}={settings[key]!r} but tokenizer.json's normalizer "
                        f"has {ours}={norm.get(ours)!r}; transformers would tokenize with the "
                        "first, tinyt runs tokenizer.json as it is: make them agree")
    return tok


def encoder_special_tokens(tok: Tokenizer) -> dict[str, Any]:
    return dict(tok.settings)


# -- encoder-decoders: the Hub's kind, padded with <pad> -------------------------------------------
# tokenizers transformers keeps in SentencePiece files alone, with no fast (tokenizer.json) form
NO_FAST = {"MarianTokenizer": "source.spm / target.spm", "M2M100Tokenizer":
           "sentencepiece.bpe.model"}


def read_seq2seq_tokenizer(directory: Path, hf_cfg: dict[str, Any],
                           log: Callable[[str], None]) -> Tokenizer:
    """read_tokenizer's tokenizer.json, ending at the model's eos_token_id; its <pad> must be
    config.json's pad_token_id (tinyt's encoder-decoders pad, and Marian's and T5's decoders
    start, at <pad>). A tokenizer transformers has no tokenizer.json form of (Marian's,
    M2M100's) is refused, saying what to bring."""
    if not (directory / "tokenizer.json").is_file():
        kind = _tokenizer_class(directory)
        if kind in NO_FAST or (directory / "source.spm").is_file():
            kind = kind if kind in NO_FAST else "MarianTokenizer"
            raise CheckpointError(
                f"{directory} has {NO_FAST[kind]} and no tokenizer.json: tinyt reads "
                f"tokenizer.json, and transformers' {kind} has no fast form to write one "
                "(AutoTokenizer.save_pretrained writes the SentencePiece files again). Bring a "
                "tokenizer.json of the same pieces and ids (for Marian: source.spm's pieces "
                "with vocab.json's ids) beside config.json")
    tok = read_tokenizer(directory, hf_cfg, log)
    pad = hf_cfg.get("pad_token_id")
    if pad is not None and tok.pad_id != pad:
        raise ConversionError(f"{directory}: config.json's pad_token_id={pad} is not the "
                              f"tokenizer's <pad> ({tok.pad_id}); tinyt's encoder-decoders "
                              "pad with <pad>")
    return tok


def _tokenizer_class(directory: Path) -> str | None:
    try:
        data = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("tokenizer_class") if isinstance(data, dict) else None


def seq2seq_special_tokens(tok: Tokenizer) -> dict[str, Any]:
    """tinyt's settings, the end and the padding <pad> (and <unk> where the vocabulary has it),
    as transformers' tokenizer pads and stops."""
    out = {**tok.settings, "eos_token": tok.eos_token}
    for role, name in (("pad_token", "<pad>"), ("unk_token", "<unk>")):
        if tok.hf.token_to_id(name) is not None:
            out[role] = name
    return out
