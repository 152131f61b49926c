"""The CPU path's C kernels (skipdecode/kernels/native.py): the Q4_1 x int8 products (w4a8.c) against the same
arithmetic written in NumPy and against the float product, the file's blocks held exactly, every row's bits
whatever the batch; the float32 attention (attention.c) against float64 SDPA and row-exact under padding and
in a prefill; the library built once per cache and reused by another process; no compiler or a failed
build gives PyTorch's kernels and says why."""

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

from skipdecode.kernels import native, q4, w4a8

pytestmark = pytest.mark.skipif(native.library().lib is None, reason=f"no C kernels here: {native.library().reason}")


def random_blocks(n: int, k: int, seed: int = 0) -> q4.Q4Blocks:
    rng = np.random.default_rng(seed)
    return q4.q4_1_blocks(quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, T.Q4_1))


def reference(blocks: q4.Q4Blocks, x: torch.Tensor) -> torch.Tensor:
    """llama.cpp's Q4_1 x Q8_1 product in float64 from the kernel's own quantized activations: per block
    d_x = max|x| / 127, q_x = round-half-even(x / d_x) (float32, as the kernel), then
    sum_b d_w d_x (q_w . q_x) + m_w d_x sum(q_x)."""
    M, K = x.shape
    xb = x.view(M, K // 32, 32)
    scale = xb.abs().amax(-1) / 127
    inverse = torch.where(scale != 0, 1 / scale, torch.zeros_like(scale))
    qx = torch.round(xb * inverse[..., None]).double()  # torch.round rounds half to even, as the kernel does
    qw = blocks.codes.view(-1, K // 32, 32).double()
    dots = torch.einsum("mbi,nbi->mnb", qx, qw)
    d, m, s = blocks.d.double(), blocks.m.double(), scale.double()
    return (dots * d[None] * s[:, None] + m[None] * (s * qx.sum(-1))[:, None]).sum(-1)


def test_the_layout_holds_the_files_blocks_exactly():
    """Units of 16 rows, block by block: four runs of 64 bytes (run i: each row's codes 4i..4i+3 low, 4i+16..
    4i+19 high), then the rows' float16 d and m; rows past the last are zero blocks."""
    blocks = random_blocks(40, 96)  # 3 blocks a row; 40 rows: the third unit holds 8 rows and 8 zero rows
    packed = w4a8.layout(blocks)
    assert packed.shape == (3, 3, w4a8.UNIT) and packed.dtype == torch.uint8
    runs = packed[..., :256].view(3, 3, 4, 16, 4)  # [unit, block, run, row, byte]
    low, high = runs & 15, runs >> 4
    codes = torch.cat((low, high), dim=2).permute(0, 3, 1, 2, 4).reshape(48, 96)  # [unit * row, block * 32]
    d, m = (packed[..., at:at + 32].contiguous().view(torch.float16).transpose(1, 2).reshape(48, 3)
            for at in (256, 288))
    assert torch.equal(codes[:40], blocks.codes) and not codes[40:].any()
    assert torch.equal(d[:40].float(), blocks.d) and torch.equal(m[:40].float(), blocks.m)
    assert not d[40:].any() and not m[40:].any()


@pytest.mark.parametrize("n,k", [(96, 64), (64, 96), (576, 1536), (40, 32), (7, 64)])
def test_the_product_is_llama_cpps_arithmetic(n, k):
    blocks = random_blocks(n, k)
    x = torch.randn(5, k)
    y = w4a8.W4A8Linear.of(blocks)(x)
    expected = reference(blocks, x)
    assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    exact = x.double() @ blocks.dequantize().double().t()
    assert ((y.double() - exact).norm() / exact.norm()) < 2e-2  # int8 activations: about 7 bits a value


def test_every_row_gets_its_bits_alone():
    """Tiles of up to 16 rows, their remainders, threads and a prefill's width change nothing in a row."""
    blocks = random_blocks(200, 576)
    lin = w4a8.W4A8Linear.of(blocks)
    x = torch.randn(37, 576)
    batch = lin(x)
    for rows in (1, 2, 3, 7, 8, 9, 16, 37):
        assert torch.equal(lin(x[:rows]), batch[:rows]), rows
    assert all(torch.equal(lin(x[i:i + 1]), batch[i:i + 1]) for i in range(37))


def test_lora_rows_and_the_head():
    torch.manual_seed(0)
    blocks = random_blocks(128, 64)
    base = w4a8.W4A8Linear.of(blocks)
    a, b = torch.randn(64, 4) * 0.1, torch.randn(4, 128) * 0.1
    x = torch.randn(6, 64)
    assert torch.allclose(base.with_lora(a, b)(x), base(x) + (x @ a) @ b, rtol=1e-5, atol=1e-5)
    assert torch.equal(base.rows(32)(x), base(x)[:, 32:])  # the key/value rows of a fused matrix
    assert base.nbytes == 128 * 2 * (16 + 2 * 2)  # per row and block 16 bytes of codes, float16 d and m: 4.5 bits
    head = q4.RescoredHead(torch.randn(512, 64))
    assert isinstance(head.screen, w4a8.W4A8Linear)
    h = torch.randn(16, 64)
    assert all(torch.equal(head(h)[i:i + 1], head(h[i:i + 1])) for i in range(16))


@pytest.mark.parametrize("n,k", [(49152, 64), (320, 16), (40, 40), (37, 5)])
def test_the_heads_selection_is_torch_topks_set(n, k):
    x = torch.randn(6, n)
    x[0, :k + 3] = 7.0  # ties above the rest: any k of them
    got, expected = native.top_k(x, k, native.library().lib), x.topk(k, dim=-1).indices
    assert got.shape == (6, k) and all(len(set(row.tolist())) == k for row in got)
    assert set(got[0].tolist()) <= set(range(k + 3))
    assert all(set(a.tolist()) == set(b.tolist()) for a, b in zip(got[1:], expected[1:]))
    with pytest.raises(ValueError, match="top_k"):
        native.top_k(x, n + 1, native.library().lib)


def attention_inputs(B=2, H=9, Hkv=3, S=5, T=40, hd=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, hd, generator=g).transpose(1, 2)  # the decoder's strides
    cache = torch.randn(2, B, Hkv, 64, hd, generator=g)
    return q, cache[0][:, :, :T], cache[1][:, :, :T]


@pytest.mark.parametrize("hd", [64, 16])  # SmolLM2's heads (the vector path), and a tiny model's
def test_attention_against_float64_sdpa(hd):
    q, keys, values = attention_inputs(hd=hd)
    S, T = q.shape[2], keys.shape[2]
    allowed = torch.ones(S, T, dtype=torch.bool).tril(T - S)
    allowed = allowed[None, None].repeat(2, 1, 1, 1)
    allowed[1, :, :, :7] = False  # row 1 left-padded by 7 columns
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
    expected = F.scaled_dot_product_attention(q.double(), keys.double(), values.double(), attn_mask=mask.double(),
                                              enable_gqa=True)
    assert torch.allclose(native.attention(q, keys, values, mask).double(), expected, atol=1e-6)
    assert torch.allclose(native.attention(q, keys, values, None).double(),
                          F.scaled_dot_product_attention(q.double(), keys.double(), values.double(), enable_gqa=True),
                          atol=1e-6)


def test_attention_rows_keep_their_bits_padded_and_in_a_prefill():
    """A query decoded alone over its T columns, the same query left-padded in a wider batch, and the same
    position as a prefill's row: the same bits (the float64 detour's purpose, without float64)."""
    q, keys, values = attention_inputs(B=1, S=6, T=30)
    S, T = 6, 30
    causal = torch.zeros(S, T).masked_fill_(~torch.ones(S, T, dtype=torch.bool).tril(T - S), float("-inf"))
    prefill = native.attention(q, keys, values, causal[None, None])
    for s in range(S):
        width = T - S + s + 1
        alone = native.attention(q[:, :, s:s + 1], keys[:, :, :width], values[:, :, :width], None)
        assert torch.equal(alone, prefill[:, :, s:s + 1]), s
        pad = 11
        padded_k = torch.cat((torch.randn(1, 3, pad, 64), keys[:, :, :width]), 2)
        padded_v = torch.cat((torch.randn(1, 3, pad, 64), values[:, :, :width]), 2)
        mask = torch.zeros(1, 1, 1, pad + width)
        mask[..., :pad] = float("-inf")
        assert torch.equal(native.attention(q[:, :, s:s + 1], padded_k, padded_v, mask), alone), s


def run_python(code: str, cache, **env) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SKIPDECODE_CACHE": str(cache), **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_library_is_built_once_per_cache_and_reused(tmp_path):
    code = "from skipdecode.kernels import native; l = native.library(); print(l.built, l.isa)"
    first, second = run_python(code, tmp_path), run_python(code, tmp_path)
    assert first.startswith("True") and second.startswith("False")
    assert len(list((tmp_path / "kernels").glob("skipdecode-*.so"))) == 1


def test_no_compiler_or_a_failed_build_runs_pytorchs_kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "compiler", lambda: None)
    assert native.Library().reason == "no C compiler (install gcc or set CC)"
    monkeypatch.setenv("SKIPDECODE_CACHE", str(tmp_path))
    failed = native.Library(cc="false")  # `false --version` exits 1
    assert failed.lib is None and failed.reason.startswith("the C kernels did not build")
    monkeypatch.setattr(native, "_LIBRARY", [failed])
    assert isinstance(q4.product(random_blocks(64, 64)), q4.Int4Linear)
    assert q4.q8_why().startswith(": the C kernels did not build")
    monkeypatch.setenv(w4a8.KERNEL_ENV, "q8")
    with pytest.raises(RuntimeError, match="SKIPDECODE_KERNEL=q8: the C kernels did not build"):
        q4.product(random_blocks(64, 64))
    monkeypatch.setenv(w4a8.KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match="SKIPDECODE_KERNEL must be one of auto, q8, bf16"):
        w4a8.setting()


def test_bf16_asks_for_pytorchs_kernel(monkeypatch):
    monkeypatch.setenv(w4a8.KERNEL_ENV, "bf16")
    assert isinstance(q4.product(random_blocks(64, 64)), q4.Int4Linear)
    assert q4.q8_why() == ": SKIPDECODE_KERNEL=bf16"


def test_a_tiny_llama_on_the_c_kernels_decodes_each_row_as_alone_and_scores_what_it_decodes():
    """The engine on the int8 kernel and the C attention: left-padded rows of a batch decode the tokens they
    decode alone (full depth and a SkipDecode schedule), and the teacher-forced pass (the page's scores)
    picks the tokens decoding chose."""
    from conftest import BATCH, tiny_int4

    from skipdecode.schedule import Schedule

    engine = tiny_int4(c_kernels=True)
    assert engine.decoder.attention_kernel is native.attention
    for policy in (Schedule(6, 6, 3, warmup=1, horizon=12), None):
        batch = engine.generate(BATCH, policy, max_new_tokens=12, stop_at_eos=False).token_ids
        assert [engine.generate([row], policy, max_new_tokens=12, stop_at_eos=False).token_ids[0]
                for row in BATCH] == batch
    for row, answer in zip(BATCH, batch):  # full depth's answers
        h = engine.hidden_states(torch.tensor([row + answer]))[-1][0, len(row) - 1:-1]
        assert engine.decoder.logits(h).argmax(-1).tolist() == answer


def adapted_tiny_llama(rank: int = 4):
    """The tiny Llama on the C kernels with a random LoRA term on every product (as a served adapter has)."""
    from conftest import tiny_int4

    engine = tiny_int4(c_kernels=True)
    g = torch.Generator().manual_seed(1)
    blocks = [tuple(lin.with_lora(torch.randn(lin.in_features, rank, generator=g) * 0.1,
                                  torch.randn(rank, lin.out_features, generator=g) * 0.1) for lin in layer)
              for layer in engine.decoder.weights.blocks]
    weights = q4.GGUFWeights(blocks, engine.decoder.lm_head, "int4 (tiny, adapted)", attention=native.attention)
    return type(engine)(engine.model, engine.tokenizer, weights=weights)


def layer_inputs(dec, B=3, S=5, width=16, start=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, dec.embed_tokens.shape[1], generator=g)
    positions = torch.arange(start, start + S).expand(B, S)
    cache = torch.randn(2, B, dec.num_kv_heads, width, dec.head_dim, generator=g)
    allowed = torch.ones(B, S, width, dtype=torch.bool).tril(start)
    allowed[1, :, :2] = False  # row 1 left-padded by 2 columns
    return x, dec.rope(positions, limit=width), dec.attention_bias(allowed)[:, None, :, :start + S], cache


def test_the_fused_layer_is_the_layer_of_per_product_calls():
    """layer.c (norms, RoPE, cache write, attention, residuals, SiLU * up, LoRA terms, one quantization a
    product input) against the same layer in PyTorch around the same products: equal within the int8
    activations' rounding, the cache's new columns likewise, the columns outside them untouched."""
    dec = adapted_tiny_llama().decoder
    assert dec.fused is not None and dec.fused.layers[0].down.rank == 4
    x, rope, mask, cache = layer_inputs(dec)
    fused_cache, eager_cache = cache.clone(), cache.clone()
    fused = dec.block(1, x, rope, mask, *fused_cache, 4)
    eager = dec._layer(dec.blocks[1], x, rope, mask, *eager_cache, 4)
    assert ((fused - eager).norm() / (eager - x).norm()) < 2e-2
    assert torch.allclose(fused_cache[:, :, :, 4:9], eager_cache[:, :, :, 4:9], atol=3e-2)
    assert torch.equal(fused_cache[:, :, :, :4], cache[:, :, :, :4]) and torch.equal(fused_cache[..., 9:, :], cache[..., 9:, :])
    assert torch.equal(x, layer_inputs(dec)[0])  # the input is not written


def test_the_fused_layer_keeps_every_rows_bits():
    """A row alone, a row in a left-padded batch, a prefill's row and one position at a time: the same bits.
    And the layers of a position in one call equal the layers one call each; the graphed step's tensor column
    equals the integer column."""
    dec = adapted_tiny_llama().decoder
    x, rope, mask, cache = layer_inputs(dec)
    batch_cache = cache.clone()
    batch = dec.block(2, x, rope, mask, *batch_cache, 4)
    for b in range(3):
        alone_cache = cache[:, b:b + 1].clone()
        alone = dec.block(2, x[b:b + 1], (rope[0][b:b + 1], rope[1][b:b + 1]), mask[b:b + 1], *alone_cache, 4)
        assert torch.equal(alone, batch[b:b + 1]) and torch.equal(alone_cache, batch_cache[:, b:b + 1])
        steps_cache = cache[:, b:b + 1].clone()
        for s in range(5):  # one position at a time, each seeing the columns written before it
            one = dec.block(2, x[b:b + 1, s:s + 1], (rope[0][b:b + 1, s:s + 1], rope[1][b:b + 1, s:s + 1]),
                            mask[b:b + 1, :, s:s + 1, :5 + s], *steps_cache, 4 + s)
            assert torch.equal(one, batch[b:b + 1, s:s + 1]), (b, s)
    from skipdecode.cache import KVCache

    first = KVCache(dec.num_layers, 3, dec.num_kv_heads, 16, dec.head_dim, "cpu", torch.float32)
    second = KVCache(dec.num_layers, 3, dec.num_kv_heads, 16, dec.head_dim, "cpu", torch.float32)
    first.data.copy_(torch.randn_like(first.data)), second.data.copy_(first.data)
    first.lengths, second.lengths = [4] * dec.num_layers, [4] * dec.num_layers
    one_call = dec.run_layers([0, 2, 5], x, rope, mask, first, 4)
    y = x
    for layer in (0, 2, 5):
        y = dec.block(layer, y, rope, mask, *second.claim(layer, 4, 5), 4)
    assert torch.equal(one_call, y) and torch.equal(first.data, second.data) and first.lengths == second.lengths
    with pytest.raises(RuntimeError, match="layer 1 holds 4 positions but is asked to run at column 9"):
        dec.run_layers([0, 1], x, rope, mask, first, 9)  # layer 1 did not run at columns 4..8: a grown budget
    column_cache = cache.clone()
    graphed = dec.block(2, x[:, :1], (rope[0][:, :1], rope[1][:, :1]), mask[:, :, :1], *column_cache, torch.tensor([4]))
    assert torch.equal(graphed, dec.block(2, x[:, :1], (rope[0][:, :1], rope[1][:, :1]), mask[:, :, :1], *cache.clone(), 4))


def test_the_lora_terms_skip_only_rows_of_zeros_and_keep_their_bits():
    """A fused matrix's LoRA b is block-diagonal: layer.c skips, per 64 outputs, the rank rows that are zero
    there (native.lora_spans). The layer's bits are those of summing over every rank row."""
    dec = adapted_tiny_llama(rank=4).decoder
    for block in dec.blocks:
        for lin in (block.qkv, block.out, block.up, block.down):
            b = lin.lora[1]
            b[:2, :native.SPAN] = 0  # the first 64 outputs read rank rows 2..3, the others rows 0..1
            b[2:, native.SPAN:] = 0
    spans = native.lora_spans(dec.blocks[0].up.lora[1])
    assert dec.blocks[0].up.out_features > native.SPAN and spans[0].tolist() == [2, 4]
    assert spans[1:].tolist() == [[0, 2]] * (len(spans) - 1)
    assert native.lora_spans(torch.zeros(3, 70)).tolist() == [[0, 0], [0, 0]]
    dec.fused = native.Layers(dec, dec.fused.lib)
    x, rope, mask, cache = layer_inputs(dec)
    skipping = dec.block(1, x, rope, mask, *cache.clone(), 4)
    every = []
    for layer in dec.fused.layers:  # the same layer summing over every rank row
        for product in (layer.qkv, layer.out, layer.up, layer.down):
            every.append(torch.tensor([[0, product.rank]] * -(-product.n // native.SPAN), dtype=torch.int32))
            product.spans = every[-1].data_ptr()
    assert torch.equal(skipping, dec.block(1, x, rope, mask, *cache.clone(), 4))


@pytest.mark.parametrize("extra,isa", [(("-mno-avx512f",), None), (("-mno-avx512f", "-mno-avxvnni"), "AVX2")])
def test_the_avx2_builds_keep_the_arithmetic_and_every_rows_bits(extra, isa, tmp_path, monkeypatch):
    """The forms a CPU without AVX-512 (or without VNNI) runs, built here with those instructions turned off:
    the same arithmetic within float32 rounding, and every row's bits alone and in a batch."""
    monkeypatch.setenv("SKIPDECODE_CACHE", str(tmp_path))
    built = native.Library(extra=extra)
    assert built.lib is not None, built.reason
    assert built.isa in ({"AVX2", "AVX-VNNI"} if isa is None else {isa})
    blocks = random_blocks(200, 576)
    lin = w4a8.W4A8Linear(w4a8.layout(blocks), 200, 576, lib=built.lib)
    x = torch.randn(19, 576)
    y = lin(x)
    expected = reference(blocks, x)
    assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    assert all(torch.equal(lin(x[i:i + 1]), y[i:i + 1]) for i in range(19))
    assert torch.equal(y, w4a8.W4A8Linear.of(blocks)(x))  # each lane runs the AVX-512 form's operations
    monkeypatch.setattr(native, "_LIBRARY", [built])  # the fused layers on this build: every row as alone
    dec = adapted_tiny_llama().decoder
    inputs, rope, mask, cache = layer_inputs(dec)
    batch = dec.block(1, inputs, rope, mask, *cache.clone(), 4)
    assert all(torch.equal(dec.block(1, inputs[b:b + 1], (rope[0][b:b + 1], rope[1][b:b + 1]), mask[b:b + 1],
                                     *cache[:, b:b + 1].clone(), 4), batch[b:b + 1]) for b in range(3))
    q, keys, values = attention_inputs(B=1, S=4, T=20)
    causal = torch.zeros(4, 20).masked_fill_(~torch.ones(4, 20, dtype=torch.bool).tril(16), float("-inf"))
    prefill = native.attention(q, keys, values, causal[None, None], lib=built)
    expected = F.scaled_dot_product_attention(q.double(), keys.double(), values.double(),
                                              attn_mask=causal[None, None].double(), enable_gqa=True)
    assert torch.allclose(prefill.double(), expected, atol=1e-6)
    for s in range(4):
        alone = native.attention(q[:, :, s:s + 1], keys[:, :, :17 + s], values[:, :, :17 + s], None, lib=built)
        assert torch.equal(alone, prefill[:, :, s:s + 1])



def test_the_ctypes_structs_are_the_c_structs_field_by_field():
    """Each struct of kernels.h has one ctypes class in native.py (STRUCTS) with the compiler's size, fields
    and offsets (layout.c reports them): a field added, moved or resized on one side only fails here."""
    lib = native.library().lib
    for struct in native.STRUCTS:
        name = struct.__name__.encode()
        assert lib.layout(name, b"") == ctypes.sizeof(struct), struct.__name__
        assert lib.layout_fields(name) == len(struct._fields_), struct.__name__
        for field, kind in struct._fields_:
            assert lib.layout(name, field.encode()) == getattr(struct, field).offset, (struct.__name__, field)
            assert getattr(struct, field).size == ctypes.sizeof(kind)
    assert lib.layout(b"Call", b"cache") == -1 and lib.layout(b"Nothing", b"") == -1


def test_a_kernel_refuses_sizes_it_does_not_take():
    """The Tensor descriptors carry shapes: keys and values of other strides, or a head dimension that is not
    contiguous, are refused (ValueError), not read out of bounds."""
    q, keys, values = attention_inputs(B=1, S=2, T=10)
    lib = native.library().lib
    out = torch.empty_like(q)
    assert lib.attention(*(native.Tensor.of(t) for t in (q, keys, values[:, :, :9])), native.Tensor(),
                         native.Tensor.of(out)) == native.SHAPES
    assert lib.attention(*(native.Tensor.of(t) for t in (q.transpose(2, 3), keys, values)), native.Tensor(),
                         native.Tensor.of(out.transpose(2, 3))) == native.SHAPES
    with pytest.raises(ValueError, match="float32"):
        native.Tensor.of(q.double())


def test_the_layers_scratch_is_kept_between_calls_and_changes_no_bit(monkeypatch):
    """layer.c cuts a call's scratch from the buffer its Layers keeps (grown to what a call needs, up to
    WORK_KEPT): the same bits as scratch allocated for the call, whatever the buffer held before; a call
    needing more than WORK_KEPT allocates its own; calls from two threads at once each get scratch of their own."""
    import threading

    dec = adapted_tiny_llama().decoder
    x, rope, mask, cache = layer_inputs(dec)
    fused = dec.fused
    fresh = dec.block(1, x, rope, mask, *cache.clone(), 4)  # the first call: nothing kept yet, its own scratch
    assert fused.work.numel() > 0
    fused.work.fill_(255)  # NaNs in every float it holds
    assert torch.equal(dec.block(1, x, rope, mask, *cache.clone(), 4), fresh)
    kept = fused.work
    assert torch.equal(dec.block(1, x[:1], (rope[0][:1], rope[1][:1]), mask[:1], *cache[:, :1].clone(), 4), fresh[:1])
    assert fused.work is kept  # fewer rows: the same buffer
    monkeypatch.setattr(native, "WORK_KEPT", 0)
    fused.work = torch.empty(0, dtype=torch.uint8)
    assert torch.equal(dec.block(1, x, rope, mask, *cache.clone(), 4), fresh) and fused.work.numel() == 0
    monkeypatch.undo()
    got = {}

    def run(name, rows):
        for _ in range(20):
            got.setdefault(name, []).append(dec.block(1, x[rows], (rope[0][rows], rope[1][rows]), mask[rows],
                                                      *cache[:, rows].clone(), 4))

    threads = [threading.Thread(target=run, args=(name, rows)) for name, rows in (("all", slice(0, 3)),
                                                                                   ("last", slice(2, 3)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(y, fresh) for y in got["all"]) and all(torch.equal(y, fresh[2:]) for y in got["last"])


def test_the_kernels_sources_and_header_ship_with_the_package_and_the_space():
    """Every file the library builds from (native.SOURCES and HEADERS) is in the wheel's package data and in
    what scripts/publish_space.py sends: a Space or an installed package builds the same library."""
    import fnmatch
    import tomllib
    from pathlib import Path

    from test_publish_space import publish_space

    root = Path(native.__file__).resolve().parents[2]
    files = [p.relative_to(root).as_posix() for p in (*native.SOURCES, *native.HEADERS)]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert native.__package__ in setuptools["packages"]
    package = setuptools["package-data"][native.__package__]  # the package the loader looks in (its own folder)
    assert all(Path(f).parent.as_posix() == native.__package__.replace(".", "/") for f in files)
    assert all(any(fnmatch.fnmatch(Path(f).name, pattern) for pattern in package) for f in files), package
    sent = {f.path for f in publish_space.space_files()}
    assert set(files) <= sent


def test_the_shipped_build_compiles_the_timing_switches_away():
    """timing.h's switches (-DTILE, -DQ8_INTEGER_ONLY, -DLAYER_TIMES) are the experiments' own: the library's
    build sets none, so its layers carry no phase timer (layer_times is not even defined)."""
    assert native.Path(native.__file__).with_name("timing.h") in native.HEADERS  # a change to it builds anew
    assert not any(flag.startswith(("-DTILE", "-DQ8_INTEGER_ONLY", "-DLAYER_TIMES")) for flag in native.FLAGS)
    assert not hasattr(native.library().lib, "layer_times")
