"""What a generation did, position by position: the record the app plots and the benchmarks count."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class StepRecord:
    """One generated position, shared by every row of the batch."""

    step: int
    budget: int
    layers: tuple[int, ...]
    skipped: tuple[int, ...]
    ms: float
    rows: int  # rows still generating (finished rows are compacted away), or sharing a continuous batch's step
    tick: int | None = None  # which step of a continuous batch this was (skipdecode/slots.py); None elsewhere

    def to_dict(self) -> dict:
        out = {"step": self.step, "budget": self.budget, "layers": list(self.layers),
               "skipped": list(self.skipped), "ms": round(self.ms, 4), "rows": self.rows}
        return out if self.tick is None else {**out, "tick": self.tick}


@dataclass
class Trace:
    num_layers: int
    batch_size: int
    prompt_tokens: int  # columns of the left-padded prompt batch; prefill runs every layer on them
    schedule: dict
    prefill_ms: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    generated_tokens: int = 0  # over all rows, EOS included
    cache_lengths: list[int] = field(default_factory=list)  # columns each layer holds at the end
    prefix_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache (skipdecode/prefix.py)

    @property
    def decode_ms(self) -> float:
        return sum(s.ms for s in self.steps)

    @property
    def total_ms(self) -> float:
        return self.prefill_ms + self.decode_ms

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 * self.generated_tokens / self.total_ms if self.total_ms else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        decoded = sum(s.rows for s in self.steps)
        return 1000.0 * decoded / self.decode_ms if self.decode_ms else 0.0

    @property
    def average_layers(self) -> float:
        """Layers run per generated position (the prefill excluded)."""
        return sum(s.budget for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def layer_calls(self) -> int:
        """Block invocations, prefill included (one per layer for the whole prompt)."""
        return self.num_layers + sum(s.budget for s in self.steps)

    def to_dict(self) -> dict:
        return {
            "num_layers": self.num_layers, "batch_size": self.batch_size, "prompt_tokens": self.prompt_tokens,
            "schedule": self.schedule, "prefill_ms": round(self.prefill_ms, 4), "prefix_tokens": self.prefix_tokens,
            "decode_ms": round(self.decode_ms, 4), "total_ms": round(self.total_ms, 4),
            "generated_tokens": self.generated_tokens, "tokens_per_s": round(self.tokens_per_s, 3),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            "average_layers": round(self.average_layers, 4), "cache_lengths": self.cache_lengths,
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_frame(self):
        """One row per generated position: step, budget, layers, skipped, ms, rows, cumulative_ms."""
        import pandas as pd

        frame = pd.DataFrame([s.to_dict() for s in self.steps],
                             columns=["step", "budget", "layers", "skipped", "ms", "rows"])
        frame["cumulative_ms"] = self.prefill_ms + frame["ms"].cumsum()
        return frame
