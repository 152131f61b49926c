"""The draft's LM head over a shortlist of the vocabulary (FR-Spec: Zhao et al. 2025, frequency-ranked drafting).

A 3x draft step runs a third of the layers but the whole LM head, 49,152 x 576: about a fifth of a full-depth
token's work, as much as its ten layers (docs/method.md, "The cost model"). A draft is only a proposal that the
verifier checks, so it may choose among fewer tokens: its task's most frequent ones, counted on its training
split (`count`, shipped beside the adapter as shortlist.json), and the request's own tokens (the prompt's and
the answer's so far: an E2E answer copies its MR's names). A token outside them is never drafted; where the
verifier wants one, the round ends there and the verifier's token is emitted. So the output is the verifier's
whatever the shortlist; only the drafts' cost and acceptance move.
"""

from __future__ import annotations

import json
import weakref
from collections import Counter
from pathlib import Path
from typing import Iterable

import torch

FILE = "shortlist.json"  # in an adapter's folder: {"ids": [...], "counted_on": "..."}, most frequent first


def count(sequences: Iterable[Iterable[int]], size: int | None = None) -> list[int]:
    """The `size` most frequent token ids of `sequences` (None: all), most frequent first (ties by id)."""
    counts = Counter(i for ids in sequences for i in ids)
    return [int(t) for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]]


def load(folder: str | Path | None) -> list[int] | None:
    """The shortlist shipped in an adapter's folder (None: the adapter has none, drafts use the whole head),
    read once per file version: the app makes a verified pair for every request."""
    path = Path(folder) / FILE if folder is not None else None
    try:
        stat = path.stat() if path is not None else None
    except OSError:
        return None
    if stat is None or not path.is_file():
        return None
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _READ:
        if len(_READ) >= 16:  # a few adapters' shortlists; a replaced file's old version goes first
            _READ.pop(next(iter(_READ)))
        _READ[key] = [int(i) for i in json.loads(path.read_text(encoding="utf-8"))["ids"]]
    return list(_READ[key])


_READ: dict[tuple[str, int, int], list[int]] = {}  # (file, its mtime and size) -> its ids


class ShortlistHead:
    """The decoder's LM head restricted to `ids`: on the 4-bit path the same screen-and-rescore head
    (q4.RescoredHead) over those rows, elsewhere those rows of the float matrix."""

    def __init__(self, dec, ids: Iterable[int]):
        from ..kernels.q4 import RescoredHead

        head = dec.lm_head
        vocab = dec.embed_tokens.shape[0]
        self.ids = torch.tensor(sorted({int(i) for i in ids if 0 <= int(i) < vocab}), dtype=torch.long)
        if isinstance(head, RescoredHead):
            self.exact, self.bias = head.exact, None
            self.head = RescoredHead(head.exact, rescore=min(head.rescore, len(self.ids)), rows=self.ids)
        else:
            from ..transformer import Linear

            self.exact, self.bias = head.weight, head.bias
            self.head = Linear(head.weight[self.ids].contiguous(),
                               None if head.bias is None else head.bias[self.ids].contiguous(), head.packed is not None)
        self.members = frozenset(self.ids.tolist())
        self.vocab = vocab

    def request(self, tokens: Iterable[int]) -> "RequestVocabulary":
        return RequestVocabulary(self, tokens)


class RequestVocabulary:
    """One request's draft vocabulary: the shortlist and the request's tokens outside it (their logits from
    the exact rows, as the full head's rescoring gives them)."""

    def __init__(self, head: ShortlistHead, tokens: Iterable[int]):
        self.head, self.extra = head, []
        self.ids, self._rows, self._bias = head.ids, None, None
        self.add(tokens)

    def add(self, tokens: Iterable[int]) -> None:
        """Tokens of the request (prompt, or answer so far) that the shortlist lacks join the vocabulary."""
        new = sorted({int(t) for t in tokens if 0 <= int(t) < self.head.vocab} - self.head.members - set(self.extra))
        if not new:
            return
        self.extra += new
        extra = torch.tensor(self.extra, dtype=torch.long)
        self.ids = torch.cat([self.head.ids, extra])
        self._rows = self.head.exact[extra].float()
        self._bias = None if self.head.bias is None else self.head.bias[extra].float()

    def logits(self, dec, x: torch.Tensor) -> torch.Tensor:
        """Logits [rows, len(self.ids)] of the draft's last hidden states x [rows, hidden], in self.ids's order."""
        h = dec._norm(x, dec.final_norm)
        short = self.head.head(h).float()
        if self._rows is None:
            return short
        more = h.float() @ self._rows.T
        if self._bias is not None:
            more = more + self._bias
        return torch.cat([short, more], dim=-1)

    def spread(self, p: torch.Tensor) -> torch.Tensor:
        """A distribution over self.ids as one over the whole vocabulary (zero elsewhere)."""
        full = p.new_zeros(*p.shape[:-1], self.head.vocab)
        return full.index_copy_(-1, self.ids, p)


_HEADS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # LM head -> {shortlist: ShortlistHead}


def shortlist_head(dec, ids: list[int] | None) -> ShortlistHead | None:
    """The decoder's head restricted to `ids` (None: no shortlist), made once per head and shortlist."""
    if not ids:
        return None
    made = _HEADS.setdefault(dec.lm_head, {})  # adapters of one base share their head, and so its shortlist
    key = tuple(ids)
    if key not in made:
        made[key] = ShortlistHead(dec, ids)
    return made[key]
