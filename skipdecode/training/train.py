"""Skip-aware fine-tuning: LoRA adapters trained with the very layer plan the engine decodes with.

Teacher forcing feeds prompt + reference in one pass, every position running the layers decoding would run
for it (skip_lm.py says why one pass equals decoding). The settings are config.py's, the examples and
batches data.py's, the losses losses.py's and the shipped adapter and its card card.py's; this file is the
loop and its command.

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
from dataclasses import asdict
from pathlib import Path

import torch

from ..schedule import Schedule
from .card import save_adapter, where_trained
from .config import TrainConfig, schedules_for
from .data import batches, collate, e2e_examples
from .own_answers import is_own_batch
from .skip_lm import SkipLM, layer_plan

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


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

    config.check()
    # Bad options are refused first, before the Accelerator claims the process's precision state.
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
