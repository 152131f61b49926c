"""A static KV cache in which layer l holds exactly the positions where layer l ran.

Under a non-increasing budget the positions a layer ran at form a prefix of the sequence, so one length
per layer describes the whole cache, and a layer asked to run at a column it has not reached yet is a
broken schedule: `claim` refuses it instead of attending over a hole.

A bfloat16 model on a CPU keeps its keys and values in float32 (`cache_dtype`): the values are the same
(bfloat16 widens exactly), and attention over them runs float32 kernels, which at one query per row are
several times faster on a CPU than the bfloat16 ones (`skipdecode bench --dtype bfloat16` measures it).
"""

from __future__ import annotations

import torch


def cache_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype keys, values and attention use for a model in `dtype` on `device`."""
    return torch.float32 if dtype == torch.bfloat16 and torch.device(device).type == "cpu" else dtype


class KVCache:
    def __init__(self, num_layers, batch, num_kv_heads, max_len, head_dim, device, dtype):
        # One allocation for the whole generation: [layer, key/value, row, head, column, dim].
        self.data = torch.empty(num_layers, 2, batch, num_kv_heads, max_len, head_dim, device=device,
                                dtype=cache_dtype(dtype, device))
        self.lengths = [0] * num_layers
        self.max_len = max_len

    def claim(self, layer: int, start: int, count: int):
        """Keys and values of `layer` for writing `count` new columns at `start`."""
        if self.lengths[layer] != start:
            raise RuntimeError(
                f"layer {layer} holds {self.lengths[layer]} positions but is asked to run at column {start}: "
                "the schedule let a budget grow, which would need recomputation"
            )
        if start + count > self.max_len:
            raise RuntimeError(f"cache of {self.max_len} columns is full")
        self.lengths[layer] = start + count
        return self.data[layer, 0], self.data[layer, 1]

    def truncate(self, columns: int):
        """Forget every column from `columns` on (verified decoding's rollback of rejected drafts): a static
        cache only needs its lengths cut, and the next writes overwrite the rest. A layer holding fewer
        columns keeps them all (under a schedule, the layers it stopped running)."""
        self.lengths = [min(length, columns) for length in self.lengths]

    def keep_rows(self, rows: torch.Tensor):
        """Drop finished rows so they stop costing compute; copies only the columns in use."""
        used = max(self.lengths)
        data = self.data.new_empty(self.data.shape[:2] + (len(rows),) + self.data.shape[3:])
        data[:, :, :, :, :used] = self.data[:, :, rows, :, :used]
        self.data = data

    def fill_rows(self, prompts: "KVCache", repeats: int):
        """Rows r * repeats ... (r + 1) * repeats - 1 take row r of `prompts`, a cache of the prompts alone
        (a beam search's prefill: each prompt once, then one copy per beam)."""
        used = max(prompts.lengths)
        self.data[:, :, :, :, :used] = prompts.data[:, :, :, :, :used].repeat_interleave(repeats, dim=2)
        self.lengths = list(prompts.lengths)

    def reorder_rows(self, rows: torch.Tensor, start: int = 0):
        """Row i takes row rows[i]'s keys and values (a beam search's step), in place: a graphed step's
        cache must stay where its graphs were captured. Only columns from `start` on are copied, and in
        each layer only those it holds: the beams of a prompt share its columns before `start`, and a
        layer the schedule skipped holds nothing past them, so the copy shrinks with the budget."""
        for layer, length in enumerate(self.lengths):
            if length > start:
                self.data[layer, :, :, :, start:length] = self.data[layer, :, rows, :, start:length]

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds (verified decoding's one cache holds as many as full decoding's)."""
        return self.data.numel() * self.data.element_size()

    @property
    def batch(self) -> int:
        return self.data.shape[2]
