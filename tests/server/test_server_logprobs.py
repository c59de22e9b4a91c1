"""`tinyt serve`'s logprobs, echo, n, best_of and token-id prompts through the `openai` client
and raw HTTP, each number against tinyt.runtime's own for the same artifact; vLLM's tokenizer
routes (/tokenize, /detokenize, /tokenizer_info), which lm-evaluation-harness reads."""
import json
import math

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client (dev extra) is not installed")

from chat_model import TEMPLATE, chat_gqa  # noqa: E402
from live_server import KEY, Server  # noqa: E402

import tinyt.runtime as rt  # noqa: E402

# The server and the test's own runtime run the same graph on the same tokens; the prompt runs
# in other batch shapes there (a staging cache of its own), so fp32 GEMMs may sum in another
# order: a few ulps of logits of size ~10, as tests/runtime/test_logprobs.py's SAME_GRAPH_TOL.
TOL = 1e-4


@pytest.fixture(scope="module")
def artifact(tiny_ckpt, tmp_path_factory):
    return chat_gqa(tiny_ckpt, tmp_path_factory.mktemp("serve-logprobs"))


@pytest.fixture(scope="module")
def server(artifact):
    s = Server(artifact, "--max-batch", "4", "--api-key", KEY)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def lm(artifact):
    return rt.load(artifact, threads=1, tune=False)


def _metric(server, name: str) -> float:
    text = server.request("GET", "/metrics")[1]
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith(name + " ")))


def test_echo_scores_the_prompt_as_the_runtime_does(server, lm):
    """lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs 1, max_tokens
    1 (and 0), temperature 0."""
    c = server.client()
    ids = lm.tokenizer.encode("def parse(argv):\n    return argv")[:20]
    want = lm.prompt_logprobs(ids, top=1)
    for max_tokens in (1, 0):
        r = c.completions.create(model="tiny-gqa", prompt=ids, max_tokens=max_tokens,
                                 temperature=0, logprobs=1, echo=True)
        lp = r.choices[0].logprobs
        n = len(ids) + max_tokens
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        for got, w in zip(lp.token_logprobs[1:len(ids)], want[1:]):
            assert abs(got - w.logprob) <= TOL
        for top, w in zip(lp.top_logprobs[1:len(ids)], want[1:]):
            assert len(top) == 1 and abs(max(top.values()) - w.top[0][1]) <= TOL
        assert r.choices[0].text.startswith(lm.tokenizer.decode(ids))
        assert lp.tokens[:len(ids)] == [lm.tokenizer.decode([t]) for t in ids]
        offsets = [0]
        for t in lp.tokens[:-1]:
            offsets.append(offsets[-1] + len(t))
        assert lp.text_offset == offsets
        assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == max_tokens
    # is_greedy as lm-evaluation-harness decides it: each token equal to its top alternative
    greedy = [ids[0]]
    for _ in range(8):
        greedy.append(int(lm.prompt_logprobs(greedy + [0], top=1)[-1].top[0][0]))
    r = c.completions.create(model="tiny-gqa", prompt=greedy, max_tokens=1, temperature=0,
                             logprobs=1, echo=True)
    lp = r.choices[0].logprobs
    assert all(t == max(top.values()) for t, top in
               zip(lp.token_logprobs[1:-1], lp.top_logprobs[1:-1]))


def test_generated_logprobs_n_and_best_of(server, lm):
    c = server.client()
    r = c.completions.create(model="tiny-gqa", prompt="def ", max_tokens=5, temperature=0,
                             logprobs=3)
    ids = lm.tokenizer.encode_prompt("def ")
    made = lm.generate_ids([ids], max_new_tokens=5)[0].token_ids
    lp = r.choices[0].logprobs
    assert lp.tokens == [lm.tokenizer.decode([t]) for t in made]
    for k in range(len(made)):  # each token's logprob: the prompt so far, scored
        w = lm.prompt_logprobs(ids + made[:k + 1], top=3)[-1]
        assert abs(lp.token_logprobs[k] - w.logprob) <= TOL
        assert len(lp.top_logprobs[k]) <= 3  # two tokens may share a text
        assert abs(max(lp.top_logprobs[k].values()) - lp.token_logprobs[k]) <= TOL  # greedy
    # n samples of one prompt, seeded: sample k draws from seed + k; admitted together, the
    # prompt runs once and the other samples copy its rows (4 rows: "def "'s 3 samples first)
    before = _metric(server, "tinyt_shared_prompt_tokens")
    r = c.completions.create(model="tiny-gqa", prompt=["def ", "x = "], max_tokens=6,
                             temperature=1.0, seed=11, n=3)
    assert [ch.index for ch in r.choices] == list(range(6))
    for p, prompt in enumerate(["def ", "x = "]):
        for k in range(3):
            assert r.choices[3 * p + k].text == lm.generate(prompt, max_new_tokens=6,
                                                            temperature=1.0, seed=11 + k)
    assert r.usage.prompt_tokens == len(ids) + len(lm.tokenizer.encode_prompt("x = "))
    assert _metric(server, "tinyt_shared_prompt_tokens") - before >= 2 * len(ids)
    # best_of: the n of best_of samples with the highest total logprob
    r = c.completions.create(model="tiny-gqa", prompt="def ", max_tokens=6, temperature=1.0,
                             seed=3, n=2, best_of=4, logprobs=0)
    samples = [lm.generate_details(["def "], max_new_tokens=6, temperature=1.0, seed=3 + k)[0]
               for k in range(4)]
    totals = [sum(lp.logprob for lp in lm.prompt_logprobs(ids + s.token_ids)[len(ids):])
              for s in samples]
    best = sorted(sorted(range(4), key=lambda k: -totals[k])[:2])
    assert [ch.text for ch in r.choices] == [samples[k].text for k in best]
    for ch, k in zip(r.choices, best):
        assert math.isclose(sum(ch.logprobs.token_logprobs), totals[k], abs_tol=10 * TOL)


def test_chat_logprobs_and_streams(server, lm):
    c = server.client()
    messages = [{"role": "user", "content": "def f"}]
    r = c.chat.completions.create(model="tiny-gqa", messages=messages, max_tokens=5,
                                  temperature=0, logprobs=True, top_logprobs=2, n=2)
    assert len(r.choices) == 2 and r.choices[0].message.content == r.choices[1].message.content
    content = r.choices[0].logprobs.content
    ids = lm.tokenizer.encode_prompt("u:def f\na:")
    made = lm.generate_ids([ids], max_new_tokens=5)[0].token_ids
    assert [e.token for e in content] == [lm.tokenizer.decode([t]) for t in made]
    for k, e in enumerate(content):
        w = lm.prompt_logprobs(ids + made[:k + 1], top=2)[-1]
        assert abs(e.logprob - w.logprob) <= TOL and len(e.top_logprobs) == 2
        assert [a.token for a in e.top_logprobs] == [lm.tokenizer.decode([t]) for t, _ in w.top]
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    # streamed: the same tokens and logprobs, chunk by chunk
    chunks = list(c.chat.completions.create(model="tiny-gqa", messages=messages, max_tokens=5,
                                            temperature=0, logprobs=True, top_logprobs=2,
                                            stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    # a streamed completion with echo and logprobs: the scored prompt first
    chunks = list(c.completions.create(model="tiny-gqa", prompt="def ", max_tokens=3,
                                       temperature=0, logprobs=1, echo=True, stream=True))
    first = chunks[0].choices[0]
    assert first.text == "def " and first.logprobs.token_logprobs[0] is None
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == "def " + lm.generate("def ", max_new_tokens=3)


def test_tokenizer_routes(server, lm):
    status, text, _ = server.post("/tokenize", {"prompt": "def f(x):", "add_special_tokens":
                                                False}, headers={"Authorization": f"Bearer {KEY}"})
    body = json.loads(text)
    assert status == 200 and body["tokens"] == lm.tokenizer.encode("def f(x):")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == lm.context
    status, text, _ = server.post("/detokenize", {"tokens": body["tokens"]},
                                  headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and json.loads(text)["prompt"] == "def f(x):"
    status, text, _ = server.request("GET", "/tokenizer_info",
                                     headers={"Authorization": f"Bearer {KEY}"})
    info = json.loads(text)
    assert status == 200 and info["eos_token"] == lm.tokenizer.eos_token
    assert info["chat_template"] == TEMPLATE
    for path, bad, says in [("/tokenize", {"prompt": 3}, "'prompt' must be"),
                            ("/tokenize", {}, "'prompt' is required"),
                            ("/detokenize", {"tokens": [1, -2]}, "token ids in 0.."),
                            ("/tokenize", {"prompt": "x", "colour": 1}, "unknown field")]:
        status, text, _ = server.post(path, bad, headers={"Authorization": f"Bearer {KEY}"})
        assert status == 400 and says in json.loads(text)["error"]["message"], (path, bad)
    assert server.post("/tokenize", {"prompt": "x"})[0] == 401  # the key is asked for


def test_a_held_prefix_is_reused_and_counted(server, lm):
    c = server.client()
    head = lm.tokenizer.encode("def parse_args(argv):\n    result = argv * 2 + 7\n" * 3)[:18]

    def reused() -> float:
        return _metric(server, "tinyt_prefix_reused_tokens")
    before = reused()
    for tail in ("x", "import os"):
        ids = head + lm.tokenizer.encode(tail)
        r = c.completions.create(model="tiny-gqa", prompt=ids, max_tokens=4, temperature=0)
        assert r.choices[0].text == lm.generate_ids([ids], max_new_tokens=4)[0].text
    assert reused() - before >= 18  # the second prompt copied the shared 18 tokens at least
