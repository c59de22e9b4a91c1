"""The CLI end to end, as a user runs it (a subprocess per call)."""
import json

import pytest
from conftest import run_tinyt


def tinyt(*args, ok=True):
    proc = run_tinyt(*args)
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("args,needle", [
    (["train", "--preset", "huge"], "error: unknown preset 'huge'; available presets: test, demo"),
    (["train", "--n-head", "3"], "error: n_embd=128 is invalid: must be divisible by n_head=3"),
    (["train", "--resume", "--n-layer", "3"], "drop --n-layer"),
    (["train", "--tokenizer", "sentencepiece"], "tokenizer='sentencepiece' is invalid"),
    (["sample", "/no/such/dir"], "error: checkpoint directory /no/such/dir does not exist"),
])
def test_bad_input_is_one_clear_line(args, needle, tmp_path):
    proc = tinyt(*args, "--out", tmp_path / "o", ok=False) if args[0] == "train" \
        else tinyt(*args, ok=False)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_sample_greedy(tiny_ckpt):
    out = tinyt("sample", tiny_ckpt, "--prompt", "def alpha", "--max-new-tokens", "8",
                "--temperature", "0").stdout
    assert out.startswith("def alpha") and len(out) > len("def alpha")
    again = tinyt("sample", tiny_ckpt, "--prompt", "def alpha", "--max-new-tokens", "8",
                  "--temperature", "0").stdout
    assert out == again


def test_sample_rejects_bad_arguments(tiny_ckpt):
    proc = tinyt("sample", tiny_ckpt, "--prompt", "", ok=False)
    assert proc.returncode == 2 and "the prompt is empty" in proc.stderr
    proc = tinyt("sample", tiny_ckpt, "--temperature", "nan", ok=False)
    assert proc.returncode == 2 and "temperature=nan must be a finite number" in proc.stderr


@pytest.mark.slow
def test_train_stop_and_resume_from_the_cli(corpus_dir, tmp_path):
    out = tmp_path / "ck"
    common = ["--preset", "test", "--data", corpus_dir, "--max-steps", "6", "--eval-interval", "3"]
    tinyt("train", *common, "--out", out, "--stop-after", "3")
    assert json.loads((out / "config.json").read_text())["metrics"]["step"] == 3
    proc = tinyt("train", *common, "--out", out, ok=False)
    assert proc.returncode == 2 and "pass --resume" in proc.stderr
    proc = tinyt("train", "--out", out, "--resume")
    assert "resuming" in proc.stderr and "at step 3 of 6" in proc.stderr
    assert json.loads((out / "config.json").read_text())["metrics"]["step"] == 6


@pytest.mark.slow
def test_train_classifier_from_the_cli(labelled_dir, tmp_path):
    out = tmp_path / "clf"
    tinyt("train", "--task", "classifier", "--preset", "test", "--data", labelled_dir,
          "--max-steps", "4", "--out", out)
    meta = json.loads((out / "config.json").read_text())
    assert meta["model"]["task"] == "classifier" and meta["model"]["num_labels"] == 2
    assert meta["labels"] == ["maths", "strings"] and "val_accuracy" in meta["metrics"]
    proc = tinyt("sample", out, ok=False)
    assert proc.returncode == 2 and "is a classifier checkpoint" in proc.stderr


def test_import_nanogpt_from_the_cli(tmp_path):
    from nanogpt_reference import nanogpt_ckpt
    nanogpt_ckpt(tmp_path / "ckpt.pt")
    proc = tinyt("import-nanogpt", tmp_path / "ckpt.pt", tmp_path / "imported", "--tokenizer",
                 "byte")
    assert "checkpoint:" in proc.stdout
    out = tinyt("sample", tmp_path / "imported", "--max-new-tokens", "4").stdout
    assert out.startswith("def ")


@pytest.mark.slow
def test_generate_logprobs_and_json_schema(lm_onnx, tmp_path):
    import tinyt.runtime as rt

    proc = tinyt("generate", lm_onnx, "def alpha", "--max-new-tokens", "5", "--temperature",
                 "0", "--logprobs", "2")
    out = json.loads(proc.stdout)
    lm = rt.load(lm_onnx, threads=1)
    want = lm.generate_details(["def alpha"], max_new_tokens=5, logprobs=2)[0]
    assert [t["id"] for t in out["tokens"]] == want.token_ids and out["text"] == want.text
    for t, lp in zip(out["tokens"], want.logprobs):
        assert abs(t["logprob"] - lp.logprob) <= 1e-4 and len(t["top"]) == 2
        assert t["text"] == lm.tokenizer.decode([t["id"]])
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "boolean"}))
    proc = tinyt("generate", lm_onnx, "x = ", "--json-schema", schema, "--max-new-tokens", "8")
    assert json.loads(proc.stdout[len("x = "):]) in (True, False)
    schema.write_text("{not json")
    proc = tinyt("generate", lm_onnx, "x", "--json-schema", schema, ok=False)
    assert proc.returncode == 2 and "not a readable JSON file" in proc.stderr


def test_generate_classify_and_info(lm_onnx, tiny_clf, tmp_path):
    proc = tinyt("generate", lm_onnx, "def alpha", "--max-new-tokens", "6", "--temperature", "0")
    assert proc.stdout.startswith("def alpha") and len(proc.stdout.strip()) > len("def alpha")
    proc = tinyt("generate", lm_onnx, "def ", "--top-p", "2", ok=False)
    assert proc.returncode == 2 and "top_p=2.0 is invalid" in proc.stderr
    assert proc.stdout == ""  # checked before anything is printed
    proc = tinyt("generate", lm_onnx, "def ", "--provider", "cuda", ok=False)
    assert proc.returncode == 2 and "available: " in proc.stderr
    from tinyt.export import export_onnx
    clf = export_onnx(tiny_clf, tmp_path / "clf")
    proc = tinyt("classify", clf, "x = sum(sum_1, 2)", "y = join(a)")
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.split("\t")[0] in ("maths", "strings") for line in lines)
    assert tinyt("generate", clf, "x", ok=False).returncode == 2
    proc = tinyt("info")
    assert "onnxruntime providers: " in proc.stdout and "int8 preset:" in proc.stdout
