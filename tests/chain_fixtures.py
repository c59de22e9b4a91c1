"""The decoder export chain the families' tests take a checkpoint through: export, `optimize
--target cpu`, the shared-cache graph, INT8 (and INT4 where asked), the INT8 shared-cache pair."""


def chain(ck, root, int4=False):
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    out = {"onnx": export_onnx(ck, root / "onnx")}
    out["opt"] = optimize(out["onnx"], root / "opt", target="cpu")
    out["gqa"] = optimize(out["opt"], root / "gqa", target="gqa")
    out["int8"] = quantize(out["opt"], root / "int8", bits=8, block_size=16)
    if int4:  # (the every-option model's accuracy report: the others are not checked at 4 bits)
        out["int4"] = quantize(out["opt"], root / "int4", bits=4, block_size=16)
    out["int8-gqa"] = optimize(out["int8"], root / "int8-gqa", target="gqa")
    return out
