"""The decoder math in plain PyTorch, on the weights of a Hugging Face model.

Calling Hugging Face's decoder layers one by one costs more in Python and framework overhead than a
small model's matrix products take, so the engine runs its own blocks (gpt-fast style): one pre-norm
block covers the Llama family (RMSNorm, RoPE, grouped-query attention, SwiGLU), OPT and GPT-2 (LayerNorm,
learned positions, plain MLP). Norm weights and embeddings are shared with the Hugging Face model; the
matrices are fused (query/key/value, gate/up) and, on a CPU, repacked for oneDNN once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .cache import cache_dtype
from .models import check_architecture

ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
PACK_ROWS = 16  # oneDNN weight layout tuned for products of up to a batch of 16 rows


class Linear:
    """y = x W^T + b. On a CPU with oneDNN the weight is repacked once into its blocked layout, which
    streams a decoding step's weights about twice as fast as the plain BLAS path for products of a few
    rows (`skipdecode bench` shows the effect); elsewhere it is F.linear."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool):
        self.weight, self.bias = weight, bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS) if pack else None

    @property
    def nbytes(self) -> int:
        """Bytes one product reads: the weight in its dtype and the bias (the benchmark's weight-streaming
        floor sums these; a quantized linear counts its codes and scales instead)."""
        return sum(t.numel() * t.element_size() for t in (self.weight, self.bias) if t is not None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def rows(self, start: int) -> "Linear":
        """The outputs from `start` on, as a linear of their own."""
        return Linear(self.weight[start:], None if self.bias is None else self.bias[start:], self.packed is not None)


def lora_term(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y + (x a) b for rows x [M, K], each row's bits those of the row alone. A float32 matmul of 4 rows or
    more takes another kernel than one row (its sums run in another order), so a row in a batch, a prefill's
    row or a verify pass's row would part from the one-row decode step at near ties (verified decoding found
    59 of 630 E2E answers parting so). As M one-row products in one batched call they cannot."""
    if x.shape[0] == 1:
        return torch.addmm(y, x @ a, b)
    M = x.shape[0]
    xa = torch.bmm(x[:, None, :], a.expand(M, -1, -1))
    return torch.baddbmm(y[:, None, :], xa, b.expand(M, -1, -1))[:, 0]


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packs float32 on any x86 CPU, bfloat16 only where it has the instructions for it (AVX-512
    BW/VL/DQ or AVX-NE-CONVERT): elsewhere, an AMD EPYC without AVX-512 for one, bfloat16 runs F.linear."""
    if not (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass
class Block:
    """One decoder layer. `up` holds gate and up stacked when the MLP is gated."""

    norm1: tuple[torch.Tensor, torch.Tensor | None]
    qkv: Linear
    out: Linear
    norm2: tuple[torch.Tensor, torch.Tensor | None]
    up: Linear
    down: Linear


class Decoder:
    """Embedding, L blocks, final norm and LM head, each callable on its own so that a schedule can
    choose which blocks a position runs."""

    def __init__(self, hf_model: torch.nn.Module, pack: bool | None = None, weights=None):
        """`weights`: the matrices from elsewhere (skipdecode/kernels/q4.py's GGUF blocks, `GGUFWeights`) instead of
        the model's own; the model still gives the norms, embeddings, RoPE and configuration."""
        config = hf_model.config
        self.family = check_architecture(config)
        self.embed_tokens = hf_model.get_input_embeddings().weight.detach()
        self.device, self.dtype = self.embed_tokens.device, self.embed_tokens.dtype
        self.pack = can_pack(self.device, self.dtype) if pack is None else pack
        self.weights = weights
        # Attention in float64 on the 4-bit path: padding moves a row's keys along the vector lanes, so the
        # float32 sums over keys round differently in a batch than alone (and a prefill's rows differently
        # than a decode step's), and the next product's bfloat16 inputs turn a last-bit difference into a
        # visible one; float64 sums round back to the same float32. Row-by-row float32 attention was tried
        # instead (docs/research/cpu-4bit-kernels.md, "What is left after the products"): faster decoding at
        # batch 1, slower prefills and batches.
        self.attention_dtype = torch.float64 if weights is not None else None
        # ... unless the weights bring a row-exact float32 attention (skipdecode/kernels/attention.c, beside the int8
        # kernel's products): the same bits alone and in a batch without the float64 detour.
        self.attention_kernel = getattr(weights, "attention", None)
        if weights is not None and self.family != "llama":
            raise ValueError("GGUF weights run the llama family only")
        with torch.no_grad():  # fused weights must not carry autograd history
            layers = {"llama": self._llama, "opt": self._opt, "gpt2": self._gpt2}[self.family](hf_model, config)
            if weights is None:
                self.blocks = [
                    Block(n1, self._linear(*qkv), self._linear(*out), n2, self._linear(*up), self._linear(*down))
                    for n1, qkv, out, n2, up, down in layers
                ]
                self.lm_head = self._linear(*_wb(hf_model.get_output_embeddings()))
            else:
                self.blocks = [Block(n1, qkv, out, n2, up, down)
                               for (n1, n2), (qkv, out, up, down) in zip(layers, weights.blocks)]
                self.lm_head = weights.head
        self.num_layers = len(self.blocks)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.gqa = self.num_heads != self.num_kv_heads
        self._rope_table = None
        self._kv_only: list[Linear] | None = None
        # Every layer in one native call where the weights are the int8 kernel's (skipdecode/kernels/layer.c)
        self.fused = weights.fused_layers(self) if weights is not None and self.family == "llama" else None

    @property
    def weights_label(self) -> str:
        """Which weights and activations run, in words the bench header and the page show."""
        return self.weights.label if self.weights is not None else str(self.dtype).removeprefix("torch.")

    def _linear(self, weight, bias):
        return Linear(weight, bias, self.pack)

    # ---- what differs between families: weight names, norms, positions, activation ------------
    def _llama(self, hf, c):
        m = hf.model
        self.num_heads, self.num_kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.norm, self.eps, self.gated, self.act = "rms", c.rms_norm_eps, True, ACTIVATIONS[c.hidden_act]
        self.max_positions = c.max_position_embeddings
        self.embed_positions, self.position_offset, self.rotary = None, 0, m.rotary_emb
        self.final_norm = _wb(m.norm)
        if self.weights is not None:  # the norms only: the matrices come from `weights`, the model's stay unread
            return [(_wb(l.input_layernorm), _wb(l.post_attention_layernorm)) for l in m.layers]
        return [(_wb(l.input_layernorm), _cat(l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj),
                 _wb(l.self_attn.o_proj), _wb(l.post_attention_layernorm),
                 _cat(l.mlp.gate_proj, l.mlp.up_proj), _wb(l.mlp.down_proj)) for l in m.layers]

    def _opt(self, hf, c):
        m = hf.model.decoder
        if not c.do_layer_norm_before or m.project_in is not None or m.final_layer_norm is None:
            raise ValueError("OPT models with post-layer-norm or projected embeddings (opt-350m) are not supported")
        self.num_heads = self.num_kv_heads = c.num_attention_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.norm, self.eps, self.gated, self.act = "layer", 1e-5, False, ACTIVATIONS[c.activation_function]
        self.max_positions = c.max_position_embeddings
        self.embed_positions, self.rotary = m.embed_positions.weight.detach(), None
        self.position_offset = m.embed_positions.offset
        self.final_norm = _wb(m.final_layer_norm)
        return [(_wb(l.self_attn_layer_norm), _cat(l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj),
                 _wb(l.self_attn.out_proj), _wb(l.final_layer_norm), _wb(l.fc1), _wb(l.fc2)) for l in m.layers]

    def _gpt2(self, hf, c):
        m = hf.transformer
        if c.scale_attn_by_inverse_layer_idx or getattr(c, "add_cross_attention", False):
            raise ValueError("GPT-2 variants with per-layer attention scaling or cross-attention are not supported")
        self.num_heads = self.num_kv_heads = c.n_head
        self.head_dim = c.n_embd // c.n_head
        self.norm, self.eps, self.gated, self.act = "layer", c.layer_norm_epsilon, False, ACTIVATIONS[c.activation_function]
        self.max_positions = c.n_positions
        self.embed_positions, self.position_offset, self.rotary = m.wpe.weight.detach(), 0, None
        self.final_norm = _wb(m.ln_f)
        conv = lambda mod: (mod.weight.detach().t().contiguous(), mod.bias.detach())  # noqa: E731 (Conv1D: W stored transposed)
        return [(_wb(h.ln_1), conv(h.attn.c_attn), conv(h.attn.c_proj), _wb(h.ln_2), conv(h.mlp.c_fc),
                 conv(h.mlp.c_proj)) for h in m.h]

    # ---- the math -----------------------------------------------------------------------------
    def _norm(self, x, weight_bias):
        weight, bias = weight_bias
        if self.norm == "rms":
            return F.rms_norm(x, (x.shape[-1],), weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), weight, bias, self.eps)

    def rope(self, positions: torch.Tensor, limit: int | None = None):
        """cos and signed sin (see `_rotate`) for positions [B, S], shaped [B, S, 1, head_dim] to broadcast
        over heads. `limit`, one past the largest position the caller will ask for, spares reading the
        positions back to the host."""
        if self.rotary is None:
            return None
        need = int(positions.max()) + 1 if limit is None else limit
        if self._rope_table is None or self._rope_table[0].shape[0] < need:
            # a table of positions, made by the model's own rotary module (any rope scaling included)
            size = min(self.max_positions, max(1024, 1 << (need - 1).bit_length()))
            cos, sin = self.rotary(self.embed_tokens, torch.arange(size, device=self.device)[None])
            half = self.head_dim // 2
            self._rope_table = (cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1))
        cos, sin = self._rope_table
        return cos[positions].unsqueeze(2), sin[positions].unsqueeze(2)

    def attention_bias(self, allowed: torch.Tensor) -> torch.Tensor:
        """A boolean mask (True = may attend) as the additive mask SDPA uses, made once per generation."""
        bias = torch.zeros(allowed.shape, dtype=cache_dtype(self.dtype, self.device), device=self.device)
        return bias.masked_fill_(~allowed, float("-inf"))

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = F.embedding(tokens, self.embed_tokens)
        if self.embed_positions is not None:
            x = x + F.embedding(positions + self.position_offset, self.embed_positions)
        return x

    def block(self, layer: int, x, rope, mask, keys: torch.Tensor, values: torch.Tensor, start):
        """Run layer `layer` on x [B, S, d] at cache columns [start, start + S): write its keys and
        values there and attend over columns [0, start + S) under the additive `mask` [B, 1, S, start + S]
        (None: every column). A `start` given as a one-element tensor is the graphed decode step's form
        (skipdecode/kernels/cuda_graphs.py): one column, written where the tensor says, and the cache's whole width
        attended under a mask that hides the columns after it, so that no shape depends on the position."""
        if self.fused is not None:
            if values.stride() != keys.stride():
                raise ValueError("keys and values must share their strides")
            return self.fused.forward((layer,), x, rope, mask, keys, start, (values.data_ptr() - keys.data_ptr()) // 4, 0)
        return self._layer(self.blocks[layer], x, rope, mask, keys, values, start)

    def run_layers(self, layers: Sequence[int], x, rope, mask, cache, start: int):
        """`block` for each of `layers` in turn at cache columns [start, start + S) of `cache` (cache.KVCache):
        one native call for them all where the layers are fused (a SkipDecode position's layers)."""
        if self.fused is None:
            return _each_layer(self, layers, x, rope, mask, cache, start)
        end, lengths = start + x.shape[1], cache.lengths
        if end > cache.max_len or any(lengths[layer] != start for layer in layers):
            for layer in layers:
                cache.claim(layer, start, x.shape[1])  # raises, saying why
        for layer in layers:  # what claim records, without the views it returns
            lengths[layer] = end
        data = cache.data  # [layer, key/value, row, head, column, dim]
        return self.fused.forward(layers, x, rope, mask, data[0, 0], start, data.stride(1), data.stride(0))

    def hidden_states(self, ids: torch.Tensor, ran: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Every position's hidden state after each layer (index 0: the embeddings) for unpadded rows ids
        [B, T], in one causal pass layer by layer. `ran[l]`: how many leading columns run layer l (None: all,
        full depth); the columns past it keep their state through the layer. The one pass over given ids,
        so that scoring (Engine.hidden_states: a batch at full depth) and the lens (skipdecode/lens.py: one
        sequence under a schedule) read the same numbers decoding computes."""
        ids = ids.to(self.device)
        B, T = ids.shape
        positions = torch.arange(T, device=self.device).expand(B, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril().expand(B, T, T)
        mask, rope = self.attention_bias(causal)[:, None], self.rope(positions, limit=T)
        kv_dtype = cache_dtype(self.dtype, self.device)
        states = [self.embed(ids, positions)]
        for layer in range(self.num_layers):
            x, k = states[-1], T if ran is None else ran[layer]
            if k == 0:
                states.append(x)
                continue
            keys = torch.empty(B, self.num_kv_heads, k, self.head_dim, dtype=kv_dtype, device=self.device)
            part_rope = None if rope is None else (rope[0][:, :k], rope[1][:, :k])
            out = self.block(layer, x[:, :k], part_rope, mask[..., :k, :k], keys, torch.empty_like(keys), 0)
            states.append(out if k == T else torch.cat([out, x[:, k:]], dim=1))
        return states

    def _layer(self, w: Block, x, rope, mask, keys, values, start):
        B, S, _ = x.shape
        H, Hkv = self.num_heads, self.num_kv_heads
        qkv = w.qkv(self._norm(x, w.norm1)).view(B, S, H + 2 * Hkv, self.head_dim)
        qk = self._rotate(qkv[:, :, : H + Hkv], rope)  # queries and keys rotated in one go
        if isinstance(start, torch.Tensor):
            keys.index_copy_(2, start, qk[:, :, H:].transpose(1, 2).to(keys.dtype))
            values.index_copy_(2, start, qkv[:, :, H + Hkv:].transpose(1, 2).to(values.dtype))
        else:
            end = start + S
            keys[:, :, start:end] = qk[:, :, H:].transpose(1, 2)
            values[:, :, start:end] = qkv[:, :, H + Hkv:].transpose(1, 2)
            keys, values = keys[:, :, :end], values[:, :, :end]
        attn = self._attend(qk[:, :, :H].transpose(1, 2), keys, values, mask)
        x = x + w.out(attn.transpose(1, 2).reshape(B, S, self.q_size).to(x.dtype))
        h = w.up(self._norm(x, w.norm2)).to(x.dtype)  # a 4-bit product's bfloat16 widened for the activation
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return x + w.down(h)

    def _attend(self, q, keys, values, mask):
        """Attention of q [B, H, S, hd] over keys and values [B, Hkv, T, hd] under the additive mask
        [B, 1, S, T] (None: every column), in `attention_dtype` where one is set, else in the cache's dtype
        (see cache_dtype); returned in the cache's dtype."""
        if self.attention_kernel is not None:
            return self.attention_kernel(q, keys, values, mask)
        wide = self.attention_dtype or keys.dtype
        attn = F.scaled_dot_product_attention(q.to(wide), keys.to(wide), values.to(wide),
                                              attn_mask=None if mask is None else mask.to(wide), enable_gqa=self.gqa)
        return attn.to(keys.dtype)

    def fill_kv(self, layer: int, x, rope, keys: torch.Tensor, values: torch.Tensor, start: int) -> None:
        """Only the keys and values of layer `layer` for x [B, S, d], written at columns [start, start + S).
        Per-token early exit needs this (CALM's state copying): a token that left the network below this
        layer still owes later tokens its keys and values here, made from its copied hidden state."""
        w = self.blocks[layer]
        if self._kv_only is None:  # the key/value rows of the fused matrices, packed on first use
            self._kv_only = [b.qkv.rows(self.q_size) for b in self.blocks]
        B, S, _ = x.shape
        kv = self._kv_only[layer](self._norm(x, w.norm1)).view(B, S, 2 * self.num_kv_heads, self.head_dim)
        keys[:, :, start:start + S] = self._rotate(kv[:, :, : self.num_kv_heads], rope).transpose(1, 2)
        values[:, :, start:start + S] = kv[:, :, self.num_kv_heads:].transpose(1, 2)

    @staticmethod
    def _rotate(t, rope):
        """RoPE on t [B, S, heads, head_dim]: t cos + rotate_half(t) sin, where rotate_half(t) = (-t2, t1)
        for the halves t1, t2, computed as (t2, t1) (one roll) times the sin whose first half is negated
        (made once with the table): the same products, so the same values, in fewer operations."""
        if rope is None:
            return t
        cos, signed_sin = rope
        return t * cos + t.roll(t.shape[-1] // 2, -1) * signed_sin

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self._norm(x, self.final_norm))


def run_layers(dec, layers: Sequence[int], x, rope, mask, cache, start: int):
    """`layers` in turn at cache columns [start, start + S) of `cache`, for any decoder: a Decoder's own
    run_layers (one native call where its layers are fused), another's (a static step's graphs,
    skipdecode/kernels/cuda_graphs.py) layer by layer."""
    if isinstance(dec, Decoder):
        return dec.run_layers(layers, x, rope, mask, cache, start)
    return _each_layer(dec, layers, x, rope, mask, cache, start)


def _each_layer(dec, layers: Sequence[int], x, rope, mask, cache, start: int):
    for layer in layers:
        x = dec.block(layer, x, rope, mask, *cache.claim(layer, start, x.shape[1]), start)
    return x


def _wb(module):
    bias = getattr(module, "bias", None)
    return module.weight.detach(), None if bias is None else bias.detach()


def _cat(*linears):
    """The linears' weights stacked into one matrix (biases likewise). The Hugging Face modules then read
    their rows of it as views, so the model and the decoder share one copy instead of holding two."""
    weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    _share_rows(weight, linears, "weight")
    if all(lin.bias is None for lin in linears):
        return weight, None
    bias = torch.cat([lin.bias.detach() if lin.bias is not None else weight.new_zeros(lin.weight.shape[0])
                      for lin in linears])
    _share_rows(bias, linears, "bias")
    return weight, bias


def _share_rows(stacked: torch.Tensor, linears, name: str) -> None:
    """Point each linear's `name` parameter at its rows of `stacked` (a missing bias keeps its zero rows)."""
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        if getattr(lin, name) is not None:
            getattr(lin, name).data = stacked[start:start + rows]
        start += rows
