"""The page, top to bottom: one sentence and the prompt, then what a run draws (the answers and the verdict
first, the layer view a pick opens, the charts), and the other tabs. Wiring only; the work is in callbacks.

Nothing empty is drawn: the results appear with the first tokens, the layer view with the finished run, its
step buttons with a picked token; a control that cannot act yet is disabled.
"""

from __future__ import annotations

import gradio as gr

from skipdecode.schedule import DECAYS, DEFAULT_WARMUP, MODES, max_speedup

from . import keys, link, machinery, replay, results, teach, verified, views
from .callbacks import DECODINGS, KV_FIRST, RUN, Callbacks, stop_run
from .examples import load_examples
from .gpu import gpu_callbacks, zero_gpu
from .lesson import GPU_CALLBACKS as LESSON_GPU_CALLBACKS
from .lesson import PLAY, PLAY_EVERY_S, Lesson
from .studio import Studio

JS = keys.JS
CONCURRENCY = 32  # requests in flight at once; they wait on the batcher, which batches them
HEADER = ("<h1>SkipDecode Studio</h1><p>A language model answers twice, once skipping most of its layers and once "
          "using all of them: see what skipping saves and what it costs.</p>")
PAPER = ('<p>The method: <a href="https://arxiv.org/abs/2307.02628" target="_blank" rel="noopener">SkipDecode, '
         "Del Corro et al. 2023</a>. Every token at one position of a batch gets the same layer budget, which never "
         "grows, spent on the top layers after a few warm-up layers: the KV cache stays complete and batching "
         "works.</p>")

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
        with gr.Row(equal_height=False, elem_id="sd-top"):
            with gr.Column(scale=4, min_width=480):
                gr.HTML(HEADER, elem_id="sd-header")
            with gr.Column(scale=1, min_width=260):
                with gr.Accordion("How this runs", open=False, elem_id="sd-how"):
                    gr.HTML(machinery.how_html(engine) + PAPER)
        fallbacks = machinery.warnings_html(engine)  # only when one is in effect
        gr.HTML(fallbacks, elem_id="sd-warnings", visible=bool(fallbacks))
        with gr.Tabs(elem_id="sd-tabs") as tabs:
            # ---- Compare ------------------------------------------------------------------------
            with gr.Tab("Compare", id="compare"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        prompt = gr.Textbox(label="Your prompt", lines=3, max_lines=8, elem_id="sd-prompt",
                                            placeholder="Ask anything, or pick an example below")
                        # bad input, said beside the prompt
                        prompt_note = gr.HTML(elem_id="sd-prompt-note", visible=False, js_on_load=keys.NOTE_JS)
                        gr.Examples(examples.all_prompts, inputs=prompt, example_labels=examples.labels,
                                    label="Examples (the restaurant records are also scored against people's own "
                                    "descriptions)", examples_per_page=10, elem_id="sd-examples")
                    with gr.Column(scale=2):
                        speedup = gr.Slider(1, max_speedup(L, DEFAULT_WARMUP), value=start, step=0.25,
                                            label="Target speedup", info=f"average layers per token = {L} / speedup",
                                            elem_id="sd-speedup")
                        speed_note = gr.Markdown(visible=False, elem_id="sd-speed-note")
                        family = gr.Radio(list(verified.FAMILIES), value=verified.FASTER, label="What it promises",
                                          elem_id="sd-family")  # app/verified.py
                        with gr.Row():
                            run = gr.Button(RUN, variant="primary", elem_id="sd-run", scale=3)
                            stop = gr.Button("Stop", variant="secondary", scale=1, interactive=False,
                                             elem_id="sd-stop")
                        with gr.Row():
                            lesson_button = gr.Button("Open the lesson's comparison", size="sm", elem_id="sd-lesson",
                                                      visible=replay.LESSON_FILE.exists())  # docs/teaching.md
                            replay_file = gr.UploadButton("Replay a saved comparison…", file_types=[".json"],
                                                          size="sm", elem_id="sd-replay-file")
                        # a refused file, said beside its button
                        replay_note = gr.HTML(elem_id="sd-replay-note", js_on_load=keys.NOTE_JS)
                with gr.Accordion("More settings: model, length, decoding, schedule", open=False,
                                  elem_id="sd-settings"):
                    with gr.Row():
                        model = gr.Dropdown(studio.labels, value=studio.labels[0], label="Model",
                                            interactive=len(studio.labels) > 1, elem_id="sd-model",
                                            info="auto picks the adapter for the prompt and the target speedup"
                                            if len(studio.labels) > 1 else
                                            "fine-tuned adapters join this list when assets/adapters has them")
                        max_new_tokens = gr.Slider(1, studio.limits.max_new_tokens, value=48, step=1,
                                                   label="Max new tokens", elem_id="sd-max-new-tokens")
                        decoding = gr.Radio(list(DECODINGS), value="greedy", label="Decoding", elem_id="sd-decoding")
                    gr.Markdown("**Schedule**: the layers each position runs")
                    with gr.Row():
                        manual = gr.Checkbox(False, label="Set budgets by hand (ignore the speedup slider)")
                        max_budget = gr.Slider(1, L, value=min(20, L), step=1, label="Max budget (first position)")
                        min_budget = gr.Slider(1, L, value=min(6, L), step=1, label="Min budget (from the horizon on)")
                    with gr.Row():
                        warmup = gr.Slider(0, L - 1, value=DEFAULT_WARMUP, step=1, label="Warm-up layers")
                        horizon = gr.Slider(0, studio.limits.max_new_tokens, value=0, step=1,
                                            label="Horizon (0 = max new tokens)", elem_id="sd-horizon")
                        decay = gr.Dropdown(list(DECAYS), value="linear", label="Decay")
                        mode = gr.Radio(list(MODES), value="skip", label="Mode",
                                        info="skip: warm-up + top layers; early_exit: bottom layers only")
                    schedule_note = gr.Markdown(elem_id="sd-schedule-note")
                    preview_plot = gr.Plot(show_label=False, elem_id="sd-preview-plot")
                    gr.Markdown("**Sampling and beam search** (for the Decoding choices above)")
                    with gr.Row():
                        beams = gr.Slider(2, studio.limits.max_beams, value=4, step=1, label="Beams (beam search)",
                                          info="the E2E table's beam rows used 4")
                        temperature = gr.Slider(0.05, 2.0, value=0.7, step=0.05, label="Temperature")
                        top_p = gr.Slider(0.05, 1.0, value=0.9, step=0.05, label="Top-p")
                        top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k (0 = off)")
                        seed = gr.Number(0, precision=0, label="Seed")

                with gr.Column(visible=False, elem_id="sd-results") as results_box:
                    with gr.Row(equal_height=False):
                        with gr.Column(scale=5):
                            headline = gr.HTML(elem_id="sd-headline", js_on_load=keys.REVEAL_JS)
                        with gr.Column(scale=1, min_width=150):
                            stop_here = gr.Button("Stop", elem_id="sd-stop-here", visible=False)  # while it runs
                            present = gr.Button("Present ▶", elem_id="sd-present", interactive=False)
                            # the next Tab stop: one press saves the comparison as JSON (and every chart as PNG)
                            export_here = gr.Button("Export ⤓", elem_id="sd-export-here", interactive=False)
                    with gr.Row(equal_height=False, elem_id="sd-answers"):  # both boxes start at one height
                        with gr.Column():
                            skip_title = gr.HTML(elem_id="sd-skip-title")
                            skip_out = gr.HTML(elem_id="sd-skip-output", js_on_load=teach.CLICK_JS)
                        with gr.Column():
                            full_title = gr.HTML(views.full_title_html(), elem_id="sd-full-title")
                            full_out = gr.HTML(elem_id="sd-full-output")
                    legend = gr.HTML(elem_id="sd-legend")
                    part_note = gr.Markdown(elem_id="sd-part-note")
                    with gr.Column(visible=False, elem_id="sd-teach") as teach_box:
                        with gr.Row(equal_height=True, elem_id="sd-lens-controls"):  # sticky: beside the tables
                            position = gr.Slider(1, 2, value=1, step=1, label="Token of the answer, layer by layer",
                                                 interactive=False, elem_id="sd-position", scale=3)
                            previous_layer = gr.Button("◀ layer", elem_id="sd-previous-layer", scale=0, min_width=90,
                                                       interactive=False)
                            next_layer = gr.Button("layer ▶", elem_id="sd-next-layer", scale=0, min_width=90,
                                                   interactive=False)
                            play = gr.Button(PLAY, elem_id="sd-play", scale=0, min_width=90, interactive=False)
                            all_layers = gr.Button("All layers", elem_id="sd-all-layers", scale=0, min_width=110,
                                                   interactive=False)
                        # the chart beside the tables, held in the window under the step buttons while they step
                        with gr.Row(equal_height=True, elem_id="sd-lens-row"):
                            with gr.Column(scale=4, min_width=560):  # both tables, three choices each
                                lens_view = gr.HTML(elem_id="sd-lens", js_on_load=teach.LENS_JS)
                            with gr.Column(scale=1, min_width=280):
                                lens_plot = gr.Plot(show_label=False, elem_id="sd-lens-plot", visible=False)
                    with gr.Column(visible=False, elem_id="sd-charts") as charts_box:
                        metrics = gr.HTML(elem_id="sd-metrics")
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=2):
                                quality = gr.HTML(elem_id="sd-quality")
                            with gr.Column(scale=3):
                                with gr.Row(equal_height=False):  # a flat budget: why, and the paper's decay
                                    flat_note = gr.HTML(elem_id="sd-flat-note", visible=False, scale=4)
                                    paper_decay = gr.Button("Run the paper's decaying budget", size="sm", scale=1,
                                                            visible=False, elem_id="sd-paper-decay")
                                budget_plot = gr.Plot(show_label=False, elem_id="sd-budget-plot")
                        latency_plot = gr.Plot(show_label=False, elem_id="sd-latency-plot")
                        layer_plot = gr.Plot(show_label=False, elem_id="sd-layer-plot")
                        divergence_plot = gr.Plot(show_label=False, elem_id="sd-divergence-plot")
                        with gr.Accordion("Details of this run", open=False, elem_id="sd-details"):
                            status = gr.Markdown(elem_id="sd-status")
                        with gr.Row(equal_height=False):
                            export = gr.Button("Export: the comparison as JSON, every chart as PNG",
                                               elem_id="sd-export", scale=1)
                            export_html = gr.Button("Standalone page (.html, plays offline)", elem_id="sd-export-html",
                                                    scale=1)
                            copy_link = gr.Button("Copy link", elem_id="sd-copy-link", scale=0, min_width=120)
                        with gr.Row(equal_height=False):
                            export_file = gr.File(label="Exported comparison", visible=False, elem_id="sd-export-file",
                                                  scale=1)
                            html_file = gr.File(label="Standalone page", visible=False, elem_id="sd-html-file", scale=1)
                        link_box = gr.Textbox(label="Link to this comparison (it opens with these settings; Run runs it)",
                                              interactive=False, visible=False, elem_id="sd-link", buttons=["copy"])
                last = gr.State(None)
                fresh = gr.State(None)  # the comparison a run just drew (None: it refused its input)
                stopper = gr.State({"stop": False})  # per session (a copy each); Stop sets it, the run reads it
                record = gr.State(None)  # the last comparison as app/replay.py records it (run or replayed)
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
                batch_status = gr.Markdown(elem_id="sd-batch-status")
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
                                          min_width=320, elem_id="sd-kv-run", interactive=False)
                kv_note = gr.Markdown(KV_FIRST, elem_id="sd-kv-note")
                kv_plot = gr.Plot(show_label=False, elem_id="sd-kv-plot", visible=False)

            # ---- Present ------------------------------------------------------------------------
            with gr.Tab("Present", id="present", elem_id="sd-present-tab") as present_tab:
                with gr.Row():
                    previous_slide = gr.Button("◀ previous", elem_id="sd-previous-slide", scale=0, min_width=120,
                                               interactive=False)
                    next_slide = gr.Button("next ▶", elem_id="sd-next-slide", scale=0, min_width=120,
                                           interactive=False)
                    gr.Markdown("The last comparison (run or replayed), one thing at a time in large type: arrow keys, "
                                "space and Page Up/Down move between slides.")
                slide = gr.HTML(teach.slide_html(None, 0), js_on_load=teach.KEYS_JS, elem_id="sd-slide")
                slide_plot = gr.Plot(visible=False, show_label=False, elem_id="sd-slide-plot")
                slide_index = gr.State(0)

            # ---- Results ------------------------------------------------------------------------
            with gr.Tab("Results", id="results"):
                gr.Markdown(results.INTRO)
                e2e_note = gr.Markdown()
                show_experiments = gr.Checkbox(False, label="show experiment adapters", elem_id="sd-show-experiments",
                                               info="grey points; hover one for its name")
                e2e_plot = gr.Plot(show_label=False, visible=False, elem_id="sd-results-plot")
                e2e_table = gr.Dataframe(label="E2E quality (test set): what the page serves first", interactive=False,
                                         visible=False, wrap=True, elem_id="sd-results-table")
                beams_note = gr.Markdown()
                beams_table = gr.Dataframe(label="E2E quality (test set), decoded by beam search of width 4, as the "
                                                 "E2E challenge's systems decoded", interactive=False, visible=False,
                                           wrap=True, elem_id="sd-results-beams")
                general_note = gr.Markdown()
                general_table = gr.Dataframe(label="General prompts (64 held-out chat prompts, 96 new tokens, greedy): "
                                                   "scored against the base model's own full-depth answers",
                                             interactive=False, visible=False, wrap=True, elem_id="sd-results-general")
                bench_note = gr.Markdown()
                bench_plot = gr.Plot(show_label=False, visible=False)
                bench_table = gr.Dataframe(label="Speed benchmark", interactive=False, visible=False,
                                           wrap=True, elem_id="sd-results-bench")
                refresh = gr.Button("Reload results", size="sm")

        # ---- wiring ---------------------------------------------------------------------------------
        schedule_inputs = [model, speedup, max_new_tokens, manual, max_budget, min_budget, warmup, horizon, decay, mode,
                           prompt]  # the prompt: "auto" picks by it, and may run another speedup
        preview_outputs = [preview_plot, schedule_note, speed_note]
        # one listener for every control: its runs never overlap (always_last), so no stale preview lands last
        gr.on([control.change for control in schedule_inputs], cb.preview, schedule_inputs, preview_outputs,
              api_visibility="private", show_progress="hidden", queue=False, trigger_mode="always_last")
        demo.load(cb.preview, schedule_inputs, preview_outputs, api_visibility="private", queue=False)
        compare_inputs = [prompt, model, speedup, max_new_tokens, decoding, temperature, top_p, top_k, seed,
                          manual, max_budget, min_budget, warmup, horizon, decay, mode, beams, family]
        # what a comparison draws (Callbacks.drawn): a run streams it, a replay draws it at once
        drawn_outputs = [results_box, headline, skip_title, full_title, skip_out, full_out, legend, status, last,
                         charts_box, metrics, quality, budget_plot, layer_plot, latency_plot, flat_note, paper_decay]
        # callbacks.STREAMED: what a run adds to what it draws
        streamed = [*drawn_outputs, teach_box, part_note, stop, stop_here, run, prompt_note, fresh]
        # Run and the prompt's submit (Shift+Enter) are one event: while its run goes, another press starts nothing
        # ("once"), so a session never has two runs drawing into one page
        run_event = gr.on([run.click, prompt.submit], cb.stream_compare, [*compare_inputs, stopper], streamed,
                          api_visibility="private", concurrency_limit=concurrency, concurrency_id="decode",
                          show_progress="hidden", trigger_mode="once")
        events = [run_event]
        # whatever ended the run (an error, a cancel), Run is ready again and Stop is not
        run_event.then(lambda: (gr.Button("Stop", interactive=False), gr.Button(visible=False),
                                gr.Button(RUN, interactive=True)), None, [stop, stop_here, run],
                       api_visibility="private", queue=False)
        # the paper's decaying budget beside a flat one: the schedule controls set to it, then Run
        paper_decay.click(cb.paper_settings, [last], [manual, max_budget, min_budget, warmup, horizon, decay, mode],
                          api_visibility="private", queue=False).then(None, js=keys.RUN_JS, api_visibility="private")
        # Stop ends the run at its next position, drawn as it stands (on ZeroGPU the run is in another process,
        # which the flag cannot reach: there Stop cancels it)
        for button in (stop, stop_here):  # Stop beside Run, and beside the headline while a run shows
            button.click(stop_run, [stopper], [button], api_visibility="private", queue=False,
                         cancels=events if zero_gpu() else None)
        # ---- teaching: marks, one position layer by layer, export and replay, presentation ----------
        step_buttons = [previous_layer, next_layer, play, all_layers]
        # what a finished comparison opens (Lesson.opened): its record, the marks, the layer view's controls
        opened_outputs = [record, skip_out, part_note, teach_box, position, lens_view, lens_plot, *step_buttons,
                          divergence_plot, kv_button, present, previous_slide, next_slide, slide_index, export_here]
        for event in events:
            event.success(lesson.after_compare, [fresh], opened_outputs,
                          api_visibility="private", concurrency_limit=concurrency, concurrency_id="decode")
        pick_outputs = [record, skip_out, position, lens_view, lens_plot, shown_layers, player, *step_buttons]
        skip_out.click(lesson.clicked, [record, last], pick_outputs, api_visibility="private",
                       concurrency_limit=concurrency, concurrency_id="decode")
        # input, not release: the arrow keys move the slider without a release, and each move picks
        position.input(lesson.pick, [position, record, last], pick_outputs, api_visibility="private",
                       concurrency_limit=concurrency, concurrency_id="decode", trigger_mode="always_last",
                       show_progress="hidden")
        step_inputs, step_outputs = [record, position, shown_layers], [lens_view, lens_plot, shown_layers, player, play]
        for button, step in ((next_layer, lesson.next_layer), (previous_layer, lesson.previous_layer)):
            button.click(step, step_inputs, step_outputs, api_visibility="private", queue=False)
        play.click(lesson.play, [*step_inputs, play], step_outputs, api_visibility="private", queue=False)  # or Pause
        player.tick(lesson.tick, step_inputs, step_outputs, api_visibility="private", queue=False)
        all_layers.click(lesson.show_all, [record, position], step_outputs, api_visibility="private", queue=False)
        for button in (export, export_here):  # the charts as PNG, the comparison as JSON: both downloaded at once
            button.click(None, None, None, js=teach.PNG_JS, api_visibility="private")
            button.click(lesson.export, [record, last], [record, export_file], api_visibility="private",
                         concurrency_limit=concurrency, concurrency_id="decode").success(
                None, [export_file], None, js=keys.DOWNLOAD_JS, api_visibility="private")
        export_html.click(lesson.export_html, [record], [html_file], api_visibility="private", queue=False)
        # ---- a link that opens a comparison (app/link.py): it fills the Compare tab, and Run runs it ----------
        link_widgets = {"prompt": prompt, "model": model, "speedup": speedup, "max_new_tokens": max_new_tokens,
                        "decoding": decoding, "temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed,
                        "beams": beams, "manual": manual, "max_budget": max_budget, "min_budget": min_budget,
                        "warmup": warmup, "horizon": horizon, "decay": decay, "mode": mode, "family": family}
        link_fields = link.fields(link_widgets, studio.models, studio.limits.max_prompt_chars)

        def open_link(request: gr.Request):
            values = link.decode(dict(request.query_params) if request else {}, link_fields)
            return [values.get(name, gr.skip()) for name in link_widgets]

        demo.load(open_link, None, list(link_widgets.values()), api_visibility="private", queue=False)
        copy_link.click(lambda r: lesson.link(r, link_fields), [record], [link_box], api_visibility="private",
                        queue=False).then(None, [link_box], [link_box], js=link.COPY_JS, api_visibility="private")
        replay_outputs = [*drawn_outputs, *opened_outputs, replay_note, prompt]
        replay_file.upload(lesson.replay, [replay_file], replay_outputs, api_visibility="private", queue=False,
                           show_progress="hidden")  # a refusal changes the note only
        lesson_button.click(lesson.replay_lesson, None, replay_outputs, api_visibility="private", queue=False,
                            show_progress="hidden")
        slide_outputs = [slide, slide_plot, slide_index]
        present_tab.select(lambda r, i, c: lesson.slide(r, i, 0, c), [record, slide_index, last], slide_outputs,
                           api_visibility="private", queue=False)
        present.click(lambda r, c: (gr.Tabs(selected="present"), *lesson.slide(r, 0, 0, c)), [record, last],
                      [tabs, *slide_outputs],
                      api_visibility="private", queue=False, js=None)
        present.click(None, js=keys.TO_TOP_JS, api_visibility="private")
        # always_last: a press while the last slide is still drawing (its chart, on a loaded machine) moves on
        # once it is drawn, where the default ("once") dropped it
        next_slide.click(lambda r, i, c: lesson.slide(r, i, 1, c), [record, slide_index, last], slide_outputs,
                         api_visibility="private", queue=False, trigger_mode="always_last")
        previous_slide.click(lambda r, i, c: lesson.slide(r, i, -1, c), [record, slide_index, last], slide_outputs,
                             api_visibility="private", queue=False, trigger_mode="always_last")
        slide.click(lesson.keyed, [record, slide_index, last], slide_outputs, api_visibility="private", queue=False,
                    trigger_mode="always_last")
        kv_button.click(cb.kv_cache, [last], [kv_plot, kv_note], api_visibility="private",
                        concurrency_limit=concurrency, concurrency_id="decode")
        # what each of these buttons draws comes into view once it shows
        for button, drawn_there in ((kv_button, "#sd-kv-plot .js-plotly-plot"), (batch_run, "#sd-batch-plot"),
                                    (batch_measure, "#sd-throughput-plot .js-plotly-plot")):
            button.click(None, js=keys.reveal_js(drawn_there), api_visibility="private")
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
