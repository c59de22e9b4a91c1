"""Constrained decoding (runtime/constrain.py): what a schema allows token by token, on the
test tokenizer and a GPT-2-sized vocabulary; hostile schemas refused by name before a token
is made; rt.load(...).generate(..., json_schema=...) on a small model, every reply valid."""
import json

import numpy as np
import pytest

pytest.importorskip("llguidance", reason="the serve (or structured) extra is not installed")

from hf_fixtures import tokenizer  # noqa: E402
from structured_fixtures import CHAIN, PERSON, check, errors, wide_checkpoint  # noqa: E402

import tinyt.runtime as rt  # noqa: E402
from tinyt.errors import ConfigError  # noqa: E402
from tinyt.runtime.constrain import (  # noqa: E402
    MAX_ENUM,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    TOOL_BEGIN,
    TOOL_END,
    Constrainer,
    Tool,
    parse_tool_calls,
)


def walk(grammar, tok, rng, limit=400):
    """Tokens sampled at temperature 1 from random logits under `grammar`'s constraint, as
    LanguageModel._choose does: (tokens, how it ended)."""
    c = grammar.constraint()
    out = []
    for _ in range(limit):
        z = rng.standard_normal(tok.vocab_size).astype(np.float32) * 2
        c.mask(z)
        p = np.exp(z - z.max())
        t = int(rng.choice(tok.vocab_size, p=p / p.sum()))
        if t == tok.eos_id:
            return out, "eos"
        c.accept(t)
        out.append(t)
        if c.finished:
            return out, "stop" if c.error is None else c.error
    return out, "length"


@pytest.fixture(scope="module")
def tok():
    return tokenizer()  # byte-level BPE, <|im_end|> its end, <|im_start|> special


@pytest.fixture(scope="module")
def con(tok):
    return Constrainer.of(tok)


def test_one_constrainer_per_tokenizer(tok, con):
    assert Constrainer.of(tok) is con
    assert con.json_schema(PERSON) is con.json_schema(json.loads(json.dumps(PERSON)))  # kept


def test_the_mask_allows_what_the_schema_allows(tok, con):
    c = con.json_schema({"type": "integer", "minimum": 0, "maximum": 99}).constraint()
    z = np.zeros(tok.vocab_size, np.float32)
    c.mask(z)
    allowed = {tok.decode([t]) for t in np.flatnonzero(np.isfinite(z))}
    assert allowed and all(s.isdigit() for s in allowed), allowed  # no sign, no end yet
    assert not np.isfinite(z[tok.eos_id]) and not np.isfinite(z[tok.bos_id])
    c.accept(tok.encode("4")[0])
    z = np.zeros(tok.vocab_size, np.float32)
    c.mask(z)
    assert np.isfinite(z[tok.eos_id]) and not c.finished  # "4" is whole; "42" too
    c.accept(tok.encode("2")[0])
    assert c.finished and c.error is None  # no third digit fits under 99
    with_text = con.json_object().constraint()
    for t in tok.encode('{"a":[1,"x"]}'):
        assert not with_text.finished
        with_text.accept(t)
    assert with_text.finished and with_text.error is None


def test_a_token_the_mask_refused_ends_the_row(tok, con):
    """A token outside the mask (a caller's mistake) puts the grammar in error: finished, and
    from then on only end-of-text is allowed, so the sampler never sees a row of -inf."""
    c = con.json_object().constraint()
    c.accept(tok.encode("x")[0])
    assert c.finished and c.error
    z = np.zeros(tok.vocab_size, np.float32)
    c.mask(z)
    assert np.flatnonzero(np.isfinite(z)).tolist() == [tok.eos_id]


@pytest.mark.parametrize("schema", [PERSON, CHAIN, {"type": "object"},
                                    {"enum": [f"city-{i:04d}" for i in range(2000)]}],
                         ids=["object", "recursive", "any-object", "enum-2000"])
def test_random_logits_always_give_valid_json(tok, con, schema):
    grammar = con.json_schema(schema)
    rng = np.random.default_rng(0)
    ended = []
    for _ in range(25):
        out, how = walk(grammar, tok, rng)
        ended.append(how)
        if how != "length":
            check(tok.decode(out), schema)
    # a bounded schema ends within 400 tokens ('stop' at its last '}', 'eos' after a whole
    # value that could go on); any object may nest past them, as it did 3 times in 25 here
    assert ended.count("length") <= (12 if schema == {"type": "object"} else 0), ended


def test_a_gpt2_sized_vocabulary():
    """50,257 tokens (merges of merges, built in a second): the same guarantees."""
    from lab.constrain_cost import synthetic_tokenizer

    big = synthetic_tokenizer(50257)
    assert big.vocab_size == 50257
    grammar = Constrainer.of(big).json_schema(PERSON)
    rng = np.random.default_rng(1)
    for _ in range(8):
        out, how = walk(grammar, big, rng)
        assert how == "stop"
        check(big.decode(out), PERSON)


def llama2_style():
    """A SentencePiece BPE as Llama 2's tokenizer.json has it: '\u2581' for spaces, <0xNN>
    byte fallback, <s> and </s>."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    from tinyt.tokenizer import Tokenizer

    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581",
              *(chr(c) for c in range(33, 127)), "\u2581t", "he", "\u2581the", '":', '{"']
    merges = [("\u2581", "t"), ("h", "e"), ("\u2581t", "he"), ('"', ":"), ("{", '"')]
    hf = HFTokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, merges, unk_token="<unk>",
                                byte_fallback=True, fuse_unk=True))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    hf.add_special_tokens(["<unk>", "<s>", "</s>"])
    return Tokenizer(hf, eos_token="</s>", bos_token="<s>")


def test_the_vocabulary_as_llguidance_reads_it(tok):
    """Added tokens that are text (Qwen's <tool_call>) stay text, special ones are never
    allowed; SentencePiece's pieces ('\u2581' a space) give JSON that decodes as it parsed."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    from tinyt.tokenizer import Tokenizer

    hf = HFTokenizer.from_str(tok.hf.to_str())
    hf.add_tokens([AddedToken("<tool_call>", special=False)])
    qwenish = Tokenizer(hf, eos_token=tok.eos_token, bos_token=tok.bos_token)
    call = hf.token_to_id("<tool_call>")
    grammar = Constrainer.of(qwenish).tool_calls([Tool("f", {"type": "object"})],
                                                 choice="required")
    z = np.zeros(qwenish.vocab_size, np.float32)
    grammar.constraint().mask(z)
    assert np.isfinite(z[call]) and not np.isfinite(z[tok.bos_id])  # the token, as text
    sp = llama2_style()
    grammar = Constrainer.of(sp).json_schema(PERSON)
    rng = np.random.default_rng(3)
    for _ in range(8):
        out, how = walk(grammar, sp, rng)
        assert how == "stop"
        check(sp.decode(out), PERSON)


def test_tool_call_grammars(tok, con):
    weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}},
               "required": ["city"], "additionalProperties": False}
    tools = [Tool("get_weather", weather), Tool("noop", {"type": "object", "properties": {},
                                                        "additionalProperties": False})]
    rng = np.random.default_rng(2)
    for choice, parallel in (("required", True), ("required", False), ("get_weather", True)):
        grammar = con.tool_calls(tools, choice=choice, parallel=parallel)
        for _ in range(8):
            out, how = walk(grammar, tok, rng)
            if how == "length":
                continue
            content, calls = parse_tool_calls(tok.decode(out))
            assert content.strip() == "" and calls, tok.decode(out)
            assert parallel or len(calls) == 1
            for name, arguments in calls:
                assert name in ("get_weather", "noop")
                assert choice == "required" or name == choice
                assert errors(arguments, weather if name == "get_weather" else
                              tools[1].parameters) == []
    auto = con.tool_calls(tools, choice="auto").constraint()
    text = 'Let me look. <tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}'
    for t in tok.encode(text):
        auto.accept(t)
    assert auto.error is None and not auto.finished
    z = np.zeros(tok.vocab_size, np.float32)
    auto.mask(z)
    assert {tok.decode([t]) for t in np.flatnonzero(np.isfinite(z))} <= \
        {TOOL_END[:k] for k in range(1, len(TOOL_END) + 1)}  # only the call's end may follow
    free = con.tool_calls(tools, choice="auto").constraint()
    for t in tok.encode("no call needed"):
        free.accept(t)
    z = np.zeros(tok.vocab_size, np.float32)
    free.mask(z)
    assert free.error is None and np.isfinite(z[tok.eos_id])  # plain text may end anywhere
    with pytest.raises(ConfigError, match="tool_choice names 'other'"):
        con.tool_calls(tools, choice="other")


def test_parse_tool_calls():
    call = TOOL_BEGIN + '{"name":"f","arguments":{"x":1}}' + TOOL_END
    assert parse_tool_calls("hi " + call + "\n" + call) == ("hi \n", [("f", {"x": 1}),
                                                                     ("f", {"x": 1})])
    cut = TOOL_BEGIN + '{"name":"f","argu'  # max_tokens ended it: it stays text
    assert parse_tool_calls("hi " + cut) == ("hi " + cut, [])


DEEP = {"type": "integer"}
for _ in range(MAX_SCHEMA_DEPTH + 1):
    DEEP = {"type": "array", "items": DEEP}


@pytest.mark.parametrize("schema, says", [
    ({"$ref": "#"}, "'#' requires itself"),
    ({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
     "'#' requires itself"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}},
      "$ref": "#/$defs/n"}, "'#/$defs/n' requires itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
      "$ref": "#/$defs/a"}, "requires itself"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum (5) is greater than maximum"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "Unsatisfiable schema"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "unsatisfiable"),
    ({"type": "colour"}, "Invalid type: colour"),
    ({"not": {"type": "string"}}, 'Unimplemented keys: ["not"]'),
    ({"$ref": "http://example.com/s.json"}, "http://example.com/s.json"),
    ({"$ref": "#/$defs/missing"}, "/$defs/missing"),
    ({"type": "string", "pattern": "(((("}, "unclosed group"),
    ({"enum": list(range(MAX_ENUM + 1))}, f"has {MAX_ENUM + 1:,} values; at most {MAX_ENUM:,}"),
    (DEEP, f"nests deeper than {MAX_SCHEMA_DEPTH} levels"),
    ({"description": "x" * MAX_SCHEMA_BYTES}, f"at most {MAX_SCHEMA_BYTES:,}"),
    ({"type": "number", "maximum": float("nan")}, "NaN"),
    ([{"type": "string"}], "must be a JSON object"),
    # a regular expression of a million states: llguidance's lexer budget (INITIAL_LEXER_FUEL)
    # stops it when the grammar is compiled, not in the engine's thread
    ({"type": "string", "pattern": "^(a{1000}){1000}$"}, "too many expressions"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_hostile_schemas_are_refused_by_name(con, schema, says):
    with pytest.raises(ConfigError) as e:
        con.json_schema(schema, what="response_format")
    assert str(e.value).startswith("response_format: ") and says in str(e.value), str(e.value)


def test_recursion_that_can_end_compiles(con):
    con.json_schema(CHAIN)
    con.json_schema({"type": "object", "properties": {"x": {"$ref": "#"}}})  # x optional
    con.json_schema({"$defs": {"n": {"anyOf": [{"type": "null"}, {"type": "array", "items": {
        "$ref": "#/$defs/n"}, "minItems": 1}]}}, "$ref": "#/$defs/n"})  # null ends it


def test_the_validator_can_fail():
    assert errors({"name": "", "age": 500, "active": 1, "tags": ["pink"], "x": 0}, PERSON) \
        and len(errors({"name": "", "age": 500, "active": 1, "tags": ["pink"], "x": 0},
                       PERSON)) == 5
    assert errors({"v": 1, "next": [{"v": 10, "next": []}]}, CHAIN) == \
        ["$.next[0].v: 10 outside [minimum, maximum]"]


@pytest.fixture(scope="module")
def wide_lm(tiny_ckpt, tmp_path_factory):
    from tinyt.checkpoint import load_checkpoint
    from tinyt.export import export_onnx

    root = tmp_path_factory.mktemp("constrain")
    ck = wide_checkpoint(load_checkpoint(tiny_ckpt).tokenizer, root / "ck")
    return rt.load(export_onnx(ck, root / "onnx"), threads=1, tune=False)


def test_generate_with_a_json_schema(wide_lm):
    prompts = ["def f(x):", "import os", "class A:", "x = 1", "return", "# a", "if x:", "y"]
    results = wide_lm.generate_details(prompts, json_schema=PERSON, max_new_tokens=150,
                                       temperature=1.0, seed=4)
    for r in results:
        assert r.finish_reason == "stop", r
        check(r.text, PERSON)
    assert len({r.text for r in results}) > 1  # rows follow their own constraint
    for seed in range(6):
        text = wide_lm.generate("def f(x):", json_schema=CHAIN, max_new_tokens=200,
                                temperature=1.0, seed=seed)
        check(text, CHAIN)
    streamed = "".join(wide_lm.stream("x = 1", json_schema=PERSON, max_new_tokens=150,
                                      temperature=1.0, seed=9))
    assert streamed == wide_lm.generate("x = 1", json_schema=PERSON, max_new_tokens=150,
                                        temperature=1.0, seed=9)
    check(wide_lm.generate("x = 1", json_schema={"type": "object", "properties": {
        "k": {"enum": ["a", "b"]}}, "required": ["k"], "additionalProperties": False},
        max_new_tokens=20), {"type": "object"})  # greedy too


def test_generate_refuses_what_cannot_be_followed(wide_lm):
    with pytest.raises(ConfigError, match="requires itself"):
        wide_lm.generate("x", json_schema={"$ref": "#"})
    with pytest.raises(ConfigError, match="min_new_tokens cannot be combined"):
        wide_lm.generate("x", json_schema=PERSON, min_new_tokens=3)
