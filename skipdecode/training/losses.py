"""The training losses, on the log-probabilities of the target positions: cross-entropy on the reference,
mixed with the KL from a full-depth teacher (self-distillation), and sequence-level unlikelihood on the
student's own answers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .targets import REPEAT_NGRAM, repeated_ngrams


def reference_loss(log_probs, labels, teacher_logits=None, distill: float = 0.0):
    """Cross-entropy on the labels; with a teacher, (1 - distill) x it + distill x the KL from the teacher's
    whole next-token distribution, which says more per token than one reference does."""
    loss = F.nll_loss(log_probs, labels[labels >= 0])
    if teacher_logits is not None and distill:
        kl = F.kl_div(log_probs, F.log_softmax(teacher_logits.float(), -1), log_target=True, reduction="batchmean")
        loss = (1 - distill) * loss + distill * kl
    return loss


def _answers(log_probs, labels):
    """(log-probabilities, target ids) of each row's target positions; `log_probs` holds them row after row."""
    start = 0
    for row in labels:
        target = row[row >= 0]
        yield log_probs[start:start + len(target)], target
        start += len(target)


def _unlikely(log_p):
    """-log(1 - p) for probabilities given as logs, kept finite where p rounds to 1."""
    return -torch.log1p(-log_p.exp().clamp(max=1 - 1e-6))


def sequence_unlikelihood_loss(log_probs, labels, n: int = REPEAT_NGRAM):
    """Sequence-level unlikelihood (Welleck et al., 2020) on the student's own answers (the labels):
    -log(1 - p(token)) at every token of a repeated n-gram, the mean over all answer tokens. Why: the full
    model's answers seldom loop; the student's own do, and this makes each token of their loops less likely,
    which no teacher's KL does (the full model finds a loop predictable)."""
    total = log_probs.new_zeros(())
    for answer, target in _answers(log_probs, labels):
        repeated = torch.tensor(repeated_ngrams(target.tolist(), n), device=log_probs.device)
        total = total + (_unlikely(answer.gather(1, target[:, None]).squeeze(1)) * repeated).sum()
    return total / len(log_probs)
