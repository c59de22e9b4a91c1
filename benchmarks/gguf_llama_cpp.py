"""A GGUF file's logits through tinyt against llama.cpp's own on the same file and tokens
(issue 51): does an imported GGUF compute what llama.cpp computes?

    GGUF ──tinyt import-hf → export──▶ fp32 graph (the blocks dequantized, fp32 products)
         ──quantize --gguf-blocks --mode weight-only──▶ the blocks carried, fp32 products
         ──quantize --gguf-blocks──▶ the blocks carried, int8 activations (accuracy_level 4)
         ──quantize --gguf-blocks --mode weight-only --activations q8──▶ the blocks carried,
           the activations rounded as llama.cpp's q8_0 / q8_1 (export/gguf_activations.py)
         ──llama-cpp-python (logits of every position)──▶ llama.cpp's logits

    python -m tinyt.benchmarks.gguf_llama_cpp MODEL.gguf WORK [--q4-0] [--out DIR]

--q4-0 also writes MODEL with its Q4_1 matrices as Q4_0 (the gguf package's port of
llama.cpp's reference quantizer) and measures that file the same way. The measure, per position:
max |tinyt − llama.cpp| / max |llama.cpp's logits|. llama.cpp quantizes each activation row
to 8 bits in blocks of 32 (q8_0 / q8_1) for its products with 4-bit weights and keeps the KV
cache in f16, so its logits are not the dequantized model's: the fp32 graph against llama.cpp
shows what that arithmetic moves, the int8-activation graph whether tinyt's own int8 products
(also blocks of 32, one scale each) land nearer, and the q8-activation graph that arithmetic
emulated (compared with llama.cpp's f32 KV cache too, where the f16 one's rounding is gone).
Each graph's time for the prompts (one pass each, median of 3) and for one decode step
after the longest says what the emulation costs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PROMPTS = ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n-1) + fibonacci(n-2)\n",
           "The year 2026 had 365 days; pi is 3.14159. The capital of France is Paris, and",
           "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n"
           "<|im_start|>assistant\n",
           "Once upon a time, in a small village by the sea, there lived an old fisherman who",
           "Photosynthesis is the process by which green plants, algae and some bacteria turn "
           "light into chemical energy. In the chloroplasts, chlorophyll absorbs mostly blue and "
           "red light; water is split, oxygen is released, and the energy is stored in ATP and "
           "NADPH, which the Calvin cycle then uses to fix carbon dioxide into sugars. Because "
           "the reactions depend on temperature, light and the supply of water, the rate"]
GRAPHS = {"fp32": "onnx", "weight-only": "wo", "int8-activations": "dyn",
          "q8-activations": "q8"}  # graph: WORK/dir
Q4_0 = 2  # general.file_type: llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_0


def tinyt_cli(*args) -> None:
    done = subprocess.run([sys.executable, "-m", "tinyt", *map(str, args)],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tinyt {' '.join(map(str, args))}: {done.stderr[-2000:]}")


def make_graphs(gguf: Path, work: Path, graphs=tuple(GRAPHS)) -> dict[str, Path]:
    """import-hf, export, and the --gguf-blocks graphs named in `graphs`, each made once
    under work."""
    steps = [("ck", ("import-hf", gguf, work / "ck")),
             ("onnx", ("export", work / "ck", work / "onnx")),
             ("wo", ("quantize", work / "onnx", work / "wo", "--bits", 4, "--block-size", 32,
                     "--gguf-blocks", "--mode", "weight-only")),
             ("dyn", ("quantize", work / "onnx", work / "dyn", "--bits", 4, "--block-size", 32,
                      "--gguf-blocks")),
             ("q8", ("quantize", work / "onnx", work / "q8", "--bits", 4, "--block-size", 32,
                     "--gguf-blocks", "--mode", "weight-only", "--activations", "q8"))]
    wanted = {"ck", *(GRAPHS[g] for g in graphs)}
    for out, args in steps:
        made = work / out / ("config.json" if out == "ck" else "manifest.json")
        if out in wanted and not made.is_file():
            tinyt_cli(*args)
    return {g: work / GRAPHS[g] for g in graphs}


def tokenize(work: Path) -> list[list[int]]:
    from tinyt.checkpoint import load_checkpoint

    tok = load_checkpoint(work / "ck").tokenizer
    return [tok.encode(p) for p in PROMPTS]


def tinyt_logits(onnx_dir: Path, ck: Path, prompts: list[list[int]], threads: int
                 ) -> tuple[list[np.ndarray], dict]:
    """Every position's logits of onnx_dir's model.onnx for each prompt from an empty cache;
    the time of the prompts' passes (all of them, ms, median of 3); and the longest prompt
    again one token at a time: the median ms of a step, and how far its logits are from the
    one pass's (relative, as `relative`: the graph against itself in another order of sums)."""
    import onnxruntime as ort

    from tinyt.checkpoint import load_checkpoint
    from tinyt.contract import DECODER_WITH_PAST
    from tinyt.runtime.feeds import prefill_feeds, step_feeds

    cfg = load_checkpoint(ck).config
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(str(onnx_dir / "model.onnx"), opts,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    feeds = [prefill_feeds(cfg, DECODER_WITH_PAST, np.array([ids], np.int64)) for ids in prompts]
    passes = []
    for _ in range(3):
        t0 = time.perf_counter()
        outs = [session.run(names, f) for f in feeds]
        passes.append(time.perf_counter() - t0)
    ids = max(prompts, key=len)
    step = prefill_feeds(cfg, DECODER_WITH_PAST, np.array([ids[:1]], np.int64))
    last, rows, times = session.run(names, step), [], []
    rows.append(last[0][0, -1])
    for t in ids[1:]:
        step = step_feeds(DECODER_WITH_PAST, step, np.array([t]), names, last)
        t0 = time.perf_counter()
        last = session.run(names, step)
        times.append(time.perf_counter() - t0)
        rows.append(last[0][0, -1])
    logits = [o[0][0] for o in outs]
    alone = relative(np.array(rows), logits[prompts.index(ids)])
    return logits, {"prompts_ms": 1e3 * float(np.median(passes)),
                    "step_ms": 1e3 * float(np.median(times)),
                    "steps_vs_one_pass_max": float(alone.max())}


def llama_cpp_logits(gguf: Path, prompts: list[list[int]], threads: int,
                     kv: str = "f16", batch: int | None = None) -> list[np.ndarray]:
    """llama.cpp's logits at every position of each prompt (one batch each, or `batch` tokens
    at a time; logits_all), its KV cache f16 (its default) or f32, the extra buffer types
    (repacked weights) on."""
    import llama_cpp

    n_ctx = max(map(len, prompts))
    kv_type = {"f16": 1, "f32": 0}[kv]  # ggml_type
    batch = batch or n_ctx
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=batch, n_ubatch=batch,
                          n_threads=threads, n_threads_batch=threads, logits_all=True,
                          type_k=kv_type, type_v=kv_type, verbose=False)
    out = []
    for ids in prompts:
        llm.reset()  # n_tokens 0: eval then drops the whole cache before it decodes
        llm.eval(ids)
        out.append(np.array(llm.scores[:len(ids)], np.float32))
    llm.close()
    return out


def requantize(src: Path, dst: Path, to: str = "Q4_0", layers: int | None = None) -> Path:
    """src with each Q4_1 matrix as `to`: Q4_0 (dequantized, then quantized by the gguf
    package's port of llama.cpp's quantize_row_q4_0_ref), every other tensor and field as it
    is (the tied Q8_0 table too); or F32, every quantized matrix dequantized (llama.cpp then
    multiplies fp32 by fp32, its activations never made 8-bit); or "same", the types kept.
    layers: only the first `layers` blocks (block_count with them), the model cut short, its
    final norm and head kept; made once."""
    import gguf
    from gguf.quants import dequantize, quantize

    if dst.is_file():
        return dst
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE and to != "same":
            value = Q4_0 if to == "Q4_0" else 0  # LLAMA_FTYPE_ALL_F32
        if field.name == gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch) and layers is not None:
            value = layers
        writer.add_key_value(field.name, value, field.types[0],
                             sub_type=field.types[-1] if len(field.types) > 1 else None)
    Q = gguf.GGMLQuantizationType
    for t in reader.tensors:
        if layers is not None and t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        if to == "F32" and t.tensor_type in (Q.Q4_0, Q.Q4_1, Q.Q8_0):
            writer.add_tensor(t.name, dequantize(t.data, t.tensor_type).astype(np.float32))
        elif to == "Q4_0" and t.tensor_type == Q.Q4_1:
            data = quantize(dequantize(t.data, Q.Q4_1), Q.Q4_0)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=Q.Q4_0)
        else:
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def relative(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per position: max |got − want| / max |want|."""
    return np.abs(got - want).max(-1) / np.abs(want).max(-1)


def _row(logits, theirs, fp32) -> dict:
    rel = np.concatenate([relative(a, b) for a, b in zip(logits, theirs)])
    to_fp32 = np.concatenate([relative(a, b) for a, b in zip(logits, fp32)])
    top1 = np.mean(np.concatenate([a.argmax(-1) == b.argmax(-1) for a, b in zip(logits, theirs)]))
    return {"vs_llama_cpp_max": float(rel.max()), "vs_llama_cpp_median": float(np.median(rel)),
            "vs_llama_cpp_positions_le_1e-3": float(np.mean(rel <= 1e-3)),
            "top1_equal_llama_cpp": float(top1), "vs_fp32_graph_max": float(to_fp32.max())}


def compare(gguf: Path, work: Path, threads: int, graphs=tuple(GRAPHS)) -> dict:
    """One GGUF file: each tinyt graph in `graphs` (the fp32 one always) against llama.cpp on
    the file, and the fp32 graph against llama.cpp on the file's weights dequantized (an F32
    file: no 8-bit activations) with its f16 and with an f32 KV cache."""
    graphs = make_graphs(gguf, work, ("fp32", *(g for g in graphs if g != "fp32")))
    prompts = tokenize(work)
    ran = {g: tinyt_logits(d, work / "ck", prompts, threads) for g, d in graphs.items()}
    ours = {g: logits for g, (logits, _) in ran.items()}
    theirs = {kv: llama_cpp_logits(gguf, prompts, threads, kv) for kv in ("f16", "f32")}
    rows = {f"{g} | {gguf.name}, KV {kv}": {**_row(x, theirs[kv], ours["fp32"]), **ran[g][1]}
            for kv in ("f16", "f32") for g, x in ours.items()}
    # llama.cpp against itself: the same tokens one at a time (its decode kernels), KV f32
    steps = llama_cpp_logits(gguf, prompts, threads, "f32", batch=1)
    self_rel = np.concatenate([relative(a, b) for a, b in zip(steps, theirs["f32"])])
    theirs = theirs["f16"]
    f32 = requantize(gguf, work / (gguf.stem + ".F32.gguf"), "F32")
    dequantized = {kv: llama_cpp_logits(f32, prompts, threads, kv) for kv in ("f16", "f32")}
    for kv, logits in dequantized.items():
        rows[f"fp32 | the same dequantized (F32 file), KV {kv}"] = _row(
            ours["fp32"], logits, ours["fp32"])
    # llama.cpp against itself: the file against its dequantized weights, both KV f16 (what
    # its 8-bit activations alone move)
    own = np.concatenate([relative(a, b) for a, b in zip(dequantized["f16"], theirs)])
    return {"gguf": gguf.name, "positions": int(sum(map(len, prompts))),
            "llama_cpp_steps_vs_one_pass_max": float(self_rel.max()),
            "llama_cpp_steps_vs_one_pass_median": float(np.median(self_rel)),
            "llama_cpp_file_vs_its_f32_max": float(own.max()),
            "llama_cpp_file_vs_its_f32_median": float(np.median(own)),
            "largest_logit": float(max(np.abs(t).max() for t in theirs)), "graphs": rows}


def report(results: dict) -> str:
    cpu, v = results["cpu"], results["versions"]
    lines = ["# tinyt's GGUF import against llama.cpp's logits", "",
             f"{cpu['model']}; flags {', '.join(k for k, on in cpu.items() if on is True)}; "
             f"{results['physical_cores']} cores, load average {results['load_average']}; "
             f"{results['time']}; " + ", ".join(f"{k} {x}" for k, x in v.items())
             + f"; {results['threads']} thread(s). Per position: max |tinyt − llama.cpp| / "
             "max |llama.cpp's logits|.", "",
             "| file | tinyt graph | llama.cpp on | positions | max | median | positions ≤ 1e-3 "
             "| top-1 = llama.cpp | vs tinyt fp32 graph (max) | prompts ms | step ms "
             "| its steps vs its one pass (max) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in results["files"]:
        for g, r in f["graphs"].items():
            timed = (f"{r['prompts_ms']:.1f} | {r['step_ms']:.1f} | "
                     f"{r['steps_vs_one_pass_max']:.2e}") if "step_ms" in r else " | | "
            lines.append(f"| {f['gguf']} | {g} | {f['positions']} | {r['vs_llama_cpp_max']:.2e} "
                         f"| {r['vs_llama_cpp_median']:.2e} | "
                         f"{100 * r['vs_llama_cpp_positions_le_1e-3']:.1f}% | "
                         f"{100 * r['top1_equal_llama_cpp']:.1f}% | "
                         f"{r['vs_fp32_graph_max']:.2e} | {timed} |")
    lines += ["", "llama.cpp on each file against llama.cpp on its dequantized F32 file (both KV "
              "f16: its 8-bit activations alone): " + "; ".join(
                  f"{f['gguf']} max {f['llama_cpp_file_vs_its_f32_max']:.2e}, median "
                  f"{f['llama_cpp_file_vs_its_f32_median']:.2e}" for f in results["files"]),
              "", "llama.cpp on each file, the longest prompt's tokens one at a time against its "
              "one pass (KV f32): " + "; ".join(
                  f"{f['gguf']} max {f['llama_cpp_steps_vs_one_pass_max']:.2e}, median "
                  f"{f['llama_cpp_steps_vs_one_pass_median']:.2e}" for f in results["files"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tinyt.benchmarks.gguf_llama_cpp",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--q4-0", action="store_true", help="also its Q4_1 matrices as Q4_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from .environment import environment

    files = [compare(args.gguf, args.work / "file", args.threads)]
    if args.q4_0:
        q = requantize(args.gguf, args.work / (args.gguf.stem + ".Q4_0.gguf"))
        files.append(compare(q, args.work / "q4_0", args.threads))
    results = {**environment(("tinyt", "numpy", "onnxruntime", "llama-cpp-python"),
                             threads=args.threads, load_average=list(os.getloadavg())),
               "files": files}
    text = report(results)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        (args.out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
