"""The shared prompt-prefix cache (skipdecode/prefix.py): a hit gives a miss's bits, adapters never share
entries, the store stays within its bytes, and full and verified decoding both use and report it."""

import threading

import pytest
import torch

from conftest import IdTokenizer, tiny_model
from skipdecode.engine import Engine
from skipdecode.prefix import PREFIXES, VERIFIED_PREFIXES, PrefixCache, prefill
from skipdecode.speculative.verify import Verified, _cache

SYSTEM = [7, 31, 64, 9, 12, 250, 3, 44]  # a fixed opening every prompt shares, like a chat template's system turn


@pytest.fixture(scope="module")
def pair():
    """Two models of one shape (an adapter and another, for the store's purposes): distinct decoders."""
    return Engine(tiny_model("llama", layers=4), IdTokenizer()), Engine(tiny_model("llama", seed=3, layers=4), IdTokenizer())


def test_a_hit_gives_what_a_miss_computes(pair):
    """The prompt's keys and values and the next token's logits, with the prefix from the store and without:
    on float32 equal up to rounding (a pass of other rows may round differently; the bundled model's 4-bit
    path, the only one the store serves by default, gives the same bits: the slow test below)."""
    dec = pair[0].decoder
    store = PrefixCache(1 << 24, any_decoder=True)
    first, second = SYSTEM + [5, 6, 7], SYSTEM + [5, 6, 90, 91]
    with torch.inference_mode():
        prefill(dec, _cache(dec, 32), first, store)
        hit, miss = _cache(dec, 32), _cache(dec, 32)
        hit_logits, cached = prefill(dec, hit, second, store)
        miss_logits, none = prefill(dec, miss, second, None)
    assert cached == len(SYSTEM) + 2 and none == 0
    assert hit.lengths == miss.lengths == [len(second)] * dec.num_layers
    torch.testing.assert_close(hit.data[..., :len(second), :], miss.data[..., :len(second), :], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hit_logits, miss_logits, rtol=1e-5, atol=1e-5)
    assert not PrefixCache(1 << 24).serves(dec)  # float32: off unless asked
    with torch.inference_mode():  # the same prompt again: all but its last two tokens from the store
        again = _cache(dec, 32)
        assert prefill(dec, again, second, store)[1] == len(second) - 2


def test_full_and_verified_decoding_use_and_report_it(pair):
    engine = pair[0]
    engine.prefixes = store = PrefixCache(1 << 24, any_decoder=True)
    try:
        cold = Engine(engine.model, IdTokenizer())
        cold.prefixes = None
        for tail in ([5, 6, 7], [5, 6, 8, 9], [11, 12, 13]):
            want = cold.generate([SYSTEM + tail], None, 10)
            got = engine.generate([SYSTEM + tail], None, 10)
            assert got.token_ids == want.token_ids and want.trace.prefix_tokens == 0
        assert got.trace.prefix_tokens == len(SYSTEM) and got.to_dict()["trace"]["prefix_tokens"] == len(SYSTEM)
        run = Verified(pair[1], engine, 3, prefixes=store)  # here: the full side's store, to find its entries
        v = run.generate([SYSTEM + [5, 6, 7, 1, 2]], None, 10)
        assert v.token_ids == cold.generate([SYSTEM + [5, 6, 7, 1, 2]], None, 10).token_ids
        assert v.verification.prefix_tokens == len(SYSTEM) + 3 == v.trace.prefix_tokens
        assert v.verification.to_dict()["prefix_tokens"] == len(SYSTEM) + 3
        assert Verified(pair[1], engine, 3).prefixes is VERIFIED_PREFIXES is not PREFIXES  # by default: its own
    finally:
        engine.prefixes = None


def test_decoders_never_read_each_others_entries_under_concurrent_requests(pair):
    """Threads decode prompts sharing the opening on two decoders through one store at once; every answer
    is the one each decoder gives without a store, and each decoder's entries are its own."""
    store = PrefixCache(1 << 24, any_decoder=True)
    engines = []
    for source in pair:
        engine = Engine(source.model, IdTokenizer())
        engine.prefixes = store
        engines.append(engine)
    cold = [Engine(source.model, IdTokenizer()) for source in pair]
    for engine in cold:
        engine.prefixes = None
    prompts = [SYSTEM + [5 + i, 6, 7 + i] for i in range(6)]
    want = {(e, i): cold[e].generate([p], None, 8).token_ids for e in range(2) for i, p in enumerate(prompts)}
    assert any(want[(0, i)] != want[(1, i)] for i in range(len(prompts)))  # the two decoders differ
    got, errors = {}, []

    def work(e, i):
        try:
            got[(e, i)] = engines[e].generate([prompts[i]], None, 8).token_ids
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    for _ in range(2):  # the second time around every prompt finds its prefix stored
        threads = [threading.Thread(target=work, args=(e, i)) for e in range(2) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and got == want
    with torch.inference_mode():  # each decoder's entries are its own keys and values, not the other's
        fresh = []
        for e in range(2):
            fresh.append(_cache(engines[e].decoder, 32))
            prefill(engines[e].decoder, fresh[e], prompts[0], None)
        for e in range(2):
            m, kv = store.lookup(engines[e].decoder, prompts[0] + [1, 2])
            assert m == len(prompts[0])
            torch.testing.assert_close(kv[:, :, :, :m], fresh[e].data[:, :, 0, :, :m], rtol=1e-5, atol=1e-5)
            assert (kv[:, :, :, :m] - fresh[1 - e].data[:, :, 0, :, :m]).abs().max() > 0.1


def test_the_store_stays_within_its_bytes(pair):
    dec = pair[0].decoder
    per_token = _cache(dec, 1).nbytes
    store = PrefixCache(per_token * 40, any_decoder=True)
    with torch.inference_mode():
        for i in range(12):
            prefill(dec, _cache(dec, 32), [100 + i] + SYSTEM, store)
            assert store.bytes <= store.max_bytes
    assert len(store) == 4  # 9-token prompts, 40 tokens' room: the 4 most recent
    with torch.inference_mode():
        assert store.lookup(dec, [111] + SYSTEM + [1, 2])[0] == len(SYSTEM) + 1  # the newest is kept
        assert store.lookup(dec, [100] + SYSTEM + [1, 2])[0] == 0  # the oldest went first
        prefill(dec, _cache(dec, 32), [111] + SYSTEM + [4, 4], store)  # it extends an entry: replaces it
    assert len(store) == 4 and store.bytes <= store.max_bytes
    off = PrefixCache(0, any_decoder=True)
    with torch.inference_mode():
        prefill(dec, _cache(dec, 32), SYSTEM, off)
    assert len(off) == 0 and off.lookup(dec, SYSTEM) == (0, None)
    with pytest.raises(ValueError):
        PrefixCache(-1)


@pytest.mark.slow
def test_bundled_model_hit_equals_miss():
    """The 4-bit default on two chat prompts (the system turn shared): the second's cache and answer with
    the first's prefix stored are the bits without it."""
    engine = Engine.load(dtype="int4")
    prompts = ["What is the capital of France?", "Write one line about tea."]
    engine.prefixes = None
    want = [engine.generate([p], None, 16) for p in prompts]
    engine.prefixes = PrefixCache(1 << 26)
    assert engine.prefixes.serves(engine.decoder)
    try:
        got = [engine.generate([p], None, 16) for p in prompts]
    finally:
        engine.prefixes = None
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert got[1].trace.prefix_tokens > 20  # the system turn at least
    dec = engine.decoder
    ids = engine.encode(prompts[1])
    with torch.inference_mode():
        store = PrefixCache(1 << 26)
        prefill(dec, _cache(dec, 128), engine.encode(prompts[0]), store)
        hit, miss = _cache(dec, 128), _cache(dec, 128)
        a, m = prefill(dec, hit, ids, store)
        b, _ = prefill(dec, miss, ids, None)
    assert m > 20 and torch.equal(a, b) and torch.equal(hit.data[..., :len(ids), :], miss.data[..., :len(ids), :])
