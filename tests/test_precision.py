"""The default precision: one decision (`models.precision`), made on the CPU's flags, faked here."""

import pytest
import torch

from skipdecode import models

CPU = torch.device("cpu")


@pytest.fixture
def flags(monkeypatch):
    """Set the CPU's flags (and clear any host override) for one test."""
    monkeypatch.delenv(models.DTYPE_ENV, raising=False)

    def fake(*names):
        monkeypatch.setattr(models, "cpu_flags", lambda: frozenset(names))

    return fake


@pytest.mark.parametrize("names", [(), ("avx2",), ("avx2", "avx512f")])
def test_no_native_bfloat16_is_float32(flags, monkeypatch, names):
    flags(*names)
    for switched in (False, True):
        monkeypatch.setattr(models, "CPU_BFLOAT16", switched)
        assert models.resolve_dtype("auto", CPU) is torch.float32
        assert models.precision_reason(CPU) == "float32: this CPU has no native bfloat16 (no avx512_bf16 or AMX)"


@pytest.mark.parametrize("names, said", [(("avx2", "avx512f", "avx512_bf16"), "avx512_bf16"),
                                         (("avx2", "amx_tile", "amx_bf16"), "amx_bf16"),
                                         (("avx512_bf16", "amx_bf16"), "amx_bf16 and avx512_bf16")])
def test_native_bfloat16_follows_the_switch(flags, monkeypatch, names, said):
    flags(*names)
    monkeypatch.setattr(models, "CPU_BFLOAT16", True)
    assert models.resolve_dtype("auto", CPU) is torch.bfloat16
    assert models.resolve_dtype(None, CPU) is torch.bfloat16
    assert models.precision(CPU) == (torch.bfloat16, f"bfloat16: this CPU has {said}")
    monkeypatch.setattr(models, "CPU_BFLOAT16", False)
    dtype, reason = models.precision(CPU)
    assert dtype is torch.float32 and reason.startswith(f"float32: this CPU has {said}, but")
    assert "CPU_BFLOAT16" in reason


def test_explicit_dtypes_win(flags, monkeypatch):
    flags("avx512_bf16")
    monkeypatch.setattr(models, "CPU_BFLOAT16", True)
    monkeypatch.setenv(models.DTYPE_ENV, "float16")
    assert models.resolve_dtype("float32", CPU) is torch.float32
    assert models.resolve_dtype("fp32", CPU) is torch.float32
    assert models.resolve_dtype(torch.float32, CPU) is torch.float32
    assert models.resolve_dtype("bf16", CPU) is torch.bfloat16
    flags()
    assert models.resolve_dtype("bfloat16", CPU) is torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of auto"):
        models.resolve_dtype("float64", CPU)


def test_host_override(flags, monkeypatch):
    flags()
    monkeypatch.setenv(models.DTYPE_ENV, "bfloat16")
    assert models.precision(CPU) == (torch.bfloat16, f"bfloat16: set by ${models.DTYPE_ENV}")
    monkeypatch.setenv(models.DTYPE_ENV, "auto")  # the same as unset
    assert models.resolve_dtype("auto", CPU) is torch.float32
    monkeypatch.setenv(models.DTYPE_ENV, "double")
    with pytest.raises(ValueError, match=models.DTYPE_ENV):
        models.resolve_dtype("auto", CPU)


def test_cuda_without_native_bfloat16_is_float32(flags, monkeypatch):
    flags("avx512_bf16")
    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, n=native: n)
        assert models.resolve_dtype("auto", torch.device("cuda")) is want


def test_cpu_flags_are_the_listed_isa_flags():
    found = models.cpu_flags()
    assert found <= set(models.ISA_FLAGS)
    reason = models.precision_reason(CPU)
    assert reason.split(":")[0] in ("float32", "bfloat16")


def test_cpu_flags_without_proc_cpuinfo_ask_torch(monkeypatch):
    def no_file(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(models, "open", no_file, raising=False)
    for probe, value in (("_is_avx2_supported", True), ("_is_avx512_supported", True),
                         ("_is_avx512_bf16_supported", False), ("_is_amx_tile_supported", True)):
        monkeypatch.setattr(torch.cpu, probe, lambda v=value: v)
    assert models.cpu_flags() == {"avx2", "avx512f", "amx_tile", "amx_bf16"}
