"""From the studio's results to what the page shows: frames for the plots, and small HTML pieces.

Pure functions (no Gradio, no model): each takes results and returns a DataFrame, a figure or a string.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from skipdecode.evaluation.general import repetition
from skipdecode.evaluation.quality import common_prefix
from skipdecode.schedule import SPREAD, Schedule, for_speedup

from . import plots, rounds, timing
from .comparison import BatchRun, Comparison, TIMING_NOTE
from .results import BROKEN, LOOPING

EMPTY_OUTPUT = '<div class="sd-output sd-empty">The output appears here, token by token.</div>'


# ---- frames -------------------------------------------------------------------------------------
def scheduled_frame(schedule: Schedule, steps: int) -> pd.DataFrame:
    """The schedule's budget b(s) for the positions a run may reach."""
    return pd.DataFrame({"step": range(steps), "budget": [schedule.budget(s) for s in range(steps)]})


# Why the served adapters spend a flat budget: what was measured against the paper's decay, and where.
FLAT_MEASURED = {
    "e2e": ("docs/research/e2e-finetuning.md, “Other findings”: with the same recipe and only the budget's shape "
            "changed, the flat budget kept the validation loss below the decay's at every point of training, and "
            "on the test set it scored the higher BLEU at 5×, and at 3× once made-up names were in training."),
    "general": ("docs/research/general-adapters.md, “Round 16: results”: 60 more training steps on the decay left "
                "ROUGE-L against the full answer where it was (26.5 against 26.2) and almost doubled the perplexity "
                "ratio (6.44 against 3.69): the late tokens, on 5-6 layers, wrote text the full model finds "
                "unlikely."),
}


def paper_decay(comparison: Comparison) -> Schedule | None:
    """The paper's decaying budget at the same average as a flat one that ran (warm-up layers, then the most
    layers for the first token, fewer up to the horizon, never more later); None where the run decayed
    already, set its budgets by hand, or ran another mode or verified decoding."""
    sched, settings = comparison.schedule, comparison.settings
    if (sched.max_budget != sched.min_budget or sched.max_budget >= sched.num_layers or sched.mode != "skip"
            or comparison.verified
            or (settings is not None and settings.manual_budgets)):
        return None
    return for_speedup(sched.num_layers / sched.max_budget, sched.num_layers, sched.horizon, sched.warmup,
                       spread=SPREAD)


def flat_note_html(comparison: Comparison | None) -> str:
    """One line beside the budget chart when the run spent a flat budget: why the served adapter does, what was
    measured and where in a fold ("" where the run decayed, or where it ran no adapter)."""
    if comparison is None or paper_decay(comparison) is None or comparison.model.endswith(" (base)"):
        return ""
    sched = comparison.schedule
    measured = FLAT_MEASURED["general" if comparison.model.startswith("general") else "e2e"]
    return (f'<div class="sd-flat-note">This adapter spends a <b>flat budget</b>, {sched.max_budget} of '
            f"{sched.num_layers} layers for every token: trained on the paper's decaying budget (dotted) it wrote "
            f"worse answers. <details><summary>Measured</summary>{html.escape(measured)}</details></div>")


class TokenText:
    """The text each generated token adds, kept up to date as a stream grows: each new token costs one
    decode of the prefix, so a long output is not re-decoded from scratch at every position.

    Decoding prefixes keeps characters whole: a character whose UTF-8 bytes span several tokens (an
    emoji, most CJK) is shown on the token that completes it, the tokens before it adding nothing."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._ids: list[int] = []
        self._pieces: list[str] = []  # pieces of the tokens up to the last complete character
        self._text = ""  # the text of those tokens

    def pieces(self, token_ids: list[int]) -> list[str]:
        ids = list(token_ids)
        if ids[: len(self._pieces)] != self._ids[: len(self._pieces)]:
            self.__init__(self.tokenizer)  # another stream: start over
        self._ids = ids
        tail: list[str] = []
        for i in range(len(self._pieces), len(ids)):
            text = self.tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
            if text.endswith("\ufffd"):  # a character still missing bytes: wait for the token that ends it
                tail.append(text)
                continue
            new = text[len(self._text):] if text.startswith(self._text) else text[common_prefix(text, self._text):]
            self._pieces += [""] * len(tail) + [new]
            self._text, tail = text, []
        if tail:  # the output so far ends inside a character: show what there is on the last token
            return self._pieces + [""] * (len(tail) - 1) + [tail[-1][common_prefix(tail[-1], self._text):]]
        return list(self._pieces)


def token_pieces(tokenizer, token_ids: list[int]) -> list[str]:
    """The text each token adds (see TokenText); joined, the pieces are the decoded output."""
    return TokenText(tokenizer).pieces(token_ids)


def token_layers(update, num_layers: int) -> list[int]:
    """Layers run to choose each generated token: the prefill (all layers) chose the first one; the
    forward pass of position s chose token s + 1."""
    budgets = [s.budget for s in update.trace.steps]
    return [num_layers] + budgets[: max(len(update.token_ids) - 1, 0)]


# ---- HTML ---------------------------------------------------------------------------------------
# What gives a character meaning in HTML (tags, entities, attributes) or in Markdown (links, images,
# emphasis, headings, lists, code, autolinks): written as a character reference, it shows as itself in both.
_ACTIVE = {c: f"&#{ord(c)};" for c in "&<>\"'`*_[](){}#!|~\\:$+-.=^"}


def safe(text) -> str:
    """`text` (a prompt, a model's output, a field of a replayed file) as plain text in HTML and in Markdown
    alike: nothing in it can open a tag, a link or an image."""
    return "".join(_ACTIVE.get(c, c) for c in str(text))


def _shade(layers: int, num_layers: int) -> str:
    """Darker = more layers: indigo at an opacity that grows with the share of layers run."""
    alpha = 0.05 + 0.45 * layers / max(num_layers, 1)
    return f"rgba(79, 70, 229, {alpha:.2f})"


def tokens_html(pieces: list[str], layers: list[int], num_layers: int, streaming: bool = False) -> str:
    """Each token on a background whose depth shows the layers run to choose it."""
    if not pieces:
        return EMPTY_OUTPUT
    spans = []
    for index, (piece, n) in enumerate(zip(pieces, layers)):
        shown = html.escape(piece) or "&#8203;"  # newlines show as such: the output box keeps white space
        spans.append(f'<span class="sd-token" style="background:{_shade(n, num_layers)}" '
                     f'title="token {index + 1}: chosen after {n} of {num_layers} layers">{shown}</span>')
    cursor = '<span class="sd-cursor"></span>' if streaming else ""
    return f'<div class="sd-output">{"".join(spans)}{cursor}</div>'


def skip_title_html(comparison: Comparison) -> str:
    """The SkipDecode side's title: what it does, in the family the run chose, and the model it ran where the
    other side ran another."""
    if comparison.verified:
        text = "Verified: SkipDecode drafts, the full model checks every token"
    else:
        average = comparison.schedule.average_budget(max(comparison.max_new_tokens - 1, 1))
        text = f"SkipDecode: about {average:.0f} of {comparison.num_layers} layers for each token"
    return side_title(text, plots.SKIP, comparison.model if comparison.model != comparison.full_model else "")


def full_title_html(comparison: Comparison | None = None) -> str:
    """The full side's title, with its model where the SkipDecode side ran another."""
    differs = comparison is not None and comparison.model != comparison.full_model
    return side_title("Full decoding: all layers for every token", plots.FULL, comparison.full_model if differs else "")


def side_title(text: str, color: str, model: str = "") -> str:
    named = f'<span class="sd-side-model">{html.escape(model_name(model))}</span>' if model else ""
    return (f'<div class="sd-side-title"><span class="sd-dot" style="background:{color}"></span>'
            f"<span>{html.escape(text)}{named}</span></div>")


def legend_html(num_layers: int) -> str:
    stops = ", ".join(_shade(n, num_layers) for n in (1, num_layers // 2, num_layers))
    return ('<div class="sd-legend"><span>token shading: layers run to choose it</span>'
            f'<span class="sd-scale-label">1</span><span class="sd-scale" style="background:linear-gradient(90deg, '
            f'{stops})"></span><span class="sd-scale-label">{num_layers}</span></div>')


def plural(n: int, word: str) -> str:
    """'1 row', '4 rows'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def tokens(n: int) -> str:
    """'1 token', '37 tokens'."""
    return plural(n, "token")


def model_name(label: str) -> str:
    """A model's label as a person reads it, without the list's notes: 'e2e-all (fine-tuned for 2x, 3x, 5x)' is
    'the e2e-all adapter', 'SmolLM2-135M-Instruct (base)' is 'the base model'."""
    if label.endswith(" (base)"):
        return "the base model"
    return f"the {label.split(' (', 1)[0]} adapter"


def progress_label(comparison: Comparison) -> str:
    """The Run button while a comparison runs: how far it has got."""
    written = max(len(side.token_ids) if side else 0 for side in (comparison.skip, comparison.full))
    return f"Running… {written} of {tokens(comparison.max_new_tokens)}"


def stopped_banner(comparison: Comparison) -> str:
    """The line a stopped comparison puts above its headline."""
    counts = [len(side.token_ids) if side else 0 for side in (comparison.skip, comparison.full)]
    return (f'<span class="sd-replayed sd-stopped-badge">Stopped</span><span class="sd-detail">SkipDecode at '
            f"{tokens(counts[0])} and full decoding at {counts[1]} of {comparison.max_new_tokens}: both answers as far "
            "as they got, the figures over the tokens both reached.</span>")


def ended_html(message: str) -> str:
    """The headline of a run that an error ended after it had drawn (a time limit): what happened, in its place.
    `message` is escaped already (callbacks.for_the_user)."""
    return (f'<div class="sd-headline sd-slower"><div class="sd-verdict">Stopped: {message}</div>'
            '<div class="sd-same">The answers below are as far as they got.</div></div>')


def card(label: str, value: str, note: str = "", accent: str = "") -> str:
    return (f'<div class="sd-card {accent}"><div class="sd-card-label">{html.escape(label)}</div>'
            f'<div class="sd-card-value">{value}</div><div class="sd-card-note">{html.escape(note)}</div></div>')


def _x(value) -> str:
    return "–" if value is None else f"{value:.2f}×"


def metrics_html(comparison: Comparison | None) -> str:
    """Speed in four cards: the time to the whole answer and per decoded token (app/timing.py: the figures
    the headline and the latency chart give), the layers run, and the times themselves."""
    if comparison is None or comparison.skip is None:
        return ""
    speed, t = comparison.speedups(), timing.of(comparison)
    skip = comparison.skip.trace
    cards = [whole_answer_card(t, "SkipDecode"), decode_card(t, f"theoretical: {_x(speed['layers'])} by layers, "
                                                               f"{_x(speed['weights'])} by weights read"),
             card("layers per token", f"{skip.average_layers:.1f} <small>of {comparison.num_layers}</small>"
                   if skip.steps else "–", "SkipDecode's average"),
             times_card(t, "SkipDecode")]
    return '<div class="sd-cards">' + "".join(cards) + "</div>"


def whole_answer_card(t: timing.Timing | None, name: str) -> str:
    if t is None or t.end_to_end is None:
        return card("to the whole answer", "–", "")
    return card("to the whole answer", _x(t.end_to_end), f"full ms / {name} ms, prefill included; {t.spread()}",
                 "sd-accent")


def decode_card(t: timing.Timing | None, note: str) -> str:
    value = "–" if t is None or t.decode is None else _x(t.decode)
    spread = f"{t.decode_low:.2f}–{t.decode_high:.2f}× over the turns; " if t and t.decode_low else ""
    return card("per decoded token", value, spread + note)


def times_card(t: timing.Timing | None, name: str) -> str:
    if t is None or not t.tokens:
        return card("time", "–", "")
    return card("time", f"{t.skip_ms / 1000:.2f} <small>vs</small> {t.full_ms / 1000:.2f} s",
                 f"{name} vs full decoding to token {t.tokens}; prefill {t.skip_prefill_ms:.0f} vs "
                 f"{t.full_prefill_ms:.0f} ms")


def same_answer(comparison: Comparison) -> str:
    """Whether the two answers are the same, in a few words."""
    skip, full = comparison.skip.token_ids, comparison.full.token_ids if comparison.full else []
    if comparison.decoding.startswith("sampling"):
        return "Sampled: each side drew its own tokens, so the answers may differ by chance alone."
    if skip == full:
        return "The same answer as full decoding, token for token."
    n = common_prefix(skip, full)
    same = "the first token is the same" if n == 1 else f"the first {n} tokens are the same"
    if n == min(len(skip), len(full)):
        return f"One answer stops sooner; {same}."
    return f"The answers part at token {n + 1}: {same}." if n else "The answers differ from the first token."


def headline_html(comparison: Comparison | None, running: bool) -> str:
    """The result at a glance, above the answers: how much faster (app/timing.py's verdict) and whether the
    answers are the same; while running, how far each side has got."""
    if comparison is None or comparison.skip is None:
        return '<div class="sd-headline"><div class="sd-verdict">Running…</div></div>'
    name = "Verified" if comparison.verified else "SkipDecode"
    if running:
        counts = [f"{name}: {tokens(len(comparison.skip.token_ids))}"]
        if comparison.full:
            counts.append(f"full decoding: {len(comparison.full.token_ids)}")
        return f'<div class="sd-headline"><div class="sd-verdict">Running… {", ".join(counts)}</div></div>'
    t = timing.of(comparison)
    verdict = t.words(name) if t else "not timed"
    kind, same = t.verdict if t else "short", same_answer(comparison)
    fallen, loops = broken(comparison), looping(comparison)
    speed = ("its speed" + (f", {t.end_to_end:.2f}× full decoding's to the whole answer," if t and t.end_to_end else "")
             + f" buys nothing here. {same}")
    if fallen:  # the speed of an answer that has fallen apart is no result: that comes first, and no "faster"
        ppl, kind = comparison.quality["perplexity"], "broken"
        verdict = (f"{name}'s answer has fallen apart: the full model finds it {fallen:,.0f}× less likely than its "
                   "own")
        same = f"Perplexity {ppl['skipdecode']:,.0f} against {ppl['full']:,.2f}; {speed}"
    elif loops:  # fluent, likely, and saying the same thing again: no "faster" either
        kind = "broken"
        verdict = f"{name}'s answer loops: {100 * loops[0]:.0f}% of its word triples repeat earlier ones"
        same = f"Full decoding's answer repeats {100 * loops[1]:.0f}% of its own; {speed}"
    detail = (f"Per decoded token {_x(t.decode)}, prefill {t.skip_prefill_ms:.0f} ms vs {t.full_prefill_ms:.0f} ms; "
              f"spread: {t.spread()}." if t and t.decode else "")
    detail = f"{detail} {sharing(comparison) or ''}".strip()
    return (f'<div class="sd-headline sd-{kind}"><div class="sd-verdict">{html.escape(verdict[0].upper() + verdict[1:])}'
            f'</div><div class="sd-same">{html.escape(same)}</div>'
            f'<div class="sd-detail">{html.escape(detail)}</div></div>')


def broken(comparison: Comparison) -> float | None:
    """How many times less likely the full model finds the SkipDecode answer than its own (the ratio of their
    perplexities under it), where that is past results.BROKEN: the answer has fallen apart (word salad). None
    where it has not, where nothing is scored yet, and for verified decoding (its answer is full depth's)."""
    ppl = (comparison.quality or {}).get("perplexity") or {}
    skip, full = ppl.get("skipdecode"), ppl.get("full")
    if comparison.verified or not skip or not full:
        return None
    return skip / full if skip / full > BROKEN else None


def looping(comparison: Comparison) -> tuple[float, float] | None:
    """(SkipDecode's, full decoding's) share of word triples that repeat earlier ones in their answers, where
    SkipDecode's answer loops (past results.LOOPING) and full decoding's does not: a fluent answer the full
    model finds likely, saying the same thing again. None otherwise, before both answers are done, and for
    verified decoding (its answer is full depth's)."""
    skip, full = comparison.skip, comparison.full
    if comparison.verified or not comparison.done or skip is None or full is None:
        return None
    shares = repetition(skip.text), repetition(full.text)
    return shares if shares[0] > LOOPING >= shares[1] else None


def _fmt(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def quality_html(comparison: Comparison | None) -> str:
    """Quality side by side: SkipDecode against full decoding, and both against E2E references."""
    if comparison is None or comparison.quality is None:
        return ('<div class="sd-quality sd-empty">Quality scores appear when both runs have finished.</div>')
    q = comparison.quality
    vs_full = q["skipdecode_vs_full"] or {}
    agree, ppl, refs = q["token_agreement"], q["perplexity"], q["references"]
    head = "<thead><tr><th></th><th>SkipDecode</th><th>full decoding</th></tr></thead>"
    rows = [
        ("BLEU vs the full output", _fmt(vs_full.get("bleu")), "reference"),
        ("ROUGE-L vs the full output", _fmt(vs_full.get("rouge_l")), "reference"),
        ("token agreement with full", f"{100 * agree['agreement']:.0f}% <small>(first {agree['prefix']} equal)</small>",
         "reference"),
        ("perplexity under the full model", _fmt(ppl["skipdecode"], 2), _fmt(ppl["full"], 2)),
    ]
    if comparison.skip is not None and comparison.full is not None:  # loops show here, whichever side loops
        rows.append(("word triples said before (loops)", f"{100 * repetition(comparison.skip.text):.0f}%",
                     f"{100 * repetition(comparison.full.text):.0f}%"))
    if refs:
        n = len(comparison.references)
        rows += [(f"BLEU vs {n} E2E references", _fmt(refs["skipdecode"]["bleu"]), _fmt(refs["full"]["bleu"])),
                 (f"ROUGE-L vs {n} E2E references", _fmt(refs["skipdecode"]["rouge_l"]),
                  _fmt(refs["full"]["rouge_l"]))]
    body = "".join(f"<tr><td>{label}</td><td>{a}</td><td>{'<i>—</i>' if b == 'reference' else b}</td></tr>"
                   for label, a, b in rows)
    against = (f'<div class="sd-note">Compared against full decoding of the same prompt with the same '
               f"settings: {html.escape(comparison.full_model)}, all {comparison.num_layers} layers; the perplexity "
               "is that model's.</div>")
    note = ("" if refs else '<div class="sd-note">Scores against references appear for E2E test '
            "meaning representations (try one of the restaurant examples).</div>")
    return f'<div class="sd-quality"><table>{head}<tbody>{body}</tbody></table>{against}{note}</div>'


def status_markdown(comparison: Comparison | None, running: bool) -> str:
    """The run's details in plain words (which model each side ran and why, how the requests were batched, the
    schedule, the decoding), then the weights, kernels and batch numbers in a fold for developers."""
    if comparison is None or comparison.skip is None:
        return "Waiting for the batcher…" if running else ""
    skip, full = comparison.skip, comparison.full
    sched = comparison.schedule
    where = sharing(comparison) or (f"SkipDecode ran as {_rows(skip.batch.size)}, full decoding as "
                                    f"{_rows(full.batch.size)}." if full else "")
    plan = (f"Schedule: {sched.max_budget} of {sched.num_layers} layers a token at first, down to {sched.min_budget} "
            f"over {sched.horizon} positions ({sched.decay} decay), the bottom {sched.warmup} always run (warm-up), "
            f"mode {sched.mode}. Decoding: {safe(comparison.decoding)}.")
    state = "Running…" if running else "Stopped." if comparison.stopped else "Done."
    labels, why = (comparison.model, comparison.full_model), comparison.why
    batches = (f" SkipDecode ran in batch #{skip.batch.number}, full decoding in batch #{full.batch.number}." if full
               else "")
    developers = (f"\n\n<details><summary>For developers: weights, kernels and batches</summary>\n\n"
                  f"{_models(labels, why, comparison.dtypes)}{batches}\n\n</details>")
    return f"{state} {_plain_models(labels, why)} {where} {plan}  \n<small>{TIMING_NOTE}</small>{developers}"


def sharing(comparison: Comparison) -> str | None:
    """How many other visitors' rows shared this comparison's decode steps, in a continuous batch (its steps
    carry the batch's tick, skipdecode/slots.py), beyond its own: both sides and, but for a beam search, the row
    that scores the SkipDecode answer as it comes (Studio.jobs); None for batches of one position."""
    sides = [u for u in (comparison.skip, comparison.full) if u is not None]
    steps = [s for u in sides for s in u.trace.steps]
    if not steps or any(s.tick is None for s in steps):
        return None
    own = 1
    if len({u.batch.number for u in sides}) == 1 and len(sides) == 2:  # both sides in one batch: their 2 rows,
        own = 2 if comparison.decoding.startswith("beam search") else 3  # and the row scoring SkipDecode's (Studio.jobs)
    others = max(s.rows for s in steps) - own
    if others <= 0:
        return "No other visitor's answer was decoding meanwhile: its steps ran its own rows alone."
    return (f"Its steps were shared with up to {others} other {'row' if others == 1 else 'rows'} (other visitors' "
            "answers), each at its own position and budget.")


def _plain_models(labels: tuple[str, str], why: tuple[str, str]) -> str:
    """Which model each side ran and why, in words: 'the general-3x adapter (a general prompt at 3x)'."""
    names = [safe(model_name(label)) for label in labels]  # a replayed file's model names are anyone's
    if why == ("chosen", "chosen"):
        return f"Model: **{names[0]}**, on both sides (chosen in the settings)."
    reasons = [safe(reason.split(": ", 1)[-1]) for reason in why]
    return f"SkipDecode: **{names[0]}** ({reasons[0]}); full decoding: **{names[1]}** ({reasons[1]})."


def _models(labels: tuple[str, str], why: tuple[str, str], dtypes: tuple[str, ...] = ()) -> str:
    """Which model each side ran, and why "auto" picked it."""
    extra = [f", {safe(d)}" for d in dtypes] or ["", ""]
    labels = tuple(safe(label) for label in labels)  # a replayed file's model names are anyone's
    if why == ("chosen", "chosen"):
        return f"Model: **{labels[0]}** (chosen{extra[0]})."
    why_skip, why_full = (safe(w) for w in why)  # "auto": which adapter each side ran, and why
    return (f"SkipDecode: **{labels[0]}** ({why_skip}{extra[0]}); full decoding: **{labels[1]}** "
            f"({why_full}{extra[1]}).")


def _rows(n: int) -> str:
    return "1 request" if n == 1 else f"{n} requests batched together"


def compare_figures(comparison: Comparison):
    """(budget, layer map, latency) figures of a finished comparison: for verified decoding, its rounds
    (app/rounds.py) in the first two."""
    if comparison.skip is None or not comparison.skip.trace.steps:
        waiting = plots.empty_figure("Nothing was decoded after the first token")
        return waiting, waiting, waiting
    L, sched = comparison.num_layers, comparison.schedule
    positions = max(comparison.max_new_tokens - 1, len(comparison.skip.trace.steps), 1)  # the last is never fed
    warmup = sched.warmup if sched.mode == "skip" else 0
    if comparison.verified:
        drafts, passes = rounds.frames(comparison)
        budget = plots.rounds_budget_figure(drafts, passes, scheduled_frame(sched, positions), L)
        layer_map = plots.rounds_map_figure(drafts, passes, L, warmup)
    else:
        skip = comparison.skip.trace.to_frame()
        decay = paper_decay(comparison)
        budget = plots.budget_figure(skip, scheduled_frame(sched, positions), L,
                                     None if decay is None else scheduled_frame(decay, positions))
        layer_map = plots.layer_map_figure(skip, L, comparison.skip.trace.prompt_tokens, warmup)
    if comparison.full is None or not comparison.full.trace.steps:
        return budget, layer_map, plots.empty_figure("Full decoding decoded nothing after the first token")
    t = timing.of(comparison)
    name = "verified" if comparison.verified else "SkipDecode"
    title = t.words(name) if t else None
    if t and t.end_to_end and broken(comparison):  # no "faster" over word salad here either
        title = f"{name} {t.end_to_end:.2f}× the speed, on an answer that has fallen apart"
    elif t and t.end_to_end and looping(comparison):  # nor over an answer going round in circles
        title = f"{name} {t.end_to_end:.2f}× the speed, on an answer that loops"
    return budget, layer_map, plots.latency_figure(timing.token_frame(comparison.skip.trace),
                                                   timing.token_frame(comparison.full.trace), title, name)


# ---- KV cache -----------------------------------------------------------------------------------
def cache_panels(comparison: Comparison, exits: list[int]) -> list[tuple[str, np.ndarray]]:
    """Cache states under SkipDecode (the layers its trace ran) and under per-token early exit (each
    position runs layers [0, exit)), on the same positions: the prompt, then the generated ones fed back."""
    L, skip = comparison.num_layers, comparison.skip
    prompt = [range(L)] * skip.trace.prompt_tokens
    skipdecode = prompt + [step.layers for step in skip.trace.steps]
    # exits[k] is the depth that chose token k; position P + k (feeding token k) chose token k + 1.
    early = prompt + [range(e) for e in exits[1:]]
    width = min(len(skipdecode), len(early))
    return [("SkipDecode", plots.cache_states(plots.holdings(skipdecode[:width], L))),
            ("per-token early exit", plots.cache_states(plots.holdings(early[:width], L)))]


# ---- Batch --------------------------------------------------------------------------------------
def batch_cells(run: BatchRun) -> pd.DataFrame:
    """(row, step, budget, tick) for every position each prompt's row still needed: `tick`, the running
    batch's step it ran in (a continuous batch, skipdecode/slots.py: rows join and leave at their own steps),
    else the position itself (a batch of one position: every row in step)."""
    cells = []
    for row, update in enumerate(run.skip):
        if update is None:
            continue
        steps = update.trace.steps
        useful = max(len(update.token_ids) - 1, 0) if update.finished else len(steps)
        cells += [{"row": row, "step": s.step, "budget": s.budget, "tick": s.step if s.tick is None else s.tick}
                  for s in steps[:useful]]
    return pd.DataFrame(cells, columns=["row", "step", "budget", "tick"])


def batch_table(run: BatchRun) -> pd.DataFrame:
    """The batch's outputs for people: each prompt by its number from 1, both answers, and how many tokens each
    side wrote."""
    rows = []
    for i, prompt in enumerate(run.prompts):
        skip = run.skip[i] if i < len(run.skip) else None
        full = run.full[i] if i < len(run.full) else None
        rows.append({"prompt #": i + 1, "prompt": prompt, "SkipDecode": skip.text if skip else "",
                     "full decoding": full.text if full else "",
                     "SkipDecode tokens": len(skip.token_ids) if skip else 0})
    return pd.DataFrame(rows)


def batch_status(run: BatchRun) -> str:
    """Where a batch stands, in words: the models, each side's rows and its decode speed (the batch numbers stay
    in the API's answer, for developers)."""
    skip = next((u for u in run.skip if u is not None), None)
    full = next((u for u in run.full if u is not None), None)
    if skip is None:
        return "Waiting for the batcher…"
    parts = [f"SkipDecode: {plural(skip.batch.size, 'row')} in one batch, {skip.trace.decode_tokens_per_s:.0f} "
             "tokens per second"]
    if full is not None:
        parts.append(f"full decoding: {plural(full.batch.size, 'row')} in one batch, "
                     f"{full.trace.decode_tokens_per_s:.0f} tokens per second")
    return ("Running… " if not run.done else "Done. ") + _plain_models(run.models, run.why) + " " + "; ".join(parts) + "."


# The throughput measurement's columns as people read them (studio.Studio.throughput keeps its own names).
THROUGHPUT = {"batch_size": "batch size (rows)", "method": "method", "tokens_per_s": "decode tokens per second",
              "ms_per_step": "ms per decode step"}


def throughput_table(table: pd.DataFrame) -> pd.DataFrame:
    """The throughput runs for people: named columns with units, without the batcher's internal batch numbers."""
    return table[[c for c in THROUGHPUT if c in table.columns]].rename(columns=THROUGHPUT)
