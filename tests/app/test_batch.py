"""`tinyt batch` without Ray (the default run): every task's output against the runtime's own
answer, row keys, a crash and its restart (finished parts kept, a half-written part never
seen, no row twice), the refusals, Parquet in and out, and the CLI; the Ray Data actor (PartActor, Ray-free
itself) runs parts as the local runner does (tests/server/test_ray_cluster.py runs it on a
cluster)."""
import json

import numpy as np
import pytest
from conftest import assert_close, run_tinyt

import tinyt.runtime as rt
from tinyt.app import batch as b
from tinyt.errors import ConfigError

# The same texts run in other batches (other padding) move the last bits of an embedding: the
# server's embeddings tests hold the same bound (tests/server/test_server_embeddings.py)
ATOL = 1e-6
TEXTS = [f"def f_{i}(x):\n    return x * {i}" + " + x" * (i % 4) for i in range(11)]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A one-layer sentence-transformers BertModel exported as an encoder artifact."""
    from hf_fixtures import save_bert

    from tinyt.export import export_onnx
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("batch-enc")
    save_bert(root / "st", num_hidden_layers=1)
    import_hf(root / "st", root / "ckpt")
    return export_onnx(root / "ckpt", root / "minilm")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("batch-in") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"doc-{i}", "text": t}) + "\n"
                            for i, t in enumerate(TEXTS)) + "\n")  # a blank last line: no row
    return path


def test_embed_rows_keyed_and_equal_to_the_runtime(encoder, corpus, tmp_path):
    summary = b.batch(encoder, corpus, tmp_path / "out", task="embed", part_rows=4,
                      log=lambda s: None)
    assert (summary["rows"], summary["parts"], summary["ran"]) == (11, 3, 3)
    out = b.read_output(tmp_path / "out")
    assert [r["row"] for r in out] == list(range(11))
    assert [r["id"] for r in out] == [f"doc-{i}" for i in range(11)]
    want = rt.load(encoder, threads=1).embed(TEXTS)
    assert_close(np.array([r["embedding"] for r in out], dtype=np.float32), want, ATOL,
                 "batch embeddings vs Encoder.embed")


def test_generate_and_classify_answer_as_the_runtime(lm_onnx, tiny_clf, corpus, tmp_path):
    from tinyt.export import export_onnx

    b.batch(lm_onnx, corpus, tmp_path / "gen", task="generate", part_rows=5,
            options={"max_tokens": 6}, log=lambda s: None)
    lm = rt.load(lm_onnx, threads=1)
    want = [r.text for s in range(0, 11, 5)  # each part is one batch of the runtime
            for r in lm.generate_details(TEXTS[s:s + 5], max_new_tokens=6, temperature=0.0)]
    assert [r["text"] for r in b.read_output(tmp_path / "gen")] == want
    clf = export_onnx(tiny_clf, tmp_path / "clf")
    b.batch(clf, corpus, tmp_path / "cls", task="classify", part_rows=5, log=lambda s: None)
    got = b.read_output(tmp_path / "cls")
    assert [r["label"] for r in got] == [p.label for p in rt.load(clf).classify(TEXTS)]
    with pytest.raises(ConfigError, match="--task embed needs an artifact that loads as Encoder; .* loads as Classifier"):
        b.batch(clf, corpus, tmp_path / "wrong", task="embed", log=lambda s: None)


def test_translate_answers_as_the_runtime_with_its_target_language(encoder, corpus, tmp_path):
    from seq2seq_fixtures import seq2seq_artifact

    _, mt = seq2seq_artifact(tmp_path / "s2s")
    b.batch(mt, corpus, tmp_path / "de", task="translate", part_rows=4,
            options={"max_tokens": 8, "tgt_lang": "de"}, log=lambda s: None)
    b.batch(mt, corpus, tmp_path / "plain", task="translate", part_rows=4,
            options={"max_tokens": 8}, log=lambda s: None)
    model = rt.load(mt, threads=1)
    for out, kw in (("de", {"tgt_lang": "de"}), ("plain", {})):
        want = [r.text for s in range(0, 11, 4)  # each part is one batch of the runtime
                for r in model.generate_details(TEXTS[s:s + 4], max_new_tokens=8,
                                                temperature=0.0, **kw)]
        got = b.read_output(tmp_path / out)
        assert [r["row"] for r in got] == list(range(11))
        assert [r["text"] for r in got] == want
    # the target language is the first token: it changes what is written
    assert [r["text"] for r in b.read_output(tmp_path / "de")] != \
        [r["text"] for r in b.read_output(tmp_path / "plain")]
    with pytest.raises(ConfigError, match="--task translate needs an artifact that loads as "
                                          "Seq2SeqModel; .* loads as Encoder"):
        b.batch(encoder, corpus, tmp_path / "x", task="translate", log=lambda s: None)


def test_a_crash_then_a_restart_keeps_whole_parts_and_every_row_once(encoder, corpus, tmp_path,
                                                                     monkeypatch):
    out = tmp_path / "out"
    real = b.Runner.run_part
    ran = []

    def crashing(self, where, k):
        ran.append(k)
        if k == 2:  # dies half-way through writing part 2
            (where / ".part-000002.jsonl.999.tmp").write_text('{"row": 8}\n{"ro')
            raise KeyboardInterrupt
        return real(self, where, k)

    monkeypatch.setattr(b.Runner, "run_part", crashing)
    with pytest.raises(KeyboardInterrupt):
        b.batch(encoder, corpus, out, task="embed", part_rows=4, log=lambda s: None)
    assert sorted(p.name for p in out.glob("part-*")) == ["part-000000.jsonl",
                                                          "part-000001.jsonl"]
    monkeypatch.setattr(b.Runner, "run_part", real)
    lines = []
    summary = b.batch(encoder, corpus, out, task="embed", part_rows=4, log=lines.append)
    assert summary["ran"] == 1 and "1 to run (2 done before)" in lines[0]
    assert not list(out.glob(".*.tmp")), "the crashed part's temporary file is left"
    rows = [r["row"] for r in b.read_output(out)]
    assert rows == list(range(11)), rows
    b.batch(encoder, corpus, tmp_path / "whole", task="embed", part_rows=4, log=lambda s: None)
    assert b.read_output(out) == b.read_output(tmp_path / "whole")


def test_refusals_name_what_is_wrong(encoder, corpus, tmp_path):
    b.batch(encoder, corpus, tmp_path / "out", task="embed", part_rows=4, log=lambda s: None)
    with pytest.raises(ConfigError, match=r"another batch \(its batch.json differs in part_rows"):
        b.batch(encoder, corpus, tmp_path / "out", task="embed", part_rows=5, log=lambda s: None)
    with pytest.raises(ConfigError, match="choose one of embed, classify, generate, translate"):
        b.batch(encoder, corpus, tmp_path / "x", task="summarize")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(ConfigError, match="row 1: no string field 'text'"):
        b.batch(encoder, bad, tmp_path / "y", task="embed", log=lambda s: None)
    with pytest.raises(ConfigError, match="give a .jsonl or .parquet file"):
        b.read_rows(tmp_path / "in.csv", "text", "id")


def test_parquet_in_and_out_equal_jsonl(encoder, corpus, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    table = pa.Table.from_pylist([json.loads(line) for line in corpus.read_text().split("\n")
                                  if line])
    pq.write_table(table, tmp_path / "corpus.parquet")
    b.batch(encoder, tmp_path / "corpus.parquet", tmp_path / "p", task="embed", part_rows=3,
            fmt="parquet", log=lambda s: None)
    b.batch(encoder, corpus, tmp_path / "j", task="embed", part_rows=3, log=lambda s: None)
    got, want = b.read_output(tmp_path / "p"), b.read_output(tmp_path / "j")
    assert [(r["row"], r["id"]) for r in got] == [(r["row"], r["id"]) for r in want]
    assert_close(np.array([r["embedding"] for r in got]), np.array([r["embedding"] for r in want]),
                 0.0, "the same parts through Parquet")


def test_the_cli_runs_and_resumes(encoder, corpus, tmp_path):
    args = ("batch", encoder, "--input", corpus, "--output", tmp_path / "out", "--task", "embed",
            "--part-rows", "6")
    first = run_tinyt(*args)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["ran"] == 2 and "2/2 parts" in first.stderr
    again = run_tinyt(*args)
    assert again.returncode == 0 and json.loads(again.stdout)["ran"] == 0
    wrong = run_tinyt(*args[:-1], "7")
    assert wrong.returncode == 2 and "another batch" in wrong.stderr


def test_the_ray_actor_runs_a_part_as_the_local_runner(encoder, corpus, tmp_path):
    from dataclasses import asdict

    from tinyt.app.batch import PartActor

    job, todo = b.plan(encoder, corpus, tmp_path / "out", task="embed", part_rows=4)
    actor = PartActor(asdict(job), str(tmp_path / "out"), 1)
    assert actor({"part": np.array(todo)}) == {"part": [0, 1, 2], "rows": [4, 4, 3]}
    b.batch(encoder, corpus, tmp_path / "local", task="embed", part_rows=4, log=lambda s: None)
    assert b.read_output(tmp_path / "out") == b.read_output(tmp_path / "local")
