"""lab/profile_encoder.py on two small graphs: every op type of each is reported in its
column, the feeds follow each graph's own inputs, and a bad request is refused by name."""
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from lab import profile_encoder


def _graph(path, ops: list[str], int32: bool = False) -> str:
    """ids -> table rows -> ops (each on the last output) -> hidden; mask, and token types
    where the graph takes them, only read by a ReduceSum."""
    ids = TensorProto.INT32 if int32 else TensorProto.INT64
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["h0"]),
             helper.make_node("ReduceSum", ["attention_mask"], ["n"], keepdims=0)]
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, [f"h{i}"], [f"h{i + 1}"]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, ids, ["B", "S"])
                     for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info(f"h{len(ops)}", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("n", ids, None)],
        [numpy_helper.from_array(np.ones((50, 8), np.float32), "table")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_each_graph_has_its_column(tmp_path, monkeypatch, capsys):
    a = _graph(tmp_path / "a.onnx", ["Relu", "Sigmoid"])
    b = _graph(tmp_path / "b.onnx", ["Tanh"], int32=True)  # int32 ids fed as int32
    monkeypatch.setattr(sys, "argv", ["profile_encoder", f"first={a}", f"second={b}",
                                      "--batch", "2", "--tokens", "4", "--vocab", "50",
                                      "--rounds", "2", "--runs", "2", "--pad", "1"])
    profile_encoder.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("batch 2 x 4 tokens (padding 1 in every other row), 1 thread")
    assert lines[1] == "| op type | first | second |"
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[3:]}
    for op, first, second in (("Relu", True, False), ("Tanh", False, True),
                              ("Gather", True, True)):
        cells = rows[op].strip("| ").split(" | ")[1:]
        assert [c != "—" for c in cells] == [first, second], rows[op]
        assert all(float(c) >= 0 for c in cells if c != "—")
    assert "**thread CPU, median**" in rows


@pytest.mark.parametrize("argv, said", [
    (["x.onnx"], "is not NAME=PATH of a model.onnx"),
    (["a=missing.onnx"], "is not NAME=PATH of a model.onnx"),
    (["--pad", "4", "a={a}"], "--pad 4 must be at least 0 and below --tokens"),
])
def test_bad_requests_are_named(tmp_path, monkeypatch, argv, said):
    a = _graph(tmp_path / "a.onnx", ["Relu"])
    monkeypatch.setattr(sys, "argv", ["profile_encoder", "--tokens", "4",
                                      *[x.format(a=a) for x in argv]])
    with pytest.raises(SystemExit, match=said):
        profile_encoder.main()
