"""The `tinyt` verbs that make or read checkpoints: train, sample, import-nanogpt, import-hf,
export-hf (registered on the one app in app/cli.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tinyt.errors import TinytError

DEFAULT_CKPT = Path("artifacts/checkpoint")


def train(
    out: Annotated[Path, typer.Option(help="Checkpoint directory to write.")] = DEFAULT_CKPT,
    preset: Annotated[Optional[str], typer.Option(
        help="Named preset: test, demo, llama-demo, seq2seq-demo, seq2seq-test, article, "
             "gpt2-small (tinyt presets). Default: demo; seq2seq-demo with --task seq2seq.")
    ] = None,
    data: Annotated[Optional[Path], typer.Option(
        help="Text file or directory (classifier: a directory with one subdirectory per "
             "label; seq2seq: a .tsv of source<TAB>target lines, a .jsonl of "
             "{\"source\", \"target\"} lines, or a directory of .py files). Default: the "
             "Python standard library's source (seq2seq: its functions -> the first "
             "sentence of their docstrings).")] = None,
    task: Annotated[Optional[str], typer.Option(
        help="causal_lm, classifier or seq2seq (encoder-decoder). Default: the preset's "
             "(causal_lm but for the seq2seq presets).")] = None,
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
    max_target_tokens: Annotated[Optional[int], typer.Option(
        min=2, help="seq2seq: targets' length limit in tokens, EOS included.")] = None,
    seed: Annotated[Optional[int], typer.Option(min=0)] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu or cuda.")] = None,
    resume: Annotated[bool, typer.Option(
        help="Continue the run saved in --out with its saved settings.")] = False,
    stop_after: Annotated[Optional[int], typer.Option(
        min=1, help="Stop after this step, leaving a checkpoint to --resume.")] = None,
) -> None:
    """Train a causal LM (default), a classifier or an encoder-decoder (seq2seq); torchrun
    runs it data-parallel."""
    from tinyt import data as D
    from tinyt.config import PRESETS
    from tinyt.config import preset as get_preset

    overrides = dict(
        tokenizer=tokenizer, max_steps=max_steps, batch_size=batch_size,
        learning_rate=learning_rate, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
        n_kv_head=n_kv_head, n_inner=n_inner, block_size=block_size, vocab_size=vocab_size,
        pos_encoding=pos_encoding, max_target_tokens=max_target_tokens,
        dropout=dropout, eval_interval=eval_interval, seed=seed, device=device,
    )
    given = sorted(k for k, v in overrides.items() if v is not None)
    if resume and given:
        raise TinytError(f"--resume continues the saved run with its saved settings; "
                         f"drop {', '.join('--' + k.replace('_', '-') for k in given)}")
    preset = preset or ("seq2seq-demo" if task == "seq2seq" else "demo")
    task = task or PRESETS.get(preset, {}).get("model", {}).get("task", "causal_lm")
    num_labels = len(D.classification_labels(data)) if task == "classifier" else 0
    model_cfg, train_cfg = get_preset(preset, task=task, num_labels=num_labels, **overrides)
    from tinyt.train import train as run_training  # torch: only once the settings are valid

    run_training(model_cfg, train_cfg, out, data=None if data is None else str(data),
                 resume=resume, stop_after=stop_after, log=lambda s: typer.echo(s, err=True))
    typer.echo(f"checkpoint: {out}")


def sample(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint directory.")] = DEFAULT_CKPT,
    prompt: Annotated[str, typer.Option(
        help="Text to continue (a seq2seq checkpoint: the source to map).")] = "def ",
    max_new_tokens: Annotated[int, typer.Option(min=0)] = 200,
    temperature: Annotated[Optional[float], typer.Option(
        help="0 = greedy. Default 0.8; a seq2seq checkpoint is greedy only.")] = None,
    top_k: Annotated[Optional[int], typer.Option(min=1)] = 50,
    seed: Annotated[int, typer.Option(min=0)] = 0,
) -> None:
    """Continue a prompt with the PyTorch model (KV cache), for a quick look at a checkpoint;
    a seq2seq checkpoint prints its greedy output for the prompt as source."""
    from tinyt.checkpoint import read_config
    from tinyt.torch_sampling import sample_text

    if temperature is None:
        temperature = 0.0 if read_config(checkpoint)[0].task == "seq2seq" else 0.8
    typer.echo(sample_text(checkpoint, prompt, max_new_tokens=max_new_tokens,
                           temperature=temperature, top_k=top_k, seed=seed))


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
                                                   "vocab.json + merges.txt); or a llama.cpp "
                                                   "GGUF file of a Llama (MODEL.gguf).")],
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
    sentence-transformers directory too) and their classification heads; the encoder-decoders
    BartForConditionalGeneration, MBartForConditionalGeneration, MarianMTModel (Opus-MT),
    M2M100ForConditionalGeneration (M2M100, NLLB), T5ForConditionalGeneration (T5, Flan-T5);
    speech: WhisperForConditionalGeneration (its tokens and generation_config.json kept).
    Anything else tinyt's model does not implement is refused by name
    (tests/core/test_family_lists.py keeps this list the catalogue's). A GGUF file (llama.cpp's;
    needs the gguf package) of a Llama is read the same way: its Q4_0 / Q4_1 / Q8_0 blocks are
    kept beside the fp32 weights for tinyt quantize to carry as they are."""
    from tinyt.hf import import_hf as run_import

    path = run_import(directory, out, context=context, log=lambda s: typer.echo(s, err=True))
    typer.echo(f"checkpoint: {path}")


def export_hf(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint directory: a causal LM, or "
                                                    "an imported encoder, classifier or "
                                                    "encoder-decoder.")],
    out: Annotated[Path, typer.Argument(help="Hugging Face directory to write.")],
) -> None:
    """Write a checkpoint as a Hugging Face directory (safetensors): the class it was
    imported as, else GPT2LMHeadModel or the first of LlamaForCausalLM, Qwen2ForCausalLM,
    MistralForCausalLM, Qwen3ForCausalLM, SmolLM3ForCausalLM, GraniteForCausalLM,
    Gemma3ForCausalLM, Gemma2ForCausalLM, Phi3ForCausalLM, Olmo2ForCausalLM that holds it
    exactly; encoders as
    BertModel, DistilBertModel, RobertaModel, XLMRobertaModel, ModernBertModel (in
    sentence-transformers' layout when they pool) or their classification heads;
    encoder-decoders as BartForConditionalGeneration, MBartForConditionalGeneration,
    MarianMTModel, M2M100ForConditionalGeneration or T5ForConditionalGeneration; speech
    as WhisperForConditionalGeneration. For
    transformers, CTranslate2, llama.cpp's converter, vLLM. Its outputs are checked first."""
    import json

    from tinyt.hf import to_hf

    path = to_hf(checkpoint, out, log=lambda s: typer.echo(s, err=True))
    meta = json.loads((path / "config.json").read_text())
    key, worst = next((k, v) for k, v in meta["tinyt"].items() if k.endswith("_max_abs_diff"))
    typer.echo(f"{key.removesuffix('_max_abs_diff')} max abs diff vs tinyt: {worst:.2e}")
    typer.echo(f"huggingface: {path}")
