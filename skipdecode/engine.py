"""One generation loop for full decoding, SkipDecode, the early-exit ablation and per-token peers.

The schedule decides which layers a position runs; everything else is the same loop: a left-padded
batch, one all-layer prefill, then one column of the batch at a time through the scheduled layers into
a static KV cache, with finished rows compacted away. A per-token method (`peers.EarlyExit`) plugs in as
a column policy: an object with `num_layers`, `to_dict()` and `run(...)` like `Scheduled` below.
On a GPU a schedule's columns run as CUDA graphs (skipdecode/kernels/cuda_graphs.py): the same loop, handed a static
step in place of the decoder, which keeps finished rows instead of compacting them. On a CPU the steps run
eagerly, on the native kernels (skipdecode/kernels/native.py) where they load.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from .beam import Beam, BeamSearch
from .cache import KVCache
from .prefix import PREFIXES, prefill
from .prompts import encode_prompt, has_chat_template
from .request import Request, check
from .sampling import Sampling, next_tokens
from .schedule import Schedule
from .trace import StepRecord, Trace
from .transformer import Decoder, run_layers

Prompt = str | Sequence[int]
GRAPHS_ENV = "SKIPDECODE_CUDA_GRAPHS"


@dataclass
class Generation:
    """The state of a generation; `Engine.stream` yields it after every position, updated in place."""

    prompts: list[Prompt]
    token_ids: list[list[int]]  # generated ids per row, EOS included
    finished: list[bool]
    trace: Trace
    tokenizer: object = field(repr=False)
    done: bool = False

    @property
    def texts(self) -> list[str]:
        return [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in self.token_ids]

    def to_dict(self) -> dict:
        outputs = [{"prompt": p if isinstance(p, str) else list(p), "text": t, "token_ids": ids}
                   for p, t, ids in zip(self.prompts, self.texts, self.token_ids)]
        return {"outputs": outputs, "trace": self.trace.to_dict()}


class Scheduled:
    """SkipDecode's column: every row of the batch runs the layers the schedule gives this position."""

    def __init__(self, schedule: Schedule):
        self.schedule, self.num_layers = schedule, schedule.num_layers

    def to_dict(self) -> dict:
        return self.schedule.to_dict()

    def run(self, dec: Decoder, cache: KVCache, step: int, column: int, x, rope, mask):
        """Hidden states [B, 1, d] after this position's layers, and the step's record (ms filled in later)."""
        layers = self.schedule.layers(step)
        x = run_layers(dec, layers, x, rope, mask, cache, column)  # fused layers: one native call for them all
        return x, StepRecord(step, len(layers), layers, self.schedule.skipped(step), 0.0, x.shape[0])


class Engine:
    def __init__(self, model: torch.nn.Module, tokenizer, name: str | None = None, weights=None):
        """`weights`: the matrices to decode with instead of the model's own (q4.GGUFWeights)."""
        self.model, self.tokenizer = model.eval(), tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or model.config.model_type
        self.decoder = Decoder(model, weights=weights)
        self.num_layers = self.decoder.num_layers
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if tokenizer.eos_token_id is not None:
            eos.append(tokenizer.eos_token_id)
        self.eos_ids = sorted(set(eos))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self.eos_ids or [0])[0]
        # "auto": CUDA graphs for the decode steps on a GPU; "off"; "on": also on a CPU, where the same static
        # step runs uncaptured (skipdecode/kernels/cuda_graphs.py; how the tests check it). A host sets it for every engine.
        self.graphs = os.environ.get(GRAPHS_ENV, "auto")
        self._steps = None
        # Prompt prefixes computed once, for every later batch-1 prefill on these weights (skipdecode/prefix.py);
        # None: every prefill runs the whole prompt.
        self.prefixes = PREFIXES

    @classmethod
    def load(cls, name_or_path: str | None = None, device: str = "auto", dtype="auto", adapter=None) -> "Engine":
        """A model by name or path; `adapter` (a name, a path or an AdapterInfo) is merged into its weights,
        or, on the GGUF's 4-bit blocks (skipdecode/kernels/q4.py: "auto" on a CPU for the bundled model), kept
        unmerged beside the packed base that every engine of the process shares."""
        from .kernels import q4
        from .adapters.lora import adapter_dtype, merge_adapter, same_base
        from .models import load_model

        info = _adapter_info(adapter)
        base = None
        if shares_base(name_or_path, info, device, dtype):
            try:
                base = q4.load_base()
            except q4.NotQ4_1 as why:  # another quantization: today's dequantized path, said in the log
                if dtype == q4.INT4:
                    raise
                logging.getLogger("skipdecode").warning("%s: running the dequantized float32 path", why)
        if base is not None:
            loaded, weights = base
            if info is not None:
                if not same_base(info.base_model, loaded.name):
                    raise ValueError(f"adapter {info.name!r} was made for {info.base_model}, not {loaded.name}")
                weights = weights.with_adapter(info.name, q4.lora_factors(Path(info.path), len(weights.blocks)))
            engine = cls(loaded.model, loaded.tokenizer, loaded.name if info is None else f"{loaded.name}+{info.name}",
                         weights=weights)
            engine.base_name, engine.adapter = loaded.name, info
            return engine
        loaded = load_model(name_or_path, device=device, dtype=adapter_dtype(info, dtype))
        _own_memory(loaded.model)
        if info is not None:
            loaded.model = merge_adapter(loaded.model, info, loaded.name)
        engine = cls(loaded.model, loaded.tokenizer, loaded.name if info is None else f"{loaded.name}+{info.name}")
        engine.base_name, engine.adapter = loaded.name, info  # what the app and evaluation report
        return engine

    @property
    def weights_label(self) -> str:
        """Which weights and activations decode ("float32", or the GGUF blocks' description)."""
        return self.decoder.weights_label

    @property
    def step_label(self) -> str:
        """Which decode step runs, in words the bench header, the log and the page show."""
        if self.graphs == "off":
            return f"eager step: {GRAPHS_ENV}=off"
        return "CUDA graphs" if self.decoder.device.type == "cuda" else "eager step"

    @torch.inference_mode()
    def hidden_states(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """Every position's hidden state after each layer (index 0: the embeddings) for unpadded rows ids
        [B, T], at full depth, on the weights this engine decodes with: what scoring needs (quality.py)
        when those are not the Hugging Face model's own (4-bit blocks, an unmerged adapter)."""
        return self.decoder.hidden_states(ids)

    # ---- prompts ------------------------------------------------------------------------------
    @property
    def is_chat(self) -> bool:
        return has_chat_template(self.tokenizer)

    def encode(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids of one prompt; text goes through the chat template when the model has one."""
        return encode_prompt(self.tokenizer, prompt, chat)

    # ---- generation ---------------------------------------------------------------------------
    def generate(self, prompts, schedule=None, max_new_tokens=64, sampling=Sampling(), chat=None,
                 stop_at_eos=True, on_step: Callable[[Generation], None] | None = None,
                 beam: Beam | None = None) -> Generation:
        for generation in self.stream(prompts, schedule, max_new_tokens, sampling, chat, stop_at_eos, beam):
            if on_step is not None:
                on_step(generation)
        return generation

    def stream(self, prompts, schedule: Schedule | None = None, max_new_tokens: int = 64,
               sampling: Sampling = Sampling(), chat: bool | None = None,
               stop_at_eos: bool = True, beam: Beam | None = None) -> Iterator[Generation]:
        """Yields the generation after every position. `beam` (width > 1) searches instead of choosing each
        token alone (skipdecode/beam.py): the batch then holds width rows per prompt, and each prompt's
        output is its best beam (while decoding, its best so far); `sampling` and `stop_at_eos` do not apply.
        The prompts are checked here (skipdecode/request.py), once; `run` takes them as given."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise ValueError("no prompts given")
        requests = [check(self, p, schedule, max_new_tokens, sampling, stop_at_eos, chat, beam) for p in prompts]
        return self.run(requests, prompts)

    @torch.inference_mode()
    def run(self, requests: list[Request], prompts: list | None = None) -> Iterator[Generation]:
        """Checked requests (skipdecode/request.py) that share their settings, as one batch of one position;
        `prompts`, what the caller asked (text or ids), are kept in the generation (default: the ids)."""
        first = requests[0]
        if any(r.settings() != first.settings() for r in requests):
            raise ValueError("the requests of one batch share their schedule, token limit, sampling and beam")
        dec, policy, max_new_tokens, beam = self.decoder, first.schedule, first.max_new_tokens, first.beam
        policy = policy if hasattr(policy, "run") else Scheduled(policy)
        prompts = prompts or [list(r.prompt_ids) for r in requests]
        encoded = [list(r.prompt_ids) for r in requests for _ in range(first.rows)]  # each prompt's beams are rows of the batch
        B, P = len(encoded), max(len(ids) for ids in encoded)
        width = P + max_new_tokens
        device = dec.device
        ids = torch.tensor([[self.pad_id] * (P - len(e)) + e for e in encoded], device=device)
        pads = [P - len(e) for e in encoded]
        valid = torch.ones(B, width, dtype=torch.bool, device=device)
        for row, pad in enumerate(pads):
            valid[row, :pad] = False
        # Additive masks, made once: SDPA would otherwise turn a boolean mask into one at every layer.
        # Without padding the decode steps need no mask at all.
        bias = dec.attention_bias(valid) if any(pads) else None
        static = self._static_step(policy, B, width)
        cache = static.begin(valid) if static else KVCache(self.num_layers, B, dec.num_kv_heads, width,
                                                           dec.head_dim, device, dec.dtype)
        try:
            yield from self._decode(prompts, encoded, policy, dec, cache, static, ids, valid, bias, width,
                                    max_new_tokens, first.sampling, first.stop_at_eos, beam)
        finally:
            if static:
                self._steps.give(static)

    def _static_step(self, policy, batch: int, width: int):
        """A static decode step for this generation (skipdecode/kernels/cuda_graphs.py: CUDA graphs on a GPU; on a
        CPU only with graphs "on", uncaptured, as the tests check it), or None for the eager one."""
        from .kernels.cuda_graphs import StaticSteps

        cuda = self.decoder.device.type == "cuda"
        if self.graphs not in ("auto", "on", "off"):
            raise ValueError(f"graphs must be 'auto', 'on' or 'off'; got {self.graphs!r}")
        if self.graphs == "off" or not isinstance(policy, Scheduled):
            return None
        if self.graphs == "auto" and not cuda:
            return None
        if self._steps is None or self._steps.dec is not self.decoder:
            self._steps = StaticSteps(self.decoder, capture=cuda)
        return self._steps.take(batch, width)

    def _decode(self, prompts, encoded, policy, dec, cache, static, ids, valid, bias, width, max_new_tokens,
                sampling, stop_at_eos, beam):
        L, B, P, device = self.num_layers, len(encoded), ids.shape[1], dec.device
        generator = None if beam else sampling.generator(device)
        search = BeamSearch(beam, len(prompts), self.eos_ids, max_new_tokens, device) if beam else None
        trace = Trace(L, B, P, policy.to_dict())
        gen = Generation(prompts, [[] for _ in prompts], [False] * len(prompts), trace, self.tokenizer)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

        # Prefill: every layer on the whole prompt; a pad column may attend only to itself. The beams of a
        # prompt share it: it runs once per prompt, and its keys and values are copied to every beam's row.
        started = time.perf_counter()
        K = search.K if search else 1
        positions = (valid[::K, :P].long().cumsum(-1) - 1).clamp(min=0)
        if B == 1 and self.prefixes is not None:  # one prompt: a prefix an earlier prefill computed is reused
            logits, trace.prefix_tokens = prefill(dec, cache, encoded[0], self.prefixes)
        else:
            causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
            mask = dec.attention_bias((causal & valid[::K, None, :P]) | torch.eye(P, dtype=torch.bool, device=device))
            x, rope = dec.embed(ids[::K], positions), dec.rope(positions, limit=width)
            shared = cache if K == 1 else KVCache(L, B // K, dec.num_kv_heads, P, dec.head_dim, device, dec.dtype)
            for layer in range(L):
                x = dec.block(layer, x, rope, mask[:, None], *shared.claim(layer, 0, P), 0)
            logits = dec.logits(x[:, -1])
        if K > 1:
            cache.fill_rows(shared, K)
            logits, positions = logits.repeat_interleave(K, 0), positions.repeat_interleave(K, 0)
        token = self._choose(logits, sampling, generator, search, cache, P)
        position = positions[:, -1:] + 1
        rows = list(range(B))  # original row of each row still in the batch
        sync()
        trace.prefill_ms = (time.perf_counter() - started) * 1000.0

        for step in range(max_new_tokens):
            if search:  # a prompt's output is its best beam so far; beams are reordered, never dropped
                gen.token_ids = [search.best(p) for p in range(len(prompts))]
                gen.finished = [not still for still in search.open]
                trace.generated_tokens += B
                if search.done:
                    break
            else:  # record what the last forward produced; drop rows that have finished
                keep = []
                for i, (row, t) in enumerate(zip(rows, token.tolist())):
                    if not gen.finished[row]:
                        gen.token_ids[row].append(t)
                        trace.generated_tokens += 1
                        gen.finished[row] = ((stop_at_eos and t in self.eos_ids)
                                             or len(gen.token_ids[row]) == max_new_tokens)
                    if not gen.finished[row]:
                        keep.append(i)
                if not keep:
                    break
                if not static and _worth_compacting(len(rows) - len(keep), len(rows), max_new_tokens - step):
                    index = torch.tensor(keep, device=device)
                    cache.keep_rows(index)
                    token, position = token[index], position[index]
                    bias = bias[index] if bias is not None else None
                    rows = [rows[i] for i in keep]
            yield gen

            # Position `step`: the policy runs the column's layers (for a schedule: the same for every row).
            started = time.perf_counter()
            column = P + step
            if static:
                x, record = policy.run(static, cache, step, column, *static.inputs(token, position, column))
                logits = static.head()
            else:
                x, rope = dec.embed(token[:, None], position), dec.rope(position, limit=width)
                mask = bias[:, None, None, : column + 1] if bias is not None else None
                x, record = policy.run(dec, cache, step, column, x, rope, mask)
                logits = dec.logits(x[:, -1])
            token = self._choose(logits, sampling, generator, search, cache, P)
            position += 1
            sync()
            record.ms = (time.perf_counter() - started) * 1000.0
            trace.steps.append(record)
        trace.cache_lengths = list(cache.lengths)
        gen.done = True
        yield gen

    @staticmethod
    def _choose(logits, sampling, generator, search, cache, prompt_columns):
        """The next token of every row; a beam search also moves the cache rows to the beams they continue
        (the prompt's columns, the same in every beam of a prompt, stay)."""
        if search is None:
            return next_tokens(logits, sampling, generator)
        token, origin = search.step(logits)
        cache.reorder_rows(origin, prompt_columns)
        return token


def _adapter_info(adapter):
    from .adapters.lora import NONE, AdapterInfo, find_adapter

    if adapter is None or str(adapter) in NONE:
        return None
    return adapter if isinstance(adapter, AdapterInfo) else find_adapter(adapter)


def shares_base(name_or_path: str | None, adapter=None, device: str = "auto", dtype="auto") -> bool:
    """Whether `Engine.load` with these arguments runs on the process's one packed 4-bit base
    (skipdecode/kernels/q4.py), an adapter unmerged beside it, rather than on weights of its own."""
    from .kernels import q4
    from .models import resolve_device

    return q4.chosen(name_or_path, resolve_device(device), dtype)


def _own_memory(model: torch.nn.Module) -> None:
    """Copy weights that still live in the checkpoint's memory map into memory of their own. Merging an
    adapter or fusing matrices writes into or replaces them, and a private file mapping keeps every page
    once written. With this and the decoder's fused matrices sharing the model's memory, a merged
    SmolLM2-135M costs 1.04-1.06 GB instead of 1.31-1.32 (RSS, float32: the weights and their packed copy;
    experiments/model_memory.py)."""
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.device.type == "cpu":
                tensor.data = tensor.data.clone()


def _worth_compacting(finished: int, batch: int, steps_left: int) -> bool:
    """Copying the cache costs about one step; dropping a row saves 1/batch of each step left."""
    return finished > 0 and (finished == batch or finished * steps_left >= batch)
