"""The page, top to bottom: Compare, Batch, KV cache, Results. Wiring only; the work is in callbacks."""

from __future__ import annotations

import html

import gradio as gr

from skipdecode.models import precision_reason
from skipdecode.schedule import DECAYS, DEFAULT_WARMUP, MODES, max_speedup

from . import plots, results, teach, verified, views
from .callbacks import DECODINGS, Callbacks
from .examples import load_examples
from .gpu import gpu_callbacks
from .lesson import GPU_CALLBACKS as LESSON_GPU_CALLBACKS
from .lesson import PLAY_EVERY_S, Lesson
from .studio import Studio, public_name

CSS = """
.gradio-container { max-width: 1360px !important; margin: auto; }
#sd-header h1 { font-size: 1.7rem; margin: 0 0 .2rem 0; letter-spacing: -0.01em; }
#sd-header p { margin: 0; color: #475569; font-size: .95rem; }
.sd-badges { display: flex; gap: .4rem; margin-top: .5rem; flex-wrap: wrap; }
.sd-badge { background: #eef2ff; color: #3730a3; border-radius: 999px; padding: .1rem .6rem; font-size: .78rem; }
.sd-side-title { font-weight: 600; font-size: .95rem; margin: 0 0 .35rem 0; display: flex; align-items: center; gap: .45rem; }
.sd-dot { width: .7rem; height: .7rem; border-radius: 50%; display: inline-block; }
.sd-output { min-height: 7.5rem; max-height: 18rem; overflow-y: auto; padding: .75rem .85rem; border: 1px solid #e2e8f0;
  border-radius: .6rem; background: #fff; line-height: 1.85; font-size: .98rem; white-space: pre-wrap; }
.sd-empty { color: #94a3b8; }
.sd-token { border-radius: .25rem; padding: .08rem 0; box-decoration-break: clone; -webkit-box-decoration-break: clone; }
.sd-cursor { display: inline-block; width: .5rem; height: 1rem; background: #4f46e5; margin-left: 2px; vertical-align: text-bottom;
  animation: sd-blink 1s steps(2, start) infinite; }
@keyframes sd-blink { to { visibility: hidden; } }
.sd-legend { display: flex; align-items: center; gap: .5rem; font-size: .8rem; color: #64748b; margin: .1rem 0 .2rem 0; }
.sd-scale { width: 9rem; height: .7rem; border-radius: .2rem; border: 1px solid #e2e8f0; }
.sd-cards { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: .6rem; margin: .2rem 0; }
.sd-card { border: 1px solid #e2e8f0; border-radius: .6rem; padding: .55rem .75rem; background: #fff; }
.sd-card.sd-accent { border-color: #c7d2fe; background: #eef2ff; }
.sd-card-label { font-size: .75rem; text-transform: uppercase; letter-spacing: .04em; color: #64748b; }
.sd-card-value { font-size: 1.45rem; font-weight: 650; color: #1e293b; line-height: 1.3; }
.sd-card-value small { font-size: .85rem; font-weight: 500; color: #64748b; }
.sd-card-note { font-size: .75rem; color: #94a3b8; }
.sd-quality { border: 1px solid #e2e8f0; border-radius: .6rem; padding: .4rem .6rem; background: #fff; }
.sd-quality table { width: 100%; border-collapse: collapse; font-size: .9rem; border: none !important; margin: 0; }
.sd-quality tr, .sd-quality th, .sd-quality td { border: none !important; background: transparent !important; }
.sd-quality th { text-align: left; font-weight: 600; color: #475569; border-bottom: 1px solid #e2e8f0 !important; padding: .35rem .5rem; }
.sd-quality td { padding: .32rem .5rem; border-bottom: 1px solid #f1f5f9 !important; }
.sd-quality tr:last-child td { border-bottom: none !important; }
.sd-quality td:first-child { color: #475569; }
.sd-quality small { color: #94a3b8; }
.sd-quality.sd-empty { padding: .75rem; border: 1px dashed #e2e8f0; border-radius: .6rem; font-size: .9rem; }
.sd-note { font-size: .8rem; color: #94a3b8; margin-top: .35rem; }
#sd-status { min-height: 2.4rem; font-size: .9rem; }
#sd-lens-controls { position: sticky; top: 0; z-index: 25; background: var(--block-background-fill, #fff); }
""" + teach.CSS
# The charts' toolbars stay for the mouse and leave the Tab order: ten buttons a chart stood between Run and the
# token slider (a keyboard or a presentation clicker walks the page with Tab).
JS = """() => { const out = () => document.querySelectorAll('.modebar-btn:not([tabindex="-1"])')
  .forEach((button) => button.setAttribute('tabindex', '-1'));
  new MutationObserver(out).observe(document.body, {childList: true, subtree: true}); out(); }"""

CONCURRENCY = 32  # requests in flight at once; they wait on the batcher, which batches them
INTRO = ("Every token at one position of a batch gets the same **layer budget**; the budget never grows, and it is "
         "spent on the **top** layers after a few **warm-up** layers, so the KV cache stays complete and batching "
         "works ([SkipDecode, Del Corro et al. 2023](https://arxiv.org/abs/2307.02628)).")

DEFAULT_BATCH = "\n".join([
    "Describe a cozy cafe in two sentences.",
    "Write a haiku about autumn rain.",
    "Explain what a KV cache is in one sentence.",
    "Give three names for a friendly robot.",
])


def theme() -> gr.themes.Base:
    system = ["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"]
    mono = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]
    return gr.themes.Soft(primary_hue="indigo", secondary_hue="amber", neutral_hue="slate", font=system,
                          font_mono=mono).set(
        button_primary_background_fill="*primary_600", button_primary_background_fill_hover="*primary_700",
        button_primary_text_color="white", block_label_text_weight="600")


def build(studio: Studio, concurrency: int = CONCURRENCY) -> gr.Blocks:
    """The page; `concurrency`: decoding requests in flight at once (more wait in Gradio's queue)."""
    cb = gpu_callbacks(Callbacks(studio))  # on ZeroGPU the model-running handlers run in GPU calls
    lesson = gpu_callbacks(Lesson(studio), LESSON_GPU_CALLBACKS)
    start = studio.default_speedup  # a question and a restaurant record both get an adapter there
    engine = studio.engine()
    L = engine.num_layers
    examples = load_examples()
    with gr.Blocks(title="SkipDecode Studio", analytics_enabled=False) as demo:
        gr.Markdown(f"# SkipDecode Studio\n{INTRO}", elem_id="sd-header")
        gr.HTML('<div class="sd-badges">' + "".join(f'<span class="sd-badge">{text}</span>' for text in (
            public_name(engine.name), f"{L} layers", f"running on {engine.decoder.device.type.upper()}",
            f'<span title="{html.escape(precision_reason(engine.decoder.device))}">{html.escape(engine.weights_label)}'
            "</span>", html.escape(engine.step_label),  # compiled step, or eager step and why
            "requests arriving together share one batch")) + "</div>")
        with gr.Tabs():
            # ---- Compare ------------------------------------------------------------------------
            with gr.Tab("Compare", id="compare"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        prompt = gr.Textbox(label="Prompt", lines=3, max_lines=8, elem_id="sd-prompt",
                                            placeholder="Ask anything, or pick an example below")
                        gr.Examples(examples.all_prompts, inputs=prompt, example_labels=examples.labels,
                                    label="Examples: E2E restaurant descriptions are also scored against their "
                                    "human references", examples_per_page=10)
                    with gr.Column(scale=2):
                        model = gr.Dropdown(studio.labels, value=studio.labels[0], label="Model",
                                            interactive=len(studio.labels) > 1,
                                            info="auto picks the adapter for the prompt and the target speedup"
                                            if len(studio.labels) > 1 else
                                            "fine-tuned adapters join this list when assets/adapters has them")
                        speedup = gr.Slider(1, max_speedup(L, DEFAULT_WARMUP), value=start, step=0.25,
                                            label="Target speedup", info=f"average layers per token = {L} / speedup",
                                            elem_id="sd-speedup")
                        max_new_tokens = gr.Slider(1, studio.limits.max_new_tokens, value=48, step=1,
                                                   label="Max new tokens", elem_id="sd-max-new-tokens")
                        decoding = gr.Radio(list(DECODINGS), value="greedy", label="Decoding")
                        family = gr.Radio(list(verified.FAMILIES), value=verified.FASTER, label="What it promises",
                                          elem_id="sd-family")  # app/verified.py
                        with gr.Row():
                            run = gr.Button("Run", variant="primary", elem_id="sd-run", scale=3)
                            stop = gr.Button("Stop", variant="secondary", scale=1)
                with gr.Accordion("Schedule (advanced)", open=False):
                    with gr.Row():
                        manual = gr.Checkbox(False, label="Set budgets by hand (ignore the speedup slider)")
                        max_budget = gr.Slider(1, L, value=min(20, L), step=1, label="Max budget (first position)")
                        min_budget = gr.Slider(1, L, value=min(6, L), step=1, label="Min budget (from the horizon on)")
                    with gr.Row():
                        warmup = gr.Slider(0, L - 1, value=DEFAULT_WARMUP, step=1, label="Warm-up layers")
                        horizon = gr.Slider(0, studio.limits.max_new_tokens, value=0, step=1,
                                            label="Horizon (0 = max new tokens)")
                        decay = gr.Dropdown(list(DECAYS), value="linear", label="Decay")
                        mode = gr.Radio(list(MODES), value="skip", label="Mode",
                                        info="skip: warm-up + top layers; early_exit: bottom layers only")
                    schedule_note = gr.Markdown(elem_id="sd-schedule-note")
                with gr.Accordion("Sampling and beam search", open=False):
                    with gr.Row():
                        beams = gr.Slider(2, studio.limits.max_beams, value=4, step=1, label="Beams (beam search)",
                                          info="the E2E table's beam rows used 4")
                        temperature = gr.Slider(0.05, 2.0, value=0.7, step=0.05, label="Temperature")
                        top_p = gr.Slider(0.05, 1.0, value=0.9, step=0.05, label="Top-p")
                        top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k (0 = off)")
                        seed = gr.Number(0, precision=0, label="Seed")
                status = gr.Markdown(elem_id="sd-status")
                with gr.Row(equal_height=True):
                    with gr.Column():
                        gr.HTML(f'<div class="sd-side-title"><span class="sd-dot" style="background:{plots.SKIP}">'
                                "</span>SkipDecode</div>")
                        skip_out = gr.HTML(views.EMPTY_OUTPUT, elem_id="sd-skip-output", js_on_load=teach.CLICK_JS)
                    with gr.Column():
                        gr.HTML(f'<div class="sd-side-title"><span class="sd-dot" style="background:{plots.FULL}">'
                                "</span>Full decoding</div>")
                        full_out = gr.HTML(views.EMPTY_OUTPUT, elem_id="sd-full-output")
                gr.HTML(views.legend_html(L))
                part_note = gr.Markdown(elem_id="sd-part-note")
                metrics = gr.HTML(views.metrics_html(None), elem_id="sd-metrics")
                with gr.Row(equal_height=False):
                    with gr.Column(scale=2):
                        quality = gr.HTML(views.quality_html(None), elem_id="sd-quality")
                    with gr.Column(scale=3):
                        budget_plot = gr.Plot(label="Budget", show_label=False, elem_id="sd-budget-plot")
                latency_plot = gr.Plot(plots.empty_figure("Latency appears when you run", height=340), label="Latency",
                                       show_label=False, elem_id="sd-latency-plot")
                layer_plot = gr.Plot(plots.empty_figure("Which layers ran at which position appears when you run"),
                                     label="Layers", show_label=False, elem_id="sd-layer-plot")
                with gr.Accordion("Why they part: the same prefix at full depth, one token layer by layer",
                                  open=True, elem_id="sd-teach"):
                    gr.Markdown("Given SkipDecode's own prefix, would full depth have chosen the same token? One "
                                "full-depth pass over the SkipDecode answer says, at every position. Pick a token "
                                "(click it in the SkipDecode answer, or move the slider) to see, after each layer that "
                                "ran, the top 3 tokens of the final norm + LM head (the logit lens): SkipDecode's run "
                                "beside full depth on the same prefix.")
                    divergence_plot = gr.Plot(plots.empty_figure("Agreement with full depth appears when you run"),
                                              show_label=False, elem_id="sd-divergence-plot")
                    with gr.Row(equal_height=True, elem_id="sd-lens-controls"):  # sticky: beside the tables
                        position = gr.Slider(0, 1, value=0, step=1, label="Token of the SkipDecode answer",
                                             interactive=False, elem_id="sd-position", scale=3)
                        previous_layer = gr.Button("◀ layer", elem_id="sd-previous-layer", scale=0, min_width=90)
                        next_layer = gr.Button("layer ▶", elem_id="sd-next-layer", scale=0, min_width=90)
                        play = gr.Button("Play", elem_id="sd-play", scale=0, min_width=90)
                        all_layers = gr.Button("All layers", elem_id="sd-all-layers", scale=0, min_width=110)
                    lens_view = gr.HTML(teach.lens_html({}, 0), elem_id="sd-lens")
                    lens_plot = gr.Plot(plots.empty_figure("The layer view appears when you pick a token", height=320),
                                        show_label=False, elem_id="sd-lens-plot")
                    with gr.Row(equal_height=False):
                        export = gr.Button("Export: the trace as JSON, every figure as PNG", elem_id="sd-export",
                                           scale=1)
                        export_file = gr.File(label="Exported trace", visible=False, elem_id="sd-export-file", scale=1)
                        with gr.Column(scale=1):
                            replay_file = gr.File(label="Replay an exported trace (.json): no model runs",
                                                  file_types=[".json"], elem_id="sd-replay-file")
                            replay_note = gr.HTML(elem_id="sd-replay-note")
                last = gr.State(None)
                record = gr.State(None)  # the last comparison as app/replay.py records it (run or replayed)
                replayed = gr.State(None)  # the prompt a replay put in the box (its change keeps the replayed plot)
                shown_layers = gr.State(None)  # the step-through: layers revealed from the bottom (None: all)
                player = gr.Timer(PLAY_EVERY_S, active=False)

            # ---- Batch --------------------------------------------------------------------------
            with gr.Tab("Batch", id="batch"):
                gr.Markdown("Several prompts decoded as **one** batch: at each position every row runs the same "
                            "layers, which is why SkipDecode keeps batching and the KV cache intact.")
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        batch_prompts = gr.Textbox(DEFAULT_BATCH, lines=6, label="Prompts, one per line "
                                                   f"(at most {studio.limits.max_batch_prompts})")
                    with gr.Column(scale=2):
                        batch_speedup = gr.Slider(1, max_speedup(L, DEFAULT_WARMUP), value=start, step=0.25,
                                                  label="Target speedup")
                        batch_tokens = gr.Slider(1, 128, value=32, step=1, label="Max new tokens")
                        with gr.Row():
                            batch_run = gr.Button("Run batch", variant="primary", elem_id="sd-batch-run")
                            batch_measure = gr.Button("Measure throughput vs batch size")
                batch_status = gr.Markdown()
                batch_plot = gr.Plot(show_label=False, visible=False, elem_id="sd-batch-plot")
                batch_table = gr.Dataframe(label="Outputs", wrap=True, interactive=False, visible=False,
                                           column_widths=["6%", "24%", "30%", "30%", "10%"])
                with gr.Row():
                    throughput_plot = gr.Plot(show_label=False, visible=False, elem_id="sd-throughput-plot")
                    throughput_table = gr.Dataframe(label="Throughput runs (each size: one SkipDecode and one "
                                                    "full batch, interleaved)", interactive=False, visible=False)

            # ---- KV cache -----------------------------------------------------------------------
            with gr.Tab("KV cache", id="kv"):
                gr.Markdown("Which positions each layer holds in its KV cache after the last comparison: under "
                            "SkipDecode, and under per-token early exit on the same tokens.")
                with gr.Row():
                    kv_button = gr.Button("Show the KV cache of the last run", variant="primary", scale=0,
                                          min_width=320, elem_id="sd-kv-run")
                kv_note = gr.Markdown(elem_id="sd-kv-note")
                kv_plot = gr.Plot(show_label=False, elem_id="sd-kv-plot")

            # ---- Present ------------------------------------------------------------------------
            with gr.Tab("Present", id="present", elem_id="sd-present-tab") as present_tab:
                with gr.Row():
                    previous_slide = gr.Button("◀ previous", elem_id="sd-previous-slide", scale=0, min_width=120)
                    next_slide = gr.Button("next ▶", elem_id="sd-next-slide", scale=0, min_width=120)
                    gr.Markdown("The last comparison (run or replayed), one thing at a time in large type: arrow keys, "
                                "space and Page Up/Down move between slides.")
                slide = gr.HTML(teach.slide_html(None, 0), js_on_load=teach.KEYS_JS, elem_id="sd-slide")
                slide_plot = gr.Plot(visible=False, show_label=False, elem_id="sd-slide-plot")
                slide_index = gr.State(0)

            # ---- Results ------------------------------------------------------------------------
            with gr.Tab("Results", id="results"):
                gr.Markdown("Measured results from `assets/results/`, exactly as the commands wrote them. The E2E "
                            "plot draws as a frontier what this app serves: at each speedup, the adapter "
                            "\"auto\" runs there. Rows of the same run that auto does not run (an adapter at a "
                            "speedup it was not trained for, or one passed over for another) are experiments: in "
                            "the table after the served rows, and on the plot when the box below is ticked.")
                e2e_note = gr.Markdown()
                show_experiments = gr.Checkbox(False, label="show experiment adapters", elem_id="sd-show-experiments",
                                               info="grey points; hover one for its name")
                e2e_plot = gr.Plot(show_label=False, visible=False, elem_id="sd-results-plot")
                e2e_table = gr.Dataframe(label="E2E quality (test set): served rows first", interactive=False,
                                         visible=False, elem_id="sd-results-table")
                beams_note = gr.Markdown()
                beams_table = gr.Dataframe(label="E2E quality (test set), decoded by beam search of width 4, as the "
                                                 "E2E challenge's systems decoded", interactive=False, visible=False,
                                           elem_id="sd-results-beams")
                general_note = gr.Markdown()
                general_table = gr.Dataframe(label="General prompts (64 held-out chat prompts, 96 new tokens, greedy): "
                                                   "scored against the base model's own full-depth answers",
                                             interactive=False, visible=False, elem_id="sd-results-general")
                bench_note = gr.Markdown()
                bench_plot = gr.Plot(show_label=False, visible=False)
                bench_table = gr.Dataframe(label="Speed benchmark", interactive=False, visible=False)
                refresh = gr.Button("Reload results", size="sm")

        # ---- wiring ---------------------------------------------------------------------------------
        schedule_inputs = [model, speedup, max_new_tokens, manual, max_budget, min_budget, warmup, horizon, decay, mode,
                           prompt]  # the prompt: "auto" picks by it, and may run another speedup
        for control in schedule_inputs[:-1]:
            control.change(cb.preview, schedule_inputs, [budget_plot, schedule_note], api_visibility="private",
                           show_progress="hidden", queue=False)
        prompt.change(cb.preview_unless_replayed, [*schedule_inputs, replayed], [budget_plot, schedule_note],
                      api_visibility="private", show_progress="hidden", queue=False)
        demo.load(cb.preview, schedule_inputs, [budget_plot, schedule_note], api_visibility="private", queue=False)
        compare_inputs = [prompt, model, speedup, max_new_tokens, decoding, temperature, top_p, top_k, seed,
                          manual, max_budget, min_budget, warmup, horizon, decay, mode, beams, family]
        compare_outputs = [status, skip_out, full_out, metrics, quality, last, budget_plot, layer_plot, latency_plot]
        events = [trigger(cb.stream_compare, compare_inputs, compare_outputs, api_visibility="private",
                          concurrency_limit=concurrency, concurrency_id="decode", show_progress="minimal")
                  for trigger in (run.click, prompt.submit)]
        stop.click(None, cancels=events, api_visibility="private")
        # ---- teaching: marks, one position layer by layer, export and replay, presentation ----------
        settings_inputs = [speedup, max_new_tokens, decoding, temperature, top_p, top_k, seed, manual, max_budget,
                           min_budget, warmup, horizon, decay, mode, beams]
        shown_outputs = [skip_out, part_note, divergence_plot, position, lens_view, lens_plot]
        for event in events:
            event.success(lesson.after_compare, [last, *settings_inputs], [record, *shown_outputs],
                          api_visibility="private", concurrency_limit=concurrency, concurrency_id="decode")
        pick_outputs = [record, skip_out, position, lens_view, lens_plot, shown_layers, player]
        skip_out.click(lesson.clicked, [record, last], pick_outputs, api_visibility="private",
                       concurrency_limit=concurrency, concurrency_id="decode")
        # input, not release: the arrow keys move the slider without a release, and each move picks
        position.input(lesson.pick, [position, record, last], pick_outputs, api_visibility="private",
                       concurrency_limit=concurrency, concurrency_id="decode", trigger_mode="always_last",
                       show_progress="hidden")
        step_inputs, step_outputs = [record, position, shown_layers], [lens_view, lens_plot, shown_layers, player]
        for button, step in ((next_layer, lesson.next_layer), (previous_layer, lesson.previous_layer),
                             (play, lesson.play)):
            button.click(step, step_inputs, step_outputs, api_visibility="private", queue=False)
        player.tick(lesson.tick, step_inputs, step_outputs, api_visibility="private", queue=False)
        all_layers.click(lesson.show_all, [record, position], step_outputs, api_visibility="private", queue=False)
        export.click(None, None, None, js=teach.PNG_JS, api_visibility="private")
        export.click(lesson.export, [record, last], [record, export_file], api_visibility="private",
                     concurrency_limit=concurrency, concurrency_id="decode")
        replay_file.upload(lesson.replay, [replay_file], [record, status, full_out, metrics, quality, budget_plot,
                                                          layer_plot, latency_plot, *shown_outputs, last,
                                                          replay_note, prompt, replayed],
                           api_visibility="private", queue=False, show_progress="hidden")  # a refusal changes the note only
        replay_file.clear(lambda: "", None, replay_note, api_visibility="private", queue=False, show_progress="hidden")
        slide_outputs = [slide, slide_plot, slide_index]
        present_tab.select(lesson.slide, [record, slide_index], slide_outputs, api_visibility="private", queue=False)
        # always_last: a press while the last slide is still drawing (its chart, on a loaded machine) moves on
        # once it is drawn, where the default ("once") dropped it
        next_slide.click(lambda r, i: lesson.slide(r, i, 1), [record, slide_index], slide_outputs,
                         api_visibility="private", queue=False, trigger_mode="always_last")
        previous_slide.click(lambda r, i: lesson.slide(r, i, -1), [record, slide_index], slide_outputs,
                             api_visibility="private", queue=False, trigger_mode="always_last")
        slide.click(lesson.keyed, [record, slide_index], slide_outputs, api_visibility="private", queue=False,
                    trigger_mode="always_last")
        kv_button.click(cb.kv_cache, [last], [kv_plot, kv_note], api_visibility="private",
                        concurrency_limit=concurrency, concurrency_id="decode")
        batch_run.click(cb.batch, [batch_prompts, model, batch_speedup, batch_tokens],
                        [batch_status, batch_table, batch_plot], api_visibility="private",
                        concurrency_limit=concurrency, concurrency_id="decode")
        batch_measure.click(cb.throughput, [batch_prompts, model, batch_speedup, batch_tokens],
                            [throughput_plot, throughput_table], api_visibility="private",
                            concurrency_limit=concurrency, concurrency_id="decode")
        result_outputs = [show_experiments, e2e_note, e2e_table, e2e_plot, bench_note, bench_table, bench_plot,
                          beams_note, beams_table, general_note, general_table]
        demo.load(cb.results, None, result_outputs, api_visibility="private", queue=False)
        refresh.click(cb.results, None, result_outputs, api_visibility="private", queue=False).then(
            results.e2e_figure, [show_experiments], [e2e_plot], api_visibility="private", queue=False)
        show_experiments.change(results.e2e_figure, [show_experiments], [e2e_plot], api_visibility="private",
                                queue=False)
        gr.api(cb.compare_api, api_name="compare", concurrency_limit=concurrency, concurrency_id="decode")
    return demo
