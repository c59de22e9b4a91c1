"""`tinyt serve` on an encoder artifact (POST /v1/embeddings), against servers the tests start on
free loopback ports and always stop: float and base64 answers against `Encoder.embed`, usage,
token ids run as given, the OpenAI error of each bad request, concurrent requests each with its
own answer, the Embedder grouping waiting requests into shared runs, the official openai
client, and the routes a server's model does not serve (an encoder's completions, a language
model's embeddings) answered with the ones it does."""
import base64
import json
import threading

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")

from live_server import KEY, Server  # noqa: E402

import tinyt.runtime as rt  # noqa: E402
from tinyt.errors import QueueFull  # noqa: E402

# The same inputs run in other batches (other padding, other row counts) move the last bits
ATOL = 1e-6
TEXTS = ["A man is eating food.", "short", "The quick brown fox jumps over the lazy dog. " * 40,
         "Ünïcode café, naïve façade — 東京!", "def __init__(self): return None"]
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """A one-layer sentence-transformers BertModel (mean pooling, Normalize, cut at 256)
    imported and exported as the encoder artifact 'minilm'."""
    from hf_fixtures import save_bert

    from tinyt.export import export_onnx
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("embed")
    save_bert(root / "st", num_hidden_layers=1)
    import_hf(root / "st", root / "ckpt")
    return export_onnx(root / "ckpt", root / "minilm")


@pytest.fixture(scope="module")
def enc(artifact):
    return rt.load(artifact, threads=1)


@pytest.fixture(scope="module")
def server(artifact):
    s = Server(artifact, "--api-key", KEY, "--max-batch", "4")
    yield s
    assert s.stop() == 0


def embed(server, body, **kw):
    """(status, answer or error) of POST /v1/embeddings with the key."""
    code, text, _ = server.post("/v1/embeddings", {"model": "minilm", **body},
                                headers=AUTH, **kw)
    return code, json.loads(text)


def vectors(answer) -> np.ndarray:
    """The answer's embeddings in index order, floats or base64 alike."""
    data = sorted(answer["data"], key=lambda d: d["index"])
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
                     if isinstance(d["embedding"], str) else np.array(d["embedding"], np.float32)
                     for d in data])


def close(got, want, what=""):
    """Shape, then dtype, then values (the worst difference)."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == want.dtype == np.float32, (what, got.dtype, want.dtype)
    worst = float(np.abs(got - want).max())
    assert worst <= ATOL, f"{what}: worst difference {worst:.2e} > {ATOL:.0e}"


def test_float_and_base64_answers_are_embed_of_the_texts(server, enc):
    want = enc.embed(TEXTS)
    tokens = sum(len(ids) for ids, _ in enc.encode(TEXTS))
    assert tokens < sum(len(t) for t in TEXTS)  # the long text is cut at 256 and counted so
    for fmt in (None, "float", "base64"):
        code, answer = embed(server, {"input": TEXTS} | ({"encoding_format": fmt} if fmt else {}))
        assert code == 200, answer
        assert (answer["object"], answer["model"]) == ("list", "minilm")
        assert [(d["object"], d["index"]) for d in answer["data"]] == \
            [("embedding", i) for i in range(len(TEXTS))]
        kind = str if fmt == "base64" else list
        assert all(isinstance(d["embedding"], kind) for d in answer["data"]), fmt
        close(vectors(answer), want, f"encoding_format={fmt}")
        assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    code, answer = embed(server, {"input": "short", "user": "u1", "dimensions": enc.dim})
    assert code == 200 and len(answer["data"]) == 1, answer
    close(vectors(answer), enc.embed(["short"]), "one string")
    assert answer["usage"]["prompt_tokens"] == len(enc.encode(["short"])[0][0])  # [CLS] [SEP]


def test_token_ids_run_as_given_equal_the_texts(server, enc):
    ids = [row for row, _ in enc.encode(TEXTS)]
    code, answer = embed(server, {"input": ids, "encoding_format": "base64"})
    assert code == 200, answer
    close(vectors(answer), enc.embed(TEXTS), "lists of token ids")
    assert answer["usage"]["prompt_tokens"] == sum(map(len, ids))
    code, answer = embed(server, {"input": ids[0]})  # one list of ids: one input
    assert code == 200 and len(answer["data"]) == 1, answer
    close(vectors(answer), enc.embed(TEXTS[:1]), "one list of token ids")
    # nothing added: the ids without [CLS] and [SEP] are another input
    code, answer = embed(server, {"input": [ids[0][1:-1]]})
    assert answer["usage"]["prompt_tokens"] == len(ids[0]) - 2
    assert np.abs(vectors(answer) - enc.embed(TEXTS[:1])).max() > 1e-3


@pytest.mark.parametrize("body, status, param, says", [
    ({"input": []}, 400, "input", "'input' is an empty list"),
    ({"input": ""}, 400, "input", "input[0] is an empty string"),
    ({"input": ["a", ""]}, 400, "input", "input[1] is an empty string"),
    ({"input": [[]]}, 400, "input", "input[0] is an empty list of token ids"),
    ({"input": 5}, 400, "input", "'input' must be a non-empty string, a list of them, a list of "
                                 "token ids, or a list of lists of token ids, got 5"),
    ({}, 400, "input", "'input' must be a non-empty string"),
    ({"input": ["a", 3]}, 400, "input", "not a mix; input[1] is 3"),
    ({"input": [[5], "a"]}, 400, "input", "not a mix; input[1] is \"a\""),
    ({"input": [[101, True]]}, 400, "input", "input[0][1] is true, not a token id of this "
                                             "model: an integer in 0..30521"),
    ({"input": [101, 1.5]}, 400, "input", "input[1] is 1.5, not a token id"),
    ({"input": [{"a": 1}]}, 400, "input", "input[0] is {\"a\": 1}, not a token id"),
    ({"input": ["a"] * 2049}, 400, "input", "'input' has 2049 inputs; at most 2048"),
    ({"input": [[101, 30522, 102]]}, 400, "input",
     "input[0][1] is 30522, not a token id of this model: an integer in 0..30521"),
    ({"input": [[5], [101, -1]]}, 400, "input", "input[1][1] is -1, not a token id"),
    ({"input": [[101] * 257]}, 400, "input",
     "input[0] is 257 token ids; this model reads at most 256 per input"),
    ({"input": [101] * 257}, 400, "input", "input is 257 token ids; this model reads at most"),
    ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format",
     "'encoding_format'=\"int8\" is invalid: 'float' or 'base64'"),
    ({"input": "a", "dimensions": 32}, 400, "dimensions",
     "'dimensions'=32: this model's embeddings have 64 dimensions and tinyt does not shorten"),
    ({"input": "a", "dimensions": "64"}, 400, "dimensions", "'dimensions' must be an integer"),
    ({"input": "a", "user": 7}, 400, "user", "'user' must be a string"),
    ({"input": "a", "prompt": "b"}, 400, "prompt",
     "unknown field(s) prompt; tinyt reads dimensions, encoding_format, input, model, user"),
    ({"input": "a", "model": "other"}, 404, "model", "model 'other' does not exist"),
])
def test_bad_requests_get_an_openai_error(server, body, status, param, says):
    code, answer = embed(server, body)
    err = answer["error"]
    assert (code, err["param"]) == (status, param) and says in err["message"], (code, err)
    assert set(err) == {"message", "type", "param", "code"}


def test_the_routes_an_encoder_does_not_serve_name_the_one_it_does(server):
    code, text, _ = server.request("POST", "/v1/embeddings", raw="{not json", headers=AUTH)
    assert code == 400 and "not valid JSON" in json.loads(text)["error"]["message"]
    assert server.post("/v1/embeddings", {"model": "minilm", "input": "a"})[0] == 401
    for path, body in (("/v1/completions", {"prompt": "a"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]})):
        code, text, _ = server.post(path, {"model": "minilm", **body}, headers=AUTH)
        err = json.loads(text)["error"]
        assert (code, err["param"]) == (400, "model"), (path, code, err)
        assert "is an encoder: it makes sentence embeddings (POST /v1/embeddings)" in \
            err["message"], err
    code, text, _ = server.request("GET", "/v1/models", headers=AUTH)
    assert code == 200 and [(m["id"], m["max_model_len"]) for m in json.loads(text)["data"]] \
        == [("minilm", 256)]
    assert json.loads(server.get("/health")[1])["status"] == "ok"
    metrics = server.get("/metrics")[1]
    assert 'tinyt_requests_total{endpoint="embeddings",status="200"}' in metrics
    assert 'tinyt_requests_total{endpoint="completions",status="400"}' in metrics


def test_concurrent_requests_each_get_their_own_embeddings(server, enc):
    words = ["alpha", "beta gamma", "delta epsilon zeta", "eta", "theta iota kappa lambda"]
    jobs = [[f"{words[(i + k) % 5]} {i}" * (1 + (i + k) % 3) for k in range(1 + i % 3)]
            for i in range(16)]
    answers: list = [None] * len(jobs)

    def one(i):
        answers[i] = embed(server, {"input": jobs[i],
                                    "encoding_format": "base64" if i % 2 else "float"})
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, (texts, (code, answer)) in enumerate(zip(jobs, answers)):
        assert code == 200, (i, answer)
        close(vectors(answer), enc.embed(texts), f"request {i}")
        assert answer["usage"]["prompt_tokens"] == sum(len(r) for r, _ in enc.encode(texts))


def test_waiting_requests_share_runs(enc):
    """What waits when the encoder is free runs together, whole requests up to max_batch
    inputs, sorted by length; a request over max_batch runs alone in runs of max_batch."""
    from tinyt.server import Embedder

    e = Embedder(enc, max_batch=4, max_queue=8)
    groups = [TEXTS[:1], TEXTS[1:3], TEXTS[3:4], TEXTS]  # 1 + 2 + 1 inputs, then 5
    futures = [e.submit(e.rows(g, [])) for g in groups]  # all waiting before the thread runs
    cancelled = e.submit(e.rows(["never run"], []))
    assert cancelled.cancel() and e.queue_depth == 5
    e.start()
    try:
        for g, f in zip(groups, futures):
            close(f.result(60), enc.embed(g), f"{len(g)} texts")
    finally:
        e.stop(timeout=30)
    assert e.runs == 1 + 2 and e.queue_depth == 0  # [1, 2, 1] together; the 5 in runs of 4
    with pytest.raises(QueueFull, match="stopping"):
        e.submit(e.rows(["late"], []))


def test_a_full_queue_is_a_429_and_a_failed_run_a_500(enc, monkeypatch):
    """Through the handler, without HTTP: max_queue requests waiting, then a run that fails
    (its requests answered 500, the thread serving on)."""
    import asyncio
    from types import SimpleNamespace

    from tinyt.server import Embedder, OpenAIServer
    from tinyt.server import embeddings as module

    e = Embedder(enc, max_queue=1)
    s = OpenAIServer(enc, e, model_id="minilm")
    async def body():
        return json.dumps({"model": "minilm", "input": "a"}).encode()
    request = SimpleNamespace(headers={}, body=body)
    waiting = e.submit(e.rows(["first"], []))  # not started: it waits
    response = asyncio.run(s.embeddings(request))
    err = json.loads(response.body)["error"]
    assert (response.status_code, err["type"]) == (429, "rate_limit_error"), err
    assert "1 requests are waiting (max_queue 1)" in err["message"]
    assert response.headers["retry-after"] == "1"
    monkeypatch.setattr(module, "run_rows", lambda enc, rows: 1 / 0)
    e.start()
    try:
        with pytest.raises(ZeroDivisionError):
            waiting.result(30)
        response = asyncio.run(s.embeddings(request))
        assert response.status_code == 500
        assert json.loads(response.body)["error"]["message"] == \
            "embedding failed: division by zero"
        monkeypatch.undo()
        response = asyncio.run(s.embeddings(request))
        assert response.status_code == 200
        close(vectors(json.loads(response.body)), enc.embed(["a"]), "after a failed run")
    finally:
        e.stop(timeout=30)


def test_the_openai_client_reads_an_embedding(server, enc):
    openai = pytest.importorskip("openai", reason="the openai client (dev extra) is not "
                                                  "installed")
    client = server.client()
    r = client.embeddings.create(model="minilm", input=TEXTS[:2])  # the client asks base64
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    close(got, enc.embed(TEXTS[:2]), "openai client, its default (base64)")
    r = client.embeddings.create(model="minilm", input="short", encoding_format="float")
    close(np.array([r.data[0].embedding], dtype=np.float32), enc.embed(["short"]),
          "openai client, float")
    assert r.usage.prompt_tokens == r.usage.total_tokens == len(enc.encode(["short"])[0][0])
    with pytest.raises(openai.BadRequestError, match="does not shorten"):
        client.embeddings.create(model="minilm", input="a", dimensions=8)


def test_a_language_model_server_names_its_routes_for_embeddings(lm_onnx):
    s = Server(lm_onnx)
    try:
        code, text, _ = s.post("/v1/embeddings", {"model": "lm", "input": "def "})
        err = json.loads(text)["error"]
        assert (code, err["param"]) == (400, "model"), (code, err)
        assert "is a language model: it generates text (POST /v1/completions, " \
               "/v1/chat/completions) and makes no embeddings" in err["message"], err
        assert s.post("/v1/completions", {"model": "lm", "prompt": "def ",
                                          "max_tokens": 2})[0] == 200
    finally:
        assert s.stop() == 0


def test_decoder_flags_on_an_encoder_are_one_line(artifact):
    from conftest import run_tinyt

    r = run_tinyt("serve", artifact, "--max-context", "16", "--prefill-chunk", "8")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is an encoder: --max-context and --prefill-chunk only apply to a language " \
           "model's" in r.stderr and "at most 256 tokens per input" in r.stderr, r.stderr
