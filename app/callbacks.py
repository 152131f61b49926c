"""What each button does: plain functions from the widgets' values to the widgets' new values.

They validate, call the studio, and turn its results into page content with `views` and `plots`.
A ValueError (bad input) or TimeoutError (time limit) becomes a gr.Error with its message; anything else
is logged with its traceback on the server and the person gets a plain apology. Either way the server
stays up, and no stack trace or local path reaches the browser.
"""

from __future__ import annotations

import logging
import re
import time
from contextlib import contextmanager

import gradio as gr

from skipdecode.evaluation.bench.figure import speed_figure
from skipdecode.schedule import max_speedup

from . import plots, replay, verified, views
from .choices import AUTO
from .results import NOTES, for_people, load_table
from .settings import Settings, shown
from .studio import Studio

# While a comparison streams, its text updates at most every TEXT_EVERY_S and its plots are drawn when it
# ends. Each update is HTML the server builds and a browser on the same machine renders while the batcher
# times the decode steps; redrawing the three plots as tokens came in made the page's measured speedup read
# 0.81x the API's for the same request (median of 5), text every 0.5 s and plots at the end 0.95x
# (experiments/page_speedup.py, docs/research/engine-speed.md). A side's first token is drawn when it comes,
# whatever the interval: a run shorter than TEXT_EVERY_S still shows both answers start. The Batch tab, which
# shows no speedup, redraws every PLOT_EVERY_S.
TEXT_EVERY_S = 0.5
PLOT_EVERY_S = 0.75
DECODINGS = ("greedy", "sampling", "beam search")
KV_FIRST = ("Run a comparison on the Compare tab first (or replay one): this view then shows which positions each "
            "layer of that run holds in its KV cache.")
INTERNAL_ERROR = ("Something went wrong on the server while running this request; it has been logged. "
                  "Please try again, or change the input or the model.")
MESSAGE_CHARS = 400  # an error message longer than this is cut
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.@+~-]+){2,}[\\/]?")  # /a/b, C:\a\b: local paths
_TAG = re.compile(r"<(?=[A-Za-z/!?])")  # what starts a tag, a comment or a declaration
log = logging.getLogger("skipdecode.app")


def for_the_user(error: BaseException) -> str:
    """An error's message with local paths taken out, cut to a readable length, and with anything that
    would open an HTML tag escaped: Gradio shows the message as HTML, and it may quote what the user sent
    (plain comparisons such as ">= 1" stay as they are for API clients)."""
    message = _PATH.sub("[path]", str(error)).strip() or type(error).__name__
    message = message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 1] + "…"
    return _TAG.sub("&lt;", message.replace("&", "&amp;"))


def message_for(error: BaseException) -> str:
    """What the person reads about `error` (called where it was caught): bad input and time limits in their own
    words, a gr.Error as it is, anything else logged with its traceback on the server and an apology."""
    if isinstance(error, gr.Error):
        return error.message
    if isinstance(error, (ValueError, TimeoutError)):
        return for_the_user(error)
    log.exception("internal error while serving a request")
    return INTERNAL_ERROR


@contextmanager
def user_errors():
    """Bad input and time limits as messages for the person, anything else as an apology; never a
    traceback. gr.Error passes through: it is a message already."""
    try:
        yield
    except gr.Error:
        raise
    except Exception as error:
        raise gr.Error(message_for(error), print_exception=False) from None


def refused(message: str) -> str:
    """A refusal beside what caused it (the prompt, a replayed file); `message` is escaped already. Each one is
    new HTML (its time in it), so the page can tell it from the one before (keys.NOTE_JS)."""
    return f'<div class="sd-refused" role="alert" data-at="{time.time():.3f}">{message}</div>'


def settings_from(speedup, max_new_tokens, decoding="greedy", temperature=0.7, top_p=0.9, top_k=0, seed=0,
                  manual=False, max_budget=20, min_budget=6, warmup=2, horizon=0, decay="linear",
                  mode="skip", beams=4, verify=False) -> Settings:
    if decoding not in DECODINGS:
        raise ValueError(f"decoding must be one of {', '.join(DECODINGS)}; got {shown(decoding)}")
    return Settings(speedup=speedup, max_new_tokens=max_new_tokens, manual_budgets=bool(manual),
                    max_budget=max_budget, min_budget=min_budget, warmup=warmup, horizon=horizon or 0,
                    decay=decay, mode=mode, sampling=decoding == "sampling", temperature=temperature,
                    top_p=top_p, top_k=top_k or 0, seed=seed if seed is not None else 0,
                    beams=beams if decoding == "beam search" else 0, verify=bool(verify))


def drawn(comparison, skip_pieces: list[str], full_pieces: list[str], running: bool = False,
          banner: str = "", reveal: str = "") -> list:
    """What a comparison draws, in the order of the layout's `drawn_outputs`: the results (shown), the headline,
    both sides' titles, both answers, the legend that fits the mode, the run's details, the
    comparison itself, and once it is done the cards and charts. `banner`: the line a replay (or a stopped
    run) puts first; `reveal`: the run's (or the replay's) own mark, which brings it into view (keys.REVEAL_JS)."""
    if comparison.verified:
        skip_html = verified.tokens_html(skip_pieces, (comparison.skip.verification or {}).get("marks", []),
                                         streaming=running and not comparison.skip.finished)
    else:
        skip_html = views.tokens_html(skip_pieces, views.token_layers(comparison.skip, comparison.num_layers),
                                      comparison.num_layers, streaming=running and not comparison.skip.finished)
    full = comparison.full
    full_html = (views.tokens_html(full_pieces, views.token_layers(full, comparison.num_layers), comparison.num_layers,
                                   streaming=running and not full.finished) if full else views.EMPTY_OUTPUT)
    legend = verified.legend_html() if comparison.verified else views.legend_html(comparison.num_layers)
    out = [gr.Column(visible=True),
           f'<div data-reveal="{reveal}">{banner}{views.headline_html(comparison, running)}</div>',
           views.skip_title_html(comparison), views.full_title_html(comparison), skip_html, full_html, legend,
           views.status_markdown(comparison, running), comparison if not running else gr.skip()]
    if running:  # the last comparison's cards and charts go until this one's are drawn
        return out + [gr.Column(visible=False)] + [gr.skip()] * (len(DRAWN) - len(out) - 1)
    metrics = (verified.summary_html if comparison.verified else views.metrics_html)(comparison)
    flat = views.flat_note_html(comparison)  # a flat budget: why, and the paper's decay one click away
    return out + [gr.Column(visible=True), metrics, views.quality_html(comparison), *views.compare_figures(comparison),
                  gr.HTML(flat, visible=bool(flat)), gr.Button(visible=bool(flat))]


RUN = "Run"  # the Run button's label when it can run; while a run goes, it says how far (views.progress_label)
# The layout's output lists, by name: what `drawn` draws, and what stream_compare adds after it.
DRAWN = ("results", "headline", "skip_title", "full_title", "skip_out", "full_out", "legend", "status", "last",
         "charts", "metrics", "quality", "budget_plot", "layer_plot", "latency_plot", "flat_note", "paper_decay")
DRAWN_COUNT = len(DRAWN)
STREAMED = ("teach_box", "part_note", "stop", "stop_here", "run", "prompt_note", "fresh")


def stop_run(stopper: dict):
    """Stop: the running comparison ends at its next position and is drawn as it stands (Callbacks.stream_compare
    asks `stopper` after every position)."""
    stopper["stop"] = True
    return gr.Button("Stopping…", interactive=False)


def refusal(message: str) -> list:
    """stream_compare's answer to bad input: the message beside the prompt, Run ready again, nothing else
    touched (no error status on the results, which stay the last comparison's)."""
    return [gr.skip()] * (DRAWN_COUNT + 2) + [gr.Button("Stop", interactive=False), gr.skip(),
                                              gr.Button(RUN, interactive=True),
                                              gr.update(value=refused(message), visible=True), None]


class Callbacks:
    def __init__(self, studio: Studio):
        self.studio = studio

    # ---- Compare ----------------------------------------------------------------------------
    def preview(self, model, speedup, max_new_tokens, manual, max_budget, min_budget, warmup, horizon, decay, mode,
                prompt=None):
        """The schedule the settings describe for this prompt, before anything runs (no model call): the budget
        plot and its note in the settings, and beside the speedup slider only what a visitor must know first
        (the speedup "auto" really runs, or that it runs a model never trained to skip)."""
        engine = self.studio.engine()  # every configured model shares the base's layers
        try:
            with user_errors():
                settings = settings_from(speedup, max_new_tokens, manual=manual, max_budget=max_budget,
                                         min_budget=min_budget, warmup=warmup, horizon=horizon, decay=decay,
                                         mode=mode)
                choice, why, settings = self.studio.resolve(settings, model, prompt)
                schedule = settings.schedule(engine.num_layers, choice.horizon, self.studio.limits, choice.spread)
                steps = max(int(settings.max_new_tokens) - 1, 1)
        except gr.Error as error:
            return (plots.empty_figure(f"Invalid schedule: {error.message}"), f"⚠️ {error.message}",
                    gr.Markdown(f"⚠️ {error.message}", visible=True))
        frame = views.scheduled_frame(schedule, steps)
        average = frame["budget"].mean()
        limit = max_speedup(engine.num_layers, schedule.warmup)
        note = (f"Average **{average:.1f} of {engine.num_layers} layers** per generated token over "
                f"{steps} positions: {engine.num_layers / average:.2f}× fewer layers "
                f"(this warm-up allows up to {limit:.0f}×).")
        first = ""
        if not manual and settings.speedup != float(speedup):
            first = (f"For this prompt \"auto\" runs {choice.adapter} at {settings.speedup:g}×, the nearest speedup "
                     f"it was trained for.")
        elif not manual and model == AUTO and choice.adapter is None and settings.speedup > 1:
            reason, trained = why.removeprefix("base model: "), self.studio.adapter_speedups(prompt)
            has = f" (this kind of prompt has adapters for {trained})." if trained else "."
            first = (f"⚠️ {reason[0].upper()}{reason[1:]}, so \"auto\" runs the base model, which was never trained "
                     f"to skip layers: its text degrades as the speedup grows, to word salad at 3×{has}")
        return (plots.budget_figure(frame.iloc[0:0], frame, engine.num_layers), f"{note} {first}".strip(),
                gr.Markdown(first, visible=bool(first)))

    def stream_compare(self, prompt, model, speedup, max_new_tokens, decoding, temperature, top_p, top_k, seed,
                       manual, max_budget, min_budget, warmup, horizon, decay, mode, beams=4, family=None,
                       stopper=None):
        """The comparison as it streams: the answers as they grow, the headline, then once both are done (or
        Stop, through `stopper`, ended them) the cards and charts (`drawn`); then what the comparison before
        opened (its layer view, hidden; what its marks said, emptied), Stop (usable while it runs), Run (saying
        how far the run has got), the note beside the prompt, and the finished comparison for what it opens.
        Bad input raises no error over the results: it is one message beside the prompt (`refusal`), the last
        comparison left as it was."""
        stopper = stopper if stopper is not None else {}
        stopper["stop"] = False
        drawing, reveal = False, f"run-{time.time():.3f}"  # whether this run has drawn yet; its mark on the page
        yield [gr.skip()] * (DRAWN_COUNT + 4) + [gr.Button("Starting…", interactive=False), gr.skip(), gr.skip()]
        try:
            settings = settings_from(speedup, max_new_tokens, decoding, temperature, top_p, top_k, seed, manual,
                                     max_budget, min_budget, warmup, horizon, decay, mode, beams,
                                     verified.chosen(family))
            written, texts, begun = 0.0, None, (False, False)
            for comparison in self.studio.compare(prompt, settings, model, stop=lambda: stopper.get("stop")):
                if texts is None:  # one incremental detokenizer per side for the whole stream
                    tokenizer = self.studio.engine(comparison.model).tokenizer
                    texts = (views.TokenText(tokenizer), views.TokenText(tokenizer))
                now, last = time.monotonic(), comparison.quality is not None or comparison.stopped
                started = tuple(bool(u and u.token_ids) for u in (comparison.skip, comparison.full))
                if not last and now - written < TEXT_EVERY_S and started == begun:
                    continue
                written, begun = now, started
                sides = [text.pieces(update.token_ids) if update else [] for update, text in
                         zip((comparison.skip, comparison.full), texts)]
                if last:  # the record (app/replay.py) keeps these: the answers are decoded once, here
                    comparison.pieces = (sides[0], sides[1])
                banner = views.stopped_banner(comparison) if comparison.stopped else ""
                mark = reveal + ("-stopped" if comparison.stopped else "")  # stopped: into view again, as it stands
                yield drawn(comparison, *sides, running=not last, banner=banner, reveal=mark) + [
                    gr.skip() if drawing else gr.Column(visible=False), gr.skip() if drawing else "",
                    gr.Button("Stop", interactive=not last), gr.Button("Stop", visible=not last, interactive=not last),
                    gr.Button(RUN, interactive=True) if last else gr.Button(views.progress_label(comparison)),
                    gr.update(value="", visible=False), comparison if last else gr.skip()]
                drawing = True
        except Exception as error:  # noqa: BLE001: every error becomes one message (message_for logs the unknown)
            message = message_for(error)
            if drawing:  # this run's answers show: the message goes over them, where the eye is
                yield [gr.skip(), views.ended_html(message)] + [gr.skip()] * (DRAWN_COUNT - 2) + [
                    gr.skip(), gr.skip(), gr.Button("Stop", interactive=False), gr.Button(visible=False),
                    gr.Button(RUN, interactive=True),
                    gr.skip(), None]
            else:
                yield refusal(message)

    def compare_api(self, prompt: str, speedup: float = 3.0, max_new_tokens: int = 48, model: str = "",
                    decoding: str = "greedy", temperature: float = 0.7, top_p: float = 0.9, top_k: int = 0,
                    seed: int = 0, max_budget: int = 0, min_budget: int = 0, warmup: int = 2, horizon: int = 0,
                    decay: str = "linear", mode: str = "skip", beams: int = 4, verify: bool = False) -> dict:
        """Run SkipDecode and full decoding on `prompt`: by default greedy, with the default schedule for
        `speedup`, on the page's default model. Optional, as on the page: `model` (one of the page's model
        labels), `decoding` ("greedy"; "sampling", with temperature, top_p, top_k and seed; "beam search",
        with `beams` beams, each side's output its best beam), the schedule
        by hand (`max_budget` and `min_budget`, both set, replace the speedup; `warmup`, `horizon` (0 = max
        new tokens), `decay`, `mode`), `verify` (verified decoding: SkipDecode drafts, the full side's model
        verifies; the answer is full decoding's, and `verification` gives the acceptance rate, drafted and
        accepted counts, verify passes and each token's mark). Returns the run's record, the JSON Export
        writes (app/replay.py, its schema app/record.py): both outputs, both traces (steps with budget, layers
        and ms), the quality scores and the divergence; bad input is an error whose message says what to change."""
        with user_errors():
            manual = bool(max_budget or min_budget)
            settings = settings_from(speedup, max_new_tokens, decoding, temperature, top_p, top_k, seed, manual,
                                     max_budget, min_budget, warmup, horizon, decay, mode, beams, verify)
            final = None
            for final in self.studio.compare(prompt, settings, model or self.studio.labels[0]):
                pass
            engine = self.studio.engine(final.model)  # the answer is the run's record, as Export writes it
            return replay.record(final, engine.tokenizer, device=engine.decoder.device)

    @staticmethod
    def paper_settings(comparison):
        """The schedule controls set to the paper's decaying budget at the average of the flat one `comparison`
        ran (views.paper_decay), for the run that follows: budgets by hand, warm-up, decay, mode."""
        decay = views.paper_decay(comparison) if comparison is not None else None
        if decay is None:
            return (gr.skip(),) * 7
        # the horizon control stays as it is: it gave the flat run its horizon, and gives the decay the same
        return True, decay.max_budget, decay.min_budget, decay.warmup, gr.skip(), decay.decay, decay.mode

    # ---- KV cache ---------------------------------------------------------------------------
    def kv_cache(self, comparison):
        if comparison is None:  # guidance, not an error: the visitor did nothing wrong
            return gr.Plot(visible=False), KV_FIRST
        with user_errors():
            exits = self.studio.exit_layers(comparison)
        panels = views.cache_panels(comparison, exits)
        figure = plots.kv_cache_figure(panels, comparison.skip.trace.prompt_tokens)
        holes = [int((states == 2).sum()) for _, states in panels]
        generated = panels[0][1].shape[1] - comparison.skip.trace.prompt_tokens
        note = (f"**SkipDecode: {holes[0]} holes.** Its budgets never grow, so every layer holds a complete "
                f"prefix (the engine's cache lengths per layer: {_spans(comparison.skip.trace.cache_lengths)}). "
                f"**Per-token early exit: {holes[1]} holes**, entries a later token needs but nobody computed: "
                "each must be recomputed, or filled by copying a lower layer's state. Its exits are an oracle's: "
                "each token leaves at the first layer whose prediction already equals the full model's (the best "
                f"case of CALM-style methods), over the first {generated} generated positions.")
        return gr.Plot(figure, visible=True), note

    # ---- Batch ------------------------------------------------------------------------------
    def batch(self, prompts_text, model, speedup, max_new_tokens):
        prompts = [line.strip() for line in (prompts_text or "").splitlines() if line.strip()]
        # at once, before the models load and the batch starts: what is coming, where it will be drawn
        yield (f"Starting… {views.plural(len(prompts), 'prompt')} as one batch on each side.", gr.skip(),
               gr.Plot(plots.empty_figure("Waiting for the first positions…"), visible=True))
        with user_errors():
            engine = self.studio.engine()
            drawn = 0.0
            for run in self.studio.batch(prompts, Settings(speedup=speedup, max_new_tokens=max_new_tokens), model):
                now = time.monotonic()
                figure = gr.skip()
                if now - drawn >= PLOT_EVERY_S or run.done:
                    drawn = now
                    cells = views.batch_cells(run)
                    figure = gr.Plot(plots.batch_budget_figure(cells, engine.num_layers) if len(cells)
                                     else plots.empty_figure("Waiting for the first positions…"), visible=True)
                yield views.batch_status(run), gr.Dataframe(views.batch_table(run), visible=True), figure

    def throughput(self, prompts_text, model, speedup, max_new_tokens):
        prompts = [line.strip() for line in (prompts_text or "").splitlines() if line.strip()]
        with user_errors():
            table = self.studio.throughput(prompts, Settings(speedup=speedup, max_new_tokens=max_new_tokens), model)
        return (gr.Plot(plots.throughput_figure(table), visible=True),
                gr.Dataframe(views.throughput_table(table), visible=True))

    # ---- Results ----------------------------------------------------------------------------
    def results(self):
        """Each table with its plot when the file exists; otherwise only the message saying it is missing.
        The box that adds the experiment adapters shows only when the E2E table has some."""
        e2e = load_table("e2e")
        experiments = e2e.frame is not None and bool((plots.e2e_kinds(e2e.frame) == "experiment").any())
        shown = [gr.Checkbox(visible=experiments)]
        pairs = ((e2e, plots.quality_speed_figure),
                 (load_table("bench"), lambda frame: plots.house_style(speed_figure(frame))))
        for table, figure in pairs:
            present = table.frame is not None
            shown += [note(table), gr.Dataframe(for_people(table.name, table.frame), visible=present),
                      gr.Plot(_safe_figure(figure, table.frame) if present else None, visible=present)]
        # tables without a plot: the E2E adapters decoded by beam search; what people type (general prompts)
        for table in (load_table("e2e-beams4"), load_table("general")):
            shown += [note(table), gr.Dataframe(for_people(table.name, table.frame), visible=table.frame is not None)]
        return tuple(shown)


def note(table) -> str:
    """A table's line above it: what its columns need said (results.NOTES), or that it is not measured yet; its
    file and the command that writes it in a fold for developers."""
    said = NOTES.get(table.name, "") if table.frame is not None else f"**Not measured yet** ({table.problem})."
    return (f"{said}\n\n<details><summary>For developers: where this table comes from</summary>\n\n{table.message}"
            "\n\n</details>").strip()


def _safe_figure(build, frame):
    try:
        return build(frame)
    except (KeyError, ValueError) as error:  # a table from another version, with other columns
        return plots.empty_figure(f"Cannot plot this table: {error}")


def _spans(lengths: list[int]) -> str:
    """[80, 80, 60, 60, 60] -> '80 (layers 0-1), 60 (layers 2-4)'"""
    out, start = [], 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or lengths[i] != lengths[start]:
            layers = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            out.append(f"{lengths[start]} (layers {layers})")
            start = i
    return ", ".join(out)
