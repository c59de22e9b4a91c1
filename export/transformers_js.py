"""`tinyt package ARTIFACT OUT --format transformers-js`: an encoder-decoder (seq2seq) artifact in
the layout transformers.js loads unchanged, as a local or Hub model
(`AutoModelForSeq2SeqLM.from_pretrained`).

    ARTIFACT (seq2seq: Optimum's three graphs, fp32 or quantized by the seq2seq quantize stage)
      ──▶ OUT/config.json          the source's, `transformers.js_config.dtype` naming the files
          OUT/generation_config.json, tokenizer.json, tokenizer_config.json (the source's, or
                                   one naming the tokenizer's end token)
          OUT/onnx/encoder_model{S}.onnx         the source's encoder
          OUT/onnx/decoder_model_merged{S}.onnx  the two decoder graphs as one (seq2seq_merge),
                                                 each weight once
          a quantized token table's GatherBlockQuantized, which transformers.js' ONNX Runtime
          Web lacks, as standard ops on the same bytes (plain_gather)
          OUT/manifest.json
      {S}: transformers.js' file suffix for the dtype (its utils/dtypes.js): fp32 '', an 8-bit
      artifact q8 '_quantized', a 4-bit one q4 '_q4' (DTYPES)
      checked before it is written: the merged graph against the two decoder graphs under ONNX
      Runtime (seq2seq_merge.check_merged), the encoder against the source's, on seq2seq_checks'
      grid (fp32 rounding in other orders at most, each); then the package's encoder and
      merged decoder, driven as transformers.js drives them (the caches empty on the first
      step, the first step's cross-attention cache kept), give tinyt.runtime's greedy tokens.

Why a format of its own and not a part of `--format web`: transformers.js reads a Hugging Face
model directory (an `onnx/` folder, file names by dtype), where the web page reads its three
graphs flat; the merged decoder in the page's package would hold the decoder's weights twice.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnxruntime as ort

from tinyt.contract import SEQ2SEQ, SEQ2SEQ_FILES, SEQ2SEQ_MERGED_FILE, seq2seq_contract
from tinyt.errors import PackageError
from tinyt.fsutil import atomic_dir
from tinyt.graphio import load_graph, save_graph
from tinyt.manifest import Artifact, write_manifest
from tinyt.runtime.session import graph_session, session_options

from .compare import max_abs, max_abs_diff, reorder_bound
from .plain_gather import OP, plain_gathers
from .seq2seq_checks import check_cases, check_sizes, graph_feeds, is_speech, role_cases
from .seq2seq_merge import check_merged, merge_decoders, merged_feeds
from .stage import Built, built

# transformers.js' dtype by the artifact's weight bits, and its file suffix for that dtype
# (utils/dtypes.js DEFAULT_DTYPE_SUFFIX_MAPPING, the same in @huggingface/transformers 3.x and
# 4.3.2)
DTYPES = {None: ("fp32", ""), 8: ("q8", "_quantized"), 4: ("q4", "_q4")}
CHECK_SOURCES = ("The cat sat on the mat.", "def add(a, b):\n    return a + b",
                 "Hello, world! How are you today?")
CHECK_NEW_TOKENS = 12


def onnx_files(bits: int | None) -> dict[str, str]:
    """The package's graph files by role ('encoder', 'decoder_merged') for weights of `bits`."""
    _, suffix = DTYPES[bits]
    return {"encoder": f"onnx/{SEQ2SEQ_FILES['encoder'].removesuffix('.onnx')}{suffix}.onnx",
            "decoder_merged": f"onnx/{SEQ2SEQ_MERGED_FILE.removesuffix('.onnx')}{suffix}.onnx"}


def package_transformers_js(src_dir: Path, out_dir: Path, src: Artifact) -> Built:
    """Write the transformers.js package (module docstring); returns out_dir. The caller
    (export/seq2seq_package.py) has refused what does not apply."""
    from tinyt.runtime import load

    manifest, cfg = src.manifest, src.config
    recipe = (manifest.record("quantization") or {}).get("recipe") or {}
    bits = recipe.get("bits")
    if bits not in DTYPES:
        raise PackageError(f"{src_dir} holds {bits}-bit weights; transformers.js names files "
                           f"for {', '.join(f'{b}-bit' for b in DTYPES if b)} or fp32 ones")
    dtype, files = DTYPES[bits][0], onnx_files(bits)
    lm = load(src_dir, threads=1, tune=False)
    with atomic_dir(out_dir) as out:
        (out / "onnx").mkdir()
        worst, kept, rewritten = _write_graphs(src_dir, out, files, cfg)
        _write_hf_files(src_dir, out, lm, dtype)
        greedy = check_greedy(out, files, lm)
        notes = [f"{', '.join(kept)} kept as {OP} (a layout plain_gather does not rewrite), "
                 "which transformers.js 4.3.2's ONNX Runtime Web (1.31.0-dev) lacks"] if kept \
            else []
        int8 = manifest.record("int8") or {}
        sizes = {"package": sum((out / f).stat().st_size for f in files.values()),
                 "source": sum((src_dir / f).stat().st_size for f in SEQ2SEQ_FILES.values())}
        written = write_manifest(
            out, stage="package", source=src.record(), options={"format": "transformers-js"},
            extra={"graph": SEQ2SEQ, "package_format": "transformers-js",
                   **manifest.records("quantization", "accuracy", "opset"),
                   "int8": {files[r]: e for r, f in (("encoder", "encoder_model.onnx"),
                                                     ("decoder_merged", "decoder_model.onnx"))
                            if (e := int8.get(f)) is not None},
                   "versions": manifest.versions,
                   "transformers_js": {"dtype": dtype, "files": files, "graph_bytes": sizes,
                                       "plain_gathers": rewritten, "notes": notes},
                   "equivalence": {"worst": worst, "greedy": greedy,
                                   "sizes": check_sizes(cfg, check_cases(cfg))}})
    return built(out_dir, written)


def _write_graphs(src_dir: Path, out: Path, files: dict[str, str], cfg
                  ) -> tuple[dict[str, dict], list[str], int]:
    """The encoder and the merged decoder, quantized gathers made plain, each checked against
    its source graphs: (the worst difference per "file [branch] output", the gathers kept,
    how many were rewritten); PackageError beyond fp32 rounding."""
    graphs = {r: load_graph(src_dir / f) for r, f in SEQ2SEQ_FILES.items()}
    before = sum(n.op_type == OP for p in graphs.values() for n in p.graph.node)
    left = [n for p in graphs.values() for n in plain_gathers(p)]  # rewritten in place
    save_graph(graphs["encoder"], out / files["encoder"], external=False)
    merged = out / files["decoder_merged"]
    save_graph(merge_decoders(graphs["decoder"], graphs["decoder_with_past"], cfg), merged,
               external=False)
    del graphs
    decoders = {r: src_dir / SEQ2SEQ_FILES[r] for r in ("decoder", "decoder_with_past")}
    try:
        branches = check_merged(decoders, merged, cfg, lambda p: graph_session(p, threads=1))
        encoder = check_encoder(src_dir / SEQ2SEQ_FILES["encoder"], out / files["encoder"], cfg)
    except ValueError as e:  # an output of another shape
        raise PackageError(f"the package's graphs do not match their sources: {e}") from None
    worst = {**{f"{files['encoder']} {g}": w for g, w in encoder.items()},
             **{f"{files['decoder_merged']} {b} {g}": w
                for b, groups in branches.items() for g, w in groups.items()}}
    bad = [f"{k}: max abs diff {w['max_abs']:.3g} > {w['bound']:.3g} at {w['case']}"
           for k, w in worst.items() if not w["max_abs"] <= w["bound"]]
    if bad:
        raise PackageError("the package's graphs differ from their sources beyond fp32 "
                           "rounding: " + "; ".join(bad))
    return worst, sorted(set(left)), before - len(left)


def _write_hf_files(src_dir: Path, out: Path, lm, dtype: str) -> None:
    """config.json (the dtype named), generation_config.json, the tokenizer's files (and a
    Whisper's preprocessor_config.json: speech_files)."""
    config = json.loads((src_dir / "config.json").read_text(encoding="utf-8"))
    config["transformers.js_config"] = {**config.get("transformers.js_config", {}),
                                        "dtype": dtype}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (src_dir / f).is_file():
            shutil.copy2(src_dir / f, out / f)
    if is_speech(lm.config):
        return speech_files(out, lm)
    if not (out / "tokenizer_config.json").is_file():  # tinyt's own tokenizer: its end token
        tok = lm.tokenizer
        settings = {"tokenizer_class": "PreTrainedTokenizerFast",
                    "model_max_length": lm.config.block_size}
        if tok.eos_id is not None:
            settings["eos_token"] = tok.eos_token
        (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n",
                                                   encoding="utf-8")


def speech_files(out: Path, sm) -> None:
    """What transformers.js' speech pipeline reads besides a Whisper's config.json and
    generation_config.json: preprocessor_config.json (WhisperFeatureExtractor's settings, as
    runtime/audio.py computes: its filters made from feature_size) and a tokenizer_config.json
    that names WhisperTokenizer (whose _decode_asr the pipeline calls)."""
    from tinyt.runtime.audio import CHUNK_SECONDS, HOP, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE

    features = {"chunk_length": CHUNK_SECONDS, "feature_extractor_type": "WhisperFeatureExtractor",
                "feature_size": sm.n_mels, "hop_length": HOP, "n_fft": N_FFT,
                "n_samples": N_SAMPLES, "nb_max_frames": N_FRAMES, "padding_side": "right",
                "padding_value": 0.0, "processor_class": "WhisperProcessor",
                "return_attention_mask": False, "sampling_rate": SAMPLE_RATE}
    end = sm.tokenizer.hf.id_to_token(sm.eos)
    tokenizer = {"tokenizer_class": "WhisperTokenizer", "model_max_length": sm.config.block_size,
                 "bos_token": end, "eos_token": end, "unk_token": end, "pad_token": end,
                 "processor_class": "WhisperProcessor"}
    for name, data in (("preprocessor_config.json", features),
                       ("tokenizer_config.json", tokenizer)):
        (out / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def check_encoder(source: Path, candidate: Path, cfg) -> dict[str, dict]:
    """{output: worst max-abs difference, the source's largest |value|, its bound, the case}
    of the package's encoder against the source's on seq2seq_checks' grid (graphs as written)."""
    import numpy as np

    rng = np.random.default_rng(0)
    runs = [(c, graph_feeds(cfg, "encoder", c, rng))
            for c in role_cases("encoder", check_cases(cfg), cfg)]
    ref = graph_session(source, threads=1)
    want = [ref.run(None, f) for _, f in runs]
    del ref
    sess, worst = graph_session(candidate, threads=1), {}
    for (case, f), xs in zip(runs, want):
        for o, x, y in zip(sess.get_outputs(), xs, sess.run(None, f)):
            if x.shape != y.shape:
                raise ValueError(f"{candidate.name} {o.name}: shape {y.shape} where the "
                                 f"source's is {x.shape}")
            w = worst.setdefault(o.name, {"max_abs": 0.0, "magnitude": 0.0, "case": None})
            d = max_abs_diff(x, y)
            if not d <= w["max_abs"]:
                w.update(max_abs=d, case=dict(zip(("batch", "source"), case[:2])))
            w["magnitude"] = max(w["magnitude"], max_abs(x))
    for w in worst.values():
        w["bound"] = reorder_bound(cfg, w["magnitude"], cfg.n_layer)
    return worst


class _Branch:
    """One branch of the merged decoder in place of the session of the graph it was made from
    (runtime/encoder_decoder.DecoderSteps runs it): run() adds what the merged graph reads
    besides, as transformers.js feeds it (seq2seq_merge.merged_feeds)."""

    def __init__(self, session: ort.InferenceSession, cfg, role: str):
        self.session, self.cfg, self.role = session, cfg, role
        # each with a .name, as a session's
        self.inputs, self.outputs = seq2seq_contract(cfg)[role]

    def get_inputs(self):
        return self.inputs

    def get_outputs(self):
        return self.outputs

    def get_modelmeta(self):  # the merged graph's (whether it takes cross caches grouped)
        return self.session.get_modelmeta()

    def run(self, names, feeds):
        return self.session.run(names, merged_feeds(self.cfg, self.role, feeds))


def check_greedy(out: Path, files: dict[str, str], lm) -> dict:
    """The package's encoder and merged decoder through the runtime's own loop, sessions as the
    runtime opens its own (`lm`: the source, as rt.load opens it): greedy tokens of
    CHECK_SOURCES (a Whisper: speech_accuracy.voice transcribed, English forced and detected)
    equal to lm's, or PackageError. Returns the record."""
    from tinyt.runtime.encoder_decoder import Seq2SeqModel
    from tinyt.runtime.transcribe import SpeechModel

    from .speech_accuracy import voice

    src, cfg = lm.artifact, lm.config

    def session(f: str) -> ort.InferenceSession:
        opts = session_options(src, threads=1, spinning=False, level=None)
        return ort.InferenceSession(str(out / f), opts, providers=["CPUExecutionProvider"])
    merged = session(files["decoder_merged"])
    sessions = {"encoder": session(files["encoder"]),
                "decoder": _Branch(merged, cfg, "decoder"),
                "decoder_with_past": _Branch(merged, cfg, "decoder_with_past")}
    if is_speech(cfg):
        cand = SpeechModel(src, sessions, lm.tokenizer)
        audio, languages = voice(), ["en", None] if lm.multilingual else ["en"]
        want, got = ([list(m.transcribe(audio, language=lang, max_new_tokens=CHECK_NEW_TOKENS)
                           .tokens) for lang in languages] for m in (lm, cand))
        checked = {"audio": "synthetic voice (3 s)",
                   "languages": [x or "detected" for x in languages]}
    else:
        cand = Seq2SeqModel(src, sessions, lm.tokenizer)
        rows = [lm.tokenizer.encode_prompt(t) for t in CHECK_SOURCES]
        want = [r.token_ids for r in lm.generate_ids(rows, max_new_tokens=CHECK_NEW_TOKENS)]
        got = [r.token_ids for r in cand.generate_ids(rows, max_new_tokens=CHECK_NEW_TOKENS)]
        checked = {"sources": len(rows)}
    if got != want:
        raise PackageError(f"the transformers.js package's greedy tokens {got} (its encoder and "
                           f"merged decoder) differ from {src.path}'s {want}")
    return {**checked, "max_new_tokens": CHECK_NEW_TOKENS, "equal": True}
