"""Optimum reads tinyt's encoder artifacts: ORTModelForFeatureExtraction (an encoder),
ORTModelForSequenceClassification (a classifier) and ORTModelForTokenClassification (a token
classifier) load the directory `tinyt.export.export_onnx` writes, and on a padded batch give
what tinyt's runtime gives (`embed`, `classify`, `tag`, its session) within OPTIMUM_ATOL."""
from __future__ import annotations

import numpy as np
import pytest
from hf_fixtures import LABELS, save_encoder

pytest.importorskip("optimum.onnxruntime", reason="the optimum extra")

# the same graph run by two ONNX Runtime sessions: their thread counts (sums split otherwise)
# and a batch's padding (tinyt's embed and tag batch texts by length) move the last bits;
# measured up to 2.5e-6 on the hidden states, 1.2e-7 on the unit-length embeddings
OPTIMUM_ATOL = 1e-5
TEXTS = ["A man is eating food.", "short", "Ünïcode café, naïve façade — 東京!",
         "The quick brown fox jumps over the lazy dog. " * 6, "def __init__(self): return None"]
ORT_CLASS = {None: "ORTModelForFeatureExtraction", "sequence": "ORTModelForSequenceClassification",
             "token": "ORTModelForTokenClassification"}
FAST = [("bert", None), ("bert", "sequence"), ("xlm-roberta", "token")]
SLOW = [("roberta", None), ("distilbert", "sequence"), ("bert", "token")]
CASES = FAST + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(kind, head) -> the ONNX artifact of a one-layer import of that family and head."""
    from tinyt.export import export_onnx
    from tinyt.hf import import_hf
    made = {}

    def make(kind: str, head: str | None):
        if (kind, head) not in made:
            root = tmp_path_factory.mktemp(f"{kind}-{head}")
            save_encoder(kind, root / "hf", sentence=head is None, head=head,
                         num_hidden_layers=1)
            import_hf(root / "hf", root / "ckpt")
            made[kind, head] = export_onnx(root / "ckpt", root / "onnx")
        return made[kind, head]
    return make


def _padded(tokenizer, names):
    """tinyt's tokens of TEXTS, right-padded with the tokenizer's pad token: Optimum's feeds."""
    pad = next(t for t in ("[PAD]", "<pad>") if tokenizer.hf.token_to_id(t) is not None)
    enc = tokenizer.hf.encode_batch(TEXTS, add_special_tokens=True)
    T = max(len(e.ids) for e in enc)
    ids = np.full((len(enc), T), tokenizer.hf.token_to_id(pad), dtype=np.int64)
    mask, types = np.zeros_like(ids), np.zeros_like(ids)
    for r, e in enumerate(enc):
        ids[r, :len(e.ids)], mask[r, :len(e.ids)], types[r, :len(e.ids)] = e.ids, 1, e.type_ids
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {k: v for k, v in feeds.items() if k in names}


def _softmax(z):
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("kind, head", CASES)
def test_optimum_loads_the_artifact_and_agrees_with_tinyts_runtime(exported, kind, head):
    import optimum.onnxruntime as ortm

    import tinyt.runtime as rt
    path = exported(kind, head)
    theirs = getattr(ortm, ORT_CLASS[head]).from_pretrained(path)
    ours = rt.load(path, threads=1)
    names = [i.name for i in ours.session.get_inputs()]
    assert list(theirs.input_names) == names  # BERT's token types are fed; the others' not
    assert ("token_type_ids" in names) == (kind == "bert")
    feeds = _padded(ours.tokenizer, names)
    real = feeds["attention_mask"].astype(bool)
    out = theirs(**feeds)
    if head is None:  # hidden states through Optimum's forward; the sentence via its session
        hidden = np.asarray(out.last_hidden_state)
        raw = ours.session.run(["last_hidden_state"], feeds)[0]
        assert hidden.shape == raw.shape and hidden.dtype == raw.dtype == np.float32
        assert np.abs(hidden - raw)[real].max() <= OPTIMUM_ATOL
        for row, text in zip(hidden, TEXTS):  # alone, unpadded, in tinyt's runtime
            mine = ours.hidden_states(text)
            assert np.abs(row[:len(mine)] - mine).max() <= OPTIMUM_ATOL
        sentence = theirs.session.run(["sentence_embedding"], feeds)[0]
        assert np.abs(sentence - ours.embed(TEXTS, batch_size=2)).max() <= OPTIMUM_ATOL
        return
    assert theirs.config.id2label == dict(enumerate(LABELS))  # Optimum reads the labels
    probs = _softmax(np.asarray(out.logits))
    if head == "sequence":
        got = ours.classify(TEXTS)
        mine = np.array([[p.probabilities[n] for n in LABELS] for p in got])
        assert probs.shape == mine.shape and np.abs(probs - mine).max() <= OPTIMUM_ATOL
        assert [p.label for p in got] == [theirs.config.id2label[i] for i in probs.argmax(-1)]
        return
    tagged = ours.tag(TEXTS, batch_size=2)
    for row, p, n in zip(tagged, probs, real.sum(1)):
        assert len(row) == n
        assert [t.label for t in row] == [theirs.config.id2label[i] for i in p[:n].argmax(-1)]
        assert np.abs(np.array([t.probability for t in row]) - p[:n].max(-1)).max() \
            <= OPTIMUM_ATOL
