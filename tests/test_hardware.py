from tinyt.hardware import cpu_features, int8_preset

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
        assert f["avx2"] == ("avx2" in flags) and f["avx512_vnni"] == ("avx512_vnni" in flags)
