"""Beam search on a decoder-only LanguageModel (runtime/lm_beams.py): the contract graph, the
shared-cache graph and the no-cache graph choose what transformers' GPT-2 generate() chooses on
the same weights (export-hf), and what the same search over the torch model does on a batch of
prompts of different lengths; beam settings that do not combine are refused by name."""
import re

import pytest
import torch

import tinyt.runtime as rt
from tinyt.checkpoint import load_checkpoint
from tinyt.errors import ConfigError
from tinyt.runtime.beam import BeamParams, beam_search
from tinyt.runtime.rules import Rules

PROMPTS = ["def ", "import os\nimport sys\n", "    return alpha_3 + beta"]
CASES = [(4, 1.0, 0, False), (3, 2.0, 2, "never"), (4, -0.5, 3, True)]


@pytest.fixture(scope="module")
def models(lm_onnx, tiny_ckpt, tmp_path_factory):
    """kind -> LanguageModel on the tiny checkpoint's export."""
    from tinyt.export.exporter import export_onnx
    from tinyt.export.optimize import optimize

    root = tmp_path_factory.mktemp("lm-beams")
    gqa = optimize(optimize(lm_onnx, root / "opt"), root / "gqa", target="gqa")
    plain = export_onnx(tiny_ckpt, root / "nocache", with_past=False)
    return {kind: rt.load(path, threads=1) for kind, path in
            (("contract", lm_onnx), ("shared-cache", gqa), ("no-cache", plain))}


@pytest.fixture(scope="module")
def ck(tiny_ckpt):
    return load_checkpoint(tiny_ckpt)


def _torch_search(ck, rows, case, n):
    """The same search over the torch model's logits, every sequence run whole each step."""
    K, lp, ngram, early = case
    model = ck.model.eval()
    seqs = [list(r) for r in rows]

    @torch.no_grad()
    def logits():
        return torch.stack([model(torch.tensor([s]))[0][0, -1] for s in seqs]).numpy()

    def step(parents, tokens):
        seqs[:] = [seqs[p] + [int(t)] for p, t in zip(parents, tokens)]
        return logits()

    V = ck.tokenizer.vocab_size
    first = logits()
    assert V == ck.config.vocab_size  # no padded ids to leave out
    return beam_search(first, step, rows, BeamParams(K, lp, early), eos=[ck.tokenizer.eos_id],
                       max_new_tokens=n, rules=Rules(max_new_tokens=n, no_repeat_ngram_size=ngram))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", ["contract", "shared-cache", "no-cache"])
def test_beams_match_the_torch_model_on_a_batch(models, ck, kind, case):
    lm = models[kind]
    rows = [ck.tokenizer.encode(p) for p in PROMPTS]
    K, lp, ngram, early = case
    got = lm.generate_ids(rows, num_beams=K, length_penalty=lp, no_repeat_ngram_size=ngram,
                          early_stopping=early, max_new_tokens=10)
    assert [(r.token_ids, r.finish_reason) for r in got] == _torch_search(ck, rows, case, 10)


def test_beams_match_transformers_gpt2(models, ck, tiny_ckpt, tmp_path):
    from transformers import GPT2LMHeadModel

    from tinyt.hf import to_hf_gpt2

    theirs = GPT2LMHeadModel.from_pretrained(to_hf_gpt2(tiny_ckpt, tmp_path / "hf")).eval()
    eos = ck.tokenizer.eos_id
    for prompt in PROMPTS[:2]:
        ids = ck.tokenizer.encode(prompt)
        for K, lp, ngram, early in CASES:
            with torch.no_grad():
                ref = theirs.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                                                                   dtype=torch.long),
                                      num_beams=K, length_penalty=lp, no_repeat_ngram_size=ngram,
                                      early_stopping=early, max_new_tokens=12, do_sample=False,
                                      eos_token_id=eos, pad_token_id=eos)[0, len(ids):].tolist()
            want = ref[:ref.index(eos)] if eos in ref else ref
            (got,) = models["shared-cache"].generate_ids([ids], num_beams=K, length_penalty=lp,
                                                         no_repeat_ngram_size=ngram,
                                                         early_stopping=early, max_new_tokens=12)
            assert got.token_ids == want, (prompt, K, lp)


def test_beams_stop_at_the_context(models, ck):
    lm = models["contract"]
    ids = ck.tokenizer.encode("x = 1\n" * 40)[:lm.context - 3]
    (r,) = lm.generate_ids([ids], num_beams=2, max_new_tokens=10)
    assert len(r.token_ids) <= 3 and r.finish_reason in ("eos", "context")


@pytest.mark.parametrize("kwargs, says", [
    (dict(num_beams=2, temperature=0.8), "num_beams=2 does not combine with temperature=0.8"),
    (dict(num_beams=2, stop=["\n"]), "does not combine with stop=['\\n']"),
    (dict(num_beams=3, logprobs=2), "logprobs does not combine with num_beams=3"),
    (dict(length_penalty=2.0), "length_penalty apply to beam search: give num_beams > 1"),
    (dict(num_beams=0), "num_beams=0 is invalid"),
    (dict(num_beams=2, early_stopping="soon"), "True, False or 'never'"),
])
def test_beam_settings_refused_by_name(models, kwargs, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        models["contract"].generate("def ", **kwargs)
