"""Corpora and data sets (torch-free).

Default corpus: the Python standard library's own source, found at run time through
`sysconfig`, so every machine with Python has it. Train/validation split is by file, decided
by a hash of the file's relative path: deterministic, and stable when files come and go.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyt.errors import DataError

VAL_PERCENT = 5
# Left out of the default corpus: third-party code, test suites (much of it odd data rather
# than code) and the codec tables in encodings/.
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "encodings",
              "__pycache__"}
# The classification task: which standard-library package a snippet comes from.
CLASSIFIER_PACKAGES = ("asyncio", "email", "multiprocessing", "tkinter", "unittest", "xml")
SNIPPET_CHARS = 320  # a snippet is whole lines adding up to at least this many characters
MAX_SNIPPETS_PER_FILE = 40


@dataclass(frozen=True)
class Corpus:
    """Texts of a corpus split by file; `names` are the files' relative paths."""

    source: str
    train: list[str]
    val: list[str]
    train_names: list[str]
    val_names: list[str]

    def describe(self) -> str:
        chars = sum(map(len, self.train)), sum(map(len, self.val))
        return (f"{self.source}: {len(self.train)} train files ({chars[0]:,} chars), "
                f"{len(self.val)} validation files ({chars[1]:,} chars)")


def stdlib_dir() -> Path:
    """The standard library's source directory, or a DataError saying why it is unusable."""
    path = Path(sysconfig.get_paths()["stdlib"])
    if not path.is_dir() or not (path / "os.py").is_file():
        raise DataError(
            f"the Python standard library source was not found at {path} (sysconfig 'stdlib'); "
            "this Python ships without .py sources. Pass --data PATH with your own text corpus."
        )
    return path


def is_validation(name: str) -> bool:
    digest = hashlib.sha1(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < VAL_PERCENT


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary or unreadable: not part of a text corpus


def _walk(root: Path, pattern: str, skip_dirs: set[str]) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and not d.startswith("."))
        for f in sorted(filenames):
            if not f.startswith(".") and Path(f).match(pattern):
                out.append(Path(dirpath) / f)
    return out


def _split(source: str, named: list[tuple[str, str]]) -> Corpus:
    named = [(n, t) for n, t in named if t.strip()]
    if not named:
        raise DataError(f"corpus {source} holds no non-empty UTF-8 text")
    if len(named) == 1:  # one document: its last tenth, cut at a line break, validates
        name, text = named[0]
        cut = text.rfind("\n", 0, int(len(text) * 0.9)) + 1 or int(len(text) * 0.9)
        if cut <= 0 or cut >= len(text):
            raise DataError(f"corpus {source} is too small to split into train and validation")
        return Corpus(source, [text[:cut]], [text[cut:]], [name], [name + "#val"])
    val = [(n, t) for n, t in named if is_validation(n)]
    if not val:  # few files: hold out the last one
        val = [named[-1]]
    if len(val) == len(named):
        val = val[:1]
    val_names = {n for n, _ in val}
    train = [(n, t) for n, t in named if n not in val_names]
    return Corpus(source, [t for _, t in train], [t for _, t in val],
                  [n for n, _ in train], [n for n, _ in val])


def load_corpus(data: str | os.PathLike | None = None) -> Corpus:
    """The default stdlib corpus (data=None), or a user's text file or directory of them."""
    if data is None:
        root = stdlib_dir()
        files = _walk(root, "*.py", _SKIP_DIRS)
        source = f"Python standard library ({root})"
    else:
        root = Path(data)
        if not root.exists():
            raise DataError(f"corpus path {root} does not exist; pass a text file or a directory")
        files = [root] if root.is_file() else _walk(root, "*", set())
        source = str(root)
    named = []
    for f in files:
        text = _read_text(f)
        if text is not None:
            named.append((f.name if f == root else f.relative_to(root).as_posix(), text))
    if not named:
        raise DataError(f"corpus {source} holds no readable UTF-8 text files")
    return _split(source, named)


def encode_documents(tokenizer, texts: list[str]) -> np.ndarray:
    """One flat token stream: each document followed by <|endoftext|> (uint32)."""
    if tokenizer.eos_id is None:
        raise DataError("the tokenizer has no <|endoftext|> token to separate documents")
    parts = []
    for ids in tokenizer.encode_batch(texts):
        parts.append(np.asarray(ids, dtype=np.uint32))
        parts.append(np.asarray([tokenizer.eos_id], dtype=np.uint32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)


def lm_batch(tokens: np.ndarray, block_size: int, batch_size: int, seed: int, step: int):
    """Random windows for step `step`: a pure function of (seed, step), so resuming a run or
    splitting a batch across ranks sees exactly the batches a single straight run sees."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - block_size - 1, size=batch_size)
    x = np.stack([tokens[s : s + block_size] for s in starts]).astype(np.int64)
    y = np.stack([tokens[s + 1 : s + 1 + block_size] for s in starts]).astype(np.int64)
    return x, y  # (B, T), (B, T)


def lm_eval_windows(tokens: np.ndarray, block_size: int, count: int, *,
                    start: int | None = None):
    """`count` fixed windows spread evenly over `tokens` (the same every evaluation).
    start: an id each window begins with (Tokenizer.start_id: the BOS that began every
    sequence a model like Gemma was trained on, without which its first positions are not
    the model's); block_size - 1 tokens of the stream follow it, and every target is still a
    token of the stream (the first is predicted from the BOS alone)."""
    span = len(tokens) - block_size - 1
    starts = np.linspace(0, span, num=count).astype(np.int64)
    if start is None:
        x = np.stack([tokens[s : s + block_size] for s in starts]).astype(np.int64)
        y = np.stack([tokens[s + 1 : s + 1 + block_size] for s in starts]).astype(np.int64)
        return x, y
    body = np.stack([tokens[s : s + block_size] for s in starts]).astype(np.int64)
    x = np.concatenate([np.full((count, 1), start, np.int64), body[:, :-1]], axis=1)
    return x, body  # (count, block_size) each


def held_out_prompts(tokenizer, texts: list[str], count: int, length: int, *,
                     minimum: int | None = None) -> list[list[int]]:
    """`count` prompts of `length` tokens from held-out `texts` (the validation split), each
    from inside one document (no <|endoftext|> within it), spread evenly over them: the same
    prompts every time for the same texts and tokenizer. With `minimum`, a smaller text gives
    fewer prompts (at least that many) instead of an error."""
    windows = []
    for ids in tokenizer.encode_batch(texts):
        windows += [ids[s : s + length] for s in range(0, len(ids) - length + 1, length)]
    count = min(count, max(len(windows), minimum or count))
    if len(windows) < count:
        raise DataError(f"the held-out text gives {len(windows)} windows of {length} tokens; "
                        f"{count} were asked for: use a larger corpus or shorter prompts")
    picks = np.linspace(0, len(windows) - 1, num=count).astype(np.int64)
    return [list(map(int, windows[i])) for i in picks]


# Greedy agreement, one definition for the accuracy report (export/accuracy.py) and the peer
# benchmark (benchmarks/peers/): AGREEMENT_PROMPTS prompts of AGREEMENT_PROMPT_TOKENS tokens
# cut from the held-out split, AGREEMENT_TOKENS new tokens each (each prompt's tokens as if
# alone: batched only through graphs whose rows are independent), compared position by
# position with the reference's tokens.
AGREEMENT_PROMPTS = 32
AGREEMENT_PROMPT_TOKENS = 32
AGREEMENT_TOKENS = 64


def agreement_prompts(tokenizer, texts: list[str], block_size: int,
                      count: int = AGREEMENT_PROMPTS) -> tuple[list[list[int]], int]:
    """The greedy-agreement prompts for a model of `block_size`, and how many tokens to make
    after each (prompt and new tokens fit the context)."""
    length = min(AGREEMENT_PROMPT_TOKENS, block_size // 4)
    steps = min(AGREEMENT_TOKENS, block_size - length - 1)
    prompts = held_out_prompts(tokenizer, texts, count, length, minimum=1)
    start = tokenizer.start_id  # each begins as the runtime begins a prompt (encode_prompt)
    if start is not None:
        prompts = [[start, *p[:-1]] for p in prompts]
    return prompts, steps


def check_lm_tokens(tokens: np.ndarray, block_size: int, split: str) -> None:
    if len(tokens) < block_size + 2:
        raise DataError(
            f"the {split} split has {len(tokens)} tokens, fewer than block_size + 2 = "
            f"{block_size + 2}; use a larger corpus or a smaller block_size"
        )


# -- classification ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ClassificationData:
    labels: list[str]
    train: list[tuple[str, int]]  # (text, label index)
    val: list[tuple[str, int]]


def snippets(text: str) -> list[str]:
    """Whole-line chunks of at least SNIPPET_CHARS characters (blank-only chunks dropped)."""
    out, cur, size = [], [], 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        size += len(line)
        if size >= SNIPPET_CHARS:
            chunk = "".join(cur)
            if chunk.strip():
                out.append(chunk)
            cur, size = [], 0
            if len(out) >= MAX_SNIPPETS_PER_FILE:
                break
    return out


def _label_dirs(data: str | os.PathLike | None) -> tuple[Path, list[str]]:
    if data is None:
        root = stdlib_dir()
        labels = [p for p in CLASSIFIER_PACKAGES if (root / p).is_dir()]
    else:
        root = Path(data)
        if not root.is_dir():
            raise DataError(
                f"classification data {root} must be a directory with one subdirectory per label"
            )
        labels = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(labels) < 2:
        raise DataError(f"classification data {root} has {len(labels)} label(s); it needs >= 2 "
                        "subdirectories, one per label")
    return root, labels


def classification_labels(data: str | os.PathLike | None = None) -> list[str]:
    """The label names of a classification data set, without reading its files."""
    return _label_dirs(data)[1]


def load_classification(data: str | os.PathLike | None = None) -> ClassificationData:
    """Snippet-to-package data from the stdlib (data=None), or from a directory whose
    subdirectories are the labels, each holding that label's text files."""
    root, labels = _label_dirs(data)
    pattern, skip = ("*.py", _SKIP_DIRS) if data is None else ("*", set())
    train, val = [], []
    for index, label in enumerate(labels):
        files = _walk(root / label, pattern, skip)
        named = [(f.relative_to(root).as_posix(), _read_text(f)) for f in files]
        named = [(n, t) for n, t in named if t]
        if not named:
            raise DataError(f"label {label!r} in {root} has no readable UTF-8 text files")
        split = _split(f"{root / label}", named)
        train += [(s, index) for t in split.train for s in snippets(t)]
        val += [(s, index) for t in split.val for s in snippets(t)]
    if not train or not val:
        raise DataError(f"classification data {root} yields no snippets for training or validation")
    return ClassificationData(labels, train, val)
