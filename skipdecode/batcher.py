"""Micro-batching: requests that arrive together with the same settings run as ONE engine batch.

This is what SkipDecode is for: every row of a batch shares one layer budget per position, so users who
ask at the same moment can share every forward pass instead of queueing behind each other. One worker
thread owns the compute. It waits for a request, gathers what else arrives within a short window (or
queued up while it was busy), groups the requests by engine, schedule, sampling (or beam search) and token limit, and runs
each group as one batch (a verified request, skipdecode/speculative/verify.py, always runs alone: a batch of one, since
rows accepting different numbers of drafts would drift apart in position). Batches that cannot merge run side by side, one position of each in turn, so
(for instance) a SkipDecode run and its full-decoding baseline see the same machine load. Each request
gets its own stream of partial results and learns which batch it ran in.

Where an engine runs its layers natively (the CPU default), requests (greedy, sampled or beam search,
any schedule) instead join their base model's continuous batch (skipdecode/slots.py) at any step: rows at
different positions, on different schedules and of different adapters over that base share every decode
step, and a finished row leaves at once. Verified requests keep the batches of one position
described above.

Pure Python and threading: no web framework is imported here.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .beam import Beam, BeamSearch
from .request import Request, check
from .sampling import Sampling
from .schedule import Schedule
from .slots import Beams, Row, Slots, base_of, serves
from .trace import Trace

DEFAULT_WINDOW_S = 0.05  # how long an idle worker waits for company after the first request arrives
DEFAULT_MAX_ROWS = 16  # rows per batch (the engine's packed weights are tuned for up to 16 rows)
DEFAULT_MAX_ACTIVE = 4  # batches running side by side; later arrivals wait and then batch together
STALL_GRACE_S = 5.0  # past its deadline, a reader stops waiting even if the worker never answers
TIME_LIMIT_MESSAGE = "the request ran past its time limit ({:g} s) and was stopped; ask for fewer new tokens"


@dataclass(frozen=True)
class Job:
    """One checked request (skipdecode/request.py) for one engine. Jobs with equal engine and settings can
    share a batch of one position; a beam search's job takes one row of its batch per beam."""

    engine: object
    request: Request
    states_from: int | None = None  # teacher-forced (scoring): no new token, the last hidden states from here
    # Continuous batch only: a teacher-forced job fed, after its prompt, the tokens of the job at this index among
    # those submitted together, as they come (scoring that ends with the answer it scores)
    follows: int | None = None
    keep_states: bool = False  # continuous batch only: a decoding job that also returns its last hidden states

    @classmethod
    def of(cls, engine, prompt, schedule: Schedule | None = None, max_new_tokens: int = 64,
           sampling: Sampling = Sampling(), stop_at_eos: bool = True, chat: bool | None = None,
           beam: Beam | None = None) -> "Job":
        """A job for `prompt`, checked here (skipdecode/request.py: ValueError on bad input)."""
        return cls(engine, check(engine, prompt, schedule, max_new_tokens, sampling, stop_at_eos, chat, beam))


@dataclass(frozen=True)
class BatchInfo:
    """Which batch a request ran in: `number` counts batches since the batcher started."""

    number: int
    size: int  # requests (rows) sharing the batch
    schedule: dict
    started: float  # time.time() at the start of the batch

    def to_dict(self) -> dict:
        return {"number": self.number, "size": self.size, "started": round(self.started, 3)}


@dataclass
class Update:
    """One request's view of its batch after a position: a snapshot, safe to keep. Its `text` is decoded
    where it is read, once (the worker that runs the batch never detokenizes)."""

    row: int  # this request's row in the batch
    batch: BatchInfo
    prompt_ids: list[int]
    token_ids: list[int]
    decoded: str | None  # the text, where it is known already (a replayed record); else `tokenizer` decodes it
    finished: bool  # this row has stopped (EOS or token limit)
    done: bool  # the whole batch has stopped and the trace is complete
    trace: Trace  # the batch's trace so far, shared by every row
    verification: dict | None = None  # a verified run's counts and marks (skipdecode/speculative/verify.py), else None
    states: torch.Tensor | None = None  # a teacher-forced request's last hidden states [positions, d]
    tokenizer: object = field(default=None, repr=False, compare=False)

    @property
    def text(self) -> str:
        if self.decoded is None:
            self.decoded = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        return self.decoded


@dataclass(eq=False)
class _Request:
    job: Job
    signal: threading.Condition  # shared by the requests submitted together, so one reader can follow them
    deadline: float | None
    limit_s: float | None = None  # the time limit the deadline came from, for the message
    inbox: deque = field(default_factory=deque)  # updates and errors not yet read
    cancelled: bool = False
    leader: "_Request | None" = None  # the request whose tokens this one is fed (Job.follows)
    rows: list = field(default_factory=list)  # its rows in a continuous batch, once admitted

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.job.request.prompt_ids)

    @property
    def key(self):
        alone = id(self) if getattr(self.job.engine, "batch_one", False) else None  # verified decoding: batch 1
        return id(self.job.engine), self.job.request.settings(), alone

    def send(self, item) -> None:
        with self.signal:
            self.inbox.append(item)
            self.signal.notify_all()

    def timed_out(self) -> TimeoutError:
        return TimeoutError(TIME_LIMIT_MESSAGE.format(self.limit_s or 0))

    def expire(self, now: float) -> None:
        """Past its deadline, the request is cancelled and told why (once)."""
        if self.deadline is not None and now > self.deadline and not self.cancelled:
            self.cancelled = True
            self.send(self.timed_out())


class Ticket:
    """A submitted request. Iterate it for its updates (the last one has `done` set); errors of its
    batch are raised from the iteration."""

    def __init__(self, request: _Request):
        self._request = request

    def __iter__(self) -> Iterator[Update]:
        return (updates[0] for updates in follow([self]))

    def result(self) -> Update:
        """Block until the request is complete; its final update."""
        last = None
        for last in self:
            pass
        return last

    def cancel(self) -> None:
        """Stop sending updates; the row stops growing at the next position, and a batch stops once
        none of its requests is left."""
        self._request.cancelled = True

    @property
    def prompt_ids(self) -> list[int]:
        return self._request.prompt_ids


def follow(tickets: Sequence[Ticket]) -> Iterator[tuple[Update | None, ...]]:
    """The newest update of every ticket, each time any of them moves, until all are done.

    Updates are cumulative snapshots, so a slow reader skips the ones it missed and loses nothing.
    Tickets followed together must come from one `submit_together` call. The worker stops a request at
    its deadline; should the worker itself be stuck, the reader gives up a little later on its own, so
    no request ever waits forever."""
    requests = [t._request for t in tickets]
    signal = requests[0].signal
    if any(r.signal is not signal for r in requests):
        raise ValueError("tickets followed together must be submitted together")
    deadline = requests[0].deadline
    latest: list[Update | None] = [None] * len(requests)
    while not all(u is not None and u.done for u in latest):
        with signal:
            wait = None if deadline is None else max(deadline + STALL_GRACE_S - time.monotonic(), 0.0)
            if not signal.wait_for(lambda: any(r.inbox for r in requests), wait):
                for r in requests:
                    r.cancelled = True
                raise requests[0].timed_out()
            arrived = [(i, list(r.inbox)) for i, r in enumerate(requests)]
            for r in requests:
                r.inbox.clear()
        for i, items in arrived:
            for item in items:
                if isinstance(item, BaseException):
                    raise item
                latest[i] = item
        yield tuple(latest)


class Batcher:
    """Runs engine work on one thread, batching the requests that arrive together.

    `window_s`: an idle worker's wait for company; `max_rows`: rows per batch; `max_active`: batches
    running side by side before new arrivals must wait (and so batch with each other);
    `time_limit_s`: a request's wall-time limit (None: none)."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, max_rows: int = DEFAULT_MAX_ROWS,
                 max_active: int = DEFAULT_MAX_ACTIVE, time_limit_s: float | None = None, history: int = 1000,
                 continuous: bool = True):
        if max_rows < 1 or max_active < 1:
            raise ValueError(f"max_rows and max_active must be >= 1; got {max_rows}, {max_active}")
        self.window_s, self.max_rows, self.max_active, self.time_limit_s = window_s, max_rows, max_active, time_limit_s
        self.continuous = continuous  # plain requests on a native engine join its continuous batch
        self._running: dict[tuple, _Continuous] = {}  # each base's continuous batch (slots.base_of)
        self._waiting: list[list[_Request]] = []  # groups for batches of one position, past max_active
        self._inbox: queue.Queue[list[_Request] | None] = queue.Queue()
        self._lock = threading.RLock()  # held for every forward pass; see `exclusive`
        self._numbers = itertools.count(1)
        self.history: deque[BatchInfo] = deque(maxlen=history)  # the most recent batches, oldest first
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="skipdecode-batcher", daemon=True)
        self._thread.start()

    # ---- the caller's side -------------------------------------------------------------------
    def submit(self, engine, prompt, schedule: Schedule | None = None, max_new_tokens: int = 64,
               sampling: Sampling = Sampling(), chat: bool | None = None, stop_at_eos: bool = True,
               beam: Beam | None = None) -> Ticket:
        return self.submit_together([Job.of(engine, prompt, schedule, max_new_tokens, sampling, stop_at_eos, chat,
                                            beam)])[0]

    def submit_together(self, jobs: Sequence[Job], time_limit_s: float | None = None) -> list[Ticket]:
        """Queue jobs that start in the same round (and can be followed together). Their requests were checked
        where they were made (Job.of, skipdecode/request.py), in the caller's thread, so bad input never
        reaches a batch shared with others; here only what this batcher cannot hold is refused."""
        if self._closed:
            raise RuntimeError("the batcher is closed")
        if not jobs:
            raise ValueError("no jobs given")
        limit = time_limit_s if time_limit_s is not None else self.time_limit_s
        deadline = time.monotonic() + limit if limit else None
        signal = threading.Condition()
        for job in jobs:
            if job.request.rows > self.max_rows:
                raise ValueError(f"at most {self.max_rows} beams (rows of a batch); got {job.request.rows}")
        requests = [_Request(job, signal, deadline, limit) for job in jobs]
        for request in requests:
            lead = request.job.follows
            if lead is None:
                continue
            if not (0 <= lead < len(jobs) and jobs[lead] is not request.job and request.job.states_from is not None
                    and self.follows_as_rows(jobs[lead].engine, request.job.engine) and not jobs[lead].request.beam):
                raise ValueError("a following job is teacher-forced and follows a plain job submitted with it, in "
                                 "one continuous batch (follows_as_rows)")
            request.leader = requests[lead]
        self._inbox.put(requests)
        return [Ticket(r) for r in requests]

    def scores_as_rows(self, engine) -> bool:
        """Whether `states` runs as a row of `engine`'s continuous batch (else it runs alone)."""
        return self._joins(engine)

    def follows_as_rows(self, leader, engine) -> bool:
        """Whether a teacher-forced row of `engine` can follow a row of `leader` as it decodes (Job.follows): both
        in one continuous batch."""
        return self._joins(leader) and self._joins(engine) and base_of(leader) == base_of(engine)

    def states(self, engine, ids: Sequence[int], start: int) -> torch.Tensor:
        """The last hidden states [len(ids) - start, d] of one full-depth, teacher-forced pass over `ids`:
        scoring, as a row of `engine`'s continuous batch that joins like a prompt, in chunks beside the decode
        steps (`scores_as_rows`; elsewhere scoring runs alone, under `exclusive`)."""
        if not 0 <= start < len(ids):
            raise ValueError(f"states from position {start} of {len(ids)}")
        job = Job(engine, check(engine, list(ids), max_new_tokens=1), states_from=start)
        if not self._joins(engine):
            raise ValueError(f"{engine.name} has no continuous batch to score in (scores_as_rows is False)")
        return self.submit_together([job])[0].result().states

    @contextmanager
    def exclusive(self):
        """Other work on a model (scoring, probing) runs between two positions of the running batches,
        never at the same time: on a CPU that would distort both timings."""
        with self._lock:
            yield

    def close(self, timeout: float = 5.0) -> None:
        self._closed = True
        self._inbox.put(None)
        self._thread.join(timeout)

    # ---- the worker's side -------------------------------------------------------------------
    def _work(self) -> None:
        active: list[_Batch] = []
        while not (self._closed and not active and not self._running):
            if not active and not self._running and not self._waiting:  # idle: block for a request
                first = self._inbox.get()
                if first is None:
                    return
                if not all(self._joins(r.job.engine) for r in first):  # a batch of one position: wait briefly for company
                    time.sleep(self.window_s)
                self._waiting.append(first)
                del first  # idle, this worker must not keep the last request's engine (and its memory) alive
            self._waiting += self._drain()
            groups, self._waiting = self._waiting, []
            for group in groups:  # continuous requests join now; the rest wait for a place among the batches
                later = [r for r in group if not (self._joins(r.job.engine) and self._join(r))]
                if later:
                    self._waiting.append(later)
            if len(active) < self.max_active and self._waiting:
                groups, self._waiting = self._waiting, []
                active += self._batches(groups)
            active = [batch for batch in active if batch.advance(self._lock)]
            for key, running in list(self._running.items()):
                if not running.advance(self._lock):
                    del self._running[key]

    def _joins(self, engine) -> bool:
        """Whether `engine`'s jobs decode in its base's continuous batch (native layers; verified decoding never)."""
        return self.continuous and not getattr(engine, "batch_one", False) and serves(engine)

    def _join(self, request: _Request) -> bool:
        """Hand `request` to its engine's continuous batch (made on first use); False if it fails to join."""
        if request.cancelled:
            return True
        key = base_of(request.job.engine)  # the adapters of one base share a continuous batch
        running = self._running.get(key)
        if running is None:
            running = self._running[key] = _Continuous(request.job.engine, self.max_rows, next(self._numbers))
            self.history.append(running.info)
        try:
            running.admit(request)
        except Exception as error:  # a request that cannot join fails alone
            _fail([request], error)
        return True

    def _drain(self) -> list[list[_Request]]:
        groups = []
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return groups
            if item is None:
                self._closed = True
                return groups
            groups.append(item)

    def _batches(self, groups: list[list[_Request]]) -> list["_Batch"]:
        """Requests with equal keys become batches of up to max_rows rows (a beam search's request takes
        one row per beam), in order of arrival."""
        by_key: dict[tuple, list[_Request]] = {}
        for request in (r for group in groups for r in group):
            if not request.cancelled:
                by_key.setdefault(request.key, []).append(request)
        batches = []
        for requests in by_key.values():
            per_batch = self.max_rows // requests[0].job.request.rows
            for start in range(0, len(requests), per_batch):
                chunk = requests[start: start + per_batch]
                info = BatchInfo(next(self._numbers), len(chunk), chunk[0].job.request.schedule.to_dict(), time.time())
                self.history.append(info)
                try:
                    batches.append(_Batch(chunk, info))
                except Exception as error:  # an engine that fails before its first position fails its batch
                    _fail(chunk, error)
        return batches


def _fail(requests: list[_Request], error: BaseException) -> None:
    for request in requests:
        if not request.cancelled:
            request.send(error)


class _Batch:
    def __init__(self, requests: list[_Request], info: BatchInfo):
        self.requests, self.info = requests, info
        self.stream = requests[0].job.engine.run([r.job.request for r in requests])
        self.generation = None

    def advance(self, lock) -> bool:
        """Run one position and publish it to every request; False once the batch is over."""
        now = time.monotonic()
        for request in self.requests:
            request.expire(now)
        if all(r.cancelled for r in self.requests):
            self.stream.close()
            return False
        if self.generation is not None:
            # A cancelled row counts as finished: the engine stops extending it and compacts it away
            # once that saves work, while the other rows of the batch go on.
            for row, request in enumerate(self.requests):
                if request.cancelled:
                    self.generation.finished[row] = True
        try:
            with lock:
                generation = self.generation = next(self.stream)
            trace = _snapshot(generation.trace)
            verification = getattr(generation, "verification", None)
            verification = verification.to_dict() if verification is not None else None
            for row, request in enumerate(self.requests):
                if not request.cancelled:
                    request.send(Update(row, self.info, request.prompt_ids, list(generation.token_ids[row]),
                                        None, generation.finished[row], generation.done, trace,
                                        verification, tokenizer=generation.tokenizer))
        except StopIteration:
            return False
        except Exception as error:  # a failed batch fails its own requests, never the worker
            _fail(self.requests, error)
            self.stream.close()
            return False
        return not generation.done


class _Continuous:
    """One base's continuous batch (skipdecode/slots.py) and the requests its rows belong to: each step's
    rows publish their requests' updates; requests past the batch's rows wait for a slot."""

    def __init__(self, engine, max_rows: int, number: int):
        self.engine, self.slots = engine, Slots(engine, max_rows)
        self.waiting: deque[list[Row]] = deque()  # each request's rows (a beam search's K), joining together
        self.info = BatchInfo(number, 0, {}, time.time())

    def admit(self, request: _Request) -> None:
        job, asked = request.job, request.job.request
        new = 0 if job.states_from is not None else asked.max_new_tokens
        if request.leader is not None:  # it scores its leader's answer: room for its columns
            new = request.leader.job.request.max_new_tokens
        rows = [Row(request.prompt_ids, asked.schedule, new, asked.sampling, asked.stop_at_eos, owner=request,
                    engine=job.engine, states_from=job.states_from, keep_states=job.keep_states)
                for _ in range(asked.rows)]
        if request.leader is not None:
            if not request.leader.rows:
                raise ValueError("a following job's leader has not joined this continuous batch")
            rows[0].leader = request.leader.rows[0]
        request.rows = rows
        if asked.beam:
            Beams(BeamSearch(asked.beam, 1, job.engine.eos_ids, asked.max_new_tokens, job.engine.decoder.device), rows)
        self.waiting.append(rows)

    def advance(self, lock) -> bool:
        """One step of the continuous batch; False once it holds no row and none waits."""
        now = time.monotonic()
        for row in (*self.slots.rows, *(r for rows in self.waiting for r in rows)):
            row.owner.expire(now)
            row.cancelled = row.owner.cancelled
        self.slots.drop_finished()
        self.waiting = deque(rows for rows in self.waiting if not rows[0].cancelled)
        while self.waiting and self.slots.room(len(self.waiting[0])):
            rows = self.waiting.popleft()
            try:
                for row in rows:
                    self.slots.add(row)
            except Exception as error:  # a request that cannot join fails alone
                _fail([rows[0].owner], error)
                for row in rows:
                    row.cancelled = True
        if not self.slots.rows:
            return bool(self.waiting)
        try:
            with lock:
                moved = self.slots.advance()
        except Exception as error:  # a failed step fails the requests of its rows, never the worker
            _fail([r.owner for r in self.slots.rows], error)
            for row in self.slots.rows:  # and ends them (a row waiting to follow one of them leaves too)
                row.cancelled = True
            self.slots = Slots(self.engine, self.slots.max_rows)
            return bool(self.waiting)
        self.info = dataclasses.replace(self.info, size=max(self.info.size, len(self.slots.rows)))
        for row in {id(r.owner): r.group.rows[0] if r.group else r for r in moved}.values():  # a row a request
            request = row.owner
            if request.cancelled:
                continue
            shared = max((step.rows for step in row.trace.steps), default=1)  # the most rows a step of it held
            info = BatchInfo(self.info.number, shared, row.schedule.to_dict(), self.info.started)
            states = torch.cat(row.states) if row.states and row.finished else None
            tokens = row.group.tokens if row.group else row.token_ids  # a search's: its best hypothesis so far
            request.send(Update(0, info, request.prompt_ids, list(tokens), None, row.finished, row.finished,
                                _snapshot(row.trace), states=states, tokenizer=row.engine.tokenizer))
        return True


def _snapshot(trace: Trace) -> Trace:
    """A trace as it stands, safe to keep while decoding appends to the original."""
    return dataclasses.replace(trace, steps=list(trace.steps), cache_lengths=list(trace.cache_lengths))
