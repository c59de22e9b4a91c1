"""`tinyt serve`'s structured output through the `openai` client: response_format (json_object,
json_schema, a pydantic model through parse()) and tools (required, named, auto, streamed)
give schema-valid JSON on 100 of 100 requests each, sampled at temperature 1 from a small
random model; hostile schemas and malformed fields are 400s naming them, and the server goes
on serving."""
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("llguidance", reason="the serve extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client (dev extra) is not installed")

from live_server import KEY, Server  # noqa: E402
from structured_fixtures import (  # noqa: E402
    ADD,
    CHAIN,
    PERSON,
    TOOLS,
    TOOLS_TEMPLATE,
    WEATHER,
    check,
    wide_checkpoint,
)

from tinyt.errors import ApiError  # noqa: E402
from tinyt.server.chat import compile_template, reads_tools, render_chat  # noqa: E402

MODEL = "wide-gqa"
PARAMS = {"get_weather": WEATHER, "add": ADD}
USER = [{"role": "user", "content": "def f(x):"}]


@pytest.fixture(scope="module")
def server(tiny_ckpt, tmp_path_factory):
    from tinyt.checkpoint import load_checkpoint
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize

    root = tmp_path_factory.mktemp("serve-structured")
    ck = wide_checkpoint(load_checkpoint(tiny_ckpt).tokenizer, root / "ck",
                         chat_template=TOOLS_TEMPLATE)
    opt = optimize(export_onnx(ck, root / "onnx"), root / "opt")
    s = Server(optimize(opt, root / MODEL, target="gqa"), "--max-batch", "8", "--api-key", KEY)
    yield s
    assert s.stop() == 0


def many(calls):
    """Run the calls from 8 client threads (the engine's 8 rows), results in order."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda f: f(), calls))


def calls_of(choice) -> list[tuple[str, dict]]:
    """(name, arguments) of a choice's tool calls, each checked against its function."""
    assert choice.finish_reason == "tool_calls", choice
    out = []
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = check(call.function.arguments, PARAMS[call.function.name])
        out.append((call.function.name, arguments))
    return out


def test_response_format_gives_valid_json_100_of_100(server):
    c = server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                  "strict": True}}

    def chat(seed, response_format=fmt):
        return lambda: c.chat.completions.create(
            model=MODEL, messages=USER, response_format=response_format, temperature=1.0,
            seed=seed, max_tokens=150).choices[0]

    def completion(seed, schema):
        return lambda: c.completions.create(
            model=MODEL, prompt="x = ", temperature=1.0, seed=seed, max_tokens=200,
            extra_body={"response_format": {"type": "json_schema", "json_schema": {
                "name": "chain", "schema": schema}}}).choices[0]

    chain = {"type": "json_schema", "json_schema": {"name": "chain", "schema": CHAIN}}
    jobs = [chat(seed) for seed in range(50)]
    jobs += [completion(seed, CHAIN) for seed in range(25)]
    jobs += [chat(seed, chain) for seed in range(50, 75)]
    answers = many(jobs)
    for k, a in enumerate(answers):
        assert a.finish_reason == "stop", (k, a)
        check(a.text if 50 <= k < 75 else a.message.content, PERSON if k < 50 else CHAIN)
    assert len({a.message.content for a in answers[:50]}) > 40  # seeds differ, replies too
    # Any object: nothing bounds its keys, so a random model's may run to max_tokens; each
    # reply that ends is an object (and "{}" alone ends half the time: a '}' or a '"' next)
    objects = many([chat(seed, {"type": "json_object"}) for seed in range(25)])
    ended = [a.message.content for a in objects if a.finish_reason == "stop"]
    assert len(ended) >= 5, [a.finish_reason for a in objects]
    for text in ended:
        assert isinstance(check(text, {"type": "object"}), dict)


def test_openai_parse_with_a_pydantic_model(server):
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=8)
        population: int = pydantic.Field(ge=0, le=10 ** 6)
        coastal: bool

    r = server.client().chat.completions.parse(model=MODEL, messages=USER, response_format=City,
                                               temperature=1.0, seed=1, max_tokens=100)
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and 0 <= city.population <= 10 ** 6 and len(city.name) <= 8


def test_a_streamed_reply_is_the_whole_reply(server):
    c = server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    whole = c.chat.completions.create(model=MODEL, messages=USER, response_format=fmt,
                                      temperature=1.0, seed=7, max_tokens=150)
    pieces = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=MODEL, messages=USER, response_format=fmt, temperature=1.0, seed=7,
        max_tokens=150, stream=True) if ch.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    check(whole.choices[0].message.content, PERSON)


def test_tool_calls_are_valid_100_of_100(server):
    c = server.client()

    def ask(seed, choice, parallel=False):
        return lambda: c.chat.completions.create(
            model=MODEL, messages=USER, tools=TOOLS, tool_choice=choice, temperature=1.0,
            seed=seed, max_tokens=200, parallel_tool_calls=parallel)

    named = {"type": "function", "function": {"name": "add"}}
    jobs = [ask(seed, "required") for seed in range(40)]
    jobs += [ask(seed, named) for seed in range(20)]
    jobs += [ask(seed, "required", True) for seed in range(20)]
    answers = many(jobs)
    names = set()
    for k, r in enumerate(answers):
        a = r.choices[0]
        if k >= 60 and a.finish_reason == "length":
            # parallel calls: after each, another or the end, near evens for a random model,
            # so some replies run to max_tokens; the calls made whole are still returned
            assert r.usage.completion_tokens == 200 and a.message.tool_calls
            a.finish_reason = "tool_calls"
        else:
            assert a.message.content is None
        calls = calls_of(a)
        names |= {n for n, _ in calls}
        assert len(calls) == 1 or k >= 60
        assert calls[0][0] == "add" or not 40 <= k < 60
    assert names == {"get_weather", "add"}  # required: the model chose among both
    assert any(len(r.choices[0].message.tool_calls) > 1 for r in answers[60:])
    for seed in range(20):  # streamed: the calls arrive whole in one tool_calls delta
        chunks = list(c.chat.completions.create(
            model=MODEL, messages=USER, tools=TOOLS, tool_choice="required", temperature=1.0,
            seed=100 + seed, max_tokens=200, stream=True, parallel_tool_calls=False))
        deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
        assert not "".join(d.content or "" for d in deltas)
        streamed = [t for d in deltas for t in d.tool_calls or []]
        assert streamed and [t.index for t in streamed] == list(range(len(streamed)))
        for t in streamed:
            check(t.function.arguments, PARAMS[t.function.name])
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_tools_and_a_conversation_with_calls(server):
    c = server.client()
    for seed in range(4):  # the model may answer in text or call: either parses
        a = c.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, temperature=1.0,
                                      seed=seed, max_tokens=40).choices[0]
        if a.message.tool_calls:
            calls_of(a)
        else:
            assert a.finish_reason in ("stop", "length") and a.message.content is not None
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    a = c.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                  tool_choice="none", temperature=0, max_tokens=5).choices[0]
    assert a.message.tool_calls is None and a.finish_reason in ("stop", "length")


HOSTILE = [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}},
     "'#' requires itself"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]}}},
     "requires itself"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": 3, "maximum": 2}}}, "minimum (3) is greater"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "enum": list(range(100_000))}}}, "has 100,000 values; at most 4,096"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "^(a{1000}){1000}$"}}}, "too many expressions"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "colour"}}},
     "Invalid type: colour"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
     "'response_format' must be"),
    ({"type": "json_schema"}, "'response_format' must be"),
    ({"type": "xml"}, "'response_format' must be"),
    ({"type": "json_object", "schema": {}}, "takes only ['type']"),
]


@pytest.mark.parametrize("fmt, says", HOSTILE)
def test_hostile_response_formats_are_a_400_naming_them(server, fmt, says):
    status, text, _ = server.post("/v1/chat/completions", {
        "model": MODEL, "messages": USER, "response_format": fmt},
        headers={"Authorization": f"Bearer {KEY}"})
    error = json.loads(text)["error"]
    assert (status, error["param"]) == (400, "response_format"), text
    assert says in error["message"], error["message"]


@pytest.mark.parametrize("extra, param, says", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "$ref": "#"}}}]}, "tools", "tools[0].function.parameters: the schema is unsatisfiable"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools",
     "1-64 letters"),
    ({"tools": TOOLS + [TOOLS[0]]}, "tools", "'get_weather' is given twice"),
    ({"tools": []}, "tools", "a non-empty list"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "'nope', which is not among the tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'none', 'auto'"),
    ({"tool_choice": "auto"}, "tool_choice", "needs 'tools'"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format",
     "response_format with tools"),
    ({"response_format": {"type": "json_object"}, "min_tokens": 3}, "min_tokens",
     "min_tokens cannot be combined"),
    ({"functions": [{"name": "f"}]}, "functions", "does not implement functions"),
])
def test_malformed_tools_are_a_400_naming_them(server, extra, param, says):
    status, text, _ = server.post("/v1/chat/completions", {
        "model": MODEL, "messages": USER, **extra}, headers={"Authorization": f"Bearer {KEY}"})
    error = json.loads(text)["error"]
    assert (status, error["param"]) == (400, param), text
    assert says in error["message"], error["message"]


def test_completions_refuse_tools_and_the_server_goes_on(server):
    deep = '{"type": "json_schema", "json_schema": {"name": "x", "schema": ' + \
        '{"items": ' * 50_000 + "{}" + "}" * 50_000 + "}}"
    body = json.dumps({"model": MODEL, "messages": USER, "response_format": None})
    status, text, _ = server.request("POST", "/v1/chat/completions",
                                     raw=body.replace("null", deep).encode(),
                                     headers={"Authorization": f"Bearer {KEY}"})
    assert status == 400 and "nests too deeply" in json.loads(text)["error"]["message"]
    status, text, _ = server.post("/v1/completions", {
        "model": MODEL, "prompt": "x", "tools": TOOLS},
        headers={"Authorization": f"Bearer {KEY}"})
    assert status == 400 and "chat completions field" in json.loads(text)["error"]["message"]
    c = server.client()  # after every refusal above: it still answers
    r = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert server.get("/health")[0] == 200


class Tok:
    bos_token, eos_token = None, "<|endoftext|>"


def test_a_template_without_tools_gets_them_in_a_system_message():
    plain = "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}\n{% endfor %}"
    assert not reads_tools(plain) and reads_tools(TOOLS_TEMPLATE)
    history = [{"role": "system", "content": "be brief"}, *USER,
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "call_1", "type": "function",
                   "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    text = render_chat(compile_template(plain), history, Tok, tools=TOOLS,
                       template_reads_tools=False)
    assert text.startswith("system:be brief\n\n# Tools\n")  # added to the system message
    assert json.dumps(TOOLS[0]) in text and "<tool_call>\n{\"name\": <function-name>" in text
    assert text.endswith('user:def f(x):\nassistant:<tool_call>\n{"name": "add", "arguments": '
                         '{"a": 1, "b": 2}}\n</tool_call>\nuser:<tool_response>\n3\n'
                         "</tool_response>\n")
    reading = render_chat(compile_template(TOOLS_TEMPLATE), history, Tok, tools=TOOLS)
    assert reading == "t:get_weather;add;s:be brief\nu:def f(x):\na:\nt:3\na:"
    with pytest.raises(ApiError, match=r"messages\[1\].tool_calls\[0\].function.arguments "
                                       "is not valid JSON"):
        render_chat(compile_template(TOOLS_TEMPLATE), [*USER, {
            "role": "assistant", "content": None, "tool_calls": [{
                "type": "function", "function": {"name": "add", "arguments": "{"}}]}], Tok,
            tools=TOOLS)
