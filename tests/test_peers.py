"""The per-token early-exit peer (CALM-style): exact when it never exits, no holes in the cache when it
does, rows independent of their batch, and calibration to a layer budget."""

import pytest
import torch

from conftest import PROMPTS
from skipdecode.evaluation.peers import EarlyExit, average_token_layers, calibrate
from skipdecode.schedule import Schedule

NEW = 16


@pytest.fixture(scope="module")
def ids(engine):
    return [engine.encode(p) for p in PROMPTS]


def test_peer_that_never_exits_is_full_decoding(engine, ids):
    L = engine.num_layers
    full = engine.generate(ids, max_new_tokens=NEW, stop_at_eos=False)
    peer = engine.generate(ids, EarlyExit(L, threshold=2.0), max_new_tokens=NEW, stop_at_eos=False)
    assert peer.token_ids == full.token_ids
    assert peer.trace.cache_lengths == full.trace.cache_lengths
    assert all(r.exits == (L,) * len(ids) and r.budget == L and r.skipped == () for r in peer.trace.steps)
    assert average_token_layers(peer.trace) == L


def test_exited_rows_still_fill_the_deeper_layers_caches(engine, ids):
    """Every row leaves after `e` layers: the tokens are those of the early-exit ablation (layers [0, e),
    then the head), but unlike the ablation every deeper layer holds every position: no holes."""
    L, e = engine.num_layers, 6
    peer = engine.generate(ids, EarlyExit(L, threshold=-2.0, min_layers=e), max_new_tokens=NEW, stop_at_eos=False)
    ablation = engine.generate(ids, Schedule(L, e, e, warmup=0, horizon=1, mode="early_exit"),
                               max_new_tokens=NEW, stop_at_eos=False)
    assert peer.token_ids == ablation.token_ids
    P, steps = peer.trace.prompt_tokens, len(peer.trace.steps)
    assert peer.trace.cache_lengths == [P + steps] * L
    assert ablation.trace.cache_lengths[e:] == [P] * (L - e)  # what the ablation leaves behind
    for record in peer.trace.steps:
        assert record.exits == (e,) * len(ids)
        assert record.layers == tuple(range(e)) and record.skipped == tuple(range(e, L))


def test_fill_kv_writes_what_the_block_writes(engine):
    """The copied-state keys and values come from the key/value rows alone, identical to a full block's."""
    dec = engine.decoder
    torch.manual_seed(0)
    x = torch.randn(2, 1, dec.embed_tokens.shape[1]).to(dec.device) * 3
    positions = torch.tensor([[5], [9]], device=dec.device)
    rope = dec.rope(positions)
    shape = (2, dec.num_kv_heads, 8, dec.head_dim)
    for layer in (0, 17, dec.num_layers - 1):
        block_kv = torch.zeros(shape, device=dec.device), torch.zeros(shape, device=dec.device)
        fill_kv = torch.full(shape, 7.0, device=dec.device), torch.full(shape, 7.0, device=dec.device)
        with torch.inference_mode():
            dec.block(layer, x, rope, None, *block_kv, 3)
            dec.fill_kv(layer, x, rope, *fill_kv, 3)
        for got, want in zip(fill_kv, block_kv):
            torch.testing.assert_close(got[:, :, 3], want[:, :, 3], rtol=1e-5, atol=1e-5)
            assert (got[:, :, :3] == 7).all() and (got[:, :, 4:] == 7).all()  # nothing else written
            assert want[:, :, 3].abs().sum() > 0


def test_rows_exit_on_their_own_and_the_batch_waits_for_the_slowest(engine, ids):
    peer = EarlyExit(engine.num_layers, threshold=0.97)
    batch = engine.generate(ids, peer, max_new_tokens=NEW, stop_at_eos=False)
    records = batch.trace.steps
    assert any(len(set(r.exits)) > 1 for r in records), "rows should leave at different layers"
    for r in records:
        assert r.budget == max(r.exits) and r.layers == tuple(range(r.budget))
    assert batch.trace.average_layers > average_token_layers(batch.trace)  # the price of waiting
    for i, prompt_ids in enumerate(ids):  # a row's exits and tokens do not depend on its batch
        alone = engine.generate([prompt_ids], peer, max_new_tokens=NEW, stop_at_eos=False)
        assert alone.token_ids[0] == batch.token_ids[i]
        assert [r.exits[0] for r in alone.trace.steps] == [r.exits[i] for r in records]


def test_calibration_reaches_the_layer_budget(engine, ids):
    peer, reached = calibrate(engine, ids[:2], 12.0, max_new_tokens=8, tolerance=1.0)
    assert abs(reached - 12.0) <= 1.0
    again = engine.generate(ids[:2], peer, max_new_tokens=8, stop_at_eos=False)
    assert average_token_layers(again.trace) == pytest.approx(reached)


def test_bad_peer_parameters_raise():
    with pytest.raises(ValueError, match="measure"):
        EarlyExit(30, 0.9, measure="entropy")
    with pytest.raises(ValueError, match="min_layers"):
        EarlyExit(30, 0.9, min_layers=31)
    with pytest.raises(ValueError, match="threshold"):
        EarlyExit(30, float("nan"))
