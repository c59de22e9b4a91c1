"""Training: AdamW (decay on matrices only), linear warmup + cosine decay, gradient clipping,
periodic validation and checkpointing, exact resume, and data parallelism under torchrun.

Batches are a pure function of (seed, step) (see `tinyt.data.lm_batch`), so a resumed run and a
data-parallel run see exactly the batches of one straight single-process run: under DDP each
rank takes its slice of the same global batch.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tinyt import data as D
from tinyt import seq2seq_data as S
from tinyt.checkpoint import (
    TrainState,
    has_train_state,
    load_checkpoint,
    load_train_state,
    read_train_config,
    save_checkpoint,
    unique_state_dict,
)
from tinyt.config import ModelConfig, TrainConfig
from tinyt.errors import ConfigError, DataError, NonFiniteError
from tinyt.model import build_model
from tinyt.seq2seq_task import Seq2SeqTask
from tinyt.tokenizer import Tokenizer


@dataclass(frozen=True)
class _Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def _dist_setup(device: str) -> _Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return _Dist()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return _Dist(dist.get_rank(), dist.get_world_size())


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to learning_rate, then cosine decay to min_lr at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    if cfg.max_steps <= cfg.warmup_steps:
        return cfg.learning_rate
    progress = (step - cfg.warmup_steps) / (cfg.max_steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + cosine * (cfg.learning_rate - cfg.min_lr)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (dim >= 2) and none on biases and LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))


class _LMTask:
    """Next-token prediction on a flat token stream."""

    def __init__(self, tok: Tokenizer, corpus: D.Corpus, cfg: ModelConfig):
        self.block = cfg.block_size
        self.train = D.encode_documents(tok, corpus.train)
        self.val = D.encode_documents(tok, corpus.val)
        D.check_lm_tokens(self.train, self.block, "train")
        D.check_lm_tokens(self.val, self.block, "validation")
        self.byte_len = torch.from_numpy(tok.token_byte_lengths())
        self.tokens_per_example = self.block

    def batch(self, seed: int, step: int, size: int):
        x, y = D.lm_batch(self.train, self.block, size, seed, step)
        return torch.from_numpy(x), torch.from_numpy(y)

    @staticmethod
    def loss(model, batch, reduction: str = "mean"):
        x, y = batch
        logits, _ = model(x)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction=reduction)

    @torch.no_grad()
    def evaluate(self, model, count: int, size: int, device) -> dict[str, float]:
        x, y = D.lm_eval_windows(self.val, self.block, count)
        nats, tokens, nbytes = 0.0, 0, 0
        for i in range(0, count, size):
            xb, yb = torch.from_numpy(x[i:i + size]), torch.from_numpy(y[i:i + size])
            nats += float(self.loss(model, (xb.to(device), yb.to(device)), "sum"))
            tokens += yb.numel()
            nbytes += int(self.byte_len[yb].sum())
        return {"val_loss": nats / tokens, "val_nats_per_byte": nats / max(nbytes, 1)}


class _ClassifierTask:
    """Which label a snippet has; batches padded on the right with an attention mask."""

    def __init__(self, tok: Tokenizer, data: D.ClassificationData, cfg: ModelConfig):
        self.pad = tok.eos_id if tok.eos_id is not None else 0
        self.block = cfg.block_size
        self.train = [(ids[:self.block], y) for ids, y in self._encode(tok, data.train)]
        self.val = [(ids[:self.block], y) for ids, y in self._encode(tok, data.val)]
        self.tokens_per_example = float(np.mean([len(ids) for ids, _ in self.train]))

    @staticmethod
    def _encode(tok, examples):
        ids = tok.encode_batch([t for t, _ in examples])
        return [(i, y) for i, (_, y) in zip(ids, examples) if i]

    def _collate(self, examples):
        T = max(len(ids) for ids, _ in examples)
        x = torch.full((len(examples), T), self.pad, dtype=torch.long)
        mask = torch.zeros((len(examples), T), dtype=torch.long)
        for row, (ids, _) in enumerate(examples):
            x[row, :len(ids)] = torch.tensor(ids)
            mask[row, :len(ids)] = 1
        return x, mask, torch.tensor([y for _, y in examples])

    def batch(self, seed: int, step: int, size: int):
        rng = np.random.default_rng([seed, step])
        return self._collate([self.train[i] for i in rng.integers(0, len(self.train), size)])

    @staticmethod
    def loss(model, batch, reduction: str = "mean"):
        x, mask, y = batch
        return F.cross_entropy(model(x, mask), y, reduction=reduction)

    @torch.no_grad()
    def evaluate(self, model, count: int, size: int, device) -> dict[str, float]:
        nats, correct = 0.0, 0
        for i in range(0, len(self.val), size):
            x, mask, y = (t.to(device) for t in self._collate(self.val[i:i + size]))
            logits = model(x, mask)
            nats += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(-1) == y).sum())
        return {"val_loss": nats / len(self.val), "val_accuracy": correct / len(self.val)}


def _slice(batch, rank: int, world: int):
    """This rank's equal share of a global batch (every tensor split along dim 0)."""
    n = batch[0].shape[0] // world
    return tuple(t[rank * n:(rank + 1) * n] for t in batch)


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' was requested but torch sees no CUDA device; "
                          "available: cpu")
    return torch.device(name)


def train(model_cfg: ModelConfig, train_cfg: TrainConfig, out: str | Path, *,
          data: str | None = None, resume: bool = False, stop_after: int | None = None,
          log: Callable[[str], None] = print) -> Path:
    """Train a model and write its checkpoint directory to `out` (also every eval_interval).

    resume=True continues the run saved in `out` with its saved configuration and data path.
    stop_after=K stops after step K as an interruption would, leaving a resumable checkpoint.
    """
    out = Path(out)
    if stop_after is not None and not (isinstance(stop_after, int) and stop_after >= 1):
        raise ConfigError(f"stop_after={stop_after!r} is invalid: None or an integer >= 1")
    # 1) the run: a new one, or the one saved in `out` (its config, tokenizer and data win)
    run, saved = _open_run(out, data, resume)
    tok = None
    if saved is not None:  # the saved settings win; the device is this machine's
        model_cfg, tok = saved.config, saved.tokenizer
        train_cfg = dataclasses.replace(read_train_config(out), device=train_cfg.device)
    # 2) processes and device; 3) data, tokenizer and the task they make
    dd = _dist_setup(train_cfg.device)
    if train_cfg.batch_size % dd.world:
        raise ConfigError(f"batch_size={train_cfg.batch_size} must be divisible by the "
                          f"{dd.world} data-parallel processes")
    device = _device(train_cfg.device)
    task, tok, model_cfg, labels = _make_task(model_cfg, train_cfg, run["data"], tok, dd, log)
    # 4) model and optimizer, restored on resume
    torch.manual_seed(train_cfg.seed)  # same initial weights on every rank
    model = build_model(model_cfg).to(device)
    optimizer = make_optimizer(model, train_cfg)
    r = _Run(out, model, model, optimizer, task, tok, labels, run, train_cfg, dd, device)
    if saved is not None:
        model.load_state_dict(saved.model.state_dict())
        r.step, r.train_cfg, r.history = load_train_state(out, model, optimizer)
        if dd.main:
            log(f"resuming {out} at step {r.step} of {r.train_cfg.max_steps}")
    if dd.world > 1:
        r.ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    if dd.main:
        log(f"model: {model.num_parameters():,} parameters, {model_cfg.to_dict()}")
    # 5) the loop: a step, then every eval_interval an evaluation and a checkpoint
    cfg = r.train_cfg
    last = cfg.max_steps if stop_after is None else min(stop_after, cfg.max_steps)
    bar = _progress(r.step, cfg.max_steps, enabled=dd.main)
    t_train, examples_done, loss_ema = 0.0, 0, None
    model.train()
    try:
        while r.step < last:
            t0 = time.perf_counter()
            value = _step(r)
            t_train += time.perf_counter() - t0
            examples_done += cfg.batch_size
            loss_ema = value if loss_ema is None else 0.9 * loss_ema + 0.1 * value
            tokens_per_s = examples_done * task.tokens_per_example / t_train
            bar.update(r.step, loss_ema, tokens_per_s)
            if r.step % cfg.eval_interval == 0 or r.step == last:
                _evaluate_and_save(r, bar, {"step": r.step, "train_loss": loss_ema,
                                            "tokens_per_s": tokens_per_s,
                                            "train_seconds": t_train})
    except KeyboardInterrupt as e:
        bar.close()
        kept = r.saved_step()
        e.add_note(f"training stopped at step {r.step}; " + (
            f"the checkpoint in {out} holds step {kept}: continue with --resume"
            if kept else "no checkpoint was written yet"))
        raise
    bar.close()
    model.eval()
    return out


@dataclass
class _Run:
    """What the steps of one training run share."""

    out: Path
    model: torch.nn.Module
    ddp_model: torch.nn.Module  # the model itself, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    task: Any
    tok: Tokenizer
    labels: list[str] | None
    run: dict[str, Any]  # how the run was made (data path): a resume reuses it
    train_cfg: TrainConfig
    dd: _Dist
    device: torch.device
    step: int = 0
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def saved_step(self) -> int | None:
        return self.history[-1]["step"] if self.history else None

    def diverged(self, what: str) -> NonFiniteError:
        lr = self.optimizer.param_groups[0]["lr"]
        kept = self.saved_step()
        return NonFiniteError(
            f"training diverged at step {self.step}: {what} (learning rate {lr:.3g}); the "
            "learning rate is likely too high for this model: lower --lr"
            + ("" if self.train_cfg.grad_clip > 0 else " and keep gradient clipping on")
            + (f"; {self.out} still holds the checkpoint of step {kept}" if kept
               else "; no checkpoint was written"))


def _open_run(out: Path, data: str | None, resume: bool):
    """(run record, the saved checkpoint when resuming else None)."""
    run: dict[str, Any] = {"data": None if data is None else str(Path(data).resolve())}
    if not resume:
        if out.exists() and any(out.iterdir()):
            raise ConfigError(f"output directory {out} is not empty; pass --resume to continue "
                              "the run saved there, or choose a new --out")
        return run, None
    saved = load_checkpoint(out)  # clear errors for a missing or corrupt directory
    if not has_train_state(out):
        raise ConfigError(f"{out} holds no resumable run (train_state files are missing)")
    before = {"data": saved.meta.get("run", {}).get("data")}
    if data is not None and before != run:
        raise ConfigError(f"--data {data} differs from the resumed run's data "
                          f"{before['data'] or '(built-in corpus)'}; a resume reuses its data")
    return before, saved


def _make_task(model_cfg: ModelConfig, train_cfg: TrainConfig, data: str | None,
               tok: Tokenizer | None, dd: _Dist, log: Callable[[str], None]):
    """(task, tokenizer, model config sized to them, labels): a new run trains its tokenizer
    and takes its vocabulary; a classifier takes its label count from the data, an
    encoder-decoder its decoder start (the <pad> its tokenizer gets) from the tokenizer."""
    labels = None
    if model_cfg.task == "seq2seq":
        pairs = S.load_pairs(data)
        if dd.main:
            log(pairs.describe())
        if tok is None:
            tok = _make_tokenizer(train_cfg, model_cfg,
                                  [text for pair in pairs.train for text in pair], dd)
            model_cfg = dataclasses.replace(model_cfg, vocab_size=tok.vocab_size,
                                            decoder_start_id=tok.pad_id)
        return Seq2SeqTask(tok, pairs, model_cfg, train_cfg), tok, model_cfg, None
    if model_cfg.task == "classifier":
        cdata = D.load_classification(data)
        labels = cdata.labels
        if model_cfg.num_labels != len(labels):
            model_cfg = dataclasses.replace(model_cfg, num_labels=len(labels))
        texts = [t for t, _ in cdata.train]
    else:
        corpus = D.load_corpus(data)
        if dd.main:
            log(corpus.describe())
        texts = corpus.train
    if tok is None:
        tok = _make_tokenizer(train_cfg, model_cfg, texts, dd)
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tok.vocab_size)
    task = _LMTask(tok, corpus, model_cfg) if labels is None else \
        _ClassifierTask(tok, cdata, model_cfg)
    return task, tok, model_cfg, labels


def _step(r: _Run) -> float:
    """One optimizer step on this rank's slice of the global batch; returns its loss. A loss
    or gradient that is not finite stops the run (NonFiniteError) before the weights change."""
    cfg = r.train_cfg
    for group in r.optimizer.param_groups:
        group["lr"] = lr_at(r.step, cfg)
    batch = r.task.batch(cfg.seed, r.step, cfg.batch_size)
    local = tuple(t.to(r.device) for t in _slice(batch, r.dd.rank, r.dd.world))
    loss = r.task.loss(r.ddp_model, local)
    loss.backward()
    # The gradient norm is the same on every rank (gradients are all-reduced): a NaN loss on
    # any rank stops them all at the same step. max_norm=inf only measures.
    norm = torch.nn.utils.clip_grad_norm_(r.model.parameters(),
                                          cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
    r.step += 1
    if not bool(torch.isfinite(norm)):
        raise r.diverged(f"the loss is {float(loss.detach()):.4g} and the gradient norm "
                         f"{float(norm):.4g}")
    r.optimizer.step()
    r.optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _evaluate_and_save(r: _Run, bar, metrics: dict[str, Any]) -> None:
    """The weights checked (on every rank: they are the same everywhere, so all stop
    together; a non-finite checkpoint is never written), validation metrics (rank 0), then the
    checkpoint of this step."""
    cfg = r.train_cfg
    bad = next((n for n, t in unique_state_dict(r.model).items()
                if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)
    if bad is not None:
        raise r.diverged(f"weight {bad!r} is no longer finite")
    if r.dd.main:
        r.model.eval()
        metrics.update(r.task.evaluate(r.model, cfg.eval_batches * cfg.batch_size,
                                       cfg.batch_size, r.device))
        r.model.train()
        r.history.append(metrics)
        bar.write("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in metrics.items()))
        save_checkpoint(r.out, r.model, r.tok, labels=r.labels,
                        metrics={**metrics, "parameters": r.model.num_parameters()},
                        run=r.run, state=TrainState(r.step, cfg, r.optimizer, r.history))
    if r.dd.world > 1:
        dist.barrier()


def _make_tokenizer(train_cfg: TrainConfig, model_cfg: ModelConfig, texts: list[str],
                    dd: _Dist) -> Tokenizer:
    """Rank 0 trains the tokenizer; the others receive it, so every rank has the same one."""
    payload = [None]
    if dd.main:
        tok = (Tokenizer.byte_level() if train_cfg.tokenizer == "byte"
               else Tokenizer.train_bpe(texts, model_cfg.vocab_size))
        if model_cfg.task == "seq2seq":
            tok.add_pad()  # the padding and decoder start, after the trained ids
            tok.end_texts_with_eos()  # a source as the model reads it (encode_prompt)
        payload = [tok.hf.to_str()]
    if dd.world > 1:
        dist.broadcast_object_list(payload, src=0)
    if not dd.main:
        from tokenizers import Tokenizer as HFTokenizer
        tok = Tokenizer(HFTokenizer.from_str(payload[0]))
    if tok.vocab_size < 2:
        raise DataError("the trained tokenizer has fewer than 2 tokens; the corpus is too small")
    return tok


class _progress:
    """A one-line progress bar on stderr (a line per 10% when stderr is not a terminal)."""

    def __init__(self, start: int, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.tty = sys.stderr.isatty()
        self.next_mark = start + max(total // 10, 1)
        self.t0 = time.perf_counter()

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if not self.enabled:
            return
        line = (f"step {step}/{self.total} [{'#' * (20 * step // self.total):<20}] "
                f"loss {loss:.3f}  {tokens_per_s:,.0f} tok/s  {time.perf_counter() - self.t0:.0f}s")
        if self.tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif step >= self.next_mark or step == self.total:
            print(line, file=sys.stderr, flush=True)
            self.next_mark = step + max(self.total // 10, 1)

    def write(self, text: str) -> None:
        if self.enabled:
            print(("\n" if self.tty else "") + text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr, flush=True)
