"""The `tinyt` command line. Thin: parse, call one library function, print.

Torch and the other heavy modules are imported inside the verb that needs them, so
`tinyt --help` is instant and works on a torch-free install.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from tinyt.errors import TinytError, memory_failure

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="tinyt: train a small Transformer, export it to ONNX, run it fast.")

DEFAULT_CKPT = Path("artifacts/checkpoint")


@app.command()
def presets() -> None:
    """List the model presets and their shapes."""
    from tinyt.config import DEFAULT_PRESET, PRESETS

    for name, kw in PRESETS.items():
        mark = " (default)" if name == DEFAULT_PRESET else ""
        typer.echo(f"{name}{mark}: model {kw['model']}  train {kw['train']}")


@app.command()
def train(
    out: Annotated[Path, typer.Option(help="Checkpoint directory to write.")] = DEFAULT_CKPT,
    preset: Annotated[str, typer.Option(
        help="Named preset: test, demo, llama-demo, article, gpt2-small (tinyt presets).")
    ] = "demo",
    data: Annotated[Optional[Path], typer.Option(
        help="Text file or directory (classifier: a directory with one subdirectory per "
             "label). Default: the Python standard library's source.")] = None,
    task: Annotated[str, typer.Option(help="causal_lm or classifier.")] = "causal_lm",
    tokenizer: Annotated[Optional[str], typer.Option(help="bpe or byte.")] = None,
    max_steps: Annotated[Optional[int], typer.Option(min=1)] = None,
    batch_size: Annotated[Optional[int], typer.Option(min=1)] = None,
    learning_rate: Annotated[Optional[float], typer.Option("--lr")] = None,
    n_layer: Annotated[Optional[int], typer.Option(min=1)] = None,
    n_head: Annotated[Optional[int], typer.Option(min=1)] = None,
    n_embd: Annotated[Optional[int], typer.Option(min=1)] = None,
    n_kv_head: Annotated[Optional[int], typer.Option(
        min=1, help="Key/value heads (divides --n-head; 1 = multi-query).")] = None,
    n_inner: Annotated[Optional[int], typer.Option(
        min=1, help="MLP width (SwiGLU: the intermediate size).")] = None,
    block_size: Annotated[Optional[int], typer.Option(min=2)] = None,
    vocab_size: Annotated[Optional[int], typer.Option(min=2)] = None,
    pos_encoding: Annotated[Optional[str], typer.Option(
        help="learned, sinusoidal or rotary (Llama's; the llama-demo preset has the whole "
             "Llama form).")] = None,
    dropout: Annotated[Optional[float], typer.Option()] = None,
    eval_interval: Annotated[Optional[int], typer.Option(min=1)] = None,
    seed: Annotated[Optional[int], typer.Option(min=0)] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu or cuda.")] = None,
    resume: Annotated[bool, typer.Option(
        help="Continue the run saved in --out with its saved settings.")] = False,
    stop_after: Annotated[Optional[int], typer.Option(
        min=1, help="Stop after this step, leaving a checkpoint to --resume.")] = None,
) -> None:
    """Train a causal LM (default) or a classifier; torchrun runs it data-parallel."""
    from tinyt import data as D
    from tinyt.config import preset as get_preset

    overrides = dict(
        tokenizer=tokenizer, max_steps=max_steps, batch_size=batch_size,
        learning_rate=learning_rate, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
        n_kv_head=n_kv_head, n_inner=n_inner, block_size=block_size, vocab_size=vocab_size,
        pos_encoding=pos_encoding,
        dropout=dropout, eval_interval=eval_interval, seed=seed, device=device,
    )
    given = sorted(k for k, v in overrides.items() if v is not None)
    if resume and given:
        raise TinytError(f"--resume continues the saved run with its saved settings; "
                         f"drop {', '.join('--' + k.replace('_', '-') for k in given)}")
    num_labels = len(D.classification_labels(data)) if task == "classifier" else 0
    model_cfg, train_cfg = get_preset(preset, task=task, num_labels=num_labels, **overrides)
    from tinyt.train import train as run_training  # torch: only once the settings are valid

    run_training(model_cfg, train_cfg, out, data=None if data is None else str(data),
                 resume=resume, stop_after=stop_after, log=lambda s: typer.echo(s, err=True))
    typer.echo(f"checkpoint: {out}")


@app.command()
def sample(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint directory.")] = DEFAULT_CKPT,
    prompt: Annotated[str, typer.Option(help="Text to continue.")] = "def ",
    max_new_tokens: Annotated[int, typer.Option(min=0)] = 200,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.8,
    top_k: Annotated[Optional[int], typer.Option(min=1)] = 50,
    seed: Annotated[int, typer.Option(min=0)] = 0,
) -> None:
    """Continue a prompt with the PyTorch model (KV cache), for a quick look at a checkpoint."""
    from tinyt.torch_sampling import sample_text

    typer.echo(sample_text(checkpoint, prompt, max_new_tokens=max_new_tokens,
                           temperature=temperature, top_k=top_k, seed=seed))


@app.command("import-nanogpt")
def import_nanogpt(
    ckpt_pt: Annotated[Path, typer.Argument(help="nanoGPT's ckpt.pt (as its train.py writes).")],
    out: Annotated[Path, typer.Argument(help="tinyt checkpoint directory to write.")],
    tokenizer: Annotated[str, typer.Option(
        help="tokenizer.json matching the model's vocabulary, or 'byte' for the 256 bytes "
             "(plus an end-of-text id when the model has more than 256).")] = ...,
) -> None:
    """Import a nanoGPT checkpoint (loaded with weights_only=True) as a tinyt checkpoint."""
    from tinyt.nanogpt import import_nanogpt as run_import

    path = run_import(ckpt_pt, out, tokenizer=tokenizer, log=lambda s: typer.echo(s, err=True))
    typer.echo(f"checkpoint: {path}")


@app.command("import-hf")
def import_hf(
    directory: Annotated[Path, typer.Argument(help="Local Hugging Face directory of a "
                                                   "GPT2LMHeadModel, LlamaForCausalLM, "
                                                   "Qwen2ForCausalLM, MistralForCausalLM, "
                                                   "Qwen3ForCausalLM, SmolLM3ForCausalLM, "
                                                   "GraniteForCausalLM, Gemma3ForCausalLM, "
                                                   "Gemma2ForCausalLM, Phi3ForCausalLM or "
                                                   "BertModel, or a sentence-transformers "
                                                   "directory around a BertModel "
                                                   "(config.json, "
                                                   "model.safetensors or shards, tokenizer.json "
                                                   "[+ tokenizer_config.json]; GPT-2 may have "
                                                   "vocab.json + merges.txt).")],
    out: Annotated[Path, typer.Argument(help="tinyt checkpoint directory to write.")],
    context: Annotated[Optional[int], typer.Option(
        help="Keep a shorter context than the model's max_position_embeddings: N tokens, 2 to "
             "the model's (exact for the positions kept: rotary positions are computed, a "
             "learned GPT-2 table keeps its first N rows; refused where a rope scaling depends "
             "on the context). Recorded in the checkpoint's metrics as context and "
             "model_context. Default: the model's whole context; the stages and the runtime "
             "cost what a call uses either way (tinyt serve / generate --max-context bound "
             "what they hold).")] = None,
) -> None:
    """Import a Hugging Face directory (safetensors) of one of the families tinyt runs:
    GPT2LMHeadModel; LlamaForCausalLM (SmolLM2, TinyLlama, Llama 3.x with rope_scaling llama3 /
    linear / dynamic / yarn), Qwen2ForCausalLM (windowed layers too), MistralForCausalLM,
    Qwen3ForCausalLM, SmolLM3ForCausalLM, GraniteForCausalLM, Gemma3ForCausalLM,
    Gemma2ForCausalLM, Phi3ForCausalLM (Phi-3 / 3.5 / Phi-4-mini), Olmo2ForCausalLM; the
    encoders BertModel, DistilBertModel, RobertaModel, XLMRobertaModel, ModernBertModel (a
    sentence-transformers directory too) and their classification heads. Anything else tinyt's
    model does not implement is refused by name (tests/core/test_family_lists.py keeps this
    list the catalogue's)."""
    from tinyt.hf import import_hf as run_import

    path = run_import(directory, out, context=context, log=lambda s: typer.echo(s, err=True))
    typer.echo(f"checkpoint: {path}")


@app.command("export-hf")
def export_hf(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint directory: a causal LM, or "
                                                    "an imported encoder or classifier.")],
    out: Annotated[Path, typer.Argument(help="Hugging Face directory to write.")],
) -> None:
    """Write a checkpoint as a Hugging Face directory (safetensors): the class it was
    imported as, else GPT2LMHeadModel or the first of LlamaForCausalLM, Qwen2ForCausalLM,
    MistralForCausalLM, Qwen3ForCausalLM, SmolLM3ForCausalLM, GraniteForCausalLM,
    Gemma3ForCausalLM, Gemma2ForCausalLM, Phi3ForCausalLM, Olmo2ForCausalLM that holds it
    exactly; encoders as
    BertModel, DistilBertModel, RobertaModel, XLMRobertaModel, ModernBertModel (in
    sentence-transformers' layout when they pool) or their classification heads. For
    transformers, CTranslate2, llama.cpp's converter, vLLM. Its outputs are checked first."""
    import json

    from tinyt.hf import to_hf

    path = to_hf(checkpoint, out, log=lambda s: typer.echo(s, err=True))
    meta = json.loads((path / "config.json").read_text())
    key, worst = next((k, v) for k, v in meta["tinyt"].items() if k.endswith("_max_abs_diff"))
    typer.echo(f"{key.removesuffix('_max_abs_diff')} max abs diff vs tinyt: {worst:.2e}")
    typer.echo(f"huggingface: {path}")


@app.command("export")
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


@app.command()
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


@app.command()
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
                        **({"fuse_embedding": True} if fuse_embedding else {}))
    manifest = path.manifest  # the stage says what it did
    if target == "gqa":
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
        typer.echo(f"onnx: {path}")
        return
    typer.echo(f"fusions: {manifest['fusions'] or 'none'}")
    typer.echo(f"contrib ops: {', '.join(manifest['contrib_ops']) or 'none'}")
    name, w = max(manifest["equivalence"]["worst"].items(), key=lambda kv: kv[1]["max_abs"])
    size = manifest["equivalence"]["sizes"]
    typer.echo(f"max abs diff vs input graph: {w['max_abs']:.2e} at {name} (its fp32 "
               f"rounding bound {w['bound']:.2e}; sequences of up to "
               f"{size['longest_sequence']} tokens, positions up to {size['highest_position']} "
               f"of the context {size['context']})")
    typer.echo(f"onnx: {path}")


@app.command()
def package(
    src: Annotated[Path, typer.Argument(help="Artifact directory (exported, optimized or "
                                             "quantized).")],
    out: Annotated[Path, typer.Argument(help="Package directory to write.")],
    format: Annotated[str, typer.Option(help="ort (ONNX Runtime mobile format + operator "
                                             "list), triton (model repository), onnx, or web "
                                             "(a page + ES module on ONNX Runtime Web).")
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
        decoders = ("decoder_with_past", "decoder", "decoder_gqa")
        what = "greedy tokens" if manifest.get("graph") in decoders else "outputs"
        typer.echo(f"checked under {web['checked']['runtime']} with onnxruntime-web "
                   f"{web['onnxruntime_web']}: tokenizer ids and {what} equal tinyt's")
        for note in web["notes"]:
            typer.echo(f"note: {note}")
        typer.echo(f"package: {path}")
        if serve:
            from tinyt.export.web.serve import serve_dir
            serve_dir(path, port)
        return
    eq = manifest["equivalence"]
    worst = max(w["max_abs"] for w in eq["worst"].values())
    bound = min(w["bound"] for w in eq["worst"].values())
    typer.echo(f"files: {', '.join(manifest['files'])}")
    if manifest.get("fixed_shape"):
        typer.echo(f"pinned: {manifest['fixed_shape']} (at most "
                   f"{manifest['capacity_tokens']} tokens per sequence)")
    typer.echo(f"max abs diff vs source graph: {worst:.2e} "
               f"(fp32 rounding bound {bound:.2e} at the smallest output)")
    typer.echo(f"package: {path}")


@app.command()
def quantize(
    src: Annotated[Path, typer.Argument(help="Exported or cpu-optimized artifact directory.")],
    out: Annotated[Path, typer.Argument(help="Quantized artifact directory to write.")],
    bits: Annotated[int, typer.Option(help="8, or 4 for the smallest footprint.")] = 8,
    block_size: Annotated[int, typer.Option(help="Weights per scale (power of two >= 16).")] = 64,
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
             "with the source that every classifier reports on built-in text.")] = None,
    kernel: Annotated[str, typer.Option(
        help="dynamic int8: nbits (MatMulNBits, block-wise; fastest per decode step on small "
             "models), qgemm (DynamicQuantizeMatMul, per channel; ~3x faster matmuls on a "
             "prompt) or qgemm-rows (the same GEMM, activations scaled per row: each row of a "
             "batch as if alone; the graph 'tinyt serve' batches best).")] = "nbits",
    max_loss_increase: Annotated[Optional[float], typer.Option(
        help="Try the variants and keep the fastest whose validation loss is at most this "
             "fraction above the source's (0.02 = +2%; classifier: accuracy points; encoder: "
             "the recall@10 it may lose).")] = None,
) -> None:
    """Quantize weights (the tied embedding / lm_head once) and report the accuracy change."""
    from tinyt.export.quantize import quantize as run_quantize
    from tinyt.export.search import quantize_search

    data_arg = None if data is None else str(data)
    choices = dict(bits=bits, block_size=block_size, mode=mode, exclude=exclude or [],
                   calibration=calibration, per_channel=per_channel, reduce_range=reduce_range,
                   kernel=kernel, keep_8bit=keep_8bit or [], scheme=scheme,
                   scale_search=scale_search)
    if max_loss_increase is not None:
        path = quantize_search(src, out, max_loss_increase=max_loss_increase, data=data_arg,
                               **choices)
    else:
        path = run_quantize(src, out, data=data_arg, **choices)
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
    typer.echo(f"size: {q['bytes']:,} bytes = {q['size_ratio']:.1%} of the source")
    for key, value in a.items():
        if isinstance(value, float):
            typer.echo(f"{key:30s} {value:.4f}" if abs(value) >= 1e-3 or value == 0
                       else f"{key:30s} {value:.2e}")
    if "meets_targets" in a:  # an encoder's report: on what, and against which bar
        typer.echo(f"measured on {a['texts']} texts ({a['queries']} queries, {a['passages']} "
                   f"passages of {a['data']}), cut at {a['max_length']} tokens; targets "
                   + ", ".join(f"{m} >= {t}" for m, t in a["targets"].items())
                   + (": met" if a["meets_targets"] else ": NOT met"))
    typer.echo(f"onnx: {path}")


@app.command("serve")
def serve_cmd(
    artifact: Annotated[Path, typer.Argument(help="Causal-LM artifact directory (the "
                                                  "shared-cache pair batches best), or an "
                                                  "encoder's (POST /v1/embeddings).")],
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")]
        = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="0: any free port.")] = 8000,
    threads: Annotated[Optional[int], typer.Option(min=1, help="Default: physical cores.")]
        = None,
    max_batch: Annotated[Optional[int], typer.Option(
        min=1, help="Rows in the running batch (default 8); an encoder: inputs per run "
                    "(default 32).")] = None,
    max_queue: Annotated[int, typer.Option(min=1, help="Requests waiting for a row before "
                                                       "429.")] = 64,
    prefill_tokens: Annotated[int, typer.Option(
        min=1, help="Prompt tokens admitted between two decode steps (at least one "
                    "request's): bounds the running rows' wait.")] = 64,
    prefill_chunk: Annotated[Optional[int], typer.Option(
        min=1, help="Prompts in pieces of N tokens, one piece between two decode steps "
                    "(shared-cache graphs): the running rows wait for one piece at most.")]
        = None,
    api_key: Annotated[Optional[str], typer.Option(
        help="Require 'Authorization: Bearer KEY' (default: $TINYT_API_KEY, else none).",
        envvar="TINYT_API_KEY")] = None,
    model_id: Annotated[Optional[str], typer.Option(
        help="The model name clients send (default: the artifact directory's name).")] = None,
    max_context: Annotated[Optional[int], typer.Option(
        min=2, help="Tokens per request, prompt + generated (default: the model's context, at "
                    "most 4096). The engine's KV cache is --max-batch rows of it, allocated at "
                    "start; refused there if it does not fit the machine's memory. "
                    "GET /v1/models reports it as max_model_len.")] = None,
    prefix_cache_mb: Annotated[Optional[int], typer.Option(
        min=0, help="MiB of recent prompts' and finished sequences' keys and values kept, so "
                    "a prompt starting with them copies their rows instead of computing them "
                    "(default 256 where that is exact: shared-cache graphs whose prompt graph "
                    "has no per-tensor activation scales; 0: off).")] = None,
) -> None:
    """Serve ARTIFACT over an OpenAI-compatible HTTP API with continuous batching (no torch
    needed; the `serve` extra)."""
    try:
        from tinyt.server import serve
    except ImportError as e:
        raise TinytError(f"tinyt serve needs the serve extra ({e.name} is missing): pip install "
                         "'tinyt[cpu,serve]'") from None
    if api_key is not None and not api_key.strip():
        raise TinytError("--api-key is empty; give a key or leave the option out")
    serve(artifact, host=host, port=port, threads=threads, max_batch=max_batch,
          max_queue=max_queue, prefill_tokens=prefill_tokens, prefill_chunk=prefill_chunk,
          max_context=max_context, api_key=api_key, model_id=model_id,
          prefix_cache_mb=prefix_cache_mb)


@app.command("generate")
def generate_cmd(
    artifact: Annotated[Path, typer.Argument(help="Causal-LM artifact directory.")],
    prompt: Annotated[str, typer.Argument(help="Text to continue.")],
    max_new_tokens: Annotated[int, typer.Option(min=0)] = 64,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.8,
    top_k: Annotated[Optional[int], typer.Option(min=1)] = 50,
    top_p: Annotated[Optional[float], typer.Option()] = None,
    repetition_penalty: Annotated[float, typer.Option()] = 1.0,
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop string (repeatable).")] = None,
    seed: Annotated[Optional[int], typer.Option(min=0)] = None,
    provider: Annotated[str, typer.Option(help="cpu, cuda, tensorrt or auto.")] = "cpu",
    threads: Annotated[Optional[int], typer.Option(min=1, help="Default: physical cores.")]
        = None,
    tune: Annotated[bool, typer.Option(
        help="Shared-cache artifacts: time each phase's threads and graph at load and keep "
             "the fastest of those at least as accurate as the defaults (--no-tune: every "
             "phase at exactly --threads).")] = True,
    tune_speed: Annotated[bool, typer.Option(
        "--tune-speed", help="With tuning: decode through a pair's prompt graph when faster "
                             "even if its accuracy report is worse.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                          help="Say what each phase runs with.")] = False,
    max_context: Annotated[Optional[int], typer.Option(
        min=2, help="Tokens the sequence may hold, prompt + generated (default: the model's "
                    "context); the KV buffers hold what this call reaches either way.")] = None,
    logprobs: Annotated[Optional[int], typer.Option(
        min=0, max=20, help="Print one JSON object instead of the text: the continuation, its "
                            "finish reason and each token with its log-probability and the N "
                            "most likely tokens there.")] = None,
    json_schema: Annotated[Optional[Path], typer.Option(
        help="A JSON Schema file: the continuation is compact JSON valid under it "
             "(constrained decoding; needs llguidance, the serve or structured extra).")]
        = None,
) -> None:
    """Stream a continuation of PROMPT with ONNX Runtime (no torch needed)."""
    import tinyt.runtime as rt

    if tune_speed and not tune:
        raise TinytError("--tune-speed times the graphs; it cannot go with --no-tune")
    lm = rt.load(artifact, provider=provider, threads=threads,
                 tune="speed" if tune_speed else tune, max_context=max_context)
    if not isinstance(lm, rt.LanguageModel):
        encoder = isinstance(lm, rt.Encoder)
        raise TinytError(f"{artifact} is {'an encoder' if encoder else 'a classifier'}; use "
                         f"'tinyt {'embed' if encoder else 'classify'}'")
    if provider == "auto" or verbose:
        typer.echo(f"provider: {lm.provider}", err=True)
    if verbose and lm.plan is not None:
        typer.echo(f"plan: {lm.plan.describe()}; measured ms: {lm.plan.measured_ms}", err=True)
    schema = None
    if json_schema is not None:
        try:
            schema = json.loads(json_schema.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TinytError(f"--json-schema {json_schema}: not a readable JSON file ({e})") \
                from None
    settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                    top_p=top_p, repetition_penalty=repetition_penalty, stop=stop or (),
                    seed=seed, **({} if schema is None else {"json_schema": schema}))
    if logprobs is not None:
        (r,) = lm.generate_details([prompt], logprobs=logprobs, **settings)
        text = lm.tokenizer.decode

        def one(token: int, value: float) -> dict:
            return {"id": token, "text": text([token]), "logprob": value}
        typer.echo(json.dumps({"text": r.text, "finish_reason": r.finish_reason, "tokens": [
            {**one(lp.token, lp.logprob), "top": [one(t, v) for t, v in lp.top]}
            for lp in r.logprobs or []]}, ensure_ascii=False))
        return
    pieces = lm.stream(prompt, **settings)
    typer.echo(prompt, nl=False)
    for piece in pieces:
        typer.echo(piece, nl=False)
    typer.echo()


@app.command("classify")
def classify_cmd(
    artifact: Annotated[Path, typer.Argument(help="Classifier artifact directory.")],
    texts: Annotated[list[str], typer.Argument(help="Texts to classify.")],
    provider: Annotated[str, typer.Option(help="cpu, cuda, tensorrt or auto.")] = "cpu",
) -> None:
    """Label each TEXT with the classifier, with its probability."""
    import tinyt.runtime as rt

    clf = rt.load(artifact, provider=provider)
    if isinstance(clf, rt.TokenClassifier):  # a label per token: one line each
        for text, tokens in zip(texts, clf.tag(texts)):
            typer.echo(f"{text!r}")
            for t in tokens:
                typer.echo(f"  {t.token}\t{t.label}\t{t.probability:.3f}\t{t.start}:{t.end}")
        return
    if not isinstance(clf, rt.Classifier):
        encoder = isinstance(clf, rt.Encoder)
        raise TinytError(f"{artifact} is {'an encoder' if encoder else 'a language model'}; "
                         f"use 'tinyt {'embed' if encoder else 'generate'}'")
    preds = clf.classify(texts)
    for text, p in zip(texts, preds):
        short = text if len(text) <= 40 else text[:37] + "..."
        typer.echo(f"{p.label}\t{p.probabilities[p.label]:.3f}\t{short!r}")


@app.command("embed")
def embed_cmd(
    artifact: Annotated[Path, typer.Argument(help="Encoder artifact directory.")],
    texts: Annotated[Optional[list[str]], typer.Argument(help="Texts to embed.")] = None,
    file: Annotated[Optional[Path], typer.Option(
        "--file", help="Embed each line of this UTF-8 file (after any TEXTs).")] = None,
    normalize: Annotated[Optional[bool], typer.Option(
        "--normalize/--no-normalize", help="Scale to unit length (default: the model's own "
                                           "choice).")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Texts per run.")] = 32,
    provider: Annotated[str, typer.Option(help="cpu, cuda, tensorrt or auto.")] = "cpu",
    threads: Annotated[Optional[int], typer.Option(min=1, help="Intra-op threads (default: "
                                                              "the physical cores).")] = None,
) -> None:
    """Print each text's sentence embedding as a JSON line: {"text", "embedding"}."""
    import json

    import tinyt.runtime as rt

    items = list(texts or [])
    if file is not None:
        try:
            items += file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise TinytError(f"--file {file}: cannot read it as UTF-8 text ({e})") from None
    if not items:
        raise TinytError("nothing to embed: give TEXT arguments or --file")
    enc = rt.load(artifact, provider=provider, threads=threads)
    if not isinstance(enc, rt.Encoder):
        raise TinytError(f"{artifact} is not an encoder; use 'tinyt "
                         f"{'classify' if isinstance(enc, rt.Classifier) else 'generate'}'")
    vectors = enc.embed(items, normalize=normalize, batch_size=batch_size)
    for text, v in zip(items, vectors):
        typer.echo(json.dumps({"text": text, "embedding": [float(x) for x in v]},
                              ensure_ascii=False))


@app.command()
def pipeline(
    out: Annotated[Path, typer.Option(help="Output directory for every stage.")]
        = Path("artifacts"),
    preset: Annotated[str, typer.Option(
        help="Model preset: test, demo, llama-demo, article, gpt2-small.")] = "demo",
    data: Annotated[Optional[Path], typer.Option(
        help="Your text corpus (default: the Python standard library's source).")] = None,
    skip_train: Annotated[Optional[Path], typer.Option(
        help="Use this checkpoint instead of training.")] = None,
    no_bench: Annotated[bool, typer.Option("--no-bench", help="Skip the quick benchmark.")]
        = False,
) -> None:
    """The main job: train, export, optimize, quantize, verify, benchmark, report. Re-runs
    skip stages whose inputs have not changed and resume an interrupted training."""
    from tinyt.app.pipeline import pipeline as run_pipeline

    report = run_pipeline(out, preset=preset, data=None if data is None else str(data),
                          skip_train=skip_train, bench=not no_bench,
                          log=lambda s: typer.echo(s, err=True))
    typer.echo(report.read_text())
    typer.echo(f"report: {report}")


@app.command()
def bench(
    artifacts: Annotated[Path, typer.Argument(help="Directory holding checkpoint/, onnx/ and the "
                                                   "other stages' outputs.")] = Path("artifacts"),
    out: Annotated[Optional[Path], typer.Option(
        help="Where the results go (default benchmarks/results/cpu, or .../peers with "
             "--peers).")] = None,
    mode: Annotated[str, typer.Option(help="quick (< 1 min) or full.")] = "quick",
    rounds: Annotated[Optional[int], typer.Option(
        min=0, help="Interleaved rounds: per shape, each round 3 untimed + 5 timed calls per "
             "variant (default quick 6, full 20); with --peers, each round 1 untimed + 3 "
             "timed calls per engine and shape (default 8; 0: greedy agreement only); with "
             "--serving, requests per client and level (default 4).")] = None,
    peers: Annotated[bool, typer.Option(
        "--peers", help="tinyt against CTranslate2, ONNX Runtime GenAI and PyTorch on the same "
                        "weights, each engine in its own process (extra 'peers').")] = False,
    serving: Annotated[bool, typer.Option(
        "--serving", help="tinyt serve against a naive thread-per-request server on "
                          "ARTIFACTS/onnx-int8-rows-gqa, closed-loop clients at concurrency 1-16 "
                          "(extra 'serve').")] = False,
) -> None:
    """Latency and throughput of PyTorch and every ONNX Runtime variant, side by side; with
    --peers, tinyt against the engines a user would pick instead; with --serving, the server
    under load."""
    if serving:
        from tinyt.benchmarks.serving import markdown
        from tinyt.benchmarks.serving import run as run_serving

        target = artifacts / "onnx-int8-rows-gqa"  # the graph the engine batches prompts with
        if not (target / "manifest.json").is_file():
            raise TinytError(f"{target} is missing: run `tinyt pipeline --out {artifacts}`")
        result = run_serving(target, out or Path("benchmarks/results/serving"),
                             requests=4 if rounds is None else rounds)
        typer.echo(markdown(result))
        return
    out = out or Path("benchmarks/results") / ("peers" if peers else "cpu")
    if peers:
        from tinyt.benchmarks.peers import run as run_peers

        run_peers(artifacts, out, rounds=8 if rounds is None else rounds)
        typer.echo((out / "peers.md").read_text())
        return
    from tinyt.benchmarks.harness import MODES, run

    if mode not in MODES:
        raise TinytError(f"--mode {mode} is not one of {', '.join(MODES)}")
    if rounds == 0:
        raise TinytError("--rounds 0 times nothing; give at least 1 (0 is for --peers: "
                         "greedy agreement only)")
    result = run(artifacts, out, mode=mode, rounds=rounds)
    for name, t in result["targets"].items():
        if name != "shape":
            measured = "n/a" if t["measured"] is None else f"{t['measured']:.2f}"
            typer.echo(f"{name:32s} {measured:>6s}  target {t['target']}  met {t['met']}")
    typer.echo(f"results: {out / 'results.json'}, {out / 'results.md'}")


@app.command()
def info() -> None:
    """Versions, ONNX Runtime providers, and the CPU features that decide INT8 settings."""
    import importlib.metadata as md
    import platform

    from tinyt import __version__
    from tinyt.hardware import cpu_features, int8_preset

    typer.echo(f"tinyt {__version__}, Python {platform.python_version()}")
    for dist in ("torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "tokenizers"):
        try:
            typer.echo(f"  {dist:16s} {md.version(dist)}")
        except md.PackageNotFoundError:
            typer.echo(f"  {dist:16s} not installed")
    try:
        import onnxruntime as ort

        from tinyt.runtime import installation_problems

        typer.echo(f"onnxruntime providers: {', '.join(ort.get_available_providers())}")
        for problem in installation_problems():
            typer.echo(f"problem: {problem}")
    except ImportError:
        typer.echo("onnxruntime providers: onnxruntime is not installed (extra 'cpu' or 'gpu')")
    features = cpu_features()
    exact = features.pop("u8s8_exact")
    typer.echo(f"cpu: {features.pop('model') or 'unknown'} ({features.pop('machine')})")
    typer.echo("  " + "  ".join(f"{k}={'yes' if v else 'no'}" for k, v in features.items()))
    typer.echo("int8 u8 x s8 products (measured): " + {
        True: "exact", None: "unknown (no onnxruntime)",
        False: "saturate (16-bit pair sums): 8-bit int8-GEMM graphs are refused here"}[exact])
    typer.echo(f"int8 preset: {int8_preset()}")


def run(interrupted: list[bool]) -> None:
    """Run the CLI: tinyt's errors, and an allocation a library could not make, exit 2 with
    one line; Ctrl-C (`interrupted` is appended to
    by the SIGINT handler) exits 130 with one line, whatever the library was doing when it came
    (torch's exporter, for one, turns a KeyboardInterrupt inside it into errors of its own),
    and earlier outputs stay intact."""
    try:
        app()
    except SystemExit as e:
        if interrupted and e.code != 0:
            _exit_interrupted(e)
        raise
    except TinytError as e:
        if interrupted:
            _exit_interrupted(e)
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except BaseException as e:
        if interrupted:
            _exit_interrupted(e)
        failed = memory_failure(e) if isinstance(e, Exception) else None
        if failed is not None:  # ONNX Runtime / numpy / torch could not allocate: one line
            typer.echo(f"error: {failed}", err=True)
            sys.exit(2)
        raise


def _exit_interrupted(e: BaseException) -> None:
    """One line, the notes of the interrupted work (train says which step it kept), exit 130."""
    notes, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        notes += getattr(e, "__notes__", [])
        e = e.__cause__ or e.__context__
    typer.echo("interrupted: " + ("; ".join(notes) or "the output being written was "
                                  "discarded; outputs already written are intact"), err=True)
    sys.exit(130)

