"""`tinyt package ARTIFACT OUT --format web`: a static folder any file server can host, that
generates in the browser on ONNX Runtime Web's WebAssembly backend (an encoder or a classifier
embeds, classifies or tags instead: export/web/text.py).

    ARTIFACT (a causal LM: contract graph, or a shared-cache graph / pair)
      ──▶ OUT/index.html        the page: prompt, generate, tokens streaming in, tokens/s;
                                URL parameters prompt, max_new_tokens, temperature, top_k,
                                top_p, seed, stop, threads start a generation on load, whose
                                result lands as JSON in <pre id="result">
          OUT/tinyt.mjs         the ES module (tokenizer, load, generate, cancel)
          OUT/tokenizers.min.mjs  @huggingface/tokenizers, the exact version in
                                TOKENIZERS_JS_VERSION: runs tokenizer.json as the Rust library does
          OUT/model.onnx [prefill.onnx], tokenizer.json, config.json, web.json (what the
                                module reads), manifest.json (a tinyt manifest)
          OUT/ort.wasm.min.mjs, ort-wasm-simd-threaded.{mjs,wasm}: onnxruntime-web, the exact
                                version in ORT_WEB_VERSION (web/package.json pins it)
      checked before it is written: the package's own module runs under Node on the same
      WebAssembly files, and its token ids (on hostile text too) and greedy tokens must equal
      tinyt's.

ONNX Runtime Web 1.30's GroupQueryAttention predates the `query_seqlens` input (per-row query
lengths, which the runtime's batched prompts use); one page generates one row, where every
row's query length is the step's, so the packaged shared-cache graphs drop that input, and
the manifest says so. A graph whose operators ONNX Runtime Web cannot load is refused, naming
the error.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import onnx

from tinyt.config import ModelConfig
from tinyt.contract import DECODER_WITH_PAST, ONNX_FILE, SHARED_CACHE_KIND, kv_axes
from tinyt.errors import WebPackageError
from tinyt.fsutil import atomic_dir
from tinyt.graphio import save_graph
from tinyt.int8 import records
from tinyt.manifest import write_manifest
from tinyt.runtime.session import check_graphs_here

from ..stage import Built, built, copy_artifact_files, open_source
from .tools import (  # the tools the decoder and the text packages share
    CHECK_TEXTS,
    GQA_WEB_INPUTS,
    ORT_WEB_VERSION,
    TOKENIZER_MODELS,
    TOKENIZERS_JS_VERSION,
    copy_runtime,
    node,
    node_version,
    ort_web_dist,
    run_module,
    tokenizers_js_dist,
)


def _for_web(proto: onnx.ModelProto) -> bool:
    """Drop GroupQueryAttention's query_seqlens (see the module docstring), in place, and
    compute the graph's other uses of it from input_ids' shape (every row's query length is
    the step's); whether the graph changed."""
    from onnx import TensorProto, helper

    graph = proto.graph
    changed = False
    for op in graph.node:
        if op.op_type == "GroupQueryAttention" and len(op.input) > GQA_WEB_INPUTS:
            extra = [i for i in op.input[GQA_WEB_INPUTS:] if i]
            if extra and extra != ["query_seqlens"]:
                raise WebPackageError(f"{op.name}: GroupQueryAttention inputs beyond what "
                                      f"onnxruntime-web {ORT_WEB_VERSION} reads: {extra}")
            del op.input[GQA_WEB_INPUTS:]
            changed = True
    if any(i.name == "query_seqlens" for i in graph.input):
        keep = [i for i in graph.input if i.name != "query_seqlens"]
        del graph.input[:]
        graph.input.extend(keep)
        if any("query_seqlens" in n.input for n in graph.node):
            made = [helper.make_node("Shape", ["input_ids"], ["web/seq"], start=1, end=2),
                    helper.make_node("Shape", ["input_ids"], ["web/batch"], start=0, end=1),
                    helper.make_node("Expand", ["web/seq", "web/batch"], ["web/seq_rows"]),
                    helper.make_node("Cast", ["web/seq_rows"], ["query_seqlens"],
                                     to=TensorProto.INT32)]
            nodes = made + list(graph.node)
            del graph.node[:]
            graph.node.extend(nodes)
        changed = True
    return changed


def greedy_ties(lm, prompts: list[list[int]], got: list[list[int]],
                want: list[list[int]]) -> int:
    """Greedy tokens of the page (got) against tinyt.runtime's (want), one list per prompt:
    the same, but where a row first differs the runtime's own logits there must make the two
    tokens a tie at the graph's precision — ONNX Runtime Web's WebAssembly kernels and the
    native ones sum in other orders (and, for an int8 graph, now and then round an activation
    to the neighbouring int8 step: an int8 level of the largest logit, as for the shared-cache
    conversion). Returns
    how many rows ended at such a tie; raises WebPackageError for a real difference."""
    import numpy as np

    from tinyt.runtime.feeds import prefill_feeds

    from ..compare import first_difference, reorder_bound
    from ..shared_cache_checks import quant_floor

    quantized = bool(lm.artifact.manifest.quantization)
    ties = 0
    for prompt, g, w in zip(prompts, got, want):
        first = first_difference(g, w)
        if first is None and len(g) == len(w):
            continue
        first = min(len(g), len(w)) if first is None else first
        eos = lm.tokenizer.eos_id  # a row that ended there chose end-of-text
        page, ours = (g[first] if first < len(g) else eos), (w[first] if first < len(w) else eos)
        if page is None or ours is None:
            raise WebPackageError(f"greedy tokens under onnxruntime-web {g} differ in length "
                                  f"from tinyt.runtime's {w}")
        row = [*prompt, *w[:first]]
        feeds = prefill_feeds(lm.config, DECODER_WITH_PAST, np.array([row], dtype=np.int64),
                              np.ones((1, len(row)), np.int64))
        z = next(lm.steps(feeds))[0, -1]
        size = float(np.abs(z).max())
        atol = quant_floor(lm.config, size) if quantized else 2 * reorder_bound(lm.config, size)
        if not z[ours] - z[page] <= atol:
            raise WebPackageError(
                f"greedy tokens under onnxruntime-web differ from tinyt.runtime's: {g} vs {w} "
                f"(at token {first} the runtime prefers its own by {z[ours] - z[page]:.3g}, "
                f"more than a tie at this graph's precision, {atol:.3g})")
        ties += 1
    return ties


def check_tokenizer(path: Path) -> None:
    """Refuse, by name, a tokenizer.json whose model the page's library does not run (it would
    read one as another, e.g. WordLevel as its Legacy model). The rest of the file is judged by
    the ids the packaged module gives (package_web's check)."""
    model = (json.loads(path.read_text()).get("model") or {}).get("type")
    if model not in TOKENIZER_MODELS:
        raise WebPackageError(f"{path}: the page's tokenizer (@huggingface/tokenizers "
                              f"{TOKENIZERS_JS_VERSION}) runs the models "
                              f"{', '.join(TOKENIZER_MODELS)}; this one has model {model}")


def package_web(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                check_prompts: list[list[int]] | None = None, check_tokens: int = 8) -> Built:
    """Write the web package (module docstring); returns out_dir."""
    from tinyt.runtime import load

    from .text import TEXT_KINDS, package_text

    src_dir, out_dir = Path(src_dir), Path(out_dir)
    src = open_source(src_dir, out_dir)
    manifest, cfg, kind = src.manifest, src.config, src.kind
    files = [ONNX_FILE] + ([manifest.prefill_model_file] if manifest.prefill_model_file else [])
    check_graphs_here(manifest, files, "the web package")
    ort_web_dist()
    tokenizers_js_dist()
    node()
    check_tokenizer(src_dir / "tokenizer.json")
    if kind in TEXT_KINDS:
        return package_text(src_dir, out_dir, src)
    if kind not in (DECODER_WITH_PAST, SHARED_CACHE_KIND):
        raise WebPackageError(f"{src_dir} is a {kind} graph; the web package takes a causal LM "
                              "with a KV cache (decoder_with_past, or a shared-cache "
                              f"decoder_gqa), or one of {', '.join(TEXT_KINDS)}")
    lm = load(src_dir, threads=1, tune=False)
    web = _web_json(src_dir, kind, files, cfg, lm)
    with tempfile.TemporaryDirectory() as tmp, atomic_dir(out_dir) as out:
        dropped, ops = [], set()
        for f in files:
            proto = onnx.load(str(src_dir / f))
            ops |= {n.op_type for n in proto.graph.node}
            if _for_web(proto):
                dropped.append(f)
            save_graph(proto, Path(tmp) / f)
            shutil.copy2(Path(tmp) / f, out / f)
        copy_artifact_files(src_dir, out)
        runtime = copy_runtime(out)
        (out / "web.json").write_text(json.dumps(web, indent=1) + "\n")
        prompts = check_prompts or [lm.tokenizer.encode(t) for t in ("def ", "import os\n")]
        ties = _check_page(out, lm, prompts, check_tokens)
        notes = _notes(ops, kind)
        written = write_manifest(
            out, stage="package", source=src.record(),
            options={"format": "web"}, extra={
            "graph": kind, "package_format": "web", "web": {
                **web, "files": [*files, *runtime],
                "gqa_query_seqlens_dropped": dropped, "notes": notes,
                "checked": {"runtime": f"node {node_version()}",
                            "onnxruntime_web": ORT_WEB_VERSION,
                            "tokenizers_js": TOKENIZERS_JS_VERSION, "prompts": len(prompts),
                            "greedy_tokens": check_tokens, "greedy_equal": True,
                            "greedy_ties": ties,
                            "tokenizer_texts": len(CHECK_TEXTS)}},
            **manifest.records("quantization", "accuracy"),
            "int8": records(manifest.data),  # the same files, beside the page
            "versions": manifest.versions})
    return built(out_dir, written)


def _web_json(src_dir: Path, kind: str, files: list[str], cfg: ModelConfig, lm) -> dict:
    """web.json: what the page's module (tinyt.mjs) reads of the model (`cfg`, the source's
    config) and its graphs."""
    # A LongRoPE model's page stops at its original context: past it every token turns at the
    # long frequencies, the cache made again, which the page's loop does not do
    context = lm.context if lm.longrope_original is None else \
        min(lm.context, lm.longrope_original)
    return {"name": src_dir.name, "graph": kind, "graphs": files, "tokenizer": "tokenizer.json",
            "context": context, "vocab_size": cfg.vocab_size, "n_layer": cfg.n_layer,
            "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
            "kv_axes": list(kv_axes(cfg, "length")),  # the contract's order, read by tinyt.mjs
            "eos_token_id": lm.tokenizer.eos_id,
            "onnxruntime_web": ORT_WEB_VERSION, "tokenizers_js": TOKENIZERS_JS_VERSION}


def _check_page(out: Path, lm, prompts: list[list[int]], check_tokens: int) -> int:
    """The check: the module, under Node, on the WebAssembly files just copied to `out`; its
    token ids of CHECK_TEXTS and greedy tokens of `prompts` against tinyt's. Returns how many
    rows ended at a tie (greedy_ties); raises WebPackageError for a difference."""
    texts = CHECK_TEXTS
    got = run_module(out, {"encode": texts, "generate": [
        {"prompt_ids": p, "max_new_tokens": check_tokens} for p in prompts]})
    if "error" in got:
        raise WebPackageError(f"the packaged graph does not run on onnxruntime-web "
                              f"{ORT_WEB_VERSION}: {got['error']}")
    want_ids = [lm.tokenizer.encode(t) for t in texts]
    if got["encode"] != want_ids:
        bad = [t for t, a, b in zip(texts, got["encode"], want_ids) if a != b]
        raise WebPackageError(f"the web tokenizer's ids differ from tinyt's on {bad}")
    want = [r.token_ids for r in lm.generate_ids(prompts, max_new_tokens=check_tokens)]
    return greedy_ties(lm, prompts, [g["token_ids"] for g in got["generate"]], want)


def _notes(ops: set[str], kind: str) -> list[str]:
    """What the manifest tells of the page's speed, from the graphs' operators and kind."""
    notes = []
    if "MatMulNBits" in ops:
        notes.append("MatMulNBits: ONNX Runtime Web's WebAssembly runs it ~4x slower than "
                     "fp32 MatMul at GPT-2 width (docs/web.md); in a page the static or "
                     "qgemm INT8 graphs decode fastest")
    if kind == SHARED_CACHE_KIND:
        notes.append("shared cache: the page copies the whole cache into and out of "
                     "WebAssembly memory every step; contract graphs decode faster in a page "
                     "at GPT-2 width (docs/web.md)")
    return notes
