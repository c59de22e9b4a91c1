"""Prompt-prefix reuse (runtime/prefix.py, the engine's prefix store): a prompt starting with a
kept prompt or finished sequence copies those rows and computes the rest, and every output is
the one computing the whole prompt gives (alone, and with reuse off); whole prompts, chunked
prefill and the next turn of a conversation; the budget evicts; where reuse would not be exact
it is off, and asking for it is refused by name."""
import threading

import numpy as np
import pytest

import tinyt.runtime as rt
from tinyt.errors import ConfigError
from tinyt.runtime.engine import Engine
from tinyt.runtime.prefix import MIN_REUSE, PrefixStore
from tinyt.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def artifacts(lm_onnx, tmp_path_factory, corpus_dir):
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    root = tmp_path_factory.mktemp("prefix")
    opt = optimize(lm_onnx, root / "opt")
    int4 = quantize(opt, root / "int4", bits=4, data=str(corpus_dir))
    int8 = quantize(opt, root / "int8", data=str(corpus_dir))
    qgemm = quantize(opt, root / "qgemm", kernel="qgemm", data=str(corpus_dir))
    return {"fp32-gqa": optimize(opt, root / "gqa", target="gqa"),
            "int4-gqa": optimize(int4, root / "int4-gqa", target="gqa"),
            "pair": optimize(int8, root / "pair", target="gqa", prefill_from=qgemm)}


def _prompts(lm):
    """A shared 18-token start (a system prompt) and tails of 2-7 tokens."""
    head = lm.tokenizer.encode("def parse_args(argv):\n    result = argv * 2 + 7\n" * 3)[:18]
    assert len(head) == 18 >= MIN_REUSE
    tails = ["x", "    return result\n", "import os", "class A:", "y = 1\n", "    for k in"]
    return [head + lm.tokenizer.encode(t)[:7] for t in tails]


def _run(lm, prompts, params, **engine_kw):
    engine = Engine(lm, max_batch=2, **engine_kw).start()
    try:
        out = []
        for ids in prompts:  # one after another: each finds the earlier ones kept
            req = engine.submit(ids, params)
            out.append((req.out, req.wait(60).finish_reason))
        return out, engine.prefix_reused_tokens
    finally:
        engine.stop()


@pytest.mark.parametrize("name", ["fp32-gqa", "int4-gqa"])
@pytest.mark.parametrize("chunk", [None, 5])
def test_reuse_gives_what_computing_gives(artifacts, name, chunk):
    lm = rt.load(artifacts[name], threads=1, tune=False)
    prompts = _prompts(lm)
    for params in (SamplingParams(max_new_tokens=5),
                   SamplingParams(max_new_tokens=5, temperature=0.8, seed=3)):
        alone = [(r.token_ids, r.finish_reason) for ids in prompts
                 for r in lm.generate_ids([ids], **{k: getattr(params, k) for k in
                                                    ("max_new_tokens", "temperature", "seed")})]
        off, none = _run(lm, prompts, params, prefill_chunk=chunk, prefix_cache_bytes=0)
        on, reused = _run(lm, prompts, params, prefill_chunk=chunk)
        assert none == 0 and reused >= 18 * (len(prompts) - 1)  # every later prompt reused
        assert on == off == alone


def test_the_next_turn_reuses_the_finished_sequence(artifacts):
    lm = rt.load(artifacts["fp32-gqa"], threads=1, tune=False)
    first = lm.tokenizer.encode("def parse_args(argv):\n    return argv")[:12]
    engine = Engine(lm, max_batch=2).start()
    try:
        req = engine.submit(first, SamplingParams(max_new_tokens=10))
        req.wait(60)
        turn = first + req.out + lm.tokenizer.encode("\n\n")[:2]  # prompt + answer + more
        before = engine.prefix_reused_tokens
        nxt = engine.submit(turn, SamplingParams(max_new_tokens=4))
        nxt.wait(60)
    finally:
        engine.stop()
    # the finished row kept its prompt and all but its last token (which never ran)
    assert engine.prefix_reused_tokens - before == len(first) + len(req.out) - 1
    assert nxt.out == lm.generate_ids([turn], max_new_tokens=4)[0].token_ids


def test_concurrent_requests_with_reuse_each_get_their_own(artifacts):
    lm = rt.load(artifacts["fp32-gqa"], threads=1, tune=False)
    prompts = _prompts(lm) * 2
    want = [lm.generate_ids([ids], max_new_tokens=4)[0].token_ids for ids in prompts]
    engine = Engine(lm, max_batch=4).start()
    got = [None] * len(prompts)
    try:
        def client(i):
            r = engine.submit(prompts[i], SamplingParams(max_new_tokens=4))
            r.wait(60)
            got[i] = r.out
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        engine.stop()
    assert got == want and engine.prefix_reused_tokens > 0


def test_the_budget_evicts_least_recently_used(artifacts):
    lm = rt.load(artifacts["fp32-gqa"], threads=1, tune=False)
    one = lm.new_cache(1, 32)
    size = sum(b.nbytes for b in one.kv)
    store = PrefixStore(lm, 2 * size)
    seqs = [[i] * 20 for i in range(3)]
    for s in seqs:
        c = lm.new_cache(1, 32)
        c.lens[0] = len(s)
        store.keep(s, c)
    assert len(store) == 2 and store.bytes == 2 * size
    assert store.match(seqs[0] + [5]) is None  # the oldest went first
    assert store.match(seqs[2] + [5])[1] == 20
    longer = seqs[1] + [7] * 5
    c = lm.new_cache(1, 32)
    c.lens[0] = len(longer)
    store.keep(longer, c)  # seqs[1] begins it: dropped, the longer one serves its matches
    assert len(store) == 2 and store.match(seqs[1] + [9])[1] == 20
    assert store.match(seqs[1][:10] + [9] * 10) is None  # below MIN_REUSE shared
    small = PrefixStore(lm, size // 2)  # one cache does not fit: not kept
    small.keep(seqs[0], lm.new_cache(1, 32))
    assert len(small) == 0 and small.bytes == 0


def test_windowed_buffers_are_reused_only_whole(artifacts):
    lm = rt.load(artifacts["fp32-gqa"], threads=1, tune=False)
    store = PrefixStore(lm, 1 << 30)
    c = lm.new_cache(1, 64)
    c.lens[0] = 30
    c.window_layers = {0}  # as a model whose windowed layers keep only their window
    store.keep(list(range(30)), c)
    assert store.match(list(range(20)) + [99] * 5) is None  # a part: not its windowed rows
    assert store.match(list(range(30)) + [99])[1] == 30


def test_where_reuse_is_not_exact_it_is_off_and_refused_by_name(artifacts, lm_onnx):
    pair = rt.load(artifacts["pair"], threads=1, tune=False)
    assert Engine(pair, max_batch=1).prefix_cache_bytes == 0
    with pytest.raises(ConfigError, match="one scale over a run"):
        Engine(pair, max_batch=1, prefix_cache_bytes=1 << 20)
    contract = rt.load(lm_onnx, threads=1)
    assert Engine(contract, max_batch=1).prefix_cache_bytes == 0
    with pytest.raises(ConfigError, match="no shared cache"):
        Engine(contract, max_batch=1, prefix_cache_bytes=1 << 20)
    lm = rt.load(artifacts["fp32-gqa"], threads=1, tune=False)
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="prefix_cache_bytes"):
            Engine(lm, max_batch=1, prefix_cache_bytes=bad)
    assert np.isscalar(Engine(lm, max_batch=1).prefix_cache_bytes)


@pytest.mark.parametrize("name", ["int4-gqa", "pair"])
def test_a_request_s_samples_run_their_prompt_once(artifacts, name):
    """A prompt admitted in several rows at once (a request's n samples, as the server submits
    them) runs once, the other rows copying its keys, values and logits: each sample is still
    what it alone gives, and a different prompt admitted with them is computed as its own."""
    lm = rt.load(artifacts[name], threads=1, tune=False)
    ids, other = _prompts(lm)[1], _prompts(lm)[2]
    asks = [(ids, 3), (ids, 4), (other, 3), (ids, 5)]
    alone = [lm.generate_ids([p], max_new_tokens=6, temperature=0.8, seed=s)[0].token_ids
             for p, s in asks]
    engine = Engine(lm, max_batch=4, prefix_cache_bytes=0)
    reqs = [engine.submit(p, SamplingParams(max_new_tokens=6, temperature=0.8, seed=s))
            for p, s in asks]  # all waiting when the engine starts: admitted in one step
    engine.start()
    try:
        for r in reqs:
            r.wait(60)
    finally:
        engine.stop()
    assert [r.out for r in reqs] == alone
    assert len({tuple(a) for a in alone}) > 1  # the seeds drew different samples
    assert engine.shared_prompt_tokens == 2 * len(ids)
