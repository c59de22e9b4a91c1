"""Constrained decoding: a JSON schema, any JSON object, or tool calls followed token by token
(runtime/sampling.Constraint), on llguidance (torch-free, no dependencies; docs/serving.md
says why it and not xgrammar).

    schema ──check_schema (size, depth, enum sizes, a finite instance)──▶ llguidance grammar
           ──Grammar (a matcher at its start: first mask computed, forced tokens probed)
           ──.constraint()──▶ GrammarConstraint, one per sequence: mask / accept / finished

A Constrainer holds one tokenizer's vocabulary as llguidance reads it (_Vocabulary: the bytes
of every token from tokenizer.json; special tokens never allowed, end-of-text only where the
grammar is complete) and the grammars compiled for it, kept by their text. What cannot be
followed is a ConfigError naming it before any token is made: a schema too large, too deep,
with an enum beyond MAX_ENUM values, whose only instances are infinite (a required property or
item that contains itself), unsatisfiable, or that llguidance cannot compile within its limits
(INITIAL_LEXER_FUEL: a regular expression that would take seconds is refused in a fraction of
one). A grammar that still fails mid-generation (llguidance's per-step limits) ends its row
and says why in `error`, never raising in the engine's thread.
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyt.errors import ConfigError
from tinyt.tokenizer import Tokenizer, bytes_to_unicode

MAX_SCHEMA_BYTES = 128 * 1024  # a schema's JSON text at most (a 2,000-value enum is ~30 KB)
MAX_SCHEMA_DEPTH = 32  # nesting of the schema document (llguidance's own parser stops at 128)
MAX_ENUM = 4096  # values in one enum: a list larger than this is data, not a type
MAX_TOOLS = 128  # functions one request may offer
CACHED_GRAMMARS = 64  # compiled grammars kept per tokenizer (requests resend their schema)
# llguidance's lexer budget for building a grammar's first regular expressions: its default
# (1,000,000) let a pattern such as ^(a{1000}){1000}$ run 4 s before failing at 50k tokens;
# 200,000 fails it in ~0.2 s and compiles every schema the tests use (2,000-value enums,
# 3,000 properties).
INITIAL_LEXER_FUEL = 200_000
# Compact JSON: one spelling for each value, so a model cannot spend its tokens on whitespace.
JSON_OPTIONS = {"whitespace_flexible": False}
TOOL_BEGIN, TOOL_END = "<tool_call>\n", "\n</tool_call>"  # Hermes' and Qwen's call format


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401 (the bitmask helpers)
    except ImportError:
        raise ConfigError("constrained output (JSON schemas, tools) needs llguidance: pip "
                          "install 'tinyt[serve]' (or 'tinyt[structured]')") from None
    return llguidance


class _Vocabulary:
    """A tokenizer as llguidance's TokenizerWrapper reads it: each id's bytes, the special ids
    (never allowed; end-of-text where the grammar is complete), and encode (of the text a
    grammar forces). Made here rather than by llguidance's own reading of tokenizer.json,
    which takes every added token for a special one: Qwen's <tool_call> is an added token that
    is text, and a model writes it."""

    def __init__(self, tokenizer: Tokenizer):
        hf = tokenizer.hf
        added = hf.get_added_tokens_decoder()
        byte_level = '"ByteLevel"' in json.dumps(json.loads(hf.to_str()).get("decoder"))
        inverse = {c: b for b, c in bytes_to_unicode().items()}
        self.tokens: list[bytes] = []
        self.special_token_ids: list[int] = []
        for i in range(tokenizer.vocab_size):
            piece = hf.id_to_token(i)
            if i in added:
                self.tokens.append(added[i].content.encode("utf-8"))
                if added[i].special:
                    self.special_token_ids.append(i)
            elif piece is None:  # a hole in the ids: no text stands for it
                self.tokens.append(b"")
                self.special_token_ids.append(i)
            elif byte_level and all(c in inverse for c in piece):  # GPT-2's byte map
                self.tokens.append(bytes(inverse[c] for c in piece))
            elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):  # SentencePiece's byte fallback
                self.tokens.append(bytes([int(piece[3:5], 16)]))
            else:  # SentencePiece's pieces: '▁' is a space
                self.tokens.append(piece.replace("\u2581", " ").encode("utf-8"))
        self.eos_token_id, self.bos_token_id = tokenizer.eos_id, tokenizer.bos_id
        self._encode = tokenizer.encode
        special = set(self.special_token_ids)
        self._ids: dict[bytes, int] = {}  # each text token's bytes (the lowest id of a kind)
        for i, b in enumerate(self.tokens):
            if b and i not in special:
                self._ids.setdefault(b, i)
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text: str | bytes) -> list[int]:
        """Ids whose bytes are exactly `text`'s: the tokenizer's own encoding where it gives
        them (byte-level BPE does), else the longest tokens first (SentencePiece adds a
        space before the text, or an unknown piece)."""
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        ids = self._encode(data.decode("utf-8", errors="replace"))
        if b"".join(self.tokens[i] for i in ids) == data and \
                not set(ids) & set(self.special_token_ids):
            return ids
        out, at = [], 0
        while at < len(data):
            for n in range(min(self._longest, len(data) - at), 0, -1):
                if data[at:at + n] in self._ids:
                    out.append(self._ids[data[at:at + n]])
                    at += n
                    break
            else:  # a byte no token stands for: the ids of the text before it
                break
        return out


class GrammarConstraint:
    """One sequence's grammar (runtime/sampling.Constraint): its matcher and its mask's
    bitmask ([ceil(vocab / 32)] int32, bit t of word t // 32: token t allowed)."""

    def __init__(self, matcher, vocab: int, eos: int):
        self._matcher, self._vocab, self._eos = matcher, vocab, eos
        self._bits = np.zeros((vocab + 31) // 32, dtype=np.int32)
        self.error: str | None = None  # why the grammar stopped being followed, if it did

    def mask(self, logits: np.ndarray) -> None:
        m = self._matcher
        if self.error is None:
            m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            if m.is_error():
                self.error = _first_line(m.get_error())
        if self.error is None and not self._bits.any():
            self.error = "the grammar allows no token here"
        if self.error is not None:
            # nothing may follow (llguidance's per-step limits): end the row here rather than
            # leave a row of -inf for the sampler to raise on, in the engine's thread
            self._bits[:] = 0
            self._bits.view(np.uint32)[self._eos // 32] = 1 << self._eos % 32
        # the refused tokens' bits, one bool each: a masked copy costs the same whatever the
        # share allowed (~25 us at 50k tokens), where indexing grows with the tokens refused
        refused = np.unpackbits((~self._bits).view(np.uint8), count=self._vocab,
                                bitorder="little").view(bool)
        np.copyto(logits, -np.inf, where=refused)

    def accept(self, token: int) -> None:
        if self.error is None and not self._matcher.consume_token(token):
            self.error = _first_line(self._matcher.get_error())

    @property
    def finished(self) -> bool:
        return self.error is not None or self._matcher.is_stopped()


class Grammar:
    """A compiled grammar at its start; constraint() gives each sequence its own copy."""

    def __init__(self, what: str, start, vocab: int, eos: int):
        self.what = what  # what it constrains to, for messages
        self._start, self._vocab, self._eos = start, vocab, eos  # start: an LLMatcher
        self._lock = threading.Lock()  # one copy at a time from the matcher threads share

    def constraint(self) -> GrammarConstraint:
        with self._lock:
            matcher = self._start.deep_copy()
        return GrammarConstraint(matcher, self._vocab, self._eos)


@dataclass(frozen=True)
class Tool:
    """A function a chat may call: its name and its arguments' JSON schema."""
    name: str
    parameters: dict


class Constrainer:
    """One tokenizer's vocabulary in llguidance and the grammars compiled for it. Made once
    per tokenizer (Constrainer.of) — building the vocabulary's trie costs ~0.5 s at GPT-2's
    50,257 tokens — and safe to use from many threads."""

    _made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    _made_lock = threading.Lock()

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> Constrainer:
        """The Constrainer of `tokenizer`, made at the first call."""
        with cls._made_lock:
            made = cls._made.get(tokenizer)
            if made is None:
                made = cls._made[tokenizer] = cls(tokenizer)
            return made

    def __init__(self, tokenizer: Tokenizer):
        llg = _llguidance()
        if tokenizer.eos_id is None:
            raise ConfigError("constrained output needs an end-of-text token to end a "
                              "sequence that follows its grammar; this tokenizer has none")
        self.vocab, self.eos = tokenizer.vocab_size, tokenizer.eos_id
        try:
            self._tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(_Vocabulary(tokenizer)),
                                              n_vocab=self.vocab, eos_token=self.eos)
        except Exception as e:  # llguidance's checks of the vocabulary
            raise ConfigError(f"llguidance cannot use this tokenizer for constrained output: "
                              f"{_first_line(str(e))}") from None
        self._limits = llg.LLParserLimits(initial_lexer_fuel=INITIAL_LEXER_FUEL)
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    # -- what a request asks for -----------------------------------------------------------
    def json_schema(self, schema: Any, *, what: str = "json_schema") -> Grammar:
        """JSON text valid under `schema` (a JSON Schema object), compact; `what` names it in
        errors (the request's field)."""
        text = check_schema(schema, what)
        grammar = _llguidance().LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)
        return self._compile(grammar, what)

    def json_object(self, *, what: str = "json_object") -> Grammar:
        """Any JSON object."""
        return self.json_schema({"type": "object"}, what=what)

    def tool_calls(self, tools: list[Tool], *, choice: str = "auto", parallel: bool = True,
                   what: str = "tools") -> Grammar:
        """Text with tool calls in Hermes' format, TOOL_BEGIN {"name": ..., "arguments": ...}
        TOOL_END, each call's arguments valid under its function's schema. choice 'auto':
        text, and calls where the model writes TOOL_BEGIN; 'required': calls only, at least
        one; a function's name: one call of it. parallel False: at most one call."""
        if not tools or len(tools) > MAX_TOOLS:
            raise ConfigError(f"{what}: give 1..{MAX_TOOLS} functions, not {len(tools)}")
        calls = {}
        for i, tool in enumerate(tools):
            check_schema(tool.parameters, f"{what}[{i}].function.parameters")
            calls[tool.name] = {"type": "object", "additionalProperties": False,
                                "required": ["name", "arguments"],
                                "properties": {"name": {"const": tool.name},
                                               "arguments": tool.parameters}}
        if choice not in ("auto", "required") and choice not in calls:
            raise ConfigError(f"tool_choice names {choice!r}, which is not among {what}: "
                              f"{sorted(calls)}")
        one = calls[choice] if choice in calls else \
            {"anyOf": list(calls.values())} if len(calls) > 1 else next(iter(calls.values()))
        body = json.dumps({**one, "x-guidance": JSON_OPTIONS})
        check_size(body, what)
        begin, end = json.dumps(TOOL_BEGIN[len("<tool_call>"):]), json.dumps(TOOL_END)
        lines = [f"call: {json.dumps(TOOL_BEGIN)} %json {body} {end}"]
        if choice == "auto":  # free text; a call where the model writes <tool_call> (lazy)
            lines = ["%llguidance {}", "start: call" + ("*" if parallel else "?") + " TEXT",
                     'call_start[lazy]: TEXT "<tool_call>"',
                     f"call: call_start {begin} %json {body} {end}", r"TEXT: /(.|\n)*/"]
        elif choice == "required":
            lines.insert(0, 'start: call ("\\n" call)*' if parallel else "start: call")
        else:
            lines.insert(0, "start: call")
        return self._compile(_llguidance().LLMatcher.grammar_from_lark("\n".join(lines)),
                             what)

    # -- compiling -------------------------------------------------------------------------
    def _compile(self, grammar: str, what: str) -> Grammar:
        with self._lock:
            if grammar in self._cache:
                self._cache.move_to_end(grammar)
                return self._cache[grammar]
        llg = _llguidance()
        start = llg.LLMatcher(self._tokenizer, grammar, log_level=0, limits=self._limits)
        bits = np.zeros((self.vocab + 31) // 32, dtype=np.int32)
        if not start.is_error():  # the first mask builds the lexer: its failures show here
            start.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if not start.is_error():  # and those of what the grammar forces first
            probe = start.deep_copy()
            forced = probe.compute_ff_tokens()
            if forced and probe.consume_tokens(forced):
                probe.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            if probe.is_error():
                start = probe
        if start.is_error():
            raise ConfigError(f"{what}: the schema cannot be followed: "
                              f"{_first_line(start.get_error())}")
        if start.is_stopped() and not start.is_accepting():
            raise ConfigError(f"{what}: the schema is unsatisfiable: no JSON value is valid "
                              "under it")
        compiled = Grammar(what, start, self.vocab, self.eos)
        with self._lock:
            self._cache[grammar] = compiled
            while len(self._cache) > CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return compiled


def parse_tool_calls(text: str) -> tuple[str, list[tuple[str, dict]]]:
    """The text outside the calls and the (name, arguments) of each whole call in text made
    under Constrainer.tool_calls; a call cut short (max_tokens) stays text."""
    calls: list[tuple[str, dict]] = []
    rest: list[str] = []
    at = 0
    for m in re.finditer(re.escape(TOOL_BEGIN) + r"(.*?)" + re.escape(TOOL_END), text, re.S):
        try:
            call = json.loads(m.group(1))
            name, arguments = call["name"], call["arguments"]
        except (ValueError, KeyError, TypeError):
            continue  # not ours: leave it in the text
        rest.append(text[at:m.start()])
        at = m.end()
        calls.append((name, arguments))
    rest.append(text[at:])
    return "".join(rest), calls


# -- checks before compiling ---------------------------------------------------------------
def check_size(text: str, what: str) -> None:
    if len(text.encode("utf-8")) > MAX_SCHEMA_BYTES:
        raise ConfigError(f"{what}: the schema is {len(text.encode('utf-8')):,} bytes of JSON; "
                          f"at most {MAX_SCHEMA_BYTES:,}")


def check_schema(schema: Any, what: str) -> str:
    """The schema's JSON text if it is a JSON Schema object within the bounds (MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH, MAX_ENUM) whose instances can be finite; ConfigError naming `what` and
    the place otherwise."""
    if not isinstance(schema, dict):
        raise ConfigError(f"{what}: a JSON schema must be a JSON object, got "
                          f"{json.dumps(schema)[:60]}")
    _walk(schema, what, "#", 0)
    try:
        text = json.dumps(schema, allow_nan=False)
    except ValueError:
        raise ConfigError(f"{what}: the schema holds a NaN or infinite number") from None
    check_size(text, what)
    looping = _infinite(schema)
    if looping is not None:
        raise ConfigError(f"{what}: the schema is unsatisfiable: {looping!r} requires itself "
                          "(through required properties, items or allOf), so every instance "
                          "would be infinite")
    return text


def _walk(node: Any, what: str, where: str, depth: int) -> None:
    """Depth and enum bounds, iterating over the document (no Python recursion limit
    reached: depth is bounded first)."""
    if depth > MAX_SCHEMA_DEPTH:
        raise ConfigError(f"{what}: the schema nests deeper than {MAX_SCHEMA_DEPTH} levels "
                          f"(at {where[:120]})")
    if isinstance(node, dict):
        enum = node.get("enum")
        if isinstance(enum, list) and len(enum) > MAX_ENUM:
            raise ConfigError(f"{what}: the enum at {where} has {len(enum):,} values; at most "
                              f"{MAX_ENUM:,}")
        for key, value in node.items():
            if isinstance(value, (dict, list)):
                _walk(value, what, f"{where}/{key}", depth + 1)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, (dict, list)):
                _walk(value, what, f"{where}/{i}", depth + 1)


def _resolve(root: dict, ref: str) -> Any:
    """A local $ref's target ('#', '#/$defs/x' ...), or None (a remote or broken one:
    llguidance says what is wrong with it)."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _infinite(root: dict) -> str | None:
    """A $ref whose every instance must contain an instance of itself (a required property,
    a required item, allOf ... leading back to it), so none is finite; None if there is none.
    A least fixpoint: a reference is finite once its schema can be met with the references
    found finite so far."""
    refs: dict[str, Any] = {}
    stack: list[Any] = [root]
    while stack:  # every local $ref in the document
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref not in refs and _resolve(root, ref) is not None:
                refs[ref] = _resolve(root, ref)
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    finite: set[str] = set()
    changed = True
    while changed:
        changed = False
        for ref, target in refs.items():
            if ref not in finite and _can_end(target, finite, refs):
                finite.add(ref)
                changed = True
    if _can_end(root, finite, refs):
        return None
    return next((r for r in refs if r not in finite), "#")


def _can_end(node: Any, finite: set[str], refs: dict, depth: int = 0) -> bool:
    """Whether `node` has a finite instance, given which references do (finite). Unknown
    keywords count as satisfiable: llguidance judges the rest."""
    if not isinstance(node, dict) or depth > MAX_SCHEMA_DEPTH:
        return node is not False

    def can(sub: Any) -> bool:
        return _can_end(sub, finite, refs, depth + 1)

    ref = node.get("$ref")
    if isinstance(ref, str) and ref in refs and ref not in finite:
        return False
    if "enum" in node or "const" in node:
        return True
    if isinstance(node.get("allOf"), list) and not all(can(s) for s in node["allOf"]):
        return False
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and node[key] and not any(can(s) for s in node[key]):
            return False
    types = node.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else None
    if types is None or any(t not in ("object", "array") for t in types):
        return True  # a string, number, boolean or null instance ends at once
    if "array" in types and _array_can_end(node, can):
        return True
    return "object" in types and _object_can_end(node, can)


def _array_can_end(node: dict, can) -> bool:
    least = node.get("minItems", 0)
    least = least if isinstance(least, int) else 0
    prefix = node.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    if not all(can(s) for s in prefix[:least]):
        return False
    return least <= len(prefix) or can(node.get("items", True))


def _object_can_end(node: dict, can) -> bool:
    props, required = node.get("properties"), node.get("required")
    props = props if isinstance(props, dict) else {}
    required = required if isinstance(required, list) else []
    extra = node.get("additionalProperties", True)
    return all(can(props[name]) if name in props else can(extra)
               for name in required if isinstance(name, str))


def _first_line(message: str) -> str:
    """llguidance's message on one line, without the parser state it appends."""
    text = " ".join(message.split("\n<state>")[0].split())
    return (text[:300] + " ...") if len(text) > 300 else text or "unknown error"
