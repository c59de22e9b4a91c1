"""The encoder peer benchmark (benchmarks/peers/encoders.py) on a tiny sentence-transformers directory
(2 layers, width 32, random weights): tinyt's three artifacts and Optimum (both in .venv) are
checked against transformers' embeddings, then timed for one round; an engine that pools
otherwise is refused before anything is timed; peers absent from the python that runs them are
reported by name with their install command. Nothing here asserts a time."""
import importlib.util
import json
import sys
from dataclasses import replace

import numpy as np
import pytest
from hf_fixtures import save_encoder
from tokenizers import Tokenizer

from tinyt.benchmarks.peers import encoders as bench
from tinyt.errors import BenchError

OURS = ("tinyt-fp32", "tinyt-opt", "tinyt-int8")
# the peers .venv lacks (scripts/setup-encoder-peers.sh puts them in a venv of their own)
ABSENT = {"st-torch": "sentence_transformers", "st-onnx": "sentence_transformers",
          "fastembed": "fastembed"}


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("encoder-peers") / "st"
    save_encoder("bert", path, num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                 intermediate_size=64)
    return path


@pytest.fixture(scope="module")
def result(st_dir, tmp_path_factory):
    # Optimum's embeddings pooled from [CLS] where the directory says mean: a wrong engine
    wrong = replace(bench.ENCODER_ENGINES["optimum"], name="optimum-cls", options={"pooling": "cls"})
    out = tmp_path_factory.mktemp("encoder-peers") / "out"
    engines = [*OURS, "optimum", wrong, *ABSENT]
    return out, bench.run(st_dir, out, threads=[1], rounds=1, block=1, settle=0,
                          engines=engines, python=sys.executable, throughput=(4, 24),
                          latency_tokens=8)


@pytest.mark.slow  # the module's run: worker processes, ~25 s
def test_every_fp32_engine_computes_the_reference_and_int8_reports(result):
    _, r = result
    for label in ("tinyt-fp32@1t", "tinyt-opt@1t", "optimum@1t"):
        a = r["accuracy"][label]
        assert a["must_match"] and a["matches"], (label, a)
        assert a["cosine_min"] >= bench.EXACT_COSINE and a["recall_at_10"] == 1.0, (label, a)
    q = r["accuracy"]["tinyt-int8@1t"]
    assert not q["must_match"] and q["matches"] is None  # reported, never refused
    assert 0.9 < q["cosine_min"] <= q["cosine_mean"] <= 1.0 and 0.0 <= q["recall_at_10"] <= 1.0
    assert r["method"]["check_texts"] == 220  # tinyt's retrieval set: 20 queries, 200 passages


@pytest.mark.slow  # the module's run: worker processes, ~25 s
def test_an_engine_pooling_otherwise_is_refused_before_timing(result):
    out, r = result
    a = r["refused"]["optimum-cls@1t"]
    assert a["must_match"] and a["matches"] is False and a["cosine_min"] < bench.EXACT_COSINE
    assert "optimum-cls@1t" not in r["rows"] and "optimum-cls@1t" not in r["raw_s"]
    assert "**refused**" in (out / "results.md").read_text()


@pytest.mark.slow  # the module's run: worker processes, ~25 s
def test_the_others_are_timed_and_written_with_ratios_to_tinyt(result):
    out, r = result
    present = [e for e, m in ABSENT.items() if importlib.util.find_spec(m) is not None]
    assert set(r["rows"]) == {f"{e}@1t" for e in (*OURS, "optimum", *present)}
    for label, row in r["rows"].items():
        assert row["texts_per_s"] > 0 and row["latency_ms"] > 0, label
        assert row["batch_tinyt"] in OURS and row["latency_tinyt"] in OURS, row
        assert [len(t) for t in r["raw_s"][label]] == [1, 1]  # one round, one timed call each
    best = r["rows"][f"{r['rows']['optimum@1t']['batch_tinyt']}@1t"]
    assert best["batch_vs_tinyt"] == 1.0  # tinyt's fastest is its own yardstick
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == r["rows"] and saved["environment"]["cpu"]
    assert saved["method"]["throughput"] == {"batch": 4, "tokens": 24}
    assert saved["workers"]["optimum@1t"]["python"] == sys.executable
    md = (out / "results.md").read_text()
    assert "texts/s (4 × 24 tokens)" in md and "ms (1 × 8 tokens)" in md
    for name in (*OURS, "optimum"):
        assert f"| {name} | 1 |" in md


@pytest.mark.slow  # the module's run: worker processes, ~25 s
def test_absent_peers_are_named_with_their_install_command(result):
    out, r = result
    absent = {e: m for e, m in ABSENT.items() if importlib.util.find_spec(m) is None}
    if not absent:
        pytest.skip("sentence-transformers and fastembed are installed in this venv")
    md = (out / "results.md").read_text()
    for name in absent:
        said = r["skipped"][name]
        assert said.startswith("not installed") and "pip install" in said, said
        assert f"- {name}: not installed" in md
        assert not any(k.startswith(f"{name}@") for k in r["accuracy"])


def test_timed_texts_have_exactly_the_tokens_asked(st_dir):
    tok = Tokenizer.from_file(str(st_dir / "tokenizer.json"))
    for tokens, count in ((8, 1), (24, 4), (128, 3)):
        texts = bench.texts_of(st_dir / "tokenizer.json", tokens, count)
        assert len(set(texts)) == count  # different texts, not one repeated
        assert [len(tok.encode(t).ids) for t in texts] == [tokens] * count


def test_unknown_engine_and_bad_settings_are_refused_before_any_work(st_dir, tmp_path):
    with pytest.raises(BenchError, match="unknown engine.*known: tinyt-fp32"):
        bench.run(st_dir, tmp_path / "out", engines=["tinyt-fp32", "onnx-magic"])
    with pytest.raises(BenchError, match="block=0"):
        bench.run(st_dir, tmp_path / "out", block=0)
    assert not (tmp_path / "out").exists()


# --- --train: briefly trained weights (benchmarks/peers/encoder_weights.py) -------------------
TRAIN_STEPS = 8
# fp32 against transformers: the same arithmetic in other orders (export/verifier.py's bound,
# tests/export/test_encoders.py's ATOL)
ATOL = 1e-4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """run() at the test shape (2 layers, width 32, the benchmark's seeded init), SimCSE-trained
    TRAIN_STEPS steps, checked by tinyt's fp32 export alone; its work folder kept."""
    root = tmp_path_factory.mktemp("encoder-train")
    r = bench.run(None, root / "out", shape="test", train_steps=TRAIN_STEPS, threads=[1],
                  rounds=0, engines=["tinyt-fp32"], work=root / "work")
    return root, r


@pytest.mark.slow
def test_training_lowers_the_contrastive_loss_and_is_recorded(trained):
    root, r = trained
    t = r["training"]
    assert len(t["loss"]) == TRAIN_STEPS and t["steps"] == TRAIN_STEPS and t["texts"] > 1000
    # B in-batch candidates: a loss of ln B is a model that cannot tell its texts apart, and the
    # seeded init starts near it (measured 3.25 at B = 64, ln 64 = 4.16); 8 steps took it to
    # 2.69. Weights that did not move would stay within the dropout's noise (a few hundredths).
    assert t["loss"][0] <= np.log(t["batch_size"]) + 0.05
    assert t["loss"][-1] < 0.9 * t["loss"][0], t["loss"]
    assert r["st_dir"].endswith(f"SimCSE-trained {TRAIN_STEPS} steps")
    assert r["model"]["pooling"] == "mean" and r["model"]["dim"] == 32
    assert json.loads((root / "out" / "results.json").read_text())["training"] == t
    md = (root / "out" / "results.md").read_text()
    assert f"SimCSE-trained {TRAIN_STEPS} steps (SimCSE" in md and "loss" in md
    # the trained directory is the one the engines were checked against
    a = r["accuracy"]["tinyt-fp32@1t"]
    assert a["matches"] and a["cosine_min"] >= bench.EXACT_COSINE, a


@pytest.mark.slow
def test_trained_directory_imports_and_embeds_as_transformers_does(trained):
    import torch
    from hf_fixtures import sentence_embeddings
    from transformers import AutoModel

    import tinyt.runtime as rt
    from tinyt.checkpoint import load_checkpoint
    from tinyt.export.retrieval_set import PASSAGES, QUERIES

    root, _ = trained
    st, init = root / "work" / "st-trained", root / "work" / "st"
    hf = AutoModel.from_pretrained(st).eval()
    before = AutoModel.from_pretrained(init).state_dict()
    moved = max((hf.state_dict()[k] - v).abs().max().item() for k, v in before.items()
                if not k.startswith("pooler."))
    assert moved > 1e-3  # trained weights, not the init copied (AdamW's first steps: ~lr each)
    texts = [*QUERIES[:4], *PASSAGES[:12]]
    enc = rt.load(root / "work" / "onnx", threads=1)
    got = enc.embed(texts, batch_size=8)
    rows = enc.encode(texts)
    T = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([i + [0] * (T - len(i)) for i, _ in rows])
    types = torch.tensor([t + [0] * (T - len(t)) for _, t in rows])
    mask = (ids != 0).long()
    _, ref = sentence_embeddings(hf, ids, mask, types)
    assert got.shape == ref.shape == (len(texts), 32)
    assert np.abs(got - ref.numpy()).max() <= ATOL
    ckpt = load_checkpoint(root / "work" / "ckpt")  # tinyt's own torch model, imported
    with torch.no_grad():
        _, s = ckpt.model.eval()(ids, mask, types)
    assert (s - ref).abs().max().item() <= ATOL


def test_training_is_seeded_and_holds_the_retrieval_set_out(tmp_path, monkeypatch):
    from tinyt import data
    from tinyt.benchmarks.peers import encoder_weights as ew
    from tinyt.export.retrieval_set import PASSAGES

    st = bench.build_st(tmp_path / "st", "test")
    texts = [f"Return the {w} of the {v} given as its argument, or None." for w in
             ("size", "name", "path", "mode", "owner") for v in ("file", "socket", "archive")]
    runs = [ew.train(st, tmp_path / f"t{i}", pooling="mean", steps=3, batch_size=4, texts=texts,
                     log=lambda _: None) for i in (0, 1)]
    assert runs[0]["loss"] == runs[1]["loss"]
    a, b = ((tmp_path / f"t{i}" / "model.safetensors").read_bytes() for i in (0, 1))
    assert a == b and a != (st / "model.safetensors").read_bytes()
    assert (tmp_path / "t0" / "modules.json").is_file()  # the sentence-transformers layout
    with pytest.raises(ValueError, match="exists; training writes a new directory"):
        ew.train(st, tmp_path / "t0", pooling="mean", steps=1, texts=texts)
    # a docstring holding a retrieval passage is not trained on; others are, each once
    doc = f'"""{PASSAGES[3]} More words."""'
    corpus = data.Corpus("fake", [f'{doc}\ndef f():\n    """{texts[0]}"""\n\n'
                                  f'def g():\n    """{texts[0]}"""\n'], [""], ["a.py"], ["b.py"])
    monkeypatch.setattr(data, "load_corpus", lambda *_: corpus)
    assert ew.training_texts() == [texts[0]]
