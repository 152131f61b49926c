"""The teaching views (app/teach.py) and export/replay (app/replay.py) on a real comparison of a tiny model:
the marks are where full depth chooses otherwise, a replayed record draws the same page, a damaged file
is refused with a message."""

import copy
import json

import gradio as gr
import pytest

from app import replay, teach
from app.comparison import Comparison
from app.settings import Settings
from conftest import IdTokenizer, tiny_model
from skipdecode import lens
from skipdecode.batcher import BatchInfo, Update
from skipdecode.engine import Engine
from skipdecode.schedule import Schedule, for_speedup

PROMPT = [1, 10, 20, 30, 40]
TOKENS = 16


@pytest.fixture(scope="module")
def comparison():
    """SkipDecode at 3x beside full decoding, as the studio would have them, with the divergence and the lens."""
    engine = Engine(tiny_model("llama", layers=6), IdTokenizer())
    schedule = for_speedup(3.0, engine.num_layers, horizon=TOKENS, warmup=1)
    sides = []
    for run_schedule in (schedule, None):
        run = engine.generate([PROMPT], run_schedule, TOKENS, stop_at_eos=False)
        batch = BatchInfo(len(sides) + 1, 1, run.trace.schedule, 0.0)
        sides.append(Update(0, batch, PROMPT, run.token_ids[0], run.texts[0], True, True, run.trace))
    out = Comparison("a prompt", "tiny", "tiny", engine.num_layers, schedule, TOKENS, *sides,
                     quality={"skipdecode_vs_full": None, "token_agreement": {"agreement": 0.5, "prefix": 2},
                              "perplexity": {"skipdecode": 3.0, "full": 2.0}, "references": None})
    out.divergence = lens.divergence(engine.decoder, PROMPT, out.skip.token_ids)
    steps = [s.layers for s in out.skip.trace.steps]
    out.lenses = {"skipdecode": lens.lens(engine.decoder, PROMPT, out.skip.token_ids, steps),
                  "full": lens.lens(engine.decoder, PROMPT, out.skip.token_ids)}
    return out


@pytest.fixture(scope="module")
def record(comparison):
    return replay.record(comparison, IdTokenizer(), Settings(speedup=3.0, max_new_tokens=TOKENS, seed=7))


def test_the_record_holds_the_trace_settings_seed_hardware_and_every_tokens_text(record, comparison):
    assert record["format"] == replay.FORMAT and record["seed"] == 7 and record["settings"]["speedup"] == 3.0
    assert record["hardware"]["device"] == "cpu" and record["hardware"]["cpu_count"] >= 1
    assert [s["ms"] for s in record["skipdecode"]["trace"]["steps"]] == [
        round(s.ms, 4) for s in comparison.skip.trace.steps]
    assert record["divergence"]["tokens"] == comparison.divergence.tokens
    named = {t for e in record["divergence"]["tokens"] for t in (e["token"], e["full_token"])}
    named |= {t for side in record["lens"].values() for v in side for row in v["top"] for t, _ in row}
    assert set(map(int, record["texts"])) == named
    assert "".join(record["skipdecode"]["pieces"]) == comparison.skip.text
    json.dumps(record)  # JSON-safe as it is


def test_marks_are_exactly_where_full_depth_chooses_otherwise(record):
    page = teach.marked_html(record, picked=3)
    parted = [e["position"] for e in record["divergence"]["tokens"] if e["token"] != e["full_token"]]
    assert parted, "a random 6-layer model at 3x should part from full depth somewhere"
    assert page.count('class="sd-token sd-part') == len(parted)
    for i in parted:
        assert f'class="sd-token sd-part" data-pos="{i}"' in page or f'sd-part sd-picked" data-pos="{i}"' in page
    assert page.count("sd-picked") == 1 and page.count("data-pos=") == TOKENS
    assert page.count("full depth would choose") == len(parted)
    first = record["divergence"]["first"]
    assert f"They first part at token {first + 1}:" in teach.summary_markdown(record)  # counted from 1


def test_the_layer_view_shows_the_run_layers_and_steps_through_them(record, comparison):
    position = teach.default_position(record)
    view = teach.lens_html(record, position)
    L = record["num_layers"]
    skipped = L - len(comparison.lenses["skipdecode"][position].layers)
    assert view.count("<td>skipped</td>") == 0 and view.count(">skipped</td>") == skipped
    assert view.count("prediction depth") == 2 and "sd-hidden" not in view
    two = teach.lens_html(record, position, shown_layers=2)
    assert two.count('class="sd-hidden') == 2 * (L - 2) and two.count("sd-now") == 2
    assert "prediction depth" not in two and two.count(f"layers 0-1 of {L} shown") == 2  # no answer before the top
    assert "sd-final" not in two and "would choose" not in two and "which token will each side choose" in two
    figure = teach.lens_figure(record, position)
    for trace, side in zip(figure.data, ("skipdecode", "full")):  # a skipped layer is a gap, not a zero
        assert [x for x, y in zip(trace.x, trace.y) if y is not None] == comparison.lenses[side][position].layers
        assert list(trace.x) == list(range(L)) and "“" in trace.name  # the token it finally chose
    stepped = teach.lens_figure(record, position, shown_layers=2)
    assert [t.name for t in stepped.data] == ["SkipDecode, its run layers", "full depth, same prefix"]
    assert all(y is None for t in stepped.data for y in t.y[2:])


def test_a_replayed_record_draws_the_same_page(record, comparison, tmp_path):
    back = replay.read(replay.write(record, tmp_path))
    assert back == json.loads(json.dumps(record))
    again = replay.comparison(back)
    # the record made again from the replayed comparison is the record: one record of the run, the settings
    # that ran and each token's text kept
    before, after = json.loads(json.dumps(record)), json.loads(json.dumps(replay.record(again, IdTokenizer())))
    for name in ("skipdecode", "full"):  # the trace's totals are sums of steps rounded for JSON
        assert after[name]["trace"]["steps"] == before[name]["trace"]["steps"]
        assert after[name]["trace"]["decode_ms"] == pytest.approx(before[name]["trace"]["decode_ms"], abs=0.01)
        for side in (before, after):
            del side[name]["trace"]
    # the measured speedup is computed from the steps' ms, which the record rounds for JSON
    assert after["speedup"]["measured"] == pytest.approx(before["speedup"]["measured"], abs=0.01)
    for side in (before, after):
        del side["exported"], side["hardware"], side["speedup"]["measured"]  # when and where this copy was written
    assert after == before
    assert again.lenses == comparison.lenses and again.divergence == comparison.divergence
    assert replay.record(again, IdTokenizer(), Settings(**back["settings"]))["divergence"] == record["divergence"]
    for name in range(len(teach.SLIDES)):
        assert teach.slide_html(back, name) == teach.slide_html(record, name)
    assert teach.marked_html(back, 2) == teach.marked_html(record, 2)
    assert teach.divergence_figure(back) == teach.divergence_figure(record)


def test_a_file_that_is_not_an_export_is_refused_with_a_reason(record, tmp_path):
    for text, reason in (("not json", "not valid JSON"), ('{"format": "other"}', "its format is not"),
                         (json.dumps({**record, "skipdecode": {}}), "skipdecode.text is missing")):
        path = tmp_path / "bad.json"
        path.write_text(text)
        with pytest.raises(ValueError, match=reason):
            replay.read(path)


def test_a_schedule_round_trips_through_the_record(record):
    assert Schedule(**record["schedule"]).to_dict() == record["schedule"]


def test_the_lessons_figures_are_those_of_its_shipped_replay_file():
    """docs/teaching.md quotes the comparison the page replays (assets/lesson): the same answers, agreement,
    first parting, probabilities, layers and verdict, so the lesson and the screen cannot drift apart."""
    from app import timing, views

    lesson = replay.read(replay.LESSON_FILE)  # through the schema, as the page reads it
    text = " ".join((replay.ROOT / "docs" / "teaching.md").read_text().split())
    found, skip = lesson["divergence"], lesson["skipdecode"]
    n, agree = len(found["tokens"]), sum(t["token"] == t["full_token"] for t in found["tokens"])
    first = found["tokens"][found["first"]]
    word = lambda token: lesson["texts"][str(token)].strip()  # noqa: E731
    assert (f"Here full depth would choose {agree} of SkipDecode's {n} tokens; they part at token {found['first'] + 1}, "
            f"where full depth gives \"{word(first['full_token'])}\" {first['full_prob']:.2f} and SkipDecode's "
            f"\"{word(first['token'])}\" {first['skip_prob']:.2f}") in text
    assert f"near tie ({first['full_prob']:.2f} against {first['skip_prob']:.2f})" in text
    layers = lesson["lens"]["skipdecode"][found["first"]]["layers"]
    warmup, top = [l for l in layers if l < lesson["schedule"]["warmup"]], [l for l in layers if l >= 2]
    assert f"SkipDecode runs {len(layers)} of {lesson['num_layers']} layers per token here" in text
    assert f"the warm-up layers 0-{len(warmup) - 1}, then the top {len(top)}, {top[0]}-{top[-1]}" in text
    depths = {lesson["lens"][side][found["first"]]["depth"] for side in ("skipdecode", "full")}
    assert depths == {lesson["num_layers"] - 1} and f"reach it at layer {lesson['num_layers'] - 1}" in text
    first_layer = [lesson["texts"][str(t)] for t, _ in lesson["lens"]["skipdecode"][found["first"]]["top"][0]]
    assert "(" + ", ".join(f'"{w}"' for w in first_layer) + " after layer 0)" in text
    t = timing.of(replay.comparison(lesson))
    assert f'"{t.words()}"' in text and f"{t.decode:.2f}× per decoded token" in text
    assert f"({t.low:.2f}–{t.high:.2f}×)" in text
    assert f"\"The answers part at token {found['first'] + 1}\"" in text  # people count from 1
    assert views.same_answer(replay.comparison(lesson)).startswith(f"The answers part at token {found['first'] + 1}")
    assert lesson["settings"]["max_new_tokens"] == 24 and lesson["schedule"]["num_layers"] == 30
    assert skip["text"].count("children friendly") == 1 and "child friendly" in lesson["full"]["text"]
    assert '"It is children friendly" against "It is child friendly"' in text


def stopped(timer) -> bool:
    """Whether a handler's timer output stops the player (gr.skip(): leaves it as it is)."""
    return isinstance(timer, gr.Timer) and timer.active is False


def test_the_player_climbs_one_layer_a_tick_and_stops_at_the_top(record):
    """The layer view's Play (app/lesson.py): from the bottom layer, one layer a tick, the timer stopped when the
    top layer is shown; Play again starts from the bottom. The browser test sees it start, climb and pause."""
    from app.lesson import PAUSE, PLAY, Lesson

    lesson, position, top = Lesson(studio=None), teach.default_position(record) + 1, record["num_layers"]  # 1-based
    *_, shown, timer, button = lesson.play(record, position, None, PLAY)
    assert shown == 1 and timer.active is True and button.value == PAUSE
    seen = [shown]
    while not stopped(timer) and len(seen) <= top:
        *_, shown, timer, button = lesson.tick(record, position, shown)
        seen.append(shown)
        assert stopped(timer) or timer == gr.skip()  # a tick never starts the player again
    assert seen == list(range(1, top + 1)) and stopped(timer)  # every layer once, in order, then stopped
    assert button.value == PLAY
    assert lesson.play(record, position, top, PLAY)[2] == 1
    html_view, _, shown, timer, button = lesson.show_all(record, position)
    assert shown is None and stopped(timer) and button.value == PLAY and "sd-hidden" not in html_view
    for late in (None, top):  # a tick already on its way after "All layers" or the top: the player stays stopped
        view, figure, kept, timer, button = lesson.tick(record, position, late)
        assert kept == late and stopped(timer) and button.value == PLAY and view == gr.skip()


def test_pause_and_a_step_by_hand_stop_the_player_where_it_stands(record):
    from app.lesson import PAUSE, PLAY, Lesson

    lesson, position = Lesson(studio=None), teach.default_position(record) + 1  # the slider's token, from 1
    view, figure, kept, timer, button = lesson.play(record, position, 4, PAUSE)  # the button reads Pause: pause
    assert kept == 4 and stopped(timer) and button.value == PLAY and view == gr.skip()
    *_, shown, timer, button = lesson.tick(record, position, 4)  # a tick on its way: one layer, still stopped
    assert shown == 5 and timer == gr.skip() and button == gr.skip()
    *_, shown, timer, button = lesson.play(record, position, 4, PLAY)  # Play again: on from where it stood
    assert shown == 4 and timer.active is True and button.value == PAUSE
    for step, want in ((lesson.next_layer, 5), (lesson.previous_layer, 3)):
        *_, shown, timer, button = step(record, position, 4)
        assert shown == want and stopped(timer) and button.value == PLAY


def test_every_slide_has_content_straight_after_a_run(record, comparison):
    """Present opened before any pick: the lens slide computes the layer view of the comparison that ran here (its
    record then keeps it), and the first slide carries the verdict."""
    from types import SimpleNamespace

    from app.lesson import Lesson

    studio = SimpleNamespace(lenses=lambda ran: ran.lenses,
                             engine=lambda label: SimpleNamespace(tokenizer=IdTokenizer()))
    fresh = {key: value for key, value in copy.deepcopy(record).items() if key != "lens"}
    lesson, names = Lesson(studio), teach.slides(fresh)
    html_view, figure, _ = lesson.slide(fresh, names.index("lens"), 0, comparison)
    assert fresh.get("lens") and figure.visible and "Pick a token" not in str(figure.value)
    first, _, _ = lesson.slide(fresh, 0, 0, comparison)
    assert 'class="sd-verdict"' in first and "SkipDecode: the tiny adapter" in first
