"""A Triton Inference Server model repository for an artifact (onnxruntime backend).

    OUT/<name>/config.pbtxt      inputs / outputs / dims from the graph, batching, instances
    OUT/<name>/1/model.onnx      the artifact's graph (plus its config.json, tokenizer.json)

Batching: the classifier and the no-cache decoder take requests of any batch, so Triton's
dynamic batcher may merge them (max_batch_size > 0, dims without the batch axis; requests merge
when their sequence lengths match). The KV-cache decoder is one step of a conversation whose
cache the client holds: each request carries its own past of its own length, which a batcher
cannot stack, so it gets max_batch_size 0 and the full dims. A graph with pinned shapes gets
its pinned dims and no batching.

config.pbtxt is checked before it is written: parsed with Triton's own schema (tritonclient's
model_config_pb2 through google.protobuf.text_format) and its tensors compared with the graph's.
"""
from __future__ import annotations

import onnx

from tinyt.contract import CLASSIFIER, DECODER
from tinyt.errors import TritonError

DTYPES = {onnx.TensorProto.INT64: "TYPE_INT64", onnx.TensorProto.INT32: "TYPE_INT32",
          onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16"}
KINDS = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}


def _dims(value_info: onnx.ValueInfoProto) -> list[int]:
    """The tensor's dims, -1 for every symbolic one."""
    return [d.dim_value if d.HasField("dim_value") else -1
            for d in value_info.type.tensor_type.shape.dim]


def _tensor(vi: onnx.ValueInfoProto, batched: bool) -> tuple[str, str, list[int]]:
    elem = vi.type.tensor_type.elem_type
    if elem not in DTYPES:
        raise TritonError(f"tensor {vi.name!r} has ONNX type {elem}, which tinyt does not map to "
                          f"a Triton type (known: {sorted(DTYPES.values())})")
    dims = _dims(vi)
    return vi.name, DTYPES[elem], dims[1:] if batched else dims


def config_pbtxt(graph: onnx.GraphProto, *, name: str, kind: str, pinned: bool, device: str,
                 instances: int, max_batch_size: int, queue_delay_us: int = 1000) -> str:
    """The text of config.pbtxt for this graph."""
    if device not in KINDS:
        raise TritonError(f"device={device!r} is not one of {', '.join(KINDS)}")
    if instances < 1:
        raise TritonError(f"instances={instances} must be at least 1")
    batched = kind in (CLASSIFIER, DECODER) and not pinned
    if batched and max_batch_size < 1:
        raise TritonError(f"max_batch_size={max_batch_size} must be at least 1 for a "
                          f"{kind} graph, whose requests Triton batches")
    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', 'backend: "onnxruntime"',
             f"max_batch_size: {max_batch_size if batched else 0}"]
    for side, tensors in (("input", graph.input), ("output", graph.output)):
        entries = []
        for vi in tensors:
            tname, dtype, dims = _tensor(vi, batched)
            entries.append(f'  {{ name: "{tname}" data_type: {dtype} '
                           f'dims: [ {", ".join(map(str, dims))} ] }}')
        lines.append(f"{side} [\n" + ",\n".join(entries) + "\n]")
    if batched:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}")
    lines.append(f"instance_group [ {{ count: {instances} kind: {KINDS[device]} }} ]")
    return "\n".join(lines) + "\n"


def check_config(text: str, graph: onnx.GraphProto):
    """Parse `text` with Triton's schema and compare its tensors with the graph's; returns the
    parsed ModelConfig. Needs tritonclient (extra 'triton')."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError as e:
        raise TritonError(f"checking config.pbtxt needs Triton's schema from tritonclient ({e}); "
                          "install the 'triton' extra: pip install 'tinyt[triton]'") from None
    try:
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as e:
        raise TritonError(f"config.pbtxt does not parse with Triton's schema: {e}") from None
    batched = config.max_batch_size > 0
    for side, declared, tensors in (("input", config.input, graph.input),
                                    ("output", config.output, graph.output)):
        want = [_tensor(vi, batched) for vi in tensors]
        got = [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims))
               for t in declared]
        if got != want:
            raise TritonError(f"config.pbtxt {side}s {got} do not match the graph's {want}")
    return config
