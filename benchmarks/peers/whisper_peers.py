"""tinyt's Whisper artifacts against the engines a user would transcribe with instead, on the same
weights and the same log-mel features (issue 52, the peers): the encoder-decoder peer benchmark
(seq2seq_peers.py: its workers, check, timing and report) with windows of speech for sources.

    ARTIFACTS/hf (a WhisperForConditionalGeneration: yours, or --make tiny|base: random weights
    at the real model's shape, whisper_shape.peer_whisper)
      ├─tinyt import-hf─▶ checkpoint ──tinyt export─▶ onnx (──optimize─▶ onnx-opt ──quantize─▶
      │                                                      onnx-int8, where they are made)
      ├─CTranslate2's TransformersConverter─▶ peers/ct2-int8, peers/ct2-float32 (the models
      │   faster-whisper runs: ctranslate2.models.Whisper, called with faster-whisper's arguments)
      ├─Optimum's ORTModelForSpeechSeq2Seq(export=True)─▶ peers/optimum-fp32
      ├─GenAI's model builder (-p fp32|int8|int4, its own venv)─▶ peers/genai-builder-{fp32,
      │   int8,int4} (opt-in: scripts/setup-genai-builder.sh), run by onnxruntime_genai
      ├─whisper.cpp's converter (and quantizer)─▶ peers/whisper.cpp-f16, peers/whisper.cpp-q8_0
      │   (opt-in: scripts/setup-whisper-cpp.sh; whisper_cpp.py, run through pywhispercpp)
      └─transformers' PyTorch model loads ARTIFACTS/hf itself
    features: espeak-ng speaking sentences of tinyt's retrieval set, runtime/audio.log_mel, one
    30-s window each (padded with silence) ──▶ OUT/features.npy, read by every worker
    the clip: espeak-ng speaking the first of them said within 5 s, resampled to 16 kHz,
    padded with silence to 5 s ──▶ OUT/clip.npy (samples), taken by each engine's own front
    end (whisper_adapters.py: what each does, and pads to 30 s)
    one worker process per (engine, threads), each loading once (whisper_adapters.py):
      1. same output first, at the first thread count: every engine's greedy tokens on each
         check window, one at a time, against tinyt fp32's; an fp32 engine must give them
         exactly, but for a tie at fp32 precision where they first part (seq2seq_check.py: tinyt
         fp32's logits there prefer its token by at most TIE_FACTOR x reorder_bound over both
         stacks), or it is refused, never timed; INT8 reports its agreement; beams told
      2. then time, rounds interleaved (seq2seq_peers.py's): one window greedy (encoder and
         decode), one window with beams, a batch of windows greedy (windows per second), and
         the clip's latency: its audio to its transcript, greedy (front end, encoder, the
         tokens of its sentence, their text), and its front end alone (--measure: some)
    ──▶ OUT/results.json (the CPU, the load average before and after, every raw time),
        OUT/results.md; tinyt's best time over CTranslate2 int8's (faster-whisper's default
        compute type on a CPU) per measure and thread count

    python -m tinyt.benchmarks.peers.whisper_peers ARTIFACTS --make tiny --out OUT

The prompt is <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|> for every engine;
each applies Whisper's suppress_tokens and begin_suppress_tokens its own way, and none stops
early: peer_whisper's head has zero rows for the end and every special token no prompt reads,
so each call makes exactly the tokens asked (each call's count is recorded, "made").
faster-whisper itself is not run: its transcribe adds its own feature extraction (and PyAV, an
FFmpeg binding, to its install) around the same ctranslate2.models.Whisper.generate call.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from tinyt.errors import BenchError

from . import formats, whisper_cpp
from .engines import PeerEngine
from .seq2seq_check import REFERENCE
from .seq2seq_peers import FP32, TINYT_ROWS, _bytes, makes, measure, prepare
from .seq2seq_report import markdown, rows, targets
from .whisper_adapters import CLIP, FEATURES, LOADERS

CHECK_WINDOWS = 8  # the check's windows: each a different sentence
UNIT = "window"
CLIP_SECONDS = 5  # the latency's clip (issue 52: "latency of a 5-second clip")
MEASURES = ("greedy", "beam", "batch", "clip")  # clip: its transcript and its front end


def _ours(name: str) -> PeerEngine:
    artifact = TINYT_ROWS[name]
    return PeerEngine(name, f"tinyt.runtime SpeechModel.decode_features on ARTIFACTS/{artifact}"
                      f" (`{makes(artifact)}`)", "onnxruntime", "bash scripts/setup.sh",
                      "whisper-tinyt", artifact, ours=True, exact=artifact in FP32,
                      modules=("tinyt.runtime",))


def _ct2(option: str) -> PeerEngine:
    return PeerEngine(f"ct2-{option}", f"CTranslate2's Whisper (faster-whisper's engine), "
                      f"{option}: its TransformersConverter on ARTIFACTS/hf", "ctranslate2",
                      "extra peers", "whisper-ctranslate2", f"peers/ct2-{option}",
                      formats.ctranslate2, option, exact=option == "float32",
                      modules=("ctranslate2",))


def _genai_builder(option: str) -> PeerEngine:
    return PeerEngine(f"genai-builder-{option}",
                      f"ONNX Runtime GenAI's Whisper on its model builder's {option} build of "
                      "ARTIFACTS/hf (-p " + option + " -e cpu; encoder.onnx with the cross "
                      "caches, decoder.onnx)", "onnxruntime-genai", "extra peers",
                      "whisper-genai", f"peers/genai-builder-{option}", formats.genai_builder,
                      option, exact=option == "fp32", modules=("onnxruntime_genai",),
                      missing=lambda _: formats.builder_missing(True))


def _whisper_cpp(option: str, flash: bool = False) -> PeerEngine:
    how = "flash attention (its default)" if flash else "flash attention off"
    return PeerEngine(f"whisper.cpp-{option}" + "-fa" * flash,
                      f"whisper.cpp {option}, {how}: whisper_full through pywhispercpp on its "
                      "own converter's file of ARTIFACTS/hf (features set by whisper_set_mel)",
                      "pywhispercpp", f"opt-in: {whisper_cpp.SETUP}", "whisper-cpp",
                      f"peers/whisper.cpp-{option}", whisper_cpp.convert, option,
                      modules=("_pywhispercpp",), options={"flash_attn": flash})


# tinyt's rows: the encoder-decoder catalogue's (seq2seq_peers.TINYT_ROWS: a form is a row
# there); one not made (optimize / quantize of speech graphs, where absent) is skipped, saying
# which command makes it
WHISPER_ENGINES: dict[str, PeerEngine] = {e.name: e for e in (
    *(_ours(name) for name in TINYT_ROWS),
    _ct2("int8"),
    _ct2("float32"),
    PeerEngine("optimum-fp32", "Optimum's ORTModelForSpeechSeq2Seq.generate on its own export "
               "(from_pretrained(ARTIFACTS/hf, export=True), saved once)", "optimum-onnx",
               "extra optimum", "whisper-optimum", "peers/optimum-fp32",
               formats.optimum_speech, exact=True,
               modules=("optimum.onnxruntime", "transformers")),
    PeerEngine("transformers", "transformers' PyTorch WhisperForConditionalGeneration (eager "
               "attention) generate on ARTIFACTS/hf", "torch", "extra torch",
               "whisper-transformers", "hf", exact=True, modules=("torch", "transformers")),
    # the builder in its own venv (scripts/setup-genai-builder.sh); GenAI in the peers extra
    _genai_builder("fp32"), _genai_builder("int8"), _genai_builder("int4"),
    # opt-in (scripts/setup-whisper-cpp.sh); none fp32 (whisper_cpp.py says why)
    _whisper_cpp("f16"), _whisper_cpp("f16", flash=True), _whisper_cpp("q8_0"),
)}


def make(name: str, artifacts: Path, log=print, rows: tuple[str, ...] | None = None) -> None:
    """ARTIFACTS/hf (whisper_shape.peer_whisper `name`), its checkpoint and the rows of
    `tinyt pipeline --skip-train ARTIFACTS/hf --out ARTIFACTS --no-bench` (onnx, onnx-opt,
    onnx-int8, onnx-int4; or those of `rows`, each after the rows it is made from), each
    where absent."""
    from tinyt.benchmarks.whisper_shape import WHISPER, peer_whisper

    if name not in WHISPER:
        raise BenchError(f"--make {name!r}: one of {', '.join(WHISPER)}")
    if not (artifacts / "hf" / "config.json").is_file():
        log(f"making {artifacts / 'hf'}: Whisper {name}'s shape, random weights")
        peer_whisper(name, artifacts / "hf")
    from tinyt.artifacts import SEQ2SEQ_VARIANTS, arguments
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize
    from tinyt.hf import import_hf

    ckpt = artifacts / "checkpoint"
    if not (ckpt / "config.json").is_file():
        log(f"making {ckpt}")
        import_hf(artifacts / "hf", ckpt)
    stages = {"export": export_onnx, "optimize": optimize, "quantize": quantize}
    for v in SEQ2SEQ_VARIANTS:  # the pipeline's rows, each where absent
        if v.made_by == "pipeline" and (rows is None or v.dir in rows) and \
                not (artifacts / v.dir / "manifest.json").is_file():
            log(f"making {artifacts / v.dir}")
            source, out, options = arguments(v, artifacts, checkpoint=ckpt)
            stages[v.stage](source, out, **options)


def _sentences() -> list[str]:
    """The sentences of tinyt's retrieval set that espeak-ng says (five words or more)."""
    from tinyt.export.retrieval_set import PASSAGES

    return [s.strip() + "." for p in PASSAGES for s in p.split(".") if len(s.split()) > 4]


def _speak(text: str, wav: Path):
    """`text` spoken by espeak-ng, as 16-kHz samples (runtime/audio.load_audio: soxr)."""
    import shutil
    import subprocess

    from tinyt.runtime.audio import load_audio

    if shutil.which("espeak-ng") is None:
        raise BenchError("espeak-ng is not installed: the benchmark speaks its windows with it "
                         "(apt-get install espeak-ng, or bash scripts/setup.sh)")
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, timeout=60)
    return load_audio(wav)


def features(artifacts: Path, out: Path, count: int) -> Path:
    """`count` windows [count, n_mels, 3000]: espeak-ng speaking the first sentences of tinyt's
    retrieval set, one a window, through runtime/audio.log_mel; saved as out/FEATURES."""
    import numpy as np

    from tinyt.runtime.audio import log_mel

    n_mels = json.loads((artifacts / "hf" / "config.json").read_text())["num_mel_bins"]
    said = _sentences()
    with tempfile.TemporaryDirectory() as tmp:
        windows = [log_mel(_speak(said[k % len(said)], Path(tmp) / f"{k}.wav"), n_mels=n_mels)
                   for k in range(count)]
    path = out / FEATURES
    np.save(path, np.stack(windows).astype(np.float32), allow_pickle=False)
    return path


def clip(out: Path) -> dict:
    """The latency's clip: espeak-ng speaking the first sentence of tinyt's retrieval set it
    says within CLIP_SECONDS, at 16 kHz, padded with silence to CLIP_SECONDS; saved as
    out/CLIP. Its tokens: the sentence's words and punctuation marks, what Whisper's byte-level
    BPE writes for common English (a word with its space one token, a mark one; the random
    weights, which never end, write exactly as many). peer_whisper's tokenizer is not asked:
    its filler vocabulary has no merges, a token a character or so."""
    import re

    import numpy as np

    from tinyt.runtime.audio import SAMPLE_RATE

    size = CLIP_SECONDS * SAMPLE_RATE
    with tempfile.TemporaryDirectory() as tmp:
        for text in _sentences():
            samples = _speak(text, Path(tmp) / "clip.wav")
            if samples.size <= size:
                break
        else:
            raise BenchError(f"espeak-ng says no sentence of the retrieval set within "
                             f"{CLIP_SECONDS} s")
    clip_samples = np.zeros(size, dtype=np.float32)
    clip_samples[:samples.size] = samples
    np.save(out / CLIP, clip_samples, allow_pickle=False)
    return {"path": str((out / CLIP).resolve()), "text": text, "seconds": CLIP_SECONDS,
            "speech_s": round(samples.size / SAMPLE_RATE, 3),
            "n": len(re.findall(r"\w+|[^\w\s]", text))}


def _calls(measures: list[str], new_tokens: int, beams: int, batch: int,
           clip_n: int) -> list[dict]:
    """The timed calls of `measures` (MEASURES' names), each with its FIGURES name."""
    made = {"greedy": [{"sources": [0], "n": new_tokens, "beams": 1}],
            "beam": [{"sources": [0], "n": new_tokens, "beams": beams}],
            "batch": [{"sources": list(range(batch)), "n": new_tokens, "beams": 1}],
            "clip": [{"clip": "transcript", "n": clip_n, "beams": 1, "figure": "clip"},
                     {"clip": "features", "n": 0, "beams": 1, "figure": "clip_features"}]}
    return [{"figure": m, **c} for m in measures for c in made[m]]


def run(artifacts: Path, out: Path, *, threads: list[int] | None = None, rounds: int = 5,
        block: int = 3, settle: int = 1, engines: list[str | PeerEngine] | None = None,
        check_windows: int = CHECK_WINDOWS, new_tokens: int = 64, batch: int = 4,
        beams: int = 5, measures: list[str] | None = None, log=print) -> dict:
    """Check, then time every engine on ARTIFACTS' Whisper; write results.json and results.md
    under `out`. Engines are names of WHISPER_ENGINES or rows (default: every one); measures
    names of MEASURES (default: every one)."""
    from tinyt.benchmarks.environment import environment

    from .seq2seq_adapters import VERSIONS

    threads, measures = threads or [1, 2], measures or list(MEASURES)
    engine_rows = _engine_rows(engines)
    _check_options(artifacts, threads, measures, rounds=rounds, block=block, settle=settle,
                   check_windows=check_windows, new_tokens=new_tokens, batch=batch, beams=beams)
    load_before = os.getloadavg()
    skipped = prepare(artifacts, engine_rows)
    out.mkdir(parents=True, exist_ok=True)
    path, said = features(artifacts, out, max(check_windows, batch)), clip(out)
    calls = _calls(measures, new_tokens, beams, batch, said["n"])
    plan = {"check": list(range(check_windows)), "new_tokens": new_tokens, "beams": beams,
            "batch": batch, "eos": json.loads((artifacts / "hf" / "config.json").read_text())[
                "eos_token_id"], "clip": said, "calls": calls}
    options = {"features": str(path.resolve()), "hf": str((artifacts / "hf").resolve()),
               "clip": said["path"]}
    agreement, raw, made, memory = measure(
        engine_rows, artifacts, threads, plan, skipped, (rounds, settle, block), log,
        module="tinyt.benchmarks.peers.whisper_peers", options=options)
    timed = rows(raw, batch, tuple(c["figure"] for c in calls))
    result = {
        "model": _model(artifacts), "artifacts": str(artifacts),
        "environment": environment((*VERSIONS, "pywhispercpp"), load_average={
            "before": load_before, "after": os.getloadavg()}),
        "method": {"threads": threads, "rounds": rounds, "block": block, "settle": settle,
                   "check_sources": check_windows, "new_tokens": new_tokens, "batch": batch,
                   "beams": beams, "unit": UNIT, "measures": measures,
                   "clip": {k: v for k, v in said.items() if k != "path"},
                   "check_said": "30-s windows of espeak-ng speech (a sentence each)"},
        "engines": {e.name: e.about for e in engine_rows}, "skipped": skipped,
        "agreement": agreement, "memory": memory,
        "files": {e.name: _bytes(artifacts / e.artifact) for e in engine_rows
                  if e.name not in skipped},
        "raw_s": raw, "made": made, "rows": timed,
        "targets": targets(timed, threads, {e.name for e in engine_rows if e.ours})}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(markdown(result, head=_head))
    return result


def _engine_rows(engines: list[str | PeerEngine] | None) -> list[PeerEngine]:
    """The engines' rows (names of WHISPER_ENGINES or rows; every one by default), the
    reference first."""
    unknown = [e for e in engines or [] if isinstance(e, str) and e not in WHISPER_ENGINES]
    if unknown:
        raise BenchError(f"unknown engine(s) {unknown}; known: {', '.join(WHISPER_ENGINES)}")
    rows = [e if isinstance(e, PeerEngine) else WHISPER_ENGINES[e]
            for e in engines or list(WHISPER_ENGINES)]
    rows = [WHISPER_ENGINES[REFERENCE], *(e for e in rows if e.name != REFERENCE)]
    return list({e.name: e for e in rows}.values())


def _check_options(artifacts: Path, threads: list[int], measures: list[str],
                   **counts: int) -> None:
    """Refuse bad counts, measures and a directory without a Whisper, every problem at
    once."""
    least = {"rounds": 0, "settle": 0, "block": 1, "check_windows": 1, "new_tokens": 1,
             "batch": 1, "beams": 2}
    problems = [f"{k}={v!r}: an integer >= {least[k]}" for k, v in counts.items()
                if not (isinstance(v, int) and v >= least[k])]
    if not measures or set(measures) - set(MEASURES) or len(set(measures)) < len(measures):
        problems.append(f"measures={measures}: some of {', '.join(MEASURES)}, each once")
    if not all(isinstance(n, int) and n >= 1 for n in threads):
        problems.append(f"threads={threads}: each an integer >= 1")
    cfg = artifacts / "hf" / "config.json"
    if not cfg.is_file() or json.loads(cfg.read_text()).get("model_type") != "whisper":
        problems.append(f"{artifacts / 'hf'} holds no Whisper (config.json, model_type "
                        "whisper): --make tiny makes one")
    if problems:
        raise BenchError("; ".join(problems))


def _model(artifacts: Path) -> dict:
    cfg = json.loads((artifacts / "hf" / "config.json").read_text())
    keys = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
            "encoder_ffn_dim", "num_mel_bins", "vocab_size")
    return {"architecture": (cfg.get("architectures") or ["?"])[0],
            **{k: cfg[k] for k in keys if k in cfg}}


def _head(result: dict) -> list[str]:
    from .seq2seq_report import cpu_line

    m, cfg, env = result["method"], result["model"], result["environment"]
    shape = ", ".join(f"{k} {v}" for k, v in cfg.items() if k != "architecture")
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    return [f"# Whisper: tinyt vs peers on one {cfg['architecture']}", "",
            f"Model: {shape} ({result['artifacts']}/hf).", "", cpu_line(env) + ".", "",
            f"Versions: {vers}.", "",
            f"Each engine in its own process per thread count, the same log-mel features in "
            f"(30-s windows of espeak-ng speech), generated ids out; the prompt "
            f"<|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>. One window: the "
            f"encoder and {m['new_tokens']} new tokens, greedy and with {m['beams']} beams; a "
            f"batch: {m['batch']} windows, greedy. Median of {m['rounds']} interleaved rounds "
            f"× {m['block']} calls (after {m['settle']} untimed).", ""] + _clip_said(m) \
        + _load(env)


def _clip_said(m: dict) -> list[str]:
    """What the clip's latency times (whisper_adapters.py: each engine's front end)."""
    c = m.get("clip")
    if not c or "clip" not in m.get("measures", ()):
        return []
    return [f"The 5-s clip's latency: \"{c['text']}\" ({c['speech_s']} s of espeak-ng speech, "
            f"silence to {c['seconds']} s) from its 16-kHz samples to its transcript's text, "
            f"greedy, {c['n']} tokens (its sentence's words and marks), features included, "
            "each engine through its own front end, each padding the clip to Whisper's 30-s "
            "window: "
            "tinyt SpeechModel.transcribe (runtime/audio.log_mel, numpy); CTranslate2 the same "
            "log_mel, then generate (faster-whisper's own numpy FeatureExtractor not run); "
            "Optimum and transformers WhisperFeatureExtractor (numpy); whisper.cpp its own "
            "(C++, whisper_full on the samples); GenAI its multimodal processor on the clip "
            "as a float WAV in memory. \"Its front end\": the features alone (whisper.cpp's "
            "whisper_pcm_to_mel).", ""]


def _load(env: dict) -> list[str]:
    """A warning where the machine was busy before the run (1-min load average over half its
    physical cores): the times then are the machine's, not the engines' alone."""
    before = (env.get("load_average") or {}).get("before")
    cores = env.get("physical_cores") or 1
    if not before or before[0] <= cores / 2:
        return []
    return [f"**Under load**: a 1-min load average of {before[0]:.1f} on {cores} physical cores "
            "before the run (other work on the machine), so the times and ratios are rough; "
            "rerun it idle for figures to quote.", ""]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tinyt.benchmarks.peers.whisper_peers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", type=Path, help="holds hf/ (a Whisper) and tinyt's onnx/")
    ap.add_argument("--make", help="make hf/ (random weights at this Whisper's shape: tiny, "
                    "base, ...), its checkpoint and the pipeline's onnx, onnx-opt, onnx-int8, "
                    "onnx-int4 where absent")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/whisper-peers"))
    ap.add_argument("--rounds", type=int, default=5, help="0: the check only, nothing timed")
    ap.add_argument("--threads", type=int, action="append", help="repeat (default 1 and 2)")
    ap.add_argument("--engine", action="append",
                    help=f"one of {', '.join(WHISPER_ENGINES)} (repeat)")
    ap.add_argument("--block", type=int, default=3, help="timed calls per call and round")
    ap.add_argument("--settle", type=int, default=1, help="untimed calls before them")
    ap.add_argument("--check-windows", type=int, default=CHECK_WINDOWS)
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens generated per window")
    ap.add_argument("--batch", type=int, default=4, help="windows of the batch call")
    ap.add_argument("--beams", type=int, default=5, help="faster-whisper's default beam size")
    ap.add_argument("--measure", action="append", choices=MEASURES,
                    help="time only these (repeat; default all): greedy, beam and batch on "
                    "30-s windows' features, clip the 5-s clip's latency from its audio")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        from .seq2seq_adapters import worker

        return worker(json.loads(args.worker), loaders=LOADERS)
    try:
        if args.make:
            make(args.make, args.artifacts)
        run(args.artifacts, args.out, threads=args.threads, rounds=args.rounds,
            block=args.block, settle=args.settle, engines=args.engine,
            check_windows=args.check_windows, new_tokens=args.new_tokens, batch=args.batch,
            beams=args.beams, measures=args.measure)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
