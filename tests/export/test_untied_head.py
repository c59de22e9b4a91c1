"""An untied lm_head (Mistral-7B-v0.1's and Phi-3.5-mini's settings) through the main job's
row-quantized pair: `quantize --kernel qgemm-rows` makes the head a MatMulInteger between a
per-row activation scale and a per-channel weight scale, not one matmul, and the shared-cache
rewrite still finds it, feeds it each row's last position, and keeps every position's logits
(the head run alone on the hidden states, runtime/score.py) those of its source graph."""
import numpy as np
import onnx
import pytest
from hf_fixtures import save_hf

import tinyt.runtime as rt
from tinyt.artifacts import arguments, variant
from tinyt.contract import HEAD_INPUT, HIDDEN_OUTPUT
from tinyt.export.shared_cache_checks import quant_floor
from tinyt.manifest import check_manifest, read_model_config

# The rows graph's shared-cache form computes each row as its source does, but attention in
# another fp32 order (GroupQueryAttention) can move an activation across an int8 rounding step;
# the stage's own check bounds the logits by eq["tolerance"], and a logprob (a logit less a
# log-sum-exp of logits) moves by at most twice that.
LOGPROB_FACTOR = 2.0
ROWS = ("onnx", "onnx-opt", "onnx-int8-rows", "onnx-int8-rows-gqa")  # the pipeline's rows


@pytest.mark.parametrize("family", ["mistral", pytest.param("phi3.5", marks=pytest.mark.slow)])
def test_untied_head_through_the_row_quantized_shared_cache_stage(family, tmp_path):
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize
    from tinyt.hf import import_hf

    # one layer (Phi-3.5's export then reads the batch size from attention_mask's shape, which
    # the shared-cache graph has no input for: gqa_graph reads it from input_ids)
    save_hf(family, tmp_path / "hf", num_hidden_layers=1,
            **({"sliding_window": 12} if family == "mistral" else {}))
    ck = import_hf(tmp_path / "hf", tmp_path / "ck", log=lambda s: None)
    stages = {"export": export_onnx, "optimize": optimize, "quantize": quantize}
    root = tmp_path / "artifacts"
    for name in ROWS:  # as `tinyt pipeline --skip-train` calls them
        v = variant(name)
        source, out, options = arguments(v, root, checkpoint=ck)
        stages[v.stage](source, out, **options)
    rows, gqa = root / "onnx-int8-rows", root / "onnx-int8-rows-gqa"

    head = [n for n in onnx.load(str(gqa / "model.onnx")).graph.node
            if n.name.startswith("/lm_head/RowQuantizedMatMul/")]
    readers = sorted(n.name.rsplit("/", 1)[1] for n in head if HEAD_INPUT in n.input)
    assert readers == ["Abs", "Div"], readers  # the row scale and the division: last rows only
    assert not any(HIDDEN_OUTPUT in n.input for n in head)
    eq = check_manifest(gqa)["equivalence"]
    assert eq["logits_max_abs"] <= eq["tolerance"], eq
    # checked as the quantized graph it is (MatMulInteger and GatherBlockQuantized, no
    # MatMulNBits): the quantization's own distance from fp32 measured, an int8 level per block
    # the least it allows (not fp32 rounding's bound), greedy tokens not held to fp32 ties
    cfg, _ = read_model_config(gqa)
    assert "quantization_vs_fp32_max_abs" in eq, eq
    assert eq["tolerance"] >= quant_floor(cfg, eq["logits_magnitude"]), eq
    assert eq["greedy_agreement"] == 1.0 or eq["greedy_ties"] > 0, eq

    # every position of a prompt, the head alone on the hidden states against the source graph
    ids = list(range(3, 43))  # 40 tokens, past Mistral's window of 12 here
    want = rt.load(rows, threads=1, tune=False).prompt_logprobs(ids, top=5)
    got = rt.load(gqa, threads=1, tune=False).prompt_logprobs(ids, top=5)
    diff = np.abs(np.array([g.logprob for g in got[1:]]) - [w.logprob for w in want[1:]])
    assert diff.max() <= LOGPROB_FACTOR * eq["tolerance"], (diff.max(), eq["tolerance"])
    assert [g.top[0][0] for g in got[1:]] == [w.top[0][0] for w in want[1:]]
