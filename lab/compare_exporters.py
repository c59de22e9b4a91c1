"""Evidence for tinyt's exporter choice: torch's dynamo exporter vs the TorchScript one.

For one checkpoint, exports the KV-cache decoder both ways and reports, side by side:
whether every contract axis is symbolic, how many copies of the tied matrix are stored, file
size against 4 bytes x unique parameters, node count, which fusions onnxscript's
`optimize_for_ort` applies, and ONNX Runtime decode latency (batch 1, one new token, past 64,
rounds interleaved). Run:

    .venv/bin/python lab/compare_exporters.py artifacts/checkpoint
"""
from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

from tinyt import contract as C
from tinyt.checkpoint import load_checkpoint
from tinyt.export import export_onnx
from tinyt.export.exporter import DecoderWithPast, _example
from tinyt.runtime.timing import session_latency_ms


def torchscript_export(ckpt, path: Path, opset: int) -> None:
    cfg = ckpt.config
    inputs, outputs = C.decoder_inputs(cfg), C.decoder_outputs(cfg)
    kwargs, _ = _example(cfg, C.DECODER_WITH_PAST)
    axes = {t.name: {i: a for i, a in enumerate(t.shape) if isinstance(a, str)}
            for t in [*inputs, *outputs]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(DecoderWithPast(ckpt.model).eval(),
                          (kwargs["input_ids"], kwargs["attention_mask"],
                           kwargs["position_ids"], kwargs["past"]),
                          str(path), dynamo=False, opset_version=opset,
                          input_names=[t.name for t in inputs],
                          output_names=[t.name for t in outputs], dynamic_axes=axes,
                          do_constant_folding=True)


def describe(path: Path, ckpt) -> dict:
    cfg = ckpt.config
    model = onnx.load(str(path))
    inputs, outputs = C.decoder_inputs(cfg), C.decoder_outputs(cfg)
    values = {v.name: v for v in [*model.graph.input, *model.graph.output]}
    symbolic = all(
        bool(d.dim_param) == isinstance(want, str)
        for t in [*inputs, *outputs]
        for d, want in zip(values[t.name].type.tensor_type.shape.dim, t.shape))
    V, E = cfg.vocab_size, cfg.n_embd
    tied = sum(sorted(i.dims) == sorted([V, E]) for i in model.graph.initializer)
    fusions = {}
    try:
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort
        _, counts = optimize_for_ort(ir.from_proto(model))
        fusions = {k: v for k, v in counts.items() if v}
    except Exception as e:  # the evidence is that it fails: record why
        fusions = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    return {"all_contract_axes_symbolic": symbolic, "tied_matrix_copies": tied,
            "bytes": path.stat().st_size,
            "bytes_over_params": path.stat().st_size / (4 * ckpt.model.num_parameters()),
            "nodes": len(model.graph.node), "onnxscript_ort_fusions": fusions}


def decode_latency(paths: dict[str, Path], ckpt, past: int, rounds: int) -> dict[str, float]:
    cfg = ckpt.config
    feeds = {
        "input_ids": np.array([[1]], dtype=np.int64),
        "attention_mask": np.ones((1, past + 1), dtype=np.int64),
        "position_ids": np.array([[past]], dtype=np.int64),
        **{n: np.random.default_rng(0).standard_normal(C.kv_shape(cfg, 1, past))
           .astype(np.float32)
           for n in C.past_names(cfg.n_layer)}}
    return session_latency_ms(paths, feeds, rounds=rounds, threads=2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--opset", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    ckpt = load_checkpoint(args.checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = {"dynamo": export_onnx(args.checkpoint, tmp / "dynamo", opset=args.opset)
                 / "model.onnx",
                 "torchscript": tmp / "torchscript.onnx"}
        torchscript_export(ckpt, paths["torchscript"], args.opset)
        result = {k: describe(p, ckpt) for k, p in paths.items()}
        past = min(64, ckpt.config.block_size - 1)  # 64 on the demo model
        lat = decode_latency(paths, ckpt, past=past, rounds=args.rounds)
        for k in result:
            result[k][f"decode_ms_per_token_past{past}"] = lat[k]
    result["parameters"] = ckpt.model.num_parameters()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
