"""The decoder math in plain PyTorch, on the weights of a Hugging Face model.

Calling Hugging Face's decoder layers one by one costs more in Python and framework overhead than a
small model's matrix products take, so the engine runs its own blocks (gpt-fast style): one pre-norm
block covers the Llama family (RMSNorm, RoPE, grouped-query attention, SwiGLU), OPT and GPT-2 (LayerNorm,
learned positions, plain MLP). Weights are shared with the Hugging Face model, except the fused
query/key/value and gate/up matrices, which are concatenated once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .models import check_architecture

ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclass
class Block:
    """One decoder layer's weights. `up` holds gate and up stacked when the MLP is gated."""

    norm1: tuple[torch.Tensor, torch.Tensor | None]
    qkv: tuple[torch.Tensor, torch.Tensor | None]
    out: tuple[torch.Tensor, torch.Tensor | None]
    norm2: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]


class Decoder:
    """Embedding, L blocks, final norm and LM head, each callable on its own so that a schedule can
    choose which blocks a position runs."""

    def __init__(self, hf_model: torch.nn.Module):
        config = hf_model.config
        self.family = check_architecture(config)
        self.config = config
        build = {"llama": self._from_llama, "opt": self._from_opt, "gpt2": self._from_gpt2}[self.family]
        with torch.no_grad():  # concatenated weights must not carry autograd history
            build(hf_model)
        self.num_layers = len(self.blocks)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.gqa = self.num_heads != self.num_kv_heads
        self.device, self.dtype = self.embed_tokens.device, self.embed_tokens.dtype

    # ---- weights from each family -------------------------------------------------------------
    def _from_llama(self, hf):
        c, m = self.config, hf.model
        self.num_heads, self.num_kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.norm, self.eps, self.gated = "rms", c.rms_norm_eps, True
        self.act = ACTIVATIONS[c.hidden_act]
        self.max_positions = c.max_position_embeddings
        self.embed_tokens, self.embed_positions, self.position_offset = m.embed_tokens.weight.detach(), None, 0
        self.rotary = m.rotary_emb
        self.blocks = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.blocks.append(Block(
                norm1=(layer.input_layernorm.weight.detach(), None),
                qkv=_cat(a.q_proj, a.k_proj, a.v_proj),
                out=_wb(a.o_proj),
                norm2=(layer.post_attention_layernorm.weight.detach(), None),
                up=_cat(mlp.gate_proj, mlp.up_proj),
                down=_wb(mlp.down_proj),
            ))
        self.final_norm = (m.norm.weight.detach(), None)
        self.lm_head = _wb(hf.lm_head)

    def _from_opt(self, hf):
        c, m = self.config, hf.model.decoder
        if not c.do_layer_norm_before or m.project_in is not None or m.final_layer_norm is None:
            raise ValueError("OPT models with post-layer-norm or projected embeddings (opt-350m) are not supported")
        self.num_heads = self.num_kv_heads = c.num_attention_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.norm, self.eps, self.gated = "layer", 1e-5, False
        self.act = ACTIVATIONS[c.activation_function]
        self.max_positions = c.max_position_embeddings
        self.embed_tokens, self.embed_positions = m.embed_tokens.weight.detach(), m.embed_positions.weight.detach()
        self.position_offset, self.rotary = m.embed_positions.offset, None
        self.blocks = []
        for layer in m.layers:
            a = layer.self_attn
            self.blocks.append(Block(
                norm1=_wb(layer.self_attn_layer_norm),
                qkv=_cat(a.q_proj, a.k_proj, a.v_proj),
                out=_wb(a.out_proj),
                norm2=_wb(layer.final_layer_norm),
                up=_wb(layer.fc1),
                down=_wb(layer.fc2),
            ))
        self.final_norm = _wb(m.final_layer_norm)
        self.lm_head = _wb(hf.lm_head)

    def _from_gpt2(self, hf):
        c, m = self.config, hf.transformer
        if c.scale_attn_by_inverse_layer_idx or getattr(c, "add_cross_attention", False):
            raise ValueError("GPT-2 variants with per-layer attention scaling or cross-attention are not supported")
        self.num_heads = self.num_kv_heads = c.n_head
        self.head_dim = c.n_embd // c.n_head
        self.norm, self.eps, self.gated = "layer", c.layer_norm_epsilon, False
        self.act = ACTIVATIONS[c.activation_function]
        self.max_positions = c.n_positions
        self.embed_tokens, self.embed_positions = m.wte.weight.detach(), m.wpe.weight.detach()
        self.position_offset, self.rotary = 0, None
        conv = lambda mod: (mod.weight.detach().t().contiguous(), mod.bias.detach())  # noqa: E731 (Conv1D stores W transposed)
        self.blocks = [
            Block(norm1=_wb(h.ln_1), qkv=conv(h.attn.c_attn), out=conv(h.attn.c_proj),
                  norm2=_wb(h.ln_2), up=conv(h.mlp.c_fc), down=conv(h.mlp.c_proj))
            for h in m.h
        ]
        self.final_norm = _wb(m.ln_f)
        self.lm_head = _wb(hf.lm_head)

    # ---- the math -----------------------------------------------------------------------------
    def _norm(self, x, weight_bias):
        weight, bias = weight_bias
        if self.norm == "rms":
            return F.rms_norm(x, (x.shape[-1],), weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), weight, bias, self.eps)

    def rope(self, positions: torch.Tensor):
        """cos/sin for positions [B, S], shaped to broadcast over heads; None without rotary."""
        if self.rotary is None:
            return None
        cos, sin = self.rotary(self.embed_tokens, positions)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = F.embedding(tokens, self.embed_tokens)
        if self.embed_positions is not None:
            x = x + F.embedding(positions + self.position_offset, self.embed_positions)
        return x

    def block(self, layer: int, x, rope, mask, keys: torch.Tensor, values: torch.Tensor, start: int):
        """Run layer `layer` on x [B, S, d] at cache columns [start, start + S): write its keys and
        values there and attend over columns [0, start + S) under `mask` [B, 1, S, start + S]."""
        w = self.blocks[layer]
        B, S, _ = x.shape
        qkv = F.linear(self._norm(x, w.norm1), *w.qkv)
        q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = q.view(B, S, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, S, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        end = start + S
        keys[:, :, start:end] = k
        values[:, :, start:end] = v.view(B, S, self.num_kv_heads, self.head_dim).transpose(1, 2)
        attn = F.scaled_dot_product_attention(
            q, keys[:, :, :end], values[:, :, :end], attn_mask=mask, enable_gqa=self.gqa
        )
        x = x + F.linear(attn.transpose(1, 2).reshape(B, S, self.q_size), *w.out)
        h = F.linear(self._norm(x, w.norm2), *w.up)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return x + F.linear(h, *w.down)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._norm(x, self.final_norm), *self.lm_head)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _wb(module):
    bias = getattr(module, "bias", None)
    return module.weight.detach(), None if bias is None else bias.detach()


def _cat(*linears):
    weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    biases = [None if lin.bias is None else lin.bias.detach() for lin in linears]
    if all(b is None for b in biases):
        return weight, None
    bias = torch.cat([b if b is not None else weight.new_zeros(lin.weight.shape[0]) for lin, b in zip(linears, biases)])
    return weight, bias
