"""A continuous batch: rows at different positions, each on its own schedule, share every decode step.

The paper leaves open how new requests join a running batch: a budget shared per position needs every row
at the same position. Here each row keeps its own position and runs the layers its own schedule gives its
own s-th token; at each layer only the rows whose layer set holds it run it, and a row that skips it passes
its hidden state through. Each row's budget still never grows, so per row the columns that ran a layer are
still a prefix of that row's sequence: every layer a row runs already holds all of that row's earlier keys
and values, and nothing is recomputed. The cache keeps one length per row per layer, and the guard that a
layer never runs past a hole holds row by row.

A step groups the layers run by the same rows into one native call (layer.c, rows at their own
columns): with warm-up plus top layers the sets are nested, so a step makes about one call per distinct
budget among its rows, and its cost is the layers of its largest budget, each paid only by the rows that
run it. A request joins at any step: its prompt runs in chunks between decode steps (PREFILL_CHUNK tokens a step, over
one long prompt or several short ones), so running rows never wait for a whole long prompt; a finished row frees its slot at once. Scoring joins the same way: a
teacher-forced row is a prompt alone, whose last hidden states it keeps. A teacher-forced row may also follow a
decoding row (`leader`): after its prompt it is fed the leader's tokens as they come, one a step beside the
leader's own, so the page's scoring of an answer ends with the answer instead of running after it; and a
decoding row can keep its own last hidden states (`keep_states`), which at full depth are its answer's scoring.

Bits: layer.c computes every row from that row alone, so a row decodes here the tokens it decodes alone.
This runs on the CPU's native path (a decoder whose layers are fused, `Decoder.fused`); elsewhere the
batcher keeps its batches of one position (skipdecode/batcher.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .cache import cache_dtype
from .prefix import PrefixCache
from .beam import BeamSearch
from .sampling import Sampling, next_tokens
from .schedule import Schedule
from .trace import StepRecord, Trace

MIN_SLOTS = 4  # a comparison's rows (two answers, their scoring): one cache for them, grown for more
PREFILL_CHUNK = 64  # prompt tokens prefilled between two decode steps (one call a row, several short prompts)
WIDTH_QUANTUM = 128  # cache columns are allocated in multiples of this


def serves(engine) -> bool:
    """Whether `engine` can decode rows at different positions in one step (its layers are fused)."""
    return getattr(engine.decoder, "fused", None) is not None


def base_of(engine) -> tuple:
    """What engines whose rows share a step have in common: one model (embeddings, norms), one packed base
    and one head. Their adapters' LoRA terms apply row by row (layer.c), as multi-adapter servers do."""
    dec = engine.decoder
    return id(engine.model), id(dec.lm_head), dec.fused.layers[0].qkv.w


@dataclass(eq=False)
class Row:
    """One sequence of the continuous batch: its prompt, schedule and limits, and what it has decoded."""

    prompt_ids: list[int]
    schedule: Schedule
    max_new_tokens: int
    sampling: Sampling = Sampling()
    stop_at_eos: bool = True
    owner: object = None  # whoever follows the row (the batcher's request)
    engine: object = None  # the model it decodes with: an adapter over the batch's base (None: the batch's own)
    slot: int = -1
    prefilled: int = 0  # prompt tokens whose keys and values are in the cache
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    cancelled: bool = False
    trace: Trace = None
    generator: torch.Generator | None = None
    # A teacher-forced row (scoring): no new token; the last hidden states of positions from here on are kept
    states_from: int | None = None
    states: list[torch.Tensor] = field(default_factory=list)
    keep_states: bool = False  # a decoding row that keeps its last hidden state at every position it predicts from
    leader: "Row | None" = None  # a teacher-forced row fed this row's tokens as they come (states_from: its prompt's last)
    fed: int = 0  # the leader's tokens fed so far
    group: "Beams | None" = None  # a beam search's rows: one prompt, K beams at one position

    @property
    def columns(self) -> int:
        return len(self.prompt_ids) + self.max_new_tokens

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.prompt_ids) and not self.finished and not self.cancelled

    def next_input(self) -> int | None:
        """The token this row feeds at the next step (its own last, or its leader's next), None if it waits."""
        if not self.decoding:
            return None
        if self.leader is None:
            return self.token_ids[-1] if self.token_ids else None
        return self.leader.token_ids[self.fed] if self.fed < len(self.leader.token_ids) else None

    def caught_up(self) -> bool:
        """A following row is done once it has fed every token of its finished leader but the last (whose
        successor nobody predicts)."""
        return self.leader.finished and self.fed >= len(self.leader.token_ids) - 1


class Beams:
    """The K rows of one beam search (skipdecode/beam.py) in a continuous batch: the first prefills the prompt,
    whose columns the others then copy; every step the search picks each beam's next token and the beam it
    continues, and the rows' cache columns past the prompt follow (each row's own layers, the same for all K:
    one schedule, one position)."""

    def __init__(self, search: BeamSearch, rows: list[Row]):
        self.search, self.rows = search, rows
        for row in rows:
            row.group = row.group or self
        for row in rows[1:]:
            row.prefilled = len(row.prompt_ids)  # its prompt's columns come from the first row's prefill

    @property
    def tokens(self) -> list[int]:
        """The search's output so far: its best finished hypothesis, else its best running beam."""
        return self.search.best(0)


class SlotCache:
    """Keys and values of every row: [layer, key/value, slot, head, column, dim], a row's sequence from column
    0 of its slot, and `lengths[slot][layer]`: the columns that layer holds for that row."""

    def __init__(self, dec, slots: int, width: int):
        self.dec, self.data = dec, None
        self.lengths: list[list[int]] = []
        self.resize(slots, width)

    def resize(self, slots: int, width: int) -> None:
        """Room for `slots` rows of `width` columns, keeping what the current slots hold."""
        dec = self.dec
        data = torch.zeros(dec.num_layers, 2, slots, dec.num_kv_heads, width, dec.head_dim,
                           dtype=cache_dtype(dec.dtype, dec.device), device=dec.device)
        if self.data is not None:
            keep_slots, keep_width = min(slots, self.slots), min(width, self.width)
            data[:, :, :keep_slots, :, :keep_width] = self.data[:, :, :keep_slots, :, :keep_width]
        self.data = data
        self.lengths = (self.lengths + [[0] * dec.num_layers for _ in range(slots)])[:slots]

    @property
    def slots(self) -> int:
        return self.data.shape[2]

    @property
    def width(self) -> int:
        return self.data.shape[4]

    def claim(self, slot: int, layers, start: int, count: int) -> None:
        """Record `count` new columns at `start` in each of `layers` for `slot`; refuse a hole."""
        lengths = self.lengths[slot]
        for layer in layers:
            if lengths[layer] != start:
                raise RuntimeError(f"layer {layer} holds {lengths[layer]} positions of a row asked to run at column "
                                   f"{start}: its schedule let a budget grow, which would need recomputation")
            lengths[layer] = start + count

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


class Slots:
    """The continuous batch of one base: rows join (`add`), each `advance` runs prefill chunks of joining rows
    and one decode step of every decoding row, and a finished row leaves at once. A row may decode with any
    engine over the same base (`base_of`): the adapter of each row applies to that row alone."""

    def __init__(self, engine, max_rows: int = 16, prefixes: PrefixCache | None = None):
        if not serves(engine):
            raise ValueError("a continuous batch needs the native layers (Decoder.fused)")
        self.engine, self.dec, self.max_rows = engine, engine.decoder, max_rows
        self.prefixes = engine.prefixes if prefixes is None else prefixes
        self.rows: list[Row] = []  # in order of arrival
        self.cache: SlotCache | None = None
        self.steps = 0  # decode steps run

    # ---- rows joining and leaving --------------------------------------------------------------
    def room(self, rows: int = 1) -> bool:
        return len(self.rows) + rows <= self.max_rows

    def add(self, row: Row) -> Row:
        """Take `row` into a free slot (its prefill starts with the next `advance`). The row's request was
        checked where it entered (skipdecode/request.py); here only what this batch cannot hold is refused."""
        row.engine = row.engine or self.engine
        if not serves(row.engine) or base_of(row.engine) != base_of(self.engine):
            raise ValueError(f"{row.engine.name} is not an adapter of this batch's base ({self.engine.name})")
        if not self.room():
            raise RuntimeError(f"the continuous batch is full ({self.max_rows} rows)")
        used = {r.slot for r in self.rows}
        row.slot = next(s for s in range(self.max_rows) if s not in used)
        width = _width([*self.rows, row])
        slots = min(self.max_rows, max(MIN_SLOTS, 1 << row.slot.bit_length()))  # a power of two above the slot
        if self.cache is None:
            self.cache = SlotCache(self.dec, slots, width)
        elif slots > self.cache.slots or width > self.cache.width:
            self.cache.resize(max(slots, self.cache.slots), max(width, self.cache.width))
        self.cache.lengths[row.slot] = [0] * self.dec.num_layers
        row.trace = Trace(self.dec.num_layers, 1, len(row.prompt_ids), row.schedule.to_dict())
        row.generator = row.sampling.generator(self.dec.device)
        self.rows.append(row)
        return row

    def drop_finished(self) -> list[Row]:
        """Free the slots of finished and cancelled rows; the rows that left."""
        gone = [r for r in self.rows if r.finished or r.cancelled]
        self.rows = [r for r in self.rows if not (r.finished or r.cancelled)]
        if not self.rows:
            self.cache = None  # an idle engine holds no cache; a busy one keeps its width (no copy as rows come and go)
        return gone

    # ---- work ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def advance(self) -> list[Row]:
        """Up to PREFILL_CHUNK prompt tokens of the joining rows, oldest first, and one decode step of every
        decoding row; the rows that moved (a row whose prefill ended has its first token)."""
        moved, budget = [], PREFILL_CHUNK
        for row in [r for r in self.rows if r.prefilled < len(r.prompt_ids) and not r.cancelled]:
            if budget <= 0:
                break
            before = row.prefilled
            if self._prefill_chunk(row, budget):
                moved.append(row)
            budget -= row.prefilled - before
        for row in self.rows:  # a follower leaves with its leader, and never waits on one that is not here to finish
            leader = row.leader
            if leader is not None and (leader.cancelled or not (leader.finished or leader in self.rows)):
                row.cancelled = True
        decoding = [r for r in self.rows if r.next_input() is not None]
        if decoding:
            self._step(decoding)
            moved += decoding
        return moved

    def _prefill_chunk(self, row: Row, most: int = PREFILL_CHUNK) -> bool:
        """The next chunk of `row`'s prompt (at most `most` tokens) through every layer; True when the prompt
        is done (its first token chosen, or for a teacher-forced row its states kept)."""
        dec, cache, ids = self.dec, self.cache, row.prompt_ids
        started = time.perf_counter()
        if row.prefilled == 0 and self.prefixes is not None:
            m, kv = self.prefixes.lookup(row.engine.decoder, ids)  # its own model's keys and values
            m = m if row.states_from is None else min(m, row.states_from)  # the states kept are computed here
            if m:
                cache.data[:, :, row.slot, :, :m] = kv[:, :, :, :m]
                cache.lengths[row.slot] = [m] * dec.num_layers
                row.prefilled = row.trace.prefix_tokens = m
        a = row.prefilled
        b = min(len(ids), a + most)
        positions = torch.arange(a, b, device=dec.device)[None]
        x, rope = dec.embed(torch.tensor([ids[a:b]], device=dec.device), positions), dec.rope(positions, limit=b)
        allowed = torch.arange(b, device=dec.device)[None, :] <= positions[0, :, None]  # causal: [S, b]
        mask = dec.attention_bias(allowed)[None, None]
        layers = list(range(dec.num_layers))
        cache.claim(row.slot, layers, a, b - a)
        x = self._call(layers, x, rope, mask, [row], [a])
        row.prefilled = b
        done = b == len(ids)
        if row.states_from is not None:  # a teacher-forced row: keep its states, choose nothing
            row.states.append(x[0, max(row.states_from - a, 0):].clone())
            row.finished = done and (row.leader is None or row.caught_up())
        elif done:
            if row.keep_states:
                row.states.append(x[0, -1:].clone())
            if self.prefixes is not None:
                self.prefixes.store(row.engine.decoder, ids, _SlotView(cache, row.slot))
            if row.group is not None:  # a beam search: every beam starts from the prompt's columns
                beams = row.group.rows
                for other in beams[1:]:
                    cache.data[:, :, other.slot, :, :b] = cache.data[:, :, row.slot, :, :b]
                    cache.lengths[other.slot] = list(cache.lengths[row.slot])
                self._choose(beams, dec.logits(x[:, -1]).repeat(len(beams), 1))
            else:
                self._choose([row], dec.logits(x[:, -1]))
        row.trace.prefill_ms += (time.perf_counter() - started) * 1000.0
        return done

    def _step(self, rows: list[Row]) -> None:
        """Each row's last token through the layers of its own schedule at its own position, in one call per
        run of layers that the same rows run (`segments`)."""
        dec, cache = self.dec, self.cache
        started = time.perf_counter()
        steps = [r.fed if r.leader is not None else len(r.token_ids) - 1 for r in rows]  # generated position fed
        starts = [len(r.prompt_ids) + s for r, s in zip(rows, steps)]
        layer_sets = [r.schedule.layers(s) for r, s in zip(rows, steps)]
        tokens = torch.tensor([[r.next_input()] for r in rows], device=dec.device)
        positions = torch.tensor([[c] for c in starts], device=dec.device)
        x, rope = dec.embed(tokens, positions), dec.rope(positions, limit=max(starts) + 1)
        for i, r in enumerate(rows):
            cache.claim(r.slot, layer_sets[i], starts[i], 1)
        spent, in_calls = [0.0] * len(rows), 0.0  # the time of the calls each row ran in, and of them all
        for layers, members in segments(layer_sets, dec.num_layers):
            began = time.perf_counter()
            index = torch.tensor(members, device=dec.device)
            part = x if len(members) == len(rows) else x[index]
            part_rope = rope if len(members) == len(rows) else (rope[0][index], rope[1][index])
            out = self._call(layers, part, part_rope, None, [rows[i] for i in members],
                             [starts[i] for i in members])
            if len(members) == len(rows):
                x = out
            else:
                x[index] = out
            took = time.perf_counter() - began
            in_calls += took
            for i in members:
                spent[i] += took
        for i, r in enumerate(rows):
            if r.keep_states or r.leader is not None:
                r.states.append(x[i, -1:].clone())
        choosing = [i for i, r in enumerate(rows) if r.leader is None]
        if choosing:
            self._choose([rows[i] for i in choosing],
                         dec.logits(x[:, -1] if len(choosing) == len(rows) else x[torch.tensor(choosing), -1]))
        for r in rows:
            if r.leader is not None:  # a following row: it chose nothing, and ends with its leader
                r.fed += 1
                r.finished = r.caught_up()
        total = time.perf_counter() - started
        self.steps += 1
        for i, r in enumerate(rows):  # the calls a row ran in, and the step's shared work (embed, head, choice)
            ms = (spent[i] + total - in_calls) * 1000.0
            r.trace.steps.append(StepRecord(steps[i], len(layer_sets[i]), layer_sets[i],
                                            r.schedule.skipped(steps[i]), ms, len(rows), self.steps - 1))

    def _call(self, layers, x, rope, mask, rows: list[Row], starts: list[int]) -> torch.Tensor:
        """`layers` on x for `rows` at their own columns, each with its own engine's adapter where they differ."""
        data = self.cache.data
        lora = None if all(r.engine is self.engine for r in rows) else [r.engine.decoder.fused for r in rows]
        return self.dec.fused.forward(layers, x, rope, mask, data[0, 0], max(starts), data.stride(1),
                                      data.stride(0), rows=torch.tensor([r.slot for r in rows], dtype=torch.int64),
                                      starts=torch.tensor(starts, dtype=torch.int64), lora=lora)

    def _choose(self, rows: list[Row], logits: torch.Tensor) -> None:
        """Each row's next token from its logits row, by its own sampling and generator; a beam search's rows
        by their search (`_search`)."""
        groups = {id(r.group): r.group for r in rows if r.group is not None}
        for group in groups.values():
            self._search(group, logits[torch.tensor([rows.index(r) for r in group.rows])])
        greedy = logits.argmax(dim=-1).tolist() if any(r.sampling.greedy for r in rows) else None
        for i, r in enumerate(rows):
            if r.group is not None:
                continue
            t = greedy[i] if r.sampling.greedy else int(next_tokens(logits[i:i + 1], r.sampling, r.generator)[0])
            r.token_ids.append(t)
            r.trace.generated_tokens += 1
            r.finished = (r.stop_at_eos and t in r.engine.eos_ids) or len(r.token_ids) == r.max_new_tokens
            if r.finished:
                r.trace.cache_lengths = list(self.cache.lengths[r.slot])


    def _search(self, group: Beams, logits: torch.Tensor) -> None:
        """One step of a beam search: each beam's next token and the beam it continues, whose cache columns
        past the prompt its row takes (in place; columns the schedule never ran are not copied)."""
        _, origin = group.search.step(logits)
        slots = torch.tensor([r.slot for r in group.rows])
        source = slots[origin]
        P = len(group.rows[0].prompt_ids)
        for layer, length in enumerate(self.cache.lengths[group.rows[0].slot]):
            if length > P and not torch.equal(source, slots):
                self.cache.data[layer, :, slots, :, P:length] = self.cache.data[layer, :, source, :, P:length]
        done = group.search.done
        for k, r in enumerate(group.rows):
            r.token_ids = list(group.search.running[0][k])
            r.trace.generated_tokens += 1
            r.finished = done
            if done:
                r.trace.cache_lengths = list(self.cache.lengths[r.slot])


def _width(rows: list[Row]) -> int:
    """The cache columns `rows` need, in whole WIDTH_QUANTUMs."""
    return -(-max(r.columns for r in rows) // WIDTH_QUANTUM) * WIDTH_QUANTUM


class _SlotView:
    """One slot of a SlotCache in the shape PrefixCache.store reads (data[:, :, 0] is the row)."""

    def __init__(self, cache: SlotCache, slot: int):
        self.data = cache.data[:, :, slot:slot + 1]


def segments(layer_sets: list[tuple[int, ...]], num_layers: int) -> list[tuple[list[int], list[int]]]:
    """(layers, rows) for each run of layers, bottom to top, that the same rows run (layers that no row runs
    between them do not break a run: every row passes them through); rows by index into `layer_sets`."""
    sets = [set(s) for s in layer_sets]
    out: list[tuple[list[int], list[int]]] = []
    for layer in range(num_layers):
        members = [i for i, s in enumerate(sets) if layer in s]
        if not members:
            continue
        if out and out[-1][1] == members:
            out[-1][0].append(layer)
        else:
            out.append(([layer], members))
    return out
