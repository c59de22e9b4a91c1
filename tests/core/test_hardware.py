from tinyt.hardware import PROBE_GRAPH, PROBE_K, cpu_features, int8_preset, saturates_here

SPR = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 avx512f avx512_vnni amx_int8 amx_bf16\n"
HASWELL = "model name\t: Intel(R) Core(TM) i7-4770\nflags\t\t: fpu sse4_2 avx avx2 fma\n"
GRAVITON = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp\nCPU part\t: 0xd0c\n"


def test_features_from_cpuinfo():
    f = cpu_features(SPR)
    assert f["avx512_vnni"] and f["amx_int8"] and f["model"].startswith("Intel(R) Xeon")
    assert not cpu_features(HASWELL)["avx512_vnni"] and cpu_features(HASWELL)["avx2"]
    assert cpu_features(GRAVITON)["arm_dotprod"]


def test_presets():
    assert int8_preset({**cpu_features(SPR), "machine": "x86_64"}) == {
        "preset": "amx", "activation_type": "uint8", "reduce_range": False}
    old = int8_preset({**cpu_features(HASWELL), "machine": "x86_64"})
    assert old["preset"] == "avx2" and old["reduce_range"] is True  # u8s8 can saturate
    arm = int8_preset({**cpu_features(GRAVITON), "machine": "aarch64"})
    assert arm == {"preset": "arm-dotprod", "activation_type": "int8", "reduce_range": False}


def test_this_machine_is_read():
    import platform
    from pathlib import Path
    f = cpu_features()
    assert f["machine"] == platform.machine()
    info = Path("/proc/cpuinfo")
    if info.is_file():  # Linux: the flags are the kernel's
        flags = next((line.split(":", 1)[1].split() for line in info.read_text().splitlines()
                      if line.lower().startswith(("flags", "features"))), [])
        if f["cpuinfo_matches_cpuid"]:  # not under an emulator, whose host wrote the file
            assert f["avx2"] == ("avx2" in flags)
            assert f["avx512_vnni"] == ("avx512_vnni" in flags)
    assert f["u8s8_exact"] in (True, False)  # measured: onnxruntime is installed here
    if f["u8s8_exact"] is False:  # only where no 32-bit int8 unit is there to take it
        assert not (f["avx512_vnni"] or f["avx_vnni"] or f["amx_int8"] or f["arm_dotprod"])


def test_the_preset_follows_the_measured_arithmetic_over_the_flags():
    vnni = {**cpu_features(SPR), "machine": "x86_64"}
    assert int8_preset({**vnni, "u8s8_exact": False})["reduce_range"] is True
    haswell = {**cpu_features(HASWELL), "machine": "x86_64"}
    assert int8_preset({**haswell, "u8s8_exact": True})["reduce_range"] is False
    assert saturates_here({**haswell, "u8s8_exact": None})  # unknown: from the flags


def test_the_probe_graph_is_the_graph_it_says():
    """The serialized probe (the runtime has no onnx package) is exactly this graph."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    K = PROBE_K
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "u8s8_probe",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, ["rows", K])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, ["rows", 8])],
        [numpy_helper.from_array(np.full((K, 8), 127, np.int8), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="tinyt")
    model.ir_version = 7
    assert model.SerializeToString() == PROBE_GRAPH


# two sockets of two cores with hyper-threads: processors 0-3 on socket 0 (cores 0, 1 twice),
# 4-7 on socket 1
TWO_SOCKETS = "".join(f"processor\t: {p}\nphysical id\t: {p // 4}\ncore id\t\t: {p % 2}\n\n"
                      for p in range(8))


def test_physical_cores_are_those_the_process_may_run_on():
    from tinyt.hardware import physical_cores
    assert physical_cores(TWO_SOCKETS, allowed=set(range(8))) == 4
    assert physical_cores(TWO_SOCKETS, allowed={0, 2}) == 1  # one core's two hyper-threads
    assert physical_cores(TWO_SOCKETS, allowed={0, 1, 4}) == 3  # taskset -c 0,1,4
    assert physical_cores("", allowed={3, 5}) == 2  # no cores listed: the mask's size
