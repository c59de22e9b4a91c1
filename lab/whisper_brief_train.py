"""Whisper tiny briefly trained on espeak-ng speech (issue 52): weights whose tokens are chosen
by clear margins, so that an INT8 engine's agreement with fp32 counts how often its
quantization changes a choice, not where random weights' near-ties fall.

    peer_whisper("tiny") (whisper_shape.py: 4 + 4 layers x 384, 80 mel bins, the 51,865-token
    layout and tokenizer, the head's special rows zero)
      ── AdamW, bf16 autocast on the CPU, --steps x --batch windows ──▶ ARTIFACTS/hf
    windows: espeak-ng speaking sentences (whisper_peers._speak), runtime/audio.log_mel
      train     the retrieval set's sentences after the held-out ones, and sentences of the
                standard library's docstrings (MODULES)
      held out  the retrieval set's first --held-out sentences: the peer benchmark's check
                windows (whisper_peers.features takes them in order) and its 5-s clip's
    labels: <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|> sentence <|endoftext|>,
    the loss on the sentence and the end (the prompt is given, never predicted)
    ──▶ ARTIFACTS/training.json: train and held-out loss per token, how peaked the held-out
        choices are (the top token's probability, its logit margin over the second), greedy
        transcripts of held-out windows, the process's CPU seconds

    .venv/bin/python -m lab.whisper_brief_train ARTIFACTS [--steps 240] [--batch 4]
    .venv/bin/python -m tinyt.benchmarks.peers.whisper_peers ARTIFACTS --make tiny ...

The head's rows peer_whisper zeroes are kept: they start every token no label names (the other
languages, tasks, the timestamps) at logit 0, below the ordinary tokens training raises, and
AdamW moves them from there (their gradient is their softmax share, pushing them down); the
end's row learns from the labels like any other. Starting from peer_whisper's model, and not a
fresh draw, keeps the benchmark's model the one its docs describe, trained. One thread (the
machine is shared); seeds fixed (the order of the windows and torch's), so a rerun on the same
Python (its docstrings are part of the data) and torch gives the same weights.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

PROMPT = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
END = 50257  # <|endoftext|>
IGNORE = -100  # torch's cross_entropy ignore_index: the padding after a label's end
# standard-library modules whose docstrings give the training sentences (every Python has them)
MODULES = ("abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "calendar", "cmd",
           "codecs", "collections", "configparser", "contextlib", "copy", "csv", "datetime",
           "decimal", "difflib", "email", "enum", "fractions", "ftplib", "functools", "getopt",
           "gettext", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client",
           "imaplib", "inspect", "io", "ipaddress", "itertools", "json", "locale", "logging",
           "mailbox", "mimetypes", "netrc", "numbers", "operator", "optparse", "os", "pathlib",
           "pdb", "pickle", "pprint", "queue", "random", "re", "sched", "secrets", "selectors",
           "shelve", "shlex", "shutil", "signal", "smtplib", "socket", "sqlite3", "statistics",
           "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
           "timeit", "tokenize", "trace", "traceback", "turtle", "types", "typing",
           "unittest", "urllib.parse", "uuid", "warnings", "wave", "weakref", "zipfile")
WORDS = (5, 20)  # a sentence's words: at least a phrase, at most ~8 s of espeak-ng
SAID = re.compile(r"[A-Z][A-Za-z ,'-]*[a-z][.?!]")  # words and pauses only: what speech says


def sentences(text: str) -> list[str]:
    """The sentences of `text` (a docstring) that a speaker says as written: a capital first,
    then letters, spaces, commas, apostrophes and hyphens, one final mark, WORDS words; no
    code, digits, abbreviations or marks Whisper suppresses (its suppress_tokens hold ; : ( )
    and the like: a label must be a token the decoder may write)."""
    flat = " ".join(text.split())
    out = []
    for piece in re.split(r"(?<=[.?!])\s+", flat):
        if SAID.fullmatch(piece) and WORDS[0] <= len(piece.split()) <= WORDS[1] \
                and not re.search(r"\b(e\.g|i\.e|etc)\b", piece):
            out.append(piece)
    return out


def docstring_sentences(modules: tuple[str, ...] = MODULES) -> list[str]:
    """Every module's docstring sentences, and its public members', in a fixed order, each
    once."""
    seen: dict[str, None] = {}
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # a Python built without one (sqlite3, turtle's tkinter)
            continue
        docs = [inspect.getdoc(mod) or ""]
        for attr in sorted(getattr(mod, "__all__", None) or dir(mod)):
            obj = getattr(mod, attr, None)
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)):
                docs.append(inspect.getdoc(obj) or "")
        for doc in docs:
            seen.update(dict.fromkeys(sentences(doc)))
    return list(seen)


def split(held_out: int) -> tuple[list[str], list[str]]:
    """(train, held out): held out the retrieval set's first `held_out` sentences (the peer
    benchmark's check windows and its clip's, whisper_peers._sentences' order); train the rest
    of it and the docstrings' sentences, less any held-out one."""
    from tinyt.benchmarks.peers.whisper_peers import _sentences

    said = _sentences()
    held = said[:held_out]
    train = [s for s in [*said[held_out:], *docstring_sentences()]
             if s not in held and sentences(s)]
    return list(dict.fromkeys(train)), held


def speak(texts: list[str], n_mels: int) -> np.ndarray:
    """[len(texts), n_mels, 3000] float16: each text spoken by espeak-ng (whisper_peers._speak,
    16 kHz), through runtime/audio.log_mel (one 30-s window, padded with silence). float16
    holds log-mel's [-1.5, 1.5] to 2^-11 relative, and halves the set's memory."""
    from tinyt.benchmarks.peers.whisper_peers import _speak
    from tinyt.runtime.audio import log_mel

    out = np.empty((len(texts), n_mels, 3000), dtype=np.float16)
    with tempfile.TemporaryDirectory() as tmp:
        for k, text in enumerate(texts):
            out[k] = log_mel(_speak(text, Path(tmp) / "said.wav"), n_mels=n_mels)
    return out


def labels(tokenizer, prompt: list[int], text: str) -> list[int]:
    """The decoder's ids: the prompt, the sentence's tokens, the end."""
    return [*prompt, *tokenizer.encode(text).ids, END]


def batch(rows: list[list[int]], prompt_len: int):
    """(decoder inputs [B, T], targets [B, T]) of label rows of different lengths: inputs every
    id but the last (padded with the end, which a causal decoder never reads back), targets
    the next id from the prompt's last on, IGNORE elsewhere."""
    import torch

    width = max(map(len, rows)) - 1
    inputs = torch.full((len(rows), width), END, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, row in enumerate(rows):
        inputs[i, :len(row) - 1] = torch.tensor(row[:-1])
        targets[i, prompt_len - 1:len(row) - 1] = torch.tensor(row[prompt_len:])
    return inputs, targets


def step_loss(model, features, inputs, targets):
    """The mean cross-entropy per target token, the forward in bf16 autocast (fp32 weights)."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_features=features, decoder_input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                             ignore_index=IGNORE)


def evaluate(model, feats: np.ndarray, rows: list[list[int]], prompt_len: int,
             size: int = 4) -> dict:
    """Loss per token over `rows` (fp32, no autocast: the weights as saved), and how peaked
    the choices are where a label is: the top token's mean probability, the mean and the
    smallest logit margin of the top token over the second, the share of positions where
    the top token is the label."""
    import torch

    total = count = hits = 0
    top, margins = [], []
    with torch.no_grad():
        for k in range(0, len(rows), size):
            inputs, targets = batch(rows[k:k + size], prompt_len)
            x = torch.from_numpy(feats[k:k + size].astype(np.float32))
            logits = model(input_features=x, decoder_input_ids=inputs).logits
            keep = targets != IGNORE
            lg, tg = logits[keep], targets[keep]  # [N, vocab], [N]
            total += torch.nn.functional.cross_entropy(lg, tg, reduction="sum").item()
            count += tg.numel()
            two = lg.topk(2, dim=-1).values
            top.append(lg.softmax(-1).max(-1).values)
            margins.append(two[:, 0] - two[:, 1])
            hits += (lg.argmax(-1) == tg).sum().item()
    margin = torch.cat(margins)
    return {"loss": total / count, "tokens": count, "top_probability": torch.cat(top).mean().item(),
            "margin_mean": margin.mean().item(), "margin_min": margin.min().item(),
            "top_is_label": hits / count}


def greedy(model, feats: np.ndarray, prompt: list[int], suppress: list[int],
           n: int = 120) -> list[list[int]]:
    """Greedy ids after the prompt, each window alone, up to the end or `n` tokens, Whisper's
    suppress_tokens never chosen (as every engine of the benchmark applies them)."""
    import torch

    out = []
    with torch.no_grad():
        for window in feats:
            enc = model.model.encoder(torch.from_numpy(window[None].astype(np.float32)))
            ids, past, made = torch.tensor([prompt]), None, []
            for _ in range(n):
                o = model(encoder_outputs=enc, decoder_input_ids=ids, past_key_values=past,
                          use_cache=True)
                logits, past = o.logits[0, -1], o.past_key_values
                logits[suppress] = -float("inf")
                nxt = int(logits.argmax())
                if nxt == END:
                    break
                made.append(nxt)
                ids = torch.tensor([[nxt]])
            out.append(made)
    return out


def _clip_held_out(held: list[str]) -> None:
    """Refuse a split that trains on the peer benchmark's 5-s clip (whisper_peers.clip: the
    first retrieval sentence espeak-ng says within 5 s)."""
    from tinyt.benchmarks.peers.whisper_peers import clip

    with tempfile.TemporaryDirectory() as tmp:
        text = clip(Path(tmp))["text"]
    if text not in held:
        raise SystemExit(f"error: the benchmark's clip says {text!r}, not held out; raise "
                         f"--held-out to cover it")


def schedule(step: int, steps: int, warmup: int) -> float:
    """The learning rate's factor at `step`: linear warm-up over `warmup` steps, then cosine
    down to a tenth at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    done = (step - warmup) / max(1, steps - 1 - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(1.0, done)))


def train(model, feats: np.ndarray, rows: list[list[int]], prompt_len: int, *, steps: int,
          size: int, lr: float, warmup: int, seed: int, log=print) -> list[dict]:
    """AdamW over `steps` batches of `size` windows, in an order drawn from `seed` (every
    window once an epoch); the batch losses, every step's."""
    import torch

    order, rng = [], random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: schedule(s, steps, warmup))
    history = []
    model.train()
    for step in range(steps):
        while len(order) < size:
            order += rng.sample(range(len(rows)), len(rows))
        pick, order = order[:size], order[size:]
        inputs, targets = batch([rows[i] for i in pick], prompt_len)
        x = torch.from_numpy(feats[pick].astype(np.float32))
        loss = step_loss(model, x, inputs, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        history.append({"step": step + 1, "loss": loss.item(), "grad_norm": norm.item(),
                        "lr": sched.get_last_lr()[0]})
        if (step + 1) % 10 == 0 or step == 0:
            log(f"step {step + 1}/{steps}: loss {loss.item():.3f}, grad norm {norm.item():.2f}, "
                f"{time.process_time():.0f} CPU-s")
    model.eval()
    return history


def run(artifacts: Path, *, steps: int, size: int, lr: float, warmup: int, held_out: int,
        shown: int, seed: int, limit: int | None, log=print) -> dict:
    """peer_whisper("tiny") trained (train), saved as ARTIFACTS/hf (written beside, then
    renamed: an interrupted run leaves no half-trained hf/), with ARTIFACTS/training.json."""
    import torch

    from tinyt.benchmarks.whisper_shape import (
        generation_config,
        peer_whisper,
        special_ids,
        whisper_tokenizer,
    )

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    hf, tmp = artifacts / "hf", artifacts / "hf.partial"
    if (hf / "config.json").is_file():
        raise SystemExit(f"error: {hf} exists; remove it or pass another ARTIFACTS")
    shutil.rmtree(tmp, ignore_errors=True)
    model = peer_whisper("tiny", tmp)
    vocab = model.config.vocab_size
    tok, ids = whisper_tokenizer(vocab), special_ids(vocab)
    prompt = [ids[t] for t in PROMPT]
    train_text, held_text = split(held_out)
    _clip_held_out(held_text)
    random.Random(seed).shuffle(train_text)  # the retrieval set's and docstrings' mixed
    train_text = train_text[:limit or steps * size]  # each window seen once
    log(f"{len(train_text)} training sentences, {len(held_text)} held out; speaking them")
    cpu0, wall0 = time.process_time(), time.time()
    feats, held = speak(train_text, 80), speak(held_text, 80)
    rows = [labels(tok, prompt, s) for s in train_text]
    held_rows = [labels(tok, prompt, s) for s in held_text]
    spoken = time.process_time() - cpu0
    before = {"train": evaluate(model, feats[:len(held_rows)], rows[:len(held_rows)], 4),
              "held_out": evaluate(model, held, held_rows, 4)}
    log(f"before: held-out loss {before['held_out']['loss']:.3f}")
    cpu1 = time.process_time()
    history = train(model, feats, rows, len(prompt), steps=steps, size=size, lr=lr,
                    warmup=warmup, seed=seed, log=log)
    trained_s = time.process_time() - cpu1
    after = {"train": evaluate(model, feats[:len(held_rows)], rows[:len(held_rows)], 4),
             "held_out": evaluate(model, held, held_rows, 4)}
    suppress = generation_config(vocab, model.config.decoder_layers)["suppress_tokens"]
    said = [{"said": s, "greedy": tok.decode(g)} for s, g in
            zip(held_text[:shown], greedy(model, held[:shown], prompt, suppress))]
    model.save_pretrained(tmp, safe_serialization=True)
    tmp.rename(hf)
    report = {"steps": steps, "batch": size, "lr": lr, "warmup": warmup, "seed": seed,
              "train_sentences": len(train_text), "held_out_sentences": held_text,
              "windows_seen": steps * size, "before": before, "after": after,
              "greedy_held_out": said, "cpu_s": {"speak": spoken, "train": trained_s,
                                                  "all": time.process_time() - cpu0},
              "wall_s": time.time() - wall0, "torch_threads": torch.get_num_threads(),
              "history": history}
    (artifacts / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.whisper_brief_train",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", type=Path, help="writes hf/ and training.json here")
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--batch", type=int, default=4, help="windows a step")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW's peak learning rate")
    ap.add_argument("--warmup", type=int, default=20, help="steps of linear warm-up")
    ap.add_argument("--held-out", type=int, default=24,
                    help="the retrieval set's first sentences kept out of training (the peer "
                    "benchmark's --check-windows and clip read the first ones)")
    ap.add_argument("--show", type=int, default=6, help="held-out windows transcribed greedy")
    ap.add_argument("--limit", type=int, help="sentences to train on (default steps x batch: "
                    "each window once)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    bad = [f"--{k.replace('_', '-')} {v}" for k, v in (("steps", args.steps), ("batch", args.batch),
           ("held_out", args.held_out), ("warmup", args.warmup)) if v < 1]
    if bad or not args.lr > 0:
        raise SystemExit(f"error: {', '.join(bad) or f'--lr {args.lr}'}: must be positive")
    args.artifacts.mkdir(parents=True, exist_ok=True)
    r = run(args.artifacts, steps=args.steps, size=args.batch, lr=args.lr, warmup=args.warmup,
            held_out=args.held_out, shown=args.show, seed=args.seed, limit=args.limit)
    for part in ("before", "after"):
        print(part, {k: {m: round(v, 3) for m, v in r[part][k].items()}
                     for k in ("train", "held_out")})
    for s in r["greedy_held_out"]:
        print(f"  said: {s['said']}\n  read: {s['greedy']}")
    print(f"CPU seconds: {r['cpu_s']}")


if __name__ == "__main__":
    main()
