"""A link that opens a comparison (app/link.py), as plain functions: the settings that ran come back from their
query string, and a stranger's query string sets only values the page's widgets could hold, never an error."""

import gradio as gr
import pytest

from app import link
from app.choices import AUTO, ModelChoice
from app.settings import Settings
from app.verified import FAMILIES, FASTER, VERIFIED
from test_teach import comparison, record  # noqa: F401 (fixtures)

MODELS = [ModelChoice(AUTO), ModelChoice("tiny (base)", "tiny"), ModelChoice("e2e-3x (fine-tuned for 3x)", "tiny", "e2e-3x")]
MAX_CHARS = 200


@pytest.fixture(scope="module")
def fields():
    """The fields of a page with the app's widgets, ranges and steps (app/layout.py), on a 6-layer model."""
    widgets = {"speedup": gr.Slider(1, 4, value=3, step=0.25), "max_new_tokens": gr.Slider(1, 512, step=1),
               "decoding": gr.Radio(["greedy", "sampling", "beam search"]),
               "temperature": gr.Slider(0.05, 2.0, step=0.05), "top_p": gr.Slider(0.05, 1.0, step=0.05),
               "top_k": gr.Slider(0, 200, step=1), "seed": gr.Number(0, precision=0), "beams": gr.Slider(2, 8, step=1),
               "max_budget": gr.Slider(1, 6, step=1), "min_budget": gr.Slider(1, 6, step=1),
               "warmup": gr.Slider(0, 5, step=1), "horizon": gr.Slider(0, 512, step=1),
               "decay": gr.Dropdown(["linear", "power"]), "mode": gr.Radio(["skip", "early_exit"]),
               "family": gr.Radio(list(FAMILIES))}
    return link.fields(widgets, MODELS, MAX_CHARS)


def test_every_setting_comes_back_from_its_link(fields):
    values = {"prompt": "Write a haiku about autumn rain.\nTwo lines & <more>", "model": MODELS[2].label,
              "max_new_tokens": 96, "decoding": "sampling", "temperature": 0.35, "top_p": 0.8, "top_k": 40,
              "seed": -12345, "beams": 6, "manual": True, "max_budget": 6, "min_budget": 2, "warmup": 1,
              "horizon": 24, "decay": "power", "mode": "early_exit", "family": VERIFIED}
    query = link.encode(values, fields)
    assert query.startswith("?prompt=Write+a+haiku") and "&model=e2e-3x&" in query and "&verify=1" in query
    assert link.decode(query, fields) == values
    assert link.decode(link.encode({"speedup": 2.75, "model": AUTO}, fields), fields) == {"speedup": 2.75,
                                                                                           "model": AUTO}


def test_the_link_of_a_run_holds_what_ran_not_what_the_widgets_hold_now(record, fields):  # noqa: F811
    ran = link.ran(record)  # the tiny model's run: 3x, greedy, 16 new tokens, seed 7 (unused by greedy)
    assert ran == {"prompt": "a prompt", "model": "tiny", "max_new_tokens": 16, "speedup": 3.0}
    sampled = {**record, "why": {"skipdecode": "e2e-3x: ...", "full": "e2e-1x: ..."}, "verified": True,
               "settings": {**record["settings"], "sampling": True, "temperature": 0.5, "warmup": 1}}
    assert link.ran(sampled) == {"prompt": "a prompt", "model": AUTO, "max_new_tokens": 16, "speedup": 3.0,
                                 "decoding": "sampling", "temperature": 0.5, "top_p": 0.9, "top_k": 0, "seed": 7,
                                 "warmup": 1, "family": VERIFIED}
    # "tiny" is not one of this page's models: the link leaves the model out, and the page keeps its default
    assert link.encode(ran, fields) == "?prompt=a+prompt&speedup=3&max_new_tokens=16"
    roomy = {**fields, "prompt": link.Prompt(4 * link.MAX_QUERY)}
    assert link.encode(link.ran({**record, "prompt": "word " * 1000}), roomy).startswith("?prompt=word+word")
    long = {**record, "prompt": "word " * (link.MAX_QUERY // 5)}  # fine for the studio, too long for an address
    assert link.encode(link.ran(long), roomy) == "?speedup=3&max_new_tokens=16"
    by_hand = {**record, "settings": {**record["settings"], "manual_budgets": True, "max_budget": 5, "min_budget": 2}}
    assert link.decode(link.encode(link.ran(by_hand), fields), fields) == {
        "prompt": "a prompt", "max_new_tokens": 16, "manual": True, "max_budget": 5, "min_budget": 2}


@pytest.mark.parametrize("query", [
    "", "?", "&&&", "?unknown=1&__proto__=x&constructor=y", "?speedup=&max_new_tokens=",
    "?speedup=nan&temperature=inf&top_p=-inf&max_new_tokens=1e309&seed=9007199254740993",
    "?speedup=0.5&speedup=3&max_new_tokens=513&beams=1&warmup=-1&top_k=201&temperature=0",  # out of range
    "?speedup=2.1&temperature=0.33&max_new_tokens=4.5&seed=1.5",  # between a widget's steps
    "?speedup=0x10&max_new_tokens=%ff&decoding=GREEDY&decoding=beam&mode=skip%00&decay=__init__",
    "?model=../../etc/passwd&model=auto&verify=yes&family=" + VERIFIED,  # the first model counts; verify is 0 or 1
    "?max_budget=2&min_budget=5", "?max_budget=5",  # budgets count only as a pair whose min is at most its max
    "?prompt=%00%01hi", "?prompt=" + "a" * (MAX_CHARS + 1), "?prompt=%20%20%0A", "?prompt=%ED%A0%80x",
    "?" + "&".join(f"k{i}=1" for i in range(link.MAX_FIELDS)) + "&prompt=hi",  # more fields than any link of ours
])
def test_a_strangers_query_string_sets_nothing_the_widgets_could_not_hold(query, fields):
    assert link.decode(query, fields) == {}


def test_good_values_beside_bad_ones_still_count_and_markup_is_only_text(fields):
    evil = '<img src=x onerror="window.pwned=1">'
    query = link.encode({"prompt": evil}, fields) + "&speedup=banana&max_new_tokens=32&top_k=1e3&model=base&verify=0"
    assert link.decode(query, fields) == {"prompt": evil, "max_new_tokens": 32, "model": MODELS[1].label,
                                          "family": FASTER}
    # parsed by the server already: values that are not text are ignored, and only the first 64 fields are read
    assert link.decode({"prompt": ["a", "b"], "speedup": 3, "seed": "7"}, fields) == {"seed": 7}
    assert link.decode({"prompt": " keep it ", "max_new_tokens": "48.0"}, fields) == {"prompt": "keep it",
                                                                                      "max_new_tokens": 48}


def test_every_default_setting_is_a_value_its_link_field_holds(fields):
    """Settings' defaults are the widgets' own defaults: a link written from them leaves nothing out."""
    default = Settings()
    for name in ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "warmup", "horizon", "decay", "mode"):
        assert fields[name].write(getattr(default, name)) is not None, name
