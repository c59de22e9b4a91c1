"""The exporter's cache (export/export_cache.py): a hit is byte for byte the artifact a traced
export writes; anything the graph is a function of (weights, config, opset, graph kind) misses;
unset, nothing is written."""
import os
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
