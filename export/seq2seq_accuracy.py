"""What a quantized encoder-decoder costs, on held-out source -> target pairs (torch-free):
its greedy outputs against the fp32 graphs' as they run in tinyt.runtime, and both against
the references, by sacrebleu; its next-token distributions along the references' targets.

    held-out pairs (the built-in code-summarization task's, or --data .tsv / .jsonl / .py dir)
      sources ──fp32 graphs (Seq2SeqModel)──▶ outputs ─┐ chrF, BLEU, token agreement,
              ──quantized graphs──────────▶ outputs ─┴▶ exact match;  each vs references
      targets (teacher forcing: encoder, then decoder_model over the whole target)
              ──both──▶ loss per target token, top-1 agreement, KL(fp32 || quantized)

The report's keys follow the decoder's (export/accuracy.py): val_loss, val_loss_reference,
perplexity_change, top1_agreement, kl_divergence (the pipeline reads them the same way),
beside chrF and BLEU (0-100) and token agreement (0-1).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from tinyt.contract import SEQ2SEQ_FILES
from tinyt.manifest import Artifact
from tinyt.runtime.encoder_decoder import Seq2SeqModel
from tinyt.runtime.session import graph_session
from tinyt.seq2seq_data import ParallelData, load_pairs
from tinyt.tokenizer import Tokenizer

from .accuracy import _window_sums

REPORT_PAIRS = 48  # held-out pairs the report reads, spread evenly over the split
REPORT_TOKENS = 48  # greedy tokens per source, at most (within the decoder's positions)
BATCH = 16  # sources a batch, where the graphs' rows are independent


@functools.lru_cache(maxsize=2)
def pairs_of(data: str | None) -> ParallelData:
    """The pairs of `data` (None: the built-in standard-library task; 5 s to build, so read
    once a process)."""
    return load_pairs(data)


def spread(items: list, count: int) -> list:
    """`count` items spread evenly over `items` (all of them when fewer)."""
    if count >= len(items):
        return list(items)
    return [items[i] for i in np.linspace(0, len(items) - 1, num=count).astype(int)]


def side_rows(tokenizer: Tokenizer, texts, limit: int) -> list[list[int]]:
    """Sources or targets as training feeds them: the tokenizer's own special tokens (Marian's
    and T5's </s> last, BART's <s> ... </s>), the end-of-text token appended where it puts
    none last (tinyt's own tokenizers: training ends both sides with it), cut to `limit`
    tokens with the end kept."""
    eos = tokenizer.eos_id
    rows = []
    for text in texts:
        ids = tokenizer.encode_prompt(text)
        if eos is not None and (not ids or ids[-1] != eos):
            ids = ids + [eos]
        rows.append(ids if len(ids) <= limit else ids[:limit - 1] + ids[-1:])
    return rows


def text_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Corpus chrF and BLEU (sacrebleu's defaults, one reference each), 0-100."""
    import sacrebleu  # the export extra's

    return {"chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
            "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score}


def model_on(src: Artifact, graphs: dict[str, Path], tokenizer: Tokenizer) -> Seq2SeqModel:
    """The runtime's Seq2SeqModel on `graphs` (by role), with the source artifact's config
    and generation_config.json (a quantized artifact carries them unchanged)."""
    sessions = {role: graph_session(graphs[role], level="all") for role in SEQ2SEQ_FILES}
    return Seq2SeqModel(src, sessions, tokenizer)


def _outputs(model: Seq2SeqModel, rows: list[list[int]], steps: int, batch: int
             ) -> list[tuple[list[int], str]]:
    """Each source's greedy tokens (the end-of-text token last where it stopped there) and
    its text."""
    out = []
    for i in range(0, len(rows), batch):
        for r in model.generate_ids(rows[i:i + batch], max_new_tokens=steps):
            end = [model.generation.eos[0]] if r.finish_reason == "eos" else []
            out.append((r.token_ids + end, r.text))
    return out


def _teacher_forced(ref: Seq2SeqModel, cand: Seq2SeqModel, sources: list[list[int]],
                    targets: list[list[int]]) -> dict[str, float]:
    """Loss per target token of both, top-1 agreement and KL(ref || cand) along the
    references' targets (decoder_model over each whole target after its start token)."""
    start = ref.generation.decoder_start
    nll_a = nll_b = kl = 0.0
    agree = tokens = 0
    for i in range(0, len(sources), BATCH):
        src, tgt = sources[i:i + BATCH], targets[i:i + BATCH]
        T = max(map(len, tgt))
        ids = np.full((len(tgt), T), ref.generation.pad, dtype=np.int64)
        ids[:, 0] = start
        for r, t in enumerate(tgt):
            ids[r, 1:len(t)] = t[:-1]
        logits = []
        for model in (ref, cand):
            memory, mask = model.encode(src)
            logits.append(model.sessions["decoder"].run(["logits"], {
                "encoder_attention_mask": mask, "input_ids": ids,
                "encoder_hidden_states": memory})[0])
        for r, t in enumerate(tgt):  # each row's real positions only
            a, b = logits[0][r, :len(t)], logits[1][r, :len(t)]
            na, nb, k = _window_sums(a[None], b[None], np.asarray([t], dtype=np.int64))
            nll_a, nll_b, kl = nll_a + na, nll_b + nb, kl + k
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            tokens += len(t)
    return {"val_loss_reference": nll_a / tokens, "val_loss": nll_b / tokens,
            "val_loss_change": nll_b / nll_a - 1.0,
            "perplexity_change": float(np.expm1((nll_b - nll_a) / tokens)),
            "top1_agreement": agree / tokens, "kl_divergence": kl / tokens,
            "target_tokens": tokens}


def seq2seq_report(src: Artifact, candidate: dict[str, Path], tokenizer: Tokenizer,
                   data: str | None, *, rows_independent: bool) -> dict[str, Any]:
    """The quantized graphs `candidate` (by role) against the source artifact's on the
    held-out pairs of `data` (the module docstring). rows_independent: whether a row's
    outputs cannot depend on the other rows of its batch (the recipe's); else each source
    runs alone."""
    pairs = pairs_of(data)
    held = spread(pairs.val, REPORT_PAIRS)
    ref = model_on(src, {r: src.path / f for r, f in SEQ2SEQ_FILES.items()}, tokenizer)
    cand = model_on(src, candidate, tokenizer)
    limit = src.config.block_size
    sources = side_rows(tokenizer, [s for s, _ in held], limit)
    targets = side_rows(tokenizer, [t for _, t in held], limit)
    steps = min(REPORT_TOKENS, ref.context)
    ours = _outputs(ref, sources, steps, BATCH)
    theirs = _outputs(cand, sources, steps, BATCH if rows_independent else 1)
    same = sum(a == b for (x, _), (y, _) in zip(ours, theirs) for a, b in zip(x, y))
    total = sum(max(len(x), len(y)) for (x, _), (y, _) in zip(ours, theirs))
    references = [t for _, t in held]
    vs_fp32 = text_scores([t for _, t in theirs], [t for _, t in ours])
    fp32_scores = text_scores([t for _, t in ours], references)
    scores = text_scores([t for _, t in theirs], references)
    return {
        "data": pairs.source, "pairs": len(held), "max_new_tokens": steps,
        "chrf_vs_fp32": vs_fp32["chrf"], "bleu_vs_fp32": vs_fp32["bleu"],
        "token_agreement": same / max(total, 1),
        "exact_match": sum(x == y for (x, _), (y, _) in zip(ours, theirs)) / len(held),
        "chrf_reference": fp32_scores["chrf"], "chrf": scores["chrf"],
        "bleu_reference": fp32_scores["bleu"], "bleu": scores["bleu"],
        **_teacher_forced(ref, cand, sources, targets),
        "greedy_batched": rows_independent,
    }
