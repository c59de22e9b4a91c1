"""Reading an artifact's ONNX graph for a stage that derives another from it (torch-free):
a file that is not ONNX, or whose weights are not finite, is refused by name before any work."""
from __future__ import annotations

from pathlib import Path

from tinyt.errors import TinytError
from tinyt.finite import check_onnx_weights


class GraphError(TinytError, ValueError):
    """A model file is not a readable ONNX model."""


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
