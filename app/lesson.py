"""What the teaching controls do: plain functions from the widgets' values to the widgets' new values.

After a comparison: its record (app/replay.py), the SkipDecode answer with its marks, the summary and
the divergence figure. Picking a position: the logit lens at every position, computed once per comparison
(both sides' teacher-forced passes), then one position layer by layer, stepped through for a lecture.
Export and replay move the record through a JSON file; the presentation view shows it one slide at a time.
"""

from __future__ import annotations

import logging

import gradio as gr

from . import plots, replay, teach, verified, views
from .callbacks import for_the_user, settings_from, user_errors
from .studio import Studio

PLAY_EVERY_S = 0.7  # the step-through's pace when playing: one layer this often
GPU_CALLBACKS = ("pick", "export")  # the handlers that run a model (app/gpu.py decorates them on ZeroGPU)
log = logging.getLogger("skipdecode.app")


class Lesson:
    def __init__(self, studio: Studio):
        self.studio = studio

    # ---- after a comparison -----------------------------------------------------------------
    def after_compare(self, comparison, *settings):
        """The record of the comparison that just finished and the views it feeds (nothing if it did not
        finish: stopped, or an error already shown)."""
        if comparison is None or comparison.divergence is None:
            return (None,) + (gr.skip(),) * 6
        with user_errors():
            tokenizer = self.studio.engine(comparison.model).tokenizer
            record = replay.record(comparison, tokenizer, settings_from(*settings),
                                   self.studio.engine(comparison.model).decoder.device)
        return (record,) + self._shown(record, None)

    def _shown(self, record, picked):
        """Marks, summary, divergence figure, position slider, layer view and its figure."""
        n = len(record["divergence"]["tokens"])
        position = teach.default_position(record) if picked is None else picked
        lensed = bool(record.get("lens"))
        return (teach.marked_html(record, picked), teach.summary_markdown(record), teach.divergence_figure(record),
                gr.Slider(0, max(n - 1, 1), value=position, step=1, interactive=n > 1),
                teach.lens_html(record, position) if lensed else teach.lens_html({}, 0),
                teach.lens_figure(record, position) if lensed else
                plots.empty_figure("Pick a token (click it, or move the slider) to see it layer by layer", height=320))

    # ---- one position, layer by layer ---------------------------------------------------------
    def pick(self, position, record, comparison):
        """The layer view of `position`; the lens of every position is computed on the first pick."""
        if record is None:  # guidance, not an error: nothing to pick from yet
            return (gr.skip(),) * 3 + (teach.guide("run"),) + (gr.skip(),) * 3
        with user_errors():
            position = int(position)
            if not 0 <= position < len(record["divergence"]["tokens"]):
                raise ValueError(f"pick a token between 0 and {len(record['divergence']['tokens']) - 1}")
            if not record.get("lens"):
                if comparison is None:
                    raise ValueError("this comparison has no layer view saved, and no model ran it here")
                lenses = self.studio.lenses(comparison)
                replay.add_lenses(record, lenses, self.studio.engine(comparison.model).tokenizer)
        return (record, teach.marked_html(record, position), gr.Slider(value=position),
                teach.lens_html(record, position), teach.lens_figure(record, position), None, gr.Timer(active=False))

    def clicked(self, record, comparison, evt: gr.EventData):
        """A click on the SkipDecode answer: `pick` the token clicked (the event's data stays here; only
        plain values go on to `pick`, which may run in a GPU call)."""
        position = getattr(evt, "position", None)
        if position is None:  # a click beside the tokens
            return (gr.skip(),) * 7
        return self.pick(position, record, comparison)

    @staticmethod
    def _step(record, position, shown, going=None):
        """The layer view and its figure with `shown` layers revealed from the bottom (None: all), `shown`, and
        the player's state; a layer button pressed before a pick gets guidance in the layer view instead."""
        if not record or not record.get("lens"):
            return teach.guide("pick" if record else "run"), gr.skip(), None, gr.Timer(active=False)
        position = int(position)
        return (teach.lens_html(record, position, shown), teach.lens_figure(record, position, shown), shown,
                gr.Timer(active=going) if going is not None else gr.skip())

    def next_layer(self, record, position, shown):
        """One layer further up (from the top, back to the bottom layer)."""
        top = record["num_layers"] if record else 0
        return self._step(record, position, 1 if shown is None or shown >= top else shown + 1)

    def previous_layer(self, record, position, shown):
        top = record["num_layers"] if record else 0
        return self._step(record, position, max(1, (top if shown is None else shown) - 1))

    def play(self, record, position, shown):
        """Play from the bottom layer (or from where a paused step-through stands), one layer a tick."""
        top = record["num_layers"] if record else 0
        return self._step(record, position, 1 if shown is None or shown >= top else shown, going=True)

    def tick(self, record, position, shown):
        if not record or not record.get("lens"):
            return gr.skip(), gr.skip(), shown, gr.Timer(active=False)
        shown = 1 if shown is None or shown >= record["num_layers"] else shown + 1
        return self._step(record, position, shown, going=shown < record["num_layers"])

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

    def replay(self, file):
        """A page drawn from an exported file alone: no model runs. A file that is not a good export changes
        nothing on the page but the note beside the file box, which says in one sentence what is wrong."""
        skip_all = (gr.skip(),) * 15  # what a replay draws (`_replayed`), then the note, the prompt, `replayed`
        if file is None:
            return skip_all + ("", gr.skip(), gr.skip())
        try:
            record = replay.read(getattr(file, "name", file))
            comparison = replay.comparison(record)
            drawn = self._replayed(record, comparison)
        except (ValueError, OSError) as error:  # the file's fault: say so, no traceback
            return skip_all + (refused(for_the_user(error)), gr.skip(), gr.skip())
        except Exception:  # a record the schema passed and the page could not draw: ours to fix
            log.exception("a replayed record passed the schema but could not be drawn")
            return skip_all + (refused("This exported comparison could not be drawn; the error has been logged."),
                               gr.skip(), gr.skip())
        return drawn + ("", record["prompt"], record["prompt"])

    def _replayed(self, record, comparison):
        L = record["num_layers"]
        full = views.tokens_html(record["full"]["pieces"], record["full"]["layers"], L)
        # The prompt goes back into its box (the preview is told to leave the replayed budget plot alone); the
        # settings are shown, not put back into the controls: a control that changes redraws the preview.
        hardware = record["hardware"]
        status = (f"**Replayed** from an export made {views.safe(record['exported'])} on {views.safe(hardware['cpu'])} "
                  f"({views.safe(hardware['device'])}, {views.safe(hardware['dtype'])}); no model ran. "
                  f"Prompt: “{views.safe(record['prompt'])}”. "
                  + views.status_markdown(comparison, False).removeprefix("Done. "))
        budget, layer_map, latency = views.compare_figures(comparison)
        metrics = (verified.summary_html if comparison.verified else views.metrics_html)(comparison)
        return ((record, status, full, metrics, views.quality_html(comparison), budget, layer_map, latency) + self._shown(record, None) + (None,))

    # ---- presentation -------------------------------------------------------------------------
    @staticmethod
    def slide(record, index, move=0):
        """Slide `index` + `move`: its large-type HTML and its figure (hidden on the text slides)."""
        index = (int(index or 0) + move) % len(teach.SLIDES)
        if record is None:
            return teach.slide_html(None, index), gr.Plot(visible=False), index
        name = teach.SLIDES[index]
        figure = None
        if name in ("layer map", "budget", "latency"):
            comparison = replay.comparison(record)
            budget, layer_map, latency = views.compare_figures(comparison)
            figure = {"layer map": layer_map, "budget": budget, "latency": latency}[name]
        elif name == "divergence":
            figure = teach.divergence_figure(record)
        elif name == "lens":
            figure = (teach.lens_figure(record, teach.default_position(record)) if record.get("lens") else
                      plots.empty_figure("Pick a token on the Compare tab first: the layer view is computed then"))
        if figure is not None:
            figure.update_layout(font=dict(size=18), height=teach.SLIDE_HEIGHT)
        return teach.slide_html(record, index), gr.Plot(figure, visible=figure is not None), index

    def keyed(self, record, index, evt: gr.EventData):
        return self.slide(record, index, int(getattr(evt, "step", 0) or 0))


def refused(message: str) -> str:
    """A replayed file's refusal, beside the file box (`message` is escaped already: for_the_user)."""
    return f'<div class="sd-refused" role="alert">{message}</div>'
