"""A trained adapter made fit to ship: saved with its record, LoRA weights in float16, the base model named
by its public id, and a model card (README.md) that says how it was trained, on what and where."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..schedule import SPREAD


def save_adapter(peft_model, out: Path, summary: dict) -> None:
    from ..adapters.lora import write_record

    # LoRA on linear layers only, the vocabulary never resized: peft's "auto" check of the embedding
    # layers would ask the Hub for the base model's config.json (a failed lookup offline).
    peft_model.save_pretrained(out, save_embedding_layers=False)
    write_record(out, summary)
    finish_adapter(out)


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


def _word_names(share: float) -> str:
    return f" ({share:.0%} of those names English words, as in 'Plum and Rook')" if share else ""


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
