"""Log-probabilities (runtime/score.py) and incremental text (runtime/detok.py): a prompt's
every position scored by the contract graph and by the shared-cache graphs (their lm_head run
alone on the hidden states) equals PyTorch's log_softmax; a position scores what the graph
gives a prompt ending there; the engine's Token logprobs, Scored prompts (whole and in
chunked pieces) and max_new_tokens=0; a stream decodes each token once."""
import numpy as np
import pytest
import torch

import tinyt.runtime as rt
from tinyt.checkpoint import load_checkpoint
from tinyt.errors import ConfigError
from tinyt.runtime.detok import TextStream
from tinyt.runtime.engine import Done, Engine, Scored, Token
from tinyt.runtime.sampling import SamplingParams
from tinyt.runtime.score import MAX_TOP, log_softmax, logprobs_of

# fp32 graphs against PyTorch: logits agree to ~1e-5 here (the stages' own bound is 1e-4), and
# a logprob is a logit less a log-sum-exp of them: within 2x that
FP32_LOGPROB_TOL = 2e-4
# The same graph's lm_head on the same row, run over several rows or alone: float GEMMs may sum
# in another order for another row count (a few ulps of logits of size ~10)
SAME_GRAPH_TOL = 1e-4


@pytest.fixture(scope="module")
def artifacts(lm_onnx, tmp_path_factory, corpus_dir):
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    root = tmp_path_factory.mktemp("logprobs")
    opt = optimize(lm_onnx, root / "opt")
    int8 = quantize(opt, root / "int8", data=str(corpus_dir))
    qgemm = quantize(opt, root / "qgemm", kernel="qgemm", data=str(corpus_dir))
    int4 = quantize(opt, root / "int4", bits=4, data=str(corpus_dir))
    return {"onnx": lm_onnx, "fp32-gqa": optimize(opt, root / "gqa", target="gqa"),
            "pair": optimize(int8, root / "pair", target="gqa", prefill_from=qgemm),
            "int4-gqa": optimize(int4, root / "int4-gqa", target="gqa")}


@pytest.fixture(scope="module")
def ids(tiny_ckpt):
    tok = load_checkpoint(tiny_ckpt).tokenizer
    return tok.encode("def parse_args(argv):\n    return argv[1:] + [x for x in argv]\n")[:24]


def torch_logprobs(ckpt, ids) -> np.ndarray:
    ck = load_checkpoint(ckpt)
    with torch.no_grad():
        logits = ck.model(torch.tensor([ids]))[0][0].double()
    lp = torch.log_softmax(logits[:, :ck.tokenizer.vocab_size], -1).numpy()
    return lp[np.arange(len(ids) - 1), ids[1:]]


def test_log_softmax_and_top():
    logits = np.array([[1.0, 3.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    lp = log_softmax(logits)
    np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0, rtol=1e-12)
    got = logprobs_of(logits, [2, 0], top=3)
    assert got[0].token == 2 and got[0].logprob == pytest.approx(lp[0, 2])
    assert [t for t, _ in got[0].top] == [1, 3, 2]  # most likely first, ties by id
    assert got[1].logprob == pytest.approx(-np.log(4))
    with pytest.raises(ConfigError, match="0..20"):
        rt.score.check_top(MAX_TOP + 1)


@pytest.mark.parametrize("name", ["onnx", "fp32-gqa"])
def test_prompt_logprobs_match_pytorch(artifacts, tiny_ckpt, ids, name):
    lm = rt.load(artifacts[name], threads=1, tune=False)
    got = lm.prompt_logprobs(ids, top=5)
    assert got[0] is None and len(got) == len(ids)
    want = torch_logprobs(tiny_ckpt, ids)
    have = np.array([g.logprob for g in got[1:]])
    assert np.abs(have - want).max() <= FP32_LOGPROB_TOL
    for g, t in zip(got[1:], ids[1:]):
        assert g.token == t and len(g.top) == 5
        assert g.top[0][1] >= g.logprob - FP32_LOGPROB_TOL  # the best is at least the token's


# The pair's prompt graph (quantize --kernel qgemm) quantizes activations with one scale over
# all of a run's positions: a position scored inside a 24-token prompt and the same position
# ending a shorter one see other scales, so they differ by int8 rounding of the activations
# (each moves by at most half a step, 1/254 of the largest). Measured 4e-4 here; the bound
# leaves 25x.
PER_TENSOR_TOL = 1e-2


@pytest.mark.parametrize("name, tol", [("fp32-gqa", SAME_GRAPH_TOL), ("int4-gqa", SAME_GRAPH_TOL),
                                       ("pair", PER_TENSOR_TOL)])
def test_a_position_scores_what_a_prompt_ending_there_gets(artifacts, ids, name, tol):
    """Position k's distribution from prompt_logprobs is the graph's own last-token logits
    for the prompt ids[:k+1] (the engine and generate choose from those); exactly so where the
    graph computes each position alone (fp32, MatMulNBits' per-row blocks)."""
    lm = rt.load(artifacts[name], threads=1, tune=False)
    got = lm.prompt_logprobs(ids, top=MAX_TOP)
    for k in (1, 7, len(ids) - 2):
        cache = lm.take_cache(1, k + 2)
        try:
            cache.clear()
            logits = cache.prefill([ids[:k + 1]], lm.pad_id)[0, 0].copy()
        finally:
            lm.give_cache(cache)
        lp = log_softmax(logits[:lm.tokenizer.vocab_size])  # ids with no text: never chosen
        assert abs(got[k + 1].logprob - lp[ids[k + 1]]) <= tol, k
        best = [t for t, _ in got[k + 1].top]
        assert best[0] == int(np.argmax(lp)), k  # the greedy token is the first alternative


def test_old_pairs_without_hidden_states_are_refused_by_name(artifacts, tmp_path):
    import shutil

    import onnx

    old = tmp_path / "old"
    shutil.copytree(artifacts["fp32-gqa"], old)
    proto = onnx.load(str(old / "model.onnx"))
    keep = [o for o in proto.graph.output if o.name != "hidden_states"]
    del proto.graph.output[:]
    proto.graph.output.extend(keep)
    onnx.save(proto, str(old / "model.onnx"))
    import json

    from tinyt.manifest import sha256_file  # the file changed: its recorded hash too
    manifest = json.loads((old / "manifest.json").read_text())
    path = old / "model.onnx"
    manifest["files"]["model.onnx"] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (old / "manifest.json").write_text(json.dumps(manifest))
    lm = rt.load(old, threads=1, tune=False)
    assert lm.generate("def ", max_new_tokens=3) is not None  # it still generates
    with pytest.raises(ConfigError, match="hidden_states.*optimize --target gqa"):
        lm.prompt_logprobs([1, 2, 3])


@pytest.mark.parametrize("name, chunk", [("pair", None), ("fp32-gqa", 5), ("onnx", None)])
def test_engine_logprobs_and_echo(artifacts, ids, name, chunk):
    lm = rt.load(artifacts[name], threads=1, tune=False)
    want_prompt = lm.prompt_logprobs(ids, top=2)
    engine = Engine(lm, max_batch=2, prefill_chunk=chunk).start()
    try:
        req = engine.submit(ids, SamplingParams(max_new_tokens=6), logprobs=3, prompt_logprobs=2)
        scored_only = engine.submit(ids, SamplingParams(max_new_tokens=0), prompt_logprobs=0)
        events = []
        while not isinstance(ev := req.next_event(30), Done):
            assert ev is not None
            events.append(ev)
        other = []
        while not isinstance(ev := scored_only.next_event(30), Done):
            other.append(ev)
        assert ev.finish_reason == "length" and ev.text == ""
    finally:
        engine.stop()
    assert isinstance(events[0], Scored) and all(isinstance(e, Token) for e in events[1:])
    for got, want in zip(events[0].prompt[1:], want_prompt[1:]):
        assert got.token == want.token
        assert abs(got.logprob - want.logprob) <= SAME_GRAPH_TOL
        assert [t for t, _ in got.top] == [t for t, _ in want.top]
    assert len(other) == 1 and isinstance(other[0], Scored)  # scored, nothing generated
    assert [g.top for g in other[0].prompt[1:]] == [()] * (len(ids) - 1)
    tokens = [e for e in events[1:]]
    assert [t.id for t in tokens] == req.out
    for t in tokens:  # greedy: each chosen token is its position's most likely
        assert t.logprob.token == t.id and len(t.logprob.top) == 3
        assert t.logprob.top[0][0] == t.id and t.logprob.top[0][1] == t.logprob.logprob
    # the first generated token's logprob is the prompt's last position's distribution
    assert abs(tokens[0].logprob.logprob - lm.prompt_logprobs(ids + [tokens[0].id])[-1].logprob) \
        <= SAME_GRAPH_TOL


def test_engine_refuses_bad_logprobs(artifacts, ids):
    lm = rt.load(artifacts["fp32-gqa"], threads=1, tune=False)
    engine = Engine(lm, max_batch=1)
    for bad in (-1, MAX_TOP + 1, 1.5, True):
        with pytest.raises(ConfigError, match="logprobs"):
            engine.submit(ids, SamplingParams(max_new_tokens=1), logprobs=bad)


def test_text_stream_pieces_are_the_text_and_each_token_decodes_once(tiny_ckpt, monkeypatch):
    tok = load_checkpoint(tiny_ckpt).tokenizer
    rng = np.random.default_rng(0)
    calls = []
    decode = type(tok).decode
    monkeypatch.setattr(type(tok), "decode", lambda self, ids: (calls.append(len(ids)),
                                                                decode(self, ids))[1])
    for trial in range(30):
        ids = rng.integers(0, tok.vocab_size, size=int(rng.integers(1, 60))).tolist()
        stops = ("\n\n", "):") if trial % 2 else ()
        ts = TextStream(tok, stops)
        pieces = []
        for t in ids:
            ts.add(t)
            if ts.stopped:
                break
            pieces.append(ts.piece())
        final = ts.finish()
        pieces.append(ts.last_piece(final))
        full = decode(tok, ts.ids)
        cut = min((full.find(s) for s in stops if s in full), default=len(full))
        assert final == full[:cut]
        assert "".join(pieces) == final
    assert calls and max(calls) <= 60 and len(calls) == 30  # one whole decode per sequence


def test_stream_and_stop_decode_once_per_generation(artifacts, monkeypatch):
    lm = rt.load(artifacts["fp32-gqa"], threads=1, tune=False)
    want = lm.generate("def ", max_new_tokens=40, stop=["\n\n\n"])
    calls = []
    decode = type(lm.tokenizer).decode
    monkeypatch.setattr(type(lm.tokenizer), "decode", lambda self, ids: (
        calls.append(len(ids)), decode(self, ids))[1])
    assert "".join(lm.stream("def ", max_new_tokens=40, stop=["\n\n\n"])) == want
    assert len(calls) == 1  # not once a token


@pytest.mark.parametrize("name", ["onnx", "fp32-gqa"])
def test_generate_gives_each_token_s_logprob(artifacts, ids, name):
    """rt.load(...).generate_details(..., logprobs=N): each token's logprob is the prompt
    so far scored, and greedy's token is its own top alternative."""
    lm = rt.load(artifacts[name], threads=1, tune=False)
    prompt = ids[:8]
    (r,) = lm.generate_ids([prompt], max_new_tokens=6, logprobs=2)
    assert [lp.token for lp in r.logprobs] == r.token_ids
    for k, lp in enumerate(r.logprobs):
        want = lm.prompt_logprobs(prompt + r.token_ids[:k + 1])[-1]
        assert abs(lp.logprob - want.logprob) <= SAME_GRAPH_TOL
        assert lp.top[0] == (lp.token, lp.logprob) and len(lp.top) == 2
    sampled = lm.generate_details([lm.tokenizer.decode(prompt)], max_new_tokens=6,
                                  temperature=1.0, seed=5, logprobs=0)[0]
    assert sampled.token_ids == lm.generate_details([lm.tokenizer.decode(prompt)],
                                                    max_new_tokens=6, temperature=1.0,
                                                    seed=5)[0].token_ids  # the same draws
    assert len(sampled.logprobs) == len(sampled.token_ids)
    assert lm.generate_ids([prompt], max_new_tokens=3)[0].logprobs is None
    with pytest.raises(ConfigError, match="logprobs"):
        lm.generate_ids([prompt], max_new_tokens=3, logprobs=99)
