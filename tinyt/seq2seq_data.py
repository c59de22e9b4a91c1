"""Parallel data for the encoder-decoder: source -> target pairs (torch-free).

Built in, on every machine with Python: code summarization over the standard library. Each
function or method with a docstring gives one pair, its code with the docstring taken out
(whole lines, cut at SOURCE_CHARS) -> the docstring's first sentence. The split is by file,
with the causal LM corpus' hash of the path (tinyt.data.is_validation): a function is held
out with its whole file, and the same files are held out for both tasks.

A user's own pairs, one documented form each:
- `.tsv`: a line is `source<TAB>target`, both taken literally (no escapes: text that holds
  tabs or newlines goes in a .jsonl file);
- `.jsonl`: a line is a JSON object with string fields "source" and "target" (other keys
  are ignored; "src" / "tgt" and the like are refused by name);
- a directory: code summarization over its .py files, as the built-in task.
Blank lines are skipped. A file's pairs are split by a hash of the source, so a source (and
any duplicate of it) is never on both sides. Exact duplicate pairs are dropped.
"""
from __future__ import annotations

import ast
import collections
import functools
import hashlib
import json
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tinyt import data as D
from tinyt.errors import DataError
from tinyt.fsutil import write_json

SOURCE_CHARS = 600  # a function's code is cut at the line end that passes this many chars
TARGET_CHARS = 160  # a longer first sentence is left out: a summary, not a paragraph
MIN_TARGET_WORDS = 2
# Periods that do not end a sentence ("e.g. a file." is one sentence).
_ABBREVIATIONS = {"e.g", "i.e", "eg", "ie", "(e.g", "(i.e", "(eg", "(ie", "etc", "vs", "cf",
                  "approx", "resp"}
_SIGNATURE = re.compile(r"[\w.]+\(")  # "S.find(sub[, start]) -> int": a signature, not prose
FORMS = ("a .tsv file (source<TAB>target a line)",
         'a .jsonl file ({"source": ..., "target": ...} a line)',
         "a directory of .py files (code summarization, as the built-in data)")


@dataclass(frozen=True)
class ParallelData:
    """Source -> target pairs split into train and validation."""

    source: str  # where they came from, for the log
    train: list[tuple[str, str]]
    val: list[tuple[str, str]]

    def describe(self) -> str:
        return f"{self.source}: {len(self.train)} train pairs, {len(self.val)} validation pairs"


def first_sentence(doc: str) -> str | None:
    """The first sentence of a docstring's first paragraph, on one line; None where it is
    not a short prose summary (too long, one word, or a signature like `f(x) -> y`)."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    text = paragraph
    for m in re.finditer(r"[.!?](?=\s|$)", paragraph):
        words = paragraph[:m.start()].split()
        if words and words[-1].lower() in _ABBREVIATIONS:
            continue
        text = paragraph[:m.end()]
        break
    if (len(text) > TARGET_CHARS or len(text.split()) < MIN_TARGET_WORDS or "->" in text
            or _SIGNATURE.match(text)):
        return None
    return text


def _cut(lines: list[str], limit: int) -> str:
    """Whole lines up to the one that passes `limit` characters (the first line always)."""
    out, size = [], 0
    for line in lines:
        out.append(line)
        size += len(line) + 1
        if size >= limit:
            break
    return "\n".join(out).rstrip()


def function_pairs(text: str) -> list[tuple[str, str]]:
    """(code without its docstring, the docstring's first sentence) for each function and
    method of a module's source that has a docstring and a body beyond it."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []  # not Python 3 (a template, a test's bad input): nothing to learn from
    lines = text.splitlines()
    pairs = []
    for node in _functions(tree):
        doc = ast.get_docstring(node)
        if not doc or len(node.body) < 2:
            continue
        target = first_sentence(doc)
        expr = node.body[0]
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        if target is None or expr.lineno <= node.lineno or expr.end_lineno is None \
                or node.end_lineno is None:
            continue  # a docstring on the def's own line cannot be cut out by lines
        code = lines[first - 1:expr.lineno - 1] + lines[expr.end_lineno:node.end_lineno]
        source = _cut(textwrap.dedent("\n".join(code)).splitlines(), SOURCE_CHARS)
        pairs.append((source, target))
    return pairs


_HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)


def _functions(tree: ast.AST):
    """The functions and methods of a module in ast.walk's order (breadth first), without
    entering expressions, which hold no statements (the walk then visits ~1 node in 8)."""
    queue = collections.deque([tree])
    while queue:
        node = queue.popleft()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        queue.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, _HOLDS_STATEMENTS))


def _code_pairs(root: Path, pattern: str, skip: set[str], source: str) -> ParallelData:
    """Code summarization over a tree of .py files, deduplicated by source (the first
    occurrence in path order is kept) and split by file: tinyt.data's hash of the path, or
    the last file when the hash holds out none or all."""
    seen: set[str] = set()
    files = []  # (path relative to root, its pairs)
    for f in D._walk(root, pattern, skip):
        text = D._read_text(f)
        kept = []
        for src, tgt in function_pairs(text or ""):
            if src not in seen:
                seen.add(src)
                kept.append((src, tgt))
        if kept:
            files.append((f.relative_to(root).as_posix(), kept))
    held = {name for name, _ in files if D.is_validation(name)}
    if len(files) >= 2 and (not held or len(held) == len(files)):
        held = {files[-1][0]}
    train = [p for name, pairs in files if name not in held for p in pairs]
    val = [p for name, pairs in files if name in held for p in pairs]
    if not train or not val:
        raise DataError(f"{source} gives {len(train)} train and {len(val)} validation pairs "
                        f"from {len(files)} file(s) (functions with a docstring and a body); "
                        "it needs two files with such functions at least, or pass a .tsv / "
                        ".jsonl file of pairs")
    return ParallelData(source, train, val)


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a UTF-8 file's non-blank lines (a BOM and CRLF endings read)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise DataError(f"{path} cannot be read: {e}") from None
    return [(i, line.rstrip("\r")) for i, line in enumerate(text.split("\n"), 1)
            if line.strip()]


def read_tsv(path: Path) -> list[tuple[str, str]]:
    """The pairs of a `source<TAB>target` file."""
    pairs = []
    for n, line in _lines(path):
        tabs = line.count("\t")
        if tabs != 1:
            raise DataError(f"{path} line {n} has {tabs} tabs; each line is source<TAB>target "
                            "with exactly one tab (text with tabs or newlines: use .jsonl)")
        src, tgt = line.split("\t")
        for side, value in (("source", src), ("target", tgt)):
            if not value.strip():
                raise DataError(f"{path} line {n} has an empty {side}; each line is "
                                "source<TAB>target, both non-empty")
        pairs.append((src, tgt))
    return pairs


def read_jsonl(path: Path) -> list[tuple[str, str]]:
    """The pairs of a file of {"source": ..., "target": ...} lines."""
    pairs = []
    for n, line in _lines(path):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {n} is not JSON ({e.msg}, column {e.colno}); each "
                            'line is an object {"source": ..., "target": ...}') from None
        if not isinstance(obj, dict):
            raise DataError(f"{path} line {n} is a JSON {type(obj).__name__}, not an object; "
                            'each line is {"source": ..., "target": ...}')
        missing = [k for k in ("source", "target") if k not in obj]
        if missing:
            raise DataError(f"{path} line {n} has keys {sorted(obj)} but no {missing}; each "
                            'line needs string fields "source" and "target"')
        for key in ("source", "target"):
            if not isinstance(obj[key], str) or not obj[key].strip():
                raise DataError(f"{path} line {n}: {key!r} is {obj[key]!r}; it must be a "
                                "non-empty string")
        pairs.append((obj["source"], obj["target"]))
    return pairs


def split_pairs(source: str, pairs: list[tuple[str, str]]) -> ParallelData:
    """Exact duplicates dropped, then held out by a hash of the source (VAL_PERCENT of
    them; the last source when none hashes there, the rest train when all do)."""
    pairs = list(dict.fromkeys(pairs))
    if len({s for s, _ in pairs}) < 2:
        raise DataError(f"{source} holds {len(pairs)} distinct pair(s) with "
                        f"{len({s for s, _ in pairs})} source(s); at least 2 sources are "
                        "needed, one to train on and one to validate")
    held = {s for s, _ in pairs if D.is_validation(s)}
    if not held or len(held) == len({s for s, _ in pairs}):
        held = {pairs[-1][0]}
    return ParallelData(source, [p for p in pairs if p[0] not in held],
                        [p for p in pairs if p[0] in held])


@functools.lru_cache(maxsize=1)
def _stdlib_pairs(root: Path) -> ParallelData:
    """The built-in pairs: parsing the library's ~600 files takes 5-10 s, and the training,
    each quantization's report and the peers' check all read them, so they are read once a
    process and kept on disk (cache_dir(), JSON) under a key of what they are made from: the
    files' paths, sizes and modification times, and the code that extracts them."""
    files = D._walk(root, "*.py", D._SKIP_DIRS)
    key = hashlib.sha256(Path(__file__).read_bytes() + Path(D.__file__).read_bytes())
    for f in files:
        st = f.stat()
        key.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    cache = cache_dir() / f"stdlib-pairs-{key.hexdigest()[:24]}.json"
    try:
        kept = json.loads(cache.read_text(encoding="utf-8"))
        return ParallelData(kept["source"], [(s, t) for s, t in kept["train"]],
                            [(s, t) for s, t in kept["val"]])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: made again
    made = _code_pairs(root, "*.py", D._SKIP_DIRS,
                       f"Python standard library functions -> docstrings ({root})")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache, {"source": made.source, "train": made.train, "val": made.val})
    except OSError:
        pass  # a read-only home: read again next time
    return made


def cache_dir() -> Path:
    """Where tinyt keeps what it derives from files that rarely change: $TINYT_CACHE, else
    $XDG_CACHE_HOME/tinyt, else ~/.cache/tinyt."""
    if os.environ.get("TINYT_CACHE"):
        return Path(os.environ["TINYT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tinyt"


def load_pairs(data: str | os.PathLike | None = None) -> ParallelData:
    """The built-in standard-library pairs (data=None), or a user's .tsv, .jsonl or
    directory of .py files."""
    if data is None:
        built_in = _stdlib_pairs(D.stdlib_dir())
        return ParallelData(built_in.source, list(built_in.train), list(built_in.val))
    path = Path(data)
    if not path.exists():
        raise DataError(f"seq2seq data {path} does not exist; pass {', '.join(FORMS)}")
    if path.is_dir():
        return _code_pairs(path, "*.py", set(), f"{path} functions -> docstrings")
    readers = {".tsv": read_tsv, ".jsonl": read_jsonl}
    if path.suffix.lower() not in readers:
        raise DataError(f"seq2seq data {path} has suffix {path.suffix or '(none)'!r}; "
                        f"allowed: {', '.join(FORMS)}")
    pairs = readers[path.suffix.lower()](path)
    if not pairs:
        raise DataError(f"{path} holds no pairs (it is empty or blank); pass "
                        f"{', '.join(FORMS)}")
    return split_pairs(str(path), pairs)


def encode_sides(tokenizer, texts: list[str], limit: int) -> list[list[int]]:
    """Sources' or targets' ids, each cut to limit - 1 tokens, then <|endoftext|> (Marian
    ends both sides with its EOS)."""
    if tokenizer.eos_id is None:
        raise DataError("the tokenizer has no <|endoftext|> token to end a source or target")
    return [ids[:limit - 1] + [tokenizer.eos_id] for ids in tokenizer.encode_batch(texts)]


def output_text(tokenizer, ids: list[int]) -> str:
    """The text of a generated row (the decoder's start first): the start dropped, cut at the
    first <|endoftext|>."""
    ids = ids[1:]
    if tokenizer.eos_id in ids:
        ids = ids[:ids.index(tokenizer.eos_id)]
    return tokenizer.decode(ids)
