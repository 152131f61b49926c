"""General chat prompts: the prompt pool, its held-out validation slice, full-depth answers as references,
and `skipdecode eval --prompts` (the training targets made of the same answers: skipdecode/training/targets.py).

No human answers are needed. The reference for a prompt is the full-depth base model's own greedy answer,
which is also what a skip-aware adapter for general prompts is trained to reproduce (self-distillation).

- Prompts are read by path: JSON lines with a `prompt` field (self-instruct's `instruction` + first
  input also works), or plain text, one prompt a line. The pool is
  `../shared/data/prompts/permissive_chat_prompts.jsonl` beside the repository ($SKIPDECODE_PROMPTS_DIR
  moves it); it is never copied into the repository.
- Held out, whatever file a prompt comes from: every prompt whose hash (the first 12 hex digits of the
  MD5 of the lower-cased prompt, the pool's own `hash` field) is divisible by 20, 5% of any set and
  about 300 of the pool's 5,999. Training never sees them. The validation set `eval --prompts validation`
  scores is the first VALIDATION_COUNT of the pool's held-out prompts in hash order whose chat-templated
  length is at most MAX_PROMPT_TOKENS tokens.
- `eval --prompts` rows, one per speedup: ROUGE-L and BLEU against the full answer, the median over
  prompts of perplexity(answer) / perplexity(full answer) under the full-depth base model, agreement
  (the share of the full answer's tokens reproduced at the same position), agreement_tf (the share of an
  answer's tokens that full depth would have chosen itself from the same prefix, teacher-forced),
  repetition (the share of an
  answer's word 3-grams that already occurred earlier in it, mean over answers), layers per token and
  decode speedup against the full-depth run. The 1x row of the base model is the full answer itself (the
  repetition level to compare with).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

PROMPTS_ENV = "SKIPDECODE_PROMPTS_DIR"
POOL_FILE = "permissive_chat_prompts.jsonl"
VALIDATION = "validation"  # `eval --prompts validation`: the project's held-out slice of the pool
HELD_OUT_EVERY = 20  # a prompt is held out when its hash is divisible by this: 5%
HELD_OUT_RULE = f"md5(lower-cased prompt)[:12] % {HELD_OUT_EVERY} == 0"  # recorded with every general adapter
VALIDATION_COUNT = 64
MAX_PROMPT_TOKENS = 128  # chat-templated (the template adds ~30 tokens); 84% of the pool fits
EVAL_TOKENS = 96
EVAL_SPEEDUPS = "1,2,3,5"
GENERAL_SPREAD = 1.0  # the base model without an adapter runs a constant budget here, the general default


# ---- prompts ----------------------------------------------------------------------------------
def prompts_dir() -> Path:
    if os.environ.get(PROMPTS_ENV):
        return Path(os.environ[PROMPTS_ENV])
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "prompts"


def pool_file() -> Path:
    path = prompts_dir() / POOL_FILE
    if not path.exists():
        raise FileNotFoundError(f"prompt pool not found: {path}. Set {PROMPTS_ENV} to the folder holding {POOL_FILE}")
    return path


def read_prompts(path: str | os.PathLike) -> list[str]:
    """The prompts of a file, in order: JSON lines (a `prompt` field, or self-instruct's `instruction`
    followed by its first instance's input) when the first line is a JSON object, else one a line."""
    lines = [(n, line.strip()) for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1)]
    lines = [(n, line) for n, line in lines if line]
    if not lines:
        raise ValueError(f"{path}: no prompts")
    if not lines[0][1].startswith("{"):
        return [line for _, line in lines]
    prompts = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{n}: not a JSON line ({error.msg})") from None
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if prompt is None and isinstance(row, dict) and row.get("instruction"):
            extra = (row.get("instances") or [{}])[0].get("input", "")
            prompt = row["instruction"] + ("\n\n" + extra if extra else "")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{path}:{n}: a JSON line needs a non-empty `prompt` field")
        prompts.append(prompt.strip())
    return prompts


def prompt_hash(prompt: str) -> str:
    """The pool's `hash`: the first 12 hex digits of the MD5 of the lower-cased prompt."""
    return hashlib.md5(prompt.lower().encode("utf-8")).hexdigest()[:12]


def held_out(prompt: str) -> bool:
    return int(prompt_hash(prompt), 16) % HELD_OUT_EVERY == 0


def by_hash(prompts, keep) -> list[str]:
    """Distinct prompts (by hash) for which keep(prompt) holds, in hash order: a fixed pseudo-random order
    that does not depend on the file's, so the first N of a set are a sample and a larger N extends it."""
    unique = {prompt_hash(p): p for p in reversed(prompts)}  # the first of equal prompts stays
    return [p for _, p in sorted(unique.items()) if keep(p)]


def fits(tokenizer, prompt: str, max_prompt_tokens: int) -> bool:
    from ..prompts import encode_prompt

    return len(encode_prompt(tokenizer, prompt)) <= max_prompt_tokens


def validation_prompts(tokenizer, count: int | None = VALIDATION_COUNT, path=None) -> list[str]:
    """The project's validation set: the held-out prompts of the pool (or `path`) in hash order whose
    chat-templated length is at most MAX_PROMPT_TOKENS, the first `count` of them (None: all)."""
    chosen = by_hash(read_prompts(path or pool_file()), held_out)
    short = (p for p in chosen if fits(tokenizer, p, MAX_PROMPT_TOKENS))
    return list(islice(short, count))


# ---- answers ----------------------------------------------------------------------------------
@dataclass
class Answers:
    """Greedy answers to a list of prompts, in order, with what decoding them cost."""

    texts: list[str]
    token_ids: list[list[int]]
    ms_per_token: float = 0.0
    avg_layers: float = 0.0
    tokens: int = 0


class _Keeping:
    """An engine that keeps the token ids of every answer it generates, by prompt (runs.decode, which
    batches and times the work, returns texts only)."""

    def __init__(self, engine):
        self._engine, self.ids = engine, {}

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, prompts, *args, **kwargs):
        result = self._engine.generate(prompts, *args, **kwargs)
        self.ids.update(zip(map(_key, prompts), result.token_ids))
        return result


def _key(prompt):
    return prompt if isinstance(prompt, str) else tuple(prompt)


def answer(engine, prompts: list, schedule=None, max_new_tokens: int = EVAL_TOKENS, batch_size: int = 16,
           progress=None) -> Answers:
    """Greedy answers under `schedule` (default: full depth), batched by prompt length as E2E MRs are."""
    from ..schedule import Schedule
    from .runs import decode

    keeping = _Keeping(engine)
    schedule = schedule or Schedule.full(engine.num_layers)
    texts, ms, layers, tokens = decode(keeping, [SimpleNamespace(prompt=p) for p in prompts], schedule,
                                       batch_size, max_new_tokens, progress)
    return Answers(texts, [keeping.ids[_key(p)] for p in prompts], ms, layers, tokens)


# ---- scores -----------------------------------------------------------------------------------
WORD = re.compile(r"\w+")


def repetition(text: str) -> float:
    """The share of the text's word 3-grams (lower case) that already occurred earlier in it: 0 for an
    answer that never repeats itself, towards 1 for one that loops."""
    words = WORD.findall(text.lower())
    grams = list(zip(words, words[1:], words[2:]))
    seen, repeated = set(), 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    return repeated / len(grams) if grams else 0.0


def agreement(token_ids, full_ids) -> float:
    """The share of the full answer's tokens that the answer holds at the same position."""
    full_ids = list(full_ids)
    return sum(a == b for a, b in zip(token_ids, full_ids)) / len(full_ids) if full_ids else 1.0


def agreement_tf(decoder, prompt_ids: list[list[int]], answers: list[list[int]]) -> float:
    """% of an answer's tokens that full depth (`decoder`, the base model's) would have chosen itself given
    the same prefix, mean over the non-empty answers: where the answer's own prefix is kept, unlike
    `agreement`, which an answer loses for good at its first different token."""
    from ..lens import divergence

    shares = [divergence(decoder, prompt, ids).agreement for prompt, ids in zip(prompt_ids, answers) if ids]
    return 100.0 * sum(shares) / len(shares) if shares else 100.0


def score(model, prompt_ids: list[list[int]], full: Answers, rows: list[Answers]) -> list[dict[str, float]]:
    """Each row's answers against the full answers (all in percent but ppl_ratio): rouge_l_vs_full (mean),
    bleu_vs_full (corpus), ppl_ratio (median over prompts of perplexity(answer) / perplexity(full answer),
    both under `model`, the full-depth base model), agreement and repetition (means)."""
    import sacrebleu

    from .quality import perplexities, rouge_l

    ratios = [[] for _ in rows]
    for i, prompt in enumerate(prompt_ids):
        values = perplexities(model, prompt, [full.token_ids[i]] + [row.token_ids[i] for row in rows])
        for r, value in enumerate(values[1:]):
            ratios[r].append(value / values[0])

    def mean(values):
        return sum(values) / len(values)

    out = []
    for row, ratio in zip(rows, ratios):
        pairs = list(zip(row.texts, full.texts))
        out.append({
            "rouge_l_vs_full": mean([100.0 if a == b else rouge_l(a, b) for a, b in pairs]),
            "bleu_vs_full": sacrebleu.corpus_bleu(row.texts, [full.texts]).score,
            "ppl_ratio": statistics.median(ratio),
            "agreement": 100.0 * mean([agreement(a, b) for a, b in zip(row.token_ids, full.token_ids)]),
            "repetition": 100.0 * mean([repetition(text) for text in row.texts]),
        })
    return out


# ---- eval --prompts ---------------------------------------------------------------------------
@dataclass
class GeneralRow:
    speedup: float
    adapter: str  # "none": the base model
    rouge_l_vs_full: float
    bleu_vs_full: float
    ppl_ratio: float  # median over prompts; 1 = as plausible to the full model as its own answer
    agreement: float  # % of the full answer's tokens at the same position
    agreement_tf: float  # % of the answer's tokens full depth would choose from the same prefix, mean over answers
    repetition: float  # % of word 3-grams seen earlier in the same answer, mean over answers
    avg_layers: float
    decode_speedup: float  # ms/token of the full-depth base model / this row's, same run
    ms_per_token: float
    prompts: int
    tokens: int


@dataclass
class Plan:
    speedup: float
    adapter: object = field(default=None)  # AdapterInfo or None

    @property
    def name(self) -> str:
        return self.adapter.name if self.adapter is not None else "none"

    @property
    def label(self) -> str:
        return f"{self.speedup:g}x {self.name}"


def plan_rows(speedups, adapter: str | None = None, model: str | None = None) -> list[Plan]:
    """One row per speedup (1x always): the --adapter given ("none": the base model), else the adapter
    `pick_adapter` gives a general prompt (the base model at 1x, and where no general adapter exists)."""
    from ..adapters.lora import NONE, find_adapter, pick_adapter
    from ..adapters.router import GENERAL

    forced = None if adapter is None or adapter.lower() in NONE else find_adapter(adapter)
    return [Plan(s, forced if adapter is not None else pick_adapter(s, model, task=GENERAL)[0])
            for s in sorted(set(speedups) | {1.0})]


def check_held_out(plan: list[Plan]) -> None:
    """Validation scores mean something only for adapters that held out the validation prompts: every
    general adapter (made by `skipdecode train --task general`) records the rule it held out by."""
    for row in plan:
        info = row.adapter
        if info is not None and info.task != "e2e" and info.meta.get("held_out") != HELD_OUT_RULE:
            raise ValueError(f"adapter {info.name} does not record holding out the validation prompts "
                             f"({HELD_OUT_RULE}); score it on another --prompts file")


def schedule_for(info, speedup: float, num_layers: int, horizon: int):
    """An adapter decodes on the schedule it was trained with; the base model at a speedup on a constant
    budget (GENERAL_SPREAD), the general adapters' default, so that rows compare at equal layers/token."""
    from ..adapters.lora import trained_schedule
    from ..schedule import DEFAULT_WARMUP, Schedule, for_speedup

    if info is not None:
        return trained_schedule(info, speedup, num_layers, horizon)
    if speedup == 1:
        return Schedule.full(num_layers)
    return for_speedup(speedup, num_layers, horizon, DEFAULT_WARMUP, spread=GENERAL_SPREAD)


def evaluate_prompts(reference, prompts: list[str], plan: list[Plan], engine_for=None,
                     max_new_tokens: int = EVAL_TOKENS, batch_size: int = 16, horizon: int | None = None):
    """(rows, outputs): the plan's rows scored against `reference` (the base model's engine) at full
    depth, and per prompt {prompt, full, <row label>: answer}. `engine_for(info)` loads an adapter's
    engine (default: merged into the reference's model by name); each is loaded once, freed after."""
    from tqdm.auto import tqdm

    from ..engine import Engine

    engine_for = engine_for or (lambda info: Engine.load(reference.base_name, adapter=info))
    bar = tqdm(total=(len(plan) + 1) * len(prompts), desc="eval --prompts", unit="prompt")
    reference.generate(prompts[:batch_size], max_new_tokens=4)  # warm-up, untimed
    full = answer(reference, prompts, None, max_new_tokens, batch_size, bar)
    results: dict[int, Answers] = {}
    for name in dict.fromkeys(row.name for row in plan):
        rows = [i for i, row in enumerate(plan) if row.name == name]
        info = plan[rows[0]].adapter
        engine = reference if info is None else engine_for(info)
        if engine is not reference:
            engine.generate(prompts[:batch_size], max_new_tokens=4)
        for i in rows:
            if info is None and plan[i].speedup == 1:  # the base model at full depth: the reference itself
                results[i] = full
                bar.update(len(prompts))
                continue
            schedule = schedule_for(info, plan[i].speedup, engine.num_layers, horizon or max_new_tokens)
            bar.set_postfix_str(plan[i].label)
            results[i] = answer(engine, prompts, schedule, max_new_tokens, batch_size, bar)
        del engine
    bar.close()
    done = [results[i] for i in range(len(plan))]
    prompt_ids = [reference.encode(p) for p in prompts]
    scores = score(reference.model, prompt_ids, full, done)
    for s, a in zip(scores, done):
        s["agreement_tf"] = agreement_tf(reference.decoder, prompt_ids, a.token_ids)
    rows = [GeneralRow(row.speedup, row.name, **s, avg_layers=a.avg_layers,
                       decode_speedup=full.ms_per_token / a.ms_per_token if a.ms_per_token else 0.0,
                       ms_per_token=a.ms_per_token, prompts=len(prompts), tokens=a.tokens)
            for row, a, s in zip(plan, done, scores)]
    outputs = [{"prompt": p, "full": full.texts[k], **{row.label: a.texts[k] for row, a in zip(plan, done)}}
               for k, p in enumerate(prompts)]
    return rows, outputs


def results_place(prompts: str, out=None, limit: int | None = None, adapter: str | None = None,
                  max_new_tokens: int = EVAL_TOKENS) -> tuple[Path, Path]:
    """(results prefix, answers file): --out DIR: DIR/general.csv, .json and DIR/outputs.jsonl; the
    project's validation set, every prompt: assets/results/general[-<adapter>][-<N>tokens].csv, .json and
    -outputs.jsonl, which the README and app quote; any other run: a fresh temporary folder."""
    from . import runs

    if out:
        return Path(out) / "general", Path(out) / "outputs.jsonl"
    if prompts == VALIDATION and limit is None:
        name = "general" + (f"-{Path(adapter).name}" if adapter else "")
        name += "" if max_new_tokens == EVAL_TOKENS else f"-{max_new_tokens}tokens"
        return runs.RESULTS_DIR / name, runs.RESULTS_DIR / f"{name}-outputs.jsonl"
    folder = Path(tempfile.mkdtemp(prefix=f"{runs.TEMP_PREFIX}general-"))
    return folder / "general", folder / "outputs.jsonl"


def markdown(rows: list[GeneralRow]) -> str:
    lines = ["| speedup | adapter | ROUGE-L vs full | BLEU vs full | ppl ratio | agreement % |"
             " agreement, same prefix % | repetition % | layers/token | decode speedup |", "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r.speedup:g}x | {r.adapter} | {r.rouge_l_vs_full:.1f} | {r.bleu_vs_full:.1f} | "
                     f"{r.ppl_ratio:.2f} | {r.agreement:.1f} | {r.agreement_tf:.1f} | {r.repetition:.1f} | "
                     f"{r.avg_layers:.1f} | "
                     f"{r.decode_speedup:.2f}x |")
    return "\n".join(lines)


E2E_ONLY = ("data", "made_up_names", "compare_adapters", "untrained_skip")


def cmd_eval(args) -> int:
    """`skipdecode eval --prompts FILE|validation`."""
    from ..engine import Engine
    from ..adapters.router import is_e2e
    from .runs import drop_empty_temp, write

    given = [f"--{name.replace('_', '-')}" for name in E2E_ONLY if getattr(args, name, None)]
    given += ["--split"] if getattr(args, "split", "test") != "test" else []
    if given:
        raise ValueError(f"--prompts scores general prompts against full-depth answers; {', '.join(given)} "
                         f"belong to the E2E evaluation")
    speedups = [float(s) for s in (args.speedups or EVAL_SPEEDUPS).split(",")]
    max_new_tokens = args.max_new_tokens or EVAL_TOKENS
    started = time.time()
    reference = Engine.load(args.model)
    if args.prompts == VALIDATION:
        prompts = validation_prompts(reference.tokenizer)[: args.limit]
    else:
        prompts = read_prompts(args.prompts)[: args.limit]
    plan = plan_rows(speedups, args.adapter, args.model)
    if args.prompts == VALIDATION:
        check_held_out(plan)
    mrs = sum(map(is_e2e, prompts))
    if mrs:
        print(f"note: the router calls {mrs} of these prompts E2E meaning representations; every row here "
              f"scores them as general prompts", file=sys.stderr)
    prefix, answers_file = results_place(args.prompts, args.out, args.limit, args.adapter, max_new_tokens)
    try:
        rows, outputs = evaluate_prompts(reference, prompts, plan, None, max_new_tokens, args.batch_size,
                                         args.horizon)
        write(rows, prefix)
        answers_file.parent.mkdir(parents=True, exist_ok=True)
        answers_file.write_text("".join(json.dumps(o) + "\n" for o in outputs), encoding="utf-8")
    finally:
        drop_empty_temp(prefix.parent)
    footer = (f"{len(prompts)} prompts, {max_new_tokens} new tokens, greedy, against the full-depth base model's "
              f"answers; {time.time() - started:.0f} s; results written to {prefix}.csv, .json and {answers_file}")
    if args.json:  # stdout stays one JSON array; the footer goes to stderr
        print(json.dumps([asdict(r) for r in rows]))
    print(footer if args.json else markdown(rows) + "\n\n" + footer, file=sys.stderr if args.json else sys.stdout)
    return 0
