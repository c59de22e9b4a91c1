"""`tinyt package ARTIFACT OUT --format web` for an encoder-decoder (seq2seq): the page
translates (or summarises) in the browser on ONNX Runtime Web's WebAssembly backend.

    ARTIFACT (seq2seq: Optimum's three graphs, fp32 or quantized by the seq2seq quantize stage)
      ──▶ OUT/index.html, tinyt.mjs, tokenizers.min.mjs, ort files   as for a language model
          OUT/seq2seq.mjs     the encoder-decoder's loop (encoder once, then the decoder with
                              its caches), imported by tinyt.mjs for this package only
          OUT/encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx,
          tokenizer.json, config.json, generation_config.json, web.json, manifest.json
      checked before it is written, under Node on the package's own files: each check text's
      ids (with and without the tokenizer's special tokens) equal tinyt's, and the greedy
      tokens of each source equal tinyt.runtime's (rt.load(ARTIFACT).generate_ids), but where a
      row first differs at a tie of the runtime's own logits (seq2seq_ties).

web.json carries what the module needs of generation_config.json (decoder start, end tokens,
the rules) as the runtime reads it (runtime/encoder_decoder.GenerationConfig).
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from tinyt.contract import SEQ2SEQ, SEQ2SEQ_FILES
from tinyt.errors import WebPackageError
from tinyt.fsutil import atomic_dir
from tinyt.manifest import Artifact, write_manifest

from ..stage import Built, built, copy_artifact_files
from .tools import (
    ASSETS,
    CHECK_TEXTS,
    ORT_WEB_VERSION,
    TOKENIZERS_JS_VERSION,
    copy_runtime,
    node,
    node_version,
    ort_web_dist,
    run_module,
    tokenizers_js_dist,
)

MODULE = "seq2seq.mjs"
CHECK_SOURCES = ("The cat sat on the mat.", "def add(a, b):\n    return a + b",
                 "Hello, world! How are you today?", "héllo wörld — 你好")
CHECK_NEW_TOKENS = 12


def package_seq2seq_web(src_dir: Path, out_dir: Path, src: Artifact) -> Built:
    """Write the encoder-decoder's web package (module docstring); returns out_dir. The caller
    (export/seq2seq_package.py) has refused what does not apply."""
    from tinyt.runtime import load

    web_tools(src_dir)
    lm = load(src_dir, threads=1, tune=False)

    def check(out: Path) -> dict:
        rows = [lm.tokenizer.encode_prompt(t) for t in CHECK_SOURCES]
        ties = check_page(out, lm, rows, CHECK_NEW_TOKENS)
        return {"sources": len(rows), "greedy_tokens": CHECK_NEW_TOKENS, "greedy_equal": True,
                "greedy_ties": ties, "tokenizer_texts": len(CHECK_TEXTS)}
    return write_web_package(src_dir, out_dir, src, web_json(src_dir.name, lm), (MODULE,),
                             lambda out: [], check)


def web_tools(src_dir: Path) -> None:
    """What a page of three graphs needs here: onnxruntime-web, tokenizers.js and Node, and a
    tokenizer.json the JS library runs as the Rust one."""
    from . import check_tokenizer

    ort_web_dist()
    tokenizers_js_dist()
    node()
    check_tokenizer(src_dir / "tokenizer.json")


def write_web_package(src_dir: Path, out_dir: Path, src: Artifact, web: dict,
                      modules: tuple[str, ...], write_more: Callable[[Path], list[str]],
                      check: Callable[[Path], dict]) -> Built:
    """The package of an encoder-decoder's three graphs (an encoder-decoder's page or a
    Whisper's): the graphs, the artifact's files, the runtime, `modules`, what write_more
    writes (the files it names), web.json; then check(out) before the manifest, which records
    what it returns."""
    graphs = list(SEQ2SEQ_FILES.values())
    manifest = src.manifest
    with atomic_dir(out_dir) as out:
        for f in graphs:
            shutil.copy2(src_dir / f, out / f)
        copy_artifact_files(src_dir, out)
        runtime = [*copy_runtime(out), *modules]
        for f in modules:
            shutil.copy2(ASSETS / f, out / f)
        runtime += write_more(out)
        (out / "web.json").write_text(json.dumps(web, indent=1) + "\n")
        checked = check(out)
        written = write_manifest(
            out, stage="package", source=src.record(), options={"format": "web"}, extra={
                "graph": SEQ2SEQ, "package_format": "web", "web": {
                    **web, "files": [*graphs, *runtime], "notes": [],
                    "checked": {"runtime": f"node {node_version()}",
                                "onnxruntime_web": ORT_WEB_VERSION,
                                "tokenizers_js": TOKENIZERS_JS_VERSION, **checked}},
                **manifest.records("quantization", "accuracy", "int8"),
                "versions": manifest.versions})
    return built(out_dir, written)


def web_json(name: str, lm) -> dict:
    """What seq2seq.mjs reads of the model (`lm`: the source as tinyt.runtime loads it)."""
    cfg, g = lm.config, lm.generation
    return {"name": name, "graph": SEQ2SEQ, "graphs": list(SEQ2SEQ_FILES.values()),
            "tokenizer": "tokenizer.json", "vocab_size": cfg.vocab_size,
            "choosable": min(lm.tokenizer.vocab_size, cfg.vocab_size),
            "n_layer": cfg.decoder_layers, "source_context": cfg.block_size,
            "context": lm.context, "max_new_tokens": lm._max_new_tokens(None),
            "decoder_start_token_id": g.decoder_start, "eos_token_ids": list(g.eos),
            "pad_token_id": g.pad, "forced_bos_token_id": g.forced_bos,
            "forced_eos_token_ids": list(g.forced_eos),
            "bad_words_ids": [list(w) for w in g.bad_words],
            "onnxruntime_web": ORT_WEB_VERSION, "tokenizers_js": TOKENIZERS_JS_VERSION}


def check_page(out: Path, lm, rows: list[list[int]], new_tokens: int) -> int:
    """The module under Node on the files just written to `out`: its ids of CHECK_TEXTS (with
    and without special tokens) and greedy tokens of `rows` against tinyt's. Returns how many
    rows ended at a tie; raises WebPackageError for a difference."""
    got = run_module(out, {"encode": CHECK_TEXTS, "encode_prompt": CHECK_TEXTS, "generate": [
        {"prompt_ids": r, "max_new_tokens": new_tokens} for r in rows]})
    if "error" in got:
        raise WebPackageError(f"the packaged graphs do not run on onnxruntime-web "
                              f"{ORT_WEB_VERSION}: {got['error']}")
    for key, encode in (("encode", lm.tokenizer.encode), ("encode_prompt",
                                                          lm.tokenizer.encode_prompt)):
        bad = [t for t, ids in zip(CHECK_TEXTS, got[key]) if ids != encode(t)]
        if bad:
            raise WebPackageError(f"the web tokenizer's ids ({key}) differ from tinyt's on {bad}")
    # each row alone, as the page runs it (a padded batch sums in other orders)
    want = [lm.generate_ids([r], max_new_tokens=new_tokens)[0].token_ids for r in rows]
    return seq2seq_ties(lm, rows, [g["token_ids"] for g in got["generate"]], want)


def seq2seq_ties(lm, rows: list, got: list[list[int]], want: list[list[int]], *,
                 logits_after=None) -> int:
    """Greedy tokens of the page (got) against tinyt.runtime's (want), per source row: equal,
    but where a row first differs the runtime's own logits there must make the two tokens a
    tie at the graphs' precision (as greedy_ties for a decoder: WebAssembly sums in other
    orders; an int8 graph now and then rounds an activation to the neighbouring step). Returns
    how many rows ended at such a tie; raises WebPackageError for a real difference.
    logits_after(model, row, prefix): the next-token logits [vocab] of `model` (lm, or lm with
    fp32 activations) for a row after the target `prefix` (default: a source's token ids;
    a Whisper's: speech_page.py's, its features and prompt, Whisper's rules applied; or a
    pair (those logits, [(margin, the logits had a rule decided the other way)]): Whisper's
    forced timestamp, decided by the sign of a margin of the logits)."""
    import numpy as np

    from ..compare import MAGNITUDE_FLOOR, first_difference
    from ..seq2seq_checks import graph_bound as reorder_bound  # widened for speech
    from ..shared_cache_checks import QUANT_LEVEL

    quantized, cfg, ties = bool(lm.artifact.manifest.quantization), lm.config, 0
    logits_after = logits_after or _logits_after
    eos = lm.generation.eos[0] if lm.generation.eos else None
    for row, g, w in zip(rows, got, want):
        first = first_difference(g, w)
        if first is None and len(g) == len(w):
            continue
        first = min(len(g), len(w)) if first is None else first
        page, ours = (g[first] if first < len(g) else eos), (w[first] if first < len(w) else eos)
        if page is None or ours is None:
            raise WebPackageError(f"greedy tokens under onnxruntime-web {g} differ in length "
                                  f"from tinyt.runtime's {w}")
        z, flips = _readings(logits_after(lm, row, w[:first]))
        free = _unforced(z, flips)  # the magnitude the graphs round at, not a forced few's
        size = float(np.abs(free[np.isfinite(free)]).max())  # (the rules' -inf left out)
        # the logits pass through both stacks: each block (and the head) may flip one int8
        # rounding of its activations (shared_cache_checks.quant_floor, at this depth)
        depth = cfg.n_layer + cfg.decoder_layers
        atol = (depth + 1) * QUANT_LEVEL * max(size, MAGNITUDE_FLOOR) if quantized else \
            2 * reorder_bound(cfg, size, depth)
        if quantized:
            # MatMulNBits' int8 activations (accuracy_level 4) run only where ONNX Runtime
            # prepacks the weights for this CPU; WebAssembly may keep them fp32, as tinyt's own
            # graphs at level 'disabled' do. If the page's logits are those (z_alt), it chose
            # `page` where z_alt[page] >= z_alt[ours], so z[ours] - z[page] <= 2 max|z - z_alt|.
            z_alt = _unforced(*_readings(logits_after(_activations_fp32(lm), row, w[:first])))
            with np.errstate(invalid="ignore"):  # nan where both are a rule's -inf
                moved = np.abs(free - z_alt)
            atol = max(atol, 2 * float(moved[np.isfinite(moved)].max())
                       + 2 * reorder_bound(cfg, size, depth))
        # a rule decided at a tie of its own (margin within atol: a difference of two
        # 1-Lipschitz functions of the logits moves no more than a difference of two logits)
        # may go the other way on the page: its token may be the best of that reading
        gaps = [z[ours] - z[page]] + [float(np.max(z_flip) - z_flip[page])
                                      for margin, z_flip in flips if abs(margin) <= atol]
        if not min(gaps) <= atol:
            raise WebPackageError(
                f"greedy tokens under onnxruntime-web differ from tinyt.runtime's: {g} vs {w} "
                f"(at token {first} the runtime prefers its own by {z[ours] - z[page]:.3g}, "
                f"more than a tie at the graphs' precision, {atol:.3g})")
        ties += 1
    return ties


def _readings(after) -> tuple:
    """logits_after's answer as (the rules' logits, [(margin, logits the other way)]): an
    array alone has no rule decided at a margin."""
    return (after, []) if not isinstance(after, tuple) else after


def _unforced(z, flips: list):
    """Of the readings of the rules (z and the flips' logits), the one that forces least (the
    most finite logits)."""
    import numpy as np

    return max([z, *(f for _, f in flips)], key=lambda a: int(np.isfinite(a).sum()))


def _logits_after(lm, row: list[int], prefix: list[int]):
    """The runtime's next-token logits [vocab] for source `row` after the target `prefix`."""
    import numpy as np

    from tinyt.runtime.encoder_decoder import DecoderSteps

    steps = DecoderSteps(lm, *lm.encode([row]))
    z = steps.first(lm.generation.decoder_start)
    for tok in prefix:
        z = steps(np.zeros(1, np.int64), np.array([tok], np.int64))
    return z[0]


def _activations_fp32(lm):
    """The same model with its MatMulNBits at accuracy_level 0 (fp32 activations), the
    arithmetic of a build without the int8-activation kernels, as WebAssembly's may be."""
    import onnx
    import onnxruntime as ort

    from tinyt.contract import SEQ2SEQ_FILES
    from tinyt.runtime.encoder_decoder import Seq2SeqModel

    sessions = {}
    for role, file in SEQ2SEQ_FILES.items():
        proto = onnx.load(str(lm.artifact.path / file))
        for n in proto.graph.node:
            for a in n.attribute:
                if n.op_type == "MatMulNBits" and a.name == "accuracy_level":
                    a.i = 0
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        sessions[role] = ort.InferenceSession(proto.SerializeToString(), options,
                                              providers=["CPUExecutionProvider"])
    return Seq2SeqModel(lm.artifact, sessions, lm.tokenizer)
