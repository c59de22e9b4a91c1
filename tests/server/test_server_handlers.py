"""tinyt.server.handlers's handlers called one by one, without HTTP or a model: a stub model and a
stub engine that answers at once, so each route's answer, error and count is checked alone
(tests/server/test_server.py runs the whole server through the openai client)."""
import asyncio
import contextlib
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")

from tinyt.errors import QueueFull  # noqa: E402
from tinyt.runtime.engine import Done, Token  # noqa: E402
from tinyt.server.handlers import OpenAIServer  # noqa: E402

KEY = "k"


class StubTokenizer:
    bos_token, eos_token = None, "<|endoftext|>"
    chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}>"

    def encode_prompt(self, text):
        return [ord(c) for c in text]


class StubEngine:
    """Answers each request at once with `script` (token texts, then a finish reason)."""

    def __init__(self, script=(("a", "b"), "eos"), capacity=10, fail=None):
        self.script, self.capacity, self.fail = script, capacity, fail
        self.submitted, self.cancelled, self.started, self.stopped = [], 0, False, False
        self.queue_depth = self.running = self.held = 0

    def submit(self, ids, params, *, listener, logprobs=None, prompt_logprobs=None):
        if self.fail:
            raise self.fail
        if len(self.submitted) >= self.capacity:
            raise QueueFull(f"{len(self.submitted)} requests are waiting (max_queue 1)")
        self.submitted.append((ids, params))
        req = SimpleNamespace(submitted=0.0, cancel=lambda: setattr(
            self, "cancelled", self.cancelled + 1))
        texts, reason = self.script
        for n, text in enumerate(texts):
            listener(Token(n, text, 0.01 * (n + 1)))
        listener(Done(reason, "".join(texts), "boom" if reason == "error" else None))
        return req

    @contextlib.contextmanager
    def together(self):  # the real engine holds its lock: the jobs are admitted in one step
        self.held += 1
        yield

    def start(self):
        self.started = True

    def stop(self, *, timeout=None):
        self.stopped = True


class StubRequest:
    def __init__(self, body=None, *, key=KEY, raw=None, method="POST", path="/v1/completions"):
        self.headers = {} if key is None else {"authorization": f"Bearer {key}"}
        self._raw = raw if raw is not None else json.dumps(body).encode()
        self.method, self.url = method, SimpleNamespace(path=path)

    async def body(self):
        return self._raw


def server(engine=None, *, api_key=KEY, template=True):
    tok = StubTokenizer()
    if not template:
        tok.chat_template = None
    lm = SimpleNamespace(tokenizer=tok, context=32, config=SimpleNamespace(vocab_size=1000))
    return OpenAIServer(lm, engine or StubEngine(), model_id="tiny", api_key=api_key)


def run(coro):
    return asyncio.run(coro)


def answer(response):
    return response.status_code, json.loads(response.body)


def streamed(handler, request) -> list:
    """The chunks of a streamed answer, read in the loop that made it (as uvicorn does)."""
    async def read():
        response = await handler(request)
        return [c async for c in response.body_iterator]
    chunks = run(read())
    assert chunks[-1] == "data: [DONE]\n\n"
    return [json.loads(c.removeprefix("data: ")) for c in chunks[:-1]]


def requests_counted(s, endpoint, status):
    return s.metrics.registry.get_sample_value(
        "tinyt_requests_total", {"endpoint": endpoint, "status": str(status)})


def test_a_completion_answers_with_choices_usage_and_counts():
    s = server()
    status, body = answer(run(s.completions(StubRequest(
        {"model": "tiny", "prompt": ["ab", "c"], "max_tokens": 4, "temperature": 0}))))
    assert status == 200 and body["object"] == "text_completion" and body["model"] == "tiny"
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == \
        [(0, "ab", "stop"), (1, "ab", "stop")]  # eos is OpenAI's "stop"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert [ids for ids, _ in s.engine.submitted] == [[97, 98], [99]]
    assert s.engine.held == 1  # a request's jobs submitted together (Engine.together)
    assert s.engine.submitted[0][1].max_new_tokens == 4
    assert requests_counted(s, "completions", 200) == 1
    assert s.metrics.registry.get_sample_value("tinyt_generated_tokens_total") == 4


def test_a_chat_answer_and_its_stream():
    s = server(StubEngine(script=(("x", "", "y"), "length")))
    req = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    status, body = answer(run(s.chat(StubRequest(req))))
    assert status == 200 and body["choices"] == [{"index": 0, "message": {
        "role": "assistant", "content": "xy"}, "logprobs": None, "finish_reason": "length"}]
    assert s.engine.submitted[0][0] == [ord(c) for c in "hi>"]  # rendered by the template
    assert s.engine.submitted[0][1].max_new_tokens == 32 - 3  # chat: up to the context
    chunks = streamed(s.chat, StubRequest({
        **req, "stream": True, "stream_options": {"include_usage": True}}))
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
          "finish_reason": None}],
        [{"index": 0, "delta": {"content": "x"}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {"content": "y"}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}], []]
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


def test_a_streamed_completion():
    s = server()
    chunks = streamed(s.completions, StubRequest({"model": "tiny", "prompt": "d",
                                                  "stream": True}))
    assert [c["choices"][0]["text"] for c in chunks] == ["a", "b", ""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "usage" not in chunks[-1]


def test_errors_are_openai_bodies_with_their_status():
    s = server()
    status, body = answer(run(s.completions(StubRequest({"model": "tiny"}, key=None))))
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert "send 'Authorization: Bearer KEY'" in body["error"]["message"]
    status, body = answer(run(s.completions(StubRequest({"model": "tiny"}, key="wrong"))))
    assert status == 401 and body["error"]["message"] == "the API key is not valid"
    status, body = answer(run(s.completions(StubRequest(raw=b"{"))))
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    status, body = answer(run(s.completions(StubRequest({"model": "tiny", "prompt": "x",
                                                         "stream": 1}))))
    assert (status, body["error"]["param"]) == (400, "stream")
    assert requests_counted(s, "completions", 401) == 2
    assert requests_counted(s, "completions", 400) == 2
    assert not s.engine.submitted  # every field is checked before anything is submitted
    status, body = answer(run(server(template=False).chat(StubRequest(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}))))
    assert status == 400 and "tiny has no chat template" in body["error"]["message"]
    status, body = answer(run(s.not_found(StubRequest(method="GET", path="/nope"), None)))
    assert (status, body["error"]["type"]) == (404, "not_found_error")
    assert body["error"]["message"] == "no route GET /nope"
    assert requests_counted(s, "other", 404) == 1


def test_a_full_queue_is_a_429_and_cancels_what_it_submitted():
    s = server(StubEngine(capacity=1))
    response = run(s.completions(StubRequest({"model": "tiny", "prompt": ["a", "b"]})))
    status, body = answer(response)
    assert (status, body["error"]["type"]) == (429, "rate_limit_error")
    assert response.headers["retry-after"] == "1"
    assert "the server is busy: 1 requests are waiting" in body["error"]["message"]
    assert s.engine.cancelled == 1


def test_runtime_refusals_and_failures():
    s = server(StubEngine(fail=ValueError("prompt 0 is 40 tokens")))
    status, body = answer(run(s.completions(StubRequest({"model": "tiny", "prompt": "a"}))))
    assert (status, body["error"]["message"]) == (400, "prompt 0 is 40 tokens")
    s = server(StubEngine(script=(("a",), "error")))
    status, body = answer(run(s.completions(StubRequest({"model": "tiny", "prompt": "a"}))))
    assert (status, body["error"]["type"]) == (500, "server_error")
    assert body["error"]["message"] == "generation failed: boom"


def test_models_health_and_the_lifespan():
    s = server(api_key=None)
    status, body = answer(run(s.models(StubRequest(key=None, method="GET"))))
    assert status == 200 and [(m["id"], m["max_model_len"]) for m in body["data"]] == \
        [("tiny", 32)]
    assert answer(run(s.health(None))) == (503, {"status": "unavailable", "model": "tiny"})

    async def lifespan():
        async with s.lifespan(None):
            assert s.engine.started and answer(await s.health(None))[0] == 200
        assert s.engine.stopped and answer(await s.health(None))[0] == 503
    run(lifespan())
    assert b"tinyt_running_rows" in run(s.prometheus(None)).body
    assert answer(run(server().models(StubRequest(key=None, method="GET"))))[0] == 401
