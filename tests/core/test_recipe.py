"""The quantization recipe (tinyt/recipe.py): one validated value, the conditions the stages and
the runtime ask of it, and every form of manifest "options" the quantize stage has written."""
import json

import pytest

from tinyt import int8
from tinyt.errors import QuantizeError
from tinyt.recipe import (
    DEFAULT_BLOCK,
    INT4_BLOCK,
    ActivationScales,
    QuantRecipe,
    recorded,
    rows_independent,
)

AVX2_PRESET = {"preset": "avx2", "activation_type": "uint8", "reduce_range": True}
VNNI_PRESET = {"preset": "vnni", "activation_type": "uint8", "reduce_range": False}

# quantize()'s keyword arguments, one of each kind of recipe
REQUESTS = [
    {},
    dict(bits=4),
    dict(bits=4, block_size=INT4_BLOCK, keep_8bit=["lm_head"]),
    dict(bits=4, scheme="symmetric-full", scale_search=False),
    dict(mode="weight-only", exclude=["lm_head"]),
    dict(mode="weight-only", bits=4, block_size=128),
    dict(kernel="qgemm", reduce_range=True),
    dict(kernel="qgemm-rows"),
    dict(mode="static", calibration="entropy", per_channel=False, reduce_range=True),
    dict(mode="static", activation_type="int8", exclude=["transformer.h.1"]),
]


def test_quantizes_defaults_are_the_plain_recipe():
    assert QuantRecipe.request() == QuantRecipe()
    r = QuantRecipe()
    assert (r.mode, r.bits, r.kernel, r.block_size, r.scheme, r.scale_search) == \
        ("dynamic", 8, "nbits", DEFAULT_BLOCK, "symmetric", False)
    four = QuantRecipe.request(bits=4)  # 4 bits: asymmetric blocks with the scale search
    assert (four.scheme, four.scale_search) == ("asymmetric", True)
    # what the mode does not use is dropped, as quantize always has
    static = QuantRecipe.request(mode="static", block_size=128, reduce_range=True)
    assert static.block_size is None and static.reduce_range is True
    assert static.scales == ActivationScales()
    assert QuantRecipe.request(reduce_range=True).reduce_range is False  # nbits: no u8 x s8


@pytest.mark.parametrize("kw,needle", [
    (dict(mode="int2"), "mode='int2' is not one of dynamic, weight-only, static"),
    (dict(bits=3), "bits=3 is not one of 8, 4"),
    (dict(block_size=48), "block_size=48 must be a power of two >= 16"),
    (dict(block_size=8), "block_size=8 must be a power of two >= 16"),
    (dict(mode="static", bits=4), "static quantization is 8-bit only"),
    # an unknown kernel is an error, never read as a bit width or taken for nbits
    (dict(kernel="4"), "kernel='4' .*kernels are nbits, qgemm, qgemm-rows"),
    (dict(kernel="fast"), "kernel='fast' .*kernels are nbits, qgemm, qgemm-rows"),
    (dict(kernel="qgemm", bits=4), "qgemm ones are for 8-bit dynamic only"),
    (dict(kernel="qgemm-rows", mode="weight-only"), "qgemm ones are for 8-bit dynamic only"),
    (dict(bits=8, keep_8bit=["lm_head"]), "keeps modules at 8 bits in a 4-bit"),
    (dict(bits=4, scheme="q4_k"), "scheme='q4_k' is not one of symmetric, symmetric-full, "
                                  "asymmetric"),
    (dict(bits=8, scheme="asymmetric"), "scheme='asymmetric' is for 4-bit blocks"),
    (dict(scale_search=True, kernel="qgemm"), "shape MatMulNBits' blocks"),
    (dict(scale_search=True, mode="static"), "shape MatMulNBits' blocks"),
    (dict(mode="static", calibration="kl"), "calibration='kl' is not one of minmax, entropy"),
    (dict(calibration="kl"), "calibration='kl' is not one of minmax"),  # named even unused
    (dict(mode="static", activation_type="fp8"), "activation_type='fp8' is not one of uint8"),
    (dict(exclude="lm_head"), "exclude='lm_head' must be a list of module names"),
])
def test_a_bad_request_names_the_value_and_what_is_allowed(kw, needle):
    with pytest.raises(QuantizeError, match=needle):
        QuantRecipe.request(**kw)


@pytest.mark.parametrize("kw,needle", [
    (dict(mode="static", scales=ActivationScales()), "block_size=64 is for MatMulNBits"),
    (dict(mode="static", block_size=None), "static mode calibrates activation scales"),
    (dict(scales=ActivationScales()), "only static mode does"),
    (dict(reduce_range=True), "reduce_range=True .* is for the u8 x s8 GEMMs"),
    (dict(block_size=None), "block_size=None must be a power of two"),
    (dict(scale_search=1), "scale_search=1 must be True or False"),
])
def test_the_value_itself_holds_no_field_its_mode_does_not_use(kw, needle):
    with pytest.raises(QuantizeError, match=needle):
        QuantRecipe(**kw)


@pytest.mark.parametrize("kw,u8s8,rows,per_row,blocks,level", [
    ({}, False, True, False, True, 4),
    (dict(mode="weight-only"), False, True, False, True, 0),
    (dict(kernel="qgemm"), True, False, False, False, 4),
    (dict(kernel="qgemm-rows"), True, True, True, False, 4),
    (dict(mode="static"), True, False, False, False, None),
])
def test_what_the_stages_and_the_runtime_ask(kw, u8s8, rows, per_row, blocks, level):
    r = QuantRecipe.request(**kw)
    assert r.u8s8_products == u8s8
    assert r.rows_independent == rows
    assert r.row_scaled == per_row
    assert r.block_wise == blocks
    assert r.accuracy_level == level
    assert r.int8_gemm == (r.kernel != "nbits")
    assert r.weight_only == (r.mode == "weight-only")
    assert r.u8s8_weight_bits == (8 if u8s8 else None)
    seven = QuantRecipe.request(**kw, reduce_range=True)
    assert seven.u8s8_weight_bits == (7 if u8s8 else None)


@pytest.mark.parametrize("kw", REQUESTS)
def test_json_and_manifest_round_trips(kw):
    r = QuantRecipe.request(**kw)
    preset = {**VNNI_PRESET, "reduce_range": r.reduce_range,  # the preset, as quantize overrides it
              **({"activation_type": kw["activation_type"]} if "activation_type" in kw else {})}
    data = json.loads(json.dumps(r.to_json()))  # JSON-ready
    assert QuantRecipe.from_json(data) == r
    # the options as the stage writes them (it adds data, and a static run's preset)
    options = {**r.options(), "data": None,
               **({"hardware_preset": preset} if r.static else {})}
    assert QuantRecipe.from_manifest(json.loads(json.dumps(options))) == r
    with pytest.raises(QuantizeError, match=r"recipe keys \['bogus'\] are not QuantRecipe's"):
        QuantRecipe.from_json({**data, "bogus": 1})


def test_options_keep_the_keys_the_stage_has_always_written():
    assert QuantRecipe.request().options() == {
        "mode": "dynamic", "bits": 8, "exclude": [], "kernel": "nbits", "block_size": 64,
        "scheme": "symmetric", "scale_search": False}
    assert QuantRecipe.request(bits=4, keep_8bit=["lm_head"]).options() == {
        "mode": "dynamic", "bits": 4, "exclude": [], "kernel": "nbits", "keep_8bit": ["lm_head"],
        "block_size": 64, "scheme": "asymmetric", "scale_search": True}
    assert QuantRecipe.request(kernel="qgemm-rows").options() == {
        "mode": "dynamic", "bits": 8, "exclude": [], "kernel": "qgemm-rows",
        "reduce_range": False, "block_size": 64}
    assert QuantRecipe.request(mode="static", reduce_range=True).options() == {
        "mode": "static", "bits": 8, "exclude": [], "kernel": "nbits",
        "calibration": "minmax", "per_channel": True}


# Every form of "options" in the history of export/quantize.py (`git log -p`), as written.
OLDER = [
    # 7b12390, the first stage: block-wise MatMulNBits only
    ({"mode": "dynamic", "bits": 4, "block_size": 32, "exclude": ["lm_head"], "data": None},
     QuantRecipe(bits=4, block_size=32, exclude=("lm_head",))),
    # a47b5a9: static mode, its CPU preset beside it (reduce_range inside the preset)
    ({"mode": "static", "bits": 8, "exclude": [], "data": "corpus",
      "calibration": "entropy", "per_channel": False, "hardware_preset": AVX2_PRESET},
     QuantRecipe(mode="static", block_size=None, reduce_range=True,
                 scales=ActivationScales("entropy", False, "uint8"))),
    ({"mode": "weight-only", "bits": 8, "exclude": [], "data": None, "block_size": 64},
     QuantRecipe(mode="weight-only")),
    # e290c7b: --kernel, reduce_range recorded for qgemm
    ({"mode": "dynamic", "bits": 8, "exclude": [], "data": None, "kernel": "qgemm",
      "reduce_range": True, "block_size": 64},
     QuantRecipe(kernel="qgemm", reduce_range=True)),
    ({"mode": "static", "bits": 8, "exclude": [], "data": None, "kernel": "nbits",
      "calibration": "minmax", "per_channel": True,
      "hardware_preset": {"preset": "arm-dotprod", "activation_type": "int8",
                          "reduce_range": False}},
     QuantRecipe(mode="static", block_size=None,
                 scales=ActivationScales("minmax", True, "int8"))),
    # 07efea2: qgemm-rows
    ({"mode": "dynamic", "bits": 8, "exclude": [], "data": None, "kernel": "qgemm-rows",
      "reduce_range": False, "block_size": 64},
     QuantRecipe(kernel="qgemm-rows")),
    # 7a89d18: --keep-8bit, before --scheme: 4-bit blocks were symmetric without the search
    ({"mode": "dynamic", "bits": 4, "exclude": [], "data": None, "kernel": "nbits",
      "keep_8bit": ["lm_head"], "block_size": 32},
     QuantRecipe(bits=4, block_size=32, keep_8bit=("lm_head",))),
    # 0a4bf8b / 96b3ab2: --scheme, --scale-search (today's form)
    ({"mode": "dynamic", "bits": 4, "exclude": [], "data": None, "kernel": "nbits",
      "block_size": 128, "scheme": "asymmetric", "scale_search": True},
     QuantRecipe(bits=4, block_size=128, scheme="asymmetric", scale_search=True)),
]


@pytest.mark.parametrize("options,want", OLDER)
def test_every_older_manifest_form_reads(options, want):
    assert QuantRecipe.from_manifest(options) == want


@pytest.mark.parametrize("options,entry", [
    (OLDER[0][0], {"u8s8_gemm": False, "exact_on": int8.EXACT_EVERYWHERE}),
    (OLDER[1][0], {"u8s8_gemm": True, "weight_bits": 7, "exact_on": int8.EXACT_EVERYWHERE}),
    (OLDER[3][0], {"u8s8_gemm": True, "weight_bits": 7, "exact_on": int8.EXACT_EVERYWHERE}),
    (OLDER[4][0], {"u8s8_gemm": True, "weight_bits": 8, "exact_on": int8.EXACT_32BIT}),
    (OLDER[5][0], {"u8s8_gemm": True, "weight_bits": 8, "exact_on": int8.EXACT_32BIT}),
    (OLDER[7][0], {"u8s8_gemm": False, "exact_on": int8.EXACT_EVERYWHERE}),
])
def test_the_int8_record_of_a_manifest_without_one_comes_from_its_recipe(options, entry):
    assert int8.quantized_entry(options) == entry


def test_the_runtime_reads_rows_independence_from_the_recipe_or_the_older_flag():
    rows, qgemm = QuantRecipe.request(kernel="qgemm-rows"), QuantRecipe.request(kernel="qgemm")
    assert rows_independent({"recipe": rows.to_json(), "rows_independent": True}) is True
    assert rows_independent({"recipe": qgemm.to_json(), "rows_independent": False}) is False
    assert recorded({"recipe": qgemm.to_json()}) == qgemm
    # a record written before the recipe block: the flag the stage wrote then
    assert rows_independent({"rows_independent": False}) is False
    assert rows_independent({"rows_independent": True}) is True
    assert recorded({"rows_independent": True}) is None
    for unknown in (None, {}, {"quantized": []}):  # fp32, or a record that says neither
        assert rows_independent(unknown) is None


def test_every_quantize_row_of_the_catalogue_and_the_search_is_a_recipe():
    from tinyt.artifacts import ENCODER_VARIANTS, VARIANTS

    rows = [v for v in (*VARIANTS, *ENCODER_VARIANTS) if v.stage == "quantize"]
    assert rows
    for v in rows:
        r = QuantRecipe.request(**v.options)
        if v.fallback:
            QuantRecipe.request(**{**v.options, **v.fallback})
        if r.bits == 4 and v.dir.startswith("onnx-int4") and "k128" not in v.dir:
            assert r.block_size == INT4_BLOCK  # the builder's block, so the two compare
