"""Skip-aware fine-tuning: LoRA adapters trained with the very layer plan the engine decodes with.

Teacher forcing feeds prompt + reference in one pass. Position p of a row runs layer l exactly when
decoding would run it: prompt positions run every layer (the prefill); the token at prompt_len + s is the
s-th token fed back and runs schedule.layers(s). A position that skips a layer passes its hidden state
through unchanged. Why one pass equals decoding: the budget never grows, so the positions that run a layer
form a prefix of the sequence. A position that runs layer l therefore attends only to earlier positions
that also ran layer l, with the same inputs they had while decoding; the keys computed at positions that
skip l lie after every position that runs l, and the causal mask hides them.

Two aids, both optional: `--init ADAPTER` starts from an adapter already fine-tuned on the task (the 1x
baseline), so that training only has to learn to do without the skipped layers; `--teacher ADAPTER
--distill A` adds self-distillation: the loss is (1 - A) x cross-entropy on the reference + A x KL from the
full-depth model with that adapter, whose whole next-token distribution says more per token than one
reference does (the student copies the full model, which is what a skip decoder should do).
`--sequence-unlikelihood SHARE` (Welleck et al., 2020) against loops: that share of the batches are the
student's own greedy answers at its speedup (skipdecode/training/own_answers.py), and the loss on them pushes
down every token of a 4-gram the answer already said; the other batches keep their loss.

E2E data (`--split`): the official training split (trainset.csv), one reference per MR an epoch, with
the whole devset left to validate and choose on, as the paper and the challenge do; `--snapshot-every N`
writes the adapter every N steps so that each MR-epoch can be scored on the devset (`eval --split dev`).
`--split dev` is the devset-era recipe (the devset MRs not held out), kept to compare with.

`--task general` trains on chat prompts that come without answers (skipdecode/training/targets.py): the targets are
the full-depth base model's own greedy answers (up to --max-answer-tokens), generated in batches once and
cached in --checkpoint-dir; --distill adds the KL to that same model (the default --teacher); the prompts
held out for `eval --prompts validation` are never trained on; the schedule defaults to a constant budget
with the horizon at the answer length.

Runs on one CPU here; `accelerate launch -m skipdecode train ...` runs the same code on several GPUs or
machines (Accelerator places the model, shards the batches and syncs gradients).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..evaluation.data import SPLIT_SEED, VALIDATION_SHARE, Item
from ..prompts import encode_prompt
from ..schedule import DEFAULT_WARMUP, E2E_HORIZON, SPREAD, Schedule, for_speedup
from .own_answers import is_own_batch
from .targets import REPEAT_NGRAM, repeated_ngrams

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


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


# ---- the layer plan ---------------------------------------------------------------------------
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


# ---- data -------------------------------------------------------------------------------------
TEACHER_TOKENS = 64  # the teacher's E2E outputs: one sentence or two; the cache file is named by it


def teacher_items(engine, items: list[Item], share: float = 1.0, seed: int = 0, batch_size: int = 16,
                  max_new_tokens: int = TEACHER_TOKENS, cache: Path | None = None) -> list[Item]:
    """Sequence-level distillation (Kim and Rush, 2016): each reference of an MR replaced, with probability
    `share`, by the full-depth teacher's greedy output for it. Why: the skip adapters' n-gram precision on
    the test set matched the 1x model's; their whole BLEU gap was brevity. Trained on eight differing
    references per MR, a student with a third of the layers settles on the short ones and drops facts; one
    target per MR, the one the full model would write, leaves nothing to hedge between. A share below 1
    keeps some of the human wording too. The MR keeps its number of examples. With `cache`, the teacher's
    outputs are kept in that file (answer_cache): a resumed run, or the next one with this teacher, reads them."""
    from .answer_cache import cached_answers
    from ..evaluation.runs import decode

    by_mr = {it.mr: it for it in items}

    def answer_chunk(mrs, bar):
        return decode(engine, [by_mr[m] for m in mrs], Schedule.full(engine.num_layers), batch_size, max_new_tokens,
                      bar)[0]

    outputs = cached_answers([it.mr for it in items], answer_chunk, cache, "mr", "output", "teacher outputs")
    rng = random.Random(seed)
    return [Item(it.mr, tuple(outputs[it.mr] if outputs[it.mr] and rng.random() < share else ref for ref in it.refs))
            for it in items]


def teacher_cache(folder, teacher: str, max_new_tokens: int = TEACHER_TOKENS) -> Path | None:
    """Where the E2E teacher's outputs are kept: named by a digest of its adapter's weights, so that an
    adapter retrained at the same path never reads the outputs of the one before (none for the base model,
    whose E2E outputs no recipe trains on)."""
    from ..adapters.lora import NONE, find_adapter, weights_digest

    if teacher.lower() in NONE:
        return None
    digest = weights_digest(find_adapter(teacher).path)[:12]
    return Path(folder) / f"teacher-outputs-{digest}-{max_new_tokens}tokens.jsonl"


def e2e_examples(config: TrainConfig, tokenizer, teacher=None):
    """(train groups, validation examples) of E2E; an example is (prompt ids, reference ids + end token).
    A group holds the examples an epoch draws one of. On the training split a group is an MR's references:
    an epoch is one reference per MR (4,862 MRs, 42,061 references), and the whole devset validates. On the
    devset-era split (`--split dev`) every reference is its own group, as before, and the devset MRs not
    held out train."""
    from ..evaluation.data import pairs, training_split

    items, val_items = training_split(config.data, config.split, config.validation_share, config.seed)
    items = items[: config.limit]
    # Validation keeps the human references; a run that learned one sentence per MR scores higher on them.
    if config.sequence_kd:
        from ..engine import Engine
        engine = Engine(teacher.model, tokenizer)
        items = teacher_items(engine, items, config.sequence_kd, config.seed,
                              cache=teacher_cache(config.checkpoint_dir, config.teacher))
    examples = tokenize_pairs(tokenizer, pairs(items, config.renamed, config.seed, config.renamed_words))
    if config.split == "dev":
        groups = [[e] for e in examples[: config.limit]]
    else:  # validation: one reference per MR, spread over the devset's MRs
        refs = iter(examples)
        groups = [group for group in ([next(refs) for _ in item.refs] for item in items) if group]
        every = max(1, len(val_items) // config.validation_examples)
        val_items = [Item(item.mr, item.refs[:1]) for item in val_items[::every]]
    # With renaming on, validation names only made-up restaurants: it measures copying a name never seen.
    val_pairs = pairs(val_items, 1.0 if config.renamed else 0.0, config.seed + 1, config.renamed_words)
    return groups, tokenize_pairs(tokenizer, val_pairs)[: config.validation_examples]


def tokenize_pairs(tokenizer, pairs):
    """(prompt ids, target ids + end token) per (prompt, reference) pair."""
    eos = tokenizer.eos_token_id
    return [(encode_prompt(tokenizer, prompt), tokenizer(ref, add_special_tokens=False)["input_ids"] + [eos])
            for prompt, ref in pairs]


def collate(examples, pad_id: int):
    """Right-padded prompt + target[:-1]; labels hold target[j] at position prompt_len - 1 + j."""
    seqs = [p + t[:-1] for p, t in examples]
    width = max(map(len, seqs))
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for row, ((prompt, target), seq) in enumerate(zip(examples, seqs)):
        input_ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, len(prompt) - 1:len(prompt) - 1 + len(target)] = torch.tensor(target)
    lengths = torch.tensor([len(s) for s in seqs])
    return input_ids, lengths, labels, [len(p) for p, _ in examples], [len(t) - 1 for _, t in examples]


def batches(groups, batch_size: int, seed: int):
    """An endless, reproducible stream of batches: epoch e shuffles the groups with seed + e and takes one
    example of each at random (one reference per MR: an MR-epoch; a group of one: every example)."""
    epoch = 0
    while True:
        rng = random.Random(seed + epoch)
        order = list(range(len(groups)))
        rng.shuffle(order)
        picks = [rng.choice(groups[j]) for j in order]
        for i in range(0, len(picks) - batch_size + 1, batch_size):
            yield picks[i:i + batch_size]
        epoch += 1


def schedules_for(speedups, num_layers, config: TrainConfig) -> list[Schedule]:
    return [Schedule.full(num_layers) if s == 1 else
            for_speedup(s, num_layers, config.horizon, config.warmup_layers, config.decay, config.mode, config.spread)
            for s in speedups]


# ---- the loop ---------------------------------------------------------------------------------
def pick_precision(precision: str) -> str:
    if precision != "auto":
        return {"fp32": "no", "no": "no", "bf16": "bf16"}[precision]
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "no"


def train(config: TrainConfig) -> dict:
    from accelerate import Accelerator
    from peft import LoraConfig, PeftModel, get_peft_model
    from tqdm.auto import tqdm
    from transformers import get_cosine_schedule_with_warmup

    from ..adapters.lora import NONE, adapter_ref, find_adapter, merge_adapter, same_base
    from ..models import load_model

    if not 0 <= config.distill <= 1:
        raise ValueError(f"--distill is a weight, in [0, 1]; got {config.distill}")
    if (config.distill > 0) != (config.teacher is not None):
        raise ValueError("--distill needs --teacher; --teacher needs --distill")
    if config.sequence_kd and not config.teacher:
        raise ValueError("--sequence-kd trains on the teacher's outputs: it needs --teacher")
    if not 0 <= config.sequence_kd <= 1:
        raise ValueError(f"--sequence-kd is a share of the references, in [0, 1]; got {config.sequence_kd}")
    if not 0 <= config.sequence_unlikelihood <= 1:
        raise ValueError(f"--sequence-unlikelihood is a share of the batches, in [0, 1]; got {config.sequence_unlikelihood}")
    if not 0 <= config.renamed <= 1:
        raise ValueError(f"--renamed is a share of the training examples, in [0, 1]; got {config.renamed}")
    if not 0 <= config.renamed_words <= 1 or (config.renamed_words and not config.renamed):
        raise ValueError(f"--renamed-words is a share of the --renamed examples, in [0, 1], with --renamed; got "
                         f"{config.renamed_words}")
    if config.task == "general" and (config.sequence_kd or config.renamed):
        raise ValueError("--sequence-kd and --renamed are E2E options: general prompts are trained on the full-depth "
                         "base model's answers already")
    if config.cut_loops and (config.task != "general" or config.cut_loops < 2):
        raise ValueError(f"--cut-loops N is a general-task option, N >= 2 tokens; got {config.cut_loops}")
    # Bad options are refused above, before the Accelerator claims the process's precision state.
    accelerator = Accelerator(gradient_accumulation_steps=config.grad_accum,
                              mixed_precision=pick_precision(config.precision), cpu=not torch.cuda.is_available())
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    loaded = load_model(config.model, device="cpu", dtype="float32")
    tokenizer = loaded.tokenizer
    if config.init:
        info = find_adapter(config.init)
        if not same_base(info.base_model, loaded.name):
            raise ValueError(f"--init adapter {info.name!r} was made for {info.base_model}, not {loaded.name}")
        peft_model = PeftModel.from_pretrained(loaded.model, str(info.path), is_trainable=True)
        for p in peft_model.parameters():
            if p.requires_grad:
                p.data = p.data.float()  # shipped in float16
        lora = peft_model.peft_config["default"]
        config.rank, config.alpha, config.init = lora.r, lora.lora_alpha, adapter_ref(info)
    else:
        lora = LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                          target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
        peft_model = get_peft_model(loaded.model, lora)
    model = SkipLM(peft_model)
    L = loaded.model.config.num_hidden_layers
    teacher = None
    if config.teacher:
        base = load_model(config.model, device="cpu", dtype="float32")
        if config.teacher.lower() in NONE:
            full = base.model
        else:
            source = find_adapter(config.teacher)
            config.teacher = adapter_ref(source)
            full = merge_adapter(base.model, source, base.name)
        teacher = SkipLM(full).eval().requires_grad_(False).to(accelerator.device)
    sampler = None
    if config.sequence_unlikelihood:  # the student's greedy answers, where its loops are
        from .own_answers import StudentSampler

        sampler = StudentSampler(load_model(config.model, device="cpu", dtype="float32").model.to(accelerator.device),
                                 tokenizer, config.max_answer_tokens)

    if config.task == "general":  # targets: the full-depth base model's answers, cached beside the checkpoints
        from .targets import training_examples

        train_examples, val_examples = training_examples(
            tokenizer, config.model, config.data, config.limit, config.validation_examples,
            config.max_prompt_tokens, config.max_answer_tokens, config.checkpoint_dir, cut_loops=config.cut_loops)
        groups = [[e] for e in train_examples]
    else:
        groups, val_examples = e2e_examples(config, tokenizer, teacher)
    schedules = schedules_for(config.speedups, L, config)

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                  weight_decay=0.0)
    scheduler = get_cosine_schedule_with_warmup(optimizer, math.ceil(config.warmup_ratio * config.steps),
                                                config.steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    run_dir = Path(config.checkpoint_dir) / Path(config.out).name
    step, started, elapsed_before, history = 0, time.time(), 0.0, []
    if config.resume and (run_dir / "progress.json").exists():
        accelerator.load_state(str(run_dir / "state"))
        progress = json.loads((run_dir / "progress.json").read_text())
        step, elapsed_before = progress["step"], progress["seconds"]
        history = progress.get("history", [])
    resumed_from, trained_on = step, where_trained(accelerator.device)

    # Each process takes every n-th micro-batch; a resumed run skips what it already consumed.
    stream = batches(groups, config.batch_size, config.seed)
    picker = random.Random(config.seed)
    for _ in range(step * config.grad_accum * accelerator.num_processes):
        next(stream)
        picker.choice(schedules)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def run_batch(examples, schedule, distill: float = 0.0, repeats: bool = False):
        input_ids, lengths, labels, prompt_lens, fed_back = collate(examples, pad)
        runs = layer_plan(schedule, prompt_lens, fed_back, input_ids.shape[1])
        batch = [t.to(accelerator.device) for t in (input_ids, lengths, runs, labels)]
        with accelerator.autocast():
            if not (distill and teacher is not None):
                return model(*batch, repeats=repeats)
            with torch.no_grad():
                full = layer_plan(Schedule.full(L), prompt_lens, fed_back, input_ids.shape[1])
                teacher_logits = teacher.logits(batch[0], batch[1], full.to(accelerator.device), batch[3])
            return model(*batch, teacher_logits=teacher_logits, distill=distill)

    def validation_loss():
        model.eval()
        with torch.no_grad():
            losses = [run_batch(val_examples[i:i + config.batch_size], schedule).item()
                      for schedule in schedules for i in range(0, len(val_examples), config.batch_size)]
        model.train()
        return sum(losses) / len(losses)

    def summary_of(steps: int, seconds: float) -> dict:
        summary = {"base_model": loaded.name, "task": config.task, "speedups": config.speedups, "steps": steps,
                   "examples_seen": steps * config.batch_size * config.grad_accum * accelerator.num_processes,
                   "train_examples": sum(map(len, groups)), "epoch_steps": len(groups) // config.batch_size,
                   "train_minutes": round(seconds / 60, 1),
                   "val_loss": next((h["val_loss"] for h in reversed(history) if "val_loss" in h), None),
                   "precision": pick_precision(config.precision), "resumed_from": resumed_from,
                   "device": trained_on,
                   "config": asdict(config), "history": history}
        if config.task == "general":  # what `eval --prompts validation` checks before it scores the adapter
            from ..evaluation.general import HELD_OUT_RULE

            summary["held_out"] = HELD_OUT_RULE
        return summary

    bar = tqdm(total=config.steps, initial=step, desc=f"train {Path(config.out).name}",
               disable=not accelerator.is_main_process)
    model.train()
    while step < config.steps:
        for micro in range(config.grad_accum * accelerator.num_processes):
            examples, schedule = next(stream), picker.choice(schedules)
            if micro % accelerator.num_processes != accelerator.process_index:
                continue
            own = sampler is not None and is_own_batch(step, config.sequence_unlikelihood)
            if own:  # the student's own answers: unlikelihood on their repeats
                sampler.refresh(accelerator.unwrap_model(model).model)
                examples = sampler.sample(examples, schedule)
            with accelerator.accumulate(model):
                loss = run_batch(examples, schedule, 0.0 if own else config.distill, repeats=own)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        step += 1
        record = {"step": step, "loss": round(loss.item(), 4), "lr": scheduler.get_last_lr()[0],
                  "layers": round(schedule.average_budget(), 2),
                  **({"sequence_unlikelihood": True} if own else {})}
        if step % config.eval_every == 0 or step == config.steps:
            record["val_loss"] = round(validation_loss(), 4)
        history.append(record)
        bar.set_postfix({k: v for k, v in record.items() if k in ("loss", "val_loss")})
        bar.update(1)
        if config.snapshot_every and step % config.snapshot_every == 0 and step < config.steps \
                and accelerator.is_main_process:
            save_adapter(accelerator.unwrap_model(model).model, Path(f"{run_dir}-snapshots") / f"step-{step}",
                         {**summary_of(step, elapsed_before + time.time() - started), "snapshot": True})
        if step % config.checkpoint_every == 0 and step < config.steps:
            accelerator.save_state(str(run_dir / "state"))
            seconds = elapsed_before + time.time() - started
            if accelerator.is_main_process:
                (run_dir / "progress.json").write_text(json.dumps({"step": step, "seconds": seconds,
                                                                          "history": history}))
    bar.close()

    summary = summary_of(step, elapsed_before + time.time() - started)
    if accelerator.is_main_process:
        save_adapter(accelerator.unwrap_model(model).model, Path(config.out), summary)
        shutil.rmtree(run_dir, ignore_errors=True)
    return summary


def save_adapter(peft_model, out: Path, summary: dict) -> None:
    from ..adapters.lora import write_record

    # LoRA on linear layers only, the vocabulary never resized: peft's "auto" check of the embedding
    # layers would ask the Hub for the base model's config.json (a failed lookup offline).
    peft_model.save_pretrained(out, save_embedding_layers=False)
    write_record(out, summary)
    finish_adapter(out)


def where_trained(device) -> str:
    """The machine in words for the card ("an NVIDIA H200", "a 2-core AMD EPYC"): minutes mean little
    without it, and runs of one project now train on a CPU or on a GPU."""
    from ..evaluation.machine import machine

    if torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(device)
        return f"{article(name)} {name}"
    cpu = machine()
    return f"a {cpu['cores']}-core {cpu['cpu']}"


def article(name: str) -> str:
    """"a" or "an" before a machine's name, by its first sound: "an NVIDIA H200", "a Tesla T4", "an AMD
    Instinct MI300X" (a capitalized initialism whose first letter is said with a vowel: F, H, L, M, N, R, S, X)."""
    word = name.split()[0] if name.split() else ""
    vowel = word[:1].upper() in set("AEIOU") or (word.isupper() and word[:1] in set("FHLMNRSX"))
    return "an" if vowel else "a"


def _word_names(share: float) -> str:
    return f" ({share:.0%} of those names English words, as in 'Plum and Rook')" if share else ""


def finish_adapter(folder: Path) -> None:
    """Make a saved adapter fit to ship: LoRA weights in float16 (half the size, under the 10 MB a Hugging
    Face Space takes without LFS, loaded back into float32 on merge; on e2e-all, greedy outputs of 16 test
    MRs at 1x, 3x and 5x were token for token those of the float32 copy), the base model named by its public
    id rather than a local cache path, and a model card that says what it is instead of peft's template."""
    from safetensors.torch import load_file, save_file

    from ..adapters.lora import WEIGHTS, read_adapter

    folder = Path(folder)
    weights = folder / WEIGHTS
    save_file({k: v.half() for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    config_file = folder / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path":
                                       _public_base(read_adapter(folder).base_model)}, indent=2))
    write_card(folder)


def _public_base(base_model: str) -> str:
    from ..models import DEFAULT_HUB_ID, DEFAULT_MODEL

    return DEFAULT_HUB_ID if base_model == DEFAULT_MODEL else base_model


def write_card(folder: Path) -> None:
    """The model card (README.md) from the adapter's record; written again alone when only the record
    changed (a served adapter whose init or teacher was replaced), leaving the weights untouched."""
    from ..adapters.lora import read_adapter
    from ..adapters.router import INSTRUCTION

    folder = Path(folder)
    meta = read_adapter(folder).meta
    base = _public_base(meta["base_model"])
    c = meta["config"]
    speedups = ", ".join(f"{s:g}x" for s in meta["speedups"])
    aids = "".join([f" Started from the adapter `{c['init']}`." if c.get("init") else "",
                    f" Loss: {1 - c['distill']:g} x cross-entropy on the target + {c['distill']:g} x KL from"
                    f" {_teacher_words(c['teacher'])} (self-distillation)." if c.get("distill") else "",
                    f" Each training target is cut before the first run of {c['cut_loops']} tokens it already"
                    f" said: the base model's greedy answers often end in a loop." if c.get("cut_loops") else "",
                    f" {c['sequence_unlikelihood']:.0%} of the batches are the student's own greedy answers at its"
                    f" speedup, whose repeated 4-grams are made less likely (sequence-level unlikelihood)."
                    if c.get("sequence_unlikelihood") else "",
                    f" {c['renamed']:.0%} of the training examples name a made-up restaurant and landmark, so that"
                    f" names are copied rather than recalled{_word_names(c.get('renamed_words', 0))}."
                    if c.get("renamed") else "",
                    " Targets: the teacher's greedy outputs, not the references (sequence-level"
                    " distillation)." if c.get("sequence_kd") == 1 else
                    f" Targets: {c['sequence_kd']:.0%} of the references replaced by the teacher's greedy"
                    f" output (sequence-level distillation)." if c.get("sequence_kd") else ""])
    spread = c.get("spread", SPREAD)
    shape = ("the same at every position (spread 1)" if spread == 1 else
             f"from {spread:g} x the average down to its minimum at position {c['horizon']}, {c['decay']} decay")
    datasets, data, example = _card_data(meta, INSTRUCTION)
    (folder / "README.md").write_text(f"""---
base_model: {base}
library_name: peft
{datasets}tags: [lora, skipdecode]
---

# {folder.name}: skip-aware LoRA for {base} at {speedups}

Fine-tuned by `skipdecode train` (SkipDecode Studio) with the layer plan the engine decodes with: prompt
tokens run every layer; the s-th generated token runs {c["warmup_layers"]} warm-up layers and the top layers of its
budget b(s), {shape}, in {c["mode"]} mode; a batch samples one of the speedups listed.{aids} LoRA rank {c["rank"]}{_cut_from(meta)}, alpha
{c["alpha"]}, {meta["steps"]} steps{_of_schedule(meta)} of batch {c["batch_size"]} x {c["grad_accum"]}, {meta["precision"]} autocast,
{meta["train_minutes"]} minutes on {meta.get("device", "a 2-core CPU")}; validation loss {meta["val_loss"]}. Every setting and the loss
history are in `skipdecode.json`.

{data}

    skipdecode generate --adapter {folder.name} --speedup {meta["speedups"][-1]:g} \\
        --prompt "{example}"
""")


def _teacher_words(teacher: str) -> str:
    from ..adapters.lora import NONE

    return "the full-depth base model" if str(teacher).lower() in NONE else f"the full-depth model with `{teacher}`"


def _of_schedule(meta: dict) -> str:
    """A snapshot stops short of its run's learning-rate schedule: say how far it got."""
    return f" (a snapshot of a {meta['config']['steps']}-step schedule)" if meta.get("snapshot") else ""


def _cut_from(meta: dict) -> str:
    """An adapter cut to a lower rank after training (`skipdecode.rank_cut`): from what, keeping how much."""
    cut = meta.get("rank_cut")
    return (f" (cut from rank {cut['from_rank']} by an SVD of each layer's update, keeping"
            f" {cut['energy_kept_mean']:.1%} of its energy on average)" if cut else "")


def _card_data(meta: dict, instruction: str) -> tuple[str, str, str]:
    """The model card's datasets line, its data paragraph and an example prompt, by task."""
    c = meta["config"]
    if meta.get("task", "e2e") == "e2e":
        split = ("training split (chosen on the dev set)" if c.get("split", "dev") == "train" else
                 "dev set (the devset-era recipe: the MRs not held out)")
        return ("datasets: [e2e_nlg]\n", f"Data: the E2E NLG challenge {split} (Novikova, Dušek and Rieser, "
                "2017), CC BY-SA 4.0.", f"{instruction}name[Strada], eatType[pub], area[city centre]")
    pool = c.get("data") is None
    source = ("the general chat prompts of `permissive_chat_prompts.jsonl` (HelpSteer2, Anthropic HH-RLHF helpful,\n"
              "OpenAssistant oasst2, databricks-dolly-15k and Capybara prompts; CC BY-SA 4.0 as a compilation)"
              if pool else f"the prompts of `{Path(c['data']).name}`")
    return ("datasets: [nvidia/HelpSteer2, Anthropic/hh-rlhf, OpenAssistant/oasst2, databricks/databricks-dolly-15k, "
            "LDJnr/Capybara]\n" if pool else "",
            f"Data: prompts only, {source}, up to {c['max_prompt_tokens']} tokens with the chat template. The targets\n"
            f"are the base model's own greedy answers at full depth, up to {c['max_answer_tokens']} tokens "
            f"(self-distillation).\nHeld out and never trained on: {meta.get('held_out')}.",
            "Explain in one paragraph why the sky is blue.")


# ---- command line -----------------------------------------------------------------------------
def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="skip-aware LoRA fine-tuning on E2E or on general chat prompts",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="adapter folder to write (e.g. assets/adapters/skip3x)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--speedup", type=float, help="train for one schedule (the paper's way)")
    group.add_argument("--speedups", help="comma list: sample one schedule per batch (one adapter for all)")
    defaults = TrainConfig(out="")
    p.add_argument("--model", default=None)
    p.add_argument("--data", default=None, help="E2E: the E2E folder or the split's CSV; --task general: a prompts "
                                                "file, JSON lines with a prompt field or one a line (default: the "
                                                "prompt pool)")
    p.add_argument("--split", choices=("train", "dev"), default=defaults.split,
                   help="E2E: train on the official training split, one reference per MR an epoch, validated on the "
                        "whole devset (default); dev: the devset-era recipe, on the devset MRs not held out")
    p.add_argument("--task", choices=("e2e", "general"), default="e2e",
                   help="general: chat prompts, trained on the full-depth base model's greedy answers (cached in "
                        "--checkpoint-dir), --limit N prompts; the validation slice is never trained on")
    p.add_argument("--init", default=None, help="adapter (name or path) to start from, e.g. e2e-1x")
    p.add_argument("--teacher", default=None,
                   help="adapter of the full-depth teacher for --distill (--task general: the base model)")
    p.add_argument("--distill", type=float, default=0.0, help="weight of the KL to the teacher, in (0, 1]")
    for name in ("warmup_layers", "horizon", "rank", "alpha", "batch_size", "grad_accum", "steps",
                 "validation_examples", "eval_every", "checkpoint_every", "snapshot_every", "seed", "limit",
                 "max_answer_tokens", "max_prompt_tokens"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("dropout", "lr", "warmup_ratio", "validation_share", "spread", "renamed", "renamed_words"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    p.set_defaults(horizon=None, spread=None)  # by task: see TrainConfig.__post_init__
    p.add_argument("--decay", default=defaults.decay)
    p.add_argument("--mode", default=defaults.mode)
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    p.add_argument("--checkpoint-dir", default=defaults.checkpoint_dir)
    p.add_argument("--sequence-kd", type=float, nargs="?", const=1.0, default=0.0, metavar="SHARE",
                   help="train on the --teacher's greedy outputs instead of the references (a SHARE of them)")
    p.add_argument("--sequence-unlikelihood", type=float, default=0.0, metavar="SHARE",
                   help="that share of the batches: the student decodes the prompts greedily at its speedup and every "
                        "token of a 4-gram its answer already said is made less likely (Welleck et al. 2020)")
    p.add_argument("--cut-loops", type=int, default=0, metavar="N",
                   help="--task general: cut each training target before the first run of N tokens that already "
                        "occurred in it (the base model's greedy answers often end in a loop); validation targets "
                        "stay whole")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint of this --out")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args) -> int:
    speedups = ([float(s) for s in args.speedups.split(",")] if args.speedups
                else [args.speedup if args.speedup else 1.0])
    fields = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__}
    summary = train(TrainConfig(**{**fields, "speedups": speedups}))
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=1))
    return 0
