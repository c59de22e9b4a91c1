"""Packaging: an artifact directory in, a deployable one out.

    DIR ──(--fixed AXIS=N ...: pin contract axes, check vs DIR on the pinned shape)──┐
                                                                                     ▼
        format onnx   ─▶ OUT/model.onnx + config/tokenizer + manifest (a tinyt artifact)
        format ort    ─▶ OUT/model.ort (ONNX Runtime's mobile format) + required_operators.config
                         for a reduced ONNX Runtime build; checked vs model.onnx; a tinyt artifact
        format triton ─▶ OUT/<name>/config.pbtxt + OUT/<name>/1/model.onnx (Triton repository)
        format web    ─▶ a static page + ES module on ONNX Runtime Web (export/web/)
    an encoder-decoder (seq2seq) artifact: its three graphs as ort or web, or as transformers.js
    loads an encoder-decoder, --format transformers-js (seq2seq_package.py), or a Whisper as
    ONNX Runtime GenAI loads it, --format genai (genai_whisper.py)

Pinned shapes (`fixed`) are for accelerators that cannot take dynamic shapes: batch_size,
sequence_length and past_sequence_length become numbers in the graph; the runtime and
`tinyt verify` then run it through a window of fixed size (runtime/fixed.py).
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import onnx

from tinyt.contract import DECODER_WITH_PAST, ONNX_FILE, SEQ2SEQ, SHARED_CACHE_KIND
from tinyt.errors import PackageError
from tinyt.export.genai_config import write_genai_config
from tinyt.fsutil import atomic_dir
from tinyt.graphio import copy_graph, save_graph
from tinyt.manifest import manifest_of, write_manifest
from tinyt.runtime.feeds import check_tokens
from tinyt.runtime.fixed import AXES, capacity
from tinyt.runtime.session import check_graphs_here, graph_session

from .compare import compare_graphs, grid_sizes, reorder_bound, within_bound
from .ort_format import ORT_FILE, to_ort, write_operators
from .stage import Built, built, copy_artifact_files, open_source, source_graph, source_versions
from .triton import check_config, config_pbtxt

FORMATS = ("onnx", "ort", "triton", "web", "transformers-js", "genai")
# packaged vs source graph on the same inputs, every output: the same graph, perhaps optimized
# at another level, so fp32 rounding in other orders at most (compare.reorder_bound)


def parse_fixed(items: list[str] | dict[str, int] | None) -> dict[str, int]:
    """'batch_size=1' items (or a dict) -> {axis: size}, checked against the contract's axes."""
    if not items:
        return {}
    pairs = items.items() if isinstance(items, dict) else []
    if not isinstance(items, dict):
        for item in items:
            m = re.fullmatch(r"\s*(\w+)\s*=\s*(-?\d+)\s*", item)
            if not m:
                raise PackageError(f"--fixed {item!r} is not AXIS=N (axes: {', '.join(AXES)})")
            pairs.append((m.group(1), int(m.group(2))))
    fixed = {}
    for axis, n in pairs:
        if axis not in AXES:
            raise PackageError(f"--fixed axis {axis!r} is not one of {', '.join(AXES)}")
        if n < (0 if axis == "past_sequence_length" else 1):
            raise PackageError(f"--fixed {axis}={n} is too small (batch and sequence ≥ 1, "
                               "past ≥ 0)")
        fixed[axis] = n
    return fixed


def _pin(proto: onnx.ModelProto, fixed: dict[str, int], kind: str, block: int) -> None:
    """Replace the contract's symbolic axes by `fixed` everywhere in the graph, in place."""
    needed = ["batch_size", "sequence_length"] + (
        ["past_sequence_length"] if kind == DECODER_WITH_PAST else [])
    if set(fixed) != set(needed):
        raise PackageError(f"a {kind} graph pins exactly {', '.join(needed)}; got "
                           f"{', '.join(sorted(fixed)) or 'none'}")
    total = fixed["sequence_length"] + fixed.get("past_sequence_length", 0)
    if total > block:
        raise PackageError(f"sequence_length + past_sequence_length = {total} exceeds the "
                           f"model's block_size {block}")
    sizes = {**fixed, "past_sequence_length + sequence_length": total}
    graph = proto.graph
    for vi in [*graph.input, *graph.output]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                if dim.dim_param not in sizes:
                    raise PackageError(f"{vi.name} has axis {dim.dim_param!r}, which is not "
                                       "in the contract")
                dim.dim_value = sizes[dim.dim_param]
    del graph.value_info[:]  # intermediate shapes: ONNX Runtime infers them from the inputs


def check_cases(cfg, kind: str, fixed: dict[str, int]) -> list[tuple[int, ...]]:
    """The pinned shape (row 0 left-padded when there are two rows or more), or a small grid:
    sequences of at most check_tokens(cfg) tokens, and a step at the context's end."""
    if fixed:
        B, S, P = fixed["batch_size"], fixed["sequence_length"], fixed.get(
            "past_sequence_length", 0)
        return [(B, S, P, 0), (B, S, P, (S + P) // 2 if B > 1 else 0)]
    T = check_tokens(cfg)
    cases: list[tuple[int, ...]] = [(1, 1, 0, 0), (2, min(7, T), 0, 3 if T > 7 else 0)]
    if kind == DECODER_WITH_PAST:
        cases.append((2, 1, T - 1, 0))
        if cfg.block_size > T:
            cases.append((2, 1, 9, 0, cfg.block_size - 10))
    return cases


def _check_same(src: Path, dst: Path, cfg, kind: str, fixed: dict[str, int]) -> dict:
    """Worst max-abs difference per output (with its bound and the source's largest |value|),
    src vs dst, on check_cases, random ids."""
    cases = check_cases(cfg, kind, fixed)
    try:
        found = compare_graphs(lambda: graph_session(src), lambda: graph_session(dst), cfg, kind,
                               cases=cases)
    except ValueError as e:  # an output of another shape
        raise PackageError(f"the packaged graph does not match its source: {e}") from None
    if bad := within_bound(cfg, found):
        raise PackageError("the packaged graph differs from its source beyond fp32 rounding "
                           "(compare.reorder_bound): " + "; ".join(
                               f"{n} {w['max_abs']:.3g} > {w['bound']:.3g}"
                               for n, w in bad.items()))
    return {name: {k: w[k] for k in ("max_abs", "bound", "magnitude")}
            for name, w in found.items()}


def package(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *, format: str = "ort",
            fixed: list[str] | dict[str, int] | None = None, name: str | None = None,
            device: str = "cpu", instances: int = 1, max_batch_size: int = 8) -> Built:
    """Package an artifact for deployment (see the module docstring); returns out_dir."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if format not in FORMATS:
        raise PackageError(f"format={format!r} is not one of {', '.join(FORMATS)}")
    routed = _elsewhere(src_dir, out_dir, format, fixed)
    if routed is not None:
        return routed
    src = open_source(src_dir, out_dir)
    manifest = src.manifest
    if manifest.graph == SHARED_CACHE_KIND:
        if format == "ort" and not fixed:
            return _package_shared_cache_ort(src_dir, out_dir, src)
        why = {"triton": "Triton's ONNX Runtime backend copies every input and output, so it "
                         "cannot run a graph whose past and present are one buffer",
               "onnx": "it is an ONNX artifact already: deploy the directory as it is"}.get(
            format, "--fixed pins the contract's batch / sequence / past axes; a shared-cache "
                    "graph has no past axis (its cache is a fixed capacity already) and its "
                    "prompt graph takes the prompt's length")
        raise PackageError(f"{src_dir} is a shared-cache graph (decoder_gqa): {why}. It "
                           "packages as --format ort (no --fixed) or --format web; package the "
                           f"artifact it was made from "
                           f"({manifest.source.get('path', 'its source')}) for the "
                           "others")
    if manifest.stage == "package":
        raise PackageError(f"{src_dir} is already a package; package the artifact it was made "
                           "from")
    cfg, kind = src.config, src.kind
    pins = parse_fixed(fixed)
    proto = source_graph(src)
    if pins:
        _pin(proto, pins, kind, cfg.block_size)
    name = name or f"tinyt-{kind.replace('_', '-')}"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise PackageError(f"name={name!r}: use letters, digits, '_', '.', '-' (it is a "
                           "directory and Triton's model name)")
    # The ORT format keeps the graph's optimization level; a portable graph must not gain
    # contrib ops on the way.
    level = "basic" if manifest.options.get("target") == "portable" else "extended"
    with tempfile.TemporaryDirectory() as tmp:
        graph_path = Path(tmp) / ONNX_FILE
        external = len(save_graph(proto, graph_path)) > 1
        if external and format == "ort":
            raise PackageError(f"{src_dir} keeps its weights in external data (a graph over "
                               "protobuf's 2 GB); the ORT format cannot hold them: package it "
                               "with --format onnx or --format triton")
        try:
            graph_session(graph_path)
        except Exception as e:  # e.g. a pinned size the graph's ops cannot take
            raise PackageError(f"ONNX Runtime cannot load the packaged graph: {e}") from None
        worst = _check_same(src_dir / ONNX_FILE, graph_path, cfg, kind, pins)
        extra = {"graph": kind, "package_format": format, "fixed_shape": pins or None,
                 "opset": manifest.record("opset"), "io": manifest.record("io"),
                 "equivalence": {"worst": worst,
                                 "sizes": grid_sizes(cfg, check_cases(cfg, kind, pins))},
                 "versions": source_versions(src)}
        if pins:
            extra["capacity_tokens"] = capacity(kind, pins)
        with atomic_dir(out_dir) as out:
            writer = {"triton": _write_triton, "ort": _write_ort, "onnx": _write_onnx}[format]
            wrote = writer(out, graph_path, proto, src_dir, cfg, kind, pins, name=name,
                           device=device, instances=instances, max_batch_size=max_batch_size,
                           level=level)
            if "ort_vs_onnx" in wrote:  # the .ort file against the graph it came from
                extra["equivalence"]["ort_vs_onnx"] = wrote.pop("ort_vs_onnx")
            extra |= wrote
            options = {"format": format, "fixed": pins, "name": name, "device": device,
                       "instances": instances, "max_batch_size": max_batch_size,
                       "level": manifest.options.get("level")}
            written = write_manifest(out, stage="package", source=src.record(),
                                     options=options, extra=extra)
    return built(out_dir, written)


def _elsewhere(src_dir: Path, out_dir: Path, format: str, fixed) -> Built | None:
    """The packages other modules make (an encoder-decoder's in any format, the web page's),
    or None for this module's; the transformers.js layout refused for a single graph."""
    if (manifest_of(src_dir) or {}).get("graph") == SEQ2SEQ:  # a missing one: refused below
        from .seq2seq_package import package_seq2seq
        return package_seq2seq(src_dir, out_dir, format=format, fixed=fixed)
    if format == "transformers-js":
        raise PackageError(
            f"{src_dir} is not an encoder-decoder (seq2seq) artifact: --format transformers-js "
            "writes the encoder and merged decoder transformers.js runs for one. A decoder, "
            "classifier or encoder graph uses Optimum's input and output names already: "
            "transformers.js loads its model.onnx as onnx/model.onnx beside config.json and "
            "the tokenizer's files")
    if format == "genai":
        raise PackageError(
            f"{src_dir} is not a Whisper artifact: --format genai writes ONNX Runtime GenAI's "
            "Whisper layout. A KV-cache decoder's --format onnx and ort packages carry "
            "genai_config.json already (GenAI loads them as they are)")
    if format == "web":
        if fixed:
            raise PackageError("--fixed pins shapes for accelerators; the web package runs "
                               "dynamic shapes on WebAssembly: drop --fixed")
        from .web import package_web
        return package_web(src_dir, out_dir)
    return None


def _package_shared_cache_ort(src_dir: Path, out_dir: Path, src) -> Built:
    """A shared-cache graph (or the pair's two) in the ORT format, with the operator list for
    a reduced build; checked by running the package through tinyt.runtime against the source:
    last-token logits of a prompt and of decode steps, and greedy tokens."""
    import numpy as np

    from tinyt.runtime import load

    manifest = src.manifest
    graphs = [ONNX_FILE] + ([manifest.prefill_model_file] if manifest.prefill_model_file else [])
    check_graphs_here(manifest, graphs, "the ORT-format package")
    ort_names = {g: g.removesuffix(".onnx") + ".ort" for g in graphs}
    level = "extended"
    with tempfile.TemporaryDirectory() as tmp, atomic_dir(out_dir) as out:
        copy_artifact_files(src_dir, out)
        for g in graphs:
            work = Path(tmp) / g.removesuffix(".onnx")
            work.mkdir()
            to_ort(src_dir / g, work, level)
            os.replace(work / ORT_FILE, out / ort_names[g])
        write_operators(out, list(ort_names.values()))
        extra = manifest.records("quantization", "accuracy", "source_accuracy",
                                 "prefill_quantization", "prefill_accuracy",
                                 "prefill_equivalence", "pair", "layers")
        extra.update(graph=SHARED_CACHE_KIND, package_format="ort", fixed_shape=None,
                     opset=manifest.record("opset"), model_file=ort_names[ONNX_FILE],
                     ort={"level": level, "model_file": ort_names[ONNX_FILE]},
                     versions=source_versions(src))
        if len(graphs) > 1:
            extra["prefill_model_file"] = ort_names[graphs[1]]
        def write(equivalence: dict | None) -> dict:
            return write_manifest(out, stage="package", source=src.record(),
                                  options={"format": "ort", "fixed": {}, "level": level},
                extra={**extra, **({"equivalence": equivalence} if equivalence else {})})
        write(None)  # the runtime opens the package by its manifest; rewritten below
        # the check: the package as the runtime loads it, against its source
        ref, cand = load(src_dir, threads=1, tune=False), load(out, threads=1, tune=False)
        ids = [ref.tokenizer.encode(t) for t in ("def main(", "import os\nclass ")]
        pairs = [(a, b) for row in ids
                 for a, b in zip(_step_logits(ref, row, 4), _step_logits(cand, row, 4))]
        worst = max(float(np.abs(a - b).max()) for a, b in pairs)
        size = max(float(np.abs(a).max()) for a, _ in pairs)
        tolerance = reorder_bound(ref.config, size)
        want = [r.token_ids for r in ref.generate_ids(ids, max_new_tokens=8)]
        got = [r.token_ids for r in cand.generate_ids(ids, max_new_tokens=8)]
        if not worst <= tolerance or got != want:
            raise PackageError(f"the ORT-format package differs from {src_dir}: logits max abs "
                               f"{worst:.2e} (fp32 rounding: {tolerance:.2e}), greedy tokens "
                               f"{'equal' if got == want else f'{got} vs {want}'}")
        written = write({"tolerance": tolerance, "worst": {"logits": {
                             "max_abs": worst, "bound": tolerance, "magnitude": size}},
                         "greedy_equal": True})
    return built(out_dir, written)


def _step_logits(lm, ids: list[int], steps: int) -> list:
    """Last-token logits of a prompt, then of `steps` greedy decode steps, through the
    runtime's step API (for a shared-cache graph: its bound cache, as generate runs it)."""
    import numpy as np

    from tinyt.runtime.feeds import prefill_feeds

    run = lm.steps(prefill_feeds(lm.config, DECODER_WITH_PAST, np.array([ids], np.int64),
                                 np.ones((1, len(ids)), np.int64)))
    out = [next(run)[0, -1].copy()]
    for _ in range(steps):
        out.append(run.send((np.array([out[-1].argmax()]), np.ones(1, bool)))[0, -1].copy())
    run.close()
    return out


# The format writers: each fills the directory being written from the checked graph and
# returns what the manifest says of it.
def _write_triton(out: Path, graph_path: Path, proto, src_dir: Path, cfg, kind: str,
                  pins: dict, *, name: str, device: str, instances: int, max_batch_size: int,
                  level: str) -> dict:
    """Triton's repository layout: NAME/config.pbtxt (checked by Triton's own schema) and
    NAME/1/ with the graph and the artifact's files."""
    text = config_pbtxt(proto.graph, name=name, kind=kind, pinned=bool(pins), device=device,
                        instances=instances, max_batch_size=max_batch_size)
    parsed = check_config(text, proto.graph)
    version = out / name / "1"
    version.mkdir(parents=True)
    (out / name / "config.pbtxt").write_text(text)
    copy_graph(graph_path, version)
    copy_artifact_files(src_dir, version)
    return {"triton": {"model": name, "max_batch_size": parsed.max_batch_size, "device": device,
                       "instances": instances},
            "model_file": f"{name}/1/{ONNX_FILE}"}


def _write_ort(out: Path, graph_path: Path, proto, src_dir: Path, cfg, kind: str, pins: dict,
               *, level: str, **_) -> dict:
    """The ORT format (model.ort), checked against the ONNX graph it came from."""
    copy_artifact_files(src_dir, out)
    to_ort(graph_path, out, level)
    worst_ort = _check_same(graph_path, out / ORT_FILE, cfg, kind, pins)
    write_genai_config(out, cfg, kind=kind, fixed=pins, model_file=ORT_FILE)
    return {"ort": {"level": level, "model_file": ORT_FILE}, "model_file": ORT_FILE,
            "ort_vs_onnx": worst_ort}


def _write_onnx(out: Path, graph_path: Path, proto, src_dir: Path, cfg, kind: str, pins: dict,
                **_) -> dict:
    """The ONNX graph (pinned, if asked) with the artifact's files."""
    copy_artifact_files(src_dir, out)
    copy_graph(graph_path, out)
    write_genai_config(out, cfg, kind=kind, fixed=pins, model_file=ONNX_FILE)
    return {}
