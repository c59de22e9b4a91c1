"""A quantization recipe: one frozen, validated value of what `tinyt quantize` does to a graph
(torch-free, numpy-free). The quantize stage makes one from its keyword arguments
(`QuantRecipe.request`), the weight rewrite (export/blockquant.py) and the calibration
(export/qdq.py) read it, the manifest records it, and every reader after that (the int8
exactness record, the runtime's batching) asks it instead of comparing option strings.

    mode         dynamic       weight-only   static
    products     int8 (level   fp32 (level   QDQ: int8 with activation scales
                 4, at run     0)            calibrated once (ActivationScales)
                 time)
    kernel       nbits | qgemm | qgemm-rows  nbits        nbits
    bits         8 | 4 (qgemm kernels: 8)    8 | 4        8

awq and max_bytes (4-bit blocks only) calibrate the rounding on activations of training text:
activation-aware scales per input channel (export/awq.py) and the weight tables whose 4 bits
move the logits most kept at 8 bits within a byte budget for the model file (export/mixed.py).
activations="q8" (weight-only, a GGUF import's carried blocks) rounds the activations before
each carried table as llama.cpp does for its integer products (export/gguf_activations.py).

The manifest keeps the keys the stage has always written under "options" (`options()`), and
the whole recipe under "quantization"."recipe" (`to_json()`); `from_manifest` reads every form
of "options" written so far (keys an older stage did not write take the value it used then).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tinyt.errors import QuantizeError

# mode -> MatMulNBits' accuracy_level (4: activations quantized to int8 at run time, products on
# the CPU's int8 dot-product units; 0: fp32 products); static has no MatMulNBits
MODES: Mapping[str, int | None] = {"dynamic": 4, "weight-only": 0, "static": None}
BITS = (8, 4)
# Weight-matmul kernels of dynamic mode: MatMulNBits (block-wise), DynamicQuantizeMatMul (per
# channel, int8 GEMM, activations per tensor), or the same GEMM with activations per row
# ("qgemm-rows": every row of a batch computed as if alone; export/blockquant.py says when each
# wins).
KERNELS = ("nbits", "qgemm", "qgemm-rows")
U8S8_KERNELS = ("qgemm", "qgemm-rows")  # kernels whose products are u8 x s8 int8 GEMMs
# How a block's values map to levels (export/blockquant.py says each one's arithmetic)
SCHEMES = ("symmetric", "symmetric-full", "asymmetric")
CALIBRATIONS = ("minmax", "entropy", "percentile")  # static: how activation ranges are set
# weight-only: the activations before each carried GGUF table rounded as llama.cpp rounds
# them for its integer products ("q8": blocks of 32 to 8 bits, q8_0 / q8_1 by the table's
# type; export/gguf_activations.py); "float": as they come (fp32 products)
ACTIVATIONS = ("float", "q8")
ACTIVATION_TYPES = ("uint8", "int8")  # static: x86's int8 kernels are u8 x s8, ARM's s8 x s8
# Weights per block scale, unless the caller names it.
DEFAULT_BLOCK = 64
# ONNX Runtime GenAI's model builder quantizes int4 in blocks of 32: the int4 artifact rows and
# the search's int4 variants use it, so the two compare on the same blocks.
INT4_BLOCK = 32
# A speech (Whisper) artifact's 8-bit tables when the caller names no block size: its decoder
# steps one row (or a beam's few) through a 51,865-token lm_head, where MatMulNBits reads
# blocks of 128 faster than of 64 (whisper-tiny's stepping graph, 1 thread, CPU time on an AMD
# EPYC with VNNI: 4.70 -> 3.98 ms at 1 row, 7.68 -> 7.16 at 5 beams); 8-bit steps lose
# nothing to note at either
SPEECH_BLOCK = 128
# bits -> (scheme, scale search) when the caller names neither. 4 bits: at llama-demo (block
# 32, the tied table at 8 bits) the asymmetric blocks with the search move the next token's
# distribution 38% less than symmetric ones (KL 4.7e-3 against 7.6e-3;
# benchmarks/results/int4-schemes-llama-demo-epyc-vnni) for 2.6% more bytes (zero points), and
# ONNX Runtime's 4-bit kernel reads them at the same speed (lab/step_kernels.py).
# 8 bits stay symmetric: the form tinyt/int8.py records exact on every CPU.
DEFAULT_SCHEME = {4: ("asymmetric", True), 8: ("symmetric", False)}
PLAIN_SCHEME = ("symmetric", False)  # what a graph without MatMulNBits blocks records


def _one_of(name: str, value: object, allowed: tuple | Mapping) -> None:
    if value not in allowed:
        raise QuantizeError(f"{name}={value!r} is not one of {', '.join(map(str, allowed))}")


def _modules(name: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(m, str) and m for m in value):
        raise QuantizeError(f"{name}={value!r} must be a list of module names, e.g. "
                            "['lm_head', 'transformer.h.0']")
    return tuple(value)


@dataclass(frozen=True)
class ActivationScales:
    """Static mode's activation ranges: calibrated once on training text (export/qdq.py)."""
    calibration: str = "minmax"
    per_channel: bool = True  # weights: a scale per output channel, else one per tensor
    activation_type: str = "uint8"  # the CPU's int8 preset (tinyt.hardware.int8_preset)

    def __post_init__(self) -> None:
        _one_of("calibration", self.calibration, CALIBRATIONS)
        if not isinstance(self.per_channel, bool):
            raise QuantizeError(f"per_channel={self.per_channel!r} must be True or False")
        _one_of("activation_type", self.activation_type, ACTIVATION_TYPES)


@dataclass(frozen=True)
class QuantRecipe:
    """What a quantization does, validated on construction (errors name the bad value and what
    is allowed). A field a mode does not use holds its neutral value: block_size None and
    scales None outside their modes, scheme 'symmetric' without search where no MatMulNBits
    blocks are made, reduce_range False where no u8 x s8 GEMM runs."""
    mode: str = "dynamic"
    bits: int = 8
    kernel: str = "nbits"
    block_size: int | None = DEFAULT_BLOCK  # weights per scale along K; None in static mode
    scheme: str = "symmetric"
    scale_search: bool = False  # each block's scale picked for the least squared error
    exclude: tuple[str, ...] = ()  # modules left fp32 ('lm_head', 'transformer.h.0', 'mlp')
    keep_8bit: tuple[str, ...] = ()  # modules kept at 8 bits in a 4-bit run
    reduce_range: bool = False  # 7-bit weights in the u8 x s8 GEMMs (x86 without VNNI)
    scales: ActivationScales | None = None  # static mode's calibrated activations
    # 4-bit blocks calibrated on activations (export/awq.py, export/mixed.py): per input
    # channel scales searched on each matmul's output error (AWQ), and a byte budget for the
    # model file within which the matmuls whose 4 bits move the logits most stay at 8
    awq: bool = False
    max_bytes: int | None = None
    activations: str = "float"  # weight-only: "q8" rounds as llama.cpp (ACTIVATIONS)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "exclude", _modules("exclude", self.exclude))
        set_(self, "keep_8bit", _modules("keep_8bit", self.keep_8bit))
        _one_of("mode", self.mode, MODES)
        _one_of("bits", self.bits, BITS)
        if self.static:
            if self.block_size is not None:
                raise QuantizeError(f"block_size={self.block_size!r} is for MatMulNBits' "
                                    "blocks; static (QDQ) weights are per channel or tensor: "
                                    "block_size=None")
        elif not (isinstance(self.block_size, int) and self.block_size >= 16
                  and self.block_size & (self.block_size - 1) == 0):
            raise QuantizeError(f"block_size={self.block_size!r} must be a power of two >= 16")
        if self.static and self.bits != 8:
            raise QuantizeError(f"static quantization is 8-bit only; bits={self.bits} is for the "
                                "dynamic and weight-only modes")
        if self.kernel not in KERNELS or (self.kernel != "nbits"
                                          and (self.bits != 8 or self.mode != "dynamic")):
            raise QuantizeError(f"kernel={self.kernel!r} with mode={self.mode!r}, "
                                f"bits={self.bits}: kernels are {', '.join(KERNELS)}, and the "
                                "qgemm ones are for 8-bit dynamic only")
        if self.keep_8bit and (self.bits != 4 or not self.block_wise):
            raise QuantizeError(f"keep_8bit={list(self.keep_8bit)} keeps modules at 8 bits in a "
                                "4-bit quantization (bits=4, mode dynamic or weight-only, kernel "
                                f"nbits); this is bits={self.bits}, mode={self.mode!r}, "
                                f"kernel={self.kernel!r}")
        _one_of("scheme", self.scheme, SCHEMES)
        if self.scheme != "symmetric" and self.bits != 4:
            raise QuantizeError(f"scheme={self.scheme!r} is for 4-bit blocks; 8-bit blocks stay "
                                "symmetric (the form whose int8 products are exact on every "
                                "CPU, tinyt/int8.py); use --bits 4, or --scale-search alone")
        if not isinstance(self.scale_search, bool):
            raise QuantizeError(f"scale_search={self.scale_search!r} must be True or False")
        if (self.scheme, self.scale_search) != PLAIN_SCHEME and not self.block_wise:
            raise QuantizeError(f"scheme={self.scheme!r}, scale_search={self.scale_search} "
                                "shape MatMulNBits' blocks (mode dynamic or weight-only, kernel "
                                f"nbits); this is mode={self.mode!r}, kernel={self.kernel!r}, "
                                "whose int8 weights are symmetric per channel")
        _one_of("activations", self.activations, ACTIVATIONS)
        if self.activations != "float" and not (self.weight_only and self.block_wise):
            raise QuantizeError(f"activations={self.activations!r} rounds the activations "
                                "before fp32 products (mode weight-only, kernel nbits); this "
                                f"is mode={self.mode!r}, kernel={self.kernel!r}")
        if not isinstance(self.reduce_range, bool):
            raise QuantizeError(f"reduce_range={self.reduce_range!r} must be True or False")
        if self.reduce_range and not self.u8s8_products:
            raise QuantizeError("reduce_range=True (7-bit weights) is for the u8 x s8 GEMMs of "
                                "mode static and kernels "
                                f"{', '.join(U8S8_KERNELS)}; this is mode={self.mode!r}, "
                                f"kernel={self.kernel!r}")
        self._check_calibrated()
        if self.static != (self.scales is not None):
            raise QuantizeError(f"scales={self.scales!r}: static mode calibrates activation "
                                "scales (ActivationScales), and only static mode does")

    def _check_calibrated(self) -> None:
        """awq and max_bytes shape 4-bit MatMulNBits blocks, nothing else."""
        if not isinstance(self.awq, bool):
            raise QuantizeError(f"awq={self.awq!r} must be True or False")
        if self.max_bytes is not None and (isinstance(self.max_bytes, bool) or not isinstance(
                self.max_bytes, int) or self.max_bytes <= 0):
            raise QuantizeError(f"max_bytes={self.max_bytes!r} must be a positive number of "
                                "bytes (the model file's), or None")
        for name, on in (("awq", self.awq), ("max_bytes", self.max_bytes is not None)):
            if on and (self.bits != 4 or not self.block_wise):
                raise QuantizeError(
                    f"{name}={getattr(self, name)!r} calibrates 4-bit MatMulNBits blocks (bits=4, "
                    f"mode dynamic or weight-only, kernel nbits); this is bits={self.bits}, "
                    f"mode={self.mode!r}, kernel={self.kernel!r}")

    @property
    def calibrated(self) -> bool:
        """The weights depend on activations of calibration text (awq, max_bytes)."""
        return self.awq or self.max_bytes is not None

    @classmethod
    def request(cls, *, mode: str = "dynamic", bits: int = 8,
                block_size: int = DEFAULT_BLOCK, kernel: str = "nbits",
                exclude: list[str] | tuple[str, ...] = (),
                keep_8bit: list[str] | tuple[str, ...] = (), scheme: str | None = None,
                scale_search: bool | None = None, reduce_range: bool = False,
                calibration: str = "minmax", per_channel: bool = True,
                activation_type: str = "uint8", awq: bool = False,
                max_bytes: int | None = None, activations: str = "float") -> QuantRecipe:
        """The recipe of `tinyt.export.quantize`'s keyword arguments: scheme / scale_search
        None take DEFAULT_SCHEME for the bits where MatMulNBits blocks are made; what the mode
        does not use is dropped as quantize always has (a block size in static mode,
        reduce_range where no u8 x s8 GEMM runs), once it is checked."""
        _one_of("mode", mode, MODES)
        _one_of("bits", bits, BITS)
        if not (isinstance(block_size, int) and block_size >= 16
                and block_size & (block_size - 1) == 0):
            raise QuantizeError(f"block_size={block_size!r} must be a power of two >= 16")
        static = mode == "static"
        blocks = not static and kernel == "nbits"
        default = DEFAULT_SCHEME[bits] if blocks else PLAIN_SCHEME
        u8s8 = static or kernel in U8S8_KERNELS
        recipe = cls(mode=mode, bits=bits, kernel=kernel,
                     block_size=None if static else block_size,
                     scheme=default[0] if scheme is None else scheme,
                     scale_search=default[1] if scale_search is None else scale_search,
                     exclude=_modules("exclude", exclude),
                     keep_8bit=_modules("keep_8bit", keep_8bit),
                     reduce_range=bool(reduce_range) and u8s8,
                     scales=ActivationScales(calibration, per_channel, activation_type)
                     if static else None, awq=awq, max_bytes=max_bytes,
                     activations=activations)
        if not static:  # unused here, but a wrong name is still a mistake worth naming
            _one_of("calibration", calibration, CALIBRATIONS)
        return recipe

    # --- what the stages and the runtime ask ------------------------------------------------
    @property
    def static(self) -> bool:
        """QDQ with calibrated activation scales (standard ONNX ops, from the plain export)."""
        return self.mode == "static"

    @property
    def weight_only(self) -> bool:
        """Int8 / int4 weights, fp32 products."""
        return self.mode == "weight-only"

    @property
    def accuracy_level(self) -> int | None:
        """MatMulNBits' accuracy_level: 4 (int8 activations at run time), 0 (fp32 products);
        None in static mode (no MatMulNBits)."""
        return MODES[self.mode]

    @property
    def block_wise(self) -> bool:
        """Weights as MatMulNBits blocks (dynamic or weight-only, kernel nbits): scheme,
        scale_search and keep_8bit shape them."""
        return not self.static and self.kernel == "nbits"

    @property
    def int8_gemm(self) -> bool:
        """The layers' weight matmuls run as int8 GEMMs with int8 weights per output channel
        (kernels qgemm, qgemm-rows); the tied table stays a shared MatMulNBits table."""
        return self.kernel in U8S8_KERNELS

    @property
    def row_scaled(self) -> bool:
        """Every int8 GEMM quantizes its activations with one scale per row (qgemm-rows); qgemm
        does so only at the modules export/blockquant.py ROW_SCALED names."""
        return self.kernel == "qgemm-rows"

    @property
    def u8s8_products(self) -> bool:
        """Products are u8 x s8 int8 GEMMs, exact only where the CPU adds them in 32 bits
        unless the weights keep to 7 bits (tinyt/int8.py)."""
        return self.static or self.int8_gemm

    @property
    def u8s8_weight_bits(self) -> int | None:
        """The u8 x s8 GEMMs' weight bits (7: reduce_range), None where there are none."""
        if not self.u8s8_products:
            return None
        return 7 if self.reduce_range else 8

    @property
    def rows_independent(self) -> bool:
        """No activation scale is shared between the rows of a batch, so a row's outputs do not
        depend on the rows run with it: serving may batch prompts, the accuracy check too."""
        return not self.static and self.kernel != "qgemm"

    # --- the manifest --------------------------------------------------------------------
    def options(self) -> dict[str, Any]:
        """The recipe's keys of the manifest's "options", as the quantize stage has always
        written them (the stage adds "data", and in static mode "hardware_preset")."""
        s = self.scales
        return {"mode": self.mode, "bits": self.bits, "exclude": list(self.exclude),
                "kernel": self.kernel,
                **({"keep_8bit": list(self.keep_8bit)} if self.keep_8bit else {}),
                **({"reduce_range": self.reduce_range} if self.int8_gemm else {}),
                **({"calibration": s.calibration, "per_channel": s.per_channel}
                   if s is not None else {"block_size": self.block_size}),
                **({"scheme": self.scheme, "scale_search": self.scale_search}
                   if self.block_wise else {}),
                **({"awq": True} if self.awq else {}),
                **({"max_bytes": self.max_bytes} if self.max_bytes is not None else {}),
                **({"activations": self.activations} if self.activations != "float" else {})}

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (the manifest's "quantization"."recipe")."""
        data = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QuantRecipe:
        """The inverse of to_json; an unknown key is an error, not ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise QuantizeError(f"recipe keys {unknown} are not QuantRecipe's: "
                                f"{', '.join(sorted(known))}")
        scales = data.get("scales")
        return cls(**{**data, "scales": None if scales is None else ActivationScales(**scales)})

    @classmethod
    def from_manifest(cls, options: Mapping[str, Any]) -> QuantRecipe:
        """The recipe of a quantize stage's manifest "options", of every form written so far:
        before --kernel (no key: nbits), before reduce_range was recorded beside the static
        preset (read from "hardware_preset"), before --keep-8bit (none), before --scheme and
        --scale-search (symmetric blocks without the search, what those stages made), before
        --exclude (none), before awq and max_bytes (off), before --activations (float)."""
        mode = options.get("mode", "dynamic")
        static = mode == "static"
        kernel = options.get("kernel", "nbits")
        preset = options.get("hardware_preset") or {}
        reduce = options.get("reduce_range")
        if reduce is None:
            reduce = preset.get("reduce_range", False)
        return cls(mode=mode, bits=options.get("bits", 8), kernel=kernel,
                   block_size=None if static else options.get("block_size", DEFAULT_BLOCK),
                   scheme=options.get("scheme", PLAIN_SCHEME[0]),
                   scale_search=options.get("scale_search", PLAIN_SCHEME[1]),
                   exclude=tuple(options.get("exclude") or ()),
                   keep_8bit=tuple(options.get("keep_8bit") or ()),
                   reduce_range=reduce is True and (static or kernel in U8S8_KERNELS),
                   scales=ActivationScales(options.get("calibration", "minmax"),
                                           options.get("per_channel", True),
                                           preset.get("activation_type", "uint8"))
                   if static else None, awq=options.get("awq", False),
                   max_bytes=options.get("max_bytes"),
                   activations=options.get("activations", "float"))


def recorded(quantization: Mapping[str, Any] | None) -> QuantRecipe | None:
    """The recipe a manifest's quantization record ("quantization", "prefill_quantization")
    carries; None for an unquantized graph or a record written before recipes were."""
    if not isinstance(quantization, Mapping) or "recipe" not in quantization:
        return None
    return QuantRecipe.from_json(quantization["recipe"])


def rows_independent(quantization: Mapping[str, Any] | None) -> bool | None:
    """Whether the graph of this quantization record computes every row of a batch as if it ran
    alone: its recipe's answer; for a record older than recipes, the flag the stage wrote
    beside it then; None for an unquantized graph (fp32 GEMMs may sum in another order for
    another batch size) or a record that says neither."""
    recipe = recorded(quantization)
    if recipe is not None:
        return recipe.rows_independent
    flag = quantization.get("rows_independent") if isinstance(quantization, Mapping) else None
    return flag if isinstance(flag, bool) else None


# --- the shared-cache graph's KV cache (`tinyt optimize --target gqa --kv-cache`) ----------
KV_CACHE_TYPES = ("float32", "int8")
# int8: a scale per (kv head, channel) of each layer's keys and values, or one per tensor;
# ONNX Runtime's GroupQueryAttention takes both (k_quant_type / v_quant_type)
KV_SCALE_TYPES = ("per-channel", "per-tensor")
# How a channel's range is chosen from the calibration (export/kv_int8.py): "mse", the range of
# least squared error of the int8 cache over the calibration's keys (at positions spread over
# the context) and values; "max", max |x| x margin (nothing clipped on the calibration)
KV_CLIP_RULES = ("mse", "max")
# clip "max": the calibrated range is max |x| over the calibration text times this: a key or
# value beyond it at run time is clipped to +-127 levels. 1.25 leaves a quarter of headroom for
# text unlike the calibration's at a cost of 1/4 of a level's resolution.
KV_MARGIN = 1.25


@dataclass(frozen=True)
class KVCacheRecipe:
    """What the shared-cache graph keeps its KV cache in, validated on construction: float32
    (as the source's graph), or int8 with scales calibrated per layer (export/kv_int8.py)."""
    dtype: str = "float32"
    scales: str = "per-channel"
    margin: float = KV_MARGIN  # clip "max" only
    clip: str = "mse"

    def __post_init__(self) -> None:
        _one_of("kv_cache", self.dtype, KV_CACHE_TYPES)
        _one_of("kv_scales", self.scales, KV_SCALE_TYPES)
        _one_of("kv_clip", self.clip, KV_CLIP_RULES)
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) \
                or not 1.0 <= self.margin <= 4.0:
            raise QuantizeError(f"kv_margin={self.margin!r} must be a number from 1 to 4 (the "
                                "calibrated max |x| is multiplied by it; beyond it is clipped)")
        object.__setattr__(self, "margin", float(self.margin))

    @property
    def quantized(self) -> bool:
        return self.dtype == "int8"

    @property
    def ort_quant_type(self) -> str:
        """GroupQueryAttention's k_quant_type / v_quant_type."""
        return "PER_CHANNEL" if self.scales == "per-channel" else "PER_TENSOR"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> KVCacheRecipe:
        """The record's recipe; None (a manifest written before --kv-cache): float32; a record
        without "clip" (written before --kv-clip): the rule then, "max"."""
        if data is None:
            return cls()
        if isinstance(data, Mapping) and "clip" not in data:
            data = {**data, "clip": "max"}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise QuantizeError(f"kv_cache keys {unknown} are not KVCacheRecipe's: "
                                f"{', '.join(sorted(known))}")
        return cls(**data)
