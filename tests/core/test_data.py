import numpy as np
import pytest

from tinyt import data as D
from tinyt.errors import DataError
from tinyt.tokenizer import Tokenizer


def test_default_corpus_is_the_stdlib_split_by_file():
    c = D.load_corpus()
    assert "standard library" in c.source
    assert "os.py" in c.train_names + c.val_names
    assert not set(c.train_names) & set(c.val_names)  # split by file, disjoint
    assert len(c.val) >= 5 and len(c.train) > 10 * len(c.val)
    assert all(not n.startswith(("site-packages", "test/")) for n in c.train_names)
    again = D.load_corpus()
    assert again.val_names == c.val_names  # deterministic


def test_split_is_a_stable_hash_of_the_name():
    import subprocess
    import sys
    names = [f"pkg/m{i}.py" for i in range(50)]
    here = [D.is_validation(n) for n in names]
    for seed in ("0", "12345"):  # not Python's salted hash(): the same split in every process
        out = subprocess.run([sys.executable, "-c", "import sys; from tinyt import data as D; "
                              f"print([D.is_validation(n) for n in {names!r}])"],
                             capture_output=True, text=True, env={"PYTHONHASHSEED": seed,
                                                                  "PATH": ""})
        assert out.stdout.strip() == str(here), out.stderr
    names = [f"pkg/m{i}.py" for i in range(2000)]
    share = np.mean([D.is_validation(n) for n in names])
    assert abs(share - D.VAL_PERCENT / 100) < 0.02


def test_user_directory_and_single_file(corpus_dir, tmp_path):
    c = D.load_corpus(corpus_dir)
    assert len(c.train) + len(c.val) == 40 and c.val
    one = tmp_path / "one.txt"
    one.write_text("".join(f"line {i}\n" for i in range(100)))
    c1 = D.load_corpus(one)
    assert c1.train[0] + c1.val[0] == one.read_text()  # nothing lost, cut at a line break
    assert c1.val[0].startswith("line 9")


def test_binary_files_are_skipped(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 20)
    (tmp_path / "b.bin").write_bytes(b"\xff\xfe\x00\x81" * 50)
    c = D.load_corpus(tmp_path)
    assert (c.train_names, c.val_names) == (["a.txt"], ["a.txt#val"])  # b.bin left out


@pytest.mark.parametrize("make,needle", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: p, "holds no readable UTF-8 text files"),
    (lambda p: (p / "e.txt").write_text("  \n") and p, "holds no non-empty UTF-8 text"),
])
def test_empty_or_missing_corpus(tmp_path, make, needle):
    with pytest.raises(DataError, match=needle):
        D.load_corpus(make(tmp_path))


def test_missing_stdlib_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(D.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path / "nolib")})
    with pytest.raises(DataError, match="standard library source was not found.*--data PATH"):
        D.load_corpus()


def test_lm_batches_are_a_function_of_seed_and_step():
    tokens = np.arange(1000, dtype=np.uint32)
    x1, y1 = D.lm_batch(tokens, 16, 4, seed=1, step=7)
    x2, _ = D.lm_batch(tokens, 16, 4, seed=1, step=7)
    x3, _ = D.lm_batch(tokens, 16, 4, seed=1, step=8)
    assert x1.shape == (4, 16) and x1.dtype == np.int64
    assert (x1 == x2).all() and not (x1 == x3).all()
    assert (y1[:, :-1] == x1[:, 1:]).all()  # targets are the inputs shifted by one


def test_too_few_tokens():
    with pytest.raises(DataError, match="fewer than block_size"):
        D.check_lm_tokens(np.zeros(10, dtype=np.uint32), 32, "validation")


def test_encode_documents_separates_with_eos():
    tok = Tokenizer.byte_level()
    ids = D.encode_documents(tok, ["ab", "c"])
    assert ids.tolist() == [97, 98, 256, 99, 256]


def test_stdlib_classification_set():
    d = D.load_classification()
    assert d.labels == list(D.CLASSIFIER_PACKAGES)
    assert len(d.train) > 1000 and len(d.val) > 100
    assert {y for _, y in d.train} == set(range(len(d.labels)))
    assert not {t for t, _ in d.train} & {t for t, _ in d.val}
    assert D.load_classification().val == d.val  # deterministic


def test_user_classification_set(labelled_dir, tmp_path):
    d = D.load_classification(labelled_dir)
    assert d.labels == ["maths", "strings"] and d.train and d.val
    assert D.classification_labels(labelled_dir) == ["maths", "strings"]
    (tmp_path / "only").mkdir()
    with pytest.raises(DataError, match="has 1 label"):
        D.load_classification(tmp_path)
