"""The exporter's cache (export/export_cache.py): a hit is byte for byte the artifact a traced
export writes; anything the graph is a function of (weights, config, opset, graph kind) misses;
unset, nothing is written."""
import os
from functools import partial
from pathlib import Path

import pytest
import torch

from tinyt.checkpoint import load_checkpoint
from tinyt.export import export_cache
from tinyt.export.exporter import export_onnx


def _export(ckpt, out: Path, cache: Path | None, monkeypatch, **kw) -> bytes:
    if cache is None:
        monkeypatch.delenv(export_cache.ENV, raising=False)
    else:
        monkeypatch.setenv(export_cache.ENV, str(cache))
    export_onnx(ckpt, out, **kw)
    return (out / "model.onnx").read_bytes()


@pytest.mark.slow
def test_a_hit_is_the_traced_artifact_and_a_change_misses(tiny_ckpt, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    traced = _export(tiny_ckpt, tmp_path / "plain", None, monkeypatch)
    assert not cache.exists()  # unset: nothing written
    first = _export(tiny_ckpt, tmp_path / "a", cache, monkeypatch)
    again = _export(tiny_ckpt, tmp_path / "b", cache, monkeypatch)
    assert traced == first == again
    assert export_cache.saved_seconds(cache)[:2] == (1, 1)  # one traced, one read back

    _export(tiny_ckpt, tmp_path / "nocache", cache, monkeypatch, with_past=False)  # another kind
    _export(tiny_ckpt, tmp_path / "opset", cache, monkeypatch, opset=19)
    assert export_cache.saved_seconds(cache)[:2] == (1, 3)

    ckpt = load_checkpoint(tiny_ckpt)  # one weight changed by one ulp: a miss
    kwargs = dict(kwargs={}, shapes=None, opset=18, input_names=[], output_names=[], what="x")
    key = export_cache._key(ckpt.model, **kwargs)
    p = next(ckpt.model.parameters())
    with torch.no_grad():
        p.view(-1)[0] = torch.nextafter(p.view(-1)[0], p.view(-1)[0] + 1)
    assert export_cache._key(ckpt.model, **kwargs) != key
    assert export_cache._key(ckpt.model, **{**kwargs, "what": "y"}) != \
        export_cache._key(ckpt.model, **kwargs)
    assert not [f for f in os.listdir(cache) if f.endswith(".tmp")]  # written whole


class _Toy(torch.nn.Module):
    """Two weight matmuls and a norm-like scale; `fold` adds 1 to the second weight (Gemma's
    norm form: the exporter folds it into a constant no parameter's bytes hold)."""

    def __init__(self, seed: int, fold: bool = False, tie: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(torch.randn(8, 8, generator=g))
        self.b = torch.nn.Parameter(self.a.detach().clone() if tie else
                                    torch.randn(8, 8, generator=g))
        self.n = torch.nn.Parameter(torch.ones(8))
        self.fold = fold

    def forward(self, x):
        h = x @ self.a.T
        return (h @ ((self.b + 1.0).T if self.fold else self.b.T)) * self.n


def _toy_export(model: _Toy, cache: Path | None, monkeypatch) -> bytes:
    if cache is None:
        monkeypatch.delenv(export_cache.ENV, raising=False)
    else:
        monkeypatch.setenv(export_cache.ENV, str(cache))
    return export_cache.export(model, kwargs={"x": torch.ones(2, 8)}, shapes=None, opset=18,
                               input_names=["x"], output_names=["y"],
                               what=f"toy fold={model.fold}").SerializeToString()


@pytest.mark.slow
def test_other_weights_of_one_form_are_refilled_into_the_traced_graph(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv(export_cache.VERIFY_ENV, "1")  # each form hit also traced: same bytes
    _toy_export(_Toy(0), cache, monkeypatch)
    refilled = _toy_export(_Toy(1), cache, monkeypatch)  # another seed: a form hit
    assert export_cache.saved_seconds(cache)[:2] == (1, 1)
    assert refilled == _toy_export(_Toy(1), None, monkeypatch)  # what tracing writes
    assert len(list(cache.glob("form-*.json"))) == 1

    # a parameter folded by arithmetic ((b + 1).T): no form entry, each seed traced
    folded = [_toy_export(_Toy(s, fold=True), cache, monkeypatch) for s in (0, 1)]
    assert export_cache.saved_seconds(cache)[:2] == (1, 3)
    assert len(list(cache.glob("form-*.json"))) == 1
    assert folded[1] == _toy_export(_Toy(1, fold=True), None, monkeypatch)

    # what the exporter's rewrites see of the values is in the form: equal parameters (merged
    # into one initializer) and a parameter of one value; the rest of the bytes are not
    form = partial(export_cache._key, kwargs={}, shapes=None, opset=18, input_names=[],
                   output_names=[], what="x", form=True)
    assert form(_Toy(0)) == form(_Toy(2))
    assert form(_Toy(0, tie=True)) != form(_Toy(0))
    scaled = _Toy(0)
    with torch.no_grad():
        scaled.n.mul_(2.0)
    assert form(scaled) != form(_Toy(0))
