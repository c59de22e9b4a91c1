"""A multiple-choice task for lm-evaluation-harness made from the built-in corpus' held-out text,
no download: "which line comes next?"

    the validation split (tinyt.data.load_corpus: files no training batch reads) ──▶ for a line
    with at least CONTEXT_LINES non-blank lines before it: the context (those lines, cut from
    the left to fit the model's context), the true next line and DISTRACTORS other non-blank
    lines of the same file, shuffled by a seeded generator ──▶ DIR/docs.jsonl +
    DIR/tinyt_next_line.yaml (lm-eval's task file: multiple_choice, acc and acc_norm)

The model scores each choice's loglikelihood after the context (lm-eval's local-completions
model sends token ids with echo and logprobs; tinyt serve answers them); a random guess is
right 1 in DISTRACTORS + 1.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tinyt import data as D

TASK = "tinyt_next_line"
CONTEXT_LINES = 6
DISTRACTORS = 3
MIN_LINE_CHARS = 8  # a choice is a line with some content (not "    )" or a blank)


def _lines(text: str) -> list[str]:
    return [ln + "\n" for ln in text.split("\n") if len(ln.strip()) >= MIN_LINE_CHARS]


def make_docs(tokenizer, count: int, max_tokens: int, *, data: str | None = None,
              seed: int = 0) -> list[dict]:
    """`count` questions from the held-out split, each fitting `max_tokens` tokens (context and
    its longest choice; the context loses whole lines from the left, at least one kept), the
    same for the same corpus, tokenizer and seed."""
    rng = np.random.default_rng(seed)
    files = [_lines(t) for t in D.load_corpus(data).val]
    candidates = [(f, i) for f, lines in enumerate(files) if len(lines) > CONTEXT_LINES + 8
                  for i in range(CONTEXT_LINES, len(lines))]
    if len(candidates) < count:
        raise ValueError(f"the held-out split gives {len(candidates)} questions; {count} were "
                         "asked for")
    docs = []
    for k in rng.permutation(len(candidates)):
        f, i = candidates[int(k)]
        lines = files[f]
        truth = lines[i]
        others = list(dict.fromkeys(ln for ln in lines if ln != truth))  # distinct lines
        if len(others) < DISTRACTORS:
            continue
        picks = [others[int(j)] for j in rng.choice(len(others), DISTRACTORS, replace=False)]
        choices = [truth, *picks]
        order = rng.permutation(len(choices))
        choices = [choices[int(j)] for j in order]
        label = int(np.flatnonzero(order == 0)[0])
        context = lines[i - CONTEXT_LINES:i]
        longest = max(len(tokenizer.encode(c)) for c in choices)
        while len(context) > 1 and len(tokenizer.encode("".join(context))) + longest > max_tokens:
            context = context[1:]
        if len(tokenizer.encode("".join(context))) + longest > max_tokens:
            continue  # one line and a choice still do not fit
        docs.append({"context": "".join(context), "choices": choices, "label": label})
        if len(docs) == count:
            return docs
    raise ValueError(f"only {len(docs)} questions fit {max_tokens} tokens; {count} were asked for")


def write_task(out: Path, docs: list[dict]) -> Path:
    """The task directory lm-eval reads with include_path: docs.jsonl and the task's YAML."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (out / f"{TASK}.yaml").write_text("\n".join([
        f"task: {TASK}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {json.dumps(str(path.resolve()))}",
        "test_split: test",
        "output_type: multiple_choice",
        'doc_to_text: "{{context}}"',
        'doc_to_choice: "{{choices}}"',
        "doc_to_target: label",
        'target_delimiter: ""',  # the choices are whole lines: nothing between
        "metric_list:",
        "  - metric: acc",
        "    aggregation: mean",
        "    higher_is_better: true",
        "  - metric: acc_norm",
        "    aggregation: mean",
        "    higher_is_better: true",
        ""]), encoding="utf-8")
    return out


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-evaluation-harness makes them for a causal model:
    trailing whitespace of the context moves to the continuation, the whole is encoded and
    split at the context's own length."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    return ctx, whole[len(ctx):]


def runtime_loglikelihoods(lm, docs: list[dict]) -> list[list[float]]:
    """Each doc's choices' loglikelihoods from tinyt.runtime itself (prompt_logprobs)."""
    out = []
    for d in docs:
        row = []
        for c in d["choices"]:
            ctx, cont = encode_pair(lm.tokenizer, d["context"], c)
            lps = lm.prompt_logprobs(ctx + cont)[len(ctx):]
            row.append(float(sum(lp.logprob for lp in lps)))
        out.append(row)
    return out
