"""INT4 calibrated on activations on a real decoder: tinyt's rounding, its activation-aware
scales (export/awq.py) and mixed precision within a byte budget (export/mixed.py), beside ONNX
Runtime's own MatMulNBitsQuantizer algorithms (k_quant, HQQ, GPTQ) on the same layers.

    .venv/bin/python -m lab.int4_calibrated SMOL/onnx-opt --out benchmarks/results/DIR \
        --variants rtn-sym-k64,awq-sym-k64,awq-sym-k64-mixed112

Perplexity as tests/real/test_smollm2.py scores it (and the GenAI builder's rows in
docs/quantization.md were): held-out prose (Python's pydoc topics, benchmarks/real_quality.py
heldout_text), 4 windows of 512 tokens at ids[500 i:], through onnxruntime directly (1
thread); the fp32 source gives 22.02 on real SmolLM2-135M. Calibration: the training split of
the built-in corpus (export/qdq.py calibration_batches, as static INT8 calibrates), never the
held-out text. A variant is `ALGO-SCHEME-kBLOCK[-head8][-mixedMB]`: ALGO rtn (tinyt's
rounding with its scale search), awq (the same after the activation-aware scales), or
ort-k_quant / ort-hqq / ort-gptq / ort-rtn (ONNX Runtime's quantizer on the layers' matmuls,
then tinyt's rounding of the tied table, which that quantizer leaves fp32); SCHEME sym
(symmetric) or asym (asymmetric, zero points); head8: the tied table at 8 bits; mixedMB: the
tables that move the logits most at 8 bits within MB x 10^6 bytes.
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from tinyt.benchmarks.environment import environment
from tinyt.benchmarks.real_quality import heldout_text
from tinyt.contract import DECODER_WITH_PAST
from tinyt.export.blockquant import quantize_weights
from tinyt.export.mixed import calibrate
from tinyt.export.qdq import calibration_batches
from tinyt.export.stage import open_source, source_graph
from tinyt.graphio import save_graph
from tinyt.recipe import QuantRecipe
from tinyt.runtime.feeds import prefill_feeds
from tinyt.tokenizer import Tokenizer

SCHEMES = {"sym": "symmetric", "asym": "asymmetric"}


def parse(name: str) -> dict:
    """A variant's name as its options (module docstring)."""
    parts = name.split("-")
    algo = parts.pop(0)
    if algo == "ort":
        algo = f"ort-{parts.pop(0)}"
    scheme, block = SCHEMES[parts.pop(0)], int(parts.pop(0).removeprefix("k"))
    head8 = "head8" in parts
    mixed = next((float(p.removeprefix("mixed")) for p in parts if p.startswith("mixed")), None)
    return {"algo": algo, "scheme": scheme, "block": block, "head8": head8,
            "max_bytes": None if mixed is None else int(mixed * 1e6)}


def perplexity(path: Path, cfg, windows: list[list[int]]) -> float:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    nll = count = 0.0
    for w in windows:
        z = sess.run(["logits"], prefill_feeds(cfg, DECODER_WITH_PAST, np.array([w])))[0][0]
        z = z.astype(np.float64)
        lz = z - np.logaddexp.reduce(z, axis=-1, keepdims=True)
        nll -= float(lz[np.arange(len(w) - 1), w[1:]].sum())
        count += len(w) - 1
    return math.exp(nll / count)


def ort_layers(proto: onnx.ModelProto, algo: str, scheme: str, block: int,
               batches: list[dict]) -> onnx.ModelProto:
    """ONNX Runtime's MatMulNBitsQuantizer on the layers' MatMuls (its algorithms read plain
    MatMul(x, initializer); the tied table's FusedMatMul and Gather are left to tinyt)."""
    from onnxruntime.quantization import matmul_nbits_quantizer as mq

    symmetric = scheme == "symmetric"
    kind = algo.removeprefix("ort-")
    if kind == "hqq":
        config = mq.HQQWeightOnlyQuantConfig(block_size=block, bits=4)
    elif kind == "gptq":
        class Reader(mq.CalibrationDataReader if hasattr(mq, "CalibrationDataReader")
                     else object):
            def __init__(self):
                self.it = iter(batches)

            def get_next(self):
                return next(self.it, None)

            def __iter__(self):
                return iter(batches)
        config = mq.GPTQWeightOnlyQuantConfig(calibration_data_reader=Reader(), block_size=block)
    elif kind == "k_quant":
        config = mq.KQuantWeightOnlyQuantConfig()
    else:
        config = mq.RTNWeightOnlyQuantConfig()
    others = [n.name for n in proto.graph.node  # the rotary tables' small MatMul: left
              if n.op_type == "MatMul" and not n.name.startswith("/transformer/h.")]
    q = mq.MatMulNBitsQuantizer(proto, bits=4, block_size=block, is_symmetric=symmetric,
                                accuracy_level=4, op_types_to_quantize=("MatMul",),
                                nodes_to_exclude=others, algo_config=config)
    q.process()
    return q.model.model


def build(src, proto: onnx.ModelProto, v: dict, batches: list[dict], out: Path) -> dict:
    """Quantize a copy of `proto` as variant v asks, saved to `out`; its record."""
    work = onnx.ModelProto()
    work.CopyFrom(proto)
    recipe = QuantRecipe.request(bits=4, block_size=v["block"], scheme=v["scheme"],
                                 scale_search=True, keep_8bit=["lm_head"] if v["head8"] else [],
                                 awq=v["algo"] == "awq", max_bytes=v["max_bytes"])
    record: dict = {}
    t0 = time.perf_counter()
    if v["algo"].startswith("ort-"):
        work = ort_layers(work, v["algo"], v["scheme"], v["block"], batches)
    elif recipe.calibrated:
        recipe, record = calibrate(work, recipe, batches)
    report = quantize_weights(work, recipe)
    seconds = time.perf_counter() - t0
    save_graph(work, out)
    return {"recipe": recipe.to_json(), "quantize_seconds": round(seconds, 1),
            "bytes": sum(f.stat().st_size for f in out.parent.iterdir()
                         if f.name.startswith(out.name)),
            "kept_8bit": report.kept_8bit, **record}


def alignment(proto: onnx.ModelProto, layer: int = 5) -> dict:
    """Relative squared weight error of layer `layer`'s c_attn and c_fc under tinyt's blocks
    (no scale search) and under Q4_1's own form (blocks of 32, min / max, a float minimum),
    with the share of values each re-finds exactly: what the weights' GGUF origin favours."""
    from tinyt.export.blockquant import block_quantize, dequantize

    inits = {i.name: i for i in proto.graph.initializer}
    out = {}
    for node in proto.graph.node:
        if node.name not in (f"/transformer/h.{layer}/attn/c_attn/MatMul",
                             f"/transformer/h.{layer}/mlp/c_fc/MatMul"):
            continue
        rows = np.ascontiguousarray(onnx.numpy_helper.to_array(inits[node.input[1]]).T)
        norm, tiny = float(np.square(rows).sum()), 1e-6 * float(np.abs(rows).max())
        forms = {}
        for blk, scheme in ((32, "asymmetric"), (64, "asymmetric"), (64, "symmetric")):
            q, scales, zeros = block_quantize(rows, 4, blk, scheme, False)
            forms[f"{scheme}-k{blk}"] = dequantize(q, scales, 4, zeros)
        x = rows.reshape(rows.shape[0], -1, 32)
        lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
        step = np.where(hi > lo, (hi - lo) / 15, 1)
        forms["q4_1-form-k32"] = (np.rint((x - lo) / step) * step + lo).reshape(rows.shape)
        out[node.name] = {k: {"relative_squared_error": float(np.square(v - rows).sum()) / norm,
                              "exact_share": float(np.mean(np.abs(v - rows) <= tiny))}
                          for k, v in forms.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="the fp32 decoder artifact (onnx-opt)")
    ap.add_argument("--variants", default="", help="comma-separated (module docstring)")
    ap.add_argument("--alignment", action="store_true",
                    help="also the weight error of layer 5's c_attn / c_fc per block form")
    ap.add_argument("--out", type=Path, help="write results.json here (appended by variant)")
    a = ap.parse_args()
    src = open_source(a.src)
    cfg = src.config
    tok = Tokenizer.from_file(src.path / "tokenizer.json")
    ids = tok.encode(heldout_text())
    windows = [ids[i * 500: i * 500 + 512] for i in range(4)]
    batches, calib = calibration_batches(tok, cfg, src.kind, None)
    proto = source_graph(src)
    path = a.out / "results.json" if a.out else None
    results = json.loads(path.read_text()) if path and path.is_file() else {
        "command": "python -m lab.int4_calibrated SRC --variants ... --out ...",
        "environment": environment(), "calibration": calib,
        "heldout": "pydoc topics, 4 windows of 512 tokens at ids[500 i:]",
        "fp32_perplexity": perplexity(src.path / "model.onnx", cfg, windows), "rows": {}}
    print(f"fp32 perplexity {results['fp32_perplexity']:.4f}", flush=True)
    if a.alignment:
        results["alignment"] = alignment(proto)
        print(json.dumps(results["alignment"], indent=1), flush=True)
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=1))
    for name in filter(None, a.variants.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            row = build(src, proto, parse(name), batches, Path(tmp) / "model.onnx")
            row["perplexity"] = perplexity(Path(tmp) / "model.onnx", cfg, windows)
        row["perplexity_change"] = row["perplexity"] / results["fp32_perplexity"] - 1
        results["rows"][name] = row
        print(f"{name}: {row['bytes'] / 1e6:.1f} MB, perplexity {row['perplexity']:.3f} "
              f"({100 * row['perplexity_change']:+.1f}%), {row['quantize_seconds']} s",
              flush=True)
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
