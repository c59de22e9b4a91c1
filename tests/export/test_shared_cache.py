"""The shared-KV-cache variant (GroupQueryAttention): graph shape, equivalence with its source,
and generation through the runtime."""
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import tinyt.runtime as rt
from tinyt.errors import ConfigError, SaturationError, SharedCacheError
from tinyt.export.compare import reorder_bound
from tinyt.export.gqa_graph import to_gqa
from tinyt.export.optimize import op_counts, optimize
from tinyt.export.package import package
from tinyt.export.quantize import quantize
from tinyt.export.shared_cache_checks import fp32_lineage, quant_floor
from tinyt.hardware import saturates_here
from tinyt.manifest import check_manifest, load_manifest
from tinyt.runtime import tuning
from tinyt.runtime.session import Artifact, open_artifact

PROMPTS = ["def alpha", "import os\n", "    return ", "x"]


@pytest.fixture(scope="module")
def opt(lm_onnx, tmp_path_factory):
    return optimize(lm_onnx, tmp_path_factory.mktemp("gqa") / "opt")


@pytest.fixture(scope="module")
def opt_gqa(opt, tmp_path_factory):
    return optimize(opt, tmp_path_factory.mktemp("gqa") / "opt-gqa", target="gqa")


def test_graph_has_one_shared_cache_per_layer(opt, opt_gqa):
    cfg = rt.load(opt).config
    proto = onnx.load(str(opt_gqa / "model.onnx"))
    ops = op_counts(proto)
    assert ops["com.microsoft.GroupQueryAttention"] == cfg.n_layer
    assert "com.microsoft.MultiHeadAttention" not in ops and "Split" not in ops
    assert sum(ops.values()) < sum(op_counts(onnx.load(str(opt / "model.onnx"))).values())
    inputs = [i.name for i in proto.graph.input]
    assert inputs[:5] == ["input_ids", "position_ids", "seqlens_k", "total_sequence_length",
                          "query_seqlens"] and "attention_mask" not in inputs
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa
    out = {o.name: dims(o) for o in proto.graph.output}
    assert out["logits"] == ["batch_size", 1, cfg.vocab_size]  # one position per row
    assert out["present.0.key"][2] == "max_sequence_length"
    manifest = check_manifest(opt_gqa)
    assert manifest["graph"] == "decoder_gqa" and manifest["layers"] == cfg.n_layer
    eq = manifest["equivalence"]
    assert eq["logits_max_abs"] <= eq["tolerance"] == reorder_bound(cfg, eq["logits_magnitude"])
    assert eq["greedy_agreement"] == 1.0 or eq["greedy_ties"] > 0  # differ only at a tie


def test_generates_the_sources_tokens(opt, opt_gqa):
    ref, fast = rt.load(opt, threads=1), rt.load(opt_gqa, threads=1)
    assert fast.artifact.kind == "decoder_gqa"
    n = ref.config.block_size - 8
    for kw in ({}, {"temperature": 0.9, "top_k": 20, "seed": 3}, {"repetition_penalty": 1.3}):
        want = ref.generate_details(PROMPTS, max_new_tokens=n, **kw)  # a ragged batch
        got = fast.generate_details(PROMPTS, max_new_tokens=n, **kw)
        assert [r.token_ids for r in got] == [r.token_ids for r in want], kw
        assert [r.finish_reason for r in got] == [r.finish_reason for r in want]
    # to the end of the context, alone and in a batch with a short row
    long = "def alpha(beta, n=3):\n    alpha = beta"
    assert fast.generate_details([long], max_new_tokens=500)[0].finish_reason == "context"
    assert fast.generate([long, "x"], max_new_tokens=500) == \
        ref.generate([long, "x"], max_new_tokens=500)
    assert "".join(fast.stream("import os\n", max_new_tokens=12)) == \
        ref.generate("import os\n", max_new_tokens=12)


def test_quantized_source(opt, corpus_dir, tmp_path, monkeypatch):
    int8 = quantize(opt, tmp_path / "int8", data=str(corpus_dir))
    fast = optimize(int8, tmp_path / "int8-gqa", target="gqa")
    eq = check_manifest(fast)["equivalence"]
    cfg = rt.load(opt).config
    # bounded by the quantization's own distance from the fp32 graph it came from (same steps)
    assert eq["fp32_source"] == str(opt.resolve()) and eq["quantization_vs_fp32_max_abs"] > 0
    assert eq["tolerance"] == max(quant_floor(cfg, eq["logits_magnitude"]),
                                  eq["quantization_vs_fp32_max_abs"],
                                  reorder_bound(cfg, eq["logits_magnitude"]))
    assert eq["logits_max_abs"] <= eq["tolerance"], eq
    # a rewrite that moves the logits by more than the quantization does (by 1, here) fails
    # the stage, saying why
    from tinyt.export import shared_cache as S

    def wrong(proto, cfg):
        done = to_gqa(proto, cfg)
        head = next(n for n in proto.graph.node if "logits" in n.output)
        head.output[list(head.output).index("logits")] = "logits_right"
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(1, np.float32),
                                                                    "off_by_one"))
        proto.graph.node.append(onnx.helper.make_node("Add", ["logits_right", "off_by_one"],
                                                      ["logits"]))
        return done
    monkeypatch.setattr(S, "to_gqa", wrong)
    with pytest.raises(SharedCacheError, match=r"differ from its source's by .* \(allowed .*: the "
                       r"larger of an int8 level of the largest logit per block \(.*\) and the "
                       r"quantization's own distance from .* on the same steps, "):
        optimize(int8, tmp_path / "wrong", target="gqa")
    assert not (tmp_path / "wrong").exists()
    monkeypatch.undo()
    assert fp32_lineage(int8) == Path(opt).resolve()
    moved = json.loads((int8 / "manifest.json").read_text())
    moved["source"]["path"] = str(tmp_path / "gone")  # the fp32 graph no longer there
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / "manifest.json").write_text(json.dumps(moved))
    assert fp32_lineage(tmp_path / "moved") is None  # then the int8 level alone bounds it
    assert "accuracy" in check_manifest(fast)  # the INT8 report travels with the variant
    ops = op_counts(onnx.load(str(fast / "model.onnx")))
    assert ops["com.microsoft.MatMulNBits"] > 0 and ops["com.microsoft.GroupQueryAttention"]
    ref, got = rt.load(int8).generate(PROMPTS, max_new_tokens=8), \
        rt.load(fast).generate(PROMPTS, max_new_tokens=8)
    assert sum(a == b for a, b in zip(ref, got)) >= 3


def test_refuses_what_it_cannot_convert(lm_onnx, opt, opt_gqa, tiny_clf, tmp_path):
    with pytest.raises(SharedCacheError, match="tinyt optimize --target cpu"):
        optimize(lm_onnx, tmp_path / "a", target="gqa")  # no fused attention yet
    with pytest.raises(SharedCacheError, match="KV-cache decoder"):
        optimize(opt_gqa, tmp_path / "b", target="gqa")
    pinned = package(opt, tmp_path / "pinned", format="onnx",
                     fixed=["batch_size=1", "sequence_length=1", "past_sequence_length=8"])
    with pytest.raises(SharedCacheError, match="pinned shapes"):
        optimize(pinned, tmp_path / "c", target="gqa")
    for name in "abc":
        assert not (tmp_path / name).exists()


def test_contract_is_checked_at_load(opt_gqa, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(opt_gqa, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["graph"] = "decoder_with_past"  # the graph does not follow this contract
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match="contract"):
        rt.load(bad)


def test_cli(opt, tmp_path):
    from conftest import run_tinyt

    r = run_tinyt("optimize", opt, tmp_path / "g", "--target", "gqa")
    assert r.returncode == 0, r.stderr
    assert "GroupQueryAttention with a shared KV cache in 2 layers" in r.stdout
    r = run_tinyt("generate", tmp_path / "g", "def ", "--max-new-tokens", "5")
    assert r.returncode == 0 and r.stdout.startswith("def "), r.stderr
    r = run_tinyt("generate", tmp_path / "g", "def ", "--max-new-tokens", "5", "--threads", "2",
                  "--temperature", "0", "-v")
    assert r.returncode == 0 and "measured ms: {'decode:model.onnx@1': " in r.stderr, r.stderr
    assert "'decode:model.onnx@2': " in r.stderr.split("measured ms: ")[1]  # both timed
    fixed = run_tinyt("generate", tmp_path / "g", "def ", "--max-new-tokens", "5", "--threads",
                      "2", "--temperature", "0", "-v", "--no-tune")
    assert "plan: decode: model.onnx at 2 thread(s); prompts: model.onnx at 2 thread(s); measured ms: {}" \
        in fixed.stderr, fixed.stderr
    assert fixed.stdout == r.stdout  # the same tokens, whatever the threads


@pytest.fixture(scope="module")
def pair(opt, corpus_dir, tmp_path_factory):
    """(INT8 MatMulNBits artifact, INT8 qgemm artifact, the shared-cache pair of the two)."""
    tmp = tmp_path_factory.mktemp("pair")
    int8 = quantize(opt, tmp / "int8", data=str(corpus_dir))
    qgemm = quantize(opt, tmp / "qgemm", kernel="qgemm", data=str(corpus_dir))
    return int8, qgemm, optimize(int8, tmp / "pair", target="gqa", prefill_from=qgemm)


def test_pair_runs_prompts_on_one_graph_and_steps_on_the_other(pair, tmp_path):
    int8, qgemm, pair = pair
    manifest = check_manifest(pair)
    assert manifest["prefill_model_file"] == "prefill.onnx"
    assert {"model.onnx", "prefill.onnx"} <= set(manifest["files"])
    ops = op_counts(onnx.load(str(pair / "prefill.onnx")))
    assert ops["com.microsoft.DynamicQuantizeMatMul"] and ops["com.microsoft.GroupQueryAttention"]
    # two INT8 quantizations of one model: int8-sized gaps (demo: 0.085); a different model
    # of the same shape is several units off (the stage refuses one by its lineage)
    assert manifest["pair"]["logits_max_abs"] < 1.0 and manifest["pair"]["top1_agreement"] > 0.5
    lm = rt.load(pair, threads=1, tune=False)  # the pair as built (tuning: the next test)
    calls = {"prefill": 0, "step": 0}
    for name, sess in (("prefill", lm.prefill_session), ("step", lm.session)):
        class Counting:  # the session, counting its runs
            def __init__(self, s, key):
                self.s, self.key = s, key

            def run_with_iobinding(self, *a):
                calls[self.key] += 1
                return self.s.run_with_iobinding(*a)

            def __getattr__(self, attr):
                return getattr(self.s, attr)
        setattr(lm, "prefill_session" if name == "prefill" else "session", Counting(sess, name))
    lm._caches.free.clear()
    out = lm.generate_details(PROMPTS, max_new_tokens=6)
    assert calls == {"prefill": 1, "step": 5}  # one prompt pass, then one graph per token
    ref = rt.load(int8).generate_details(PROMPTS, max_new_tokens=6)
    same = sum(a == b for r, o in zip(ref, out) for a, b in zip(r.token_ids, o.token_ids))
    assert same >= 0.5 * sum(len(r.token_ids) for r in ref)  # two quantizations, one model
    other = tmp_path / "other"
    import shutil
    shutil.copytree(qgemm, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["tinyt"]["model"]["block_size"] += 1
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="not the same model|does not match"):
        optimize(int8, tmp_path / "bad", target="gqa", prefill_from=other)
    from tinyt.export.shared_cache import origin
    assert origin(load_manifest(int8)) == origin(load_manifest(qgemm)) is not None
    # the same config and tokenizer, exported from another checkpoint: another model
    shutil.rmtree(other)
    shutil.copytree(qgemm, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["source"] = {"kind": "checkpoint", "sha256": {"model.safetensors": "0" * 64}}
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match="lineages lead to different checkpoints"):
        optimize(int8, tmp_path / "bad", target="gqa", prefill_from=other)


def test_verify_against_pytorch_and_the_formats_it_packages_in(tiny_ckpt, opt_gqa, pair,
                                                               tmp_path):
    from tinyt.export import verify
    from tinyt.export.package import PackageError

    report = verify(tiny_ckpt, opt_gqa, report_path=tmp_path / "v.json")
    assert report["passed"], report["failures"]
    assert report["graph"] == "decoder_gqa" and report["worst"]["logits"]["max_abs"] <= 1e-4
    assert any(c["prompts"] == [3, 10, 1] for c in report["cases"])  # ragged, one row finishing
    assert all(g["identical"] for g in report["generation"])
    # the ORT format: the graph (or the pair's two) as .ort, run by the runtime like its source
    for name, src in (("one", opt_gqa), ("pair", pair[2])):
        pkg = package(src, tmp_path / name, format="ort")
        m = check_manifest(pkg)
        assert m["graph"] == "decoder_gqa" and m["model_file"] == "model.ort"
        assert m.get("prefill_model_file") == ("prefill.ort" if name == "pair" else None)
        eq = m["equivalence"]
        logits = eq["worst"]["logits"]
        assert eq["greedy_equal"] and logits["max_abs"] <= logits["bound"] == eq["tolerance"]
        assert logits["bound"] < 1e-3
        assert "GroupQueryAttention" in (pkg / "required_operators.config").read_text()
        want = rt.load(src, tune=False).generate_details(PROMPTS, max_new_tokens=6)
        got = rt.load(pkg, tune=False).generate_details(PROMPTS, max_new_tokens=6)
        assert [r.token_ids for r in got] == [r.token_ids for r in want]
    for fmt, fixed, why in (("ort", ["batch_size=1"], "has no past axis"),
                            ("triton", None, "cannot run a graph whose past and present"),
                            ("onnx", None, "an ONNX artifact already")):
        with pytest.raises(PackageError, match=why):
            package(opt_gqa, tmp_path / "bad", format=fmt, fixed=fixed)
    assert not (tmp_path / "bad").exists()


AVX2 = {"machine": "x86_64", "avx2": True}  # u8 x s8 products can saturate
VNNI = {"machine": "x86_64", "avx2": True, "avx512_vnni": True}


def _graph(session) -> str:
    return Path(session._model_path).name  # which file of the artifact a session runs


def test_the_runtime_times_each_phase_and_keeps_the_fastest(pair):
    pair = pair[2]
    fixed = rt.load(pair, threads=2, tune=False)  # exactly the threads asked for, no timing
    assert not fixed.plan.tuned and fixed.plan.measured_ms == {}
    assert (fixed.plan.decode_graph, fixed.plan.decode_threads, fixed.plan.prompt_graph) == \
        ("model.onnx", 2, "prefill.onnx")
    assert fixed.session.get_session_options().intra_op_num_threads == 2
    lm = rt.load(pair, threads=2, tune="speed")  # every graph a candidate, whatever its accuracy
    plan = lm.plan
    decode = {(g, n): f"decode:{g}@{n}" for g in ("model.onnx", "prefill.onnx") for n in (1, 2)}
    assert plan.tuned and set(plan.measured_ms) == {
        *decode.values(), "prompt:prefill.onnx", "prompt:model.onnx"}
    assert all(ms > 0 for ms in plan.measured_ms.values())
    # the sessions are the ones the plan names, and the choice follows the measurements
    assert lm.session.get_session_options().intra_op_num_threads == plan.decode_threads
    assert _graph(lm.session) == plan.decode_graph
    assert _graph(lm.prefill_session or lm.session) == plan.prompt_graph
    # two at a time: the choice so far against the next candidate, kept unless beaten by MARGIN
    order = [decode[c] for c in sorted(decode, key=lambda c: (c[0] != "model.onnx", c[1]))]
    matches = plan.matches
    assert [sorted(m["ms"]) for m in matches] == [
        *(sorted([m["default"], nxt]) for m, nxt in zip(matches, order[1:])),
        ["prompt:model.onnx", "prompt:prefill.onnx"]]
    assert matches[0]["default"] == "decode:model.onnx@1"
    for m, after in zip(matches, matches[1:-1]):
        assert after["default"] == m["kept"]
    for m in matches:
        (other,) = set(m["ms"]) - {m["default"]}
        won = m["ms"][other] < (1 - tuning.MARGIN) * m["ms"][m["default"]]
        assert m["kept"] == (other if won else m["default"])
    assert matches[-1]["default"] == "prompt:prefill.onnx"
    assert f"decode:{plan.decode_graph}@{plan.decode_threads}" == matches[-2]["kept"]
    assert f"prompt:{plan.prompt_graph}" == matches[-1]["kept"]
    assert lm.generate("def alpha", max_new_tokens=4, temperature=0)
    assert rt.load(pair, threads=1, tune="speed").plan.measured_ms.keys() == {  # nothing to split
        "decode:model.onnx@1", "decode:prefill.onnx@1", "prompt:prefill.onnx",
        "prompt:model.onnx"}


@pytest.mark.parametrize("threads, tune", [(2, "speed"), (2, True), (1, "speed")])
def test_the_tuner_holds_at_most_two_sessions(pair, monkeypatch, threads, tune):
    """Each session holds its graph's weights: the tuner opens a candidate's only for its
    match and closes what no match ahead needs, so at most two are alive at once (the pair
    keeps two), and those alive after the load are the plan's."""
    import gc
    import weakref

    real, alive, peak = tuning.create_session, weakref.WeakSet(), [0]

    class Session:  # a real session that can be counted (InferenceSession takes no weakref)
        def __init__(self, **kw):
            self.s = real(**kw)

        def __getattr__(self, name):
            return getattr(self.s, name)

    def counted(artifact, **kw):
        gc.collect()  # only what is still referenced counts
        session = Session(artifact=artifact, **kw)
        alive.add(session)
        peak[0] = max(peak[0], len(alive))
        return session

    monkeypatch.setattr(tuning, "create_session", counted)
    artifact = open_artifact(pair[2])
    plan, step, prompt = tuning.plan_sessions(artifact, threads=threads, spinning=None,
                                              level=None, tune=tune, features=VNNI)
    gc.collect()
    assert plan.tuned and peak[0] == 2
    assert set(alive) == {step, prompt}  # nothing else left open
    assert step.s.get_session_options().intra_op_num_threads == plan.decode_threads
    assert Path(step.s._model_path).name == plan.decode_graph
    assert Path(prompt.s._model_path).name == plan.prompt_graph


@pytest.mark.parametrize("faster, chosen", [(0.90, "prefill.onnx"), (0.97, "model.onnx")])
def test_steps_go_through_the_int8_gemm_graph_when_it_wins_by_the_margin(pair, monkeypatch,
                                                                          faster, chosen):
    """The choice and its wiring, with the timings given (not measured): the prompt graph at 1
    thread is `faster` x the step graph; it decodes only when that beats MARGIN, and then
    generate's steps run on its session."""
    import numpy as np

    from tinyt.runtime.cache import SharedCache

    def measured(artifact, decode, prompt):
        times = {f"decode:{g}@{n}": 1.0 * n for g, n in decode}  # one thread is best
        times["decode:prefill.onnx@1"] = faster
        return times | {f"prompt:{g}": 1.0 for g in prompt}

    monkeypatch.setattr(tuning, "_measure", measured)
    lm = rt.load(pair[2], threads=2, tune="speed")
    assert (lm.plan.decode_graph, lm.plan.decode_threads) == (chosen, 1)
    assert _graph(lm.session) == chosen and any("prefill.onnx measured" in r
                                                for r in lm.plan.reasons) == (faster < 0.95)
    ids = lm.tokenizer.encode("def alpha")
    got = lm.generate_ids([ids], max_new_tokens=6, min_new_tokens=6)[0].token_ids
    cache = SharedCache(lm.session, lm.config, 1, len(ids) + 8,
                        prefill_session=lm.prefill_session)  # the plan's two sessions, by hand
    logits, want = cache.prefill([ids], 0), []
    for _ in range(6):
        want.append(int(logits[0, 0, :lm.tokenizer.vocab_size].argmax()))
        logits = cache.step(np.array([want[-1]]), np.array([True]))
    assert got == want


@pytest.mark.parametrize("tie", [False, True])
def test_fp32_tokens_may_differ_from_the_source_only_at_a_tie(opt, tmp_path, monkeypatch, tie):
    """The fp32 shared-cache graph must generate its source's greedy tokens, but for a tie
    at fp32 precision where they first differ: a candidate whose first token is the source's
    runner-up is refused, unless the two are within the tie margin (here made wide)."""
    import numpy as np

    import tinyt.export.shared_cache_checks as G

    make = G._gqa_model

    def runner_up_first(src_dir, path, cfg, prefill=None):
        lm = make(src_dir, path, cfg, prefill)
        real = lm.generate_ids

        def generate_ids(prompts, **kw):
            out = real(prompts, **kw)
            for prompt, r in zip(prompts, out):
                z = next(lm.steps(G.prefill_feeds(cfg, "decoder_with_past", np.array([prompt]),
                                                  np.ones((1, len(prompt)), np.int64))))[0, -1]
                r.token_ids[0] = int(np.argsort(z[:lm.tokenizer.vocab_size])[-2])
            return out

        lm.generate_ids = generate_ids
        return lm

    monkeypatch.setattr(G, "_gqa_model", runner_up_first)
    if not tie:
        with pytest.raises(SharedCacheError, match="more than a tie at fp32 precision"):
            optimize(opt, tmp_path / "g", target="gqa")
        assert not (tmp_path / "g").exists()
        return
    monkeypatch.setattr(G, "reorder_bound", lambda cfg, size: 1e3)  # every one a "tie"
    eq = check_manifest(optimize(opt, tmp_path / "g", target="gqa"))["equivalence"]
    assert eq["greedy_ties"] == 3 and eq["greedy_agreement"] < 1


def test_a_candidate_must_win_by_the_margin():
    assert tuning._choose(1, {1: 1.0, 2: 0.97}) == 1  # 3% is noise: the core stays free
    assert tuning._choose(1, {1: 1.0, 2: 0.90}) == 2
    assert tuning._choose("prefill.onnx", {"prefill.onnx": 1.0, "model.onnx": 0.5}) == "model.onnx"
    assert tuning._choose("prefill.onnx", {"prefill.onnx": 0.5, "model.onnx": 1.0}) == "prefill.onnx"


def test_full_range_int8_gemms_are_not_run_where_they_saturate(pair):
    artifact = open_artifact(pair[2])
    options = artifact.manifest.data["prefill_source"]["manifest"]["options"]
    assert options["kernel"] == "qgemm"
    full = artifact.with_manifest(_with_options(artifact, reduce_range=False))
    seven = artifact.with_manifest(_with_options(artifact, reduce_range=True))
    unknown = artifact.with_manifest({
        k: v for k, v in artifact.manifest.data.items() if k not in ("prefill_source", "int8")})
    assert "saturate" in tuning.prompt_graph_allowed(full, AVX2)
    assert "does not say" in tuning.prompt_graph_allowed(unknown, AVX2)
    assert tuning.prompt_graph_allowed(seven, AVX2) is None  # 7-bit weights: made for it
    for a in (full, unknown, seven):
        assert tuning.prompt_graph_allowed(a, VNNI) is None
    plan, step, prompt = tuning.plan_sessions(full, threads=1, spinning=None, level=None,
                                              tune=False, features=AVX2)
    assert plan.prompt_graph == "model.onnx" and prompt is step and "saturate" in plan.reasons[0]
    plan, step, prompt = tuning.plan_sessions(full, threads=1, spinning=None, level=None,
                                              tune=True, features=AVX2)
    assert not any("prefill.onnx" in k for k in plan.measured_ms)  # not even timed for steps
    assert plan.decode_graph == plan.prompt_graph == _graph(step) == "model.onnx"
    if saturates_here():  # the plan's rule aside, the session itself refuses the graph here
        with pytest.raises(SaturationError, match="prefill.onnx: its u8 x s8 int8 GEMMs have "
                                                  "8-bit weights"):
            tuning.plan_sessions(full, threads=1, spinning=None, level=None, tune=False,
                                 features=VNNI)
    else:
        plan, step, prompt = tuning.plan_sessions(full, threads=1, spinning=None, level=None,
                                                  tune=False, features=VNNI)
        assert plan.prompt_graph == _graph(prompt) == "prefill.onnx" and plan.reasons == []


def _with_kl(artifact, step: float | None, prompt: float | None, **prompt_report) -> Artifact:
    """The pair as if its graphs' accuracy reports had these KL divergences (None: no report)."""
    manifest = {k: v for k, v in artifact.manifest.data.items()
                if k not in ("accuracy", "source_accuracy", "prefill_accuracy", "prefill_source")}
    for key, kl, extra in (("source_accuracy", step, {}),
                           ("prefill_accuracy", prompt, prompt_report)):
        if kl is not None:
            manifest[key] = {**artifact.manifest.data["source_accuracy"], "kl_divergence": kl,
                             **extra}
    return artifact.with_manifest(manifest)


def test_the_tuner_decodes_only_through_a_graph_at_least_as_accurate(pair):
    """Which graph decodes decides the quantization a token is computed with: the prompt graph
    is a decode candidate only when its accuracy report's KL from fp32 is at most the step
    graph's (an INT4 pair's int8 prompt graph), unless tune="speed"."""
    int8, qgemm, pair = pair
    manifest = check_manifest(pair)  # the pair keeps both graphs' reports, and its own
    assert manifest["source_accuracy"] == check_manifest(int8)["accuracy"]
    assert manifest["accuracy"]["measured_on"].startswith("this artifact")
    assert manifest["prefill_accuracy"] == check_manifest(qgemm)["accuracy"]
    artifact = open_artifact(pair)
    refusal = tuning.decode_accuracy_refusal
    assert refusal(_with_kl(artifact, 1e-3, 1e-3)) is None  # as accurate: may decode
    assert refusal(_with_kl(artifact, 1e-3, 1e-4)) is None  # more accurate (INT4 steps)
    assert "less accurate than model.onnx's (KL from fp32 0.0011 against 0.001" in refusal(
        _with_kl(artifact, 1e-3, 1.1e-3))
    assert "no accuracy report" in refusal(_with_kl(artifact, 1e-3, None))
    assert "different text" in refusal(_with_kl(artifact, 1e-3, 1e-4, tokens=7))
    fp32_steps = _with_kl(artifact, None, 1e-9)
    fp32_steps.manifest.data.pop("quantization")
    assert "less accurate" in refusal(fp32_steps)  # unquantized steps are the reference
    # the same rule on what the demo pair's own reports say, and where the plan records it
    worse = refusal(artifact)
    assert (worse is None) == (manifest["prefill_accuracy"]["kl_divergence"]
                               <= manifest["source_accuracy"]["kl_divergence"])
    for tune, case in (("speed", _with_kl(artifact, 1e-3, 1.1e-3)),
                       (True, _with_kl(artifact, 1e-3, 1.1e-3)),
                       (True, _with_kl(artifact, 1e-3, 1e-4))):
        plan, step, prompt = tuning.plan_sessions(case, threads=1, spinning=None, level=None,
                                                  tune=tune, features=VNNI)
        timed = "decode:prefill.onnx@1" in plan.measured_ms
        assert timed == (tune == "speed" or refusal(case) is None)
        assert any("not timed: its tokens are less accurate" in r for r in plan.reasons) == \
            (not timed)
        assert timed or _graph(step) == plan.decode_graph == "model.onnx"
        assert {"prompt:prefill.onnx", "prompt:model.onnx"} <= plan.measured_ms.keys()
        assert _graph(prompt) == plan.prompt_graph  # prompts: timed whatever decodes
    for bad in ("fast", 1, None):
        with pytest.raises(ConfigError, match=r"tune=.* is not one of True .*'speed'"):
            rt.load(pair, tune=bad)
    from conftest import run_tinyt

    args = ("generate", pair, "def ", "--max-new-tokens", "3", "--threads", "1", "-v")
    r = run_tinyt(*args, "--tune-speed")
    assert r.returncode == 0 and "'decode:prefill.onnx@1'" in r.stderr, r.stderr
    r = run_tinyt(*args)
    assert r.returncode == 0 and ("'decode:prefill.onnx@1'" in r.stderr) == (worse is None)
    r = run_tinyt(*args, "--tune-speed", "--no-tune")
    assert r.returncode == 2 and "cannot go with --no-tune" in r.stderr, r.stderr


def _with_options(artifact, **options) -> dict:
    """The pair's manifest as if its prompt graph had been quantized with `options`, read
    through its lineage (the record the stage wrote left out)."""
    source = artifact.manifest.data["prefill_source"]
    source_manifest = {k: v for k, v in source["manifest"].items() if k != "int8"}
    return {**{k: v for k, v in artifact.manifest.data.items() if k != "int8"},
            "prefill_source": {**source, "manifest": {
                **source_manifest, "options": {**source_manifest["options"], **options}}}}


def test_the_single_greedy_loop_makes_the_general_loops_tokens(opt_gqa):
    lm = rt.load(opt_gqa, threads=1)
    tok = lm.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS] + [[5] * (lm.context - 3), [tok.eos_id] * 3]
    reasons = set()
    for ids in prompts:
        for kw in ({"max_new_tokens": 0}, {"max_new_tokens": 1}, {"max_new_tokens": 9},
                   {"max_new_tokens": 300, "min_new_tokens": 0},
                   {"max_new_tokens": 40, "min_new_tokens": 40}):
            fast = lm.generate_ids([ids], temperature=0, **kw)[0]
            # a stop string that never occurs sends the same call through the general loop
            slow = lm.generate_ids([ids], temperature=0, stop="\x00never", **kw)[0]
            assert (fast.token_ids, fast.finish_reason) == (slow.token_ids, slow.finish_reason)
            reasons.add(fast.finish_reason)
    assert {"length", "context"} <= reasons  # the loop's exits were exercised


def test_the_single_greedy_loop_stops_on_non_finite_logits(opt_gqa, tmp_path):
    from test_reliability import _poisoned

    from tinyt.errors import NonFiniteError
    bad = _poisoned(opt_gqa, tmp_path, "model.transformer.wpe.weight", (5, 0))
    lm = rt.load(bad, threads=1)  # position 5 is NaN: the probe (last position) passes
    assert lm.generate_ids([[7, 8]], max_new_tokens=2, temperature=0)[0].token_ids
    messages = []
    for extra in ({}, {"stop": "\x00never"}):  # the single greedy loop, then the general one
        with pytest.raises(NonFiniteError, match="stopped at new token 5 of row 0: .* not finite"
                           ) as e:
            lm.generate_ids([[7, 8]], max_new_tokens=9, min_new_tokens=9, temperature=0, **extra)
        messages.append(str(e.value))
    assert messages[0] == messages[1]


def test_a_prompt_graph_beyond_the_budget_is_not_run(pair):
    """The plan never runs prompts through a prompt graph whose own accuracy report costs more
    perplexity than the INT8 budget and than the step graph's (real SmolLM2's per-tensor
    int8-GEMM graph: +59.5%): prompts and steps then run on the step graph."""
    artifact = open_artifact(pair[2])
    m = artifact.manifest.data
    worse = {**m["prefill_accuracy"], "perplexity_change": 0.595}
    bad = artifact.with_manifest({**m, "prefill_accuracy": worse})
    assert "costs perplexity +59.50%, beyond the +0.5% budget" in \
        tuning.prompt_graph_allowed(bad, VNNI)
    assert tuning.prompt_graph_allowed(artifact, VNNI) is None  # the demo's holds
    plan, step, prompt = tuning.plan_sessions(bad, threads=1, spinning=None, level=None,
                                              tune=False, features=VNNI)
    assert plan.prompt_graph == "model.onnx" and prompt is step
