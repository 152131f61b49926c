import json
import os
from pathlib import Path

import pytest
import torch

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


def pytest_collection_finish(session):
    """A test module with a `prestart_servers(fixtures)` function launches the app servers its selected tests
    will use now (appserver.prestart), so they load while the tests before them run."""
    if session.config.option.collectonly:
        return
    fixtures = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if hasattr(module, "prestart_servers"):
            fixtures.setdefault(module, set()).update(item.fixturenames)
    for module, names in fixtures.items():
        module.prestart_servers(names)


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
