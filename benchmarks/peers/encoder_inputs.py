"""What the encoder benchmarks read (encoders.py, browser_encoders.py, encoder_quick.py): a
sentence-transformers directory's settings, one built of random weights at a named shape, and
texts of an exact token length.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tinyt.errors import BenchError

REPO = Path(__file__).resolve().parents[2]

# Random-weight directories at the real models' shapes: (BertConfig keys, pooling,
# max_seq_length). The vocabulary is BERT's 30,522 ids (tests/hf_fixtures.py's WordPiece).
SHAPES = {
    "minilm": (dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12,
                    intermediate_size=1536), "mean", 256),  # sentence-transformers/all-MiniLM-L6-v2
    "bge-small": (dict(num_hidden_layers=12, hidden_size=384, num_attention_heads=12,
                       intermediate_size=1536), "cls", 512),  # BAAI/bge-small-en-v1.5
    "test": (dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                  intermediate_size=64), "mean", 256),  # seconds: a docs check's run
}
POOLING_MODES = {"mean_tokens": "mean", "cls_token": "cls", "lasttoken": "last"}


def st_settings(st_dir: Path) -> dict:
    """What a sentence-transformers directory says about its embeddings: the Transformer's
    folder, pooling, Normalize, max_seq_length, width (read here, not through tinyt's import)."""
    modules = {m["type"].rsplit(".", 1)[-1]: m for m in _json(st_dir / "modules.json")}
    if "Transformer" not in modules or "Pooling" not in modules:
        raise BenchError(f"{st_dir}: modules {list(modules)}; the benchmark needs a Transformer "
                         "and a Pooling")
    cfg = _json(st_dir / modules["Pooling"].get("path", "1_Pooling") / "config.json")
    modes = [k.removeprefix("pooling_mode_") for k, v in cfg.items()
             if k.startswith("pooling_mode_") and v is True]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise BenchError(f"{st_dir}: pooling {modes}; the benchmark runs one of "
                         f"{list(POOLING_MODES)}")
    transformer = st_dir / modules["Transformer"].get("path", "")
    sbc = transformer / "sentence_bert_config.json"
    hf = _json(transformer / "config.json")
    return {"transformer": str(transformer), "pooling": POOLING_MODES[modes[0]],
            "normalize": "Normalize" in modules, "dim": hf["hidden_size"],
            "max_length": _json(sbc).get("max_seq_length") if sbc.is_file() else None,
            "layers": hf.get("num_hidden_layers"), "heads": hf.get("num_attention_heads"),
            "vocab": hf.get("vocab_size")}


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def build_st(out: Path, shape: str) -> Path:
    """A sentence-transformers directory of random weights at `shape`: tests/hf_fixtures.py's
    layout and WordPiece tokenizer, and transformers' own initialization (N(0, 0.02), norm
    gains 1), the scale of real weights, seeded. (With the fixture's N(0, 0.2), which keeps a
    tiny model's hidden states lively, tinyt's optimize check saw 1.7e-4 between the graphs at
    the MiniLM shape and 261 tokens, over its 1e-4, on hidden states of rms 1.)"""
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from hf_fixtures import save_encoder

    overrides, pooling, max_seq_length = SHAPES[shape]
    model = save_encoder("bert", out, pooling=pooling, max_seq_length=max_seq_length,
                         **overrides)
    torch.manual_seed(0)
    type(model)(model.config).save_pretrained(out, safe_serialization=True)
    return out


def texts_of(tokenizer_json: Path, tokens: int, count: int) -> list[str]:
    """`count` different texts of exactly `tokens` tokens each, special tokens included: words
    of the retrieval set's passages while they fit, then " ." (one token) to the length."""
    from tokenizers import Tokenizer

    from tinyt.export.retrieval_set import PASSAGES

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_truncation()
    tok.no_padding()
    words = " ".join(PASSAGES).split()
    out = []
    for i in range(count):
        text, n = "", len(tok.encode("").ids)
        for w in words[(i * 97) % len(words):] + words:
            k = len(tok.encode(f"{text} {w}".strip()).ids)
            if k > tokens:
                break
            text, n = f"{text} {w}".strip(), k
        text += " ." * (tokens - n)
        if len(tok.encode(text).ids) != tokens:
            raise BenchError(f"{tokenizer_json}: could not make a text of {tokens} tokens")
        out.append(text)
    return out
