"""Beam search (skipdecode/beam.py): transformers' search, token for token, on SkipDecode's batches."""

import pytest
import torch

from conftest import DEVICE, IdTokenizer, tiny_model
from skipdecode.beam import Beam, BeamSearch
from skipdecode.engine import Engine
from skipdecode.schedule import Schedule

PROMPTS = [[1, 17, 43, 99, 5], [1, 250, 7], [1, 3, 3, 8, 120, 64, 31]]


def reference(model, prompts, width, tokens, eos, length_penalty=1.0):
    """transformers' generate(num_beams=width) on the left-padded batch: each prompt's generated ids,
    cut after its first EOS (the rest is padding)."""
    P = max(map(len, prompts))
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts], device=DEVICE)
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts], device=DEVICE)
    out = model.generate(input_ids=ids, attention_mask=mask, num_beams=width, do_sample=False,
                         max_new_tokens=tokens, eos_token_id=eos, pad_token_id=0, length_penalty=length_penalty)
    rows = []
    for row in out[:, P:].tolist():
        cut = next((i for i, t in enumerate(row) if t in eos), None)
        rows.append(row if cut is None else row[: cut + 1])
    return rows


def eos_seen_mid_way(engine, prompts, tokens):
    """A token that greedy decoding produces part-way through, to serve as EOS: the search then finishes
    hypotheses at different lengths, the case where a beam search differs from greedy most."""
    ids = engine.generate(prompts, None, tokens, stop_at_eos=False).token_ids
    return [ids[0][tokens // 2]]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("width,length_penalty", [(3, 1.0), (4, 0.6)])
def test_full_depth_beams_equal_transformers(kind, width, length_penalty):
    model = tiny_model(kind)
    engine = Engine(model, IdTokenizer())
    eos = eos_seen_mid_way(engine, PROMPTS, 12)
    engine.eos_ids = eos
    got = engine.generate(PROMPTS, None, 12, beam=Beam(width, length_penalty)).token_ids
    assert got == reference(model, PROMPTS, width, 12, eos, length_penalty)
    assert got != engine.generate(PROMPTS, None, 12).token_ids  # the search chose something greedy did not


def test_width_one_is_greedy_decoding():
    engine = Engine(tiny_model("llama"), IdTokenizer())
    assert engine.generate(PROMPTS, None, 10, beam=Beam(1)).token_ids == engine.generate(PROMPTS, None, 10).token_ids


def test_skipdecode_beams_reorder_whole_rows_of_the_cache():
    """At 3x every beam of a prompt runs the same layers, so a beam takes over another beam's cache row
    whole. Checked against a search that recomputes each beam from scratch (no cache to reorder): the
    same beams, so the reordered cache held exactly what each beam's own history would have put there."""
    engine = Engine(tiny_model("llama", layers=6), IdTokenizer())
    schedule = Schedule(6, 4, 2, warmup=1, horizon=4)
    eos = eos_seen_mid_way(engine, PROMPTS, 10)
    engine.eos_ids = eos
    width, tokens = 3, 10
    got = engine.generate(PROMPTS, schedule, tokens, beam=Beam(width)).token_ids
    assert got == recomputed_search(engine, PROMPTS, schedule, width, tokens)
    on = Engine(engine.model, IdTokenizer())
    on.eos_ids, on.graphs = eos, "on"  # the static (graphed) step, uncaptured on a CPU: its cache is reordered in place
    assert on.generate(PROMPTS, schedule, tokens, beam=Beam(width)).token_ids == got


def recomputed_search(engine, prompts, schedule, width, tokens):
    """The same search, each step's logits from decoding every running beam again from its prompt
    (a fresh cache, nothing reordered)."""
    search = BeamSearch(Beam(width), len(prompts), engine.eos_ids, tokens, DEVICE)
    while not search.done:
        logits = []
        for p, prompt in enumerate(prompts):
            for beam in search.running[p]:
                logits.append(step_logits(engine, prompt + beam, len(beam), schedule))
        search.step(torch.stack(logits))
    return [search.best(p) for p in range(len(prompts))]


def step_logits(engine, ids, generated, schedule):
    """Logits after `ids`, of which the last `generated` were generated under `schedule`."""
    dec, L = engine.decoder, engine.num_layers
    from skipdecode.cache import KVCache

    cache = KVCache(L, 1, dec.num_kv_heads, len(ids), dec.head_dim, dec.device, dec.dtype)
    P = len(ids) - generated
    with torch.inference_mode():
        positions = torch.arange(P, device=dec.device)[None]
        mask = dec.attention_bias(torch.ones(P, P, dtype=torch.bool, device=dec.device).tril())[None, None]
        x, rope = dec.embed(torch.tensor([ids[:P]], device=dec.device), positions), dec.rope(positions)
        for layer in range(L):
            x = dec.block(layer, x, rope, mask, *cache.claim(layer, 0, P), 0)
        for step in range(generated):
            column = P + step
            position = torch.tensor([[column]], device=dec.device)
            x = dec.embed(torch.tensor([[ids[column]]], device=dec.device), position)
            rope = dec.rope(position)
            for layer in schedule.layers(step):
                x = dec.block(layer, x, rope, None, *cache.claim(layer, column, 1), column)
        return dec.logits(x[:, -1])[0]


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="beam width"):
        Beam(0)
    with pytest.raises(ValueError, match="beam width"):
        Beam(2.5)
    with pytest.raises(ValueError, match="length_penalty"):
        Beam(4, float("nan"))


def test_generate_command_searches_with_beams(capsys):
    import json

    from skipdecode.adapters.lora import find_adapter, trained_schedule
    from skipdecode.cli import main

    prompt = "name[The Eagle], eatType[pub], area[riverside]"
    assert main(["generate", "--prompt", prompt, "--speedup", "3", "--max-new-tokens", "12", "--beams", "3",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["outputs"][0]
    engine = Engine.load(adapter="e2e-all")
    schedule = trained_schedule(find_adapter("e2e-all"), 3, engine.num_layers, None, None)
    assert out["token_ids"] == engine.generate([prompt], schedule, 12, beam=Beam(3)).token_ids[0]
    assert main(["generate", "--prompt", prompt, "--beams", "3", "--temperature", "0.7"]) == 2
    assert "does not sample" in capsys.readouterr().err
