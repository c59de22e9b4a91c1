"""The `tinyt` verbs that make artifacts from artifacts: export, verify, optimize, package,
quantize (registered on the one app in app/cli.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tinyt.errors import TinytError
from tinyt.recipe import DEFAULT_BLOCK, SPEECH_BLOCK


def export_cmd(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint directory.")],
    out: Annotated[Path, typer.Argument(help="ONNX artifact directory to write.")],
    opset: Annotated[int, typer.Option(help="ONNX opset to write.")] = 18,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Causal LM without KV cache I/O (input_ids, attention_mask -> "
                           "logits).")] = False,
    external_data: Annotated[Optional[bool], typer.Option(
        "--external-data/--single-file",
        help="Weights in model.onnx.data beside the graph (default: when they pass ~1.8 GB, "
             "below protobuf's 2 GB limit).")] = None,
) -> None:
    """Export a checkpoint to ONNX (KV-cache decoder, no-cache decoder, or classifier)."""
    from tinyt.export import export_onnx

    path = export_onnx(checkpoint, out, opset=opset, with_past=not no_cache,
                       external_data=external_data)
    typer.echo(f"onnx: {path}")


def verify(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint directory.")],
    onnx_dir: Annotated[Path, typer.Argument(help="ONNX artifact directory.")],
    report: Annotated[Optional[Path], typer.Option(
        help="JSON report path (default: ONNX_DIR/../NAME-verify.json).")] = None,
) -> None:
    """Compare ONNX Runtime with PyTorch on a grid of shapes and greedy generation; exits 1 on
    a mismatch, naming the worst case."""
    from tinyt.export import verify as run_verify

    report = report or onnx_dir.parent / f"{onnx_dir.name}-verify.json"
    result = run_verify(checkpoint, onnx_dir, report_path=report)
    for name, worst in result["worst"].items():
        typer.echo(f"{name:28s} max abs diff {worst['max_abs']:.2e}  (worst at {worst['case']})")
    size = result["sizes"]
    typer.echo(f"checked sequences of up to {size['longest_sequence']} tokens (batch up to "
               f"{size['batch']}, positions up to {size['highest_position']}) of the context "
               f"{size['context']}")
    for g in result["generation"]:
        typer.echo(f"greedy {g['tokens']:3d} tokens from {g['prompt']!r}: "
                   f"{'identical' if g['identical'] else 'DIFFERENT'}")
    typer.echo(f"report: {report}")
    if not result["passed"]:
        typer.echo("FAILED: " + "; ".join(result["failures"]), err=True)
        raise typer.Exit(1)
    typer.echo("passed")


def _say_gqa(manifest, src: Path, prefill_from: Optional[Path]) -> None:
    """What optimize --target gqa did: its check, its pair's, its int8 cache's."""
    eq = manifest["equivalence"]
    typer.echo(f"GroupQueryAttention with a shared KV cache in {manifest['layers']} layers; "
               f"logits max abs diff vs input graph {eq['logits_max_abs']:.2e} (tolerance "
               f"{eq['tolerance']:.3g}"
               + (f": the quantization's own distance from {eq['fp32_source']}"
                  if eq['tolerance'] == eq.get("quantization_vs_fp32_max_abs") else "")
               + f"; prompts + steps of up to "
               f"{eq['sizes']['longest_sequence']} tokens of the context "
               f"{eq['sizes']['context']}), greedy agreement {eq['greedy_agreement']:.0%}")
    if "pair" in manifest:
        p = manifest["pair"]
        typer.echo(f"prompts run by {manifest['prefill_model_file']} (from {prefill_from}); "
                   f"the pair vs {src}: logits max abs diff {p['logits_max_abs']:.2e}, "
                   f"top-1 agreement {p['top1_agreement']:.0%}")
    if "kv_cache" in manifest:
        kv = manifest["kv_cache"]
        c = kv["check"]
        typer.echo(f"int8 KV cache ({kv['scales']}, calibrated on {kv['calibration']['tokens']}"
                   f" tokens of {kv['calibration']['data']}): logits max abs diff vs the "
                   f"float32 cache {c['logits_max_abs']:.3g} (tolerance "
                   f"{c['tolerance']:.3g}), top-1 agreement {c['top1_agreement']:.0%}")


def optimize(
    src: Annotated[Path, typer.Argument(help="Exported artifact directory (tinyt export).")],
    out: Annotated[Path, typer.Argument(help="Optimized artifact directory to write.")],
    target: Annotated[str, typer.Option(help="cpu (fused contrib ops), portable (standard "
                                             "ONNX ops only) or gqa (the shared-KV-cache "
                                             "variant of a cpu-optimized or quantized "
                                             "artifact).")] = "cpu",
    level: Annotated[str, typer.Option(help="ONNX Runtime offline optimization: basic, "
                                            "extended or all (all: this CPU only).")] = "extended",
    prefill_from: Annotated[Optional[Path], typer.Option(
        help="gqa: another quantization of the same model (quantize --kernel qgemm) whose "
             "graph runs the prompts, sharing the KV cache with SRC's.")] = None,
    kv_cache: Annotated[str, typer.Option(
        help="gqa: the KV cache's type, float32 or int8 (scales per layer calibrated on "
             "--kv-data's training split; docs/quantization.md).")] = "float32",
    kv_scales: Annotated[str, typer.Option(
        help="--kv-cache int8: per-channel (a scale per kv head and channel) or "
             "per-tensor.")] = "per-channel",
    kv_data: Annotated[Optional[str], typer.Option(
        help="--kv-cache int8: the corpus to calibrate on (default: the one the source's "
             "quantization read, else the built-in one).")] = None,
    kv_clip: Annotated[str, typer.Option(
        help="--kv-cache int8: each channel's range, mse (least squared error of the int8 "
             "cache over the calibration) or max (max |x| x 1.25, as before).")] = "mse",
    fuse_embedding: Annotated[bool, typer.Option(
        help="An encoder with a position table (BERT, DistilBERT, RoBERTa): its embeddings in "
             "one EmbedLayerNormalization (off: slower on CPU, and not quantized).")] = False,
) -> None:
    """Fuse attention / LayerNorm / GELU and apply ONNX Runtime's graph optimizations; the
    result is checked against the input graph before it is written."""
    from tinyt.export.optimize import optimize as run_optimize

    if prefill_from is not None and target != "gqa":
        raise TinytError("--prefill-from goes with --target gqa")
    path = run_optimize(src, out, target=target, level=level, prefill_from=prefill_from,
                        **({"fuse_embedding": True} if fuse_embedding else {}),
                        **({"kv_cache": kv_cache, "kv_scales": kv_scales, "kv_data": kv_data,
                            "kv_clip": kv_clip}
                           if (kv_cache, kv_scales, kv_data, kv_clip)
                           != ("float32", "per-channel", None, "mse") else {}))
    manifest = path.manifest  # the stage says what it did
    if target == "gqa":
        _say_gqa(manifest, src, prefill_from)
        typer.echo(f"onnx: {path}")
        return
    worst = manifest["equivalence"]["worst"]
    if manifest.get("graph") == "seq2seq":  # three graphs: each one's fusions, its worst
        for file, attention in manifest["attention"].items():
            typer.echo(f"{file}: attention fused {attention}; fusions "
                       f"{manifest['fusions'][file] or 'none'}")
        worst = {f"{file} {group}": w for file, groups in worst.items()
                 for group, w in groups.items()}
    else:
        typer.echo(f"fusions: {manifest['fusions'] or 'none'}")
    typer.echo(f"contrib ops: {', '.join(manifest['contrib_ops']) or 'none'}")
    name, w = max(worst.items(), key=lambda kv: kv[1]["max_abs"])
    size = manifest["equivalence"]["sizes"]
    typer.echo(f"max abs diff vs input graph: {w['max_abs']:.2e} at {name} (its fp32 "
               f"rounding bound {w['bound']:.2e}; sequences of up to "
               f"{size['longest_sequence']} tokens, positions up to {size['highest_position']} "
               f"of the context {size['context']})")
    typer.echo(f"onnx: {path}")


def package(
    src: Annotated[Path, typer.Argument(help="Artifact directory (exported, optimized or "
                                             "quantized).")],
    out: Annotated[Path, typer.Argument(help="Package directory to write.")],
    format: Annotated[str, typer.Option(help="ort (ONNX Runtime mobile format + operator "
                                             "list), triton (model repository), onnx, web "
                                             "(a page + ES module on ONNX Runtime Web), or "
                                             "transformers-js (an encoder-decoder as "
                                             "transformers.js loads it), or genai (a "
                                             "Whisper as ONNX Runtime GenAI loads it).")
                      ] = "ort",
    fixed: Annotated[Optional[list[str]], typer.Option(
        help="Pin an axis, AXIS=N (repeat): batch_size, sequence_length, "
             "past_sequence_length.")] = None,
    name: Annotated[Optional[str], typer.Option(help="Triton model name.")] = None,
    device: Annotated[str, typer.Option(help="Triton instance kind: cpu or gpu.")] = "cpu",
    instances: Annotated[int, typer.Option(min=1, help="Triton instances of the model.")] = 1,
    max_batch_size: Annotated[int, typer.Option(min=1, help="Triton dynamic batching limit "
                                                     "(classifier, no-cache decoder).")] = 8,
    serve: Annotated[bool, typer.Option(
        "--serve", help="web: then host OUT on 127.0.0.1 with the cross-origin isolation "
                        "headers WebAssembly threads need (Ctrl-C stops).")] = False,
    port: Annotated[int, typer.Option(min=0, max=65535, help="--serve: port (0: any free).")]
        = 8080,
) -> None:
    """Package an artifact for deployment: .ort for edge builds, a Triton model repository,
    a web page, or a graph with pinned shapes; checked against its source before it is
    written."""
    from tinyt.export.package import package as run_package

    if serve and format != "web":
        raise TinytError("--serve hosts a web package: use it with --format web")
    path = run_package(src, out, format=format, fixed=fixed, name=name, device=device,
                       instances=instances, max_batch_size=max_batch_size)
    manifest = path.manifest  # the stage says what it did
    if format == "web":
        web = manifest["web"]
        typer.echo(f"files: {', '.join(manifest['files'])}")
        decoders = ("decoder_with_past", "decoder", "decoder_gqa", "seq2seq")
        what = "greedy tokens" if manifest.get("graph") in decoders else "outputs"
        checked = ("log-mel features within the FFT's rounding and greedy tokens as tinyt's"
                   ", long audio window by window as tinyt transcribe's"
                   if "speech" in web else f"tokenizer ids and {what} equal tinyt's")
        typer.echo(f"checked under {web['checked']['runtime']} with onnxruntime-web "
                   f"{web['onnxruntime_web']}: {checked}")
        for note in web["notes"]:
            typer.echo(f"note: {note}")
        typer.echo(f"package: {path}")
        if serve:
            from tinyt.export.web.serve import serve_dir
            serve_dir(path, port)
        return
    eq = manifest["equivalence"]
    if format == "genai":
        typer.echo(f"files: {', '.join(manifest['files'])}")
        g = eq["greedy"]
        tie = " (parting at an int8 tie of tinyt's logits)" if g["ties"] or g.get(
            "wav_ties") else ""
        typer.echo(f"checked with onnxruntime-genai {manifest['versions']['onnxruntime_genai']}"
                   f": {g['tokens']} greedy tokens as tinyt's, fed log-mel features and fed a "
                   f"WAV through its own front end (audio_processor_config.json){tie}")
        typer.echo(f"package: {path}")
        return
    worst = max(w["max_abs"] for w in eq["worst"].values())
    bound = min(w["bound"] for w in eq["worst"].values())
    typer.echo(f"files: {', '.join(manifest['files'])}")
    if manifest.get("fixed_shape"):
        typer.echo(f"pinned: {manifest['fixed_shape']} (at most "
                   f"{manifest['capacity_tokens']} tokens per sequence)")
    typer.echo(f"max abs diff vs source graph: {worst:.2e} "
               f"(fp32 rounding bound {bound:.2e} at the smallest output)")
    for note in manifest.get("transformers_js", {}).get("notes", []):
        typer.echo(f"note: {note}")
    typer.echo(f"package: {path}")


def quantize(
    src: Annotated[Path, typer.Argument(help="Exported or cpu-optimized artifact directory.")],
    out: Annotated[Path, typer.Argument(help="Quantized artifact directory to write.")],
    bits: Annotated[int, typer.Option(help="8, or 4 for the smallest footprint.")] = 8,
    block_size: Annotated[Optional[int], typer.Option(
        help=f"Weights per scale (power of two >= 16; default {DEFAULT_BLOCK}, "
             f"{SPEECH_BLOCK} for a speech artifact's 8-bit tables).")] = None,
    mode: Annotated[str, typer.Option(help="dynamic (int8 activations at run time), "
                                           "weight-only (fp32 products) or static (QDQ, "
                                           "calibrated; from the plain export).")] = "dynamic",
    calibration: Annotated[str, typer.Option(help="static: minmax, entropy or percentile.")]
        = "minmax",
    per_channel: Annotated[bool, typer.Option(help="static: a scale per output channel.")] = True,
    reduce_range: Annotated[Optional[bool], typer.Option(
        help="static, and the qgemm kernels: 7-bit weights (default: from this CPU, see "
             "'tinyt info').")] = None,
    exclude: Annotated[Optional[list[str]], typer.Option(
        help="PyTorch module to leave in fp32, e.g. lm_head or transformer.h.0 (repeatable).")]
        = None,
    keep_8bit: Annotated[Optional[list[str]], typer.Option(
        "--keep-8bit",
        help="With --bits 4: a PyTorch module to keep at 8 bits, e.g. lm_head (a tied table "
             "then 8-bit for the embedding too) or transformer.h.0 (repeatable).")] = None,
    scheme: Annotated[Optional[str], typer.Option(
        help="How a block's weights map to levels: symmetric (+-max, 2^bits - 1 levels), "
             "symmetric-full (the largest-magnitude value at the lowest of 2^bits levels, as "
             "llama.cpp's q4_0) or asymmetric (min..max with a zero point per block, as "
             "q4_1; 4-bit only). Default: asymmetric at 4 bits, symmetric at 8.")] = None,
    scale_search: Annotated[Optional[bool], typer.Option(
        help="Each block's scale chosen for the least squared error (clips outliers where "
             "that rounds the rest finer). Default: on at 4 bits, off at 8.")] = None,
    data: Annotated[Optional[Path], typer.Option(
        help="Held-out data for the accuracy report (default: the built-in corpus); for a "
             "classifier, a directory per label, for its accuracy beside the label agreement "
             "with the source that every classifier reports on built-in text; for a Whisper, "
             "an audio file or a folder of them (default: espeak-ng's built-in sentences).")
        ] = None,
    kernel: Annotated[str, typer.Option(
        help="dynamic int8: nbits (MatMulNBits, block-wise; fastest per decode step on small "
             "models), qgemm (DynamicQuantizeMatMul, per channel; ~3x faster matmuls on a "
             "prompt) or qgemm-rows (the same GEMM, activations scaled per row: each row of a "
             "batch as if alone; the graph 'tinyt serve' batches best).")] = "nbits",
    max_loss_increase: Annotated[Optional[float], typer.Option(
        help="Try the variants and keep the fastest whose validation loss is at most this "
             "fraction above the source's (0.02 = +2%; classifier: accuracy points; encoder: "
             "the recall@10 it may lose).")] = None,
    gguf_blocks: Annotated[bool, typer.Option(
        "--gguf-blocks",
        help="A GGUF import's Q4_0 / Q4_1 / Q8_0 weights as MatMulNBits tables of their own "
             "blocks, not quantized again (needs --block-size 32); the rest by the recipe.")]
        = False,
    activations: Annotated[str, typer.Option(
        help="With --gguf-blocks --mode weight-only: q8 rounds the activations before each "
             "carried table as llama.cpp does (blocks of 32 to 8 bits, q8_0 / q8_1), so the "
             "model computes llama.cpp's logits on the same file; float leaves them fp32.")]
        = "float",
    awq: Annotated[bool, typer.Option(
        "--awq",
        help="With --bits 4 (a decoder): activation-aware scales per input channel, searched "
             "on each matmul's output error over calibration windows of the training split, "
             "folded into the norm before it where the graph allows.")] = False,
    max_mb: Annotated[Optional[float], typer.Option(
        help="With --bits 4 (a decoder): keep the weight tables whose 4 bits move the logits "
             "most at 8 bits while the model file stays within this many MB (10^6 bytes).")]
        = None,
) -> None:
    """Quantize weights (the tied embedding / lm_head once) and report the accuracy change."""
    choices = dict(bits=bits, block_size=block_size, mode=mode, exclude=exclude or [],
                   calibration=calibration, per_channel=per_channel, reduce_range=reduce_range,
                   kernel=kernel, keep_8bit=keep_8bit or [], scheme=scheme,
                   scale_search=scale_search)
    one = dict(gguf_blocks=gguf_blocks, awq=awq, activations=activations,
               max_bytes=None if max_mb is None else int(max_mb * 1e6))
    _say_quantized(_quantize_or_search(src, out, None if data is None else str(data),
                                       max_loss_increase, choices, one))


ONE_RECIPE = dict(gguf_blocks=False, awq=False, activations="float", max_bytes=None)


def _quantize_or_search(src: Path, out: Path, data: Optional[str],
                        max_loss_increase: Optional[float], choices: dict, one: dict):
    """One recipe (`one`: the options only one recipe takes, ONE_RECIPE when unset), or the
    search of --max-loss-increase."""
    from tinyt.export.quantize import quantize
    from tinyt.export.search import quantize_search

    if max_loss_increase is None:
        return quantize(src, out, data=data, **choices, **one)
    if one != ONE_RECIPE:
        from tinyt.errors import QuantizeError
        raise QuantizeError("--max-loss-increase searches recipes; --gguf-blocks (one table per "
                            "weight as the GGUF stores it), --activations, --awq and --max-mb "
                            "make one: use one or the other")
    return quantize_search(src, out, max_loss_increase=max_loss_increase, data=data, **choices)


def _say_quantized(path) -> None:
    """What the quantize stage did, from its manifest: the variants a search tried, the weights
    quantized, the size, the accuracy report."""
    manifest = path.manifest  # the stage says what it did
    q, a = manifest["quantization"], manifest["accuracy"]
    for t in manifest.get("search", {}).get("tried", []):
        typer.echo(f"tried {t['variant']:32s} " + (
            f"cost {t['cost']:+.4f}  {t.get('latency_ms', float('nan')):.3f} ms/step  "
            f"{'within' if t['within_budget'] else 'over'} budget" if "cost" in t
            else f"failed: {t['error']}"))
    if "search" in manifest:
        typer.echo(f"chosen: {manifest['search']['chosen']}")
    typer.echo(f"quantized {len(q['quantized'])} weight ops; excluded: "
               f"{', '.join(q['excluded']) or 'none'}; shared tables: {q['shared_tables']}")
    if q.get("kept_8bit"):
        typer.echo(f"kept at 8 bits: {', '.join(q['kept_8bit'])}")
    if "gguf_blocks" in q:
        g = q["gguf_blocks"]
        typer.echo(f"GGUF blocks carried as stored: {len(g['carried'])} tables; by the recipe: "
                   + (", ".join(f"{k} ({why})" for k, why in g["not_carried"].items()) or "none"))
        if g.get("activations_rounded"):
            typer.echo(f"activations rounded as llama.cpp's: {len(g['activations_rounded'])} "
                       f"products; RMSNorm means in double: {g.get('norms_in_double', 0)}")
    typer.echo(f"size: {q['bytes']:,} bytes = {q['size_ratio']:.1%} of the source")
    for key, value in a.items():
        if isinstance(value, float):
            typer.echo(f"{key:30s} {value:.4f}" if abs(value) >= 1e-3 or value == 0
                       else f"{key:30s} {value:.2e}")
    if "clips" in a:  # a Whisper's report: on what
        typer.echo(f"measured on {a['clips']} clips ({a['data']}), greedy, up to "
                   f"{a['max_new_tokens']} tokens a clip; WER / CER against fp32's transcripts")
    if "meets_targets" in a:  # an encoder's report: on what, and against which bar
        typer.echo(f"measured on {a['texts']} texts ({a['queries']} queries, {a['passages']} "
                   f"passages of {a['data']}), cut at {a['max_length']} tokens; targets "
                   + ", ".join(f"{m} >= {t}" for m, t in a["targets"].items())
                   + (": met" if a["meets_targets"] else ": NOT met"))
    typer.echo(f"onnx: {path}")
