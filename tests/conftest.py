import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import appserver
from skipdecode import models
from skipdecode.engine import Engine

# The tests decode in float32 on every CPU (and so do the servers and commands they start): "auto" means
# bfloat16 on CPUs with native bfloat16 and float32 elsewhere, and the tests compare tokens with
# transformers' own. tests/test_precision.py tests that decision on faked CPU flags.
os.environ.setdefault("SKIPDECODE_DTYPE", "float32")
# The tiny models go where SKIPDECODE_TEST_DEVICE says (default cpu): "cuda" runs the suite's model tests on a GPU.
DEVICE = torch.device(os.environ.get("SKIPDECODE_TEST_DEVICE", "cpu"))

PROMPTS = [
    "Write a sentence about a coffee shop.",
    "What is the capital of France?",
    "name[The Eagle], eatType[coffee shop], food[French], priceRange[moderate], area[riverside], "
    "kidsFriendly[yes], near[Burger King]. Describe this place in one sentence.",
]


WARMING: list[subprocess.Popen] = []


def pytest_sessionstart(session):
    """On an empty model cache (a fresh machine, as on CI) the default model's float32 copy is written first
    (models.cached_default: 27 s on one core here). A process of its own writes it while the tests are
    collected on the other core; the first test that loads the model waits for it on the cache's lock, or
    writes the copy itself if that process failed."""
    if not (models.cache_dir() / models.DEFAULT_MODEL / models.SOURCE_FILE).exists():
        WARMING.append(subprocess.Popen([sys.executable, "-c", "from skipdecode import models; models.cached_default()"],
                                        cwd=appserver.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def pytest_sessionfinish(session):
    for process in WARMING:  # a session that never loaded the model may end first
        process.terminate()
        process.wait()


# The app servers (tests/appserver.py): a test module with a `servers(fixtures)` function names the servers
# (appserver.app_url's arguments) that a test with these fixtures uses. Each server is launched a little ahead
# of its first test, so that it loads while the tests before it run, and stopped after its last one: an idle
# `python app.py` still takes 7-8% of a core (Gradio's queue looks for work every millisecond), time the
# other tests lose on a two-core machine.
LEAD_FILES = 2  # a server is launched when the file this many files before its first test's file starts
LAUNCH: dict[str, list[dict]] = {}  # test id -> the servers to launch as it starts
STOP: dict[str, list[str]] = {}  # test id -> the servers to stop once it is done (its fixtures torn down)


def servers_of(item) -> list[dict]:
    found = getattr(getattr(item, "module", None), "servers", None)
    return found(set(item.fixturenames)) if found else []


def pytest_collection_modifyitems(items):
    """The test files that use a server run last, so that the servers load while the other files run instead
    of the first file waiting for its own; after each such file, the next one that shares a server with it
    (else the next in the usual order), so that no server waits idle through a file that does not use it. The
    tests of each file keep their order."""
    files: dict[Path, list] = {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    uses = {path: {server["name"] for item in tests for server in servers_of(item)} for path, tests in files.items()}
    serving, order = [path for path in files if uses[path]], []
    while serving:
        shared = [path for path in serving if order and uses[path] & uses[order[-1]]]
        order.append((shared or serving)[0])
        serving.remove(order[-1])
    items[:] = [item for path in files if not uses[path] for item in files[path]] + \
               [item for path in order for item in files[path]]


def pytest_collection_finish(session):
    """Plan when each server the selected tests use is launched and stopped (see servers_of)."""
    if session.config.option.collectonly:
        return
    uses: dict[str, tuple[dict, list[int]]] = {}  # server name -> (its arguments, the indices of its tests)
    for index, item in enumerate(session.items):
        for server in servers_of(item):
            uses.setdefault(server["name"], (server, []))[1].append(index)
    starts = [i for i, item in enumerate(session.items) if i == 0 or item.path != session.items[i - 1].path]
    for name, (server, indices) in uses.items():
        files_before = [start for start in starts if start <= indices[0]]
        launch_at = files_before[max(0, len(files_before) - 1 - LEAD_FILES)]
        if launch_at == 0:
            appserver.prestart(**server)
        else:
            LAUNCH.setdefault(session.items[launch_at].nodeid, []).append(server)
        STOP.setdefault(session.items[indices[-1]].nodeid, []).append(name)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for server in LAUNCH.pop(item.nodeid, []):
        appserver.prestart(**server)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for name in STOP.pop(item.nodeid, []):
        appserver.stop(name)


@pytest.fixture
def cli(capsys):
    """`skipdecode ARGS` run by its `main()` in this process (the command's code without an interpreter's
    start, 4-5 s each here): returncode, stdout and stderr, like subprocess.run's."""
    from types import SimpleNamespace

    from skipdecode.cli import main

    def call(*args):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return call


@pytest.fixture(scope="session")
def engine():
    """The default model (bundled SmolLM2-135M-Instruct), loaded once for the whole session."""
    return Engine.load()


@pytest.fixture(scope="module")
def url():
    """The URL of the session's default app server (appserver.DEFAULT; a module's `servers` names it for the
    tests that use this fixture)."""
    return appserver.app_url()


# The browser tests' chromium: Debian's (scripts/setup_browser.sh installs it), never one playwright downloads.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """Headless chromium driven by playwright, one for each test file that asks for it."""
    if not CHROMIUM.exists():
        pytest.fail("Debian's chromium is missing: apt-get install -y chromium (.ci/run does this)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def served_engine():
    """The default model on the precision of the app servers that tests compare tokens with ("auto": the 4-bit
    default on a CPU; tests/appserver.py), loaded once for the whole session."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SKIPDECODE_DTYPE", "auto")
        return Engine.load()


def tiny_model(kind: str, seed: int = 0, layers: int = 4):
    """A small random model of another architecture, built from a config (no download)."""
    from transformers import (AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, OPTConfig,
                              Qwen2Config)

    torch.manual_seed(seed)
    common = dict(vocab_size=320, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    configs = {
        "opt": OPTConfig(hidden_size=64, num_attention_heads=4, ffn_dim=128, num_hidden_layers=layers,
                         max_position_embeddings=256, word_embed_proj_dim=64, **common),
        "gpt2": GPT2Config(n_embd=64, n_head=4, n_layer=layers, n_positions=256, **common),
        "llama": LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                             num_hidden_layers=layers, max_position_embeddings=256, **common),
        "qwen2": Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                             num_hidden_layers=layers, max_position_embeddings=256, **common),
        "mistral": MistralConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=128, num_hidden_layers=layers, max_position_embeddings=256,
                                 **common),
    }
    model = AutoModelForCausalLM.from_config(configs[kind]).eval()
    # Random init at std 0.02 gives near-uniform logits; widen it so greedy choices are not near-ties.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return model.to(DEVICE)


class IdTokenizer:
    """Enough of a tokenizer for prompts given as token ids."""

    chat_template = None
    pad_token_id, eos_token_id = 0, 2

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


# Left padding in every row but one: what the tiny 4-bit engines decode in a batch.
BATCH = [[1, 17, 43, 99, 5], [1, 250, 7], [1, 8, 9, 10, 11, 12, 13, 14]]


def tiny_int4(layers: int = 6, lora: int = 0, c_kernels: bool = False) -> Engine:
    """A random Llama on the 4-bit path: its matrices quantized to Q4_1-style blocks, packed for PyTorch's
    int4 kernel, or with `c_kernels` for the int8 kernel beside the C attention (skipdecode/kernels/native.py);
    with `lora`, a random rank-`lora` adapter unmerged on the fused query/key/value product."""
    from skipdecode.kernels import native, q4, w4a8

    model = tiny_model("llama", layers=layers)
    blocks = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp

        def int4(*linears):
            found = q4.quantize(torch.cat([lin.weight.detach() for lin in linears]))
            return w4a8.W4A8Linear.of(found) if c_kernels else q4.Int4Linear.of(found)

        qkv = int4(a.q_proj, a.k_proj, a.v_proj)
        if lora:
            qkv = qkv.with_lora(torch.randn(qkv.in_features, lora) * 0.1, torch.randn(lora, qkv.out_features) * 0.1)
        blocks.append((qkv, int4(a.o_proj), int4(m.gate_proj, m.up_proj), int4(m.down_proj)))
    head = q4.RescoredHead(model.get_output_embeddings().weight.detach(), rescore=16)
    weights = q4.GGUFWeights(blocks, head, "int4 (tiny)", attention=native.attention if c_kernels else None)
    return Engine(model, IdTokenizer(), weights=weights)


def tiny_checkpoint(folder, layers: int = 6):
    """A random Llama (6 layers unless told) with the default model's tokenizer (chat template included),
    on disk."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from skipdecode.models import cached_default

    tokenizer = AutoTokenizer.from_pretrained(cached_default())
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64, num_hidden_layers=layers,
                                         max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
                                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_adapter(folder, base, speedups=(2.0,), horizon: int = 12, task: str = "e2e"):
    """A random rank-2 LoRA adapter of `base` with the record `skipdecode train` writes."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(folder)
    folder = Path(folder)
    (folder / "skipdecode.json").write_text(json.dumps({
        "base_model": str(base), "speedups": list(speedups), "task": task,
        "config": {"horizon": horizon, "warmup_layers": 1, "decay": "linear", "mode": "skip", "spread": 1.0}}))
    return folder
