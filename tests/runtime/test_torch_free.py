"""The torch-free boundary: an edge install (numpy + onnxruntime, no torch) can import the
runtime side of tinyt and run the CLI's help."""
import subprocess
import sys

BLOCK_TORCH = "import sys; sys.modules['torch'] = None  # any 'import torch' now fails\n"


def run_without_torch(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], capture_output=True,
                          text=True, timeout=300)


def test_blocking_works():
    proc = run_without_torch("import torch")
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


def test_torch_free_modules_import():
    proc = run_without_torch(
        "import tinyt, tinyt.runtime, tinyt.config, tinyt.tokenizer, tinyt.contract, tinyt.data\n"
        "from tinyt.tokenizer import Tokenizer\n"
        "t = Tokenizer.byte_level(); assert t.decode(t.encode('ok')) == 'ok'\n"
        "from tinyt.config import preset; preset('demo')\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('fine')\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "fine"


def test_cli_help_without_torch():
    proc = run_without_torch("from tinyt.__main__ import entry; sys.argv = ['tinyt', '--help']; entry()")
    assert proc.returncode == 0, proc.stderr
    for verb in ("train", "sample", "import-nanogpt", "presets"):
        assert verb in proc.stdout
    proc = run_without_torch("from tinyt.__main__ import entry; sys.argv = ['tinyt', 'presets']; entry()")
    assert proc.returncode == 0 and "demo (default)" in proc.stdout


def test_onnx_stages_run_without_torch(lm_onnx, corpus_dir, tmp_path):
    """optimize, quantize (dynamic, and static calibrating from the corpus through the
    tokenizer) and package need onnxruntime, onnx and onnxscript (extra 'onnx'), not torch."""
    steps = [["optimize", lm_onnx, tmp_path / "opt"],
             ["quantize", tmp_path / "opt", tmp_path / "int8", "--data", corpus_dir],
             ["quantize", lm_onnx, tmp_path / "qdq", "--mode", "static", "--data", corpus_dir],
             ["package", tmp_path / "int8", tmp_path / "edge"],
             ["optimize", tmp_path / "int8", tmp_path / "gqa", "--target", "gqa"]]
    code = "".join(
        f"sys.argv = {['tinyt', *map(str, argv)]!r}\n"
        "try:\n    entry()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        for argv in steps)
    proc = run_without_torch(
        "from tinyt.__main__ import entry\n" + code +
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('fine')\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("fine")
    for name in ("opt", "int8", "qdq", "edge", "gqa"):
        assert (tmp_path / name / "manifest.json").is_file()
