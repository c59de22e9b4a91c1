"""lm-evaluation-harness against `tinyt serve` (benchmarks/lm_eval_quant.py): its
local-completions model scores the built-in next-line task through the server (token ids,
echo, logprobs, the remote tokenizer), and every loglikelihood it reads equals tinyt.runtime's
own for the same artifact; its accuracy is the runtime's argmax's."""
import json

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval (the eval extra) is not installed")
pytest.importorskip("starlette", reason="the serve extra is not installed")

from benchmarks.lm_eval_quant import run  # noqa: E402
from benchmarks.lm_eval_task import TASK, encode_pair, make_docs  # noqa: E402

# The server and the runtime run the same graph on the same tokens, each prompt in a batch of
# one (tests/runtime/test_logprobs.py's SAME_GRAPH_TOL per token); a choice sums <= 30 tokens.
LOGLIKELIHOOD_TOL = 30 * 1e-4


def test_the_task_is_held_out_and_fits(tiny_ckpt, corpus_dir, tmp_path):
    from tinyt import data as D
    from tinyt.checkpoint import load_checkpoint

    tok = load_checkpoint(tiny_ckpt).tokenizer
    docs = make_docs(tok, 8, 30, data=str(corpus_dir))
    assert docs == make_docs(tok, 8, 30, data=str(corpus_dir))  # the same every time
    val = "".join(D.load_corpus(str(corpus_dir)).val)
    for d in docs:
        assert len(d["choices"]) == 4 and len(set(d["choices"])) == 4
        for line in d["context"].splitlines(keepends=True) + d["choices"]:
            assert line in val  # every line from the held-out split
        longest = max(len(tok.encode(c)) for c in d["choices"])
        assert len(tok.encode(d["context"])) + longest <= 30
        ctx, cont = encode_pair(tok, d["context"], d["choices"][0])
        assert ctx + cont == tok.encode(d["context"] + d["choices"][0])


@pytest.mark.slow
def test_lm_eval_reads_the_runtime_s_loglikelihoods(tiny_ckpt, corpus_dir, tmp_path):
    result = run(tmp_path / "out", checkpoint=tiny_ckpt, count=8,
                 variants=("fp32-gqa", "int4-gqa"), threads=1, data=str(corpus_dir),
                 work=tmp_path / "work")
    for v, r in result["variants"].items():
        assert r["docs"] == 8
        assert r["max_loglikelihood_diff"] <= LOGLIKELIHOOD_TOL, v
        assert r["acc"] == r["runtime_acc"], v  # lm-eval's argmax is the runtime's
        theirs, ours = r["loglikelihoods"]["lm_eval"], r["loglikelihoods"]["runtime"]
        assert len(theirs) == len(ours) == 8 and all(len(row) == 4 for row in theirs)
    # quantization moves the numbers (the task measures it), not the questions
    a, b = (result["variants"][v]["loglikelihoods"]["runtime"] for v in ("fp32-gqa", "int4-gqa"))
    assert a != b
    saved = json.loads((tmp_path / "out" / "lm-eval.json").read_text())
    assert saved["task"] == TASK and set(saved["variants"]) == {"fp32-gqa", "int4-gqa"}
    assert "| fp32-gqa |" in (tmp_path / "out" / "lm-eval.md").read_text()
