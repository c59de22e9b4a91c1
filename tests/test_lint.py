"""The code checks CI runs with the suite: ruff's lint over the tree and mypy over the torch-free
modules (both configured in pyproject.toml; the dev extra installs them)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_ruff_finds_nothing():
    proc = check("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_passes_on_the_torch_free_modules():
    proc = check("mypy")
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout[-4000:] + proc.stderr


# The house's sizes (issue 49): no module of the product over 500 lines (its Python and the web
# page's ES modules), no function over 80; tests and lab/ (evidence scripts) are not the product
PRODUCT = ("tinyt", "export", "runtime", "app", "server", "benchmarks")
MODULE_LINES, FUNCTION_LINES = 500, 80


def _product_files(*suffixes: str) -> list[Path]:
    return [p for d in PRODUCT for s in suffixes for p in sorted((ROOT / d).rglob(f"*{s}"))
            if "node_modules" not in p.parts and not p.name.endswith(".min.mjs")]


def test_no_module_over_500_lines_and_no_function_over_80():
    import ast

    files = _product_files(".py", ".mjs")
    assert len(files) > 150
    long_modules = [f"{p.relative_to(ROOT)}: {n}" for p in files
                    if (n := len(p.read_text().splitlines())) > MODULE_LINES]
    long_functions = [f"{p.relative_to(ROOT)}:{f.lineno} {f.name}: {n}"
                      for p in files if p.suffix == ".py"
                      for f in ast.walk(ast.parse(p.read_text()))
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and (n := f.end_lineno - f.lineno + 1) > FUNCTION_LINES]
    assert not long_modules and not long_functions, (long_modules, long_functions)
