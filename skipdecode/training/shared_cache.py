"""A draft adapter for verified decoding's one cache: self-distillation with the verifier's keys and values.

In verified decoding (skipdecode/speculative/verify.py) the draft reads the verifier's cache: at a layer it runs, a draft
position attends to the verifier's full-depth keys and values of every earlier position and to its own
entry. Skip-aware training (train.py) teaches the other case, a model reading its own skipped entries, and
the E2E draft trained so agrees with e2e-1x less often on the shared cache (docs/method.md). Here the teacher
is the verifier itself (its adapter at full depth): one pass of it gives every layer's keys and values and
its next-token distribution; the student (the draft adapter, LoRA, started from `--init`) runs only the
answer positions, through the layers its schedule gives them, each attending over the teacher's keys and
values before it plus its own, and learns the teacher's distribution there (KL). That is exactly the first
draft of a round; later drafts also read the round's earlier drafts.

Data: the E2E training split's MRs and references (one reference per MR an epoch); the devset validates
(top-1 agreement with the verifier, the measure acceptance follows). Checkpoints every `--checkpoint-every`
steps (adapter, optimizer, step): `--resume` goes on from the last one. `--ship DIR` writes the last
checkpoint as a served adapter: float16 like the others, and only the layers the draft runs (a third of
them at 3x), with a record that names its verifier (adapters.shared_cache_draft finds it by that).

    python -m skipdecode.training.shared_cache --out checkpoints/runs/e2e-draft-3x --init e2e-all \\
        --teacher e2e-1x --speedup 3 --steps 300
    python -m skipdecode.training.shared_cache --out checkpoints/runs/e2e-draft-3x --ship assets/adapters/e2e-draft-3x
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def attend(layer, h, cos, sin, context=None, offset: int = 0):
    """One Llama decoder layer on h [B, T, d]: (output, keys, values), keys after RoPE [B, Hkv, T, hd]. Without
    `context`: causal self-attention (the teacher). With context (keys, values) of the teacher over all
    columns: h holds columns offset.., and column c attends to the context's columns before c and to its own
    key and value, never to other student entries."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attn = layer.self_attn
    B, T, _ = h.shape
    hd = attn.head_dim
    x = layer.input_layernorm(h)
    q = attn.q_proj(x).view(B, T, -1, hd).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, -1, hd).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    groups = q.shape[1] // k.shape[1]
    scale = hd ** -0.5
    causal = torch.ones(T, T, dtype=torch.bool, device=h.device)
    if context is None:
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                             attn_mask=causal.tril(), scale=scale)
    else:
        ck, cv = (t.repeat_interleave(groups, 1) for t in context)
        columns = torch.arange(ck.shape[2], device=h.device)
        allowed = columns[None, :] < (offset + torch.arange(T, device=h.device))[:, None]
        before = (q @ ck.transpose(-1, -2)) * scale  # [B, H, T, columns]: the teacher's
        before = before.masked_fill(~allowed, float("-inf"))
        own = (q * k.repeat_interleave(groups, 1)).sum(-1, keepdim=True) * scale  # [B, H, T, 1]
        weights = torch.cat([before, own], -1).softmax(-1)
        out = weights[..., :-1] @ cv + weights[..., -1:] * v.repeat_interleave(groups, 1)
    h = h + attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))
    return h + layer.mlp(layer.post_attention_layernorm(h)), k, v


def teacher_pass(model, ids, at):
    """The verifier at full depth: every layer's keys and values, and its logits at positions `at` [B, T]."""
    inner = model.model
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    h = inner.embed_tokens(ids)
    cos, sin = inner.rotary_emb(h, positions)
    kv = []
    for layer in inner.layers:
        h, k, v = attend(layer, h, cos, sin)
        kv.append((k, v))
    return kv, model.lm_head(inner.norm(h)[at])


def student_logits(peft_model, ids, kv, layers, at):
    """The draft's logits at positions `at` (a boolean mask [B, T]): its layers only, on the teacher's cache,
    computed from the first column any row drafts at."""
    base = peft_model.get_base_model()
    inner = base.model
    first = int(at.any(0).nonzero().min())
    positions = torch.arange(first, ids.shape[1], device=ids.device)[None]
    h = inner.embed_tokens(ids[:, first:])
    cos, sin = inner.rotary_emb(h, positions)
    for layer in layers:
        h, _, _ = attend(inner.layers[layer], h, cos, sin, kv[layer], first)
    return base.lm_head(inner.norm(h)[at[:, first:]])


def draft_positions(input_ids, prompt_lens, lengths):
    """Positions a draft predicts from: the answer's tokens fed back (prompt_len .. length - 1)."""
    B, T = input_ids.shape
    cols = torch.arange(T)[None]
    return (cols >= torch.tensor(prompt_lens)[:, None]) & (cols < lengths[:, None])


def ship(run: Path, dest: Path) -> None:
    """The run's last checkpoint as a served adapter in `dest`: its LoRA factors for the layers the draft runs,
    in float16, peft's config told which layers they are, and the record with `shared_cache` and `verifier`."""
    from safetensors.torch import load_file, save_file

    from ..adapters.lora import WEIGHTS, read_adapter, write_record

    meta = dict(read_adapter(run / "adapter").meta)
    tensors = load_file(str(run / "adapter" / WEIGHTS))
    layer_of = {key: int(key.split(".layers.")[1].split(".")[0]) for key in tensors}
    layers = meta["layers"]  # the layers the draft runs, which the training run's record names
    kept = {key: t.half().contiguous() for key, t in tensors.items() if layer_of[key] in layers}
    dest.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(dest / WEIGHTS), metadata={"format": "pt"})
    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    config.update(layers_to_transform=layers, inference_mode=True)
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    meta.update(layers=sorted(layers), verifier=meta["config"]["teacher"], shared_cache=True,
                init=meta["config"]["init"])
    write_record(dest, meta)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--init", default="e2e-all", help="the draft adapter to start from")
    p.add_argument("--teacher", default="e2e-1x", help="the verifier's adapter")
    p.add_argument("--speedup", type=float, default=3.0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--validation-examples", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--ship", metavar="DIR", help="write the last checkpoint of --out as a served adapter in DIR, and stop")
    args = p.parse_args(argv)
    if args.ship:
        ship(Path(args.out), Path(args.ship))
        return 0

    from peft import PeftModel

    from ..adapters.lora import find_adapter, merge_adapter, trained_schedule, write_record
    from ..evaluation.data import Item, pairs, training_split
    from ..models import load_model
    from .data import batches, collate, tokenize_pairs

    torch.manual_seed(args.seed)
    init, teacher_info = find_adapter(args.init), find_adapter(args.teacher)
    loaded = load_model(None, device="cpu", dtype="float32")
    tokenizer = loaded.tokenizer
    teacher = merge_adapter(load_model(None, device="cpu", dtype="float32").model, teacher_info, loaded.name)
    teacher.eval().requires_grad_(False)
    L = teacher.config.num_hidden_layers
    schedule = trained_schedule(init, args.speedup, L)
    if len({schedule.layers(s) for s in range(64)}) != 1:
        raise ValueError("shared-cache training runs a constant budget (the E2E adapters' spread 1)")
    layers = schedule.layers(0)
    out, state = Path(args.out), Path(args.out) / "state.pt"
    start = out / "adapter" if args.resume and state.exists() else init.path
    student = PeftModel.from_pretrained(loaded.model, str(start), is_trainable=True)
    for q in student.parameters():
        if q.requires_grad:
            q.data = q.data.float()
    params = [q for q in student.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    warm = max(1, args.steps // 20)
    lr_at = lambda s: args.lr * min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / args.steps))  # noqa: E731
    step, history, seconds = 0, [], 0.0
    if args.resume and state.exists():
        saved = torch.load(state)
        optimizer.load_state_dict(saved["optimizer"])
        step, history, seconds = saved["step"], saved["history"], saved["seconds"]

    items, val_items = training_split()
    examples = tokenize_pairs(tokenizer, pairs(items))
    refs = iter(examples)
    groups = [group for group in ([next(refs) for _ in item.refs] for item in items) if group]
    every = max(1, len(val_items) // args.validation_examples)
    val = tokenize_pairs(tokenizer, pairs([Item(i.mr, i.refs[:1]) for i in val_items[::every]]))
    val = val[:args.validation_examples]
    stream = batches(groups, args.batch_size, args.seed)
    for _ in range(step):
        next(stream)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()  # bfloat16 products where the CPU has them, as train.py

    def run(batch, train: bool):
        ids, lengths, _, prompt_lens, _ = collate(batch, pad)
        at = draft_positions(ids, prompt_lens, lengths)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            with torch.no_grad():
                kv, target = teacher_pass(teacher, ids, at)
                target = target.float()
            with torch.set_grad_enabled(train):
                logits = student_logits(student, ids, kv, layers, at).float()
        loss = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(target, -1), log_target=True, reduction="batchmean")
        agree = (logits.argmax(-1) == target.argmax(-1)).float().mean().item()
        return loss, agree

    def validate() -> dict:
        student.eval()
        with torch.no_grad():
            results = [run(val[i:i + args.batch_size], False) for i in range(0, len(val), args.batch_size)]
        student.train()
        return {"val_loss": round(sum(r[0].item() for r in results) / len(results), 4),
                "val_agreement": round(sum(r[1] for r in results) / len(results), 4)}

    def checkpoint():
        student.save_pretrained(out / "adapter", save_embedding_layers=False)
        write_record(out / "adapter", summary())
        torch.save({"optimizer": optimizer.state_dict(), "step": step, "history": history, "seconds": seconds},
                   state)

    def summary() -> dict:
        return {"base_model": loaded.name, "task": "e2e", "speedups": [args.speedup], "steps": step,
                "train_minutes": round(seconds / 60, 1), "init": init.name, "verifier": teacher_info.name,
                "shared_cache": True, "layers": list(layers),
                "config": {**vars(args), "warmup_layers": schedule.warmup, "horizon": init.config.get("horizon"),
                           "decay": schedule.decay, "mode": schedule.mode, "spread": init.spread,
                           "rank": student.peft_config["default"].r, "alpha": student.peft_config["default"].lora_alpha},
                "history": history}

    out.mkdir(parents=True, exist_ok=True)
    if step == 0:
        history.append({"step": 0, **validate()})
        print(json.dumps(history[-1]), flush=True)
    student.train()
    while step < args.steps:
        started = time.time()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss, agree = run(next(stream), True)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        seconds += time.time() - started
        entry = {"step": step, "loss": round(loss.item(), 4), "agreement": round(agree, 4)}
        if step % args.eval_every == 0 or step == args.steps:
            entry.update(validate())
        history.append(entry)
        print(json.dumps(entry), flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            checkpoint()
    write_record(out / "adapter", summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
