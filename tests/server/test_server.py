"""`tinyt serve` through the official `openai` client and raw HTTP, against servers the tests
start on free loopback ports and always stop: completions (plain, streamed, stop strings, a
list of prompts), chat through the artifact's template, the OpenAI error for each bad client,
concurrency identity, a disconnect cancelling its row, SIGTERM, bad flags at start-up."""
import http.client
import json
import os
import re
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client (dev extra) is not installed")

from chat_model import chat_gqa  # noqa: E402
from live_server import KEY, Server  # noqa: E402

import tinyt.runtime as rt  # noqa: E402


@pytest.fixture(scope="module")
def artifacts(tiny_ckpt, tmp_path_factory):
    """The tiny model with a chat template: its shared-cache graph, and a contract graph."""
    from tinyt.export import export_onnx

    root = tmp_path_factory.mktemp("serve")
    return {"gqa": chat_gqa(tiny_ckpt, root), "contract": export_onnx(tiny_ckpt, root / "plain")}


@pytest.fixture(scope="module")
def server(artifacts):
    s = Server(artifacts["gqa"], "--max-batch", "4", "--api-key", KEY)
    yield s
    assert s.stop() == 0  # SIGTERM: stops taking requests, finishes, exits 0


@pytest.fixture(scope="module")
def lm(artifacts):
    return rt.load(artifacts["gqa"], threads=1, tune=False)


@pytest.mark.slow
def test_completions_plain_streamed_stopped_and_batched(server, lm):
    c = server.client()
    r = c.completions.create(model="tiny-gqa", prompt="def ", max_tokens=8, temperature=0)
    want = lm.generate("def ", max_new_tokens=8)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "length"
    n_prompt = len(lm.tokenizer.encode("def "))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == \
        (n_prompt, 8, n_prompt + 8)
    pieces = [ch.choices[0].text for ch in c.completions.create(
        model="tiny-gqa", prompt="def ", max_tokens=8, temperature=0, stream=True)]
    assert "".join(pieces) == want
    cut = want[2:4] if len(want) > 4 else want[-1:]
    r = c.completions.create(model="tiny-gqa", prompt="def ", max_tokens=8, temperature=0,
                             stop=[cut])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == want[:want.find(cut)]
    r = c.completions.create(model="tiny-gqa", prompt=["def ", "import os\n"], max_tokens=5,
                             temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1]
    assert r.choices[1].text == lm.generate("import os\n", max_new_tokens=5)
    seeded = [c.completions.create(model="tiny-gqa", prompt="x = ", max_tokens=6,
                                   temperature=0.9, top_p=0.95, seed=7, extra_body={"top_k": 20})
              .choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1] == lm.generate("x = ", max_new_tokens=6, temperature=0.9,
                                                  top_p=0.95, top_k=20, seed=7)


def test_chat_renders_the_template_and_streams(server, lm):
    c = server.client()
    messages = [{"role": "user", "content": "def f"}]
    prompt = "u:def f\na:"
    r = c.chat.completions.create(model="tiny-gqa", messages=messages, max_tokens=6,
                                  temperature=0)
    assert r.choices[0].message.content == lm.generate(prompt, max_new_tokens=6)
    assert r.choices[0].message.role == "assistant"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="tiny-gqa", messages=messages, max_tokens=6, temperature=0, stream=True)
        if ch.choices)
    assert streamed == r.choices[0].message.content


def test_sixteen_concurrent_requests_each_get_their_own_output(server):
    c = server.client()
    jobs = [dict(prompt=["def ", "import ", "class A", "x = 1\n"][i % 4] * (1 + i % 2),
                 max_tokens=3 + (i * 3) % 9, temperature=0.0 if i % 2 else 0.8, seed=i)
            for i in range(16)]
    alone = [c.completions.create(model="tiny-gqa", **j).choices[0].text for j in jobs]
    together = [None] * 16

    def one(i):
        together[i] = server.client().completions.create(model="tiny-gqa", **jobs[i]) \
            .choices[0].text
    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == alone


@pytest.mark.parametrize("body, status, says", [
    (None, 400, "not valid JSON"),
    ({"model": "tiny-gqa", "prompt": "def ", "max_tokens": "ten"}, 400, "'max_tokens' must be"),
    ({"model": "tiny-gqa", "prompt": 3}, 400, "'prompt' must be a string"),
    ({"model": "other", "prompt": "def "}, 404, "model 'other' does not exist"),
    ({"model": "tiny-gqa", "prompt": "def ", "n": 99}, 400, "'n'=99 is invalid: an integer in "
     "1..16"),
    ({"model": "tiny-gqa", "prompt": "def ", "logprobs": 9}, 400, "'logprobs'=9 is invalid: an "
     "integer in 0..5"),
    ({"model": "tiny-gqa", "prompt": "def ", "n": 2, "best_of": 1}, 400, "'best_of'=1 is "
     "invalid: an integer in n (2)"),
    ({"model": "tiny-gqa", "prompt": "def ", "best_of": 2, "stream": True}, 400,
     "cannot stream"),
    ({"model": "tiny-gqa", "prompt": "def ", "max_tokens": 0}, 400, "0 only with echo"),
    ({"model": "tiny-gqa", "prompt": "def ", "top_logprobs": 2}, 400, "chat completions field"),
    ({"model": "tiny-gqa", "prompt": [5, 10 ** 6]}, 400, "token id 1000000, outside"),
    ({"model": "tiny-gqa", "prompt": [[5], []]}, 400, "'prompt' must be a string"),
    ({"model": "tiny-gqa", "prompt": "def ", "functions": [{"name": "f"}]}, 400,
     "does not implement functions"),
    ({"model": "tiny-gqa", "prompt": "def ", "temperature": float("nan")}, 400,
     "'temperature'=NaN is invalid"),
    ({"model": "tiny-gqa", "prompt": "def ", "temperature": 9}, 400, "'temperature'=9"),
    ({"model": "tiny-gqa", "prompt": "a b " * 40}, 400, "this model reads at most 31"),
    ({"model": "tiny-gqa", "prompt": "def ", "max_tokens": 500}, 400,
     "max_tokens=500 does not fit: the prompt is"),
    ({"model": "tiny-gqa", "prompt": "def ", "colour": 1}, 400, "unknown field(s) colour"),
])
def test_bad_requests_get_an_openai_error(server, body, status, says):
    raw = "{not json" if body is None else json.dumps(body, allow_nan=True)
    code, text, _ = server.request("POST", "/v1/completions", raw=raw,
                                   headers={"Authorization": f"Bearer {KEY}"})
    err = json.loads(text)["error"]
    assert code == status and says in err["message"], (code, err)
    assert set(err) == {"message", "type", "param", "code"}


def test_keys_models_health_metrics(server):
    assert server.post("/v1/completions", {"model": "tiny-gqa", "prompt": "def "})[0] == 401
    code, text, _ = server.post("/v1/completions", {"model": "tiny-gqa", "prompt": "def "},
                                headers={"Authorization": "Bearer wrong"})
    assert code == 401 and "not valid" in json.loads(text)["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").completions.create(model="tiny-gqa", prompt="def ")
    assert [m.id for m in server.client().models.list()] == ["tiny-gqa"]
    assert json.loads(server.get("/health")[1])["status"] == "ok"
    metrics = server.get("/metrics")[1]
    for name in ("tinyt_requests_total", "tinyt_generated_tokens_total",
                 "tinyt_time_to_first_token_seconds_bucket",
                 "tinyt_time_between_tokens_seconds_bucket", "tinyt_queue_depth",
                 "tinyt_running_rows"):
        assert name in metrics, name
    assert re.search(r'tinyt_requests_total\{endpoint="completions",status="401"\} [1-9]',
                     metrics)


def _running_rows(server) -> float:
    return float(re.search(r"^tinyt_running_rows (\S+)", server.get("/metrics")[1], re.M)[1])


def test_a_client_that_disconnects_mid_stream_is_cancelled(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps({
        "model": "tiny-gqa", "prompt": "d", "max_tokens": 30, "min_tokens": 30,
        "temperature": 0.7, "stream": True}),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    conn.sock.close()  # gone, without reading the rest
    conn.close()
    deadline = time.time() + 10
    while _running_rows(server) and time.time() < deadline:
        time.sleep(0.05)
    assert _running_rows(server) == 0
    assert server.client().completions.create(model="tiny-gqa", prompt="def ", max_tokens=2,
                                              temperature=0).choices[0].text  # still serving


def test_contract_graph_server_queue_limit_and_no_template(artifacts):
    s = Server(artifacts["contract"], "--max-batch", "1", "--max-queue", "1")
    try:
        c = s.client(key="unused")
        code, text, _ = s.post("/v1/chat/completions", {
            "model": "plain", "messages": [{"role": "user", "content": "hi"}]})
        assert code == 400 and "has no chat template" in json.loads(text)["error"]["message"]
        results = []

        def one():
            code, text, headers = s.post("/v1/completions", {
                "model": "plain", "prompt": "d", "max_tokens": 25, "min_tokens": 25})
            results.append((code, headers.get("Retry-After") or headers.get("retry-after")))
        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        codes = sorted(code for code, _ in results)
        assert 200 in codes and 429 in codes, codes  # one runs, one waits, the rest: busy
        assert all(after == "1" for code, after in results if code == 429)
        assert c.completions.create(model="plain", prompt="def ", max_tokens=3,
                                    temperature=0).choices[0].finish_reason == "length"
    finally:
        assert s.stop() == 0


def test_sigterm_finishes_what_runs_and_exits_0(artifacts):
    s = Server(artifacts["gqa"])
    out = []

    def stream():
        out.append("".join(ch.choices[0].text for ch in s.client().completions.create(
            model="tiny-gqa", prompt="d", max_tokens=20, temperature=0.5, seed=1,
            stream=True, extra_body={"min_tokens": 20})))
    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.3)
    assert s.stop() == 0
    t.join(30)
    assert out and out[0]  # the running stream was finished, not cut


def test_bad_flags_at_start_up_are_one_line(artifacts, tmp_path):
    from conftest import run_tinyt

    for args, says in ((["--port", "70000"], "less than or equal to 65535"),
                       (["--max-batch", "0"], "--max-batch"),
                       (["--api-key", " "], "--api-key is empty")):
        r = run_tinyt("serve", artifacts["gqa"], *args)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run_tinyt("serve", tmp_path / "missing")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = run_tinyt("serve", artifacts["contract"], "--prefill-chunk", "8")
    assert r.returncode == 2 and "prefill_chunk needs a shared-cache graph" in r.stderr, r.stderr
    taken = Server(artifacts["gqa"])
    try:
        r = run_tinyt("serve", artifacts["gqa"], "--port", taken.port)
        assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{taken.port}" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        assert taken.stop() == 0
    assert os.environ.get("TINYT_API_KEY") is None  # the tests' servers read no stray key


def test_max_context_bounds_what_the_server_holds(artifacts):
    """--max-context: the engine's cache is max_batch rows of it, /v1/models reports it as
    max_model_len, and a prompt that leaves no room in it is a 400."""
    s = Server(artifacts["gqa"], "--max-context", "16", "--max-batch", "2")
    try:
        models = json.loads(s.get("/v1/models")[1])["data"]
        assert [m["max_model_len"] for m in models] == [16]
        code, text, _ = s.post("/v1/completions", {"model": "tiny-gqa", "prompt": "x = 1\n" * 20})
        message = json.loads(text)["error"]["message"]
        assert code == 400 and "at most 15 (its context 16" in message, message
        code, text, _ = s.post("/v1/completions", {"model": "tiny-gqa", "prompt": "def ",
                                                   "max_tokens": 100})
        assert code == 400 and "context 16" in json.loads(text)["error"]["message"], text
        code, text, _ = s.post("/v1/completions", {"model": "tiny-gqa", "prompt": "def ",
                                                   "max_tokens": 8, "temperature": 0})
        assert code == 200, text
    finally:
        assert s.stop() == 0
    # the default: the model's context (32 here) when it is under DEFAULT_CONTEXT
    from tinyt.server import DEFAULT_CONTEXT

    assert DEFAULT_CONTEXT == 4096
    s = Server(artifacts["gqa"])
    try:
        assert json.loads(s.get("/v1/models")[1])["data"][0]["max_model_len"] == 32
    finally:
        assert s.stop() == 0
