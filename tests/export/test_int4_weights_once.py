"""The INT4 shared-cache variant holds its weights once (issue 51): one 4-bit graph runs the
prompts and the steps, where the pair ran its prompts on a second, 8-bit copy of the weights
(docs/quantization.md); a pair made before still loads and runs as it did."""
import hashlib

import numpy as np
import pytest

import tinyt.runtime as rt
from tinyt.artifacts import BY_DIR, arguments
from tinyt.export.compare import reorder_bound
from tinyt.export.optimize import optimize
from tinyt.export.package import _step_logits
from tinyt.export.quantize import quantize
from tinyt.graphio import graph_files
from tinyt.manifest import check_manifest

# A shared-cache graph holds its source's weights plus or minus the few constants the
# conversion changes beside them: at Qwen3-0.6B's widths (4 layers) 0.02% fewer bytes than
# its source. "One copy": at most 1.1x the source
# graph's bytes, the budget against the GenAI builder's int4.
ONE_COPY = 1.1


@pytest.fixture(scope="module")
def built(lm_onnx, corpus_dir, tmp_path_factory):
    """The root of onnx-int4, onnx-int8-qgemm and onnx-int4-gqa made as the catalogue makes
    them, and `pair`: the old form (the same step graph with a qgemm prompt graph)."""
    root = tmp_path_factory.mktemp("int4-once")
    optimize(lm_onnx, root / "onnx-opt")
    for row in ("onnx-int4", "onnx-int8-qgemm", "onnx-int4-gqa"):
        source, out, options = arguments(BY_DIR[row], root, data=str(corpus_dir))
        options.pop("data", None)  # the accuracy reports are other tests' business
        (optimize if BY_DIR[row].stage == "optimize" else quantize)(source, out, **options)
    optimize(root / "onnx-int4", root / "pair", target="gqa",
             prefill_from=root / "onnx-int8-qgemm")
    return root


def _bytes(directory, graph="model.onnx") -> int:
    return sum(p.stat().st_size for p in graph_files(directory / graph))


def _sha(directory) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest()
            for p in graph_files(directory / "model.onnx")]


def test_the_int4_variant_is_one_graph_of_one_copy(built):
    assert BY_DIR["onnx-int4-gqa"].prefill_from is None
    one, pair = check_manifest(built / "onnx-int4-gqa"), check_manifest(built / "pair")
    assert "prefill_model_file" not in one and pair["prefill_model_file"] == "prefill.onnx"
    source = _bytes(built / "onnx-int4")
    graphs = {f for f in one["files"] if ".onnx" in f}
    assert sum((built / "onnx-int4-gqa" / f).stat().st_size for f in graphs) \
        <= ONE_COPY * source
    # the old form's second copy: the 8-bit prompt graph is larger than the 4-bit step graph
    assert _bytes(built / "pair", "prefill.onnx") > _bytes(built / "pair")


def test_its_outputs_are_the_old_pairs_step_graphs(built):
    """The new form is the old pair's step graph, byte for byte, and computes what the old
    pair computes once its prompts also run there: the same logits (one graph, one order of
    operations: equal within fp32 rounding, reorder_bound) and the same greedy tokens."""
    one_dir, pair_dir = built / "onnx-int4-gqa", built / "pair"
    assert _sha(one_dir) == _sha(pair_dir)
    one = rt.load(one_dir, threads=1, tune=False)
    assert one.prefill_session is None and one.plan.prompt_graph == "model.onnx"
    old = rt.load(pair_dir, threads=1, tune=False)
    assert old.plan.prompt_graph == "prefill.onnx"  # the old form runs as it was built
    old.prefill_session, old.plan.prompt_graph = None, "model.onnx"  # its prompts through
    old._caches.free.clear()  # its step graph: what the new form does
    ids = [one.tokenizer.encode(t) for t in ("def alpha(x):", "import os\n")]
    a, b = (np.stack([x for i in ids for x in _step_logits(m, i, 4)]) for m in (one, old))
    assert a.shape == b.shape and a.dtype == b.dtype
    worst, bound = float(np.abs(a - b).max()), reorder_bound(one.config, float(np.abs(b).max()))
    assert worst <= bound, (worst, bound)
    got = [r.token_ids for r in one.generate_ids(ids, max_new_tokens=6)]
    assert got == [r.token_ids for r in old.generate_ids(ids, max_new_tokens=6)]


def test_the_old_pair_still_loads_and_runs_its_prompt_graph(built):
    lm = rt.load(built / "pair", threads=1, tune=False)
    assert lm.prefill_session is not None and lm.plan.prompt_graph == "prefill.onnx"
    out = lm.generate_details(["def alpha", "x"], max_new_tokens=4)
    assert all(len(r.token_ids) == 4 for r in out)


@pytest.mark.parametrize("one_thread, tune, sessions, says", [
    (0.5, True, 1, "memory: steps at 1 thread(s) measured faster"),
    (0.5, "speed", 2, "memory: model.onnx is held twice"),
    (2.0, True, 1, None)])
def test_the_tuner_holds_one_graph_once(built, monkeypatch, one_thread, tune, sessions, says):
    """A session packs its own copy of the weights (ONNX Runtime's Python API shares no
    pre-packed weights between sessions): steps at 1 thread beside prompts at 2 would be two
    sessions of one graph. tune=True keeps one (the steps join the prompts' session, and the
    plan says why); tune="speed" keeps both, and says what it costs."""
    from tinyt.runtime import tuning

    def measured(artifact, decode, prompt):  # the timings given, not measured
        return {f"decode:{g}@{n}": (one_thread if n == 1 else 1.0) for g, n in decode} | \
            {f"prompt:{g}": 1.0 for g in prompt}

    monkeypatch.setattr(tuning, "_measure", measured)
    lm = rt.load(built / "onnx-int4-gqa", threads=2, tune=tune)
    assert lm.plan.prompt_graph == lm.plan.decode_graph == "model.onnx"
    assert 1 + (lm.prefill_session is not None) == sessions
    assert lm.plan.decode_threads == (1 if sessions == 2 else 2)
    memory = [r for r in lm.plan.reasons if r.startswith("memory:")]
    assert memory == ([] if says is None else [memory[0]]) and \
        (says is None or memory[0].startswith(says))
