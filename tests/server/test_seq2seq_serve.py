"""`tinyt serve` on an encoder-decoder (runtime/seq2seq_engine.py, server/seq2seq_jobs.py): a
live server on a free loopback port, always stopped, answering /v1/completions (the prompt is
the source text) as rt.load(artifact).generate does, token for token, alone or batched with
others, whole or streamed; a request joining rows that already run; the OpenAI error of each
request it cannot serve. The model: tests/seq2seq_fixtures.py's small random one."""
import json
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client (dev extra) is not installed")

from live_server import KEY, Server  # noqa: E402
from seq2seq_fixtures import seq2seq_artifact  # noqa: E402

import tinyt.runtime as rt  # noqa: E402
from tinyt.runtime.engine import Done  # noqa: E402
from tinyt.runtime.sampling import SamplingParams  # noqa: E402
from tinyt.runtime.seq2seq_engine import Seq2SeqEngine  # noqa: E402
from tinyt.server.logprobs import TokenTexts  # noqa: E402

NAME = "s2s"
SOURCES = ["The cat sat on the mat.", "Hi", "A longer source, with some more words in it.",
           "Ok then", "zzz"]
MAX = 30  # target tokens a test asks for: SOURCES end at eos and at this length both
FINISH = {"eos": "stop", "length": "length"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    _, path = seq2seq_artifact(tmp_path_factory.mktemp("s2s-serve"))
    return rt.load(path, threads=1)


@pytest.fixture(scope="module")
def server(model):
    s = Server(model.artifact.path, "--max-batch", "4", "--api-key", KEY, "--model-id", NAME)
    yield s
    assert s.stop() == 0  # SIGTERM: stops taking requests, finishes, exits 0


def _post(server, body, path="/v1/completions"):
    code, text, _ = server.post(path, {"model": NAME, **body},
                                headers={"Authorization": f"Bearer {KEY}"})
    return code, json.loads(text) if text.startswith("{") else text


def _metric(server, name: str) -> float:
    _, text, _ = server.get("/metrics")
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[1])


def test_completions_equal_generate_token_for_token(server, model):
    c, texts = server.client(), TokenTexts(model.tokenizer)
    for source, kw in [(s, {}) for s in SOURCES[:3]] + [(SOURCES[0], {"tgt_lang": "de"})]:
        want = model.generate_details([source], max_new_tokens=MAX, **kw)[0]
        r = c.completions.create(model=NAME, prompt=source, max_tokens=MAX, temperature=0,
                                 logprobs=1, extra_body=kw)
        got = r.choices[0]
        assert got.logprobs.tokens == [texts.text(t) for t in want.token_ids], source
        assert (got.text, got.finish_reason) == (want.text, FINISH[want.finish_reason])
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == \
            (len(model.tokenizer.encode_prompt(source)), len(want.token_ids))
    ids = model.tokenizer.encode_prompt(SOURCES[3])  # a prompt of token ids: the source's
    r = c.completions.create(model=NAME, prompt=ids, max_tokens=MAX, temperature=0)
    assert r.choices[0].text == model.generate(SOURCES[3], max_new_tokens=MAX)


def test_a_list_of_sources_of_different_lengths_runs_as_one_batch(server, model):
    before = _metric(server, "tinyt_widest_run_rows")
    r = server.client().completions.create(model=NAME, prompt=SOURCES, max_tokens=MAX,
                                           temperature=0)
    assert [ch.index for ch in r.choices] == list(range(len(SOURCES)))
    assert [ch.text for ch in r.choices] == model.generate(SOURCES, max_new_tokens=MAX) == \
        [model.generate(s, max_new_tokens=MAX) for s in SOURCES]
    assert _metric(server, "tinyt_widest_run_rows") == max(before, 4)  # --max-batch 4


def test_concurrent_requests_each_get_their_own_output(server, model):
    jobs = [dict(prompt=SOURCES[i % 5], max_tokens=5 + (i * 7) % 25, temperature=0)
            for i in range(8)]
    alone = [model.generate(j["prompt"], max_new_tokens=j["max_tokens"]) for j in jobs]
    together = [None] * len(jobs)

    def one(i):
        together[i] = server.client().completions.create(model=NAME, **jobs[i]) \
            .choices[0].text
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert together == alone
    assert _metric(server, "tinyt_widest_step_rows") >= 2


def test_streamed_stopped_and_sampled(server, model):
    c = server.client()
    want = model.generate(SOURCES[1], max_new_tokens=MAX)
    stream = c.completions.create(model=NAME, prompt=SOURCES[1], max_tokens=MAX, temperature=0,
                                  stream=True)
    chunks = list(stream)
    assert "".join(ch.choices[0].text for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"
    cut = want[3:5]
    r = c.completions.create(model=NAME, prompt=SOURCES[1], max_tokens=MAX, temperature=0,
                             stop=[cut])
    assert (r.choices[0].text, r.choices[0].finish_reason) == (want[:want.find(cut)], "stop")
    kw = dict(max_new_tokens=20, temperature=0.8, top_k=20)
    r = c.completions.create(model=NAME, prompt=SOURCES[0], max_tokens=20, temperature=0.8,
                             seed=7, n=2, extra_body={"top_k": 20})
    assert [ch.text for ch in r.choices] == [model.generate(SOURCES[0], seed=s, **kw)
                                             for s in (7, 8)]  # sample k: seed + k


def test_models_lists_it(server, model):
    code, body = server.request("GET", "/v1/models",
                                headers={"Authorization": f"Bearer {KEY}"})[:2]
    (entry,) = json.loads(body)["data"]
    assert code == 200 and entry["id"] == NAME and entry["max_model_len"] == model.context


@pytest.mark.parametrize("path, body, status, says", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, 400,
     "is an encoder-decoder: it translates or summarises a source text (POST "
     "/v1/completions, the source as 'prompt') and does not serve /v1/chat/completions"),
    ("/v1/embeddings", {"input": "Hi"}, 400, "does not serve /v1/embeddings"),
    ("/v1/completions", {"prompt": "Hi", "tgt_lang": "xx"}, 400,
     "tgt_lang='xx' is not a language of this model; its tokenizer spells them __de__, __fr__"),
    ("/v1/completions", {"prompt": "Hi", "tgt_lang": 3}, 400, "'tgt_lang' must be a language"),
    ("/v1/completions", {"prompt": "Hi", "num_beams": 4}, 400,
     "'num_beams'=4: beam search is not served (num_beams 1 only)"),
    ("/v1/completions", {"prompt": "Hi", "echo": True}, 400,
     "'echo' is not offered for an encoder-decoder: the prompt is the source text"),
    ("/v1/completions", {"prompt": "Hi", "response_format": {"type": "json_object"}}, 400,
     "'response_format' is not offered for an encoder-decoder"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 500}, 400,
     "max_tokens=500 does not fit: this encoder-decoder's decoder reads at most 64 target"),
    ("/v1/completions", {"prompt": "x" * 70}, 400,
     "prompt 0 is 70 tokens; this encoder reads at most 64 source tokens"),
    ("/v1/completions", {"prompt": ["Hi", ""]}, 400, "prompt 1 is empty"),
    ("/v1/completions", {"prompt": "Hi", "best_of": 2, "stream": True}, 400, "cannot stream"),
    ("/v1/completions", {"prompt": "Hi", "suffix": "!"}, 400, "does not implement suffix"),
    ("/v1/completions", {"prompt": "Hi", "colour": 1}, 400, "unknown field(s) colour"),
])
def test_what_it_cannot_serve_is_a_named_400(server, path, body, status, says):
    code, answer = _post(server, body, path)
    err = answer["error"]
    assert code == status and says in err["message"], (code, err)
    assert set(err) == {"message", "type", "param", "code"}


def test_a_request_joins_rows_that_already_run(model):
    """The engine alone: a request submitted once another has made its second token takes its
    tokens in the same steps (its own cohort), and each answer is what it is alone."""
    long_source = SOURCES[1]  # runs to MAX tokens (asserted below)
    engine = Seq2SeqEngine(model, max_batch=4).start()
    joined = []

    def on_second_token(event):  # on the engine's thread, between two steps
        if len(first.out) == 2 and not joined:
            joined.append(engine.submit(model.tokenizer.encode_prompt(SOURCES[0]),
                                        SamplingParams(max_new_tokens=MAX)))
    try:
        first = engine.submit(model.tokenizer.encode_prompt(long_source),
                              SamplingParams(max_new_tokens=MAX), listener=on_second_token)
        deadline = time.time() + 30
        while not (joined and joined[0].done) and time.time() < deadline:
            first.wait(0.1)
            if joined:
                joined[0].wait(0.1)
        assert isinstance(first.done, Done) and joined and isinstance(joined[0].done, Done)
    finally:
        engine.stop(cancel=True)
    want = model.generate_details([long_source, SOURCES[0]], max_new_tokens=MAX)
    assert [first.out, joined[0].out] == [w.token_ids for w in want]
    assert len(first.out) == MAX and len(joined[0].out) >= 1
    assert engine.widest_step == 2 and engine.widest_run == 1  # two cohorts, one step
