"""What a CPU's u8 x s8 int8 GEMM computes, for tests that assert int8 arithmetic on every CPU
kind. Where products are added in 32 bits (VNNI, AMX, ARM dot product) it is the exact integer
product. On x86 with AVX2 only, ONNX Runtime's kernel (MLAS, vpmaddubsw) multiplies u8 x s8
bytes and adds each pair of neighbouring products (k = 2j, 2j + 1) into a signed 16-bit sum that
saturates at -32768 / 32767, then adds those sums in 32 bits; a zero point of A is taken off
afterwards, through B's column sums. This emulation matched ONNX Runtime 1.32's MatMulInteger
bit for bit on an AVX2-only AMD EPYC (K from 16 to 768, odd K included, 1 to 17 rows)."""
from __future__ import annotations

import numpy as np


def u8s8_products(a: np.ndarray, b: np.ndarray, *, saturating: bool,
                  a_zero_point: int = 0) -> np.ndarray:
    """(a - a_zero_point) @ b as the CPU computes it: a [M, K] uint8 values, b [K, N] int8."""
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    if not saturating:
        return (a64 - a_zero_point) @ b64
    if a64.shape[-1] % 2:  # the kernel pads K with zeros
        a64 = np.pad(a64, ((0, 0), (0, 1)))
        b64 = np.pad(b64, ((0, 1), (0, 0)))
    products = a64[:, :, None] * b64[None, :, :]  # [M, K, N]
    pairs = np.clip(products[:, 0::2] + products[:, 1::2], -32768, 32767)
    return pairs.sum(1) - a_zero_point * b64.sum(0)
