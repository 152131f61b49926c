"""Beam search over SkipDecode's batches: K beams per prompt, each a row of the batch.

Every beam of every prompt is at the same sequence position, so a beam search is one more batch for
SkipDecode: each position's budget is shared by all beams, and reordering the beams after a step copies
rows of the KV cache that hold the same layers (the schedule decides the layers by position alone). A
per-token early-exit method has no such luck: beams that exited at different layers hold different cache
layers. The E2E challenge's systems and the LoRA paper's E2E figures decode with beam search.

The search is transformers' (`generate(num_beams=K)`, its default `early_stopping=False`), so that the
engine's beams are token for token the reference's at full depth (tests/test_beam.py): at every step
the 2K best continuations over all of a prompt's beams (scores: summed log-probabilities); those ending
in EOS among the top K become finished hypotheses, scored sum / length ** length_penalty (length counts
the generated tokens, EOS included); the K best others run on. A prompt is done once K hypotheses are
finished and its best running beam, scored at its current length, cannot beat the worst of them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

NEG = -1.0e9  # transformers' stand-in for an impossible score


@dataclass(frozen=True)
class Beam:
    """Beam search settings: `width` beams per prompt; `length_penalty` > 0 favours longer outputs."""

    width: int = 4
    length_penalty: float = 1.0

    def __post_init__(self):
        if isinstance(self.width, bool) or not isinstance(self.width, numbers.Integral) or not 1 <= self.width <= 64:
            raise ValueError(f"beam width must be an integer in [1, 64]; got {self.width!r}")
        lp = self.length_penalty
        if isinstance(lp, bool) or not isinstance(lp, numbers.Real) or not -10.0 <= lp <= 10.0:
            raise ValueError(f"length_penalty must be a number in [-10, 10]; got {lp!r}")


class BeamSearch:
    """The state of one beam search over `prompts` prompts; batch row p * K + k is beam k of prompt p."""

    def __init__(self, beam: Beam, prompts: int, eos_ids, max_new_tokens: int, device):
        self.K, self.lp, self.max_new_tokens = beam.width, float(beam.length_penalty), max_new_tokens
        K, B = self.K, prompts
        self.keep = max(2, 1 + len(eos_ids)) * K  # candidates per prompt, so that K can always run on
        self.eos = torch.tensor(list(eos_ids), dtype=torch.long, device=device)
        self.running_scores = torch.full((B, K), NEG, device=device)
        self.running_scores[:, 0] = 0.0  # the K copies of a prompt are one beam until the first choice
        self.running: list[list[list[int]]] = [[[] for _ in range(K)] for _ in range(B)]
        self.finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]  # (score, ids), best first
        self.open = [True] * B  # the heuristic above: can this prompt still improve its finished hypotheses?
        self.length = 0  # tokens generated so far by every running beam

    def step(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B*K, V] for the running beams -> (next token of each new beam [B*K], the row it continues
        [B*K]): the caller moves its cache rows by the second before the next position."""
        B, K = len(self.running), self.K
        log_probs = torch.log_softmax(logits.float(), dim=-1).view(B, K, -1) + self.running_scores[:, :, None]
        vocab = log_probs.shape[-1]
        top_scores, top_index = torch.topk(log_probs.view(B, -1), self.keep)
        top_beam, top_token = top_index // vocab, top_index % vocab
        ends = torch.isin(top_token, self.eos) | (self.length + 1 >= self.max_new_tokens)
        length = self.length + 1
        scores, beams, tokens, ended = top_scores.tolist(), top_beam.tolist(), top_token.tolist(), ends.tolist()

        origin, next_token, running, running_scores = [], [], [], []
        for p in range(B):
            if self.open[p]:  # only the top K candidates may finish (the others are spares for running on)
                for rank in range(K):
                    if ended[p][rank]:
                        self._finish(p, scores[p][rank] / length ** self.lp,
                                     self.running[p][beams[p][rank]] + [tokens[p][rank]])
            alive = [r for r in range(self.keep) if not ended[p][r]][:K]
            alive += [r for r in range(self.keep) if ended[p][r]][: K - len(alive)]  # only at the length limit
            running.append([self.running[p][beams[p][rank]] + [tokens[p][rank]] for rank in alive])
            running_scores.append([scores[p][rank] + (NEG if ended[p][rank] else 0.0) for rank in alive])
            origin += [p * K + beams[p][rank] for rank in alive]
            next_token += [tokens[p][rank] for rank in alive]
        device = logits.device
        self.running, self.length = running, length
        self.running_scores = torch.tensor(running_scores, device=device)  # float32, as transformers keeps them
        for p, best in enumerate(self.running_scores[:, 0].tolist()):
            if self.open[p] and len(self.finished[p]) == K:  # can its best running beam still beat the worst?
                self.open[p] = best / length ** self.lp > self.finished[p][-1][0]
        return torch.tensor(next_token, device=device), torch.tensor(origin, device=device)

    def _finish(self, p: int, score: float, ids: list[int]) -> None:
        hypotheses = self.finished[p]
        if len(hypotheses) == self.K and score <= hypotheses[-1][0]:
            return
        hypotheses.append((score, ids))
        hypotheses.sort(key=lambda h: -h[0])  # stable: an earlier hypothesis wins a tie, as in transformers
        del hypotheses[self.K:]

    @property
    def done(self) -> bool:
        return not any(self.open) or self.length >= self.max_new_tokens

    def best(self, p: int) -> list[int]:
        """Prompt p's output so far: its best finished hypothesis, else its best running beam."""
        return self.finished[p][0][1] if self.finished[p] else self.running[p][0]


def beam_search(forward, gen, search: BeamSearch):
    """The beam-search strategy over a generation's forward passes (engine.Forward): each prompt's output
    is its best beam so far; beams are reordered after each step, never dropped."""

    def choose(logits):
        token, origin = search.step(logits)
        forward.reorder(origin)
        return token

    token = forward.prefill(choose)
    for step in range(search.max_new_tokens):
        gen.token_ids = [search.best(p) for p in range(len(gen.prompts))]
        gen.finished = [not still for still in search.open]
        forward.trace.generated_tokens += len(forward.encoded)
        if search.done:
            break
        yield gen
        token = forward.column(step, token, choose)
    forward.finish()
    gen.done = True
    yield gen
