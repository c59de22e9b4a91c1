"""tinyt's encoder-decoder artifacts against the engines a user would translate with instead, on
the same weights (issue "The Transformer itself": "Against the peers, on the same weights").

    ARTIFACTS/hf (a Hugging Face MarianMTModel, T5ForConditionalGeneration, ...: yours, or
    random weights at a real model's shape, `python -m tinyt.benchmarks.hf_shape opus-mt-en-de`)
      ├─tinyt import-hf─▶ checkpoint ──tinyt export─▶ onnx (──optimize─▶ onnx-opt ──quantize─▶
      │                                                      onnx-int8, where they exist)
      ├─CTranslate2's TransformersConverter─▶ peers/ct2-int8, peers/ct2-float32
      ├─Optimum's ORTModelForSeq2SeqLM(export=True)─▶ peers/optimum-fp32
      └─transformers' PyTorch model loads ARTIFACTS/hf itself
    one worker process per (engine, threads) (seq2seq_adapters.py), each loading once:
      1. same output first, at the first thread count: the greedy tokens of every engine on
         held-out sources (sentences of tinyt's retrieval set, 8 to 48 tokens, one at a
         time) against tinyt fp32's. An fp32 engine must give exactly its tokens, as the
         decoder peers' must, but for a tie at fp32 precision where they first part (tinyt's
         logits there prefer its token by at most compare.TIE_FACTOR x reorder_bound: the
         seq2seq verifier's rule), or it is refused (skipped with the difference, never
         timed); an INT8 engine reports its agreement. Beam search's tokens are compared too
         (told, not required).
      2. then time, rounds interleaved across the live workers (each round starting one
         worker on, a rest between workers): one sentence greedy, one sentence with beams,
         and a batch of sentences greedy (sentences per second); `settle` untimed calls, then
         `block` timed, the median kept
    ──▶ results.json (environment with the CPU's flags and the load average, every raw time),
        results.md; the target: tinyt's best time at most 0.9x CTranslate2 int8's

    python -m tinyt.benchmarks.peers.seq2seq_peers ARTIFACTS --out benchmarks/results/seq2seq-X

Every engine is given the call's settings (max_new_tokens, beams, no sampling, length penalty
1, no early stop), none from generation_config.json. hf_shape's random weights carry a zero
</s> row in the head, so every engine makes exactly the tokens asked (the work compared is the
same); with real weights a sentence may end sooner, and each call's tokens are recorded
("made"). Each worker's threads go to its engine's own setting (tinyt.runtime's threads, ONNX
Runtime's intra_op_num_threads, CTranslate2's intra_threads, torch.set_num_threads) and to
OMP / MKL; every worker runs offline (HF_HUB_OFFLINE).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tinyt.errors import BenchError

from . import formats
from .engines import PeerEngine
from .protocol import REST_S, Worker
from .seq2seq_adapters import VERSIONS, worker
from .seq2seq_check import REFERENCE, check, tie_bound
from .seq2seq_report import CT2_INT8, TARGET, markdown, rows, targets  # noqa: F401 (API)

MIN_FREE = 2 << 30  # bytes available, at least, when a worker starts
CHECK_LENGTHS = (8, 48)  # the check's sources: lengths from, to (their </s> included)


# tinyt's own engines: the rows of the encoder-decoder catalogue (tinyt.artifacts
# .SEQ2SEQ_VARIANTS) each runs; the fp32 ones must give the reference's tokens
TINYT_ROWS = {REFERENCE: "onnx", "tinyt-opt": "onnx-opt", "tinyt-int8": "onnx-int8",
              "tinyt-int4": "onnx-int4", "tinyt-int8-qgemm": "onnx-int8-qgemm",
              "tinyt-int8-static": "onnx-int8-static"}
FP32 = ("onnx", "onnx-opt")


def _variant(artifact: str):
    from tinyt.artifacts import SEQ2SEQ_VARIANTS

    return next(v for v in SEQ2SEQ_VARIANTS if v.dir == artifact)


def makes(artifact: str) -> str:
    """The command that makes tinyt's directory `artifact` under ARTIFACTS."""
    v = _variant(artifact)
    flags = "".join(f" --{k.replace('_', '-')} {x}" for k, x in v.options.items())
    return f"tinyt {v.stage} ARTIFACTS/{v.source} ARTIFACTS/{v.dir}{flags}"


def _ours(name: str) -> PeerEngine:
    artifact = TINYT_ROWS[name]
    v = _variant(artifact)
    about = ("the fp32 export: three graphs in Optimum's layout" if artifact == "onnx" else
             v.note.split(":")[0] if v.note else f"`{makes(artifact)}`")
    return PeerEngine(name, f"tinyt.runtime generate_ids on ARTIFACTS/{artifact} ({about})",
                      "onnxruntime", "bash scripts/setup.sh", "tinyt", artifact, ours=True,
                      exact=artifact in FP32, modules=("tinyt.runtime",))


def _ct2(option: str) -> PeerEngine:
    return PeerEngine(f"ct2-{option}", f"CTranslate2 Translator, {option} (its "
                      "TransformersConverter on ARTIFACTS/hf)", "ctranslate2", "extra peers",
                      "ctranslate2", f"peers/ct2-{option}", formats.ctranslate2, option,
                      exact=option == "float32", modules=("ctranslate2",))


# load: a loader of seq2seq_adapters.py; artifact: a directory under ARTIFACTS. tinyt's rows
# are the directories `tinyt export` / `optimize` / `quantize` write; one that is absent is
# skipped, saying which command makes it.
SEQ2SEQ_ENGINES: dict[str, PeerEngine] = {e.name: e for e in (
    *(_ours(name) for name in TINYT_ROWS),
    _ct2("int8"),
    _ct2("float32"),
    PeerEngine("optimum-fp32", "Optimum's ORTModelForSeq2SeqLM.generate on its own export "
               "(from_pretrained(ARTIFACTS/hf, export=True), saved once)", "optimum-onnx",
               "extra optimum", "optimum", "peers/optimum-fp32", formats.optimum_seq2seq,
               exact=True, modules=("optimum.onnxruntime", "transformers")),
    PeerEngine("transformers", "transformers' PyTorch model (AutoModelForSeq2SeqLM, eager "
               "attention) generate on ARTIFACTS/hf", "torch", "extra torch", "transformers",
               "hf", exact=True, modules=("torch", "transformers")),
)}


def measure(engine_rows: list[PeerEngine], artifacts: Path, threads: list[int], plan: dict,
            skipped: dict, timing: tuple[int, int, int], log, **start: Any
            ) -> tuple[dict, dict, dict, dict]:
    """Each engine's worker started, checked against the first (the reference), then timed:
    (agreement, raw times, tokens made, memory). timing: (rounds, settle, block); start:
    _start's module and options (the Whisper benchmark's)."""
    rounds, settle, block = timing
    workers: list[Worker] = []
    with tempfile.TemporaryDirectory() as logs:
        try:
            workers = _start(engine_rows, artifacts, threads, skipped, Path(logs), log, **start)
            agreement = check(workers, engine_rows, threads[0], plan, skipped,
                              tie_bound(artifacts / engine_rows[0].artifact), log)
            raw, made = _time(workers, plan["calls"], rounds, settle, block, log)
            memory = {w.label: {"loaded": w.hello.get("loaded"),
                                "load_s": w.hello.get("load_s"),
                                **(w.ask(op="memory")["memory"] or {})} for w in workers}
        finally:
            for w in workers:
                w.close()
    return agreement, raw, made, memory


def run(artifacts: Path, out: Path, *, threads: list[int] | None = None, rounds: int = 5,
        block: int = 3, settle: int = 1, engines: list[str | PeerEngine] | None = None,
        check_sources: int = 16, source_tokens: int = 32, new_tokens: int = 32,
        batch: int = 32, beams: int = 4, log=print) -> dict:
    """Check, then time every engine on ARTIFACTS' weights; write results.json and results.md
    under `out`. Engines are names of SEQ2SEQ_ENGINES or rows (default: every one)."""
    from tinyt.benchmarks.environment import environment

    engine_rows = _engine_rows(engines)
    threads = threads or [1, 2]
    _check_options(artifacts, threads=threads, rounds=rounds, block=block, settle=settle,
                   check_sources=check_sources, source_tokens=source_tokens,
                   new_tokens=new_tokens, batch=batch, beams=beams)
    load_before = os.getloadavg()
    skipped = prepare(artifacts, engine_rows)
    plan = inputs(artifacts, check_sources, source_tokens, new_tokens, batch, beams)
    out.mkdir(parents=True, exist_ok=True)
    agreement, raw, made, memory = measure(engine_rows, artifacts, threads, plan, skipped,
                                           (rounds, settle, block), log)
    timed = rows(raw, plan["batch"])
    result = {
        "model": _model(artifacts), "artifacts": str(artifacts),
        "environment": environment(VERSIONS, load_average={"before": load_before,
                                                           "after": os.getloadavg()}),
        "method": {"threads": threads, "rounds": rounds, "block": block, "settle": settle,
                   "check_sources": len(plan["check"]), "check_lengths": CHECK_LENGTHS,
                   "source_tokens": source_tokens, "new_tokens": new_tokens, "batch": batch,
                   "beams": beams},
        "engines": {e.name: e.about for e in engine_rows}, "skipped": skipped,
        "agreement": agreement, "memory": memory,
        "files": {e.name: _bytes(artifacts / e.artifact) for e in engine_rows
                  if e.name not in skipped},
        "raw_s": raw, "made": made, "rows": timed,
        "targets": targets(timed, threads, {e.name for e in engine_rows if e.ours})}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(markdown(result))
    return result


def _engine_rows(engines: list[str | PeerEngine] | None) -> list[PeerEngine]:
    """The engines' rows (every one by default), the reference first; an unknown name is
    refused."""
    unknown = [e for e in engines or [] if isinstance(e, str) and e not in SEQ2SEQ_ENGINES]
    if unknown:
        raise BenchError(f"unknown engine(s) {unknown}; known: {', '.join(SEQ2SEQ_ENGINES)}")
    rows = [e if isinstance(e, PeerEngine) else SEQ2SEQ_ENGINES[e]
            for e in engines or list(SEQ2SEQ_ENGINES)]
    if REFERENCE not in [e.name for e in rows]:
        rows.insert(0, SEQ2SEQ_ENGINES[REFERENCE])  # every check is against its tokens
    return sorted(rows, key=lambda e: e.name != REFERENCE)


def _check_options(artifacts: Path, **counts: int | list[int]) -> None:
    """Refuse bad counts and a directory without the Hugging Face model, every problem at once,
    before any work."""
    least = {"rounds": 0, "settle": 0, "block": 1, "check_sources": 1, "source_tokens": 2,
             "new_tokens": 1, "batch": 1, "beams": 2}
    problems = [f"{k}={v!r}: an integer >= {least[k]}" for k, v in counts.items()
                if k in least and not (isinstance(v, int) and v >= least[k])]
    if not all(isinstance(n, int) and n >= 1 for n in counts["threads"]):
        problems.append(f"threads={counts['threads']}: each an integer >= 1")
    if not (artifacts / "hf" / "config.json").is_file():
        problems.append(f"{artifacts / 'hf'} has no config.json: ARTIFACTS/hf is the Hugging "
                        "Face model every engine runs (python -m tinyt.benchmarks.hf_shape "
                        f"opus-mt-en-de {artifacts / 'hf'} makes one)")
    if problems:
        raise BenchError("; ".join(problems))


def prepare(artifacts: Path, rows: list[PeerEngine]) -> dict[str, str]:
    """The engines that cannot run here, with why (a package absent, tinyt's directory not
    made); every peer's conversion of ARTIFACTS/hf brought up to date, in a child process
    (what the converters hold in torch goes with it)."""
    import concurrent.futures as cf
    import importlib.metadata as md
    import multiprocessing as mp

    from .prepare import exit_with_parent

    skipped: dict[str, str] = {}
    for e in rows:
        try:
            md.version(e.package)
        except md.PackageNotFoundError:
            skipped[e.name] = f"{e.package} is not installed ({e.install})"
            continue
        if e.missing is not None and (why := e.missing(False)):  # a tool of its own absent
            skipped[e.name] = why
            continue
        if e.ours and not (artifacts / e.artifact / "manifest.json").is_file():
            skipped[e.name] = (f"{artifacts / e.artifact} is missing (`"
                               f"{makes(e.artifact)}` makes it)"
                               .replace("ARTIFACTS", str(artifacts)))
    need = [(e.name, e.artifact, e.convert, e.option) for e in rows
            if e.convert is not None and e.name not in skipped]
    if need:
        with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"),
                                    initializer=exit_with_parent,
                                    initargs=(os.getpid(),)) as child:
            skipped.update(child.submit(convert, artifacts, need).result())
    return skipped


def convert(artifacts: Path, need: list[tuple]) -> dict[str, str]:
    """Each (name, artifact, converter, option) made from ARTIFACTS/hf, kept while the weights
    are unchanged (formats.STAMP); the engines whose converter failed, with its error."""
    from tinyt.fsutil import sha256_file

    hf = artifacts / "hf"
    stamp = "\n".join(sha256_file(f) for f in sorted(hf.glob("*.safetensors")))
    failed = {}
    for name, artifact, converter, option in need:
        path = artifacts / artifact
        if formats.stamp(path) == stamp:
            continue
        shutil.rmtree(path, ignore_errors=True)
        try:
            converter(hf, path, option)
        except Exception as e:  # a peer's converter failing is that peer's result
            failed[name] = f"conversion failed: {type(e).__name__}: {e}".splitlines()[0][:300]
            continue
        (path / formats.STAMP).write_text(stamp)
    return failed


def inputs(artifacts: Path, check_sources: int, source_tokens: int, new_tokens: int,
           batch: int, beams: int) -> dict:
    """The check's sources (CHECK_LENGTHS apart, each ending in </s>) and the timed calls:
    one source of `source_tokens` greedy and with `beams`, and `batch` such sources greedy.
    Cut from the sentences of tinyt's retrieval set, tokenized by ARTIFACTS/hf's tokenizer."""
    from tokenizers import Tokenizer

    from tinyt.export.retrieval_set import PASSAGES

    hf = artifacts / "hf"
    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
    eos = json.loads((hf / "config.json").read_text())["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    stream = [i for p in PASSAGES for i in tok.encode(p, add_special_tokens=False).ids]
    at = [0]

    def cut(length: int) -> list[int]:  # the next `length` - 1 ids of the stream, and </s>
        if at[0] + length > len(stream):
            at[0] = 0
        ids = stream[at[0]:at[0] + length - 1] + [eos]
        at[0] += length - 1
        return ids
    lo, hi = CHECK_LENGTHS
    check = [cut(lo + (hi - lo) * i // max(1, check_sources - 1)) for i in range(check_sources)]
    one, many = cut(source_tokens), [cut(source_tokens) for _ in range(batch)]
    calls = [{"sources": [one], "n": new_tokens, "beams": 1},
             {"sources": [one], "n": new_tokens, "beams": beams},
             {"sources": many, "n": new_tokens, "beams": 1}]
    return {"check": check, "new_tokens": new_tokens, "beams": beams, "batch": batch,
            "eos": eos, "calls": calls}


def _start(rows: list[PeerEngine], artifacts: Path, threads: list[int],
           skipped: dict[str, str], logs: Path, log, **how) -> list[Worker]:
    """A worker per engine and thread count, one after another; one that cannot start (its
    package absent in the worker, its load failing, too little memory left) is skipped with
    why. how: start's module and options."""
    from tinyt.hardware import available_memory, gib

    workers: list[Worker] = []
    for e in rows:
        for n in threads:
            if e.name in skipped:
                break
            free = available_memory()
            if free is not None and free < MIN_FREE:
                skipped[f"{e.name}@{n}t"] = (f"not started: {gib(free)} available with "
                                             f"{len(workers)} worker(s) loaded")
                continue
            w = start(e, artifacts, n, logs / f"{e.name}@{n}t.log", **how)
            if "ready" not in w.hello:
                said = w.hello.get("error") or f"not installed (no {w.hello.get('missing')}): "\
                                                f"{e.install}"
                skipped[e.name if w.hello.get("missing") else w.label] = said
                w.close()
                continue
            log(f"{w.label}: loaded in {w.hello['load_s']:.1f} s")
            workers.append(w)
    return workers


def start(e: PeerEngine, artifacts: Path, threads: int, log: Path | None = None, *,
          module: str = "tinyt.benchmarks.peers.seq2seq_peers",
          options: dict | None = None) -> Worker:
    """The worker of engine `e` at `threads` on ARTIFACTS/<its artifact> (its hello read):
    `python -m module ARTIFACTS --worker SPEC`, its loader given e.options and `options`."""
    n = str(threads)
    spec = {"loader": e.load, "path": str((artifacts / e.artifact).resolve()),
            "threads": threads, "packages": list(e.modules),
            "options": {**e.options, **(options or {})}}
    return Worker(e.name, threads, [sys.executable, "-m", module,
                                    str(artifacts), "--worker", json.dumps(spec)],
                  {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "HF_HUB_OFFLINE": "1",
                   "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}, log)


def _time(workers: list[Worker], calls: list[dict], rounds: int, settle: int, block: int,
          log) -> tuple[dict[str, list[list[float]]], dict[str, list[int]]]:
    """Seconds per call per worker, rounds interleaved (each round starting one worker on),
    and the tokens each call made."""
    raw = {w.label: [[] for _ in calls] for w in workers} if rounds else {}
    made: dict[str, list[int]] = {}
    for r in range(rounds if workers else 0):
        log(f"round {r + 1}/{rounds}")
        for w in workers[r % len(workers):] + workers[:r % len(workers)]:
            reply = w.ask(op="time", calls=calls, settle=settle, block=block)
            for i, ts in enumerate(reply["times"]):
                raw[w.label][i] += ts
            made[w.label] = reply["made"]
            time.sleep(REST_S)
    return raw, made


def _model(artifacts: Path) -> dict:
    """The Hugging Face model's class and shape, from ARTIFACTS/hf/config.json."""
    cfg = json.loads((artifacts / "hf" / "config.json").read_text())
    keys = ("model_type", "d_model", "encoder_layers", "decoder_layers", "num_layers",
            "num_decoder_layers", "num_heads", "encoder_attention_heads", "d_kv", "d_ff",
            "encoder_ffn_dim", "feed_forward_proj", "activation_function", "vocab_size",
            "max_position_embeddings", "n_positions", "tie_word_embeddings")
    return {"architecture": (cfg.get("architectures") or ["?"])[0],
            **{k: cfg[k] for k in keys if k in cfg}}


def _bytes(path: Path) -> int | None:
    """An engine's model on disk: every file of its directory."""
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else []
    return sum(f.stat().st_size for f in files) or None


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tinyt.benchmarks.peers.seq2seq_peers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", type=Path, help="holds hf/ (the Hugging Face model), and "
                    "tinyt's onnx/ (and onnx-opt/, onnx-int8/ where made)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/seq2seq"))
    ap.add_argument("--rounds", type=int, default=5, help="0: the check only, nothing timed")
    ap.add_argument("--threads", type=int, action="append", help="repeat (default 1 and 2)")
    ap.add_argument("--engine", action="append",
                    help=f"one of {', '.join(SEQ2SEQ_ENGINES)} (repeat)")
    ap.add_argument("--block", type=int, default=3, help="timed calls per call and round")
    ap.add_argument("--settle", type=int, default=1, help="untimed calls before them")
    ap.add_argument("--check-sources", type=int, default=16,
                    help="sources of the same-output check")
    ap.add_argument("--source-tokens", type=int, default=32, help="a timed source's tokens")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens generated per source")
    ap.add_argument("--batch", type=int, default=32, help="sources of the throughput call")
    ap.add_argument("--beams", type=int, default=4, help="the beam search's width")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # a worker's spec (seq2seq_adapters)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    try:
        run(args.artifacts, args.out, threads=args.threads, rounds=args.rounds,
            block=args.block, settle=args.settle, engines=args.engine,
            check_sources=args.check_sources, source_tokens=args.source_tokens,
            new_tokens=args.new_tokens, batch=args.batch, beams=args.beams)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
