"""The encoder-decoder peer benchmark (benchmarks/peers/seq2seq_peers.py) at a test's size (Opus-MT's
settings: 2 + 2 layers, width 64, vocab 512; hf_shape's random weights): tinyt's export,
CTranslate2 int8 and float32, Optimum's own export and transformers' PyTorch model are checked
against tinyt fp32's greedy tokens, then timed for one round; an engine running another model
(the same shape, another seed) is refused with the difference, before anything is timed.
Nothing here asserts a time."""
import importlib.util
import json
from dataclasses import replace

import pytest

from tinyt.benchmarks import hf_shape
from tinyt.benchmarks.peers import formats
from tinyt.benchmarks.peers import seq2seq_peers as bench
from tinyt.errors import BenchError

PEERS = ("ct2-int8", "ct2-float32", "optimum-fp32", "transformers")
EXACT = ("ct2-float32", "optimum-fp32", "transformers")
CALLS = dict(check_sources=4, source_tokens=10, new_tokens=6, batch=3, beams=2)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """ARTIFACTS as the docs make it (hf_shape, import-hf, export), and CTranslate2's
    conversion of another seed's model beside it (the engine that must be refused)."""
    from tinyt.export.exporter import export_onnx
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("seq2seq-peers")
    hf_shape.save("opus-mt-test", root / "hf")
    export_onnx(import_hf(root / "hf", root / "checkpoint"), root / "onnx")
    other = hf_shape.save("opus-mt-test", root / "other-hf", seed=1)
    formats.ctranslate2(other, root / "peers" / "ct2-other", "float32")
    return root


@pytest.fixture(scope="module")
def result(artifacts):
    installed = [e for e in PEERS if importlib.util.find_spec(
        bench.SEQ2SEQ_ENGINES[e].modules[0].split(".")[0]) is not None]
    other = replace(bench.SEQ2SEQ_ENGINES["ct2-float32"], name="ct2-other",
                    artifact="peers/ct2-other", convert=None)
    out = artifacts / "out"
    r = bench.run(artifacts, out, threads=[1], rounds=1, block=1, settle=0,
                  engines=["tinyt-fp32", "tinyt-int8", *installed, other], **CALLS,
                  log=lambda _: None)
    return out, r, installed


@pytest.mark.slow  # worker processes: ~40 s on 2 idle cores
def test_every_installed_fp32_engine_gives_tinyts_tokens(result):
    _, r, installed = result
    # the outputs follow the sources (hf_shape's init): a check on one output repeated would
    # not see the encoder
    assert r["agreement"]["tinyt-fp32"]["greedy"]["distinct_outputs"] > 1
    for name in [e for e in EXACT if e in installed]:
        a = r["agreement"][name]
        assert a["must_equal"] == "tinyt-fp32" and a["greedy"]["identical"], (name, a)
        assert a["greedy"]["tokens"] == CALLS["check_sources"] * CALLS["new_tokens"]
        assert name not in r["skipped"]
    if "ct2-int8" in installed:  # reported, never refused
        a = r["agreement"]["ct2-int8"]
        assert a["must_equal"] is None and 0.0 <= a["greedy"]["agreement"] <= 1.0
        assert "ct2-int8" not in r["skipped"]


@pytest.mark.slow
def test_an_engine_running_another_model_is_refused_before_timing(result):
    out, r, _ = result
    said = r["skipped"]["ct2-other"]
    assert said.startswith("refused before timing: its greedy tokens differ from tinyt-fp32's")
    assert "beyond a tie" in said
    parted = r["agreement"]["ct2-other"]["greedy"]["ties"]
    assert parted and not any(t["tie"] for t in parted)
    assert all(t["margin"] > t["tie_bound"] for t in parted)
    assert not r["agreement"]["ct2-other"]["greedy"]["identical"]
    assert not any(k.startswith("ct2-other@") for k in (*r["rows"], *r["raw_s"]))
    assert "| ct2-other |" in (out / "results.md").read_text()
    assert "**refused**" in (out / "results.md").read_text()


@pytest.mark.slow
def test_results_hold_a_row_per_timed_engine_with_the_cpu(result):
    out, r, installed = result
    assert set(r["rows"]) == {f"{e}@1t" for e in ("tinyt-fp32", *installed)}
    for label, row in r["rows"].items():
        assert row["greedy_ms"] > 0 and row["beam_ms"] > 0, label
        assert row["batch_sentences_per_s"] > 0, label
        n = CALLS["new_tokens"]  # hf_shape's zero </s> row: every engine makes every token
        assert r["made"][label] == [n, n, CALLS["batch"] * n], label
        assert [len(t) for t in r["raw_s"][label]] == [1, 1, 1]
    assert "onnx-int8 is missing" in r["skipped"]["tinyt-int8"] or \
        "tinyt-int8@1t" in r["rows"]  # where `tinyt quantize` takes an encoder-decoder
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == r["rows"] and saved["environment"]["cpu"]["model"]
    assert len(saved["environment"]["load_average"]["before"]) == 3
    md = (out / "results.md").read_text()
    assert "avx2 " in md and "avx512_vnni " in md and "amx_int8 " in md
    for name in ("tinyt-fp32", *installed):
        assert f"| {name} | 1 |" in md
    if "ct2-int8" in installed:
        t = r["targets"]["greedy_ms@1t"]
        assert t["tinyt"] == "tinyt-fp32" and t["target_max"] == bench.TARGET
        assert t["met"] == (t["vs_ct2_int8"] <= bench.TARGET)
        assert "× CTranslate2 int8" in md


class Reference:  # the reference's worker, answering the logits of two ids
    def __init__(self, values):
        self.values, self.asked = values, []

    def ask(self, **req):
        self.asked.append(req)
        return {"values": self.values, "magnitude": 40.0}


def test_tokens_parting_at_a_tie_are_the_same_computation():
    """Where an fp32 engine's tokens first part from tinyt's, tinyt's own logits decide: a
    margin within TIE_FACTOR x reorder_bound is two orders of the same sums; beyond, not."""
    from tinyt.benchmarks.peers.seq2seq_check import ties

    plan = {"check": [[5, 6, 0], [7, 0]], "eos": 0}
    ref, got = [[1, 2, 3], [4, 4]], [[1, 2, 9], [4, 4]]
    near = Reference([10.0, 10.0 - 1e-6])
    (t,) = ties(near, plan, got, ref, lambda m: 1e-4 * m)
    assert t == {"source": 0, "position": 2, "margin": pytest.approx(1e-6),
                 "tie_bound": pytest.approx(4e-3), "tie": True}
    assert near.asked == [{"op": "logits", "source": [5, 6, 0], "prefix": [1, 2],
                           "ids": [3, 9]}]
    (t,) = ties(Reference([10.0, 9.0]), plan, got, ref, lambda m: 1e-4 * m)
    assert not t["tie"] and t["margin"] == 1.0
    # one stopping sooner parts where it ended: its token there is </s>
    (t,) = ties(near, plan, [[1, 2]], [[1, 2, 3]], lambda m: 1e-4 * m)
    assert t["position"] == 2 and near.asked[-1]["ids"] == [3, 0]


def test_sources_end_in_eos_at_the_lengths_asked(artifacts):
    plan = bench.inputs(artifacts, 5, 12, 4, 3, 2)
    lo, hi = bench.CHECK_LENGTHS
    assert [len(s) for s in plan["check"]] == [lo + (hi - lo) * i // 4 for i in range(5)]
    eos = json.loads((artifacts / "hf" / "config.json").read_text())["eos_token_id"]
    for s in plan["check"] + [s for c in plan["calls"] for s in c["sources"]]:
        assert s[-1] == eos and eos not in s[:-1] and max(s) < 511  # never <pad>
    one, beams, batch = plan["calls"]
    assert one["sources"] == beams["sources"] and beams["beams"] == 2
    assert len(batch["sources"]) == 3 and {len(s) for s in batch["sources"]} == {12}
    assert len({tuple(s) for s in batch["sources"]}) == 3  # different sentences


def test_hf_shape_seq2seq_has_the_real_special_ids_and_a_silent_eos(tmp_path):
    """Opus-MT's </s> 0, <unk> 1, <pad> last (its decoder's start); the head's </s> row zero,
    so every engine runs to the length asked; the padding rows zero, as the decoders'."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    out = hf_shape.save("opus-mt-test", tmp_path / "hf")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert [tok.token_to_id(t) for t in ("</s>", "<unk>", "<pad>")] == [0, 1, 511]
    assert tok.encode("Return the size of the file").ids[-1] == 0
    table = load_file(out / "model.safetensors")["model.shared.weight"]
    assert table.shape == (512, 64) and (table[0] == 0).all() and (table[511] == 0).all()
    assert (table[1:511] != 0).any(axis=1).all()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["forced_eos_token_id"] is None and cfg["decoder_start_token_id"] == 511


def test_unknown_engine_and_bad_settings_are_refused_before_any_work(artifacts, tmp_path):
    with pytest.raises(BenchError, match="unknown engine.*known: tinyt-fp32"):
        bench.run(artifacts, tmp_path / "out", engines=["tinyt-fp32", "marian-nmt"])
    with pytest.raises(BenchError, match="block=0.*beams=1"):
        bench.run(artifacts, tmp_path / "out", block=0, beams=1)
    with pytest.raises(BenchError, match="has no config.json"):
        bench.run(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
