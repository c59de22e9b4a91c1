"""The real all-MiniLM-L6-v2 (scripts/setup-real.sh) through the main job, `tinyt pipeline
--skip-train`, as a user runs it (issue 48): the pipeline exits 0; the fp32 graph gives
sentence-transformers' own embeddings; the INT8 artifact it builds keeps recall@10 and cosine
to fp32 on the standard library's docstrings (export/retrieval_set.py), recomputed here from
the artifacts through tinyt.runtime, not read from the report alone.

Bounds:
- fp32 against sentence-transformers' encode: the same arithmetic in another order. float32
  sums over 384-wide rows through 6 layers leave a relative error of ~1e-6 in a unit
  embedding, so 1 - cos ~ |error|^2 / 2 ~ 1e-12; FP32_COSINE = 0.99999 allows an error of
  0.45% (measured: cos 1.000000, 1 - cos < 1e-7 for every text).
- INT8 against fp32: issue 48's targets (recall@10 >= 0.99, cosine >= 0.999 mean), real-model
  figures, not tuned here: recall@10 counts whole hits of 500 (0.99: at most 5 of fp32's 500
  top-10 passages lost).
- The report against the recomputation: the reference in batches of 32 in both, the candidate
  (independent rows) too, so embeddings agree to float summation order (~1e-7) and a ranking
  flips only between two scores that close: at most one passage of one query (ONE_PASSAGE).
- `tinyt serve` against tinyt.runtime on the same INT8 artifact: the same graph on the same
  ONNX Runtime, only the rows batched and padded otherwise (the server's Embedder groups the
  waiting texts). Its int8 activations are quantized per row (the manifest's
  `rows_independent`), so a row's arithmetic differs by float32 summation order at most:
  ~1e-7 in a unit embedding, 1 - cos ~ 1e-14. SERVE_COSINE = 0.99999 (issue 48's figure)
  allows a relative error of 0.45%: any reordering passes, but it barely tells the INT8 graph
  from the fp32 one (their 1 - cos on SERVE_TEXTS: 1.4e-5 to 6.5e-5), so the values are held
  to SERVE_ATOL as well, tests/server's 1e-6 reorder bound grown tenfold for six real layers
  (INT8 against fp32 there: 1.7e-3). Measured: bit-identical (worst |diff| 0).
- The web package: `tinyt package --format web` checks the page's module under Node (the
  onnxruntime-web WebAssembly files the page loads; not a browser) against tinyt.runtime
  within export/web/text.py's WEB_INT8_ATOL (2e-2: where the two backends round an activation
  to neighbouring int8 steps, the step travels through the layers); the manifest records that
  check, asserted here. The page itself then runs in headless Chromium on SERVE_TEXTS, held
  to the same bound. Measured: 2.2e-7 under Node and in Chromium alike.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from tinyt.export.accuracy import ENCODER_TARGETS, RECALL_K, cosines, recall_at_k, top_k
from tinyt.export.retrieval_set import docstring_set

pytestmark = [pytest.mark.real, pytest.mark.slow]

FP32_COSINE = 0.99999
INT8_TARGETS = {"cosine_mean": 0.999, "recall_at_10": 0.99}  # issue 48
RECOMPUTE_ATOL = 1e-5
ONE_PASSAGE = 1 / (RECALL_K * len(docstring_set().queries))
SERVE_COSINE = 0.99999
SERVE_ATOL = 1e-5
# real docstrings, one text past the model's cut (256 tokens), accents and scripts
SERVE_TEXTS = [*docstring_set().passages[:6], "Ünïcode café — ΟΔΟΣ İstanbul ß ﬁ 東京",
               "the quick brown fox jumps over the lazy dog. " * 80]


@pytest.fixture(scope="module")
def minilm_run(minilm_dir, tmp_path_factory, main_job):
    """(the work folder, the main job's CompletedProcess) on the real MiniLM."""
    work = tmp_path_factory.mktemp("minilm")
    return work, main_job(minilm_dir, work)


def _embed(path, texts):
    import tinyt.runtime as rt
    return rt.load(path, threads=2).embed(texts, batch_size=32)


def test_pipeline_takes_real_minilm(minilm_run):
    work, run = minilm_run
    out = run.stdout
    assert run.returncode == 0, run.stderr[-3000:]
    for d in ("onnx", "onnx-opt", "onnx-int8"):
        assert (work / "out" / d / "model.onnx").is_file(), d
    assert "verified vs PyTorch" in out and "FAILED" not in out, out
    assert "targets cosine_mean >= 0.999, recall_at_10 >= 0.99 met" in out, out
    assert "Not built: static INT8" in out and "--no-bench" in out, out


def test_fp32_is_sentence_transformers_encode(minilm_dir, minilm_run):
    from sentence_transformers import SentenceTransformer
    work = minilm_run[0]
    rs = docstring_set()
    texts = [*rs.queries, *rs.passages]
    want = SentenceTransformer(str(minilm_dir), device="cpu").encode(
        texts, batch_size=32, convert_to_numpy=True)
    for d in ("onnx", "onnx-opt"):
        got = _embed(work / "out" / d, texts)
        assert got.shape == want.shape, (d, got.shape, want.shape)
        assert got.dtype == want.dtype == np.float32, (d, got.dtype, want.dtype)
        cos = cosines(got, want)
        assert cos.min() >= FP32_COSINE, (d, float(cos.min()), texts[int(cos.argmin())])


def test_int8_keeps_recall_and_cosine_on_the_docstring_set(minilm_run):
    work = minilm_run[0]
    rs = docstring_set()
    texts, n = [*rs.queries, *rs.passages], len(rs.queries)
    a = json.loads((work / "out" / "onnx-int8" / "manifest.json").read_text())["accuracy"]
    assert (a["set_digest"], a["texts"]) == (rs.digest, len(texts))
    assert a["targets"] == ENCODER_TARGETS and a["meets_targets"], a
    x, y = _embed(work / "out" / "onnx-opt", texts), _embed(work / "out" / "onnx-int8", texts)
    cos = cosines(x, y)
    hits = recall_at_k(top_k(x[:n], x[n:], RECALL_K), top_k(y[:n], y[n:], RECALL_K))
    recall = int(hits.sum()) / (RECALL_K * n)
    figures = {"cosine_mean": float(cos.mean()), "recall_at_10": recall}
    for key, floor in INT8_TARGETS.items():
        assert figures[key] >= floor, (key, figures, float(cos.min()))
    assert abs(a["cosine_mean"] - cos.mean()) <= RECOMPUTE_ATOL
    assert abs(a["cosine_min"] - cos.min()) <= RECOMPUTE_ATOL
    assert abs(a["recall_at_10"] - recall) <= ONE_PASSAGE + 1e-12
    # A real model finds a query's own docstring passage in its top 10 (measured 0.76 of the
    # queries; random weights: ~10 x 1.4 / 500 = 0.03). A query loses that only by losing one
    # of fp32's top 10, so INT8's rate falls by at most the lost hits over the queries.
    assert a["hit_rate_at_10_reference"] >= 0.5, a
    lost = round((1 - a["recall_at_10"]) * RECALL_K * n)  # the report's own, whole hits
    assert a["hit_rate_at_10"] >= a["hit_rate_at_10_reference"] - lost / n - 1e-12, a


def _same_embeddings(got, want, what, *, atol, cosine=None):
    """Shape, then dtype, then values: the worst |difference| (and the lowest cosine)."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == want.dtype == np.float32, (what, got.dtype, want.dtype)
    worst = float(np.abs(got - want).max())
    assert worst <= atol, f"{what}: worst difference {worst:.2e} > {atol:.0e}"
    if cosine is not None:
        cos = cosines(got, want)
        assert cos.min() >= cosine, (what, float(cos.min()), SERVE_TEXTS[int(cos.argmin())][:60])


def test_serve_answers_the_runtimes_embeddings(minilm_run):
    """`tinyt serve OUT/onnx-int8` on loopback: POST /v1/embeddings gives tinyt.runtime's
    embeddings of the same artifact (SERVE_COSINE and SERVE_ATOL, module docstring)."""
    from live_server import Server

    artifact = minilm_run[0] / "out" / "onnx-int8"
    want = _embed(artifact, SERVE_TEXTS)
    s = Server(artifact)
    try:
        # the server's model id is the artifact's folder name
        status, text, _ = s.post("/v1/embeddings", {"model": artifact.name, "input": SERVE_TEXTS})
        assert status == 200, text
        data = sorted(json.loads(text)["data"], key=lambda d: d["index"])
        got = np.array([d["embedding"] for d in data], dtype=np.float32)
        _same_embeddings(got, want, "serve", atol=SERVE_ATOL, cosine=SERVE_COSINE)
        status, text, _ = s.post("/v1/embeddings", {"model": artifact.name,
                                                    "input": SERVE_TEXTS[0]})  # one alone
        assert status == 200, text
        got = np.array([json.loads(text)["data"][0]["embedding"]], dtype=np.float32)
        _same_embeddings(got, want[:1], "serve, one text", atol=SERVE_ATOL, cosine=SERVE_COSINE)
    finally:
        assert s.stop() in (0, -15)


@pytest.fixture(scope="module")
def minilm_web(minilm_run, tmp_path_factory):
    """(the INT8 artifact, `tinyt package OUT/onnx-int8 WEB --format web`'s CompletedProcess,
    WEB)."""
    artifact = minilm_run[0] / "out" / "onnx-int8"
    web = tmp_path_factory.mktemp("minilm-web") / "web"
    done = subprocess.run([sys.executable, "-m", "tinyt", "package", artifact, web, "--format",
                           "web"], capture_output=True, text=True)
    return artifact, done, web


def test_web_package_checks_the_page_against_the_runtime(minilm_web):
    """The package stage's own check, as its manifest records it: the rows (ids and token
    types) of its check texts equal tinyt's, and their embeddings are within WEB_INT8_ATOL of
    tinyt.runtime's."""
    from tinyt.export.web.text import WEB_INT8_ATOL
    from tinyt.export.web.tools import CHECK_TEXTS

    done, web = minilm_web[1:]
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"package: {web}" in done.stdout, done.stdout
    m = json.loads((web / "manifest.json").read_text())
    assert (m["package_format"], m["graph"]) == ("web", "encoder")
    checked = m["web"]["checked"]
    assert checked["runtime"].startswith("node ") and checked["rows_equal"], checked
    assert checked["embed"] == len(CHECK_TEXTS) + 1, checked  # and one text past the cut
    assert checked["tolerance"] == WEB_INT8_ATOL and checked["worst"] <= WEB_INT8_ATOL, checked
    # where the page cuts a text: where the runtime does, sentence-transformers' max_seq_length
    assert m["web"]["max_length"] == 256, m["web"]


def test_web_page_embeds_as_the_runtime_in_chromium(minilm_web):
    """The packaged page in headless Chromium (texts from the URL) against tinyt.runtime on
    the same INT8 artifact, within the stage's WEB_INT8_ATOL."""
    from tinyt.export.web.text import WEB_INT8_ATOL

    from .web_page import page_result

    artifact, done, web = minilm_web
    assert done.returncode == 0, done.stderr[-2000:]
    got = page_result(web, {"text": SERVE_TEXTS})
    _same_embeddings(np.array(got["embeddings"], dtype=np.float32),
                     _embed(artifact, SERVE_TEXTS), "page in Chromium", atol=WEB_INT8_ATOL)
