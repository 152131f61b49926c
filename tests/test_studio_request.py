"""One request, one path: a comparison (or a batch) checks, routes and encodes its prompt once, and both
sides decode those ids on the models that one route picked. On a tiny random Llama with two tiny adapters
made for it, so that "auto" really picks."""

from types import SimpleNamespace

import pytest

import app.studio as studio_module
import skipdecode.engine as engine_module
import skipdecode.adapters.router as router_module
from app.choices import AUTO, configured_models
from app.settings import Settings
from app.studio import Studio
from conftest import tiny_adapter, tiny_checkpoint
from skipdecode.batcher import Batcher
from skipdecode.prompts import encode_prompt
from skipdecode.adapters.router import INSTRUCTION

MR_PROMPT = INSTRUCTION + "name[The Eagle], eatType[coffee shop], food[French], area[riverside]"


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("request")
    base = tiny_checkpoint(folder / "tiny", layers=6)
    for name, speedups in (("tiny-1x", (1.0,)), ("tiny-2x", (2.0,))):
        tiny_adapter(folder / "adapters" / name, base, speedups)
    return base, folder / "adapters"


@pytest.fixture
def studio(tiny_set, monkeypatch):
    base, adapters = tiny_set
    monkeypatch.setenv("SKIPDECODE_ADAPTERS", str(adapters))
    s = Studio(configured_models(str(base)), batcher=Batcher(window_s=0.0))
    yield s
    s.batcher.close()


@pytest.fixture
def counted(monkeypatch):
    """Every text the tokenizer encodes (ids given as ids cost nothing) and every prompt the router reads."""
    seen = SimpleNamespace(texts=[], routes=[])
    real_encode, real_route = engine_module.encode_prompt, router_module.route

    def encode(tokenizer, prompt, chat=None):
        if isinstance(prompt, str):
            seen.texts.append(prompt)
        return real_encode(tokenizer, prompt, chat)

    def route(prompt):
        seen.routes.append(prompt)
        return real_route(prompt)

    monkeypatch.setattr(engine_module, "encode_prompt", encode)
    monkeypatch.setattr(router_module, "route", route)  # what pick_adapter asks
    monkeypatch.setattr(studio_module, "route", route)  # what the studio asks
    return seen


def test_a_comparison_encodes_its_prompt_once_and_routes_it_once(studio, counted):
    final = list(studio.compare(MR_PROMPT, Settings(speedup=2.0, max_new_tokens=4), AUTO))[-1]
    assert counted.texts == [MR_PROMPT] and counted.routes == [MR_PROMPT]
    assert final.done and final.quality is not None
    assert final.model.startswith("tiny-2x ") and final.full_model.startswith("tiny-1x ")
    assert final.why == ("tiny-2x: an E2E meaning representation at 2x",
                         "tiny-1x: an E2E meaning representation at 1x")
    ids = encode_prompt(studio.engine(final.model).tokenizer, MR_PROMPT)
    assert final.skip.prompt_ids == final.full.prompt_ids == ids


def test_a_batch_encodes_each_prompt_once_and_routes_by_the_first_once(studio, counted):
    prompts = [MR_PROMPT, "Describe a cafe."]
    run = list(studio.batch(prompts, Settings(speedup=2.0, max_new_tokens=3), AUTO))[-1]
    assert counted.texts == prompts and counted.routes == [MR_PROMPT]
    assert run.done and run.prompts == prompts
    assert run.models[0].startswith("tiny-2x ") and run.models[1].startswith("tiny-1x ")
    tokenizer = studio.engine(run.models[0]).tokenizer
    assert [u.prompt_ids for u in run.skip] == [u.prompt_ids for u in run.full] == \
        [encode_prompt(tokenizer, p) for p in prompts]


def test_the_record_of_a_run_holds_the_settings_it_ran_not_the_widgets_later(studio):
    """An export (and a link) is written from the comparison itself: the settings that ran travel with it, so
    sliders moved during the run cannot leak into the record (Lesson.after_compare reads no widget)."""
    from app.lesson import Lesson

    asked = Settings(speedup=2.0, max_new_tokens=3, seed=11)
    *_, comparison = studio.compare(MR_PROMPT, asked, AUTO)
    assert comparison.settings == asked
    record = Lesson(studio).after_compare(comparison)[0]
    assert record["settings"]["speedup"] == 2.0 and record["settings"]["max_new_tokens"] == 3 and record["seed"] == 11


def test_a_comparisons_scoring_rides_its_decode_and_scores_what_a_pass_after_scores(served_engine, monkeypatch):
    """Both sides in one continuous batch (the default model on its native 4-bit path): the full side keeps its
    own states and a row of the full model follows SkipDecode's answer as it comes (Studio.jobs), so no scoring
    pass runs after the answers, and the scores and divergence are those of passes after them, to the bit."""
    from app.choices import ModelChoice
    from app.studio import weights_per_token
    from skipdecode.models import DEFAULT_MODEL

    studio = Studio([ModelChoice(f"{DEFAULT_MODEL} (base)", DEFAULT_MODEL)], batcher=Batcher(window_s=0.0))
    label = studio.base.label  # the session's engine, instead of loading the same model again
    studio._engines[label], studio._costs[label] = served_engine, weights_per_token(served_engine)
    passes = []
    after = studio.batcher.states
    monkeypatch.setattr(studio.batcher, "states", lambda *args: passes.append(args) or after(*args))
    try:
        final = list(studio.compare("Describe a cafe by the river.", Settings(speedup=3.0, max_new_tokens=8), label))[-1]
        assert studio.batcher.follows_as_rows(served_engine, served_engine) and final.skip.token_ids
        assert passes == [] and final.full.states is None  # no pass after; the comparison keeps no states
        states = studio.answer_states(served_engine, final)
        assert len(passes) == 2
        assert studio.score(served_engine, final, states) == final.quality
        assert studio.divergence(served_engine, final, states).to_dict() == final.divergence.to_dict()
    finally:
        studio.batcher.close()


def test_stop_ends_both_sides_early_and_scores_what_they_wrote(studio):
    """Stop (asked after every position) ends the comparison where it stands: marked stopped, done, shorter than
    asked, and scored on the partial answers, so that it opens like a finished one."""
    asked = []
    stream = studio.compare(MR_PROMPT, Settings(speedup=2.0, max_new_tokens=40), AUTO, stop=lambda: len(asked) > 3)
    for comparison in stream:
        asked.append(comparison)
    final = asked[-1]
    assert final.stopped and final.done and final.quality is not None and final.divergence is not None
    assert 0 < len(final.skip.token_ids) < 40 and 0 < len(final.full.token_ids) < 40
    assert len(final.divergence.tokens) == len(final.skip.token_ids)


def test_the_page_draws_a_stopped_run_as_stopped_with_run_ready_and_present_open(studio):
    """Run's stream with Stop pressed after its first drawing: the last update says Stopped over both partial
    answers, Run reads Run again, and the stopped comparison opens (its record: Present, the marks)."""
    from app.callbacks import RUN, STREAMED, Callbacks
    from app.lesson import OPENED, Lesson

    callbacks, stopper = Callbacks(studio), {}
    inputs = [MR_PROMPT, AUTO, 2.0, 40, "greedy", 0.7, 0.9, 0, 0, False, 20, 6, 2, 0, "linear", "skip", 4, None]
    labels = []
    for update in callbacks.stream_compare(*inputs, stopper=stopper):
        run = update[len(update) - len(STREAMED) + STREAMED.index("run")]
        labels.append(run.value)
        if run.value.startswith("Running…"):
            stopper["stop"] = True  # Stop, as its button does (callbacks.stop_run)
    assert labels[0] == "Starting…" and labels[-1] == RUN and any(" of 40 tokens" in label for label in labels)
    fresh = update[len(update) - len(STREAMED) + STREAMED.index("fresh")]
    assert fresh.stopped and "Stopped" in update[1] and "of 40" in update[1]
    opened = Lesson(studio).after_compare(fresh)
    record = opened[OPENED.index("record")]
    assert record["skipdecode"]["token_ids"] == fresh.skip.token_ids
    assert opened[OPENED.index("present")].interactive is True


def test_the_page_says_how_many_other_visitors_rows_shared_a_comparisons_steps():
    """A continuous batch's steps carry its tick: the details and the headline say how many rows beyond the
    comparison's own (both sides, and the row scoring SkipDecode's answer as it comes) shared them; batches of one position keep saying how they were batched."""
    from app import views
    from app.comparison import Comparison
    from skipdecode.batcher import BatchInfo, Update
    from skipdecode.schedule import Schedule
    from skipdecode.trace import StepRecord, Trace

    def side(rows, tick=0):
        trace = Trace(4, 1, 3, {}, steps=[StepRecord(0, 4, (0, 1, 2, 3), (), 1.0, n, tick) for n in rows])
        return Update(0, BatchInfo(7, max(rows), {}, 0.0), [1, 2, 3], [5] * len(rows), "x", True, True, trace)

    comparison = Comparison("p", "m", "m", 4, Schedule.full(4), 3, side([3, 6, 4]), side([3, 3, 3]))
    assert "up to 3 other rows (other visitors' answers)" in views.sharing(comparison)
    assert views.sharing(comparison) in views.status_markdown(comparison, running=False)
    alone = Comparison("p", "m", "m", 4, Schedule.full(4), 3, side([3, 3]), side([3]))
    assert views.sharing(alone).startswith("No other visitor's answer")
    beams = Comparison("p", "m", "m", 4, Schedule.full(4), 3, side([2, 5]), side([2]), decoding="beam search, 2 beams")
    assert "up to 3 other rows" in views.sharing(beams)  # no scoring row rides a beam search
    in_step = Comparison("p", "m", "m", 4, Schedule.full(4), 3, side([2], None), side([2], None))
    assert views.sharing(in_step) is None and "requests batched together" in views.status_markdown(in_step, False)
