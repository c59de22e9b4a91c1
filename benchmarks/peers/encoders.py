"""tinyt's encoder artifacts against the engines a user would pick instead, on the same
sentence-transformers directory (issue 31, "Against the peers").

    ST_DIR (default: random weights at all-MiniLM-L6-v2's shape, or --shape bge-small)
      │ --train STEPS: first a short SimCSE run (encoder_weights.py) ─▶ ST_DIR-trained
      ├─tinyt.hf.import_hf─▶ ckpt ──export──▶ onnx ──optimize──▶ opt ──quantize──▶ int8
      ├─Optimum (export=True, save_pretrained)─▶ optimum/   (run by Optimum and by fastembed)
      └─sentence-transformers loads ST_DIR itself (torch; backend="onnx" exports through Optimum)
    one worker process per (engine, threads), started one after another, each loading once:
      1. same embeddings first: the 220 texts of tinyt's retrieval set (export/retrieval_set.py),
         against transformers' hidden states pooled as sentence-transformers pools them; an fp32
         engine below EXACT_COSINE is refused before anything is timed; INT8 reports its cosine
         and recall@10
      2. then time, rounds interleaved across the live workers (engine A round 1, B round 1,
         ...): texts per second at a batch of 32 texts of 128 tokens, and the latency of one
         16-token text; each call `settle` untimed then `block` timed, a rest between workers
    ──▶ results.json (environment, every raw time), results.md; times as ratios to tinyt's
        fastest artifact at the same thread count

    python -m benchmarks.peers.encoders --out benchmarks/results/encoders-minilm --rounds 10
    python -m benchmarks.peers.encoders --shape bge-small --out benchmarks/results/encoders-bge
    python -m benchmarks.peers.encoders --train 30 --rounds 0 --engine tinyt-int8 --out OUT

Random weights crowd every text near one direction, so INT8's recall@10 there measures near-ties
of the init; --train gives the weights a trained model's spread first (a few minutes on 2
cores), from the same seeded init, and the rest runs unchanged on the trained directory.

Peers run with .venv-encoder-peers' python where it exists (bash scripts/setup-encoder-peers.sh;
sentence-transformers and fastembed stay out of .venv), else with this one; a peer whose
package is absent is reported as not installed, with how to install it. Every worker runs
offline (HF_HUB_OFFLINE) with its thread count given to the engine's own setting (torch
set_num_threads, ONNX Runtime intra_op_num_threads, fastembed threads) and to OMP, MKL and
the tokenizers' rayon pool. Timings include each engine's own tokenization: texts in,
embeddings out. The engines are PeerEngine rows (engines.py), their workers speak the decoders'
protocol (protocol.py); the loaders and the worker are encoder_adapters.py, the report
encoder_report.py.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tinyt.errors import BenchError

from .encoder_adapters import VERSIONS, pool
from .encoder_inputs import SHAPES, build_st, st_settings, texts_of  # noqa: F401 (API)
from .encoder_report import markdown
from .engines import PeerEngine
from .protocol import REST_S, Worker

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = Path(__file__).resolve().with_name("encoder_adapters.py")  # the workers' script
PEER_VENV = REPO / ".venv-encoder-peers"
SETUP = "bash scripts/setup-encoder-peers.sh"
EXACT_COSINE = 0.9999  # an fp32 engine's worst text against the reference, at least
CHECK_BATCH = 32  # texts per call of the same-embeddings check
def _ours(name: str, model: str, about: str, exact: bool = True) -> PeerEngine:
    return PeerEngine(name, about, "tinyt", "bash scripts/setup.sh", "tinyt", model, ours=True,
                      exact=exact, modules=("tinyt.runtime",))


def _peer(name: str, about: str, package: str, install: str, loader: str, model: str,
          modules: tuple[str, ...]) -> PeerEngine:
    return PeerEngine(name, about, package, install, loader, model, exact=True, modules=modules)


_PIP_ST = f"pip install sentence-transformers (or {SETUP})"
_PIP_OPTIMUM = f"pip install 'optimum[onnxruntime]' (or {SETUP})"
# load: a loader of encoder_adapters.py; artifact: "st" (ST_DIR) or one made here (onnx, opt,
# int8, optimum)
ENCODER_ENGINES: dict[str, PeerEngine] = {e.name: e for e in (
    _ours("tinyt-fp32", "onnx", "tinyt.runtime on the fp32 export"),
    _ours("tinyt-opt", "opt", "tinyt.runtime on the optimized export"),
    _ours("tinyt-int8", "int8", "tinyt.runtime on the dynamic INT8 artifact", exact=False),
    _peer("st-torch", "sentence-transformers, PyTorch on CPU", "sentence-transformers", _PIP_ST,
          "st_torch", "st", ("sentence_transformers", "torch")),
    _peer("st-onnx", "sentence-transformers' ONNX backend (it exports through Optimum at load)",
          "sentence-transformers", f"pip install 'sentence-transformers[onnx]' (or {SETUP})",
          "st_onnx", "st", ("sentence_transformers", "optimum.onnxruntime")),
    _peer("optimum", "Optimum's ORTModelForFeatureExtraction on its own export, pooled in "
          "numpy", "optimum-onnx", _PIP_OPTIMUM, "optimum", "optimum",
          ("optimum.onnxruntime", "transformers")),
    _peer("fastembed", "fastembed on Optimum's export (add_custom_model, specific_model_path)",
          "fastembed", f"pip install fastembed (or {SETUP})", "fastembed", "optimum",
          ("fastembed",)),
)}


def start(engine: PeerEngine, path: Path, threads: int, python: str, options: dict,
          log: Path) -> Worker:
    """The worker of `engine` at `threads` on `path`, run by `python` (encoder_adapters.py as
    a script), offline, with every thread pool of its libraries at `threads`."""
    n = str(threads)
    spec = {"loader": engine.load, "path": str(path), "threads": threads,
            "packages": list(engine.modules), "options": options}
    return Worker(engine.name, threads, [python, str(ADAPTERS), "--worker", json.dumps(spec)],
                  {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "RAYON_NUM_THREADS": n,
                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "PYTHONUNBUFFERED": "1"}, log)


def peer_python() -> str:
    """The python that runs the peers: .venv-encoder-peers' where it exists, else this one."""
    p = PEER_VENV / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def reference(settings: dict, texts: list[str]) -> np.ndarray:
    """transformers' hidden states, pooled and normalized as sentence-transformers does [n, C]."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(settings["transformer"])
    model = AutoModel.from_pretrained(settings["transformer"]).eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(texts), CHECK_BATCH):
            x = tok(texts[s:s + CHECK_BATCH], padding=True, truncation=True,
                    max_length=settings["max_length"], return_tensors="pt")
            h = model(**x).last_hidden_state.numpy()
            out.append(pool(h, x["attention_mask"].numpy(), settings["pooling"],
                            settings["normalize"]))
    return np.concatenate(out)


def prepare(st_dir: Path, work: Path, engines: list[PeerEngine], python: str, settings: dict,
            skipped: dict, log=print) -> dict[str, Path]:
    """The directories the engines load: ST_DIR, tinyt's artifacts (each stage from the one
    before) and Optimum's export, made once here."""
    paths = {"st": st_dir}
    need = {e.artifact for e in engines if e.ours}  # each stage made from the one before
    if need:
        from tinyt.export import export_onnx
        from tinyt.export.optimize import optimize
        from tinyt.export.quantize import quantize
        from tinyt.hf import import_hf

        log(f"tinyt: import, export{', optimize' if need - {'onnx'} else ''}"
            f"{', quantize' if 'int8' in need else ''}")
        import_hf(st_dir, work / "ckpt")
        paths["onnx"] = export_onnx(work / "ckpt", work / "onnx")
        if need - {"onnx"}:
            paths["opt"] = optimize(paths["onnx"], work / "opt")
        if "int8" in need:
            paths["int8"] = quantize(paths["opt"], work / "int8")
    users = [e for e in engines if e.artifact == "optimum"]
    if users:
        log("Optimum: export=True")
        spec = {"source": settings["transformer"], "out": str(work / "optimum"),
                "max_length": settings["max_length"] or 512}
        proc = subprocess.run([python, str(ADAPTERS), "--export-optimum",
                               json.dumps(spec)], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        said = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
        for e in users:
            if said.get("missing"):
                skipped[e.name] = (f"not installed in {python}: {_PIP_OPTIMUM}" if e.load ==
                                   "optimum" else f"needs Optimum's export ({_PIP_OPTIMUM})")
            elif "saved" not in said:
                skipped[e.name] = "Optimum's export failed: " + " ".join(
                    proc.stderr.strip().splitlines()[-1:])
        paths["optimum"] = work / "optimum"
    return paths


def check(w: Worker, exact: bool, texts: list[str], ref: np.ndarray, queries: int,
          tmp: Path) -> dict:
    """The worker's embeddings of `texts` against the reference's: cosine per text (min, mean),
    recall@10 of the passages' ranking for each query, and whether it matches (an `exact`
    engine must)."""
    from tinyt.export.accuracy import RECALL_K, cosines, recall_at_k, top_k

    path = tmp / f"{w.label}.npy"
    w.ask(op="embed", texts=texts, batch_size=CHECK_BATCH, path=str(path))
    got = np.load(path)
    if got.shape != ref.shape:
        return {"shape": list(got.shape), "reference_shape": list(ref.shape),
                "must_match": exact, "matches": False}
    cos = cosines(ref, got)
    recall = recall_at_k(top_k(ref[:queries], ref[queries:], RECALL_K),
                         top_k(got[:queries], got[queries:], RECALL_K))
    return {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
            f"recall_at_{RECALL_K}": int(recall.sum()) / (RECALL_K * queries),
            f"recall_at_{RECALL_K}_worst_query": int(recall.min()) / RECALL_K,
            "must_match": exact,
            "matches": bool(cos.min() >= EXACT_COSINE) if exact else None}


def run(st_dir: Path | None, out: Path, *, shape: str = "minilm", threads: list[int] | None = None,
        rounds: int = 8, block: int = 3, settle: int = 1,
        engines: list[str | PeerEngine] | None = None, python: str | None = None,
        throughput: tuple[int, int] = (32, 128), latency_tokens: int = 16,
        work: Path | None = None, train_steps: int = 0, log=print) -> dict:
    """Check, then time every engine on one sentence-transformers directory (built at `shape`
    with random weights where st_dir is None; SimCSE-trained for `train_steps` steps first
    where that is above 0: encoder_weights.py); write results.json and results.md.
    Engines are names of ENCODER_ENGINES or rows; `python` runs the peers (default:
    peer_python())."""
    from tinyt.benchmarks.environment import environment
    from tinyt.export.retrieval_set import PASSAGES, QUERIES

    rows = _engine_rows(engines)
    threads = threads or [1, 2]
    _check_options(shape=shape, threads=threads, rounds=rounds, block=block, settle=settle,
                   train_steps=train_steps)
    python = python or peer_python()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(work or tmp)
        for sub in ("logs", "check"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        st_dir, source, settings, weights = _weights(st_dir, work, shape, train_steps, log)
        skipped: dict[str, str] = {}
        paths = prepare(st_dir, work, rows, python, settings, skipped, log)
        texts = [*QUERIES, *PASSAGES]
        ref = reference(settings, texts)
        calls = _calls(settings, throughput, latency_tokens)
        workers, accuracy, refused, loads = [], {}, {}, {}
        try:
            for e in rows:  # one worker at a time: loaded and checked before the next starts
                for n in threads:
                    if e.name in skipped:
                        break
                    w = _load(e, n, paths[e.artifact], python, settings, work, skipped, log)
                    if w is None:
                        continue
                    loads[w.label] = {k: w.hello[k] for k in ("load_s", "memory", "python",
                                                              "versions")}
                    try:
                        accuracy[w.label] = check(w, e.exact, texts, ref, len(QUERIES),
                                                  work / "check")
                    except RuntimeError as err:  # it cannot embed these texts
                        skipped[w.label] = f"failed the check: {' '.join(str(err).split())[:300]}"
                        w.close()
                        continue
                    if accuracy[w.label]["matches"] is False:
                        refused[w.label] = accuracy[w.label]
                        w.close()
                        continue
                    workers.append(w)
            raw = _time(workers, calls, rounds, settle, block, log)
            for w in workers:
                loads[w.label]["memory_after"] = w.ask(op="memory")["memory"]
        finally:
            for w in workers:
                w.close()
    result = {
        "model": {k: v for k, v in settings.items() if k != "transformer"},
        "st_dir": source, "training": weights,
        "environment": environment(VERSIONS, peer_python=python),
        "method": {"threads": threads, "rounds": rounds, "block": block, "settle": settle,
                   "throughput": {"batch": throughput[0], "tokens": throughput[1]},
                   "latency": {"batch": 1, "tokens": latency_tokens},
                   "check_texts": len(texts), "exact_cosine": EXACT_COSINE},
        "engines": {e.name: e.about for e in rows}, "skipped": skipped, "refused": refused,
        "accuracy": accuracy, "workers": loads, "raw_s": raw,
        "rows": _rows(raw, rows, throughput[0])}
    _write(result, out)
    return result


def _engine_rows(engines: list[str | PeerEngine] | None) -> list[PeerEngine]:
    """The engines' rows (every one of ENCODER_ENGINES by default); an unknown name is refused."""
    unknown = [e for e in engines or [] if isinstance(e, str) and e not in ENCODER_ENGINES]
    if unknown:
        raise BenchError(f"unknown engine(s) {unknown}; known: {', '.join(ENCODER_ENGINES)}")
    return [e if isinstance(e, PeerEngine) else ENCODER_ENGINES[e]
            for e in engines or list(ENCODER_ENGINES)]


def _check_options(*, shape: str, threads: list[int], rounds: int, block: int, settle: int,
                   train_steps: int) -> None:
    """Refuse bad counts and an unknown shape, every problem at once, before any work."""
    problems = [text for ok, text in (
        (isinstance(rounds, int) and rounds >= 0, f"rounds={rounds!r}: an integer >= 0 (0: "
                                                  "the check only)"),
        (isinstance(settle, int) and settle >= 0, f"settle={settle!r}: an integer >= 0"),
        (isinstance(block, int) and block >= 1, f"block={block!r}: an integer >= 1"),
        (isinstance(train_steps, int) and train_steps >= 0,
         f"train_steps={train_steps!r}: an integer >= 0 (0: the weights as they are)"),
        (all(isinstance(n, int) and n >= 1 for n in threads), f"threads={threads}: each >= 1"),
        (shape in SHAPES, f"shape={shape!r}: one of {', '.join(SHAPES)}")) if not ok]
    if problems:
        raise BenchError("; ".join(problems))


def _weights(st_dir: Path | None, work: Path, shape: str, train_steps: int,
             log) -> tuple[Path, str, dict, dict | None]:
    """The sentence-transformers directory every engine loads (ST_DIR, or random weights at
    `shape` built under `work`, SimCSE-trained first where train_steps > 0): the directory,
    what it is in words, its st_settings and the training's record (None: untrained)."""
    source = str(st_dir) if st_dir else f"random weights at the {shape} shape"
    if st_dir is None:
        log(f"building a sentence-transformers directory of {source}")
        st_dir = build_st(work / "st", shape)
    settings = st_settings(Path(st_dir))
    weights = None
    if train_steps:
        from .encoder_weights import train

        log(f"SimCSE: {train_steps} steps on {source}")
        weights = train(Path(st_dir), work / "st-trained", pooling=settings["pooling"],
                        transformer=str(Path(settings["transformer"]).relative_to(st_dir)),
                        steps=train_steps, log=log)
        st_dir, source = work / "st-trained", f"{source}, SimCSE-trained {train_steps} steps"
        settings = st_settings(st_dir)
    return Path(st_dir), source, settings, weights


def _calls(settings: dict, throughput: tuple[int, int], latency_tokens: int) -> list[dict]:
    """The two timed calls: `throughput` (texts, tokens) at that batch, and one short text."""
    tokenizer = Path(settings["transformer"]) / "tokenizer.json"
    return [{"texts": texts_of(tokenizer, throughput[1], throughput[0]),
             "batch_size": throughput[0]},
            {"texts": texts_of(tokenizer, latency_tokens, 1), "batch_size": 1}]


def _load(e: PeerEngine, n: int, path: Path, python: str, settings: dict, work: Path,
          skipped: dict[str, str], log) -> Worker | None:
    """The worker of `e` at `n` threads, loaded; None where it did not start (why: in
    `skipped`, under the engine's name where its package is absent)."""
    from tinyt.hardware import available_memory

    free = available_memory()
    if free is not None and free < 2 << 30:
        skipped[f"{e.name}@{n}t"] = f"not started: {free >> 20} MiB available"
        return None
    w = start(e, path, n, sys.executable if e.ours else python,
              {**settings, **e.options}, work / "logs" / f"{e.name}@{n}t.log")
    if "ready" not in w.hello:
        skipped[e.name if w.hello.get("missing") else w.label] = (
            f"not installed in {w.proc.args[0]} (no {w.hello['missing']}): "
            f"{e.install}" if w.hello.get("missing") else w.hello["error"])
        w.close()
        return None
    log(f"{w.label}: loaded in {w.hello['load_s']:.1f} s; checking")
    return w


def _write(result: dict, out: Path) -> None:
    """results.json and results.md under `out`."""
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(markdown(result))


def _time(workers: list[Worker], calls: list[dict], rounds: int, settle: int, block: int,
          log) -> dict[str, list[list[float]]]:
    """Seconds per call per worker, rounds interleaved (each round starting one worker on)."""
    raw: dict[str, list[list[float]]] = {w.label: [[] for _ in calls] for w in workers}
    for r in range(rounds if workers else 0):
        log(f"round {r + 1}/{rounds}")
        for w in workers[r % len(workers):] + workers[:r % len(workers)]:
            for i, ts in enumerate(w.ask(op="time", calls=calls, settle=settle,
                                         block=block)["times"]):
                raw[w.label][i] += ts
            time.sleep(REST_S)
    return {k: v for k, v in raw.items() if rounds}


def _rows(raw: dict, engines: list[PeerEngine], batch: int) -> dict[str, dict]:
    """Per worker: texts/s at the batch, ms for one text, and both as times over the fastest
    tinyt artifact's at the same thread count (above 1: slower than tinyt)."""
    ours = {e.name for e in engines if e.ours}
    rows = {label: {"texts_per_s": batch / statistics.median(t[0]),
                    "latency_ms": 1e3 * statistics.median(t[1])} for label, t in raw.items()}
    for label, row in rows.items():
        n = label.rsplit("@", 1)[1]
        mine = {k: v for k, v in rows.items() if k.endswith(f"@{n}") and k.split("@")[0] in ours}
        if not mine:
            continue
        fast = max(mine, key=lambda k: mine[k]["texts_per_s"])
        quick = min(mine, key=lambda k: mine[k]["latency_ms"])
        row.update(batch_vs_tinyt=mine[fast]["texts_per_s"] / row["texts_per_s"],
                   batch_tinyt=fast.split("@")[0],
                   latency_vs_tinyt=row["latency_ms"] / mine[quick]["latency_ms"],
                   latency_tinyt=quick.split("@")[0])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers.encoders",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("st_dir", nargs="?", type=Path,
                    help="a sentence-transformers directory (default: random weights at --shape)")
    ap.add_argument("--shape", choices=list(SHAPES), default="minilm")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/encoders"))
    ap.add_argument("--rounds", type=int, default=8, help="0: the same-embeddings check only")
    ap.add_argument("--threads", type=int, action="append", help="repeat (default 1 and 2)")
    ap.add_argument("--engine", action="append",
                    help=f"one of {', '.join(ENCODER_ENGINES)} (repeat)")
    ap.add_argument("--block", type=int, default=3, help="timed calls per call and round")
    ap.add_argument("--settle", type=int, default=1, help="untimed calls before them")
    ap.add_argument("--python", help="the peers' python (default: .venv-encoder-peers' if any)")
    ap.add_argument("--train", type=int, default=0, metavar="STEPS",
                    help="SimCSE-train the directory for STEPS steps first (default 0: as it is; "
                    "benchmarks/peers/encoder_weights.py)")
    ap.add_argument("--keep", type=Path, help="make and keep the artifacts here (default: a "
                    "temporary folder)")
    args = ap.parse_args()
    try:
        run(args.st_dir, args.out, shape=args.shape, threads=args.threads, rounds=args.rounds,
            block=args.block, settle=args.settle, engines=args.engine, python=args.python,
            work=args.keep, train_steps=args.train)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
