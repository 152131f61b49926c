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

from .beam import Beam, BeamSearch, beam_search
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


class Decoding:
    """What every way of decoding offers: `stream` (checks its prompts, skipdecode/request.py, and yields the
    generation after every position or round), `run` (checked requests) and `generate` (the last of `stream`)."""

    def generate(self, prompts, schedule=None, max_new_tokens=64, sampling=Sampling(), chat=None,
                 stop_at_eos=True, on_step: Callable[[Generation], None] | None = None,
                 beam: Beam | None = None) -> Generation:
        for generation in self.stream(prompts, schedule, max_new_tokens, sampling, chat, stop_at_eos, beam):
            if on_step is not None:
                on_step(generation)
        return generation


class Engine(Decoding):
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
        `prompts`, what the caller asked (text or ids), are kept in the generation (default: the ids). The
        strategy drives the forward passes: one token at a time (`_tokens`) or a beam search (beam.beam_search)."""
        first = requests[0]
        if any(r.settings() != first.settings() for r in requests):
            raise ValueError("the requests of one batch share their schedule, token limit, sampling and beam")
        policy = first.schedule if hasattr(first.schedule, "run") else Scheduled(first.schedule)
        prompts = prompts or [list(r.prompt_ids) for r in requests]
        encoded = [list(r.prompt_ids) for r in requests for _ in range(first.rows)]  # a prompt's beams are rows
        forward = Forward(self, policy, encoded, first.max_new_tokens, first.rows)
        gen = Generation(prompts, [[] for _ in prompts], [False] * len(prompts), forward.trace, self.tokenizer)
        try:
            if first.beam:
                search = BeamSearch(first.beam, len(prompts), self.eos_ids, first.max_new_tokens, self.decoder.device)
                yield from beam_search(forward, gen, search)
            else:
                yield from self._tokens(forward, gen, first)
        finally:
            forward.close()

    def _tokens(self, forward: "Forward", gen: Generation, request: Request) -> Iterator[Generation]:
        """One token a row at each position (greedy or sampled); rows that have finished are compacted away
        once that saves work."""
        generator = request.sampling.generator(self.decoder.device)

        def choose(logits):
            return next_tokens(logits, request.sampling, generator)

        token = forward.prefill(choose)
        rows = list(range(len(gen.prompts)))  # original row of each row still in the batch
        n = request.max_new_tokens
        for step in range(n):
            keep = []  # record what the last forward produced; drop rows that have finished
            for i, (row, t) in enumerate(zip(rows, token.tolist())):
                if not gen.finished[row]:
                    gen.token_ids[row].append(t)
                    forward.trace.generated_tokens += 1
                    gen.finished[row] = (request.stop_at_eos and t in self.eos_ids) or len(gen.token_ids[row]) == n
                if not gen.finished[row]:
                    keep.append(i)
            if not keep:
                break
            if not forward.static and _worth_compacting(len(rows) - len(keep), len(rows), n - step):
                token = token[forward.keep(keep)]
                rows = [rows[i] for i in keep]
            yield gen
            token = forward.column(step, token, choose)
        forward.finish()
        gen.done = True
        yield gen

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


class Forward:
    """One generation's forward passes over its cache: the prefill, then one column at a time through the
    policy's layers, eagerly or on a static step (skipdecode/kernels/cuda_graphs.py). A strategy (Engine._tokens,
    beam.beam_search) chooses the tokens; `choose` runs inside each pass's timing, as the token is part of it."""

    def __init__(self, engine: "Engine", policy, encoded: list[list[int]], max_new_tokens: int, beams: int = 1):
        dec = self.dec = engine.decoder
        self.engine, self.policy, self.encoded, self.K = engine, policy, encoded, beams
        B, P = len(encoded), max(len(ids) for ids in encoded)
        self.P, self.width, device = P, P + max_new_tokens, dec.device
        self.ids = torch.tensor([[engine.pad_id] * (P - len(e)) + e for e in encoded], device=device)
        pads = [P - len(e) for e in encoded]
        self.valid = torch.ones(B, self.width, dtype=torch.bool, device=device)
        for row, pad in enumerate(pads):
            self.valid[row, :pad] = False
        # Additive masks, made once: SDPA would otherwise turn a boolean mask into one at every layer.
        # Without padding the decode steps need no mask at all.
        self.bias = dec.attention_bias(self.valid) if any(pads) else None
        self.static = engine._static_step(policy, B, self.width)
        self.cache = self.static.begin(self.valid) if self.static else KVCache(
            engine.num_layers, B, dec.num_kv_heads, self.width, dec.head_dim, device, dec.dtype)
        self.trace = Trace(engine.num_layers, B, P, policy.to_dict())
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.position = None

    def prefill(self, choose) -> torch.Tensor:
        """Every layer on the whole prompt (a pad column may attend only to itself); the first tokens. The
        beams of a prompt share it: it runs once per prompt, its keys and values copied to every beam's row."""
        dec, cache, K, P, L, device = self.dec, self.cache, self.K, self.P, self.engine.num_layers, self.dec.device
        started = time.perf_counter()
        positions = (self.valid[::K, :P].long().cumsum(-1) - 1).clamp(min=0)
        if len(self.encoded) == 1 and self.engine.prefixes is not None:  # a prefix computed before is reused
            logits, self.trace.prefix_tokens = prefill(dec, cache, self.encoded[0], self.engine.prefixes)
        else:
            causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
            mask = dec.attention_bias((causal & self.valid[::K, None, :P]) | torch.eye(P, dtype=torch.bool,
                                                                                      device=device))
            x, rope = dec.embed(self.ids[::K], positions), dec.rope(positions, limit=self.width)
            shared = cache if K == 1 else KVCache(L, len(self.encoded) // K, dec.num_kv_heads, P, dec.head_dim,
                                                  device, dec.dtype)
            for layer in range(L):
                x = dec.block(layer, x, rope, mask[:, None], *shared.claim(layer, 0, P), 0)
            logits = dec.logits(x[:, -1])
        if K > 1:
            cache.fill_rows(shared, K)
            logits, positions = logits.repeat_interleave(K, 0), positions.repeat_interleave(K, 0)
        token = choose(logits)
        self.position = positions[:, -1:] + 1
        self.sync()
        self.trace.prefill_ms = (time.perf_counter() - started) * 1000.0
        return token

    def column(self, step: int, token: torch.Tensor, choose) -> torch.Tensor:
        """Position `step`: the policy runs the column's layers (for a schedule: the same for every row)."""
        dec, cache, position = self.dec, self.cache, self.position
        started = time.perf_counter()
        column = self.P + step
        if self.static:
            x, record = self.policy.run(self.static, cache, step, column, *self.static.inputs(token, position, column))
            logits = self.static.head()
        else:
            x, rope = dec.embed(token[:, None], position), dec.rope(position, limit=self.width)
            mask = self.bias[:, None, None, : column + 1] if self.bias is not None else None
            x, record = self.policy.run(dec, cache, step, column, x, rope, mask)
            logits = dec.logits(x[:, -1])
        token = choose(logits)
        self.position += 1
        self.sync()
        record.ms = (time.perf_counter() - started) * 1000.0
        self.trace.steps.append(record)
        return token

    def keep(self, rows: list[int]) -> torch.Tensor:
        """Keep only these rows of the batch (their cache, position and mask); the index, for the caller's."""
        index = torch.tensor(rows, device=self.dec.device)
        self.cache.keep_rows(index)
        self.position = self.position[index]
        self.bias = self.bias[index] if self.bias is not None else None
        return index

    def reorder(self, origin: torch.Tensor) -> None:
        """Each row continues row origin[row] (a beam search's step); the prompt's columns, the same in every
        beam of a prompt, stay."""
        self.cache.reorder_rows(origin, self.P)

    def finish(self) -> None:
        self.trace.cache_lengths = list(self.cache.lengths)

    def close(self) -> None:
        if self.static:
            self.engine._steps.give(self.static)


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
