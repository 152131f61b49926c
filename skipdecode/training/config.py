"""What a `skipdecode train` run is: its settings, their defaults by task, the checks that refuse bad ones
before anything loads, and the schedules a run samples from."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..evaluation.data import SPLIT_SEED, VALIDATION_SHARE
from ..schedule import DEFAULT_WARMUP, E2E_HORIZON, SPREAD, Schedule, for_speedup


@dataclass
class TrainConfig:
    out: str
    speedups: list[float] = field(default_factory=lambda: [1.0])
    model: str | None = None
    data: str | None = None  # E2E: the split's CSV or the E2E folder; general: a prompts file (default: the pool)
    task: str = "e2e"  # or "general": chat prompts, targets = the full-depth base model's answers
    split: str = "train"  # E2E: the official training split; "dev": the devset-era recipe (devset minus its held-out MRs)
    warmup_layers: int = DEFAULT_WARMUP
    horizon: int | None = None  # default: E2E_HORIZON; general: max_answer_tokens
    decay: str = "linear"
    mode: str = "skip"
    spread: float | None = None  # max budget / average budget (1 = a constant budget); default SPREAD, general 1
    init: str | None = None  # adapter (name or path) to start from; its rank and alpha are kept
    teacher: str | None = None  # adapter of the full-depth teacher ("none": the base model)
    distill: float = 0.0  # weight of the KL to the teacher; 1 - distill stays on the reference
    renamed: float = 0.0  # share of training examples given a made-up name and landmark (validation: all)
    renamed_words: float = 0.0  # share of those names made of words ("Plum and Rook"), not syllables
    sequence_kd: float = 0.0  # share of references replaced by the teacher's greedy output (1: all)
    sequence_unlikelihood: float = 0.0  # share of batches: the student's greedy answers, unlikelihood on their repeats
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.05
    lr: float = 5e-4
    batch_size: int = 8
    grad_accum: int = 1
    steps: int = 300
    warmup_ratio: float = 0.05
    validation_share: float = VALIDATION_SHARE
    validation_examples: int = 64
    eval_every: int = 50
    checkpoint_every: int = 50
    snapshot_every: int = 0  # also write the adapter as it stands every N steps (to validate each MR-epoch)
    checkpoint_dir: str = "checkpoints"
    precision: str = "auto"
    seed: int = SPLIT_SEED
    resume: bool = False
    limit: int | None = None  # train on the first N examples only (general: N prompts)
    max_answer_tokens: int = 160  # general: length of the full-depth answers trained on
    max_prompt_tokens: int = 128  # general: longer chat-templated prompts are left out
    cut_loops: int = 0  # general: cut each training target before its first repeated N-token run (0: off)

    def __post_init__(self):
        """Defaults that depend on the task: chat answers are 100-200 tokens, not E2E's 32, and the
        general recipe decodes on a constant budget; the KL teacher of general prompts is the base model."""
        if self.task not in ("e2e", "general"):
            raise ValueError(f"--task must be e2e or general; got {self.task!r}")
        if self.split not in ("train", "dev"):
            raise ValueError(f"--split must be train or dev; got {self.split!r}")
        general = self.task == "general"
        if self.horizon is None:
            self.horizon = self.max_answer_tokens if general else E2E_HORIZON
        if self.spread is None:
            self.spread = 1.0 if general else SPREAD
        if general and self.distill and self.teacher is None:
            self.teacher = "none"  # the full-depth base model, whose answers are the targets

    def check(self) -> None:
        """Refuse settings that contradict each other, before a run loads anything."""
        if not 0 <= self.distill <= 1:
            raise ValueError(f"--distill is a weight, in [0, 1]; got {self.distill}")
        if (self.distill > 0) != (self.teacher is not None):
            raise ValueError("--distill needs --teacher; --teacher needs --distill")
        if self.sequence_kd and not self.teacher:
            raise ValueError("--sequence-kd trains on the teacher's outputs: it needs --teacher")
        if not 0 <= self.sequence_kd <= 1:
            raise ValueError(f"--sequence-kd is a share of the references, in [0, 1]; got {self.sequence_kd}")
        if not 0 <= self.sequence_unlikelihood <= 1:
            raise ValueError(f"--sequence-unlikelihood is a share of the batches, in [0, 1]; got "
                             f"{self.sequence_unlikelihood}")
        if not 0 <= self.renamed <= 1:
            raise ValueError(f"--renamed is a share of the training examples, in [0, 1]; got {self.renamed}")
        if not 0 <= self.renamed_words <= 1 or (self.renamed_words and not self.renamed):
            raise ValueError(f"--renamed-words is a share of the --renamed examples, in [0, 1], with --renamed; got "
                             f"{self.renamed_words}")
        if self.task == "general" and (self.sequence_kd or self.renamed):
            raise ValueError("--sequence-kd and --renamed are E2E options: general prompts are trained on the "
                             "full-depth base model's answers already")
        if self.cut_loops and (self.task != "general" or self.cut_loops < 2):
            raise ValueError(f"--cut-loops N is a general-task option, N >= 2 tokens; got {self.cut_loops}")


def schedules_for(speedups, num_layers, config: TrainConfig) -> list[Schedule]:
    return [Schedule.full(num_layers) if s == 1 else
            for_speedup(s, num_layers, config.horizon, config.warmup_layers, config.decay, config.mode, config.spread)
            for s in speedups]
