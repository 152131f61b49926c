"""llama.cpp's build flags from the CPU's flags and the kernel's answer on AMX (skipdecode/evaluation/amx.py):
native where that is safe, else each ISA flag the CPU has, AMX off. Plain functions: no compiler runs."""

from skipdecode.evaluation.amx import amx_granted, amx_refused, cmake_args, cpu_flags

SAPPHIRE = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile",
            "amx_int8", "amx_bf16"}  # no avx_vnni: that flag's switch must then be left out


def test_native_where_amx_is_absent_or_granted():
    assert cmake_args(SAPPHIRE - {"amx_tile", "amx_int8", "amx_bf16"}, granted=False) == "-DGGML_NATIVE=ON"
    assert cmake_args(SAPPHIRE, granted=True) == "-DGGML_NATIVE=ON"
    assert not amx_refused(SAPPHIRE, granted=True) and amx_refused(SAPPHIRE, granted=False)


def test_refused_amx_gets_the_cpus_own_flags_and_amx_off():
    args = cmake_args(SAPPHIRE, granted=False).split()
    assert args[0] == "-DGGML_NATIVE=OFF"
    assert {"-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX512_VNNI=ON"} <= set(args)
    assert "-DGGML_AVX_VNNI=ON" not in args  # the CPU lacks avx_vnni
    assert not [a for a in args if "AMX" in a and not a.endswith("=OFF")]


def test_cpu_flags_read_from_cpuinfo_and_the_probe_answers():
    assert cpu_flags("processor\t: 0\nflags\t\t: fpu avx2 amx_tile\n") == {"fpu", "avx2", "amx_tile"}
    assert cpu_flags("") == set()
    assert amx_granted() in (True, False)  # the real request: 0 from the kernel or a refusal, never an exception


def test_the_build_script_reads_the_pinned_version_and_says_why(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "bench_peers.py"
    spec = importlib.util.spec_from_file_location("bench_peers", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    pins = tmp_path / "requirements-peers.txt"
    pins.write_text("# comment\nllama-cpp-python==1.2.3  # why\n")
    assert script.pinned_version(pins) == "1.2.3"
    assert script.pinned_version() in script.REQUIREMENTS.read_text()  # the real file's pin
    assert "does not grant it" in script.why(SAPPHIRE, granted=False)
    assert "native" in script.why(SAPPHIRE, granted=True) and "no AMX" in script.why(set(), granted=False)
