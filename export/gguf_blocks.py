"""A GGUF import's Q4_0 / Q4_1 / Q8_0 blocks as MatMulNBits tables, carried without
quantizing again (torch-free): `tinyt quantize --gguf-blocks` (export/quantize.py).

llama.cpp's blocks (32 values along K, one row of the matrix a run of blocks):

    Q4_0  d fp16 | 16 bytes: value j in the low nibble of byte j, value j+16 in its high one
          x = d·(q - 8)                    ─▶ bits 4, scale d, zero point 8 (MatMulNBits' own)
    Q8_0  d fp16 | 32 int8                 x = d·q
                                           ─▶ bits 8, level q + 128, scale d, zero point 128
    Q4_1  d fp16 | m fp16 | 16 bytes as Q4_0, x = d·q + m
                                           ─▶ bits 4, scale d, a float zero point z per block

MatMulNBits reads levels in pairs (value 2i low nibble, 2i+1 high): the nibbles are re-packed,
the levels unchanged. Q4_1's minimum is not an integer zero point (x = scale·(q - zp) with zp
integer holds only where m/d is one), so the table takes zero points of the graph's float type:
ONNX Runtime 1.32 dequantizes them as q·s - z·s, two fp32 roundings, and z is chosen so that
fl(z·d) = -m exactly; then q·d - z·d = fl(d·q) + m, gguf's own dequantization, bit for bit.
Where no fp32 z gives -m exactly the nearest is kept and the block counted (FLOAT_ZP_MISSES).
Every table is checked against the graph's fp32 weight before it is used (carried_table).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

BLOCK = 32
BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # a block's bytes
BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}


@dataclasses.dataclass(frozen=True)
class NBitsTable:
    """One weight's MatMulNBits inputs: packed levels [N, K/32, 32·bits/8], fp32 scales
    [N, K/32], zero points (None: the default 2^(bits-1); else fp32 [N, K/32])."""
    kind: str  # the GGUF type it came from
    bits: int
    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    inexact_blocks: int = 0  # Q4_1 blocks whose float zero point misses -m by an ulp


def nbits_table(kind: str, rows: np.ndarray) -> NBitsTable:
    """The MatMulNBits table of a matrix's raw GGUF rows (uint8 [N, K/32 · bytes a block])."""
    if kind not in BYTES:
        raise ValueError(f"{kind} blocks are not carried; carried: {', '.join(BYTES)}")
    N = rows.shape[0]
    blocks = rows.reshape(N, -1, BYTES[kind])  # (N, nb, bytes)
    d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, nb)
    if kind == "Q8_0":
        levels = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return NBitsTable(kind, 8, np.ascontiguousarray(levels), d, None)
    qs = blocks[..., 4 if kind == "Q4_1" else 2:]  # (N, nb, 16)
    levels = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # (N, nb, 32): values 0..31
    packed = np.ascontiguousarray(levels[..., 0::2] | (levels[..., 1::2] << 4))
    if kind == "Q4_0":
        return NBitsTable(kind, 4, packed, d, None)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    z, misses = float_zero_points(d, m)
    return NBitsTable(kind, 4, packed, d, z, misses)


def float_zero_points(d: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, int]:
    """fp32 z with fl(z·d) = -m where one exists (searched a few ulps about -m/d); returns
    (z, how many blocks have none). A zero scale takes z = 0 (its block is m alone: missed
    unless m is 0)."""
    safe = np.where(d == 0, np.float32(1), d)
    z = (-m / safe).astype(np.float32)
    best, hit = z.copy(), (z * d).astype(np.float32) == -m
    for step in range(1, 5):
        for sign in (1, -1):
            cand = z.copy()
            for _ in range(step):
                cand = np.nextafter(cand, np.float32(sign * np.inf)).astype(np.float32)
            now = ~hit & ((cand * d).astype(np.float32) == -m)
            best[now], hit = cand[now], hit | now
    best[d == 0] = 0
    return best, int((~hit).sum())


def dequantize_table(t: NBitsTable) -> np.ndarray:
    """The fp32 matrix [N, K] ONNX Runtime's MatMulNBits reads from the table (q·s - z·s)."""
    q = t.packed
    if t.bits == 4:
        q = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(*q.shape[:-1], -1)
    s = t.scales[..., None]
    if t.zero_points is None:
        x = (q.astype(np.float32) - np.float32(2 ** (t.bits - 1))) * s
    else:
        x = q.astype(np.float32) * s - (t.zero_points[..., None] * s).astype(np.float32)
    return x.reshape(x.shape[0], -1)


def checkpoint_of(artifact: Path, depth: int = 16) -> Path | None:
    """The checkpoint an artifact was exported from, following each manifest's source."""
    for _ in range(depth):
        try:
            source = json.loads((artifact / "manifest.json").read_text())["source"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(source, dict) or "path" not in source:
            return None
        artifact = Path(source["path"])
        if source.get("kind") == "checkpoint":
            return artifact
    return None


def carried_table(kind: str, raw: np.ndarray, rows: np.ndarray) -> NBitsTable | str:
    """The table of `raw` if it dequantizes to the graph's fp32 weight `rows` [N, K] bit for
    bit (inexact Q4_1 zero points aside, where within one rounding), else why not."""
    if rows.shape[1] % BLOCK or raw.shape != (rows.shape[0], rows.shape[1] // BLOCK * BYTES[kind]):
        return f"{kind} blocks of shape {raw.shape} do not fit the graph's weight {rows.shape}"
    table = nbits_table(kind, raw)
    values = dequantize_table(table)
    if table.inexact_blocks:
        worst = float(np.abs(values - rows).max() / max(float(np.abs(rows).max()), 1e-30))
        if worst > 1e-6:
            return f"its {kind} blocks dequantize {worst:.2g} away from the graph's weight"
    elif not np.array_equal(values, rows):
        return f"its {kind} blocks do not dequantize to the graph's weight (another weight?)"
    return table
