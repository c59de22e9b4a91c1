"""What a caller of generate passes, checked before anything runs (torch-free): a prompt's
text, rows of token ids, and the sampling keywords; each refusal a ConfigError (a ValueError)
that names the bad value and what is allowed."""
from __future__ import annotations

import numpy as np

from tinyt.errors import ConfigError

from .sampling import SamplingParams


def prompt_text(prompt) -> str:
    """A prompt (str or UTF-8 bytes) as non-empty, encodable text; ConfigError if it is not."""
    if isinstance(prompt, bytes):
        try:
            prompt = prompt.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"prompt bytes are not valid UTF-8 ({e}); pass str or UTF-8 "
                              "bytes") from None
    if not isinstance(prompt, str):
        raise ConfigError(f"prompt must be str or UTF-8 bytes, not {type(prompt).__name__}")
    if not prompt:
        raise ConfigError("prompt is empty; give at least one character")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"prompt is not valid Unicode text ({e.reason} at {e.start})") \
            from None
    return prompt


def token_rows(token_ids, *, vocab_size: int, context: int, pinned_batch: int | None = None,
               room: int = 1) -> list[list[int]]:
    """Prompt rows as lists of ints (from a list of ints, a list of rows or a 1-D / 2-D
    array), each inside the vocabulary and leaving room for `room` new tokens in the
    context (0: a text scored whole), at most `pinned_batch` of them where a graph is pinned
    to that batch size; ConfigError naming the row and the limit otherwise."""
    rows = token_ids.tolist() if isinstance(token_ids, np.ndarray) else token_ids
    if isinstance(token_ids, np.ndarray) and (
            token_ids.ndim not in (1, 2) or not np.issubdtype(token_ids.dtype, np.integer)):
        raise ConfigError(f"token ids must be a 1-D or 2-D integer array, got "
                          f"{token_ids.ndim}-D {token_ids.dtype}")
    if isinstance(rows, (list, tuple)) and rows and all(_is_int(t) for t in rows):
        rows = [rows]
    if not (isinstance(rows, (list, tuple)) and rows and all(
            isinstance(r, (list, tuple)) and r and all(_is_int(t) for t in r) for r in rows)):
        raise ConfigError("token ids must be a non-empty list of ints, or a list of "
                          "non-empty lists of ints")
    V, block = vocab_size, context
    if pinned_batch is not None and len(rows) > pinned_batch:
        raise ConfigError(f"{len(rows)} prompts, but this graph is pinned to batch_size "
                          f"{pinned_batch}; give at most that many")
    for i, row in enumerate(rows):
        bad = [int(t) for t in row if not 0 <= t < V]
        if bad:
            raise ConfigError(f"token ids {bad[:5]} (row {i}) are outside the vocabulary "
                              f"0..{V - 1}")
        if len(row) > block - room:
            raise ConfigError(f"prompt {i} is {len(row)} tokens; this model reads at most "
                              f"{block - room} (its context {block}" + (
                                  ", less one so that a token can follow)" if room == 1
                                  else f", less {room} new tokens)" if room else ")"))
    return [[int(t) for t in row] for row in rows]


def sampling_kwargs(kwargs: dict) -> dict:
    """generate's keywords as SamplingParams' (a stop string or list as a tuple); ConfigError
    naming any that is not one of its fields."""
    if isinstance(kwargs.get("stop"), str):
        kwargs = {**kwargs, "stop": (kwargs["stop"],)}
    elif isinstance(kwargs.get("stop"), list):
        kwargs = {**kwargs, "stop": tuple(kwargs["stop"])}
    unknown = set(kwargs) - set(SamplingParams.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown generation argument(s) {sorted(unknown)}; allowed: "
                          f"{sorted(SamplingParams.__dataclass_fields__)}")
    return kwargs


def _is_int(t) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, bool)
