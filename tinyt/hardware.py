"""CPU features that decide how INT8 should be laid out (torch-free).

x86 without VNNI multiplies u8 x s8 with 16-bit intermediate sums (vpmaddubsw) that can
saturate, so weights are quantized to 7 bits there (`reduce_range`); VNNI / AMX / ARM
dot-product units accumulate in 32 bits and take the full 8 bits.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path


def _cpuinfo() -> str:
    """/proc/cpuinfo, or '' where there is none (not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def cpu_features(cpuinfo: str | None = None) -> dict[str, object]:
    """INT8-relevant features of this CPU (from /proc/cpuinfo on Linux)."""
    if cpuinfo is None:
        cpuinfo = _cpuinfo()
    flags: set[str] = set()
    model = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "cpu model") and not model:
            model = value.strip()
    return {
        "machine": platform.machine(), "model": model,
        "avx2": "avx2" in flags, "avx512_vnni": "avx512_vnni" in flags,
        "avx_vnni": "avx_vnni" in flags, "amx_int8": "amx_int8" in flags,
        "amx_bf16": "amx_bf16" in flags, "arm_dotprod": "asimddp" in flags,
    }


def int8_preset(features: dict[str, object] | None = None) -> dict[str, object]:
    """Static-INT8 settings for this CPU: activation type and whether to reduce the range."""
    f = cpu_features() if features is None else features
    arm = str(f.get("machine", "")).lower() in ("aarch64", "arm64")
    wide = bool(f.get("avx512_vnni") or f.get("avx_vnni") or f.get("amx_int8")
                or f.get("arm_dotprod"))
    if arm:
        name = "arm-dotprod" if f.get("arm_dotprod") else "arm"
    else:
        name = ("amx" if f.get("amx_int8") else "vnni" if wide
                else "avx2" if f.get("avx2") else "x86")
    return {"preset": name,
            # x86 int8 kernels are u8 x s8; ARM's are s8 x s8
            "activation_type": "int8" if arm else "uint8",
            "reduce_range": not wide}


def physical_cores(cpuinfo: str | None = None) -> int:
    """Physical cores (hyper-threads counted once); the logical count where unknown."""
    if cpuinfo is None:
        cpuinfo = _cpuinfo()
    cores, phys = set(), "0"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = value.strip()
        elif key == "core id":
            cores.add((phys, value.strip()))
    return len(cores) or os.cpu_count() or 1
