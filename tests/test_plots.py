"""Plot builders and page views as pure functions of hand-made traces and tables (no model, no server)."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from types import SimpleNamespace

from app import plots, rounds, timing, views
from app.results import load_table
from skipdecode.evaluation import general
from skipdecode.models import DEFAULT_MODEL
from skipdecode.schedule import Schedule
from skipdecode.trace import StepRecord, Trace

L, P, W = 6, 3, 1  # layers, prompt tokens, warm-up layers
SCHEDULE = Schedule(L, max_budget=4, min_budget=2, warmup=W, horizon=2)


def hand_trace(schedule=SCHEDULE, steps=4, ms=10.0, prompt=P) -> Trace:
    trace = Trace(schedule.num_layers, 1, prompt, schedule.to_dict(), prefill_ms=5.0)
    for s in range(steps):
        trace.steps.append(StepRecord(s, schedule.budget(s), schedule.layers(s), schedule.skipped(s),
                                      ms * schedule.budget(s) / schedule.num_layers, 1))
    return trace


def test_budget_figure_plots_the_schedule_and_what_ran():
    run = hand_trace().to_frame()
    scheduled = views.scheduled_frame(SCHEDULE, 6)
    fig = plots.budget_figure(run, scheduled, L)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["scheduled b(s)"].y) == [4, 3, 2, 2, 2, 2]
    assert list(by_name["SkipDecode ran"].y) == [4, 3, 2, 2]
    assert set(by_name["full decoding"].y) == {L}
    assert fig.layout.yaxis.title.text == "layers run" and fig.layout.xaxis.title.text == "generated position s"


def test_a_flat_budget_is_drawn_beside_the_papers_decay_and_says_why_it_is_flat():
    """The served adapters spend a flat budget; the page draws the paper's decay at the same average beside it
    (more layers first, never more later, the warm-up kept) and says in one line why the adapter is flat. A
    decaying run, one set by hand and the base model get neither."""
    from app.comparison import Comparison
    from app.settings import Settings

    flat = Schedule(30, max_budget=10, min_budget=10, warmup=2, horizon=32)
    run = Comparison("p", "e2e-all (fine-tuned for 2x, 3x, 5x)", "e2e-1x (fine-tuned for 1x)", 30, flat, 48)
    decay = views.paper_decay(run)
    budgets = [decay.budget(s) for s in range(47)]
    assert budgets[0] > 10 > budgets[-1] and all(b >= a for a, b in zip(budgets[1:], budgets))
    assert decay.warmup == 2 and abs(decay.average_budget(32) - 10) <= 0.5
    fig = plots.budget_figure(hand_trace(flat).to_frame(), views.scheduled_frame(flat, 47), 30,
                              views.scheduled_frame(decay, 47))
    assert list({t.name: t for t in fig.data}["the paper's decay, same average"].y) == budgets
    note = views.flat_note_html(run)
    assert "flat budget</b>, 10 of 30 layers" in note and "e2e-finetuning.md" in note
    assert "general-adapters.md" in views.flat_note_html(Comparison("p", "general-3x (fine-tuned for 3x)", "b", 30,
                                                                    flat, 48))
    decaying = Schedule(30, max_budget=15, min_budget=5, warmup=2, horizon=32)
    for other in (Comparison("p", "e2e-all (x)", "b", 30, decaying, 48),
                  Comparison("p", "e2e-all (x)", "b", 30, flat, 48, settings=Settings(manual_budgets=True)),
                  Comparison("p", "SmolLM2 (base)", "SmolLM2 (base)", 30, flat, 48)):
        assert views.flat_note_html(other) == ""


def test_layer_states_mark_prompt_warmup_run_and_skipped():
    grid = plots.layer_states(hand_trace().to_frame(), L, P, W)
    assert grid.shape == (L, P + 4)
    assert (grid[:, :P] == 3).all()  # the prefill runs every layer on the prompt
    first = grid[:, P]  # budget 4: warm-up layer 0, then the top 3 layers (3, 4, 5)
    assert list(first) == [1, 0, 0, 2, 2, 2]
    last = grid[:, -1]  # budget 2: warm-up, then only the top layer
    assert list(last) == [1, 0, 0, 0, 0, 2]
    fig = plots.layer_map_figure(hand_trace().to_frame(), L, P, W)
    assert [t.name for t in fig.data if t.name] == ["skipped", "warm-up", "run", "prompt (prefill)"]
    assert np.array_equal(np.array(fig.data[0].z), grid)


def side(trace: Trace, tokens: int | None = None):
    """What app/timing.py reads of a run: its tokens and its trace."""
    return SimpleNamespace(token_ids=list(range(tokens or len(trace.steps) + 1)), trace=trace)


def test_latency_figure_counts_both_prefills_alike_and_agrees_with_the_cards():
    skip, full = hand_trace(), hand_trace(Schedule.full(L))
    t = timing.timing(side(skip), side(full), timing.turns(side(skip)), timing.turns(side(full)))
    fig = plots.latency_figure(timing.token_frame(skip), timing.token_frame(full), t.words())
    assert len(fig.data) == 4
    per_token = {t.name: list(t.y) for t in fig.data if t.xaxis == "x"}
    assert per_token["full decoding"] == [10.0] * 4  # decoded tokens 1-4: the prefill is not a decoded token
    expected = [10 * 4 / 6, 10 * 3 / 6, 10 * 2 / 6, 10 * 2 / 6]
    assert per_token["SkipDecode"] == pytest.approx(expected, abs=1e-3)  # the trace keeps ms to 4 decimals
    cumulative = {t.name: list(t.y) for t in fig.data if t.xaxis == "x2"}
    assert cumulative["full decoding"] == [5.0, 15.0, 25.0, 35.0, 45.0]  # token 1 is the prefill's 5 ms
    # the headline's ratio is the ratio of the two curves' ends: both count their prefill once
    assert t.full_ms == cumulative["full decoding"][-1] and t.skip_ms == pytest.approx(cumulative["SkipDecode"][-1])
    assert t.end_to_end == pytest.approx(45.0 / (5 + sum(expected)), abs=1e-3)
    assert t.decode == pytest.approx(40.0 / sum(expected), abs=1e-3)
    assert t.verdict == timing.FASTER and fig.layout.title.text == f"Time: SkipDecode {t.end_to_end:.2f}× faster to " \
        "the whole answer"


def timed(ms: list[float], prefill: float = 50.0) -> Trace:
    trace = Trace(L, 1, P, SCHEDULE.to_dict(), prefill_ms=prefill)
    trace.steps += [StepRecord(s, L, tuple(range(L)), (), m, 1) for s, m in enumerate(ms)]
    return trace


def test_a_verdict_inside_the_spread_of_the_turns_says_too_close_to_call():
    """Interleaved turns whose ratio scatters around 1 give no faster or slower; a clear gap does."""
    rng = np.random.default_rng(1)
    full = timed(list(10 + rng.normal(0, 3, 40)))
    noisy = timed(list(10 + rng.normal(0, 3, 40)))
    close = timing.timing(side(noisy), side(full), timing.turns(side(noisy)), timing.turns(side(full)))
    assert close.verdict == timing.CLOSE and close.low < 1 < close.high
    assert "too close to call" in close.words() and "40 interleaved turns" in close.spread()
    fast = timed([s.ms / 2 for s in full.steps])
    clear = timing.timing(side(fast), side(full), timing.turns(side(fast)), timing.turns(side(full)))
    assert clear.verdict == timing.FASTER and clear.low > 1
    slow = timing.timing(side(full), side(fast), timing.turns(side(full)), timing.turns(side(fast)))
    assert slow.verdict == timing.SLOWER and slow.high < 1 and "slower" in slow.words()
    short = timing.timing(side(timed([5.0, 5.0])), side(timed([10.0, 10.0])), [(5.0, 1)] * 2, [(10.0, 1)] * 2)
    assert short.verdict == timing.SHORT and short.low is None


def test_verified_turns_are_its_rounds_each_beside_a_full_step():
    """A verified side's turn is a round (drafts and their pass, several tokens): its cost per token is the
    round's time over the tokens it emitted."""
    rounds = [{"first": 1, "drafted": 3, "accepted": 3, "emitted": 4, "source": "skipdecode", "draft_ms": 6.0,
               "verify_ms": 14.0}] * 4
    full = timed([10.0] * 16)
    verified = SimpleNamespace(token_ids=list(range(17)), trace=timed([5.0] * 16))
    t = timing.timing(verified, side(full), timing.turns(verified, {"rounds": rounds}), timing.turns(side(full)))
    assert timing.turns(verified, {"rounds": rounds}) == [(20.0, 4)] * 4
    assert t.decode == pytest.approx(2.0) and t.decode_low == pytest.approx(2.0) == t.decode_high


VERIFICATION = {  # three rounds of k 3: all kept (and a bonus), one rejected at its second draft, a cut last one
    "marks": ["verifier", "accepted", "accepted", "accepted", "verifier", "accepted", "replaced", "accepted"],
    "rounds": [{"first": 1, "drafted": 3, "accepted": 3, "emitted": 4, "source": "skipdecode", "draft_ms": 3.0,
                "verify_ms": 9.0},
               {"first": 5, "drafted": 3, "accepted": 1, "emitted": 2, "source": "skipdecode", "draft_ms": 3.0,
                "verify_ms": 9.0},
               {"first": 7, "drafted": 1, "accepted": 1, "emitted": 1, "source": "skipdecode", "draft_ms": 1.0,
                "verify_ms": 9.0}]}


def test_verified_rounds_draw_each_drafts_layers_and_each_verify_pass():
    drafts = rounds.drafts_frame(VERIFICATION, SCHEDULE, 8)
    assert list(drafts["outcome"]) == ["none", "kept", "kept", "kept", "none", "kept", "rejected", "kept"]
    assert list(drafts["round"]) == [0, 1, 1, 1, 1, 2, 2, 3]
    # the draft of token i ran the schedule's layers for step i - 1; tokens of no draft ran none of the draft's
    assert [tuple(x) for x in drafts["layers"]] == [(), SCHEDULE.layers(0), SCHEDULE.layers(1), SCHEDULE.layers(2),
                                                    (), SCHEDULE.layers(4), SCHEDULE.layers(5), SCHEDULE.layers(6)]
    passes = rounds.passes_frame(VERIFICATION, 8)
    # each pass judged its drafts and chose one more token: drafted + 1 output tokens (cut at the answer's end)
    assert list(zip(passes["first"], passes["last"])) == [(1, 4), (5, 7), (7, 7)]
    assert list(passes["lane"]) == [0, 1, 0] and list(passes["ms"]) == [12.0, 12.0, 10.0]
    grid = plots.draft_states(drafts, L, W)
    assert list(grid[:, 1]) == [1, 0, 0, 2, 2, 2]  # warm-up layer 0, skipped 1-2 (gaps), top layers kept
    assert list(grid[:, 6]) == [1, 0, 0, 0, 0, 3]  # a rejected draft's layers (budget 2 from the horizon on)
    assert (grid[:, 0] == 4).all() and (grid[:, 4] == 4).all()  # the prefill's token, a bonus token: no draft
    layer_map = plots.rounds_map_figure(drafts, passes, L, W)
    bars = [t for t in layer_map.data if t.legendgroup == "pass"]
    assert len(bars) == 3 and list(bars[1].x) == [6 - 0.42, 8 + 0.42]  # tokens counted from 1 on the page
    assert "kept 1 of 3 drafts" in bars[1].hovertemplate
    assert np.array_equal(np.array([t for t in layer_map.data if t.type == "heatmap"][0].z), grid)
    budget = plots.rounds_budget_figure(drafts, passes, views.scheduled_frame(SCHEDULE, 7), L)
    by_name = {t.name: t for t in budget.data}
    assert list(by_name["draft kept"].y) == [4, 3, 2, 2, 2] and list(by_name["draft rejected"].x) == [7]
    assert list(by_name["the draft's budget b(s)"].x)[0] == 2  # token 2's draft (the first): step 0's budget


def test_a_round_that_copies_from_the_prompt_then_drafts_draws_each_token_by_its_own_drafter():
    # round 1 copies two tokens from the prompt, then the skipped model drafts one; all three are kept
    mixed = {"rounds": [{"first": 1, "drafted": 3, "accepted": 3, "emitted": 4, "source": "prompt",
                         "prompt_drafts": 2, "draft_ms": 1.0, "verify_ms": 9.0}],
             "sources": ["verifier", "prompt", "prompt", "skipdecode", "verifier"]}
    drafts = rounds.drafts_frame(mixed, SCHEDULE, 5)
    assert list(drafts["outcome"]) == ["none", "copied", "copied", "kept", "none"]
    assert [tuple(x) for x in drafts["layers"]] == [(), (), (), SCHEDULE.layers(2), ()]  # a copy ran no layer


def test_rounds_of_an_older_file_are_read_back_from_its_marks():
    older = {"marks": VERIFICATION["marks"]}
    assert [(r["first"], r["drafted"], r["accepted"], r["emitted"]) for r in rounds.rounds_of(older)] == \
        [(1, 3, 3, 4), (5, 2, 1, 2), (7, 1, 1, 1)]  # drafts thrown away after a rejection go uncounted


def test_skipdecode_cache_has_no_holes_and_per_token_early_exit_has_them():
    trace = hand_trace()
    skip_held = plots.holdings([range(L)] * P + [step.layers for step in trace.steps], L)
    assert (plots.cache_states(skip_held) != 2).all()
    # Early exit at depths 2, 5, 3, 6: position P ran layers 0-1 only, but P + 1 runs up to layer 4 and
    # attends to layers 2-4 at position P: three holes; P + 2 exits at 3, P + 3 runs all six layers.
    early = plots.holdings([range(L)] * P + [range(2), range(5), range(3), range(6)], L)
    states = plots.cache_states(early)
    holes = {(l, p) for l, p in zip(*np.nonzero(states == 2))}
    assert holes == {(2, P), (3, P), (4, P), (5, P), (5, P + 1), (3, P + 2), (4, P + 2), (5, P + 2)}
    assert (states[:, -1] != 2).all()  # nothing comes after the last position
    fig = plots.kv_cache_figure([("SkipDecode", plots.cache_states(skip_held)), ("early exit", states)], P)
    titles = [a.text for a in fig.layout.annotations]
    assert "SkipDecode: 0 holes" in titles and "early exit: 8 holes" in titles


def test_cache_panels_align_exits_with_the_positions_they_ran():
    class Side:  # what views needs of a batcher Update
        def __init__(self, trace, tokens):
            self.trace, self.token_ids = trace, tokens

    class Comparison:
        num_layers = L
        skip = Side(hand_trace(), [1, 2, 3, 4, 5])

    # exits[k] is the depth that chose token k; position P + k fed token k and chose token k + 1.
    panels = views.cache_panels(Comparison, [6, 2, 5, 3, 6])
    skip, early = panels[0][1], panels[1][1]
    assert skip.shape == early.shape == (L, P + 4)
    assert list(early[:, P] == 1) == [True, True, False, False, False, False]
    assert (early == 2).sum() == 8 and (skip == 2).sum() == 0


def test_token_shading_follows_the_layers_that_chose_each_token():
    class Update:
        trace = hand_trace()
        token_ids = [7, 8, 9]

    assert views.token_layers(Update, L) == [L, 4, 3]  # the prefill chose token 0
    html = views.tokens_html(["Hi", " <b>", "!"], [L, 4, 3], L)
    assert "&lt;b&gt;" in html and "<b>" not in html  # model output is escaped
    assert html.count('class="sd-token"') == 3 and "chosen after 4 of 6 layers" in html


def test_batch_budget_figure_leaves_finished_rows_blank():
    cells = pd.DataFrame({"row": [0, 0, 0, 1], "step": [0, 1, 2, 0], "budget": [4, 3, 2, 4], "tick": [0, 1, 2, 0]})
    fig = plots.batch_budget_figure(cells, L)
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (2, 3) and list(z[0]) == [4, 3, 2]
    assert z[1, 0] == 4 and math.isnan(z[1, 1]) and math.isnan(z[1, 2])
    assert "shared by every row" in fig.layout.title.text


def test_a_batch_of_one_budget_says_why_its_map_is_one_colour():
    """A flat budget (the served adapters' at 2x and 3x) colours every cell alike: the title says so, and why."""
    cells = pd.DataFrame({"row": [0, 0, 1, 1], "step": [0, 1, 0, 1], "budget": [3, 3, 3, 3], "tick": [0, 1, 1, 2]})
    title = plots.batch_budget_figure(cells, L).layout.title.text
    assert title.startswith("One colour") and f"3 of {L} layers at every position" in title and "flat budget" in title


def test_batch_budget_figure_draws_rows_joining_a_running_batch_at_their_own_positions():
    """A continuous batch: prompt 2 joins at the batch's step 7 (its tick) with its own first position while
    prompt 1 is at its third; each cell is its row's own budget, blank before it joined and after it left."""
    cells = pd.DataFrame({"row": [0, 0, 0, 1, 1], "step": [0, 1, 2, 0, 1], "budget": [4, 3, 2, 4, 3],
                          "tick": [5, 6, 7, 7, 8]})
    fig = plots.batch_budget_figure(cells, L)
    z, at = np.array(fig.data[0].z, dtype=float), np.array(fig.data[0].customdata, dtype=float)
    assert z.shape == (2, 4) and list(z[0, :3]) == [4, 3, 2] and math.isnan(z[0, 3])
    assert math.isnan(z[1, 0]) and list(z[1, 2:]) == [4, 3] and at[1, 2] == 1 and at[0, 2] == 3
    assert "join and leave" in fig.layout.title.text


def test_throughput_figure():
    points = pd.DataFrame({"batch_size": [1, 2, 1, 2], "method": ["SkipDecode"] * 2 + ["full decoding"] * 2,
                           "tokens_per_s": [50.0, 95.0, 20.0, 39.0]})
    fig = plots.throughput_figure(points)
    assert {t.name: list(t.y) for t in fig.data} == {"SkipDecode": [50.0, 95.0], "full decoding": [20.0, 39.0]}


# An E2E table as `skipdecode eval --compare-adapters` writes it: base model, served adapters, experiments.
E2E_CSV = """row,model,adapter,speedup,bleu,ser,names,decode_speedup,mrs
untrained 1x,m,none,1.0,12.0,56.0,98.0,0.9,630
fine-tuned 1x,m,e2e-1x,1.0,57.0,22.0,100.0,1.0,630
fine-tuned 1x,m,e2e-all,1.0,55.9,23.4,100.0,0.96,630
SkipDecode 3x,m,e2e-3x-skd,3.0,57.3,27.0,99.2,2.37,630
SkipDecode 3x,m,e2e-3x,3.0,54.1,28.3,99.0,2.12,630
SkipDecode 5x,m,e2e-5x-refs,5.0,48.0,42.9,69.8,3.23,630
SkipDecode 5x,m,e2e-5x,5.0,52.2,31.5,87.8,3.12,630
SkipDecode 2x,m,e2e-2x,2.0,56.4,24.4,100.0,1.65,630
"""
SERVED = {("e2e-1x", 1.0), ("e2e-2x", 2.0), ("e2e-3x", 3.0), ("e2e-5x", 5.0)}  # what "auto" runs at each speedup


@pytest.fixture
def e2e(tmp_path):
    (tmp_path / "e2e.csv").write_text(E2E_CSV)
    return load_table("e2e", tmp_path, served=SERVED).frame


def test_results_table_puts_served_rows_and_the_readers_columns_first(e2e):
    assert list(e2e.columns) == ["row", "adapter", "served", "speedup", "bleu", "ser", "names", "decode_speedup",
                                 "model", "mrs"]
    assert list(e2e["adapter"]) == ["none", "e2e-1x", "e2e-3x", "e2e-5x", "e2e-2x",  # served, in the file's order
                                    "e2e-all", "e2e-3x-skd", "e2e-5x-refs"]
    assert list(e2e["served"]) == [True] * 5 + [False] * 3
    assert e2e.loc[e2e["adapter"] == "e2e-3x-skd", "bleu"].item() == 57.3  # the values as written


def test_results_plot_is_the_served_frontier_and_the_box_adds_the_experiments(e2e):
    fig = plots.quality_speed_figure(e2e)
    assert [t.name for t in fig.data] == ["served adapters", "base model, no adapter"]
    frontier = fig.data[0]
    assert list(frontier.text) == ["e2e-1x", "e2e-2x", "e2e-3x", "e2e-5x"]  # a line in speedup order
    assert list(frontier.x) == [1.0, 1.65, 2.12, 3.12] and list(frontier.y) == [57.0, 56.4, 54.1, 52.2]
    assert "lines" in frontier.mode and list(fig.data[1].y) == [12.0]
    assert fig.layout.xaxis.title.text == "measured decode speedup" and fig.layout.yaxis.title.text == "BLEU"
    shown = plots.quality_speed_figure(e2e, show_experiments=True)
    legend = sorted((t.legendrank, t.name) for t in shown.data if t.showlegend is not False)
    assert [name for _, name in legend] == ["served adapters", "base model, no adapter",
                                            "experiment adapters (hover for names)"]  # one entry for them all
    grey = shown.data[0]  # drawn first: under the frontier and its names
    assert grey.mode == "markers" and grey.marker.color == plots.EXPERIMENT and len(grey.x) == 3
    assert list(grey.customdata) == ["e2e-all (fine-tuned 1x)", "e2e-3x-skd (SkipDecode 3x)",
                                     "e2e-5x-refs (SkipDecode 5x)"]  # hover names them
    assert "%{customdata}" in grey.hovertemplate and grey.text is None  # no labels crowding the plot


def test_results_plot_of_a_table_without_served_rows_says_so(e2e):
    none_served = e2e.assign(served=False)
    assert "tick the box" in plots.quality_speed_figure(none_served).layout.annotations[0].text
    assert [len(t.x) for t in plots.quality_speed_figure(none_served, show_experiments=True).data] == [8]
    bare = e2e.drop(columns=["served"])  # a table nobody arranged: all served
    assert len(plots.quality_speed_figure(bare).data[0].x) == 7


def test_results_tables_say_when_they_are_missing(tmp_path):
    missing = load_table("e2e", tmp_path)
    assert missing.frame is None and "No `e2e.csv` yet" in missing.message and "skipdecode eval" in missing.message
    (tmp_path / "bench.csv").write_text("speedup,batch_size,measured_speedup\n1,1,1.0\n3,1,2.5\n")
    present = load_table("bench", tmp_path)
    assert list(present.frame["measured_speedup"]) == [1.0, 2.5] and "2 rows" in present.message


def test_results_tab_shows_the_tables_that_exist_and_names_the_missing_ones(tmp_path, monkeypatch):
    import app.results
    from app.callbacks import Callbacks

    (tmp_path / "bench.csv").write_text(
        "method,speedup,batch_size,tokens_per_s,measured_speedup,bound\n"
        "full,1,1,30,1.0,1.0\nskipdecode,3,1,66,2.2,2.4\nearly_exit_peer,3,1,40,1.3,2.4\n")
    monkeypatch.setattr(app.results, "RESULTS_DIR", tmp_path)
    box, e2e_note, e2e_table, e2e_plot, bench_note, bench_table, bench_plot, beams_note, beams_table, \
        general_note, general_table = Callbacks(studio=None).results()
    assert "No `e2e.csv` yet" in e2e_note and not e2e_table.visible and not e2e_plot.visible and not box.visible
    assert "No `e2e-beams4.csv` yet" in beams_note and "--beams 4" in beams_note and not beams_table.visible
    assert "No `general.csv` yet" in general_note and "--prompts validation" in general_note
    assert not general_table.visible
    assert "3 rows" in bench_note and bench_table.visible and bench_plot.visible and "What this page runs" in bench_note
    assert [row[:2] for row in bench_table.value["data"]] == [  # what the page runs first, the others labelled
        ["full decoding", "yes: one request"], ["SkipDecode", "yes: one request"],
        ["per-token early exit", "no: measured for comparison"]]
    names = {trace.get("name") for trace in json.loads(bench_plot.value["plot"])["data"]}
    assert {"SkipDecode, batch 1", "early-exit peer, batch 1"} <= names
    # the box that adds the experiments shows only when the table has rows of adapters not served
    (tmp_path / "e2e.csv").write_text(E2E_CSV)
    monkeypatch.setattr(app.results, "served_pairs", lambda speedups: SERVED)
    assert Callbacks(studio=None).results()[0].visible
    every = pd.read_csv(tmp_path / "e2e.csv")
    monkeypatch.setattr(app.results, "served_pairs", lambda speedups: set(zip(every["adapter"], every["speedup"])))
    assert not Callbacks(studio=None).results()[0].visible
    (tmp_path / "e2e-beams4.csv").write_text("row,adapter,speedup,bleu,bleu_e2e\nfine-tuned 1x,e2e-1x,1.0,66.0,66.9\n")
    *_, beams_note, beams_table, _, _ = Callbacks(studio=None).results()
    assert "1 rows" in beams_note and beams_table.visible and list(beams_table.value["headers"][:3]) == [
        "run", "adapter", "target speedup (×)"]
    # the general-prompt table as eval wrote it, the columns a reader looks for first
    (tmp_path / "general.csv").write_text(
        "speedup,adapter,rouge_l_vs_full,bleu_vs_full,ppl_ratio,agreement,repetition,avg_layers,decode_speedup\n"
        "1.0,none,100.0,100.0,1.0,100.0,10.7,30.0,1.0\n2.0,general-2x,29.0,12.4,2.64,7.7,14.5,15.2,1.74\n"
        "5.0,none,5.2,0.1,11171.725,1.9,2.2,6.3,3.18\n")
    *_, general_note, general_table = Callbacks(studio=None).results()
    assert "3 rows" in general_note and general_table.visible and "Perplexity vs full" in general_note
    headers = list(general_table.value["headers"])
    assert headers[:5] == ["target speedup (×)", "adapter", "ROUGE-L vs full (0-100)", "BLEU vs full (0-100)",
                           "perplexity vs full (×)"]
    ratios = [row[4] for row in general_table.value["data"]]
    assert ratios == ["1.00", "2.64", "11,172: text fallen apart"]  # no bare ratio in the thousands


def test_results_tab_box_redraws_the_plot_with_the_adapters_folder_as_the_served_set(tmp_path, monkeypatch):
    import app.results

    (tmp_path / "e2e.csv").write_text(E2E_CSV)
    monkeypatch.setattr(app.results, "served_pairs", lambda speedups: SERVED)
    off, on = app.results.e2e_figure(False, tmp_path), app.results.e2e_figure(True, tmp_path)
    assert [len(t.x) for t in off.data] == [4, 1] and [len(t.x) for t in on.data] == [3, 4, 1]
    missing = app.results.e2e_figure(True, tmp_path / "elsewhere")
    assert "No e2e.csv yet" in missing.layout.annotations[0].text
    adapters = tmp_path / "adapters"
    (adapters / "e2e-2x").mkdir(parents=True)
    (adapters / "e2e-2x" / "adapter_config.json").write_text("{}")
    (adapters / "e2e-2x" / "skipdecode.json").write_text(json.dumps({"speedups": [2], "base_model": DEFAULT_MODEL}))
    monkeypatch.undo()
    monkeypatch.setenv("SKIPDECODE_ADAPTERS", str(adapters))
    # "auto" runs e2e-2x at 2x only: at 1x, 3x and 5x it would run it at 2x, so those rows are not what it serves
    assert app.results.served_pairs([1.0, 2.0, 3.0, 5.0]) == {("e2e-2x", 2.0)}
    assert list(app.results.e2e_figure(False, tmp_path).data[0].text) == ["e2e-2x"]


def test_a_row_is_served_only_where_auto_runs_that_adapter_at_that_speedup(tmp_path, monkeypatch):
    """Today's set: auto runs e2e-5x at 5x (not e2e-all) and, asked for 4x, runs 5x: the test table's 4x row
    and its e2e-all-at-5x row are experiments, off the served frontier."""
    import app.results

    for name, speedups in (("e2e-1x", [1]), ("e2e-all", [2, 3, 5]), ("e2e-5x", [5])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
        card = {"speedups": speedups, "base_model": DEFAULT_MODEL}
        (tmp_path / name / "skipdecode.json").write_text(json.dumps(card))
    monkeypatch.setenv("SKIPDECODE_ADAPTERS", str(tmp_path))
    assert app.results.served_pairs([1, 2, 3, 4, 5]) == {("e2e-1x", 1.0), ("e2e-all", 2.0), ("e2e-all", 3.0),
                                                         ("e2e-5x", 5.0)}
    (tmp_path / "e2e.csv").write_text("row,adapter,speedup,bleu\nSkipDecode 4x,e2e-5x,4.0,14.3\n"
                                      "SkipDecode 5x,e2e-5x,5.0,65.4\nSkipDecode 5x,e2e-all,5.0,64.6\n")
    table = load_table("e2e", tmp_path).frame
    assert list(zip(table["adapter"], table["speedup"], table["served"])) == [
        ("e2e-5x", 5.0, True), ("e2e-5x", 4.0, False), ("e2e-all", 5.0, False)]


def test_the_quality_panel_says_what_it_compares_against():
    """The panel names the full-decoding model and its depth; the E2E note shows only without references."""
    from app.comparison import Comparison

    comparison = Comparison("Why is the sky blue?", "general-3x", "SmolLM2-135M-Instruct", 30, SCHEDULE, 8,
                            quality={"skipdecode_vs_full": {"bleu": 40.0, "rouge_l": 55.0},
                                     "token_agreement": {"agreement": 0.5, "prefix": 3},
                                     "perplexity": {"skipdecode": 2.0, "full": 1.8}, "references": None})
    panel = views.quality_html(comparison)
    assert "Compared against full decoding of the same prompt" in panel
    assert "SmolLM2-135M-Instruct, all 30 layers" in panel and "55.0" in panel
    assert "Scores against references appear for E2E" in panel
    assert "appear when both runs have finished" in views.quality_html(None)


def test_how_this_runs_speaks_plain_words_and_warns_only_of_a_fallback_in_effect(monkeypatch):
    """The machinery in words a visitor reads (no build labels); a warning only where the fast kernel was
    wanted and did not build, or a compile failed."""
    from app import machinery
    from skipdecode.kernels import w4a8

    kernel = SimpleNamespace(isa="AVX512-VNNI")  # the int8 kernel serving the 4-bit products
    decoder = SimpleNamespace(weights=SimpleNamespace(head=SimpleNamespace(screen=kernel)), device=SimpleNamespace(
        type="cpu"), dtype="torch.float32")
    engine = SimpleNamespace(decoder=decoder, name="SmolLM2-135M-Instruct", num_layers=30,
                             step_label="eager step")
    words = " ".join(machinery.sentences(engine))
    assert "4 bits" in words and "8-bit integers" in words and "30 layers" in words
    assert not [w for w in ("GGUF", "Q4_1", "Q8_1", "AVX", "VNNI", "eager step", "SKIPDECODE_") if w in words]
    assert machinery.warnings(engine) == [] and machinery.warnings_html(engine) == ""
    decoder.weights.head.screen = SimpleNamespace()  # PyTorch's 4-bit kernel: why?
    monkeypatch.setattr(w4a8, "library", lambda: SimpleNamespace(reason="no C compiler (install gcc or set CC)"))
    monkeypatch.setattr(w4a8, "setting", lambda: "auto")
    assert machinery.warnings(engine) == ["The fast 8-bit kernel is not running (no C compiler (install gcc or set "
                                          "CC)): PyTorch's 4-bit kernel runs instead, slower."]
    monkeypatch.setattr(w4a8, "setting", lambda: "bf16")  # the host chose it: nothing fell back
    assert machinery.warnings(engine) == []
    assert "at each position every row runs the same layers" in words  # batches of one position
    decoder.fused = object()  # every layer in one C call (skipdecode/kernels/layer.c), rows at their own positions
    words = " ".join(machinery.sentences(engine))
    assert "one call to the C library" in words and "each row at its own position and budget" in words


def test_the_headline_figure_lies_in_the_spread_it_states_when_one_side_runs_on():
    """The figure and its spread come from the same turns: those that decoded the tokens both sides reached. A side
    that runs on (here SkipDecode, slower past full decoding's end) adds none of its later turns to either."""
    fast_then_slow = timed([5.0] * 40 + [50.0] * 40)
    full = timed([10.0] * 40)
    t = timing.timing(side(fast_then_slow), side(full), timing.turns(side(fast_then_slow)), timing.turns(side(full)))
    assert t.tokens == 41 and t.turns == 40
    assert t.end_to_end == pytest.approx((50 + 400) / (50 + 200), abs=1e-3) and t.decode == pytest.approx(2.0)
    assert t.low <= t.end_to_end <= t.high and t.decode_low <= t.decode <= t.decode_high
    rng = np.random.default_rng(3)  # skewed, uneven runs: the figure never falls outside its own spread
    for seed in range(40):
        a, b = rng.lognormal(1.5, 0.8, int(rng.integers(4, 90))), rng.lognormal(2.0, 0.8, int(rng.integers(4, 90)))
        t = timing.timing(side(timed(list(a))), side(timed(list(b))), timing.turns(side(timed(list(a)))),
                          timing.turns(side(timed(list(b)))), seed=seed)
        assert t.low <= t.end_to_end <= t.high, (seed, t)
    short = timing.timing(side(timed([5.0])), side(timed([10.0])), [(5.0, 1)], [(10.0, 1)])
    assert short.verdict == timing.SHORT and "too short a run to tell" in short.words()


def finished(skip_ms, full_ms, perplexity, model="general-3x (fine-tuned for 3x)", full_model="M (base)",
             texts=("text", "text")):
    """A finished comparison on hand-made traces, scored with these perplexities (SkipDecode's, full's)."""
    from app.comparison import Comparison
    from skipdecode.batcher import BatchInfo, Update

    def update(ms, text):
        return Update(0, BatchInfo(1, 1, {}, 0.0), [1, 2], list(range(len(ms) + 1)), text, True, True, timed(ms))

    return Comparison("Why is the sky blue?", model, full_model, L, SCHEDULE, len(skip_ms) + 1,
                      skip=update(skip_ms, texts[0]), full=update(full_ms, texts[1]),
                      quality={"skipdecode_vs_full": None, "token_agreement": {"agreement": 0.1, "prefix": 0},
                               "perplexity": dict(zip(("skipdecode", "full"), perplexity)), "references": None})


def test_a_broken_answer_is_said_first_and_never_called_faster():
    """Past results.BROKEN (the full model finds the SkipDecode answer that many times less likely than its own),
    the headline says the answer has fallen apart before any speed, and neither it nor the latency chart says
    "faster"; below it, the same speed is the verdict."""
    broken = finished([5.0] * 30, [10.0] * 30, (57872.0, 3.1))
    headline = views.headline_html(broken, running=False)
    assert "sd-broken" in headline and "faster" not in headline.lower()
    assert "answer has fallen apart: the full model finds it 18,668× less likely" in headline
    assert "Perplexity 57,872 against 3.10" in headline
    latency = views.compare_figures(broken)[2]
    assert "fallen apart" in latency.layout.title.text and "faster" not in latency.layout.title.text
    fine = finished([5.0] * 30, [10.0] * 30, (4.0, 3.1))
    assert "faster to the whole answer" in views.headline_html(fine, running=False)
    assert views.broken(fine) is None


def test_a_looping_answer_is_said_first_and_never_called_faster():
    """A fluent answer that says the same thing again (its share of repeated word triples past results.LOOPING,
    full decoding's not): the headline says it loops before any speed, and neither it nor the latency chart says
    "faster". Where full decoding loops as much, the model loops, not the skipping: the speed is the verdict."""
    from app.results import LOOPING

    loop = "The knight and the dragon became friends. " * 12
    prose = ("Once upon a time a knight rode out to find the dragon that had burned the northern fields. He found "
             "it asleep by a cold river, thin and wounded, and instead of drawing his sword he brought it water.")
    assert general.repetition(loop) > LOOPING >= general.repetition(prose)
    loops = finished([5.0] * 30, [10.0] * 30, (1.4, 3.1), texts=(loop, prose))
    headline = views.headline_html(loops, running=False)
    assert "sd-broken" in headline and "faster" not in headline.lower()
    assert f"answer loops: {100 * general.repetition(loop):.0f}% of its word triples repeat earlier ones" in headline
    latency = views.compare_figures(loops)[2]
    assert "loops" in latency.layout.title.text and "faster" not in latency.layout.title.text
    shares = f"<td>{100 * general.repetition(loop):.0f}%</td><td>0%</td>"  # both sides' loops, in the quality panel
    assert "word triples said before (loops)" in views.quality_html(loops) and shares in views.quality_html(loops)
    both = finished([5.0] * 30, [10.0] * 30, (1.4, 1.4), texts=(loop, loop))
    assert views.looping(both) is None and "faster to the whole answer" in views.headline_html(both, running=False)


def test_the_side_titles_name_each_model_only_where_the_sides_differ():
    """An adapter against the base model: each title says which, in plain words (never the model list's nested
    notes); one model on both sides: no names."""
    differ = finished([5.0] * 8, [10.0] * 8, (2.0, 1.8))
    skip, full = views.skip_title_html(differ), views.full_title_html(differ)
    assert "the general-3x adapter" in skip and "the base model" in full and "fine-tuned" not in skip + full
    same = finished([5.0] * 8, [10.0] * 8, (2.0, 1.8), full_model="general-3x (fine-tuned for 3x)")
    assert "sd-side-model" not in views.skip_title_html(same) + views.full_title_html(same)
    assert views.model_name("e2e-all (fine-tuned for 2x, 3x, 5x)") == "the e2e-all adapter"


def test_words_a_person_reads_count_in_the_singular_and_the_plural():
    run = finished([], [10.0] * 3, (2.0, 1.8))  # SkipDecode's first token, full decoding's fourth
    run.max_new_tokens = 48
    assert views.tokens(1) == "1 token" and views.tokens(2) == "2 tokens"
    assert "SkipDecode: 1 token," in views.headline_html(run, running=True)
    assert views.progress_label(run) == "Running… 4 of 48 tokens"


def test_the_batch_tab_speaks_to_people_without_internal_batch_numbers():
    """The Batch tab's status, outputs and throughput table: models named plainly, prompts numbered from 1,
    columns with units, and no batch number the batcher keeps for itself."""
    from app.comparison import BatchRun

    done = finished([5.0] * 4, [10.0] * 4, (2.0, 1.8))
    run = BatchRun(["a", "b"], SCHEDULE, L, ("e2e-all (fine-tuned for 2x, 3x, 5x)", "e2e-1x (fine-tuned for 1x)"),
                   ("e2e-all: an E2E meaning representation at 3x", "e2e-1x: an E2E meaning representation at 1x"),
                   [done.skip, done.skip], [done.full, done.full])
    status = views.batch_status(run)
    assert status.startswith(f"Done. SkipDecode: **{views.safe('the e2e-all adapter')}** (an E2E meaning "
                             "representation at 3x)")  # escaped for Markdown: it shows as written
    assert "batch #" not in status and "fine-tuned" not in status and "1 row in one batch" in status
    table = views.batch_table(run)
    assert list(table.columns) == ["prompt #", "prompt", "SkipDecode", "full decoding", "SkipDecode tokens"]
    assert list(table["prompt #"]) == [1, 2]
    measured = pd.DataFrame([{"batch_size": 1, "method": "SkipDecode", "batch": 39, "rows": 1, "tokens_per_s": 50.0,
                              "ms_per_step": 20.0}])
    shown = views.throughput_table(measured)
    assert list(shown.columns) == ["batch size (rows)", "method", "decode tokens per second", "ms per decode step"]
