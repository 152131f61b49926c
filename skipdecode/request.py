"""One request, checked once where it enters the library, into one frozen object.

`check` is the only place that validates what a caller asks for (prompt, schedule, token limit, sampling,
beam search) and the only place that encodes a prompt. Whatever is below it (Engine.run, the batcher's
batches, the continuous batch's rows, verified decoding) takes a `Request` as given: nothing there checks
or encodes it again. Product limits (the app's longest prompt, its most new tokens) are the caller's, passed
in as `max_prompt_tokens`, so a refusal says the app's limit once, in one sentence.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

from .beam import Beam
from .sampling import Sampling
from .schedule import Schedule


@dataclass(frozen=True)
class Request:
    """What one prompt asks for, checked (`check` makes it): token ids, the column policy that decodes it
    (a Schedule, or an object like engine.Scheduled), the token limit, sampling and the beam search."""

    prompt_ids: tuple[int, ...]
    schedule: object
    max_new_tokens: int
    sampling: Sampling = Sampling()
    stop_at_eos: bool = True
    beam: Beam | None = None  # a search of width > 1; None: one token at a time

    @property
    def rows(self) -> int:
        """The batch rows it takes: one per beam."""
        return self.beam.width if self.beam else 1

    @property
    def columns(self) -> int:
        """The cache columns it needs: the prompt and every new token."""
        return len(self.prompt_ids) + self.max_new_tokens

    def at_full_depth(self) -> "Request":
        """The same request decoded at full depth: the other side of a comparison."""
        return replace(self, schedule=Schedule.full(self.schedule.num_layers))

    def settings(self) -> tuple:
        """What requests must share to run as one batch of one position (everything but the prompt)."""
        return self.schedule, self.max_new_tokens, self.sampling, self.stop_at_eos, self.beam


def check(engine, prompt, schedule=None, max_new_tokens: int = 64, sampling: Sampling = Sampling(),
          stop_at_eos: bool = True, chat: bool | None = None, beam: Beam | None = None,
          max_prompt_tokens: int | None = None) -> Request:
    """`prompt` (text, through the chat template where the model has one, or token ids) for `engine`, checked;
    ValueError with one plain sentence otherwise. `schedule` None decodes at full depth."""
    layers = engine.num_layers
    schedule = Schedule.full(layers) if schedule is None else schedule
    if not hasattr(schedule, "to_dict") or getattr(schedule, "num_layers", None) != layers:
        raise ValueError(f"schedule is for {getattr(schedule, 'num_layers', '?')} layers but the model has {layers}")
    n = max_new_tokens
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1; got {n!r}")
    if not isinstance(sampling, Sampling):
        raise ValueError("sampling must be a skipdecode.Sampling")
    if beam is not None and not isinstance(beam, Beam):
        raise ValueError("beam must be a skipdecode.Beam")
    ids = tuple(engine.encode(prompt, chat))
    if not ids:
        raise ValueError("prompt is empty")
    context = engine.decoder.max_positions
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        raise ValueError(f"the prompt is {len(ids):,} tokens long; this app takes at most {max_prompt_tokens:,} "
                         f"prompt tokens (the model's context is {context:,} tokens)")
    if len(ids) + n > context:
        raise ValueError(f"prompt of {len(ids)} tokens + max_new_tokens {n} exceeds the model's context of "
                         f"{context} tokens")
    return Request(ids, schedule, int(n), sampling, bool(stop_at_eos), beam if beam and beam.width > 1 else None)
