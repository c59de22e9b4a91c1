"""What structured output costs (runtime/constrain.py on llguidance): building a vocabulary,
compiling a schema, and the mask per token at batch rows, on the tiny model's vocabulary size
and GPT-2's; with --xgrammar, the same for xgrammar (the library compared against it: `pip
install xgrammar` first, which requires torch and transformers).

    .venv/bin/python -m lab.constrain_cost [--vocab 320 50257] [--tokenizer PATH ...]
                                              [--rows 8] [--steps 200] [--xgrammar]

Vocabularies: byte-level BPE trained on the Python standard library's sources (the corpus
every machine has; 50,257 tokens take ~2.5 min to train once, then are kept under --cache),
and any tokenizer.json given. Schemas: a small object (bounded strings, an integer range, an
enum list), a recursive one, a 2,000-value enum. The mask's cost: `rows` sequences, each
under its own constraint, sampled at temperature 1 from random logits (a near-uniform model:
every allowed token is reached), a finished row starting again; per step, the time of mask()
for every row plus accept() of its token — what LanguageModel._choose adds to a token.
Every finished reply is parsed and validated (jsonschema where installed).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from tinyt.tokenizer import EOS_TOKEN, Tokenizer, bytes_to_unicode

SMALL = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
         "properties": {"name": {"type": "string", "maxLength": 20},
                        "age": {"type": "integer", "minimum": 0, "maximum": 150},
                        "tags": {"type": "array", "maxItems": 5,
                                 "items": {"enum": ["red", "green", "blue"]}}}}
RECURSIVE = {"$defs": {"node": {"type": "object", "additionalProperties": False,
                                "required": ["value", "children"],
                                "properties": {"value": {"type": "integer", "minimum": -99,
                                                         "maximum": 99},
                                               "children": {"type": "array", "maxItems": 2,
                                                            "items": {"$ref": "#/$defs/node"}}}}},
             "$ref": "#/$defs/node"}
ENUM = {"type": "object", "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"enum": [f"city-{i:04d}" for i in range(2000)]}}}
SCHEMAS = {"small object": SMALL, "recursive": RECURSIVE, "2,000-value enum": ENUM}


def synthetic_tokenizer(vocab: int) -> Tokenizer:
    """A byte-level BPE of exactly `vocab` tokens in a second, without training: the 256
    bytes, then merges of two printable ASCII characters, then of those with a third, then
    <|endoftext|> (the tests' GPT-2-sized vocabulary)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    table = bytes_to_unicode()
    chars = [table[b] for b in range(32, 127)]  # printable ASCII as byte-level characters
    tokens = {table[b]: b for b in range(256)}
    merges: list[tuple[str, str]] = []
    pairs = [(a, b) for a in chars for b in chars]
    triples = ((a + b, c) for a, b in pairs for c in chars)
    for left, right in (*pairs, *triples):
        if len(tokens) >= vocab - 1:
            break
        tokens[left + right] = len(tokens)
        merges.append((left, right))
    hf = HFTokenizer(models.BPE(vocab=tokens, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([EOS_TOKEN])
    return Tokenizer(hf)


def stdlib_tokenizer(vocab: int, cache: Path) -> Tokenizer:
    """Byte-level BPE of `vocab` tokens trained on the standard library's .py files (kept at
    cache/stdlib-bpe-VOCAB.json)."""
    path = cache / f"stdlib-bpe-{vocab}.json"
    if not path.is_file():
        lib = Path(sysconfig.get_paths()["stdlib"])
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(lib.rglob("*.py"))]
        cache.mkdir(parents=True, exist_ok=True)
        Tokenizer.train_bpe(texts, vocab).save(path)
    return Tokenizer.from_file(path)


def valid(text: str, schema: dict) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:
        return True
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


class Llguidance:
    """tinyt's own constraints (runtime/constrain.py)."""
    name = "llguidance"

    def __init__(self, tok: Tokenizer):
        from tinyt.runtime.constrain import Constrainer
        self.con = Constrainer(tok)  # not Constrainer.of: built (and timed) every run
        self.n = 0

    def compile(self, schema: dict):
        self.n += 1  # a new description: a new grammar text, so nothing comes from the cache
        return self.con.json_schema({**schema, "description": f"run {self.n}"})

    @staticmethod
    def row(grammar):
        return grammar.constraint()


class Xgrammar:
    """xgrammar's matcher behind the same mask / accept / finished (needs torch)."""
    name = "xgrammar"

    def __init__(self, tok: Tokenizer):
        import xgrammar as xgr
        self.xgr, self.vocab, self.eos = xgr, tok.vocab_size, tok.eos_id
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tok.hf.to_str())
        info = xgr.TokenizerInfo([tok.hf.id_to_token(i) for i in range(tok.vocab_size)],
                                 meta["vocab_type"], vocab_size=tok.vocab_size,
                                 stop_token_ids=[tok.eos_id],
                                 add_prefix_space=meta["add_prefix_space"])
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def row(self, grammar):
        xgr, vocab = self.xgr, self.vocab

        class Row:
            matcher = xgr.GrammarMatcher(grammar)
            bits = xgr.allocate_token_bitmask(1, vocab)
            error = None

            def mask(self, logits):
                self.matcher.fill_next_token_bitmask(self.bits, 0)
                allowed = np.unpackbits(self.bits.numpy()[0].view(np.uint8), count=vocab,
                                        bitorder="little").view(bool)
                logits[~allowed] = -np.inf

            def accept(self, token):
                assert self.matcher.accept_token(token)

            @property
            def finished(self):
                return self.matcher.is_terminated()
        return Row()


def measure(lib, tok: Tokenizer, schema: dict, rows: int, steps: int, seed: int = 0) -> dict:
    """Compile time (median of 5) and the mask's cost over `steps` steps of `rows` rows."""
    times = []
    for _ in range(5):
        t = time.perf_counter()
        grammar = lib.compile(schema)
        times.append(time.perf_counter() - t)
    rng = np.random.default_rng(seed)
    V, eos = tok.vocab_size, tok.eos_id
    live = [lib.row(grammar) for _ in range(rows)]
    outs: list[list[int]] = [[] for _ in range(rows)]
    step_times, tokens, replies, good = [], 0, 0, 0
    for _ in range(steps):
        logits = rng.standard_normal((rows, V)).astype(np.float32) * 2
        draws = rng.random(rows)
        spent = 0.0
        for r in range(rows):
            t = time.perf_counter()
            live[r].mask(logits[r])
            spent += time.perf_counter() - t
            p = np.exp(logits[r] - logits[r].max())
            tok_id = min(int(np.searchsorted(np.cumsum(p / p.sum()), draws[r])), V - 1)
            if tok_id != eos:
                t = time.perf_counter()
                live[r].accept(tok_id)
                spent += time.perf_counter() - t
                outs[r].append(tok_id)
                tokens += 1
            if tok_id == eos or live[r].finished:
                replies += 1
                good += valid(tok.decode(outs[r]), schema)
                live[r], outs[r] = lib.row(grammar), []
        step_times.append(spent)
    return {"compile_ms": statistics.median(times) * 1e3,
            "step_us": statistics.mean(step_times) * 1e6,
            "token_us": sum(step_times) / max(tokens, 1) * 1e6,
            "replies": replies, "valid": good}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, nargs="*", default=[320, 50257])
    ap.add_argument("--tokenizer", type=Path, action="append", default=[])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/tinyt-structured"))
    ap.add_argument("--xgrammar", action="store_true", help="measure xgrammar too")
    args = ap.parse_args(argv)
    toks = [(f"stdlib BPE {v:,}", stdlib_tokenizer(v, args.cache)) for v in args.vocab]
    toks += [(str(p), Tokenizer.from_file(p)) for p in args.tokenizer]
    libs = [Llguidance] + ([Xgrammar] if args.xgrammar else [])
    print(f"| library | vocabulary | build s | schema | compile ms | mask+accept per token us "
          f"| step of {args.rows} rows us | valid replies |")
    print("|---|---|---|---|---|---|---|---|")
    for name, tok in toks:
        for make in libs:
            t = time.perf_counter()
            lib = make(tok)
            built = time.perf_counter() - t
            for label, schema in SCHEMAS.items():
                m = measure(lib, tok, schema, args.rows, args.steps)
                print(f"| {make.name} | {name} | {built:.2f} | {label} | {m['compile_ms']:.1f} "
                      f"| {m['token_us']:.0f} | {m['step_us']:.0f} | "
                      f"{m['valid']}/{m['replies']} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
