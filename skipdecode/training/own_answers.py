"""The student's own answers, for sequence-level unlikelihood: the student decodes a batch's prompts
greedily on the layer plan it is trained for, with the engine, on the adapter as it stands.

Why: teacher forcing only ever shows the student the full model's answers, so it never sees its own loops;
the round-1 general adapter, trained that way, looped (docs/research/general-adapters.md).
"""

from __future__ import annotations

import torch

from ..engine import Engine
from ..schedule import Schedule


def merged_weights(peft_model) -> dict[str, torch.Tensor]:
    """Module name -> base weight + LoRA delta, for every LoRA'd linear of a peft model as it stands
    (dropout plays no part in the delta). The names are those of the plain base model."""
    base = peft_model.get_base_model() if hasattr(peft_model, "get_base_model") else peft_model
    weights = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if not (hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")):
                continue
            weight = module.base_layer.weight.detach().clone()
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    weight += module.get_delta_weight(adapter).detach().to(weight.dtype)
            weights[name] = weight
    return weights


class StudentSampler:
    """The student as the engine decodes it: a plain copy of the base model whose LoRA'd matrices are
    set to base + delta before each draw. The engine fuses and repacks the matrices it is built on, so
    every refresh builds a new one (a few hundred milliseconds for SmolLM2-135M, against a draw of 160
    tokens)."""

    def __init__(self, model: torch.nn.Module, tokenizer, max_new_tokens: int):
        self.model, self.tokenizer = model.eval().requires_grad_(False), tokenizer
        self.max_new_tokens = max_new_tokens
        self.engine: Engine | None = None

    def refresh(self, peft_model) -> None:
        self.engine = None  # the old engine's fused and packed copies go before the new one's are made
        for name, weight in merged_weights(peft_model).items():
            self.model.get_submodule(name).weight.data = weight
        self.engine = Engine(self.model, self.tokenizer)

    def sample(self, examples, schedule: Schedule):
        """The examples' prompts with the student's own greedy answers as targets (its end token included
        where it ended): the decoding whose loops the demo shows."""
        if self.engine is None:
            raise RuntimeError("refresh the sampler from the student before sampling")
        prompts = [prompt for prompt, _ in examples]
        result = self.engine.generate(prompts, schedule, self.max_new_tokens)
        return [(prompt, ids) for prompt, ids in zip(prompts, result.token_ids)]


def is_own_batch(step: int, share: float) -> bool:
    """Whether batch `step` (from 0) is drawn by the student: exactly `share` of the batches, spread
    evenly and the same on a resumed run."""
    return int((step + 1) * share) > int(step * share)
