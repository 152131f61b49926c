"""What the teaching controls do: plain functions from the widgets' values to the widgets' new values.

After a comparison: its record (app/replay.py), the SkipDecode answer with its marks, the summary and
the divergence figure. Picking a position: the logit lens at every position, computed once per comparison
(both sides' teacher-forced passes), then one position layer by layer, stepped through for a lecture.
Export and replay move the record through a JSON file; the presentation view shows it one slide at a time.
"""

from __future__ import annotations

import html
import logging
import time
from pathlib import Path

import gradio as gr

from . import link, plots, replay, standalone, teach, timing, verified, views
from .callbacks import DRAWN, for_the_user, refused, user_errors
from .callbacks import drawn as drawn_view
from .gpu import zero_gpu
from .studio import Studio

PLAY_EVERY_S = 0.7  # the step-through's pace when playing: one layer this often
PLAY, PAUSE = "Play", "Pause"  # the Play button's label, stopped and while playing
GPU_CALLBACKS = ("pick", "export")  # the handlers that run a model (app/gpu.py decorates them on ZeroGPU)
log = logging.getLogger("skipdecode.app")


class Lesson:
    def __init__(self, studio: Studio):
        self.studio = studio

    # ---- after a comparison -----------------------------------------------------------------
    def after_compare(self, comparison):
        """The record of the comparison that just finished (or that Stop ended), with the settings it ran (not
        the widgets', which may have moved since), and what it opens (`opened`); nothing new where the run
        refused its input or drew nothing to open."""
        if comparison is None:  # no comparison this time (bad input): the last one stays open
            return (gr.skip(),) * len(OPENED)
        if comparison.divergence is None:  # stopped before both sides had a token: nothing to open
            return (None,) + (gr.skip(),) * (len(OPENED) - 1)
        with user_errors():
            tokenizer = self.studio.engine(comparison.model).tokenizer
            record = replay.record(comparison, tokenizer, device=self.studio.engine(comparison.model).decoder.device)
        return opened(record)

    # ---- one position, layer by layer ---------------------------------------------------------
    def pick(self, number, record, comparison):
        """The layer view of token `number` (counted from 1, as the slider shows it); the lens of every position
        is computed on the first pick."""
        if record is None:  # guidance, not an error: nothing to pick from yet
            return (gr.skip(),) * 3 + (teach.guide("run"),) + (gr.skip(),) * 7
        with user_errors():
            position = int(number) - 1
            if not 0 <= position < len(record["divergence"]["tokens"]):
                raise ValueError(f"pick a token between 1 and {len(record['divergence']['tokens'])}")
            if not record.get("lens"):
                if comparison is None:
                    raise ValueError("this comparison has no layer view saved, and no model ran it here")
                lenses = self.studio.lenses(comparison)
                replay.add_lenses(record, lenses, self.studio.engine(comparison.model).tokenizer)
        return (record, teach.marked_html(record, position), gr.Slider(value=position + 1),
                teach.lens_html(record, position), gr.Plot(teach.lens_figure(record, position), visible=True), None,
                gr.Timer(active=False)) + steppable(True)

    def clicked(self, record, comparison, evt: gr.EventData):
        """A click on the SkipDecode answer: `pick` the token clicked (the event's data stays here; only
        plain values go on to `pick`, which may run in a GPU call)."""
        position = getattr(evt, "position", None)
        if position is None:  # a click beside the tokens
            return (gr.skip(),) * 11
        return self.pick(int(position) + 1, record, comparison)  # the element's positions count from 0

    @staticmethod
    def _step(record, number, shown, going=None):
        """The layer view and its figure with `shown` layers revealed from the bottom (None: all), `shown`, the
        player's state and the Play button's label (Pause while it plays); a layer button pressed before a
        pick gets guidance in the layer view instead."""
        if not record or not record.get("lens"):
            return teach.guide("pick" if record else "run"), gr.skip(), None, gr.Timer(active=False), gr.skip()
        position = int(number) - 1  # the slider's token, counted from 1
        return (teach.lens_html(record, position, shown), teach.lens_figure(record, position, shown), shown,
                *((gr.skip(), gr.skip()) if going is None else (gr.Timer(active=going), play_button(going))))

    def next_layer(self, record, position, shown):
        """One layer further up (from the top, back to the bottom layer); a step by hand pauses the player."""
        top = record["num_layers"] if record else 0
        return self._step(record, position, 1 if shown is None or shown >= top else shown + 1, going=False)

    def previous_layer(self, record, position, shown):
        top = record["num_layers"] if record else 0
        return self._step(record, position, max(1, (top if shown is None else shown) - 1), going=False)

    def play(self, record, position, shown, label=PLAY):
        """Play from the bottom layer (or from where a paused step-through stands), one layer a tick; pressed
        while playing (its label then Pause), pause where it stands."""
        if label == PAUSE:
            return gr.skip(), gr.skip(), shown, gr.Timer(active=False), play_button(False)
        top = record["num_layers"] if record else 0
        return self._step(record, position, 1 if shown is None or shown >= top else shown, going=True)

    def tick(self, record, position, shown):
        """One layer further while playing; the player stops at the top layer. A tick never starts the player
        again: one already on its way when Pause, a layer button or "All layers" stopped it leaves the player
        stopped (after "All layers", shown None, or at the top, it changes nothing)."""
        if not record or not record.get("lens") or shown is None or shown >= record["num_layers"]:
            return gr.skip(), gr.skip(), shown, gr.Timer(active=False), play_button(False)
        last = shown + 1 >= record["num_layers"]  # this tick reveals the top layer: the player stops
        return self._step(record, position, shown + 1, going=False if last else None)

    def show_all(self, record, position):
        return self._step(record, position, None, going=False)

    # ---- export and replay --------------------------------------------------------------------
    def export(self, record, comparison):
        """The record as a JSON file, the logit lens of every position included (computed if not yet)."""
        if record is None:  # guidance, not an error
            gr.Warning("Run a comparison first: the export is its trace.")
            return gr.skip(), gr.skip()
        with user_errors():
            if not record.get("lens"):
                if comparison is None:
                    raise ValueError("this comparison has no layer view saved, and no model ran it here")
                replay.add_lenses(record, self.studio.lenses(comparison),
                                  self.studio.engine(comparison.model).tokenizer)
            path = replay.write(record)
        return record, gr.File(str(path), visible=True)

    @staticmethod
    def export_html(record):
        """The record as one .html file that plays offline (app/standalone.py); nothing runs a model."""
        if record is None:  # guidance, not an error
            gr.Warning("Run a comparison first: the standalone page draws it.")
            return gr.skip()
        with user_errors():
            path = standalone.write(record)
        return gr.File(str(path), visible=True)

    @staticmethod
    def link(record, fields):
        """The query string that opens the comparison that ran (its record, not the widgets now), shown in the
        link box; the browser makes it a whole address and copies it (link.COPY_JS)."""
        if record is None:
            gr.Warning("Run a comparison first: the link opens its settings.")
            return gr.skip()
        query = link.encode(link.ran(record), fields)
        if not query.startswith("?prompt="):
            gr.Warning("This prompt is too long for a link: the link holds the settings only.")
        return gr.Textbox(query, visible=True)

    def replay(self, file):
        """A page drawn from an exported file alone: no model runs. A file that is not a good export changes
        nothing on the page but the note beside the file box, which says in one sentence what is wrong."""
        skip_all = (gr.skip(),) * (len(DRAWN) + len(OPENED))  # what a replay draws, then the note and the prompt
        if file is None:
            return skip_all + ("", gr.skip())
        path = getattr(file, "name", file)
        named = f"{html.escape(Path(path).name)}: "  # which file the note is about (several may be tried in turn)
        try:
            record = replay.read(path)
            drawn = self._replayed(record, replay.comparison(record))
        except (ValueError, OSError) as error:  # the file's fault: say so, no traceback
            return skip_all + (refused(named + for_the_user(error)), gr.skip())
        except Exception:  # a record the schema passed and the page could not draw: ours to fix
            log.exception("a replayed record passed the schema but could not be drawn")
            return skip_all + (refused(named + "this exported comparison could not be drawn; the error has been "
                                       "logged."), gr.skip())
        # The prompt goes back into its box; the settings are shown, not put back into the controls.
        return drawn + ("", record["prompt"])

    def replay_lesson(self):
        """The comparison docs/teaching.md walks through, shipped with the app (replay.LESSON_FILE)."""
        return self.replay(str(replay.LESSON_FILE))

    @staticmethod
    def _replayed(record, comparison):
        hardware = record["hardware"]
        line = (f'<span class="sd-replayed">Replayed</span><span class="sd-detail">from an export made '
                f"{views.safe(record['exported'])} on {views.safe(hardware['cpu'])}; no model ran.</span>")
        out = drawn_view(comparison, record["skipdecode"]["pieces"], record["full"]["pieces"], banner=line,
                          reveal=f"replay-{time.time():.3f}")
        status = (f"**Replayed** from an export made {views.safe(record['exported'])} on {views.safe(hardware['cpu'])} "
                  f"({views.safe(hardware['device'])}, {views.safe(hardware['dtype'])}); no model ran. "
                  f"Prompt: “{views.safe(record['prompt'])}”. "
                  + views.status_markdown(comparison, False).removeprefix("Done. "))
        out[DRAWN.index("status")] = status
        return tuple(out) + opened(record)

    # ---- presentation -------------------------------------------------------------------------
    def slide(self, record, index, move=0, ran=None):
        """Slide `index` + `move`: its large-type HTML and its figure (hidden on the text slides). `ran`: the
        comparison this page ran, whose layer view the lens slide computes if no pick has yet (not on ZeroGPU,
        where a model runs only in a GPU call: there the slide says to pick a token first)."""
        names = teach.slides(record)
        index = (int(index or 0) + move) % len(names)
        if record is None:
            return teach.slide_html(None, index), gr.Plot(visible=False), index
        name, figure, why = names[index], None, ""
        comparison = replay.comparison(record)
        if name in ("layer map", "budget", "latency"):
            budget, layer_map, latency = views.compare_figures(comparison)
            figure = {"layer map": layer_map, "budget": budget, "latency": latency}[name]
        elif name == "divergence":
            figure = teach.divergence_figure(record)
        elif name == "lens":
            self._lens_for_slides(record, ran)
            figure = (teach.lens_figure(record, teach.default_position(record)) if record.get("lens") else
                      plots.empty_figure("Pick a token on the Compare tab first: the layer view is computed then"))
        elif name == "acceptance":
            why = verified.explain(record["verification"], timing.of(comparison))
        elif name == "answers":  # the verdict, as the headline gives it: a broken answer said first
            why = views.headline_html(comparison, running=False)
        if figure is not None:  # large type; the legend below the chart, where its rows cannot reach the title
            figure.update_layout(font=dict(size=18), height=teach.SLIDE_HEIGHT + 60, margin=dict(b=140),
                                 legend=dict(orientation="h", yanchor="top", y=-0.3, x=0.0, xanchor="left"))
        return teach.slide_html(record, index, why), gr.Plot(figure, visible=figure is not None), index

    def keyed(self, record, index, ran, evt: gr.EventData):
        return self.slide(record, index, int(getattr(evt, "step", 0) or 0), ran)

    def _lens_for_slides(self, record, ran) -> None:
        """The layer view of every position, added to `record` where a pick has not computed it yet and the
        comparison ran here (a replayed one carries its own)."""
        if record.get("lens") or ran is None or not ran.done or zero_gpu():
            return
        try:
            replay.add_lenses(record, self.studio.lenses(ran), self.studio.engine(ran.model).tokenizer)
        except Exception:  # noqa: BLE001: the slide then says to pick a token; the host gets the traceback
            log.exception("the lens slide could not compute the layer view")


# The layout's output lists, by name: what a comparison draws (callbacks.DRAWN) and what a finished one opens.
OPENED = ("record", "skip_out", "part_note", "teach_box", "position", "lens_view", "lens_plot", "previous_layer",
          "next_layer", "play", "all_layers", "divergence_plot", "kv_button", "present", "previous_slide",
          "next_slide", "slide_index", "export_here")


def steppable(on: bool) -> tuple:
    """The four step buttons (◀ layer, layer ▶, Play, All layers), usable only once a token is picked; the
    player stopped."""
    usable = gr.Button(interactive=on)
    return usable, usable, gr.Button(PLAY, interactive=on), usable


def play_button(playing: bool) -> gr.Button:
    return gr.Button(PAUSE if playing else PLAY)


def opened(record: dict) -> tuple:
    """What a finished comparison opens, in OPENED's order: its record, the answer with its marks, what they
    say, the layer view's controls (a token to pick; the step buttons wait for the pick), the agreement figure
    (not for verified decoding, whose answer is full depth's own), and the controls that need a comparison
    (the KV cache, Present, the slides, which start again at the first)."""
    n = len(record["divergence"]["tokens"])
    position = teach.default_position(record)
    usable = gr.Button(interactive=True)
    return ((record, teach.marked_html(record), teach.summary_markdown(record), gr.Column(visible=True),
             gr.Slider(1, max(n, 2), value=position + 1, step=1, interactive=n > 1), teach.guide("pick"),
             gr.Plot(visible=False)) + steppable(False)
            + (gr.Plot(teach.divergence_figure(record), visible=not record.get("verified")), usable, usable, usable,
               usable, 0, usable))
