import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinyt.runtime as rt
from tinyt.checkpoint import load_checkpoint
from tinyt.errors import ConfigError
from tinyt.manifest import ManifestError
from tinyt.model import generate as torch_generate

CLF_PROB_TOL = 1e-4  # classifier probabilities, ONNX Runtime vs PyTorch


@pytest.fixture(scope="module")
def lm(lm_onnx):
    return rt.load(lm_onnx, threads=1)


@pytest.fixture(scope="module")
def ck(tiny_ckpt):
    return load_checkpoint(tiny_ckpt)


def torch_greedy(ck, ids, n):
    out = torch_generate(ck.model, torch.tensor([ids]), n, temperature=0)[0, len(ids):].tolist()
    eos = ck.tokenizer.eos_id
    return out[:out.index(eos)] if eos in out else out


@pytest.mark.parametrize("prompt", ["def ", "import os\n", "    return alpha_3", "x"])
def test_greedy_matches_pytorch(lm, ck, prompt):
    ids = ck.tokenizer.encode(prompt)
    n = ck.config.block_size - len(ids)
    (res,) = lm.generate_ids(ids, max_new_tokens=n)
    assert res.token_ids == torch_greedy(ck, ids, n)
    assert res.finish_reason in ("length", "eos")  # n fills the context exactly
    assert lm.generate(prompt, max_new_tokens=n) == ck.tokenizer.decode(res.token_ids)


def test_batch_of_different_lengths_equals_one_by_one(lm):
    prompts = ["def ", "import os\nimport sys\n", "x", "    return alpha_3 + beta"]
    for kw in (dict(), dict(temperature=0.9, top_k=20, seed=5)):
        batch = lm.generate_details(prompts, max_new_tokens=12, **kw)
        alone = [lm.generate_details([p], max_new_tokens=12, **kw)[0] for p in prompts]
        assert [b.token_ids for b in batch] == [a.token_ids for a in alone], kw
        assert [b.finish_reason for b in batch] == [a.finish_reason for a in alone]


def test_sampling_options(lm):
    base = dict(max_new_tokens=15, temperature=1.0, seed=1)
    assert lm.generate("def ", **base) == lm.generate("def ", **base)  # seeded
    outs = {lm.generate("def ", **{**base, "seed": s}) for s in range(6)}
    assert len(outs) > 1  # the seed matters
    greedy = lm.generate("def ", max_new_tokens=15)
    assert lm.generate("def ", **{**base, "top_k": 1}) == greedy
    assert lm.generate("def ", **{**base, "top_p": 1e-9}) == greedy
    plain = lm.generate_details(["def "], max_new_tokens=20)[0].token_ids
    penalised = lm.generate_details(["def "], max_new_tokens=20, repetition_penalty=5.0)[0]
    assert len(set(penalised.token_ids)) >= len(set(plain))


def test_stop_strings_and_streaming(lm):
    full = lm.generate("def ", max_new_tokens=25)
    stop = full[5:8]
    assert stop and stop in full
    res = lm.generate_details(["def "], max_new_tokens=25, stop=[stop])[0]
    assert res.finish_reason == "stop" and res.text == full[:full.index(stop)]
    for kw in (dict(max_new_tokens=25), dict(max_new_tokens=25, stop=stop),
               dict(max_new_tokens=25, temperature=0.7, seed=3)):
        pieces = list(lm.stream("def ", **kw))
        assert "".join(pieces) == lm.generate("def ", **kw)
        assert len(pieces) > 1


def test_a_batch_goes_on_after_one_sequence_fills_its_context(lm, ck):
    long = list(range(3, 3 + ck.config.block_size - 4))  # room for 4 tokens
    short = [5, 6]
    batch = lm.generate_ids([long, short], max_new_tokens=12)
    assert batch[0].token_ids == lm.generate_ids([long], max_new_tokens=12)[0].token_ids
    assert batch[1].token_ids == lm.generate_ids([short], max_new_tokens=12)[0].token_ids
    assert batch[0].finish_reason in ("context", "eos") and len(batch[0].token_ids) <= 4


def test_context_limit(lm, ck):
    block = ck.config.block_size
    ids = list(range(3, 3 + block - 3))
    res = lm.generate_ids(ids, max_new_tokens=10)[0]
    assert res.finish_reason in ("context", "eos") and len(res.token_ids) <= 3
    with pytest.raises(ValueError, match=f"reads at most {block - 1} \\(its context {block}"):
        lm.generate_ids(list(range(block)), max_new_tokens=1)
    assert lm.generate_ids([5], max_new_tokens=0)[0].token_ids == []


@pytest.mark.parametrize("call,needle", [
    (lambda m: m.generate_ids([1, 99999]), r"token ids \[99999\] \(row 0\) are outside"),
    (lambda m: m.generate_ids([[1, -1]]), r"token ids \[-1\]"),
    (lambda m: m.generate(""), "prompt is empty"),
    (lambda m: m.generate(b"\xff\xfe"), "not valid UTF-8"),
    (lambda m: m.generate("\ud800"), "not valid Unicode"),
    (lambda m: m.generate(42), "prompt must be str"),
    (lambda m: m.generate_ids(np.zeros((1, 2, 3), dtype=np.int64)), "1-D or 2-D integer array"),
    (lambda m: m.generate_ids(np.zeros((1, 2), dtype=np.float32)), "1-D or 2-D integer array"),
    (lambda m: m.generate_ids([]), "non-empty list of ints"),
    (lambda m: m.generate("a", max_new_tokens=-1), "max_new_tokens=-1 is invalid"),
    (lambda m: m.generate("a", max_new_tokens=10**9), "max_new_tokens=1000000000 is invalid"),
    (lambda m: m.generate("a", top_p=0), "top_p=0 is invalid: None or a number in \\(0, 1\\]"),
    (lambda m: m.generate("a", top_p=1.5), "top_p=1.5 is invalid"),
    (lambda m: m.generate("a", temperature=float("nan")), "temperature=nan is invalid"),
    (lambda m: m.generate("a", top_k=0), "top_k=0 is invalid"),
    (lambda m: m.generate("a", stop=[""]), "stop=.* is invalid"),
    (lambda m: m.generate("a", beams=4), r"unknown generation argument\(s\) \['beams'\]"),
    (lambda m: m.stream("a", top_p=2), "top_p=2 is invalid"),  # eager, before any piece
    (lambda m: m.stream("alpha beta " * 60), r"reads at most \d+ \(its context"),
])
def test_bad_input_is_a_value_error(lm, call, needle):
    with pytest.raises(ValueError, match=needle) as e:
        call(lm)
    assert isinstance(e.value, ConfigError)  # tinyt's own, a ValueError


def test_the_scheduler_interface_gives_generates_tokens(lm):
    """check_ids, steps and choose_next driven token by token, as runtime/engine.py drives
    them, give generate's tokens, and leave the logits they are given as they were."""
    from tinyt.runtime.feeds import prefill_feeds

    ids = lm.tokenizer.encode("def ")
    assert lm.check_ids(np.array(ids)) == lm.check_ids([ids]) == [ids]
    params = rt.SamplingParams(max_new_tokens=6, min_new_tokens=6, temperature=0.8, seed=3)
    rng = np.random.default_rng(params.seed)
    steps = lm.steps(prefill_feeds(lm.config, lm.artifact.kind, np.array([ids]),
                                   kv_dtype=lm.kv_dtype))
    logits, out = next(steps)[0, -1], []
    while True:
        before = logits.copy()
        reason = lm.choose_next(logits, params, rng, ids, out)
        assert np.array_equal(logits, before)  # end-of-text was masked in a copy
        if reason:
            break
        logits = steps.send((np.array([out[-1]]), np.ones(1, dtype=bool)))[0, -1]
    steps.close()
    (want,) = lm.generate_ids([ids], max_new_tokens=6, min_new_tokens=6, temperature=0.8, seed=3)
    assert (out, reason) == (want.token_ids, want.finish_reason) == (out, "length")
    assert lm.pad_id == lm.tokenizer.eos_id and lm.kv_dtype == np.float32
    with pytest.raises(ConfigError, match="shared caches belong to shared-cache graphs"):
        lm.take_cache(1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.one_of(st.text(max_size=40), st.binary(max_size=20)),
       ids=st.lists(st.integers(-5, 400), max_size=40),
       max_new=st.integers(-3, 6),
       temperature=st.one_of(st.floats(-1, 3), st.just(float("nan")), st.just(float("inf"))),
       top_k=st.one_of(st.none(), st.integers(-1, 50)),
       top_p=st.one_of(st.none(), st.floats(-0.5, 1.5)))
def test_random_input_gives_a_result_or_a_documented_error(lm, prompt, ids, max_new,
                                                           temperature, top_k, top_p):
    kw = dict(max_new_tokens=max_new, temperature=temperature, top_k=top_k, top_p=top_p, seed=0)
    for call in (lambda: lm.generate_details([prompt], **kw), lambda: lm.generate_ids(ids, **kw)):
        try:
            (res,) = call()
        except ValueError:
            continue
        assert isinstance(res.text, str) and len(res.token_ids) <= max(max_new, 0)
        assert all(0 <= t < lm.config.vocab_size for t in res.token_ids)
        assert res.finish_reason in ("eos", "stop", "length", "context")


def test_eight_threads_equal_sequential_calls(lm):
    prompts = [f"def alpha_{i}(" for i in range(8)]
    want = [lm.generate(p, max_new_tokens=10, temperature=0.8, seed=i)
            for i, p in enumerate(prompts)]
    got = [None] * 8

    def work(i):
        got[i] = lm.generate(prompts[i], max_new_tokens=10, temperature=0.8, seed=i)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_no_cache_graph_generates_the_same(lm, tiny_ckpt, tmp_path):
    from tinyt.export import export_onnx
    plain = rt.load(export_onnx(tiny_ckpt, tmp_path / "nocache", with_past=False), threads=1)
    assert plain.generate("def ", max_new_tokens=12) == lm.generate("def ", max_new_tokens=12)


def test_integrity_checks(lm_onnx, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(lm_onnx, copy)
    with open(copy / "model.onnx", "r+b") as f:  # truncate
        f.truncate(1000)
    with pytest.raises(ManifestError, match="model.onnx does not match its sha256"):
        rt.load(copy)
    with pytest.raises(ManifestError, match="does not exist"):
        rt.load(tmp_path / "nothing")


def test_a_graph_that_breaks_the_contract_is_refused(lm_onnx, tmp_path):
    import json

    import onnx

    from tinyt.fsutil import sha256_file
    copy = tmp_path / "renamed"
    shutil.copytree(lm_onnx, copy)
    model = onnx.load(str(copy / "model.onnx"))
    model.graph.input[2].name = "positions"  # position_ids renamed: the graph no longer fits
    for node in model.graph.node:
        node.input[:] = ["positions" if i == "position_ids" else i for i in node.input]
    onnx.save(model, str(copy / "model.onnx"))
    manifest = json.loads((copy / "manifest.json").read_text())  # hashes made consistent
    manifest["files"]["model.onnx"] = {"sha256": sha256_file(copy / "model.onnx"),
                                       "bytes": (copy / "model.onnx").stat().st_size}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="do not follow the decoder_with_past contract"):
        rt.load(copy)


def test_providers_never_fall_back_silently(lm_onnx, monkeypatch):
    with pytest.raises(rt.ProviderError, match="provider 'cuda' .* is not in this onnxruntime"
                                               ".*available: .*CPUExecutionProvider"):
        rt.load(lm_onnx, provider="cuda")
    with pytest.raises(rt.ProviderError, match="provider='npu' is not one of cpu, cuda"):
        rt.load(lm_onnx, provider="npu")
    assert rt.load(lm_onnx, provider="auto").provider == "CPUExecutionProvider"
    import onnxruntime as ort

    import tinyt.runtime.session as S
    # CUDA listed but its libraries missing: ONNX Runtime hands back a CPU session.
    monkeypatch.setattr(S.ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    real = ort.InferenceSession
    monkeypatch.setattr(S.ort, "InferenceSession",
                        lambda path, opts, providers, **kw: real(
                            path, opts, providers=["CPUExecutionProvider"], **kw))
    with pytest.raises(rt.ProviderError, match="did not initialise .* libraries are likely"):
        rt.load(lm_onnx, provider="cuda")


def test_both_onnxruntime_packages_is_detected(monkeypatch):
    import tinyt.runtime.session as S
    monkeypatch.setattr(S, "_installed", lambda dist: True)
    (problem,) = S.installation_problems()
    assert "both onnxruntime and onnxruntime-gpu are installed" in problem


def test_classifier_matches_pytorch(tiny_clf, tmp_path):
    from tinyt.export import export_onnx
    clf = rt.load(export_onnx(tiny_clf, tmp_path / "clf"), threads=1)
    assert isinstance(clf, rt.Classifier) and clf.labels == ["maths", "strings"]
    texts = ["x0 = sum(sum_1, 0)\n" * 3, "y = join(a)\n", "z = join(join_2, 5)\nq = 1\n" * 4]
    preds = clf.classify(texts, batch_size=2)
    ck = load_checkpoint(tiny_clf)
    for text, pred in zip(texts, preds):
        ids = torch.tensor([ck.tokenizer.encode(text)[: ck.config.block_size]])
        with torch.no_grad():
            p = torch.softmax(ck.model(ids), -1)[0].tolist()
        assert pred.label == ck.labels[int(np.argmax(p))]
        assert max(abs(pred.probabilities[n] - v) for n, v in zip(ck.labels, p)) <= CLF_PROB_TOL
    single = clf.classify(texts[1])
    assert single.probabilities == pytest.approx(preds[1].probabilities, abs=1e-6)
    with pytest.raises(ValueError, match="non-empty list of strings"):
        clf.classify([])


def test_runtime_runs_without_torch(lm_onnx):
    code = ("import sys; sys.modules['torch'] = None\n"
            "import tinyt.runtime as rt\n"
            f"lm = rt.load({str(lm_onnx)!r}, threads=1)\n"
            "print(repr(lm.generate('def ', max_new_tokens=5)))\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("'")


def test_io_binding_path_gives_the_same_tokens(lm_onnx, lm):
    """The accelerator path (KV cache bound to the provider's device between steps) run on
    CPU: only the device string differs on CUDA."""
    bound = rt.load(lm_onnx, threads=1, io_binding=True)
    assert bound.io_binding and not lm.io_binding
    prompts = ["def ", "import os\nimport sys\n", "x"]
    for kw in (dict(max_new_tokens=20), dict(max_new_tokens=20, temperature=0.9, seed=2)):
        assert [r.token_ids for r in bound.generate_details(prompts, **kw)] == \
            [r.token_ids for r in lm.generate_details(prompts, **kw)]
    assert "".join(bound.stream("def ", max_new_tokens=15)) == lm.generate("def ",
                                                                          max_new_tokens=15)


def test_spinning_follows_the_thread_count(lm_onnx, monkeypatch):
    from tinyt.runtime.session import SPINNING_ENV, open_artifact, session_options

    monkeypatch.delenv(SPINNING_ENV, raising=False)  # (tests/conftest.py sets it for the suite)
    art = open_artifact(lm_onnx)

    def spin(**kw):
        opts = session_options(art, level=None, **kw)
        return opts.get_session_config_entry("session.intra_op.allow_spinning")

    assert spin(threads=2, spinning=None) == "1"  # measured: decode and prefill both gain
    assert spin(threads=1, spinning=None) == "0"
    assert spin(threads=2, spinning=False) == "0" and spin(threads=1, spinning=True) == "1"
    opts = session_options(art, threads=2, spinning=None, level=None, phase="prompt")
    assert opts.get_session_config_entry("session.force_spinning_stop") == "1"
    # $TINYT_SPINNING: the process-wide default where the caller leaves it to tinyt
    monkeypatch.setenv(SPINNING_ENV, "0")
    assert spin(threads=2, spinning=None) == "0" and spin(threads=2, spinning=True) == "1"
    monkeypatch.setenv(SPINNING_ENV, "1")
    assert spin(threads=1, spinning=None) == "1" and spin(threads=1, spinning=False) == "0"
    monkeypatch.setenv(SPINNING_ENV, "yes")
    with pytest.raises(ConfigError, match=r"\$TINYT_SPINNING='yes' is invalid: 0 .*, 1 .*unset"):
        spin(threads=2, spinning=None)
    monkeypatch.setenv(SPINNING_ENV, "0")  # and rt.load's sessions take it
    import tinyt.runtime as rt
    lm = rt.load(lm_onnx, threads=2, tune=False)
    assert lm.session.get_session_options().get_session_config_entry(
        "session.intra_op.allow_spinning") == "0"


def test_every_session_starts_from_one_set_of_options(lm_onnx, tmp_path):
    """ort_options: the level, threads, spinning and offline-optimized path each caller
    differs in; the artifact's sessions (session_options) start from it too."""
    import onnxruntime as ort

    from tinyt.runtime.session import LEVELS, open_artifact, ort_options, session_options

    opts = ort_options(level="basic", threads=3, spinning=True,
                       optimized_model=tmp_path / "opt.onnx")
    assert opts.graph_optimization_level == LEVELS["basic"]
    assert opts.intra_op_num_threads == 3 and opts.log_severity_level == 3
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert opts.optimized_model_filepath == str(tmp_path / "opt.onnx")
    plain = ort_options(level="all")
    assert plain.intra_op_num_threads == ort.SessionOptions().intra_op_num_threads
    assert plain.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert not plain.optimized_model_filepath
    art = open_artifact(lm_onnx)  # an export: ONNX Runtime's extended level at load
    served = session_options(art, threads=2, spinning=None, level=None)
    assert served.graph_optimization_level == LEVELS["extended"]
    assert served.intra_op_num_threads == 2 and served.inter_op_num_threads == 1
    assert served.log_severity_level == 3


def test_memory_planning_follows_the_graphs_shapes(lm_onnx, tmp_path):
    """Contract graphs change shape every step: no memory pattern, the arena. A shared-cache
    step has fixed shapes: a planned pattern and no arena (measured faster); its prompt-only
    session plans none."""

    from tinyt.contract import SHARED_CACHE_KIND
    from tinyt.runtime.session import open_artifact, session_options

    art = open_artifact(lm_onnx)
    shared = art.with_manifest({**art.manifest.data, "graph": SHARED_CACHE_KIND})
    plans = {(a.kind, phase): session_options(a, threads=1, spinning=None, level=None,
                                              phase=phase)
             for a in (art, shared) for phase in ("any", "step", "prompt")}
    for (kind, phase), opts in plans.items():
        assert opts.enable_mem_pattern == (kind == SHARED_CACHE_KIND and phase != "prompt"), (kind, phase)
        assert opts.enable_cpu_mem_arena == (kind != SHARED_CACHE_KIND), (kind, phase)
    with pytest.raises(ValueError, match="phase='decode' is not one of any, step, prompt"):
        rt.session.create_session(art, threads=1, phase="decode")


def _reference_next_token(logits, params, rng, history):
    """The plain full-row sampler (float64 over every id, masked ids at -inf): what
    next_token's candidate-only top-k path must choose exactly. Nucleus and draw are written
    from their definitions as loops, not as the sampler's cumsum / searchsorted:
    top-p keeps the most likely ids (ties: the lower id first) until their mass reaches p;
    the draw takes the first id whose running mass passes a uniform number."""
    z = logits.astype(np.float64)
    if params.repetition_penalty != 1.0 and history:
        seen = np.unique(np.asarray(history))
        z[seen] = np.where(z[seen] > 0, z[seen] / params.repetition_penalty,
                           z[seen] * params.repetition_penalty)
    z = z / params.temperature
    if params.top_k is not None and params.top_k < z.size:
        z = np.where(z < np.partition(z, -params.top_k)[-params.top_k], -np.inf, z)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if params.top_p is not None and params.top_p < 1:
        mass, keep = 0.0, []
        for i in sorted(range(probs.size), key=lambda i: (-probs[i], i)):
            keep.append(i)
            mass += float(probs[i])
            if mass >= params.top_p:
                break
        mask = np.zeros_like(probs)
        mask[keep] = probs[keep]
        probs = mask / mask.sum()
    u, mass = rng.random(), 0.0
    for i, p in enumerate(probs.tolist()):
        mass += p
        if mass > u:
            return i
    return probs.size - 1


@pytest.mark.slow
def test_top_k_sampling_picks_what_the_full_row_sampler_picks():
    from tinyt.runtime.sampling import next_token
    rng = np.random.default_rng(0)
    for trial in range(150):
        vocab = int(rng.choice([50, 2048, 50257]))
        row = (rng.standard_normal(vocab) * rng.uniform(0.5, 4)).astype(np.float32)
        row[rng.integers(0, vocab, 3)] = row.max()  # ties at the top
        for kw in (dict(temperature=0.8, top_k=50), dict(temperature=1.3, top_k=5, top_p=0.9),
                   dict(temperature=0.7, top_p=0.95), dict(temperature=0.33, top_k=2),
                   dict(temperature=1.0, top_k=40, repetition_penalty=1.2)):
            params = rt.SamplingParams(**kw)
            assert next_token(row, params, np.random.default_rng(trial), [1, 5, 9]) == \
                _reference_next_token(row, params, np.random.default_rng(trial), [1, 5, 9])


def test_load_hands_back_the_memory_it_freed():
    """glibc keeps freed heap chunks resident until malloc_trim: a heap with 64 KB holes
    between live chunks (as a model's load and the tuner's unkept sessions leave) shrinks
    only when return_freed_memory runs; off glibc it says it could not."""
    import platform

    from tinyt.runtime.session import return_freed_memory

    def rss() -> int:
        status = Path("/proc/self/status").read_text()
        return int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1])

    if platform.libc_ver()[0] != "glibc":
        assert return_freed_memory() is False
        return
    chunks = [np.ones(8192) for _ in range(6000)]  # 64 KB each: below the mmap threshold
    del chunks[::2]  # 3,000 holes of 64 KB (~190 MB) between live chunks
    before = rss()
    assert return_freed_memory() is True
    assert before - rss() > 100_000  # kB: most of the holes' pages went back


def test_load_hands_back_the_memory_after_reading_the_tokenizer(lm_onnx, monkeypatch):
    """The tokenizer's JSON, parsed and freed, is the last of the load's freed heap (14 of
    its 30 MB at SmolLM2's 49,152 entries): the trim runs after it, not before."""
    import tinyt.runtime as runtime_pkg

    calls = []
    read = runtime_pkg._tokenizer
    monkeypatch.setattr(runtime_pkg, "return_freed_memory", lambda: calls.append("trim"))
    monkeypatch.setattr(runtime_pkg, "_tokenizer",
                        lambda artifact: (calls.append("tokenizer"), read(artifact))[1])
    rt.load(lm_onnx, threads=1)
    assert calls[-2:] == ["tokenizer", "trim"], calls


def test_runtime_leaves_metadata_and_uuid_modules_unimported():
    """importlib.metadata (with email, zipfile, csv) and uuid (with socket) held 3.5 MB of an
    inference process's resident memory and are used only by the installation check and the
    stages' temporary names."""
    code = ("import sys, tinyt.runtime\n"
            "print(sorted(m for m in ('importlib.metadata', 'uuid', 'email', 'socket')"
            " if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
