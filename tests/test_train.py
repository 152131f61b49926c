"""Skip-aware training follows exactly the layer plan of decoding, and it learns."""

import pytest
import torch

from conftest import PROMPTS, IdTokenizer, tiny_model
from skipdecode.engine import Engine
from skipdecode.schedule import Schedule, for_speedup
from skipdecode.train import SkipLM, collate, layer_plan


def greedy_then_teacher_force(engine, model, prompt_ids, schedule, new_tokens):
    result = engine.generate([prompt_ids], schedule, max_new_tokens=new_tokens, stop_at_eos=False)
    target = result.token_ids[0]
    input_ids, lengths, labels, prompt_lens, fed_back = collate([(prompt_ids, target)], pad_id=0)
    runs = layer_plan(schedule, prompt_lens, fed_back, input_ids.shape[1])
    with torch.no_grad():
        hidden = SkipLM(model).hidden(input_ids, lengths, runs)
        predicted = SkipLM(model).lm_head(hidden[labels >= 0]).argmax(-1).tolist()
    return result, runs, target, predicted


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


def test_a_few_steps_lower_the_loss():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(tiny_model("llama", layers=4),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"]))
    lm = SkipLM(model)
    examples = [([1, 10 + i, 20 + i, 30], [40 + i, 50 + i, 60 + i, 2]) for i in range(8)]
    input_ids, lengths, labels, prompt_lens, fed_back = collate(examples, pad_id=0)
    runs = layer_plan(Schedule(4, 4, 2, warmup=1, horizon=3), prompt_lens, fed_back, input_ids.shape[1])
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=5e-3)
    losses = []
    for _ in range(12):
        loss = lm(input_ids, lengths, runs, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_same_adapter(tmp_path, monkeypatch):
    """A run stopped after its step-1 checkpoint and resumed ends with the very weights of the run that
    was never stopped; the adapter is saved in float16 and decodes."""
    from safetensors.torch import load_file

    from skipdecode import train as training
    from skipdecode.adapters import read_adapter

    def config(name, **kw):
        return training.TrainConfig(out=str(tmp_path / name), speedups=[3.0], rank=4, alpha=8, batch_size=2,
                                    steps=2, limit=8, validation_examples=2, checkpoint_every=1,
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
    engine = Engine.load(None, adapter=read_adapter(tmp_path / "whole"))
    assert engine.generate(["name[Strada], eatType[pub]"], for_speedup(3, 30, 32), max_new_tokens=4).token_ids[0]
