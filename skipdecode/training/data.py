"""What training reads: E2E examples (prompt ids, reference ids + end token) grouped by MR, the teacher's
outputs for sequence-level distillation, right-padded batches and the endless, reproducible stream of them."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from ..evaluation.data import Item
from ..prompts import encode_prompt
from ..schedule import Schedule
from .config import TrainConfig


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
