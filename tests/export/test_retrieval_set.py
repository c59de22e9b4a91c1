"""The encoder report's retrieval set drawn from the standard library's docstrings
(export/retrieval_set.py): the same texts every time, its sizes, no empty or repeated text,
every query with its own passages, no code; and the hand-written topics beside it."""
import hashlib
import sys

import pytest

from tinyt.errors import DataError
from tinyt.export import retrieval_set as R


def test_docstring_set_is_deterministic_sized_and_clean():
    rs = R.docstring_set()
    assert (len(rs.queries), len(rs.passages), len(rs.relevant)) == (R.N_QUERIES, R.N_PASSAGES,
                                                                      R.N_QUERIES)
    assert R.N_QUERIES >= 50 and R.N_PASSAGES >= 500  # issue 48's size
    again = R.docstring_set.__wrapped__()  # built anew, not the cached one
    assert (again.queries, again.passages, again.relevant) == (rs.queries, rs.passages,
                                                               rs.relevant)
    assert again.digest == rs.digest and len(rs.digest) == 16
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in rs.source
    for texts, (lo, hi) in ((rs.queries, R.QUERY_CHARS), (rs.passages, R.PASSAGE_CHARS)):
        assert len(set(texts)) == len(texts)  # no repeats
        assert all(t == " ".join(t.split()) and lo <= len(t) <= hi for t in texts)
        assert not any(t.startswith((">>>", "...")) for t in texts)
    assert not set(rs.queries) & set(rs.passages)
    owned = [i for r in rs.relevant for i in r]
    assert all(1 <= len(r) <= R.MAX_RELEVANT for r in rs.relevant)
    assert len(owned) == len(set(owned)) and all(0 <= i < len(rs.passages) for i in owned)
    assert len(owned) < len(rs.passages) // 2  # most passages are distractors


def test_docstring_set_digest_is_of_its_texts():
    rs = R.docstring_set()
    h = hashlib.sha256()
    for t in (*rs.queries, "\0", *rs.passages):
        h.update(t.encode() + b"\n")
    assert rs.digest == h.hexdigest()[:16]


def test_a_query_and_its_passages_come_from_one_docstring():
    doc = ("Return the size of the file, in bytes.  Follows symbolic links.\n\n"
           "The size is read from the file system, not by reading the file; a file that\n"
           "grows meanwhile reports its size at the call.\n\n"
           "    >>> getsize('x')\n    3\n\n"
           "Raises OSError if the file does not exist or cannot be read.")
    query, own, whole = R._split(doc)
    assert query == "Return the size of the file, in bytes."
    assert own == ["The size is read from the file system, not by reading the file; a file "
                   "that grows meanwhile reports its size at the call.",
                   "Raises OSError if the file does not exist or cannot be read."]
    assert len(whole) == 3 and whole[0].startswith("Return the size")  # the doctest left out
    assert R._split("    x = f(1)\n    y = g(x)")[0] is None  # code: no query


def test_bad_sizes_are_refused_by_name():
    with pytest.raises(DataError, match="n_queries=200, n_passages=500"):
        R.docstring_set(200, 500)


def test_topics_stay_for_the_classifier_report():
    assert (len(R.QUERIES), len(R.PASSAGES)) == (20, 200)
