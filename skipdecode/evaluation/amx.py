"""Whether this CPU's AMX can be used, and the llama.cpp build flags that follow.

A CPU may advertise AMX (`amx_tile` in /proc/cpuinfo) while the kernel does not grant a process its tile
state: Linux hands it out only on request, `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, and a
virtual machine's kernel may refuse. llama.cpp built with `-DGGML_NATIVE=ON` on such a machine compiles its AMX
kernel and dies with a general-protection fault at its first `ldtilecfg`. So `make bench-peers`
(scripts/bench_peers.py) builds natively where AMX is granted or absent, and otherwise with this CPU's other
ISA flags named one by one and AMX left out; the bench's crash line (llamacpp_child.py) names the cause.
Stdlib only: nothing here loads llama.cpp.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

SYS_ARCH_PRCTL = 158  # x86-64's syscall number for arch_prctl
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
# llama.cpp's CMake switch for each CPU flag, in the order its ggml-cpu CMakeLists lists them
ISA = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"),
       ("bmi2", "GGML_BMI2"), ("avx512f", "GGML_AVX512"), ("avx512vbmi", "GGML_AVX512_VBMI"),
       ("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"), ("avx_vnni", "GGML_AVX_VNNI"))
NO_AMX = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's flags in /proc/cpuinfo (empty where there is none: not Linux)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def amx_granted() -> bool:
    """True when the kernel grants this process AMX's tile data (the request returns 0); False where it
    refuses, or where the call does not exist (not Linux on x86-64)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def amx_refused(flags: set[str] | None = None, granted: bool | None = None) -> bool:
    """The crashing case: the CPU advertises AMX and the kernel does not grant it."""
    flags = cpu_flags() if flags is None else flags
    return "amx_tile" in flags and not (amx_granted() if granted is None else granted)


def cmake_args(flags: set[str] | None = None, granted: bool | None = None) -> str:
    """CMAKE_ARGS for llama.cpp on this CPU: native where that is safe, else each flag the CPU has, AMX off."""
    flags = cpu_flags() if flags is None else flags
    if not amx_refused(flags, granted):
        return "-DGGML_NATIVE=ON"
    return " ".join(["-DGGML_NATIVE=OFF", *(f"-D{switch}=ON" for flag, switch in ISA if flag in flags), *NO_AMX])
