"""The engine against transformers' own generate, batched against alone, and its KV bookkeeping."""

import collections

import pytest
import torch

from conftest import PROMPTS, IdTokenizer, tiny_model
from skipdecode.engine import Engine
from skipdecode.sampling import Sampling
from skipdecode.schedule import Schedule, for_speedup


def hf_greedy(model, batch_ids, max_new_tokens, pad_id, eos_ids):
    """transformers' generate on a left-padded batch; each row cut after its first EOS."""
    width = max(len(ids) for ids in batch_ids)
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in batch_ids])
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch_ids])
    input_ids, attention = input_ids.to(model.device), attention.to(model.device)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_ids)
    rows = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        rows.append(row[:cut])
    return rows


def test_full_depth_matches_generate_one_prompt(engine):
    ids = [engine.encode(PROMPTS[0])]
    ours = engine.generate(ids, max_new_tokens=64)
    assert ours.token_ids == hf_greedy(engine.model, ids, 64, engine.pad_id, engine.eos_ids)
    assert len(ours.token_ids[0]) > 10


def test_full_depth_matches_generate_left_padded_batch(engine):
    ids = [engine.encode(p) for p in PROMPTS]
    assert len({len(i) for i in ids}) == 3, "prompts must differ in length to exercise left padding"
    ours = engine.generate(ids, max_new_tokens=64)
    assert ours.token_ids == hf_greedy(engine.model, ids, 64, engine.pad_id, engine.eos_ids)


@pytest.mark.parametrize("speedup", [1, 3])
def test_batched_equals_alone(engine, speedup):
    schedule = for_speedup(speedup, engine.num_layers, horizon=48)
    batch = engine.generate(PROMPTS, schedule, max_new_tokens=48)
    for i, prompt in enumerate(PROMPTS):
        alone = engine.generate([prompt], schedule, max_new_tokens=48)
        assert alone.token_ids[0] == batch.token_ids[i]


def count_layer_calls(engine):
    calls = collections.Counter()
    block = engine.decoder.block

    def counting(layer, *args):
        calls[layer] += 1
        return block(layer, *args)

    engine.decoder.block = counting
    return calls


@pytest.mark.parametrize("mode", ["skip", "early_exit"])
def test_layer_calls_and_cache_lengths_follow_schedule(engine, mode):
    schedule = Schedule(engine.num_layers, 20, 5, warmup=2, horizon=20, mode=mode)
    calls = count_layer_calls(engine)
    engine.graphs = "off"  # counts the decoder's calls; a CUDA graph replays its layers without calling it
    try:
        result = engine.generate(PROMPTS[:2], schedule, max_new_tokens=32, stop_at_eos=False)
    finally:
        del engine.decoder.block  # back to the class method
        engine.graphs = "auto"
    trace = result.trace
    steps = len(trace.steps)
    assert steps == 31  # the first token comes from the prefill
    assert sum(calls.values()) == engine.num_layers + sum(schedule.budget(s) for s in range(steps))
    assert trace.layer_calls == sum(calls.values())
    for layer in range(engine.num_layers):
        ran = [s for s in range(steps) if layer in schedule.layers(s)]
        assert calls[layer] == 1 + len(ran)
        # the layer's cache is the prompt plus exactly the positions where it ran, a prefix of the steps
        assert trace.cache_lengths[layer] == trace.prompt_tokens + len(ran)
        assert ran == list(range(len(ran)))
    for record in trace.steps:
        assert record.layers == schedule.layers(record.step)
        assert sorted(record.layers + record.skipped) == list(range(engine.num_layers))
        top = engine.num_layers - 1
        assert (top in record.layers) == (mode == "skip")


def test_skip_runs_warmup_and_top_layers(engine):
    schedule = for_speedup(3, engine.num_layers, horizon=16, warmup=2)
    trace = engine.generate([PROMPTS[0]], schedule, max_new_tokens=16, stop_at_eos=False).trace
    for record in trace.steps:
        b = record.budget
        assert record.layers == (0, 1) + tuple(range(engine.num_layers - (b - 2), engine.num_layers))
    assert trace.average_layers < engine.num_layers / 2


def test_growing_budget_is_refused(engine):
    """A schedule whose budget grows would need keys the cache does not hold; the cache refuses."""

    class Growing(Schedule):
        def layers(self, step):
            return tuple(range(self.num_layers)) if step >= 2 else (0, self.num_layers - 1)

    growing = Growing(engine.num_layers, engine.num_layers, engine.num_layers)
    with pytest.raises(RuntimeError, match="recomputation"):
        engine.generate([PROMPTS[0]], growing, max_new_tokens=8, stop_at_eos=False)


def test_finished_rows_are_compacted(engine):
    short = "Answer with one word: yes or no. Is the sky blue?"
    engine.graphs = "off"  # the eager step compacts; a graphed step keeps its batch (tests/test_graphs.py)
    try:
        result = engine.generate([short, PROMPTS[0]], max_new_tokens=64)
    finally:
        engine.graphs = "auto"
    lengths = [len(ids) for ids in result.token_ids]
    assert lengths[0] < lengths[1]
    rows = [s.rows for s in result.trace.steps]
    assert rows[0] == 2 and rows[-1] == 1  # the short row stopped costing compute
    assert result.token_ids[0][-1] in engine.eos_ids


def test_sampling_is_seeded_and_streams(engine):
    sampling = Sampling(temperature=0.8, top_k=50, top_p=0.9, seed=7)
    seen = []
    a = engine.generate(PROMPTS[:2], max_new_tokens=12, sampling=sampling,
                        on_step=lambda g: seen.append(sum(map(len, g.token_ids))))
    b = engine.generate(PROMPTS[:2], max_new_tokens=12, sampling=sampling)
    c = engine.generate(PROMPTS[:2], max_new_tokens=12, sampling=Sampling(temperature=0.8, seed=8))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    assert seen == sorted(seen) and len(seen) >= 2 and seen[-1] == sum(map(len, a.token_ids))


def test_trace_frame_and_json(engine):
    import json

    result = engine.generate([PROMPTS[1]], for_speedup(2, engine.num_layers, horizon=8), max_new_tokens=8,
                             stop_at_eos=False)
    frame = result.trace.to_frame()
    assert list(frame.columns[:6]) == ["step", "budget", "layers", "skipped", "ms", "rows"]
    assert len(frame) == 7 and (frame["ms"] > 0).all()
    assert frame["budget"].is_monotonic_decreasing
    data = json.loads(result.trace.to_json())
    assert data["steps"][0]["layers"] == list(result.trace.steps[0].layers)
    assert data["generated_tokens"] == 8 and data["prefill_ms"] > 0


def test_bad_inputs_raise(engine):
    with pytest.raises(ValueError, match="empty"):
        engine.generate(["   "])
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([PROMPTS[0]], max_new_tokens=0)
    with pytest.raises(ValueError, match="context"):
        engine.generate([PROMPTS[0]], max_new_tokens=10_000)
    with pytest.raises(ValueError, match="layers"):
        engine.generate([PROMPTS[0]], Schedule.full(12))


@pytest.mark.parametrize("kind", ["opt", "gpt2", "llama", "qwen2", "mistral"])
def test_tiny_models_match_their_generate(kind):
    model = tiny_model(kind)
    engine = Engine(model, IdTokenizer())
    assert engine.eos_ids == [2]
    batch = [[1, 17, 43, 99, 5], [1, 250, 7], [1, 8, 9, 10, 11, 12, 13, 14]]
    want = hf_greedy(model, batch, 20, 0, [2])
    assert engine.generate(batch, max_new_tokens=20).token_ids == want
    assert engine.generate(batch[:1], max_new_tokens=20).token_ids == want[:1]
    # and a skip schedule runs through the same loop
    skipped = engine.generate(batch, Schedule(4, 4, 2, warmup=1, horizon=5), max_new_tokens=12, stop_at_eos=False)
    assert [s.budget for s in skipped.trace.steps][-1] == 2


def test_rope_is_transformers_rotation_exactly():
    """`Decoder._rotate` (one roll, a signed sin made once) gives the very values of transformers' own RoPE."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from skipdecode.transformer import Decoder

    model = tiny_model("llama")
    dec = Decoder(model)
    positions = torch.tensor([[0, 1, 2, 7], [3, 4, 5, 6]], device=model.device)
    q, k = torch.randn(2, 2, 4, 16, device=model.device), torch.randn(2, 2, 4, 16, device=model.device)  # [B, heads, S, head_dim] as transformers has them
    cos, sin = model.model.rotary_emb(q, positions)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    rope = dec.rope(positions)
    assert torch.equal(dec._rotate(q.transpose(1, 2), rope).transpose(1, 2), want_q)
    assert torch.equal(dec._rotate(k.transpose(1, 2), rope).transpose(1, 2), want_k)


def test_bfloat16_on_cpu_keeps_keys_and_values_in_float32():
    from skipdecode.cache import KVCache, cache_dtype
    from skipdecode.evaluation.peers import EarlyExit

    assert cache_dtype(torch.bfloat16, torch.device("cpu")) == torch.float32
    assert cache_dtype(torch.float32, torch.device("cpu")) == torch.float32
    assert cache_dtype(torch.bfloat16, torch.device("cuda")) == torch.bfloat16
    assert KVCache(2, 1, 2, 8, 16, "cpu", torch.bfloat16).data.dtype == torch.float32
    engine = Engine(tiny_model("llama").to(torch.bfloat16), IdTokenizer())
    batch = [[1, 17, 43, 99, 5], [1, 250, 7]]  # left padding: the masks are made in the cache's dtype
    for policy in (None, Schedule(4, 4, 2, warmup=1, horizon=5), EarlyExit(4, 0.5)):
        out = engine.generate(batch, policy, max_new_tokens=6, stop_at_eos=False)
        assert [len(ids) for ids in out.token_ids] == [6, 6]
