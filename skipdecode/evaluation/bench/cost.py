"""What a decode step costs, for `skipdecode bench`: the cost-model bound and the weight-streaming floor.

The cost model counts work in multiply-accumulates per generated token. For the matrix products that is
also the number of weights a token touches, which is what a small batch on a CPU pays for:
    embedding           d                              (one row read)
    each layer it runs  its norm, attention and MLP weights
                        + 2 x heads x head_dim x context   (attention scores and weighted sum over the cache)
    final norm, LM head d + vocab x d                  (SmolLM2-135M: the tied head is ~1/5 of a token's weights)
bound = work per token at full depth / work per token under the method, summed over the decode steps.
A 3x schedule (a third of the layers) cannot give 3x: the head and embedding stay. efficiency =
measured decode speedup / bound. The per-token peer's own work adds the keys and values it must still
compute for the layers above its exit (and an LM head per checked layer with the "softmax" measure).

The weight-streaming floor: a decode step cannot be faster than reading what it needs from memory once:
the weights the batch runs (each row's embedding row, the layers, the key/value rows of the layers only
filled, the heads) plus each row's cached keys and values in the layers it runs, in the bytes the decoder
actually holds them in (`Reads`: each product's `.nbytes`, so 4-bit weights count their codes and scales),
over the read bandwidth `torch.sum` reaches on a tensor of the model's weight size in the same run
(timing.read_bandwidth, once per round, round-robin with the cases; the best round counts: a floor is a
limit). floor_ms_per_token = those bytes / that bandwidth, averaged over the decode steps; vs_floor =
measured ms per token / floor (1.0 would be a step that only streams its weights).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    """Multiply-accumulates per token, from the decoder's own weight shapes."""

    embedding: int
    layer: int  # weights of one layer (norms, attention projections, MLP)
    kv_only: int  # what `Decoder.fill_kv` touches: the first norm and the key/value rows
    head: int  # final norm and LM head
    attention_width: int  # heads x head_dim: MACs per cached column, for scores and again for values
    kv_width: int = 0  # key/value heads x head_dim: cached elements read per column, for keys and for values

    @classmethod
    def of(cls, dec) -> "CostModel":
        block = dec.blocks[0]
        norms = sum(t.numel() for norm in (block.norm1, block.norm2) for t in norm if t is not None)
        layer = norms + sum(outputs * inputs for outputs, inputs in map(_shape, (block.qkv, block.out, block.up,
                                                                                  block.down)))
        kv_rows = _shape(block.qkv)[1] * 2 * dec.kv_size
        d = dec.embed_tokens.shape[1]
        head = _shape(dec.lm_head)
        return cls(embedding=d, layer=layer, kv_only=block.norm1[0].numel() + kv_rows,
                   head=head[0] * head[1] + d, attention_width=dec.q_size, kv_width=dec.kv_size)

    def token(self, layers: int, context: int, kv_only: int = 0, heads: int = 1) -> int:
        """Work for one token that runs `layers` layers over `context` cached columns."""
        attention = 2 * self.attention_width * context
        return self.embedding + layers * (self.layer + attention) + kv_only * self.kv_only + heads * self.head

    def bound(self, num_layers: int, prompt: int, per_step) -> float:
        """Full-depth work over the decode steps / the method's work. `per_step` lists, for each decode
        step, the tokens' (layers, kv_only, heads) triples."""
        full = method = 0
        for step, tokens in enumerate(per_step):
            context = prompt + step + 1
            full += len(tokens) * self.token(num_layers, context)
            method += sum(self.token(layers, context, kv, heads) for layers, kv, heads in tokens)
        return full / method

    def reads(self, element_bytes: int = 1) -> "Reads":
        """What a step reads if every weight and cached element took `element_bytes` (a dense decoder in
        one dtype; `Reads.of` counts a decoder's real bytes)."""
        return Reads(*(n * element_bytes for n in (self.embedding, self.layer, self.kv_only, self.head,
                                                    2 * self.kv_width)))


def _shape(product) -> tuple[int, int]:
    """(outputs, inputs) of a product, whatever holds its weights: a dense matrix (transformer.Linear), the
    GGUF's 4-bit blocks (q4.Int4Linear) or the 4-bit screened head (q4.RescoredHead, its exact rows)."""
    if hasattr(product, "out_features"):
        return product.out_features, product.in_features
    weight = product.exact if hasattr(product, "exact") else product.weight
    return tuple(weight.shape)


@dataclass(frozen=True)
class Reads:
    """What a decode step reads from memory, part by part, in bytes as the decoder holds its weights
    (`of`): each product's own `.nbytes` (a dense float32 weight 4 bytes an element; a 4-bit one its codes
    and their scales), the norms, one embedding row a token and the cached keys and values in the cache's
    dtype. The floor is these bytes over the read bandwidth; MACs (`CostModel`) do not see a weight's
    format, the floor must."""

    embedding: int  # one row
    layer: int  # norms and the four products of a layer (the mean over the layers)
    kv_only: int  # what `Decoder.fill_kv` reads: the first norm and the key/value rows of the fused product
    head: int  # final norm and LM head, in the head's own format
    cache_column: int  # one cached column of one layer and one row: its keys and values

    @classmethod
    def of(cls, dec) -> "Reads":
        from ...cache import cache_dtype

        size = lambda *tensors: sum(t.numel() * t.element_size() for t in tensors if t is not None)  # noqa: E731
        layers = [size(*b.norm1, *b.norm2) + sum(lin.nbytes for lin in (b.qkv, b.out, b.up, b.down))
                  for b in dec.blocks]
        block = dec.blocks[0]
        # the key/value rows' share of the fused query/key/value product: every row of it takes the same bytes
        kv_rows = block.qkv.nbytes * 2 * dec.kv_size // (dec.q_size + 2 * dec.kv_size)
        cache = cache_dtype(dec.dtype, dec.device).itemsize
        return cls(embedding=size(dec.embed_tokens[0]), layer=round(sum(layers) / len(layers)),
                   kv_only=size(block.norm1[0]) + kv_rows, head=dec.lm_head.nbytes + size(*dec.final_norm),
                   cache_column=2 * dec.kv_size * cache)

    def step(self, layers: int, context: int, rows: int = 1, kv_only: int = 0, heads: int = 1) -> int:
        """What one decode step of `rows` rows reads: the weights, once for the whole batch, and each row's
        embedding row and cached keys and values over `context` columns in the `layers` it runs."""
        cache = rows * layers * self.cache_column * context
        return rows * self.embedding + layers * self.layer + kv_only * self.kv_only + heads * self.head + cache

    def weights(self, num_layers: int) -> int:
        """The bytes of a full-depth token's weights (the size of the bandwidth probe)."""
        return num_layers * self.layer + self.head

    def floor_ms(self, prompt: int, per_step, bytes_per_s: float) -> float:
        """The weight-streaming floor: mean ms per decode step to read `step` at `bytes_per_s`. `per_step`
        as for `CostModel.bound`; the batch runs its deepest row's layers, fills the keys and values of the
        layers above them and checks as many heads as its busiest row."""
        total = sum(self.step(max(t[0] for t in tokens), prompt + step + 1, len(tokens),
                              min(t[1] for t in tokens), max(t[2] for t in tokens))
                    for step, tokens in enumerate(per_step))
        return 1000.0 * total / bytes_per_s / len(per_step)


def schedule_steps(schedule, steps: int, rows: int = 1):
    return [[(schedule.budget(s), 0, 1)] * rows for s in range(steps)]


def trace_steps(trace, heads_per_layer: bool = False):
    """Per decode step, each row's (layers, kv_only, heads) as it ran, from a peer's trace."""
    out = []
    for record in trace.steps:
        exits = getattr(record, "exits", None) or (record.budget,) * record.rows
        L = trace.num_layers
        out.append([(e, L - e, e if heads_per_layer else 1) for e in exits])
    return out
