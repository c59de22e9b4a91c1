"""Where each graph of an artifact is exact: the manifest's `int8` record (torch-free).

A graph whose weight matmuls run as u8 x s8 int8 GEMMs (quantize --kernel qgemm / qgemm-rows,
--mode static: DynamicQuantizeMatMul, MatMulInteger, QLinearMatMul) computes exact integer
products only where the CPU adds them in 32 bits, unless its weights keep to 7 bits:

    weights   x86 AVX2 only (pairs summed in 16 bits)    VNNI / AMX / ARM dot product
    8-bit     saturates: wrong outputs, no error         exact
    7-bit     exact (255 x 63 x 2 = 32130 < 32767)       exact
    fp32 / MatMulNBits (s8 blocks) / weight-only          exact on every CPU

Every stage's manifest records, per graph file, which line its graph is on:

    "int8": {"model.onnx": {"u8s8_gemm": true, "weight_bits": 8, "exact_on": EXACT_32BIT}}

The quantize stage states it; every later stage (the shared-cache pair, packages) carries its
source's record to the file it made from it, so an artifact built on one CPU kind says the
same thing on another, and every loader checks it against the CPU it runs on
(tinyt.runtime.session.int8_refusal). A manifest written before this record existed is read
through its lineage the same way.
"""
from __future__ import annotations

from typing import Any

from tinyt.recipe import QuantRecipe

EXACT_EVERYWHERE = "every CPU"
EXACT_32BIT = ("CPUs that add u8 x s8 products in 32 bits: x86 with AVX-512 VNNI, AVX-VNNI or "
               "AMX, ARM with dot product; not x86 with AVX2 only, which adds pairs of products "
               "in 16 bits and saturates")


def _entry(u8s8: bool, bits: int | None = None) -> dict[str, Any]:
    if not u8s8:
        return {"u8s8_gemm": False, "exact_on": EXACT_EVERYWHERE}
    return {"u8s8_gemm": True, "weight_bits": bits,
            "exact_on": EXACT_EVERYWHERE if bits == 7 else EXACT_32BIT}


def fp32_entry() -> dict[str, Any]:
    """The record of a graph without int8 GEMMs (an export's): exact on every CPU."""
    return _entry(False)


def recipe_entry(recipe: QuantRecipe) -> dict[str, Any]:
    """The record of a graph the quantize stage made with this recipe."""
    return _entry(recipe.u8s8_products, recipe.u8s8_weight_bits)


def quantized_entry(options: dict[str, Any]) -> dict[str, Any]:
    """The record of a graph the quantize stage made with these manifest options (any form
    written so far: QuantRecipe.from_manifest)."""
    return recipe_entry(QuantRecipe.from_manifest(options))


def _file(manifest: dict[str, Any], role: str) -> str | None:
    """The artifact's model graph file (role 'model') or its pair's prompt graph ('prefill')."""
    if role == "model":
        return manifest.get("model_file", "model.onnx")
    return manifest.get("prefill_model_file")


def _graph_entry(manifest: dict[str, Any], role: str) -> dict[str, Any] | None:
    """The record of the artifact's graph of `role`, read from the manifest or through its
    lineage; None where nothing says."""
    name = _file(manifest, role)
    if name is None:
        return None
    recorded = (manifest.get("int8") or {}).get(name)
    if recorded is not None:
        return recorded
    stage = manifest.get("stage")
    if stage == "export":
        return _entry(False)
    if stage == "quantize" and role == "model":
        return quantized_entry(manifest.get("options") or {})
    if role == "prefill" and isinstance(manifest.get("prefill_source"), dict):
        return _graph_entry(manifest["prefill_source"].get("manifest") or {}, "model")
    source = (manifest.get("source") or {}).get("manifest")
    return _graph_entry(source, role) if isinstance(source, dict) else None


def records(manifest: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """{graph file: its record or None (unknown)} for the artifact's model and prompt graph."""
    names = {role: _file(manifest, role) for role in ("model", "prefill")}
    return {name: _graph_entry(manifest, role) for role, name in names.items() if name}


def entry_for(manifest: dict[str, Any], graph: str) -> dict[str, Any] | None:
    """The record of one graph file of the artifact (None: the manifest does not say): its
    own where the manifest lists it (an encoder-decoder's three graphs), else the model's or
    the prompt graph's, read through the lineage."""
    recorded = (manifest.get("int8") or {}).get(graph)
    return recorded if recorded is not None else records(manifest).get(graph)


def exact_everywhere(entry: dict[str, Any] | None) -> bool:
    return entry is not None and entry.get("exact_on") == EXACT_EVERYWHERE
