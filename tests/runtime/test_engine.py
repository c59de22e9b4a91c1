"""Continuous batching (tinyt.runtime.engine): under load a request's output is its output
alone — 16 concurrent greedy and seeded requests of mixed lengths give exactly what each gives
run by itself — on the shared-cache pair and on a contract graph; rows join and leave the
running batch; cancel frees a row within a step; a full queue and a stopping engine refuse."""
import threading

import pytest

import tinyt.runtime as rt
from tinyt.runtime.engine import Done, Engine, QueueFull, Token
from tinyt.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def artifacts(lm_onnx, tmp_path_factory, corpus_dir):
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    root = tmp_path_factory.mktemp("engine")
    opt = optimize(lm_onnx, root / "opt")
    int8 = quantize(opt, root / "int8", data=str(corpus_dir))
    qgemm = quantize(opt, root / "qgemm", kernel="qgemm", data=str(corpus_dir))
    pair = optimize(int8, root / "pair", target="gqa", prefill_from=qgemm)
    rows = quantize(opt, root / "qgemm-rows", kernel="qgemm-rows", data=str(corpus_dir))
    return {"opt": opt, "pair": pair, "fp32-gqa": optimize(opt, root / "gqa", target="gqa"),
            "rows": optimize(rows, root / "rows-gqa", target="gqa")}


def _requests(lm, n=16):
    """Mixed prompt lengths, lengths to generate, greedy and seeded sampling, stops; no two
    prompts alike (identical prompts admitted in one step run once, the others copying it)."""
    texts = ["def ", "import os\n", "class Config:\n    def __init__(self", "x", "    return "]
    out = []
    for i in range(n):  # each prompt begins with its number: no two alike within the cut
        text = f"{i}" + texts[i % len(texts)] * (1 + i % 3)
        ids = lm.tokenizer.encode(text)[: lm.context - 20]
        params = SamplingParams(max_new_tokens=3 + (i * 5) % 14, min_new_tokens=0,
                                temperature=0.0 if i % 2 else 0.9, top_k=None if i % 4 else 20,
                                seed=i, stop=("\n\n",) if i % 5 == 0 else ())
        out.append((ids, params))
    return out


def _alone(lm, ids, params) -> tuple[list[int], str]:
    r = lm.generate_ids([ids], **{k: getattr(params, k) for k in params.__dataclass_fields__})[0]
    return r.token_ids, r.finish_reason


@pytest.mark.parametrize("name, batch, together", [
    ("pair", 8, False), ("fp32-gqa", 4, False), ("opt", 8, False), ("rows", 8, True)])
def test_each_request_gets_what_it_gets_alone(artifacts, name, batch, together, monkeypatch):
    from tinyt.runtime.cache import SharedCache

    lm = rt.load(artifacts[name], threads=1, tune=False)
    reqs = _requests(lm)
    assert len({tuple(ids) for ids, _ in reqs}) == len(reqs)
    want = [_alone(lm, ids, p) for ids, p in reqs]
    admitted = []  # prompts per prompt-graph run
    admit_from = SharedCache.admit_from
    monkeypatch.setattr(SharedCache, "admit_from", lambda self, new, *a: (
        admitted.append(len(new)), admit_from(self, new, *a))[1])
    # no prefix store: whether a prompt finds another's kept rows depends on which arrived
    # first, and such a prompt is not admitted through a prompt-graph run (tests of its own)
    engine = Engine(lm, max_batch=batch, max_queue=32, prefix_cache_bytes=0).start()
    try:
        got = [None] * len(reqs)

        def client(i):  # concurrent submitters, as a server's handlers are
            r = engine.submit(*reqs[i])
            done = r.wait(60)
            got[i] = (r.out, done.finish_reason)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        engine.stop()
    for i, ((w_ids, w_reason), (g_ids, g_reason)) in enumerate(zip(want, got)):
        assert g_ids == w_ids, (i, reqs[i][1])
        assert g_reason == w_reason, i
    assert engine.steps_run < sum(len(w) for w, _ in want)  # rows shared steps
    if name != "opt":  # prompts ran together only where no activation scale spans rows
        assert sum(admitted) == len(reqs)
        assert (max(admitted) > 1) == together, admitted


def test_chunked_prefill_runs_one_piece_between_steps_and_keeps_each_output(artifacts,
                                                                            monkeypatch):
    """prefill_chunk=3: prompts go in pieces of at most 3 tokens, at most one piece between
    two decode steps while rows run; 16 concurrent requests get what each gets alone through
    the same engine (a prompt in pieces may differ from it whole by float rounding: generate
    is not the reference here)."""
    from tinyt.runtime.cache import SharedCache

    lm = rt.load(artifacts["rows"], threads=1, tune=False)
    reqs = _requests(lm)

    current = []

    def through_engine(batch):
        engine = Engine(lm, max_batch=8, max_queue=32, prefill_chunk=3)
        current[:] = [engine]
        engine.start()
        try:
            running = [engine.submit(*r) for r in batch]
            return [(r.out, r.wait(60).finish_reason) for r in running]
        finally:
            engine.stop()
    alone = [through_engine([r])[0] for r in reqs]
    log: list[tuple[str, int, int]] = []  # (run, tokens or rows, rows running before it)
    extend, step_rows = SharedCache.extend, SharedCache.step_rows
    monkeypatch.setattr(SharedCache, "extend", lambda self, ids: (
        log.append(("piece", len(ids), current[0].running)), extend(self, ids))[1])
    monkeypatch.setattr(SharedCache, "step_rows", lambda self, k, *a: (
        log.append(("step", k, current[0].running)), step_rows(self, k, *a))[1])
    together = through_engine(reqs)
    assert together == alone
    assert sum(n for kind, n, _ in log if kind == "piece") == sum(len(ids) for ids, _ in reqs)
    assert max(n for kind, n, _ in log if kind == "piece") == 3
    # while rows run, each piece is followed by a step: they wait for one piece at most
    waited = [b[0] for a, b in zip(log, log[1:]) if a[0] == "piece" and a[2] > 0]
    assert waited and set(waited) == {"step"}
    with pytest.raises(ValueError, match="prefill_chunk needs a shared-cache graph"):
        Engine(rt.load(artifacts["opt"], tune=False), prefill_chunk=4)
    with pytest.raises(ValueError, match="prefill_chunk=0 must be an integer >= 1"):
        Engine(lm, prefill_chunk=0)


def test_rows_independent_reads_every_graph_of_the_artifact(artifacts):
    from tinyt.manifest import Manifest
    from tinyt.runtime.engine import rows_independent
    from tinyt.runtime.session import open_artifact

    assert rows_independent(open_artifact(artifacts["rows"]).manifest)
    assert not rows_independent(open_artifact(artifacts["pair"]).manifest)  # qgemm prompts
    assert not rows_independent(open_artifact(artifacts["fp32-gqa"]).manifest)  # float GEMMs
    m = open_artifact(artifacts["rows"]).manifest
    assert not rows_independent(Manifest.from_dict({
        **m.data, "prefill_model_file": "prefill.onnx",
        "prefill_quantization": {"rows_independent": False}}))


def test_streamed_pieces_make_the_text_and_a_cancel_frees_the_row(artifacts):
    lm = rt.load(artifacts["pair"], threads=1, tune=False)
    engine = Engine(lm, max_batch=2, max_queue=4).start()
    try:
        ids = lm.tokenizer.encode("def ")
        r = engine.submit(ids, SamplingParams(max_new_tokens=12))
        pieces = []
        while not isinstance(ev := r.next_event(30), Done):
            assert isinstance(ev, Token)
            pieces.append(ev.text)
        assert "".join(pieces) == ev.text == lm.generate("def ", max_new_tokens=12)
        n = lm.context - len(ids) - 1

        submitted = threading.Event()

        def cancel_at_first_token(event):  # on the engine's thread: no race with its speed
            if isinstance(event, Token):
                submitted.wait(10)  # `long` is assigned
                long.cancel()
        long = engine.submit(ids, SamplingParams(max_new_tokens=n, min_new_tokens=n),
                             listener=cancel_at_first_token)
        submitted.set()
        assert long.wait(30).finish_reason == "cancelled"
        assert len(long.out) <= 2 < n  # freed within a step of the cancel
        assert engine.running == 0
        again = engine.submit(ids, SamplingParams(max_new_tokens=12))  # the row serves again
        assert again.wait(30).text == ev.text
    finally:
        engine.stop()


def test_a_full_queue_and_a_stopping_engine_refuse(artifacts):
    lm = rt.load(artifacts["pair"], threads=1, tune=False)
    engine = Engine(lm, max_batch=1, max_queue=2)  # not started: nothing leaves the queue
    ids = lm.tokenizer.encode("def ")
    engine.submit(ids, SamplingParams(max_new_tokens=2))
    engine.submit(ids, SamplingParams(max_new_tokens=2))
    with pytest.raises(QueueFull, match="2 requests are waiting"):
        engine.submit(ids, SamplingParams(max_new_tokens=2))
    engine.start()
    engine.stop()  # finishes what waits, then ends
    with pytest.raises(QueueFull, match="stopping"):
        engine.submit(ids, SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="this model reads at most"):
        Engine(lm).submit([1] * lm.context, SamplingParams())
    with pytest.raises(ValueError, match="max_batch=0"):
        Engine(lm, max_batch=0)
