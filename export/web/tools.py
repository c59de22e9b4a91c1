"""What the web packages share (the decoder's in __init__, the encoder's and classifier's in
text.py): where onnxruntime-web and the tokenizer library are, node, the module's check."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from tinyt.errors import WebPackageError

ORT_WEB_VERSION = "1.30.0"
ORT_WEB_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
TOKENIZERS_JS_VERSION = "0.2.0"  # @huggingface/tokenizers (npm), what tinyt.mjs is checked with
TOKENIZERS_JS_FILE = "tokenizers.min.mjs"
TOKENIZER_MODELS = ("BPE", "WordPiece", "Unigram")  # what it runs (it reads others as a guess)
PAGE_FILES = ("tinyt.mjs", "tokenizer.mjs", "offsets.mjs", "index.html")  # offsets.mjs: tag's
# character offsets; tokenizer.mjs: the tokenizer (and TinytWebError) tinyt.mjs re-exports
ASSETS = Path(__file__).parent  # tinyt.mjs, offsets.mjs, index.html, check.mjs beside this module
REPO_WEB = Path(__file__).resolve().parents[2] / "web"  # the checkout's web/package.json (npm)
GQA_WEB_INPUTS = 16  # GroupQueryAttention's inputs in onnxruntime-web 1.30


def ort_web_dist() -> Path:
    """Where onnxruntime-web's files are: $TINYT_ORT_WEB_DIST, or the checkout's
    web/node_modules (scripts/setup-web.sh installs it there)."""
    env = os.environ.get("TINYT_ORT_WEB_DIST")
    dist = Path(env) if env else REPO_WEB / "node_modules" / "onnxruntime-web" / "dist"
    missing = [f for f in ORT_WEB_FILES if not (dist / f).is_file()]
    if missing:
        raise WebPackageError(f"onnxruntime-web {ORT_WEB_VERSION} is not installed ({dist} lacks "
                              f"{', '.join(missing)}): run `bash scripts/setup-web.sh`, or set "
                              "TINYT_ORT_WEB_DIST to its dist folder")
    version = json.loads((dist.parent / "package.json").read_text()).get("version")
    if version != ORT_WEB_VERSION:
        raise WebPackageError(f"{dist} is onnxruntime-web {version}; tinyt's web module is "
                              f"checked with {ORT_WEB_VERSION} (bash scripts/setup-web.sh)")
    return dist


def tokenizers_js_dist() -> Path:
    """Where @huggingface/tokenizers' browser build is: $TINYT_TOKENIZERS_JS_DIST, or the
    checkout's web/node_modules (scripts/setup-web.sh installs it there)."""
    env = os.environ.get("TINYT_TOKENIZERS_JS_DIST")
    dist = Path(env) if env else REPO_WEB / "node_modules" / "@huggingface" / "tokenizers" / "dist"
    if not (dist / TOKENIZERS_JS_FILE).is_file():
        raise WebPackageError(f"@huggingface/tokenizers {TOKENIZERS_JS_VERSION} is not installed "
                              f"({dist} lacks {TOKENIZERS_JS_FILE}): run `bash "
                              "scripts/setup-web.sh`, or set TINYT_TOKENIZERS_JS_DIST to its dist "
                              "folder")
    version = json.loads((dist.parent / "package.json").read_text()).get("version")
    if version != TOKENIZERS_JS_VERSION:
        raise WebPackageError(f"{dist} is @huggingface/tokenizers {version}; tinyt's web "
                              f"module is checked with {TOKENIZERS_JS_VERSION} (bash "
                              "scripts/setup-web.sh)")
    return dist


def copy_runtime(out: Path) -> list[str]:
    """onnxruntime-web, the tokenizer library and the page into `out`; the names written."""
    for dist, names in ((ort_web_dist(), ORT_WEB_FILES), (tokenizers_js_dist(),
                                                          (TOKENIZERS_JS_FILE,))):
        for f in names:
            shutil.copy2(dist / f, out / f)
    for f in PAGE_FILES:
        shutil.copy2(ASSETS / f, out / f)
    return [*ORT_WEB_FILES, TOKENIZERS_JS_FILE, *PAGE_FILES]


def node() -> str:
    found = shutil.which("node")
    if not found:
        raise WebPackageError("node is not installed: the web package is checked by running its "
                              "module under Node before it is written (bash scripts/setup-web.sh)")
    return found


def node_version() -> str:
    return subprocess.run([node(), "--version"], capture_output=True, text=True).stdout.strip()


def run_module(package_dir: Path, request: dict, timeout: float = 600) -> dict:
    """Run the package's tinyt.mjs under Node (check.mjs) on a request."""
    proc = subprocess.run([node(), str(ASSETS / "check.mjs"), str(package_dir)],
                          input=json.dumps(request), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise WebPackageError(f"the web module failed under Node: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


# Text the package's tokenizer must encode to tinyt's ids before anything is written: code,
# accents, scripts, emoji, the two spaces JavaScript's \s and Unicode disagree on, control
# characters, an empty text.
CHECK_TEXTS = ["def main():\n    return 0\n", "héllo wörld 😀 — 你好", "",
               "Ünïcode café — ΟΔΟΣ İstanbul ß ﬁ", "東京 한국어 عربى 👩‍👩‍👧‍👦 🇫🇷",
               "bom\ufeff next\x85line \u2028 \u3000 \xa0", "\x00\x01 ctrl\x1b[0m \x7f\t\r\n  ",
               "supercalifragilisticexpialidocious" * 4, "   "]
