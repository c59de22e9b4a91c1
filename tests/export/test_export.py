import json
import shutil

import numpy as np
import onnx
import pytest
from conftest import assert_close, run_tinyt

from tinyt import contract as C
from tinyt.checkpoint import load_checkpoint
from tinyt.errors import CheckpointError
from tinyt.export import ExportError, export_onnx, reorder_bound, verify
from tinyt.export.verifier import case_feeds, cpu_session, torch_outputs
from tinyt.manifest import ManifestError, check_manifest


def dims(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_artifact_directory(lm_onnx, tiny_ckpt):
    assert sorted(p.name for p in lm_onnx.iterdir()) == [
        "config.json", "genai_config.json", "generation_config.json", "manifest.json",
        "model.onnx", "tokenizer.json"]
    cfg = load_checkpoint(tiny_ckpt).config
    hf = json.loads((lm_onnx / "config.json").read_text())
    for key, want in dict(model_type="gpt2", n_embd=cfg.n_embd, n_head=cfg.n_head,
                          n_layer=cfg.n_layer, vocab_size=cfg.vocab_size,
                          n_positions=cfg.block_size).items():
        assert hf[key] == want, key
    assert hf["eos_token_id"] == hf["bos_token_id"] == hf["pad_token_id"] == 0
    assert hf["tinyt"]["model"] == cfg.to_dict()
    manifest = check_manifest(lm_onnx)
    assert manifest["stage"] == "export" and manifest["opset"] == 18
    assert set(manifest["files"]) == {"config.json", "genai_config.json",
                                      "generation_config.json", "model.onnx", "tokenizer.json"}
    assert {"torch", "onnx"} <= set(manifest["versions"])
    assert len(manifest["source"]["sha256"]["model.safetensors"]) == 64
    assert [t["name"] for t in manifest["io"]["inputs"]][:3] == ["input_ids", "attention_mask",
                                                                   "position_ids"]


def test_graph_axes_are_symbolic_and_named_by_the_contract(lm_onnx, tiny_ckpt):
    cfg = load_checkpoint(tiny_ckpt).config
    model = onnx.load(str(lm_onnx / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    got = {v.name: dims(v) for v in [*model.graph.input, *model.graph.output]}
    for spec in [*C.decoder_inputs(cfg), *C.decoder_outputs(cfg)]:
        assert got[spec.name] == list(spec.shape), spec.name
    assert len(model.graph.input) == 3 + 2 * cfg.n_layer
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {18}


def test_tied_matrix_stored_once_and_file_size(lm_onnx, tiny_ckpt):
    ck = load_checkpoint(tiny_ckpt)
    V, E = ck.config.vocab_size, ck.config.n_embd
    model = onnx.load(str(lm_onnx / "model.onnx"))
    tied = [i.name for i in model.graph.initializer if sorted(i.dims) == sorted([V, E])]
    assert len(tied) == 1, f"the embedding / lm_head matrix is stored {len(tied)} times: {tied}"
    unique_bytes = 4 * ck.model.num_parameters()
    size = (lm_onnx / "model.onnx").stat().st_size
    assert unique_bytes <= size <= 1.05 * unique_bytes + 40_000, (size, unique_bytes)


def test_node_names_follow_pytorch_modules(lm_onnx):
    names = {n.name for n in onnx.load(str(lm_onnx / "model.onnx")).graph.node}
    assert "/transformer/h.0/attn/c_attn/MatMul" in names
    assert "/transformer/h.1/mlp/c_fc/MatMul" in names
    assert len(names) == len(onnx.load(str(lm_onnx / "model.onnx")).graph.node)  # unique


@pytest.mark.parametrize("b,s,p", [(1, 1, 0), (4, 32, 0), (1, 1, 31), (4, 1, 17), (2, 5, 27),
                                   (3, 16, 16), (4, 2, 1)])
def test_any_mix_of_batch_sequence_and_past(lm_onnx, tiny_ckpt, b, s, p):
    ck = load_checkpoint(tiny_ckpt)
    sess = cpu_session(lm_onnx / "model.onnx")
    ids = np.random.default_rng(b * 100 + s * 10 + p).integers(0, ck.config.vocab_size, (b, p + s))
    feeds = case_feeds(ck.model, ck.config, "decoder_with_past", ids, p, pad=0)
    names = [o.name for o in sess.get_outputs()]
    ours = sess.run(names, feeds)
    ref = torch_outputs(ck.model, "decoder_with_past", feeds, ck.config.n_layer)
    assert ours[0].shape == (b, s, ck.config.vocab_size)
    assert ours[1].shape == (b, ck.config.n_head, p + s, ck.config.head_dim)
    for name, o, r in zip(names, ours, ref):
        assert_close(o, r, reorder_bound(ck.config, float(np.abs(r).max())), name)


def test_verify_passes_and_writes_a_report(lm_onnx, tiny_ckpt, tmp_path):
    report = verify(tiny_ckpt, lm_onnx, report_path=tmp_path / "r.json")
    assert report["passed"], report["failures"]
    saved = json.loads((tmp_path / "r.json").read_text())
    logits = saved["worst"]["logits"]
    assert logits["max_abs"] <= logits["bound"] == saved["tolerances"]["logits"]
    assert logits["bound"] < 1e-3  # fp32 rounding at this depth and width, not a loose constant
    shapes = {(c["batch"], c["sequence"], c["past"]) for c in saved["cases"]}
    assert (1, 1, 0) in shapes and (3, 32, 0) in shapes and (1, 1, 31) in shapes
    assert {c["inputs"] for c in saved["cases"]} == {"random", "corpus", "left-padded"}
    assert all(c["outputs"]["logits"]["top1_agreement"] == 1.0 for c in saved["cases"])
    assert len(saved["generation"]) == 4 and all(g["identical"] for g in saved["generation"])
    assert all(g["tokens"] > 0 for g in saved["generation"])


def test_verify_fails_for_another_models_export(lm_onnx, tiny_cfgs, corpus_dir, tmp_path):
    import dataclasses

    from tinyt.train import train
    m, t = tiny_cfgs
    other = train(m, dataclasses.replace(t, seed=99, max_steps=2), tmp_path / "other",
                  data=str(corpus_dir), log=lambda s: None)
    report = verify(other, lm_onnx)
    assert not report["passed"]
    assert any(f.startswith("logits: max abs diff") for f in report["failures"])


def test_no_cache_and_classifier_graphs(tiny_ckpt, tiny_clf, tmp_path):
    out = export_onnx(tiny_ckpt, tmp_path / "nocache", with_past=False)
    model = onnx.load(str(out / "model.onnx"))
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in model.graph.output] == ["logits"]
    assert verify(tiny_ckpt, out)["passed"]

    clf = tiny_clf
    out = export_onnx(clf, tmp_path / "clf-onnx")
    model = onnx.load(str(out / "model.onnx"))
    assert {v.name: dims(v) for v in model.graph.output} == {"logits": ["batch_size", 2]}
    hf = json.loads((out / "config.json").read_text())
    assert hf["id2label"] == {"0": "maths", "1": "strings"}
    report = verify(clf, out)
    assert report["passed"] and report["graph"] == "classifier"


def test_export_of_an_imported_nanogpt_checkpoint(tmp_path):
    from nanogpt_reference import nanogpt_ckpt

    from tinyt.nanogpt import import_nanogpt
    nanogpt_ckpt(tmp_path / "ckpt.pt")
    ck = import_nanogpt(tmp_path / "ckpt.pt", tmp_path / "imported", tokenizer="byte")
    out = export_onnx(ck, tmp_path / "onnx")
    assert verify(ck, out)["passed"]


def test_bad_export_input(tiny_ckpt, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        export_onnx(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(ManifestError, match="is or holds the input"):
        export_onnx(tiny_ckpt, tiny_ckpt)
    with pytest.raises(ManifestError, match="is or holds the input"):
        export_onnx(tiny_ckpt, tiny_ckpt.parent)  # would wipe the checkpoint with it
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(ManifestError, match="exists and is not a tinyt artifact directory"):
        export_onnx(tiny_ckpt, tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
    with pytest.raises(ExportError, match=r"opset=99 cannot be written here: allowed 18\.\."):
        export_onnx(tiny_ckpt, tmp_path / "out", opset=99)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_ckpt, broken)
    (broken / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        export_onnx(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "notes"]  # no leftovers


def test_tampered_artifact_is_refused(lm_onnx, tiny_ckpt, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(lm_onnx, copy)
    data = bytearray((copy / "model.onnx").read_bytes())
    data[-100] ^= 0xFF
    (copy / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="model.onnx does not match its sha256"):
        verify(tiny_ckpt, copy)
    shutil.copy(lm_onnx / "model.onnx", copy / "model.onnx")
    (copy / "tokenizer.json").unlink()
    with pytest.raises(ManifestError, match="tokenizer.json is listed in manifest.json but missing"):
        verify(tiny_ckpt, copy)


@pytest.mark.slow
def test_export_and_verify_cli(tiny_ckpt, tmp_path):
    tinyt = run_tinyt
    proc = tinyt("export", tiny_ckpt, tmp_path / "onnx")
    assert proc.returncode == 0, proc.stderr
    proc = tinyt("verify", tiny_ckpt, tmp_path / "onnx")
    assert proc.returncode == 0, proc.stderr
    assert "passed" in proc.stdout and (tmp_path / "onnx-verify.json").is_file()
    # the sizes it checked: the tiny model's whole (learned) block of 32, batch 3
    assert "checked sequences of up to 32 tokens (batch up to 3, positions up to 31) of the " \
        "context 32" in proc.stdout, proc.stdout
    (tmp_path / "onnx" / "config.json").write_text("{}")
    proc = tinyt("verify", tiny_ckpt, tmp_path / "onnx")
    assert proc.returncode == 2 and "config.json does not match its sha256" in proc.stderr
    proc = tinyt("export", tiny_ckpt, tmp_path / "x", "--opset", "12")
    assert proc.returncode == 2 and "opset=12 cannot be written here" in proc.stderr


def test_the_greedy_check_forgives_only_a_tie_at_fp32_precision(tiny_ckpt, monkeypatch):
    """verify's one greedy check (contract graphs and the shared-cache runtime alike): tokens
    that differ where PyTorch's two candidates are more than the tie bound apart fail it; a
    difference at a tie is recorded with its margin, not failed."""
    import torch

    from tinyt.checkpoint import load_checkpoint
    from tinyt.export import verifier
    from tinyt.model import generate

    ck = load_checkpoint(tiny_ckpt)
    model, limit = ck.model.eval(), verifier.vocab_limit(ck.tokenizer, ck.config)

    def runner_up_first(prompt, n):  # PyTorch's tokens, the first replaced by its runner-up
        ref = generate(model, torch.tensor([prompt]), n, temperature=0,
                       vocab_limit=limit)[0, len(prompt):].tolist()
        with torch.no_grad():
            z = model(torch.tensor([prompt]))[0][0, -1, :limit]
        return [int(z.topk(2).indices[1])] + ref[1:]

    failures: list[str] = []
    gen = verifier.greedy_generation(model, ck.tokenizer, 32, 4, runner_up_first, failures)
    margins = [g["first_difference"]["torch_logit_margin"] for g in gen]
    assert all(g["first_difference"]["position"] == 0 for g in gen)
    ties = [g["first_difference"]["tie_bound"] for g in gen]
    assert len(failures) == sum(m > t for m, t in zip(margins, ties)) > 0
    assert "more than a tie at fp32 precision" in failures[0]
    monkeypatch.setattr(verifier, "TIE_FACTOR", 1e9)  # every one a "tie" now
    failures = []
    verifier.greedy_generation(model, ck.tokenizer, 32, 4, runner_up_first, failures)
    assert failures == []
    same = verifier.greedy_generation(  # PyTorch against itself: identical, nothing recorded
        model, ck.tokenizer, 32, 4, lambda p, n: generate(
            model, torch.tensor([p]), n, temperature=0, vocab_limit=limit)[0, len(p):].tolist(),
        failures)
    assert failures == [] and all(g["identical"] and "first_difference" not in g for g in same)
