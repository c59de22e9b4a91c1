"""The torch-free boundary: an edge install (numpy + onnxruntime, no torch) can import the
runtime side of tinyt and run the CLI's help."""
import subprocess
import sys

BLOCK_TORCH = "import sys; sys.modules['torch'] = None  # any 'import torch' now fails\n"


def run_without_torch(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], capture_output=True,
                          text=True, timeout=60)


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
    proc = run_without_torch("from tinyt.cli import main; sys.argv = ['tinyt', '--help']; main()")
    assert proc.returncode == 0, proc.stderr
    for verb in ("train", "sample", "import-nanogpt", "presets"):
        assert verb in proc.stdout
    proc = run_without_torch("from tinyt.cli import main; sys.argv = ['tinyt', 'presets']; main()")
    assert proc.returncode == 0 and "demo (default)" in proc.stdout
