"""CPU features that decide how INT8 should be laid out, and whether this CPU's int8 GEMMs are
exact (torch-free).

x86 without VNNI multiplies u8 x s8 with 16-bit intermediate sums (vpmaddubsw adds each pair
of products and saturates at 32767), so weights are quantized to 7 bits there (`reduce_range`:
255 x 63 x 2 = 32130 fits); VNNI / AMX / ARM dot-product units accumulate in 32 bits and take
the full 8 bits. Whether an 8-bit graph is exact here is measured, not guessed from flags:
`u8s8_exact` runs ONNX Runtime's own int8 GEMM once on products that saturate in 16 bits. That
answers for the CPU ONNX Runtime sees (its CPUID), which is also what an emulator such as
`qemu-x86_64 -cpu Haswell` shows, while /proc/cpuinfo stays the host's file; the flags below
are read from CPUID too where numpy knows them.
"""
from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

# (numpy's CPUID name, /proc/cpuinfo's flag) of the features read from both
_CPUID = {"avx2": ("AVX2", "avx2"), "avx512f": ("AVX512F", "avx512f"),
          "avx512_vnni": ("AVX512VNNI", "avx512_vnni")}
# flags numpy's table lacks: taken from /proc/cpuinfo only where it agrees with CPUID on the
# features above (else the file describes another CPU than the one this process runs on)
_CPUINFO_ONLY = {"avx_vnni": "avx_vnni", "amx_int8": "amx_int8", "amx_bf16": "amx_bf16",
                 "arm_dotprod": "asimddp"}


def _cpuinfo() -> str:
    """/proc/cpuinfo, or '' where there is none (not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def _cpuid() -> dict[str, bool] | None:
    """numpy's runtime CPU feature table (it executes CPUID), or None where it is unavailable."""
    import importlib

    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # 2.x, 1.x
        try:
            return dict(importlib.import_module(module).__cpu_features__)
        except (ImportError, AttributeError):
            continue
    return None


def cpu_features(cpuinfo: str | None = None) -> dict[str, object]:
    """INT8-relevant features of this CPU: from CPUID (numpy's table) where it has them, else
    from /proc/cpuinfo on Linux. With `cpuinfo` given (a file's text), from that text alone.
    For this machine also `u8s8_exact`: whether ONNX Runtime's u8 x s8 GEMM is exact here
    (None where onnxruntime is not installed)."""
    here = cpuinfo is None
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    flags: set[str] = set()
    model = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "cpu model") and not model:
            model = value.strip()
    found = {name: flag in flags for name, (_, flag) in _CPUID.items()}
    found |= {name: flag in flags for name, flag in _CPUINFO_ONLY.items()}
    cpuid = _cpuid() if here and platform.machine().lower() in ("x86_64", "amd64") else None
    emulated = False
    if cpuid is not None:
        by_cpuid = {name: bool(cpuid.get(key)) for name, (key, _) in _CPUID.items()}
        emulated = any(by_cpuid[n] != found[n] for n in by_cpuid)
        found |= by_cpuid
        if emulated:  # /proc/cpuinfo is another CPU's (an emulator's host): not its flags
            found |= {name: False for name in _CPUINFO_ONLY}
    features: dict[str, object] = {"machine": platform.machine(), "model": model, **found}
    if here:
        features["cpuinfo_matches_cpuid"] = not emulated
        features["u8s8_exact"] = u8s8_exact()
    return features


def wide_int8(features: dict[str, object]) -> bool:
    """Whether these features add int8 products in 32 bits (from the flags alone)."""
    return bool(features.get("avx512_vnni") or features.get("avx_vnni")
                or features.get("amx_int8") or features.get("arm_dotprod"))


def int8_preset(features: dict[str, object] | None = None) -> dict[str, object]:
    """Static-INT8 settings for this CPU: activation type and whether to reduce the range
    (7-bit weights where 8-bit u8 x s8 products would saturate: measured on this machine, from
    the flags for a `features` dict without `u8s8_exact`)."""
    f = cpu_features() if features is None else features
    arm = str(f.get("machine", "")).lower() in ("aarch64", "arm64")
    wide = wide_int8(f)
    exact = f.get("u8s8_exact")
    if exact is None:
        exact = wide
    if arm:
        name = "arm-dotprod" if f.get("arm_dotprod") else "arm"
    else:
        name = ("amx" if f.get("amx_int8") else "vnni" if wide
                else "avx2" if f.get("avx2") else "x86")
    return {"preset": name,
            # x86 int8 kernels are u8 x s8; ARM's are s8 x s8
            "activation_type": "int8" if arm else "uint8",
            "reduce_range": not exact}


def saturates_here(features: dict[str, object] | None = None) -> bool:
    """Whether 8-bit u8 x s8 GEMM weights give saturated products on this CPU (or, with
    `features`, on the CPU they describe)."""
    if features is None and (exact := u8s8_exact()) is not None:
        return not exact  # the measured answer, without reading the flags again
    return bool(int8_preset(features)["reduce_range"])


# The probe graph, serialized (the runtime has no `onnx` package to build it; a test rebuilds
# it with onnx and compares): Y[rows, 8] int32 = MatMulInteger(A[rows, 64] uint8, B), B a
# [64, 8] int8 constant of 127s (a constant, so ONNX Runtime prepacks it as it does a graph's
# weights). A row of 255s gives 64 x 255 x 127 = 2,072,640 where products are added in 32 bits;
# in 16-bit pair sums each pair saturates at 32,767 (32 pairs: 1,048,544).
PROBE_K = 64
PROBE_GRAPH = (b'\x08\x07\x12\x05tinyt:\xe7\x04\n\x18\n\x01A\n\x01B\x12\x01Y"\rMatMulInteger'
               b'\x12\nu8s8_probe*\x8c\x04\x08@\x08\x08\x10\x03B\x01BJ\x80\x04' + b"\x7f" * 512
               + b'Z\x17\n\x01A\x12\x12\n\x10\x08\x02\x12\x0c\n\x06\x12\x04rows\n\x02\x08@b\x17\n'
               b'\x01Y\x12\x12\n\x10\x08\x06\x12\x0c\n\x06\x12\x04rows\n\x02\x08\x08B\x04\n\x00\x10\r')


@functools.lru_cache(maxsize=1)
def u8s8_exact() -> bool | None:
    """Whether ONNX Runtime's u8 x s8 int8 GEMM (MatMulInteger, DynamicQuantizeMatMul,
    QLinearMatMul: one MLAS kernel per CPU) gives exact products on this CPU: run once per
    process, on products whose pair sums saturate in 16 bits, at one row and at several (the
    shapes a decode step and a prompt take). None where onnxruntime is not installed."""
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError:
        return None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(PROBE_GRAPH, opts, providers=["CPUExecutionProvider"])
    for rows in (1, 5):
        y = session.run(None, {"A": np.full((rows, PROBE_K), 255, np.uint8)})[0]
        if not (y == PROBE_K * 255 * 127).all():
            return False
    return True


def physical_cores(cpuinfo: str | None = None, allowed: set[int] | None = None) -> int:
    """Physical cores this process may run on (hyper-threads counted once): the processors of
    its CPU affinity mask (taskset, a container's cpuset; `allowed`, else os.sched_getaffinity)
    grouped by core; the mask's size where /proc/cpuinfo says nothing of cores."""
    if cpuinfo is None:
        cpuinfo = _cpuinfo()
    if allowed is None and hasattr(os, "sched_getaffinity"):
        allowed = os.sched_getaffinity(0)
    cores, processor, phys = set(), None, "0"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            processor = int(value) if value.strip().isdigit() else None
        elif key == "physical id":
            phys = value.strip()
        elif key == "core id" and (allowed is None or processor is None or processor in allowed):
            cores.add((phys, value.strip()))
    return len(cores) or (len(allowed) if allowed else os.cpu_count() or 1)


def available_memory(meminfo: str | None = None, cgroup: Path | None = None) -> int | None:
    """Bytes that can be allocated without swapping or the OOM killer: /proc/meminfo's
    MemAvailable, or less where a cgroup (a container's limit) leaves less (v2's memory.max
    less memory.current, v1's memory.limit_in_bytes less memory.usage_in_bytes). None where
    neither says (not Linux, an old kernel)."""
    if meminfo is None:
        try:
            meminfo = Path("/proc/meminfo").read_text(errors="replace")
        except OSError:
            meminfo = ""
    free = None
    for line in meminfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "MemAvailable":
            parts = value.split()
            if parts and parts[0].isdigit():
                free = int(parts[0]) * 1024 if parts[1:2] == ["kB"] else int(parts[0])
    room = _cgroup_room(Path("/sys/fs/cgroup") if cgroup is None else cgroup)
    if room is None:
        return free
    return room if free is None else min(free, room)


def _cgroup_room(root: Path) -> int | None:
    for limit, used in (("memory.max", "memory.current"),
                        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            cap, now = (root / limit).read_text().strip(), (root / used).read_text().strip()
        except OSError:
            continue
        if cap.isdigit() and now.isdigit() and int(cap) < 1 << 60:  # "max" / v1's huge = none
            return max(0, int(cap) - int(now))
    return None


def gib(nbytes: float) -> str:
    """A size in bytes as people read it: '2.5 GiB', '64.0 MiB'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} bytes"


def memory_refusal(nbytes: int, what: str, lower: str) -> str | None:
    """None if `nbytes` fit in this machine's available memory (or it cannot be read), else the
    one line that refuses it: the size, what it is, what there is and what to lower."""
    free = available_memory()
    if free is None or nbytes <= free:
        return None
    return (f"{what} need {gib(nbytes)}, but this machine has {gib(free)} available "
            f"(MemAvailable): lower {lower}")
