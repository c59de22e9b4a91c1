"""Whisper's special tokens and generation settings (torch-free): read from a Hugging Face
directory at import, checked against each other, kept in the checkpoint (speech.json) and
written back by export-hf as they came.

    tokenizer.json's added tokens   <|endoftext|> <|startoftranscript|> <|en|> ... <|translate|>
                                    <|transcribe|> <|startoflm|> <|startofprev|> <|nocaptions|>
                                    <|notimestamps|> <|0.00|> ... <|30.00|> (every 0.02 s)
        ──speech_tokens──▶ {"start", "languages": {code: id}, "tasks", "no_timestamps",
                            "timestamp_begin", "timestamps", "previous", "end"}
    generation_config.json          suppress_tokens, begin_suppress_tokens, forced_decoder_ids,
                                    lang_to_id, task_to_id, no_timestamps_token_id,
                                    alignment_heads, ... : kept whole, each id checked
    config.json                     its own begin_suppress_tokens, suppress_tokens,
                                    forced_decoder_ids (older saves'): kept as they are

A language code's id, a task's, the no-timestamps id and the first timestamp must be the
tokenizer's: a generation config of another tokenizer is refused by name, never generated from.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tinyt.contract import SPEECH_FILE  # in a checkpoint and an artifact (re-exported)
from tinyt.errors import ConversionError
from tinyt.fsutil import read_json_object

CONFIG_KEYS = ("begin_suppress_tokens", "suppress_tokens", "forced_decoder_ids")
TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|>, every 0.02 s
LANGUAGE = re.compile(r"<\|([a-z]{2,3}|haw)\|>")
NAMED = {"start": "<|startoftranscript|>", "end": "<|endoftext|>",
         "no_timestamps": "<|notimestamps|>", "previous": "<|startofprev|>",
         "start_lm": "<|startoflm|>", "no_speech": "<|nocaptions|>"}


def speech_tokens(tok) -> dict[str, Any]:
    """Whisper's special tokens' ids from the tokenizer: the named ones, the languages (the
    ids between <|startoftranscript|> and the first task token, in order), the tasks, and
    the 1,501 timestamps, which must follow <|notimestamps|> in order (a tokenizer.json
    saved before they were added tokens has none: timestamps 0)."""
    ids = {name: tok.hf.token_to_id(text) for name, text in NAMED.items()}
    missing = [NAMED[n] for n in ("start", "end", "no_timestamps") if ids[n] is None]
    if missing:
        raise ConversionError(f"the tokenizer has no {', '.join(missing)}: not Whisper's "
                              "(tokenizer.json's added tokens name them)")
    tasks = {t: i for t in ("transcribe", "translate")
             if (i := tok.hf.token_to_id(f"<|{t}|>")) is not None}
    languages: dict[str, int] = {}
    for i in range(ids["start"] + 1, min(tasks.values(), default=ids["start"] + 1)):
        m = LANGUAGE.fullmatch(tok.hf.id_to_token(i) or "")
        if m is None:
            raise ConversionError(f"the tokenizer's id {i} ({tok.hf.id_to_token(i)!r}) lies "
                                  "among Whisper's languages but is not a language token")
        languages[m.group(1)] = i
    begin = ids["no_timestamps"] + 1
    count = TIMESTAMPS if tok.hf.token_to_id("<|0.00|>") is not None else 0  # older files
    for k in range(count):
        want = f"<|{k * 0.02:.2f}|>"
        if tok.hf.token_to_id(want) != begin + k:
            raise ConversionError(f"the tokenizer's {want} is id {tok.hf.token_to_id(want)}, "
                                  f"not {begin + k}: Whisper's 1,501 timestamps follow "
                                  "<|notimestamps|> in order")
    return {**{n: i for n, i in ids.items() if i is not None}, "languages": languages,
            "tasks": tasks, "timestamp_begin": begin, "timestamps": count}


def _ids(value: Any, key: str, vocab: int) -> None:
    flat = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab
               for i in flat):
        raise ConversionError(f"generation_config.json's {key}={value!r}: each must be a "
                              f"token id in 0..{vocab - 1}")


def check_generation(gen: dict[str, Any], tokens: dict[str, Any], cfg) -> None:
    """Each id of Whisper's generation_config.json against the tokenizer and the model: the
    language and task tables, the no-timestamps id, the suppressed ids, the forced ids, the
    alignment heads (decoder layer, head)."""
    for key in ("suppress_tokens", "begin_suppress_tokens"):
        if gen.get(key) is not None:
            _ids(gen[key], key, cfg.vocab_size)
    for key, want in (("decoder_start_token_id", cfg.decoder_start_id),
                      ("no_timestamps_token_id", tokens["no_timestamps"]),
                      ("prev_sot_token_id", tokens.get("previous"))):
        if gen.get(key) is not None and gen[key] != want:
            raise ConversionError(f"generation_config.json's {key}={gen[key]!r}, but the "
                                  f"model's is {want}")
    for key, table, spell in (("lang_to_id", tokens["languages"], "<|{}|>"),
                              ("task_to_id", tokens["tasks"], "<|{}|>")):
        given = gen.get(key) or {}
        ours = {spell.format(k) if key == "lang_to_id" else k: v for k, v in table.items()}
        wrong = {k: v for k, v in given.items() if ours.get(k) != v}
        if wrong:
            raise ConversionError(f"generation_config.json's {key} {wrong} are not the "
                                  f"tokenizer's ids ({ {k: ours.get(k) for k in wrong} })")
    for pair in gen.get("forced_decoder_ids") or []:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int)):
            raise ConversionError(f"generation_config.json's forced_decoder_ids has {pair!r}: "
                                  "each must be [position, id or null]")
        if pair[1] is not None:
            _ids(pair[1], "forced_decoder_ids", cfg.vocab_size)
    for head in gen.get("alignment_heads") or []:
        if not (isinstance(head, list) and len(head) == 2
                and all(isinstance(v, int) for v in head)
                and 0 <= head[0] < cfg.decoder_layers and 0 <= head[1] < cfg.n_head):
            raise ConversionError(f"generation_config.json's alignment_heads has {head!r}: "
                                  f"each is [decoder layer < {cfg.decoder_layers}, head < "
                                  f"{cfg.n_head}]")


def read_speech(directory: Path, hf_cfg: dict[str, Any], tok, cfg) -> dict[str, Any]:
    """What a Whisper checkpoint keeps beside its weights (SPEECH_FILE): the special tokens'
    ids, generation_config.json whole ({} without one) and config.json's generation keys."""
    tokens = speech_tokens(tok)
    path = Path(directory) / "generation_config.json"
    gen: dict[str, Any] = {}
    if path.is_file():
        gen = read_json_object(path, ConversionError)
        check_generation(gen, tokens, cfg)
    return {"tokens": tokens, "generation_config": gen,
            "config": {k: hf_cfg[k] for k in CONFIG_KEYS if k in hf_cfg}}


def load_speech(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    """A checkpoint's SPEECH_FILE, or None where it has none (not a speech model)."""
    path = Path(checkpoint_dir) / SPEECH_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
