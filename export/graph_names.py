"""What the exporters do to a graph torch traced (every export: the single graph's, an
encoder-decoder's three): its symbolic axes named after the contract, each node named after
the PyTorch module it came from, the exporter's per-node metadata dropped."""
from __future__ import annotations

import ast

import onnx

from tinyt.errors import ExportError


def name_axes(proto: onnx.ModelProto, inputs, outputs) -> None:
    """Give the graph's symbolic I/O axes the contract's names (torch writes s0, s1, ...)."""
    rename: dict[str, str] = {}
    values = {v.name: v for v in [*proto.graph.input, *proto.graph.output]}
    for spec in [*inputs, *outputs]:
        dims = values[spec.name].type.tensor_type.shape.dim
        if len(dims) != len(spec.shape):
            raise ExportError(f"exported {spec.name} has rank {len(dims)}, the contract says "
                              f"{len(spec.shape)}")
        for dim, want in zip(dims, spec.shape):
            if isinstance(want, str):
                if not dim.dim_param:
                    raise ExportError(f"axis {want!r} of {spec.name} was specialised to "
                                      f"{dim.dim_value} during export; it must stay symbolic")
                rename.setdefault(dim.dim_param, want)
                dim.dim_param = want
            elif dim.dim_value != want:
                raise ExportError(f"{spec.name} has size {dim.dim_value or dim.dim_param} where "
                                  f"the contract fixes {want}")
    for v in proto.graph.value_info:  # keep intermediate shapes consistent with the I/O names
        for dim in v.type.tensor_type.shape.dim:
            if dim.dim_param in rename:
                dim.dim_param = rename[dim.dim_param]


def module_path(names: list[str]) -> str:
    """['transformer', 'h', '0', 'attn'] -> 'transformer/h.0/attn' (indices join their list)."""
    parts: list[str] = []
    for s in filter(None, names):
        if s.isdigit() and parts:
            parts[-1] += f".{s}"
        else:
            parts.append(s)
    return "/".join(parts)


def tidy_nodes(proto: onnx.ModelProto, wrapped: bool) -> None:
    """Name each node after the PyTorch module it came from, `/transformer/h.0/attn/c_attn/
    MatMul`, and drop the exporter's per-node metadata (stack traces with local paths, FX
    dumps): it is most of a small model's graph bytes and says nothing a deployment needs."""
    seen: dict[str, int] = {}
    for node in proto.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        try:
            scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "[]"))
        except (ValueError, SyntaxError):
            scopes = []
        # scopes: ['', 'model.transformer', 'model.transformer.h.0', ..., aten op]; the one
        # before the op is the innermost module's qualified name.
        module = scopes[-2] if len(scopes) >= 2 and "hook" not in scopes[-2] else ""
        if wrapped:
            module = module.removeprefix("model").removeprefix(".")
        base = "/" + "/".join(filter(None, [module_path(module.split(".")), node.op_type]))
        seen[base] = seen.get(base, -1) + 1
        node.name = base if seen[base] == 0 else f"{base}_{seen[base]}"
        del node.metadata_props[:]
