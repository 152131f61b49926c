"""Skip-aware training follows exactly the layer plan of decoding, and it learns."""

import json
import os
import shutil

import pytest
import torch

from conftest import DEVICE, PROMPTS, IdTokenizer, tiny_checkpoint, tiny_model
from skipdecode.engine import Engine
from skipdecode.schedule import Schedule, for_speedup
from skipdecode.training.card import article, where_trained
from skipdecode.training.data import collate
from skipdecode.training.skip_lm import SkipLM, layer_plan


def greedy_then_teacher_force(engine, model, prompt_ids, schedule, new_tokens):
    result = engine.generate([prompt_ids], schedule, max_new_tokens=new_tokens, stop_at_eos=False)
    target = result.token_ids[0]
    input_ids, lengths, labels, prompt_lens, fed_back = collate([(prompt_ids, target)], pad_id=0)
    runs = layer_plan(schedule, prompt_lens, fed_back, input_ids.shape[1])
    input_ids, lengths, labels, runs = (t.to(model.device) for t in (input_ids, lengths, labels, runs))
    with torch.no_grad():
        hidden = SkipLM(model).hidden(input_ids, lengths, runs)
        predicted = SkipLM(model).lm_head(hidden[labels >= 0]).argmax(-1).tolist()
    return result, runs, target, predicted


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["skip", "early_exit"])
def test_training_plan_equals_decoding_plan(engine, mode):
    schedule = for_speedup(3, engine.num_layers, horizon=12, warmup=2, mode=mode)
    prompt = engine.encode(PROMPTS[2])
    result, runs, target, predicted = greedy_then_teacher_force(engine, engine.model, prompt, schedule, 16)
    P = len(prompt)
    assert runs[0, :P].all()  # the prompt runs every layer, as the prefill does
    for record in result.trace.steps:  # the s-th token fed back runs the layers the engine ran at step s
        assert runs[0, P + record.step].nonzero().flatten().tolist() == list(record.layers)
    assert runs.shape[1] == P + len(result.trace.steps)
    # and one teacher-forced pass under that plan predicts what decoding produced, token for token
    assert predicted == target


def test_tiny_llama_teacher_forcing_matches_decoding():
    model = tiny_model("llama", layers=6)
    engine = Engine(model, IdTokenizer())
    schedule = Schedule(6, 5, 2, warmup=1, horizon=6)
    _, _, target, predicted = greedy_then_teacher_force(engine, model, [1, 5, 9, 33, 7], schedule, 10)
    assert predicted == target


@pytest.mark.slow
def test_a_few_steps_lower_the_loss():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(tiny_model("llama", layers=4),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"]))
    lm = SkipLM(model)
    examples = [([1, 10 + i, 20 + i, 30], [40 + i, 50 + i, 60 + i, 2]) for i in range(8)]
    input_ids, lengths, labels, prompt_lens, fed_back = collate(examples, pad_id=0)
    runs = layer_plan(Schedule(4, 4, 2, warmup=1, horizon=3), prompt_lens, fed_back, input_ids.shape[1])
    input_ids, lengths, labels, runs = (t.to(DEVICE) for t in (input_ids, lengths, labels, runs))
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=5e-3)
    losses = []
    for _ in range(12):
        loss = lm(input_ids, lengths, runs, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_sequence_unlikelihood_penalizes_every_token_of_a_repeated_4gram_and_nothing_else():
    from skipdecode.training.targets import repeated_ngrams
    from skipdecode.training.losses import sequence_unlikelihood_loss

    assert repeated_ngrams([1, 2, 3, 4, 5, 1, 2, 3, 4]) == [False] * 5 + [True] * 4
    assert repeated_ngrams([7, 7, 7, 7, 7]) == [False, True, True, True, True]  # a one-token loop
    assert repeated_ngrams([1, 2, 3, 9, 1, 2, 3, 8]) == [False] * 8  # a repeated 3-gram is not a 4-gram
    torch.manual_seed(0)
    labels = torch.tensor([[-100, 5, 5, 5, 5, 5], [-100, 1, 2, 3, 4, -100]])
    log_probs = torch.randn(9, 6).log_softmax(-1)
    expected = -sum(torch.log1p(-log_probs[j, 5].exp()) for j in (1, 2, 3, 4)) / 9  # the second row never repeats
    assert torch.allclose(sequence_unlikelihood_loss(log_probs, labels), expected)


def test_distillation_pulls_the_skipping_student_toward_the_full_teacher():
    """The KL term is zero when the student already is the teacher, and a few steps with it move a
    skipping student's predictions toward the full-depth model's."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    teacher = SkipLM(tiny_model("llama", layers=4)).eval()
    student = SkipLM(get_peft_model(tiny_model("llama", layers=4),
                                    LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"])))
    examples = [([1, 10 + i, 20 + i, 30], [40 + i, 50 + i, 60 + i, 2]) for i in range(8)]
    input_ids, lengths, labels, prompt_lens, fed_back = collate(examples, pad_id=0)
    width = input_ids.shape[1]
    full = layer_plan(Schedule.full(4), prompt_lens, fed_back, width)
    skip = layer_plan(Schedule(4, 3, 2, warmup=1, horizon=3), prompt_lens, fed_back, width)
    input_ids, lengths, labels, full, skip = (t.to(DEVICE) for t in (input_ids, lengths, labels, full, skip))
    with torch.no_grad():
        target = teacher.logits(input_ids, lengths, full, labels)
        ce = student(input_ids, lengths, full, labels)
        same = student(input_ids, lengths, full, labels, teacher_logits=target, distill=0.5)
    assert same.item() == pytest.approx(0.5 * ce.item(), rel=1e-4)  # a LoRA starts at zero: KL = 0

    def kl():
        with torch.no_grad():
            logits = student.logits(input_ids, lengths, skip, labels)
        return torch.nn.functional.kl_div(logits.log_softmax(-1), target.log_softmax(-1), log_target=True,
                                          reduction="batchmean").item()

    before = kl()
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=5e-3)
    for _ in range(12):
        student(input_ids, lengths, skip, labels, teacher_logits=target, distill=1.0).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert before > 0.1 and kl() < 0.5 * before


@pytest.mark.slow
def test_a_run_can_start_from_an_adapter_and_distill_from_the_full_model(tmp_path):
    """--init starts from the shipped 1x adapter's weights (rank and alpha taken from it); --teacher and
    --distill add the full-depth model's KL; both are recorded with the adapter."""
    from safetensors.torch import load_file

    from skipdecode.training import train as training
    from skipdecode.adapters.lora import find_adapter

    base = dict(speedups=[3.0], batch_size=1, limit=4, validation_examples=1, precision="fp32", split="dev",
                checkpoint_dir=str(tmp_path / "checkpoints"))
    with pytest.raises(ValueError, match="--teacher"):
        training.train(training.TrainConfig(out=str(tmp_path / "bad"), distill=0.5, **base))
    with pytest.raises(ValueError, match="--sequence-kd .* needs --teacher"):
        training.train(training.TrainConfig(out=str(tmp_path / "bad"), sequence_kd=True, **base))
    with pytest.raises(ValueError, match="--renamed is a share"):
        training.train(training.TrainConfig(out=str(tmp_path / "bad"), renamed=1.5, **base))
    with pytest.raises(ValueError, match="--renamed-words is a share of the --renamed examples"):
        training.train(training.TrainConfig(out=str(tmp_path / "bad"), renamed_words=0.5, **base))
    summary = training.train(training.TrainConfig(out=str(tmp_path / "kd"), init="e2e-1x", teacher="e2e-1x",
                                                  distill=0.5, renamed=0.5, renamed_words=0.5, steps=1, lr=1e-9,
                                                  **base))
    assert summary["config"]["init"] == "e2e-1x" and summary["config"]["teacher"] == "e2e-1x"
    assert summary["config"]["renamed"] == 0.5
    assert summary["config"]["rank"] == find_adapter("e2e-1x").meta["config"]["rank"]
    start = load_file(find_adapter("e2e-1x").path / "adapter_model.safetensors")
    after = load_file(tmp_path / "kd" / "adapter_model.safetensors")
    assert start.keys() == after.keys()  # a learning rate of 1e-9 leaves the 1x weights where they were
    assert all(torch.allclose(start[k].float(), after[k].float(), atol=1e-3) for k in start)
    card = (tmp_path / "kd" / "README.md").read_text()
    assert "e2e-1x" in card and "50% of the training examples name a made-up restaurant" in card
    assert "(50% of those names English words" in card
    # the card says where the minutes were spent: this machine's CPU here, a GPU's name on a GPU
    assert summary["device"] == where_trained("cpu") and f"minutes on {summary['device']};" in card
    assert summary["device"].startswith(f"a {os.cpu_count()}-core ")
    summary = training.train(training.TrainConfig(out=str(tmp_path / "skd"), init="e2e-1x", teacher="e2e-1x",
                                                  distill=0.5, sequence_kd=True, steps=1, **base))
    assert summary["config"]["sequence_kd"] and summary["train_examples"] == base["limit"]
    assert "teacher's greedy outputs, not the references" in (tmp_path / "skd" / "README.md").read_text()


@pytest.mark.slow
def test_sequence_kd_targets_are_the_teachers_greedy_outputs(engine):
    """Each reference of an MR becomes the full-depth model's greedy output for that MR; the MR keeps its
    number of training examples."""
    from skipdecode.evaluation.data import Item
    from skipdecode.training.data import teacher_items

    items = [Item("name[The Eagle], eatType[pub]", ("r1", "r2", "r3")), Item("name[Strada], area[riverside]", ("r",))]
    taught = teacher_items(engine, items, batch_size=2, max_new_tokens=12)
    for item, new in zip(items, taught):
        alone = engine.generate([item.prompt], Schedule.full(engine.num_layers), max_new_tokens=12).texts[0]
        assert new.mr == item.mr and new.refs == (alone.strip(),) * len(item.refs)
        assert alone.strip() not in item.refs


@pytest.mark.slow
def test_teacher_outputs_are_kept_so_a_resumed_run_does_not_decode_them_again(engine, tmp_path, monkeypatch):
    """With a cache file, the teacher's outputs are written as they are decoded; the next call reads them
    (even after a line cut short by a stopped run) and decodes nothing, with the same targets."""
    from skipdecode.evaluation import runs
    from skipdecode.evaluation.data import Item
    from skipdecode.training.data import teacher_items

    items = [Item("name[The Eagle], eatType[pub]", ("r1", "r2")), Item("name[Strada], area[riverside]", ("r",))]
    cache = tmp_path / "teacher-outputs.jsonl"
    first = teacher_items(engine, items, batch_size=2, max_new_tokens=8, cache=cache)
    assert first == teacher_items(engine, items, batch_size=2, max_new_tokens=8)  # the same as uncached
    assert [json.loads(line)["mr"] for line in cache.read_text().splitlines()] == [it.mr for it in items]
    with open(cache, "a") as handle:
        handle.write('{"mr": "name[cut')
    monkeypatch.setattr(runs, "decode", lambda *a, **k: pytest.fail("decoded again"))
    assert teacher_items(engine, items, batch_size=2, max_new_tokens=8, cache=cache) == first


def test_the_teacher_outputs_file_is_named_by_the_adapters_weights(tmp_path):
    """Retrained at the same path, a teacher gets a new file; the same weights elsewhere, the same file; the
    base model as teacher, none."""
    from skipdecode.training.data import teacher_cache

    adapter = tmp_path / "one"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "skipdecode.json").write_text('{"speedups": [1], "base_model": "m"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    first = teacher_cache(tmp_path / "ck", str(adapter))
    assert first.parent == tmp_path / "ck" and first.name.endswith("-64tokens.jsonl")
    copy = tmp_path / "copy"
    shutil.copytree(adapter, copy)
    assert teacher_cache(tmp_path / "ck", str(copy)) == first
    (adapter / "adapter_model.safetensors").write_bytes(b"retrained")
    assert teacher_cache(tmp_path / "ck", str(adapter)) != first
    assert teacher_cache(tmp_path / "ck", "none") is None


@pytest.mark.slow
def test_a_sequence_kd_share_replaces_that_share_of_the_references(engine):
    """`--sequence-kd 0.5` keeps about half of the human references; which ones is fixed by the seed; a share
    of 0 keeps them all; an out-of-range share is refused before any work."""
    from skipdecode.training import data, train as training
    from skipdecode.evaluation.data import Item

    items = [Item(f"name[The Eagle], eatType[pub], area[{a}]", tuple(f"r{a}{k}" for k in range(8)))
             for a in ("riverside", "city centre")]
    half = data.teacher_items(engine, items, share=0.5, seed=3, batch_size=2, max_new_tokens=8)
    kept = [ref for item, new in zip(items, half) for ref, was in zip(new.refs, item.refs) if ref == was]
    taught = [{ref for ref, was in zip(new.refs, item.refs) if ref != was} for item, new in zip(items, half)]
    assert 4 <= len(kept) <= 12 and [len(t) for t in taught] == [1, 1]  # one teacher sentence per MR
    assert half == data.teacher_items(engine, items, share=0.5, seed=3, batch_size=2, max_new_tokens=8)
    assert data.teacher_items(engine, items, share=0.0, batch_size=2, max_new_tokens=8) == items
    with pytest.raises(ValueError, match="--sequence-kd is a share"):
        training.train(training.TrainConfig(out="unused", teacher="e2e-1x", distill=0.5, sequence_kd=1.5))


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_same_adapter(tmp_path, monkeypatch):
    """A run stopped after its step-1 checkpoint and resumed ends with the very weights of the run that
    was never stopped; the adapter is saved in float16 and decodes. On the E2E data with a tiny random
    Llama that has the default model's tokenizer (what resuming depends on is the run, not the model's size;
    the tests above train the default model itself)."""
    from safetensors.torch import load_file

    from skipdecode.training import train as training
    from skipdecode.adapters.lora import read_adapter

    model = str(tiny_checkpoint(tmp_path / "tiny", layers=12))  # 12 layers: room for 3x after the warm-up

    def config(name, **kw):
        return training.TrainConfig(out=str(tmp_path / name), model=model, speedups=[3.0], rank=4, alpha=8,
                                    batch_size=2, steps=2, limit=8, validation_examples=2, checkpoint_every=1,
                                    checkpoint_dir=str(tmp_path / "checkpoints"), precision="fp32", **kw)

    training.train(config("whole"))
    with monkeypatch.context() as patch:  # keep the step-1 checkpoint, as a run killed after it would
        patch.setattr(training.shutil, "rmtree", lambda *a, **k: None)
        training.train(config("stopped"))
    summary = training.train(config("stopped", resume=True))
    assert summary["steps"] == 2 and summary["resumed_from"] == 1  # only step 2 ran again
    assert [h["step"] for h in summary["history"]] == [1, 2]  # with the record of step 1 kept
    whole, resumed = (load_file(tmp_path / n / "adapter_model.safetensors") for n in ("whole", "stopped"))
    assert whole.keys() == resumed.keys() and all(v.dtype == torch.float16 for v in whole.values())
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    engine = Engine.load(model, adapter=read_adapter(tmp_path / "whole"))
    schedule = for_speedup(3, engine.num_layers, 32)
    assert engine.generate(["name[Strada], eatType[pub]"], schedule, max_new_tokens=4).token_ids[0]


def test_training_follows_the_spread_it_is_given():
    """`--spread` reaches the schedules a run trains on (and so its adapter's record)."""
    from skipdecode.training.config import TrainConfig, schedules_for

    flat, wide = (schedules_for([3.0], 30, TrainConfig(out="", spread=s))[0] for s in (1.0, 1.5))
    assert (flat.max_budget, flat.min_budget, wide.max_budget, wide.min_budget) == (10, 10, 15, 5)


def test_an_mr_epoch_takes_one_reference_of_every_mr():
    """On the training split an epoch draws one reference per MR (reproducibly, a different one next
    epoch); groups of one give every example each epoch in the order the devset-era runs used."""
    import random

    from skipdecode.training.data import batches

    groups = [[(m, r) for r in range(8)] for m in range(12)]
    stream = batches(groups, batch_size=4, seed=5)
    epochs = [[e for _ in range(3) for e in next(stream)] for _ in range(4)]
    assert all(sorted(m for m, _ in epoch) == list(range(12)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 4
    again = batches(groups, batch_size=4, seed=5)
    assert [e for _ in range(3) for e in next(again)] == epochs[0]
    flat = list(range(10))
    order = list(range(10))
    random.Random(5).shuffle(order)
    assert [e for _, b in zip(range(2), batches([[e] for e in flat], 5, 5)) for e in b] == order


@pytest.mark.slow
def test_a_run_on_the_training_split_snapshots_each_epoch_and_validates_on_the_devset(tmp_path):
    """`--split train` (the default) trains on trainset.csv MRs, records its split (so that `eval --split dev`
    accepts it) and the steps of one MR-epoch, validates on devset MRs, and `--snapshot-every` leaves an
    adapter that decodes at each snapshot step."""
    from skipdecode.training import train as training
    from skipdecode.adapters.lora import read_adapter
    from skipdecode.evaluation.data import read_items, resolve
    from skipdecode.evaluation.evaluate import check_held_out

    config = training.TrainConfig(out=str(tmp_path / "run"), speedups=[3.0], rank=4, alpha=8, batch_size=1,
                                  steps=2, limit=2, validation_examples=1, snapshot_every=1,
                                  checkpoint_dir=str(tmp_path / "checkpoints"), precision="fp32")
    summary = training.train(config)
    refs = sum(len(item.refs) for item in read_items(resolve(None, "trainset.csv"))[:2])
    assert summary["config"]["split"] == "train" and summary["train_examples"] == refs
    assert summary["epoch_steps"] == 2  # 2 MRs, one reference each, batch 1
    snapshot = read_adapter(tmp_path / "checkpoints" / "run-snapshots" / "step-1")
    assert snapshot.meta["steps"] == 1 and snapshot.meta["snapshot"]
    check_held_out([("SkipDecode", snapshot, 3.0), ("SkipDecode", read_adapter(tmp_path / "run"), 3.0)], "dev")
    engine = Engine.load(None, adapter=snapshot)
    assert engine.generate(["name[Strada], eatType[pub]"], for_speedup(3, 30, 32), max_new_tokens=4).token_ids[0]


def test_the_student_sampler_decodes_the_adapter_as_it_stands():
    """Sequence-level unlikelihood draws the student's answers with the engine on base + LoRA delta: the same
    tokens as an engine on the merged model, before and after the LoRA weights move."""
    import copy

    from peft import LoraConfig, get_peft_model

    from skipdecode.training.own_answers import StudentSampler

    peft_model = get_peft_model(tiny_model("llama", layers=4),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]))
    sampler = StudentSampler(tiny_model("llama", layers=4), IdTokenizer(), max_new_tokens=8)
    schedule = Schedule(4, 3, 2, warmup=1, horizon=6)
    prompts = [([1, 5, 9, 33, 7], []), ([1, 40, 41], [])]

    def merged_greedy():
        merged = copy.deepcopy(peft_model).merge_and_unload()
        return Engine(merged, IdTokenizer()).generate([p for p, _ in prompts], schedule, 8).token_ids

    seen = []
    for scale in (0.0, 0.5):
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, scale)
        sampler.refresh(peft_model)
        drawn = sampler.sample(prompts, schedule)
        assert [ids for _, ids in drawn] == merged_greedy()
        assert [p for p, _ in drawn] == [p for p, _ in prompts]
        seen.append(drawn)
    assert seen[0] != seen[1]  # the second refresh took the moved weights


def test_the_students_own_batches_are_that_share_spread_evenly():
    from skipdecode.training.own_answers import is_own_batch

    assert [is_own_batch(s, 0.25) for s in range(8)] == [False, False, False, True] * 2
    assert sum(is_own_batch(s, 0.5) for s in range(600)) == 300
    assert not any(is_own_batch(s, 0.0) for s in range(50)) and all(is_own_batch(s, 1.0) for s in range(50))


@pytest.mark.parametrize("name, expected", [("NVIDIA H200", "an"), ("Tesla T4", "a"), ("AMD Instinct MI300X", "an"),
                                           ("Intel Xeon", "an"), ("GeForce RTX 4090", "a"), ("", "a")])
def test_the_card_names_a_gpu_with_the_article_its_first_sound_takes(name, expected):
    assert article(name) == expected
