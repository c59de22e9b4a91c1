import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer

from tinyt.errors import ConfigError, DataError
from tinyt.tokenizer import EOS_TOKEN, Tokenizer


@pytest.fixture(scope="module")
def bpe(corpus_dir):
    texts = [p.read_text() for p in sorted(corpus_dir.iterdir())]
    return Tokenizer.train_bpe(texts, 400)


def test_byte_tokenizer_ids_are_bytes():
    tok = Tokenizer.byte_level()
    assert tok.vocab_size == 257 and tok.eos_id == 256
    text = "héllo\x00\n€"
    assert tok.encode(text) == list(text.encode("utf-8"))


def test_bpe_learns_merges_and_respects_vocab_size(bpe):
    assert 257 < bpe.vocab_size <= 400
    assert bpe.encode("x<|endoftext|>")[-1] == bpe.eos_id  # one id, read as end-of-text
    text = "def alpha_1(beta, n=1):\n    return alpha\n"
    assert len(bpe.encode(text)) < len(text.encode()) / 2  # merges compress the corpus' text


def test_bpe_vocab_too_small_is_an_error():
    with pytest.raises(ConfigError, match="vocab_size=100 is too small"):
        Tokenizer.train_bpe(["abc"], 100)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_any_unicode_text(bpe, text):
    for tok in (bpe, Tokenizer.byte_level()):
        assert tok.decode(tok.encode(text)) == text


def test_eos_token_round_trips(bpe):
    text = f"a{EOS_TOKEN}b"
    assert bpe.eos_id in bpe.encode(text)
    assert bpe.decode(bpe.encode(text)) == text


def test_saved_file_is_a_standard_tokenizer_json(bpe, tmp_path):
    path = tmp_path / "tokenizer.json"
    bpe.save(path)
    hf = HFTokenizer.from_file(str(path))  # what other tools load
    text = "import os\nx = 1\n"
    assert hf.encode(text).ids == bpe.encode(text)
    data = json.loads(path.read_text())
    assert data["model"]["type"] == "BPE" and data["pre_tokenizer"]["type"] == "ByteLevel"
    assert Tokenizer.from_file(path).encode(text) == bpe.encode(text)


def test_token_byte_lengths_add_up(bpe):
    lengths = bpe.token_byte_lengths()
    text = "déf gamma(x):\n    return x  # ok\n"
    assert sum(lengths[i] for i in bpe.encode(text)) == len(text.encode("utf-8"))
    assert lengths[bpe.eos_id] == 0


def test_bad_tokenizer_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        Tokenizer.from_file(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(DataError, match="not a valid tokenizer.json"):
        Tokenizer.from_file(bad)
