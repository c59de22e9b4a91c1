"""What a shared-cache artifact holds in memory and how fast its phases run: the measure behind
docs/quantization.md's "the pair's weights once" (issue 51).

    # one artifact a fresh process: RSS (and USS / PSS) after the load, after a prompt of
    # PROMPT tokens and STEPS decode steps (4,096 together by default), then again once the
    # C heap's freed pages are handed back (runtime.session.return_freed_memory), and the peak
    .venv/bin/python -m lab.pair_memory memory DIR --threads 1 [--tune]
    # prefill of 128 tokens and decode ms/token, artifacts interleaved round by round
    .venv/bin/python -m lab.pair_memory speed DIR [DIR ...] --threads 1 --rounds 5
    # the same for the GenAI builder's artifact (a directory with genai_config.json)
    .venv/bin/python -m lab.pair_memory memory PEERS/genai-builder-int4 --threads 1
    # the process around a session: imports, then the tokenizer alone (before / after trim)
    .venv/bin/python -m lab.pair_memory parts DIR/tokenizer.json
    # one ONNX Runtime session alone on DIR's graph (tinyt's options, or plain ones with the
    # arena off for a GenAI directory): what it adds over the imports, freed heap handed back
    .venv/bin/python -m lab.pair_memory session DIR --threads 1
    # one Qwen3-0.6B layer's weight matmuls over 128 rows: the qgemm prompt graph's int8 GEMM
    # against the 4-bit MatMulNBits the one graph runs prompts with (lab/step_kernels.py kinds)
    .venv/bin/python -m lab.pair_memory kernels --prompt 128 --rounds 11

Memory is read in the measuring process itself, so run `memory` once a process (a fresh
interpreter each time: never inside a pytest worker, whose heap holds other tests' models).
Files: the bytes of every file the manifest lists. RSS counts a file page mapped twice
twice; PSS divides it among its mappings, USS counts only what no other process maps.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import psutil

from tinyt.manifest import read_manifest


def files_mb(directory: Path) -> float:
    """MB of the files the artifact's manifest lists (graphs, their data, config, tokenizer)."""
    return sum((directory / f).stat().st_size for f in read_manifest(directory)["files"]) / 1e6


def memory_mb() -> dict[str, float]:
    info = psutil.Process().memory_full_info()
    return {"rss": info.rss / 1e6, "uss": info.uss / 1e6, "pss": info.pss / 1e6}


def _ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def memory(directory: Path, threads: int, tune: bool, prompt: int, steps: int) -> dict:
    import tinyt.runtime as rt

    before = memory_mb()
    t = time.perf_counter()
    lm = rt.load(directory, threads=threads, tune=tune)
    load_s = time.perf_counter() - t
    loaded = memory_mb()
    cache = lm.new_cache(1, prompt + steps + 1)
    logits = cache.prefill([_ids(prompt, min(lm.tokenizer.vocab_size, lm.config.vocab_size))], 0)
    nxt, active = np.array([int(logits[0].argmax())]), np.array([True])
    for _ in range(steps):
        nxt = np.array([int(cache.step(nxt, active)[0].argmax())])
    after = memory_mb()
    from tinyt.runtime.session import return_freed_memory

    return_freed_memory()  # what the prompt pass freed (its attention scores, its MLP rows)
    return {"artifact": str(directory), "files_mb": round(files_mb(directory), 1),
            "threads": threads, "tune": tune, "load_s": round(load_s, 2),
            "plan": None if lm.plan is None else lm.plan.describe(),
            "sessions": 1 + (lm.prefill_session is not None),
            "before": before, "loaded": loaded, "tokens": prompt + steps, "after": after,
            "after_trimmed": memory_mb(),
            # ru_maxrss: kilobytes on Linux
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}


def genai_memory(directory: Path, threads: int, prompt: int, steps: int) -> dict:
    """memory()'s figures for ONNX Runtime GenAI on a directory with its genai_config.json
    (the GenAI builder's artifact), loaded as the peer benchmark's adapter loads it."""
    import onnxruntime_genai as og

    from tinyt.runtime.session import return_freed_memory

    before = memory_mb()
    t = time.perf_counter()
    config = og.Config(str(directory))
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(config)
    model_only = memory_mb()  # the peer benchmark's worker holds this: it makes no tokenizer
    tokenizer = og.Tokenizer(model)
    load_s = time.perf_counter() - t
    loaded = memory_mb()
    vocab = json.loads((directory / "genai_config.json").read_text())["model"]["vocab_size"]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt + steps + 1, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([_ids(prompt, vocab)], dtype=np.int32))
    for _ in range(steps):
        gen.generate_next_token()
    after = memory_mb()
    return_freed_memory()
    del tokenizer
    return {"artifact": str(directory), "files_mb": round(sum(
        f.stat().st_size for f in directory.iterdir() if f.is_file()) / 1e6, 1),
            "threads": threads, "load_s": round(load_s, 2), "before": before,
            "model_only": model_only, "loaded": loaded, "tokens": prompt + steps, "after": after,
            "after_trimmed": memory_mb(),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}


def parts(tokenizer_json: Path) -> dict:
    """What a loaded process holds besides its session, step by step in this fresh process:
    the interpreter, tinyt.runtime's imports, then `tokenizers.Tokenizer.from_file` of
    `tokenizer_json` alone, before and after malloc_trim hands back its parse's freed heap."""
    out = {"interpreter": memory_mb()}
    import tinyt.runtime  # noqa: F401  (numpy, onnxruntime, tokenizers and tinyt's modules)
    from tinyt.runtime.session import return_freed_memory

    out["imports"] = memory_mb()
    import tokenizers

    t = time.perf_counter()
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    out["from_file_s"] = round(time.perf_counter() - t, 3)
    out["tokenizer"] = memory_mb()
    return_freed_memory()
    out["tokenizer_trimmed"] = memory_mb()
    out["vocab"] = tok.get_vocab_size()
    del tok
    return_freed_memory()
    out["tokenizer_dropped"] = memory_mb()
    return out


def session(directory: Path, threads: int) -> dict:
    """What one ONNX Runtime session on DIR's graph holds, nothing else loaded (no tokenizer,
    no cache, no probe run): a tinyt artifact with the options rt.load gives it
    (session_options, tune=False), a GenAI directory (genai_config.json) with plain ones
    (threads, arena off); RSS over the imports once the load's freed heap is handed back."""
    import onnxruntime as ort

    from tinyt.runtime.session import open_artifact, return_freed_memory, session_options

    imports = memory_mb()
    if (directory / "genai_config.json").is_file():
        opts, model, options = ort.SessionOptions(), directory / "model.onnx", "plain"
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.enable_cpu_mem_arena, opts.log_severity_level = False, 3
    else:
        artifact = open_artifact(directory)
        opts = session_options(artifact, threads=threads, spinning=False, level=None)
        model, options = artifact.path / artifact.model_file, "tinyt"
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    loaded = memory_mb()
    return_freed_memory()
    trimmed = memory_mb()
    del sess
    data = model.with_name(model.name + ".data")  # the builder's external weights
    graph = model.stat().st_size + (data.stat().st_size if data.is_file() else 0)
    return {"artifact": str(directory), "graph_mb": round(graph / 1e6, 1),
            "options": options, "threads": threads, "imports": imports, "session": loaded,
            "session_trimmed": trimmed,
            "over_imports_mb": round(trimmed["rss"] - imports["rss"], 1)}


def speed(dirs: list[Path], threads: int, rounds: int, prompt: int, steps: int) -> dict:
    """Median ms of a `prompt`-token prefill and of one decode step (mean of `steps` after a
    prompt), each artifact loaded with tune=False (prompts through its prompt graph, if it
    has one), the artifacts taking turns every round; the first round is not kept."""
    import tinyt.runtime as rt

    lms = {str(d): rt.load(d, threads=threads, tune=False, spinning=False) for d in dirs}
    times: dict[str, dict[str, list[float]]] = {d: {"prefill": [], "decode": []} for d in lms}
    for r in range(rounds + 1):
        for d, lm in lms.items():
            ids = _ids(prompt, min(lm.tokenizer.vocab_size, lm.config.vocab_size), seed=r)
            cache = lm.new_cache(1, prompt + steps + 1)
            t = time.perf_counter()
            logits = cache.prefill([ids], 0)
            pre = time.perf_counter() - t
            nxt, active = np.array([int(logits[0].argmax())]), np.array([True])
            t = time.perf_counter()
            for _ in range(steps):
                nxt = np.array([int(cache.step(nxt, active)[0].argmax())])
            dec = (time.perf_counter() - t) / steps
            if r:
                times[d]["prefill"].append(pre * 1e3)
                times[d]["decode"].append(dec * 1e3)
    return {d: {k: {"median": round(statistics.median(v), 2), "min": round(min(v), 2),
                    "all": [round(x, 2) for x in v]} for k, v in t.items()}
            for d, t in times.items()} | {"threads": threads, "rounds": rounds,
                                           "prompt": prompt, "steps": steps}


# one Qwen3-0.6B layer's weight matmuls (name, K, N): q + k + v, o, gate + up, down
QWEN3_LAYER = [("qkv", 1024, 4096), ("o", 2048, 1024), ("gate_up", 1024, 6144),
               ("down", 3072, 1024)]
KERNELS = ("qgemm", "nbits-b4-k32-a4-z")  # the pair's prompt kernel, the INT4 graph's (asym.)


def kernels(rows: int, rounds: int, threads: int) -> dict:
    """Median and min ms of QWEN3_LAYER's matmuls over `rows` rows in each of KERNELS, one
    session each, interleaved round by round (the first run of each not kept)."""
    import onnx
    import onnxruntime as ort

    from lab.step_kernels import build

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    runs = {}
    for kind in KERNELS:
        model = onnx.load_from_string(build(kind, QWEN3_LAYER)[0])
        for v in (*model.graph.input, *model.graph.output):  # [1, K] -> [rows, K]
            v.type.tensor_type.shape.dim[0].dim_value = rows
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        feeds = {i.name: np.random.default_rng(1).standard_normal((rows, i.shape[1]))
                 .astype(np.float32) for i in sess.get_inputs()}
        runs[kind] = lambda s=sess, f=feeds: s.run(None, f)
        runs[kind]()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, run in runs.items():
            t = time.perf_counter()
            run()
            times[k].append((time.perf_counter() - t) * 1e3)
    return {k: {"median": round(statistics.median(v), 2), "min": round(min(v), 2)}
            for k, v in times.items()} | {"rows": rows, "threads": threads, "rounds": rounds,
                                          "layer": QWEN3_LAYER}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("memory", "speed", "kernels", "parts", "session"))
    ap.add_argument("dirs", nargs="*", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tune", action="store_true", help="memory: load as rt.load's default "
                    "does (the tuner's timed choices); else tune=False")
    ap.add_argument("--prompt", type=int, help="tokens of the prompt (memory: 4032, speed: 128)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.what == "kernels":
        out = kernels(args.prompt or 128, args.rounds, args.threads)
    elif args.what == "parts":
        if len(args.dirs) != 1:
            ap.error("parts: one tokenizer.json")
        out = parts(args.dirs[0])
    elif args.what == "session":
        if len(args.dirs) != 1:
            ap.error("session: one artifact a process")
        out = session(args.dirs[0], args.threads)
    elif args.what == "memory":
        if len(args.dirs) != 1:
            ap.error("memory: one artifact a process")
        measure = genai_memory if (args.dirs[0] / "genai_config.json").is_file() else \
            partial(memory, tune=args.tune)
        out = measure(args.dirs[0], args.threads, prompt=args.prompt or 4032, steps=args.steps)
    else:
        if not args.dirs:
            ap.error("speed: name the artifacts")
        out = speed(args.dirs, args.threads, args.rounds, args.prompt or 128, args.steps)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
