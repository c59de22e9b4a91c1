"""Reading and writing an artifact's ONNX graph (torch-free). Reading: a file that is not
ONNX, or whose weights are not finite, is refused by name before any work. Writing: a graph
too big for one protobuf message keeps its weights in `model.onnx.data` beside it (ONNX's
external data), which ONNX Runtime, the manifest and every stage follow."""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tinyt.errors import GraphError
from tinyt.finite import check_onnx_weights


def load_graph(path: str | Path):
    """The ModelProto in `path`, its weights checked to be finite."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    try:
        proto = onnx.load(str(path))
    except (DecodeError, ValueError, OSError) as e:
        raise GraphError(f"{path} is not a valid ONNX model ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'unparseable protobuf'})") \
            from None
    if not proto.graph.node:
        raise GraphError(f"{path} is not a valid ONNX model (its graph has no nodes)")
    check_onnx_weights(proto, str(path))
    return proto


# ONNX Runtime's contrib-op domain (MatMulNBits, GroupQueryAttention, SkipLayerNormalization...)
CONTRIB_DOMAIN = "com.microsoft"
# The ops a quantized graph holds and an fp32 one never does, whichever way it was quantized:
# QDQ (static), DynamicQuantizeMatMul (kernel qgemm), MatMulInteger (qgemm's row-scaled modules,
# every matmul of qgemm-rows: export/blockquant.py), MatMulNBits and GatherBlockQuantized
# (kernel nbits, and the tied table of every kernel), ONNX Runtime's own QLinear forms.
QUANTIZED_OPS = frozenset({"DequantizeLinear", "QuantizeLinear", "MatMulInteger",
                           "DynamicQuantizeMatMul", "MatMulNBits", "GatherBlockQuantized",
                           "QLinearMatMul", "DynamicQuantizeLinear"})


def quantized_ops(ops: Iterable[str]) -> list[str]:
    """The quantized ops among a graph's op types, sorted: empty for an fp32 graph."""
    return sorted(QUANTIZED_OPS & set(ops))


# Contrib ops ONNX Runtime registers in the standard domain (onnxscript's fusion writes them
# there, as ORT expects): onnx's checker has no schema for them there and refuses the node.
ORT_OPS_IN_ONNX_DOMAIN = ("SimplifiedLayerNormalization",)


def check_graph(path: str | Path) -> None:
    """onnx's checker on a saved graph (its weights left on disk), reading the contrib ops
    ONNX Runtime keeps in the standard domain as the contrib ops they are."""
    import onnx

    path = Path(path)
    proto = onnx.load(str(path), load_external_data=False)
    moved = [n for n in proto.graph.node
             if n.domain in ("", "ai.onnx") and n.op_type in ORT_OPS_IN_ONNX_DOMAIN]
    if not moved:
        onnx.checker.check_model(str(path))  # by path: external data resolves beside it
        return
    for node in moved:
        node.domain = CONTRIB_DOMAIN
    if not any(o.domain == CONTRIB_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(CONTRIB_DOMAIN, 1))
    probe = path.with_name(f".{path.name}.check")  # beside it, so external data resolves
    try:
        onnx.save(proto, str(probe))
        onnx.checker.check_model(str(probe))
    finally:
        probe.unlink(missing_ok=True)


# A graph whose weights pass this many bytes keeps them in PATH.data beside it: protobuf cannot
# serialise a message over 2 GiB (GPT-2 large and up in fp32). TINYT_EXTERNAL_DATA_BYTES lowers
# it (tests force the path on small models; so can a user whose tools want external data).
EXTERNAL_DATA_BYTES = 1_800_000_000
DATA_SUFFIX = ".data"


def external_threshold() -> int:
    value = os.environ.get("TINYT_EXTERNAL_DATA_BYTES")
    if value is None:
        return EXTERNAL_DATA_BYTES
    try:
        return max(0, int(value))
    except ValueError:
        raise GraphError(f"TINYT_EXTERNAL_DATA_BYTES={value!r} is not a number of bytes") \
            from None


def weight_bytes(proto) -> int:
    """Bytes of the graph's initializers held in the message (raw or typed fields)."""
    total = 0
    for t in proto.graph.initializer:
        total += len(t.raw_data) or 4 * (len(t.float_data) + len(t.int32_data)) \
            + 8 * (len(t.int64_data) + len(t.double_data))
    return total


def save_graph(proto, path: str | Path, *, external: bool | None = None) -> list[Path]:
    """Write `proto` to `path`; its weights go to `path`.data when they pass the threshold (or
    external=True). Returns the files written. The proto's tensors point at the data file
    afterwards: reload from `path` to use it again."""
    import onnx

    path = Path(path)
    data = path.with_name(path.name + DATA_SUFFIX)
    data.unlink(missing_ok=True)
    if external is None:
        external = weight_bytes(proto) > external_threshold()
    if not external:
        onnx.save_model(proto, str(path))
        return [path]
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)  # shape constants stay inline
    return [path, data]


def graph_files(path: str | Path) -> list[Path]:
    """The model file and, when it has one, its external-data file."""
    path = Path(path)
    data = path.with_name(path.name + DATA_SUFFIX)
    return [path, data] if data.is_file() else [path]


def copy_graph(path: str | Path, directory: str | Path) -> list[Path]:
    """Copy a model file with its external data into `directory`, names unchanged (the model
    names its data file)."""
    import shutil

    out = []
    for f in graph_files(path):
        shutil.copy(f, Path(directory) / f.name)
        out.append(Path(directory) / f.name)
    return out
