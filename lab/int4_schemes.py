"""INT4 side by side: schemes, the scale search, block sizes and the tied table at 4 or 8 bits,
each with `tinyt quantize`'s own accuracy report against the source graph.

    .venv/bin/python -m lab.int4_schemes artifacts-llama/onnx-opt \
        --out benchmarks/results/int4-schemes-llama-demo-epyc-vnni

For every combination asked (default: the three schemes of export/blockquant.py, scale search
off and on, blocks 32 / 64 / 128, the table at 4 and at 8 bits): quantize (dynamic mode:
MatMulNBits, accuracy_level 4), then report the file's size against the source, the KL of the
next token's distribution from the source's, top-1 agreement, the validation loss change and
greedy agreement over the report's held-out prompts (export/accuracy.py), and (unless --rounds
0) one decode step's median time, all candidates timed interleaved in one process
(export/search.py latency_ms; at a demo size this is mostly ONNX Runtime's dispatch, so it
says little about the kernels: lab/step_kernels.py times the 4-bit kernels at a real
shape).
"""
from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path

from tinyt.benchmarks.environment import environment
from tinyt.export.blockquant import SCHEMES
from tinyt.export.quantize import quantize
from tinyt.export.search import latency_ms
from tinyt.manifest import check_manifest, read_model_config


def variant_name(scheme: str, search: bool, block: int, table_bits: int) -> str:
    return (f"{scheme}{'+search' if search else ''}-k{block}"
            f"{'-table8' if table_bits == 8 else ''}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="fp32 artifact (export or optimize --target cpu)")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--search", default="off,on", help="scale search: off, on or both")
    ap.add_argument("--blocks", default="32,64,128")
    ap.add_argument("--table-bits", default="4,8", help="the tied table / lm_head: 4, 8 or both")
    ap.add_argument("--threads", type=int, default=2, help="of the timed decode steps")
    ap.add_argument("--rounds", type=int, default=200,
                    help="timed steps per candidate (0: accuracy only, nothing timed)")
    ap.add_argument("--out", type=Path, help="write results.json and results.md here")
    args = ap.parse_args()
    schemes = args.schemes.split(",")
    unknown = sorted(set(schemes) - set(SCHEMES))
    if unknown:
        ap.error(f"--schemes {unknown}: allowed {', '.join(SCHEMES)}")
    if set(args.search.split(",")) - {"off", "on"}:
        ap.error("--search takes off, on or off,on")
    if set(args.table_bits.split(",")) - {"4", "8"}:
        ap.error("--table-bits takes 4, 8 or 4,8")
    searches = [s == "on" for s in args.search.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    tables = [int(b) for b in args.table_bits.split(",")]
    manifest = check_manifest(args.src)
    cfg, _ = read_model_config(args.src)
    rows, paths, report = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for scheme, search, block, table in itertools.product(schemes, searches, blocks, tables):
            name = variant_name(scheme, search, block, table)
            built = quantize(args.src, Path(tmp) / name, bits=4, block_size=block,
                             scheme=scheme, scale_search=search,
                             keep_8bit=["lm_head"] if table == 8 else [])
            m, a = built.manifest, built.manifest["accuracy"]
            report = a
            rows.append({"variant": name, "scheme": scheme, "scale_search": search,
                         "block_size": block, "table_bits": table,
                         "bytes": m["quantization"]["bytes"],
                         "size_ratio": m["quantization"]["size_ratio"],
                         **{k: a[k] for k in ("kl_divergence", "top1_agreement",
                                              "val_loss_change", "greedy_agreement")}})
            paths[name] = str(built / "model.onnx")
            print(f"{name}: KL {a['kl_divergence']:.2e}, greedy {a['greedy_agreement']:.1%}",
                  flush=True)
        ms = latency_ms(paths, cfg, manifest["graph"], rounds=args.rounds,
                        threads=args.threads) if args.rounds > 0 else {}
    for r in rows:
        r["decode_ms"] = ms.get(r["variant"])
    env = environment(("tinyt", "onnxruntime", "numpy"), threads=args.threads)
    cpu = env["cpu"]
    lines = [f"Source: {args.src} ({cfg.n_layer} layers x {cfg.n_embd}, vocabulary "
             f"{cfg.vocab_size}). CPU: {cpu['model']} (avx512_vnni={cpu['avx512_vnni']}, "
             f"amx_int8={cpu['amx_int8']}); onnxruntime {env['versions'].get('onnxruntime')}.",
             "", f"Accuracy against the source on {report['tokens']:,} held-out tokens "
             f"(windows of {report['window']}); greedy agreement over "
             f"{report['greedy_prompts']} prompts x {report['greedy_tokens']} tokens" + (
                 f"; decode ms: median of {args.rounds} interleaved steps at {args.threads} "
                 "threads." if ms else "."), "",
             "| variant | size of fp32 | KL | top-1 | loss change | greedy agreement |"
             + (" decode ms |" if ms else ""), "|---|---|---|---|---|---|" + ("---|" if ms else "")]
    for r in sorted(rows, key=lambda r: r["kl_divergence"]):
        lines.append(f"| {r['variant']} | {r['size_ratio']:.1%} | {r['kl_divergence']:.2e} | "
                     f"{r['top1_agreement']:.1%} | {r['val_loss_change']:+.2%} | "
                     f"{r['greedy_agreement']:.1%} |"
                     + (f" {r['decode_ms']:.3f} |" if ms else ""))
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text("\n".join(lines) + "\n")
        (args.out / "results.json").write_text(json.dumps(
            {"environment": env, "source": str(args.src), "variants": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
