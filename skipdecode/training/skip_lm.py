"""The model under training: a LoRA-wrapped causal LM whose one teacher-forced pass follows the layer plan
the engine decodes with.

Teacher forcing feeds prompt + reference in one pass. Position p of a row runs layer l exactly when
decoding would run it: prompt positions run every layer (the prefill); the token at prompt_len + s is the
s-th token fed back and runs schedule.layers(s). A position that skips a layer passes its hidden state
through unchanged. Why one pass equals decoding: the budget never grows, so the positions that run a layer
form a prefix of the sequence. A position that runs layer l therefore attends only to earlier positions
that also ran layer l, with the same inputs they had while decoding; the keys computed at positions that
skip l lie after every position that runs l, and the causal mask hides them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..schedule import Schedule
from .losses import reference_loss, sequence_unlikelihood_loss


def layer_plan(schedule: Schedule, prompt_lens: list[int], fed_back: list[int], width: int) -> torch.Tensor:
    """runs[r, p, l]: does position p of row r run layer l? The prompt runs all layers; the s-th token
    fed back (at prompt_len + s) runs schedule.layers(s); padding runs nothing."""
    steps = max(fed_back, default=0)
    table = torch.tensor(schedule.plan(steps), dtype=torch.bool).reshape(steps, schedule.num_layers)
    runs = torch.zeros(len(prompt_lens), width, schedule.num_layers, dtype=torch.bool)
    for row, (p, n) in enumerate(zip(prompt_lens, fed_back)):
        runs[row, :p] = True
        runs[row, p:p + n] = table[:n]
    return runs


class SkipLM(torch.nn.Module):
    """A (LoRA-wrapped) Llama-family causal LM whose forward follows a layer plan and returns the loss on
    target tokens only. Everything runs inside forward so that DDP under `accelerate launch` sees it."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if base.config.model_type not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"skip-aware training supports the Llama family (llama, mistral, qwen2); "
                             f"got {base.config.model_type!r}")
        self.inner, self.lm_head = base.model, base.lm_head

    def hidden(self, input_ids, lengths, runs):
        inner = self.inner
        B, T = input_ids.shape
        h = inner.embed_tokens(input_ids)
        positions = torch.arange(T, device=h.device)[None]
        cos, sin = inner.rotary_emb(h, positions)
        valid = positions < lengths[:, None]  # right padding
        causal = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()
        for l, layer in enumerate(inner.layers):
            run = runs[:, :, l]
            if not run.any():
                continue
            w = int(run.any(0).nonzero().max()) + 1  # columns that run layer l form a prefix: compute only those
            mask = (causal[:w, :w] & valid[:, None, :w])[:, None]
            out = layer(h[:, :w], attention_mask=mask, position_ids=positions[:, :w],
                        position_embeddings=(cos[:, :w], sin[:, :w]))
            h = torch.cat([torch.where(run[:, :w, None], out, h[:, :w]), h[:, w:]], dim=1)
        return inner.norm(h)

    def logits(self, input_ids, lengths, runs, labels):
        """Next-token logits at the target positions only (labels >= 0), in float32."""
        h = self.hidden(input_ids, lengths, runs)
        return self.lm_head(h[labels >= 0]).float()

    def forward(self, input_ids, lengths, runs, labels, teacher_logits=None, distill: float = 0.0,
                repeats: bool = False):
        """Cross-entropy on the labels (mixed with the teacher's KL); with `repeats`, the labels are the
        student's own answers and the loss is sequence-level unlikelihood."""
        log_probs = F.log_softmax(self.logits(input_ids, lengths, runs, labels), -1)
        if repeats:
            return sequence_unlikelihood_loss(log_probs, labels)
        return reference_loss(log_probs, labels, teacher_logits, distill)
