"""`tinyt package` of an encoder-decoder (seq2seq) artifact: its three graphs (fp32, or as the
seq2seq quantize stage wrote them: INT8, INT4, qgemm, static) in ONNX Runtime's format, or as a
web page (export/web/seq2seq_page.py).

    ARTIFACT  encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx (+ config)
      ──format ort──▶ OUT/encoder_model.ort, decoder_model.ort, decoder_with_past_model.ort
                      (each optimized at 'extended', saved in the ORT format),
                      required_operators.config (the three graphs' operators, for a reduced
                      ONNX Runtime build), config.json, generation_config.json,
                      tokenizer.json, manifest.json (a tinyt artifact: rt.load runs it)
      ──format web──▶ export/web/seq2seq_page.py (a Whisper: export/web/speech_page.py)
      ──format transformers-js──▶ export/transformers_js.py (onnx/encoder_model.onnx and
                      Optimum's onnx/decoder_model_merged.onnx, as transformers.js loads them)
      ──format genai (a Whisper)──▶ export/genai_whisper.py (encoder.onnx with the cross
                      caches, decoder.onnx, genai_config.json: ONNX Runtime GenAI's Whisper)
      checked before it is written: each .ort graph against its source graph on the contract's
      random inputs over seq2seq_checks' grid (fp32 rounding in other orders at most), then the
      package, loaded by tinyt.runtime, gives the source's greedy tokens.

Formats onnx and triton, --fixed, and a source that is a package already are refused by name.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tinyt.contract import SEQ2SEQ, SEQ2SEQ_FILES, SEQ2SEQ_ORT_FILES
from tinyt.errors import PackageError
from tinyt.fsutil import atomic_dir
from tinyt.graphio import DATA_SUFFIX
from tinyt.manifest import write_manifest
from tinyt.runtime.session import check_graphs_here, graph_session

from .ort_format import ORT_FILE, to_ort, write_operators
from .seq2seq_checks import beyond_bound, check_cases, check_sizes, compare_graphs, is_speech
from .speech_accuracy import voice
from .stage import Built, built, copy_artifact_files, open_source, source_versions

# What the package's greedy check translates (every tokenizer encodes them)
CHECK_SOURCES = ("The cat sat on the mat.", "def add(a, b):\n    return a + b",
                 "Hello, world!")
CHECK_NEW_TOKENS = 8
# Why a format or an option does not apply to an encoder-decoder (the refusal's reason)
REFUSED = {
    "onnx": "it is an ONNX artifact already, in Optimum's layout: deploy the directory as it "
            "is (tinyt.runtime and Optimum's ORTModelForSeq2SeqLM load it)",
    "triton": "Triton's ONNX Runtime backend serves one graph a model, and an encoder-decoder "
              "generates by running its three graphs in turn (an ensemble or a BLS model "
              "would drive the loop; tinyt does not write one)",
    "fixed": "--fixed pins a decoder's batch / sequence / past axes; an encoder-decoder's "
             "graphs have source and target axes, which tinyt does not pin",
}


def package_seq2seq(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *, format: str,
                    fixed: list[str] | dict[str, int] | None = None) -> Built:
    """An encoder-decoder's ORT-format, web or transformers.js package (module docstring);
    returns out_dir."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    why = REFUSED["fixed"] if fixed else REFUSED.get(format)
    if why:
        raise PackageError(f"{src_dir} is an encoder-decoder (seq2seq) artifact: "
                           f"{'--fixed' if fixed else f'--format {format}'} does not apply, as "
                           f"{why}. It packages as --format ort, web or transformers-js (a "
                           "Whisper also as genai)")
    src = open_source(src_dir, out_dir)
    if format == "genai" and not is_speech(src.config):
        raise PackageError(f"{src_dir} is a text encoder-decoder: --format genai writes ONNX "
                           "Runtime GenAI's Whisper layout, and GenAI 0.18 runs no other "
                           "encoder-decoder type. It packages as --format ort, web or "
                           "transformers-js")
    if src.manifest.stage == "package":
        raise PackageError(f"{src_dir} is already a package; package the artifact it was made "
                           "from")
    external = [f + DATA_SUFFIX for f in SEQ2SEQ_FILES.values()
                if (src_dir / (f + DATA_SUFFIX)).exists()]
    if external:
        holder = {"ort": "ORT format", "web": "page"}.get(format, "merged decoder")
        raise PackageError(f"{src_dir} keeps weights in external data ({', '.join(external)}); "
                           f"the {holder} holds a graph under protobuf's 2 GB only")
    check_graphs_here(src.manifest, list(SEQ2SEQ_FILES.values()), f"the {format} package")
    if format == "web" and is_speech(src.config):
        from .web.speech_page import package_speech_web
        return package_speech_web(src_dir, out_dir, src)
    if format == "web":
        from .web.seq2seq_page import package_seq2seq_web
        return package_seq2seq_web(src_dir, out_dir, src)
    if format == "genai":
        from .genai_whisper import package_genai_whisper
        return package_genai_whisper(src_dir, out_dir, src)
    if format == "transformers-js":
        from .transformers_js import package_transformers_js
        return package_transformers_js(src_dir, out_dir, src)
    return _package_ort(src_dir, out_dir, src)


def _package_ort(src_dir: Path, out_dir: Path, src) -> Built:
    """The three graphs in the ORT format, checked (module docstring)."""
    from tinyt.runtime import load

    manifest, cfg, level = src.manifest, src.config, "extended"
    with tempfile.TemporaryDirectory() as tmp, atomic_dir(out_dir) as out:
        copy_artifact_files(src_dir, out)
        for role, file in SEQ2SEQ_FILES.items():
            work = Path(tmp) / role
            work.mkdir()
            to_ort(src_dir / file, work, level)
            os.replace(work / ORT_FILE, out / SEQ2SEQ_ORT_FILES[role])
        write_operators(out, list(SEQ2SEQ_ORT_FILES.values()))
        try:
            worst = compare_graphs({r: src_dir / f for r, f in SEQ2SEQ_FILES.items()},
                                   {r: out / f for r, f in SEQ2SEQ_ORT_FILES.items()}, cfg,
                                   # both at the package's level: MatMulNBits' int8
                                   # activations (accuracy_level 4) run only where ONNX
                                   # Runtime prepacks it, not at 'disabled'
                                   lambda p: graph_session(p, level=level))
        except ValueError as e:  # an output of another shape
            raise PackageError(f"the ORT-format graphs do not match their sources: {e}") from None
        if bad := beyond_bound(worst):
            raise PackageError("the ORT-format graphs differ from their sources beyond fp32 "
                               "rounding: " + "; ".join(bad))
        # each .ort graph's int8 record under its own name (the runtime checks it by file)
        int8 = {SEQ2SEQ_ORT_FILES[r]: e for r, f in SEQ2SEQ_FILES.items()
                if (e := (manifest.record("int8") or {}).get(f)) is not None}
        extra = {**manifest.records("quantization", "accuracy", "opset"),
                 "graph": SEQ2SEQ, "package_format": "ort", "fixed_shape": None,
                 "int8": int8, "versions": source_versions(src),
                 "ort": {"level": level, "files": dict(SEQ2SEQ_ORT_FILES)},
                 # per "graph output-group", as a single graph's package lists its outputs
                 "equivalence": {"worst": {f"{SEQ2SEQ_ORT_FILES[r]} {group}": w
                                           for r, f in SEQ2SEQ_FILES.items()
                                           for group, w in worst[f].items()},
                                 "sizes": check_sizes(cfg, check_cases(cfg))}}

        def write(greedy: dict | None) -> dict:
            if greedy:
                extra["equivalence"]["greedy"] = greedy
            return write_manifest(out, stage="package", source=src.record(),
                                  options={"format": "ort", "fixed": {}, "level": level},
                                  extra=extra)
        write(None)  # the runtime opens the package by its manifest; rewritten below
        ref, cand = load(src_dir, threads=1, tune=False), load(out, threads=1, tune=False)
        want, got, checked = _greedy(ref, cand, cfg)
        if got != want:
            raise PackageError(f"the ORT-format package's greedy tokens {got} differ from "
                               f"{src_dir}'s {want}")
        written = write({**checked, "max_new_tokens": CHECK_NEW_TOKENS, "equal": True})
    return built(out_dir, written)


def _greedy(ref, cand, cfg) -> tuple[list, list, dict]:
    """The source's and the package's greedy tokens on the check's inputs (CHECK_SOURCES; a
    Whisper: speech_accuracy.voice, transcribed), and what they were."""
    if is_speech(cfg):
        audio = voice()
        want, got = ([list(m.transcribe(audio, max_new_tokens=CHECK_NEW_TOKENS).tokens)]
                     for m in (ref, cand))
        return want, got, {"audio": "synthetic voice (3 s)"}
    rows = [ref.tokenizer.encode_prompt(t) for t in CHECK_SOURCES]
    want, got = ([r.token_ids for r in m.generate_ids(rows, max_new_tokens=CHECK_NEW_TOKENS)]
                 for m in (ref, cand))
    return want, got, {"sources": len(rows)}
