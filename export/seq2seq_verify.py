"""Verification of an encoder-decoder artifact (torch): its three graphs against the PyTorch
model on the same inputs, and greedy generation through tinyt.runtime against
tinyt.seq2seq.greedy.

    sources (text and random ids; a right-padded batch)
      ──encoder_model.onnx──▶ hidden states                  vs model.encode (real tokens)
    torch's hidden states + a whole target (teacher forcing)
      ──decoder_model.onnx──▶ logits, self cache, cross k/v  vs model.decode, model.cross_kv
    torch's caches of the target's first P tokens + the rest
      ──decoder_with_past_model.onnx──▶ logits, self cache   vs model.decode(past)
    decoder_model on the start token, then one token a step through decoder_with_past_model
      on the graphs' own caches ──▶ the logits at every position vs teacher forcing
    greedy: rt.load(artifact).generate_ids vs tinyt.seq2seq.greedy, each source alone

Every output is held to compare.reorder_bound over both stacks (n_layer + decoder layers);
a failure names the graph. Greedy tokens must be identical but for a tie at fp32 precision
(compare.TIE_FACTOR), as the decoder's verifier allows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tinyt.contract import SEQ2SEQ, SEQ2SEQ_FILES, seq2seq_cache_names
from tinyt.runtime.session import graph_session
from tinyt.seq2seq import greedy

from .compare import TIE_FACTOR, first_difference, max_abs, reorder_bound
from .seq2seq_accuracy import side_rows
from .seq2seq_checks import output_group

SOURCES = ("def add(a, b):\n    return a + b", "Return the current file position.",
           "The quick brown fox jumps over the lazy dog.", "x")
CHECK_TARGET = 16  # target tokens teacher forcing and stepping run over, at most


def _padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), 1
    return ids, mask


class _Worst:
    """The worst difference per (graph, output group) over the cases, and where."""

    def __init__(self):
        self.by: dict[str, dict[str, Any]] = {}

    def add(self, file: str, name: str, ours: np.ndarray, ref: np.ndarray, case: dict) -> None:
        w = self.by.setdefault(f"{file}: {output_group(name)}",
                               {"max_abs": 0.0, "magnitude": 0.0, "case": None})
        if ours.shape != ref.shape:
            w.update(max_abs=float("inf"), case={**case, "shape": [ours.shape, ref.shape]})
            return
        d = float(np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max(initial=0.0))
        if not d <= w["max_abs"]:
            w.update(max_abs=d, case=case)
        w["magnitude"] = max(w["magnitude"], max_abs(ref))


def _sessions(onnx_dir: Path) -> dict[str, Any]:
    return {role: graph_session(onnx_dir / file, level="all")
            for role, file in SEQ2SEQ_FILES.items()}


def _check_graphs(model, sessions, batches, T: int, worst: _Worst) -> None:
    """The three graphs on each (name, ids, mask) batch, against PyTorch."""
    cfg = model.config
    n = cfg.decoder_layers
    files = SEQ2SEQ_FILES
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for label, ids, mask in batches:
            B = len(ids)
            case = {"sources": label, "batch": B, "source": int(ids.shape[1])}
            memory = model.encode(ids, mask)
            (hidden,) = sessions["encoder"].run(None, {"input_ids": ids.numpy(),
                                                       "attention_mask": mask.numpy()})
            real = mask.numpy()[..., None] == 1  # a padded position's state is unspecified
            worst.add(files["encoder"], "last_hidden_state", np.where(real, hidden, 0),
                      np.where(real, memory.numpy(), 0), case)
            cross = model.cross_kv(memory)
            target = torch.from_numpy(rng.integers(0, cfg.vocab_size, (B, T), dtype=np.int64))
            target[:, 0] = cfg.decoder_start_id
            logits, own = model.decode(target, cross, mask)
            out = sessions["decoder"].run(None, {
                "encoder_attention_mask": mask.numpy(), "input_ids": target.numpy(),
                "encoder_hidden_states": memory.numpy()})
            ref = [logits, *(t for o, c in zip(own, cross) for t in (*o, *c))]
            names = ["logits", *seq2seq_cache_names(n, "present", ("decoder", "encoder"))]
            for name, o, r in zip(names, out, ref):
                worst.add(files["decoder"], name, o, r.numpy(), {**case, "target": T})
            P = T // 2
            _, past = model.decode(target[:, :P], cross, mask)
            logits2, own2 = model.decode(target[:, P:], cross, mask, past)
            feeds = {"encoder_attention_mask": mask.numpy(), "input_ids": target[:, P:].numpy()}
            caches = [t for p, c in zip(past, cross) for t in (*p, *c)]
            feeds.update(zip(seq2seq_cache_names(n, "past_key_values", ("decoder", "encoder")),
                             (t.numpy() for t in caches)))
            out = sessions["decoder_with_past"].run(None, feeds)
            ref = [logits2, *(t for o in own2 for t in o)]
            names = ["logits", *seq2seq_cache_names(n, "present", ("decoder",))]
            for name, o, r in zip(names, out, ref):
                worst.add(files["decoder_with_past"], name, o, r.numpy(),
                          {**case, "past": P, "target": T - P})
            _check_steps(sessions, n, mask, memory, target, logits, worst, case)


def _check_steps(sessions, n: int, mask, memory, target, logits, worst: _Worst,
                 case: dict) -> None:
    """decoder_model on the start token, then decoder_with_past a token a step on the graphs'
    own caches, as the runtime steps: each position's logits against teacher forcing (mask
    None: a speech model's decoders, fed no source mask)."""
    source = {} if mask is None else {"encoder_attention_mask": mask.numpy()}  # speech: none
    first = sessions["decoder"].run(None, {**source, "input_ids": target[:, :1].numpy(),
                                           "encoder_hidden_states": memory.numpy()})
    own = [c for i, c in enumerate(first[1:]) if i % 4 < 2]
    cross = [c for i, c in enumerate(first[1:]) if i % 4 >= 2]
    steps = [first[0]]
    for t in range(1, target.shape[1]):
        feeds = {**source, "input_ids": target[:, t:t + 1].numpy()}
        kv = iter(own), iter(cross)
        for i, name in enumerate(seq2seq_cache_names(n, "past_key_values",
                                                     ("decoder", "encoder"))):
            feeds[name] = next(kv[i % 4 >= 2])
        out = sessions["decoder_with_past"].run(None, feeds)
        own = out[1:]
        steps.append(out[0])
    worst.add(SEQ2SEQ_FILES["decoder_with_past"], "logits (stepped on its own caches)",
              np.concatenate(steps, axis=1), logits.numpy(),
              {**case, "steps": int(target.shape[1])})


def _greedy(model, tokenizer, onnx_dir: Path, rows, steps: int, bound: float,
            failures: list[str]) -> list[dict[str, Any]]:
    """Each source's greedy tokens through the runtime against tinyt.seq2seq.greedy."""
    from tinyt.runtime import load

    cfg = model.config
    lm = load(onnx_dir, threads=1)
    limit = tokenizer.vocab_size if tokenizer.vocab_size < cfg.vocab_size else None
    eos = tokenizer.eos_id
    out = []
    for text, row in zip((*SOURCES, "random ids"), rows):
        ids = torch.tensor([row])
        ref = greedy(model, ids, max_new_tokens=steps, eos_id=eos,
                     forced_bos_id=cfg.forced_bos_id, vocab_limit=limit)[0, 1:].tolist()
        if eos in ref:
            ref = ref[:ref.index(eos)]
        got = lm.generate_ids([row], max_new_tokens=steps)[0].token_ids
        first = first_difference(got, ref)
        case = {"prompt": text, "tokens": steps, "identical": got == ref, "torch": ref,
                "onnxruntime": got}
        if first is None and len(got) != len(ref):  # one stopped where the other went on
            first = min(len(got), len(ref))
        if first is not None:
            prefix = torch.tensor([[cfg.decoder_start_id, *ref[:first]]])
            with torch.no_grad():
                z = model(ids, None, prefix)[0, -1]
            theirs = got[first] if first < len(got) else eos
            mine = ref[first] if first < len(ref) else eos
            margin = float(z[mine] - z[theirs])
            case["first_difference"] = {"position": first, "torch_logit_margin": margin,
                                        "tie_bound": TIE_FACTOR * bound}
            if margin > TIE_FACTOR * bound:
                failures.append(f"greedy generation differs for source {text!r} at token "
                                f"{first} (PyTorch prefers its token by {margin:.3g}, more "
                                f"than a tie at fp32 precision, {TIE_FACTOR * bound:.3g})")
        out.append(case)
    return out


def verify_seq2seq(ckpt, onnx_dir: Path, seed: int = 0, gen_tokens: int = 64
                   ) -> dict[str, Any]:
    """The report of verifier.verify for an encoder-decoder artifact (`passed`, `failures`
    naming the graph, `worst` per graph and output group, `generation`)."""
    model, tokenizer = ckpt.model.eval(), ckpt.tokenizer
    cfg = model.config
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_id
    S = min(cfg.block_size, 64)
    rows = side_rows(tokenizer, SOURCES, S)
    rng = np.random.default_rng(seed)
    rows.append(rng.integers(0, cfg.vocab_size, S).tolist())  # the longest source
    T = min(CHECK_TARGET, cfg.block_size)
    batches = [("text", *_padded(rows[:len(SOURCES)], pad)),
               ("random ids", *_padded([rows[-1], rows[-1][:3]], pad)),
               ("one token", *_padded([rows[-1][:1]], pad))]
    worst = _Worst()
    _check_graphs(model, _sessions(onnx_dir), batches, T, worst)
    layers = cfg.n_layer + cfg.decoder_layers
    failures = []
    for name, w in worst.by.items():
        w["bound"] = reorder_bound(cfg, w["magnitude"], layers)
        if not w["max_abs"] <= w["bound"]:
            failures.append(f"{name} max abs diff {w['max_abs']:.3g} > {w['bound']:.3g} (fp32 "
                            f"rounding at |value| up to {w['magnitude']:.3g}, {layers} blocks) "
                            f"at {w['case']}")
    logits_size = max(w["magnitude"] for n, w in worst.by.items() if n.endswith("logits"))
    steps = min(gen_tokens, cfg.block_size)
    generation = _greedy(model, tokenizer, onnx_dir, rows, steps,
                         reorder_bound(cfg, logits_size, layers), failures)
    return {"passed": not failures, "failures": failures, "graph": SEQ2SEQ,
            "sizes": {"longest_source": max(map(len, rows)), "longest_sequence": T,
                      "context": cfg.block_size, "highest_position": T - 1,
                      "batch": len(SOURCES), "generated_tokens": steps},
            "tolerances": {n: w["bound"] for n, w in worst.by.items()},
            "worst": worst.by, "generation": generation}
