"""The prompt router, the adapter each prompt gets (and why), and the CLI's default for a general prompt."""

import json
from pathlib import Path

import pytest
import torch

from skipdecode.adapters import lora as adapters
from skipdecode.cli import build_parser, default_adapter
from skipdecode.adapters.router import E2E, GENERAL, INSTRUCTION, route
from test_evaluate import fake_adapter

ROOT = Path(__file__).resolve().parent.parent
MR = "name[The Eagle], eatType[coffee shop], food[French], area[riverside], familyFriendly[yes], near[Burger King]"
QUESTION = "Explain in one paragraph why the sky is blue."


@pytest.mark.parametrize("prompt, kind, reason", [
    (INSTRUCTION + MR, E2E, "the E2E instruction"),
    (INSTRUCTION.lower() + "name[Strada]", E2E, "the E2E instruction"),  # the instruction alone decides
    (MR, E2E, "slot[value] pairs (name, eatType, food, area, familyFriendly, near)"),
    ("name[Strada],eatType[pub]", E2E, "slot[value] pairs (name, eatType)"),
    ("Describe this place: " + MR + ". One sentence, please.", E2E, "slot[value] pairs"),
    ("customer rating[5 out of 5], priceRange[£20-25]", E2E, "slot[value] pairs (customer rating, priceRange)"),
    # unusual slots: one E2E slot among others, or three made-up slots that are most of the prompt
    ("name[Zorba], cuisine[Greek], parking[yes], music[live]", E2E, "slot[value] pairs (name, cuisine"),
    ("venue[Blue Note], genre[jazz], price[£15]", E2E, "unusual slots (venue, genre, price)"),
    ("Write a sentence about it: venue[Blue Note], genre[jazz], price[£15]", E2E, "unusual slots"),
    # ordinary prompts, and text that merely holds brackets
    (QUESTION, GENERAL, "no slot[value] pairs"),
    ("Write a short, friendly email inviting a colleague to lunch on Friday.", GENERAL, "no slot[value] pairs"),
    ("What is the capital of France?", GENERAL, "no slot[value] pairs"),
    ("Describe a cozy cafe in two sentences.", GENERAL, "no slot[value] pairs"),
    ("what is a[i] in C?", GENERAL, "brackets, but not a meaning representation"),
    ("What do a[i], b[j], c[k] mean in C?", GENERAL, "not a meaning representation"),  # one-letter names
    ("print(arr[0], arr[1])", GENERAL, "not a meaning representation"),  # the same name twice
    ("name[The Eagle]", GENERAL, "not a meaning representation"),  # one slot is no MR
    ("Prove that a continuous f on [a,b] attains its maximum.", GENERAL, "not a meaning representation"),
    ("Tell me about [Verse 1] and [Chorus] of this song, then rewrite it as a poem about the sea, keeping the "
     "rhyme scheme of verse[one], chorus[two] and bridge[three] intact for the whole thing", GENERAL,
     "not a meaning representation"),  # three pairs, but inside a long request
    ("", GENERAL, "no slot[value] pairs"),
])
def test_router_on_hand_made_prompts(prompt, kind, reason):
    found = route(prompt)
    assert found.kind == kind and reason in found.reason, found


def test_router_sends_the_apps_examples_where_they_belong():
    examples = json.loads((ROOT / "assets" / "examples" / "examples.json").read_text())
    assert all(route(INSTRUCTION + item["mr"]).kind == E2E and route(item["mr"]).kind == E2E
               for item in examples["e2e"])
    assert all(route(prompt).kind == GENERAL for prompt in examples["prompts"])


def fake(folder, name, speedups, task=None, base="SmolLM2-135M-Instruct"):
    """A fake adapter folder; `task` recorded as train records it (in its config too)."""
    return fake_adapter(folder, name, speedups, base, config={"task": task} if task else None)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """An adapters folder with four single-speedup E2E adapters, as shipped before the one-for-all (no task
    recorded: E2E)."""
    monkeypatch.setenv(adapters.ADAPTERS_ENV, str(tmp_path))
    for s in (1, 2, 3, 5):
        fake(tmp_path, f"e2e-{s}x", [s])
    return tmp_path


def test_an_mr_gets_the_e2e_adapters_as_before(folder):
    assert adapters.pick_adapter(3, prompt=MR) == (adapters.find_adapter("e2e-3x"),
                                                   "e2e-3x: an E2E meaning representation at 3x")
    assert adapters.adapter_for(1, prompt=INSTRUCTION + MR).name == "e2e-1x"
    assert adapters.adapter_for(4, prompt=MR).name in ("e2e-3x", "e2e-5x")  # nearest, as before
    assert adapters.pick_adapter(4.5, prompt=MR) == (adapters.find_adapter("e2e-5x"), "e2e-5x: an E2E meaning "
                                                     "representation at 5x, the nearest speedup an adapter was "
                                                     "trained for (4.5x asked: an adapter holds up only at the "
                                                     "speedups it was trained for)")
    assert adapters.adapter_for(3).name == "e2e-3x"  # no prompt: the E2E task (the E2E evaluation)
    assert adapters.pick_adapter(3)[1] == "e2e-3x: the E2E task at 3x"
    fake(folder, "general-3x", [3], task="general")
    assert adapters.adapter_for(3, prompt=MR).name == "e2e-3x"  # never a general adapter for an MR
    assert adapters.adapter_for(3).name == "e2e-3x"


def test_an_adapter_runs_at_the_nearest_speedup_it_was_trained_for(folder):
    one_for_all = fake(folder, "e2e-all", [2, 3, 5])
    run = adapters.run_speedup
    assert [run(one_for_all, s) for s in (2, 2.25, 2.5, 2.75, 4, 4.25, 6)] == [2, 2, 2, 3, 3, 5, 5]  # ties: lower
    assert run(None, 4) == 4 and run(one_for_all, None) is None  # the base model; hand-set budgets
    assert run(adapters.find_adapter("e2e-1x"), 1.5) == 1
    # The pick and its reason agree: the served set of today (1x, one-for-all 2-3-5, single 5x).
    for s in (2, 3):
        (folder / f"e2e-{s}x" / "skipdecode.json").unlink()
    picked, why = adapters.pick_adapter(3.5, prompt=MR)
    assert picked.name == "e2e-all" and run(picked, 3.5) == 3 and " at 3x, the nearest speedup" in why
    picked, why = adapters.pick_adapter(4, prompt=MR)  # a tie at distance 1: e2e-5x by name, as before
    assert picked.name == "e2e-5x" and run(picked, 4) == 5 and "(4x asked" in why


def test_a_general_prompt_gets_the_base_model_at_1x_and_never_an_e2e_adapter(folder):
    assert adapters.pick_adapter(1, prompt=QUESTION) == (
        None, "base model: a general prompt at 1x (the full-depth reference)")
    assert adapters.pick_adapter(3, prompt=QUESTION) == (None, "base model: no general adapter for 3x yet")
    assert adapters.adapter_for(2, prompt="what is a[i] in C?") is None


def test_a_general_prompt_gets_a_general_adapter_for_its_speedup(folder):
    fake(folder, "general-3x", [3], task="general")
    fake(folder, "general-all", [2, 3, 4, 5], task="general")
    fake(folder, "general-6x", [6], task="general")
    fake(folder, "other-model-2x", [2], task="general", base="gpt2")
    assert adapters.pick_adapter(3, prompt=QUESTION) == (adapters.find_adapter("general-3x"),
                                                         "general-3x: a general prompt at 3x")
    assert adapters.adapter_for(2, prompt=QUESTION).name == "general-all"  # a one-for-all adapter covers 2x
    assert adapters.adapter_for(2.5, prompt=QUESTION).name == "general-all"  # inside its range
    assert adapters.adapter_for(1, prompt=QUESTION) is None  # 1x is the base model, whatever exists
    assert adapters.adapter_for(7, prompt=QUESTION) is None  # no nearest fallback for general prompts
    assert adapters.adapter_for(5.5, prompt=QUESTION) is None
    assert adapters.adapter_for(2, base_model="gpt2", prompt=QUESTION).name == "other-model-2x"
    assert adapters.find_adapter("general-3x").task == "general" and adapters.find_adapter("e2e-3x").task == "e2e"
    # hand-set budgets: a one-for-all adapter of the prompt's task, else the base model
    assert adapters.pick_adapter(None, prompt=QUESTION) == (adapters.find_adapter("general-all"),
                                                            "general-all: a general prompt at hand-set budgets")
    assert adapters.pick_adapter(None, prompt=MR) == (None, "base model: no E2E adapter for hand-set budgets yet")


def test_the_page_starts_at_the_highest_speedup_both_kinds_of_prompt_have_an_adapter_for(folder):
    """A visitor's first prompt, a question or a restaurant record, runs an adapter made for the speedup
    the page shows; with no speedup shared, the page starts at 3x."""
    from app.choices import configured_models
    from app.studio import Studio

    def start():
        return Studio(configured_models(), batcher=object()).default_speedup  # nothing decodes here

    assert start() == 3  # E2E adapters only: no question has one
    fake(folder, "general-2x", [2], task="general")
    assert start() == 2  # today's served set: a question has an adapter at 2x only
    fake(folder, "general-all", [2, 3, 5], task="general")
    assert start() == 5  # shared: 2x, 3x (e2e-2x, e2e-3x) and 5x (e2e-5x)
    assert adapters.shared_speedup([(E2E, (1.0,)), (GENERAL, (2.0,))]) == 3  # nothing shared above 1x
    assert adapters.shared_speedup([(E2E, (2.0, 3.0)), (GENERAL, (3.0,))], fallback=4) == 3


def generate_args(*argv):
    return build_parser().parse_args(["generate", *argv])


def test_the_cli_says_which_adapter_runs_and_why(folder):
    fake(folder, "general-3x", [3], task="general")
    assert default_adapter(generate_args("--prompt", MR, "--speedup", "3"))[1] == \
        "e2e-3x: an E2E meaning representation at 3x"
    assert default_adapter(generate_args("--prompt", QUESTION, "--speedup", "3"))[0].name == "general-3x"
    assert default_adapter(generate_args("--prompt", QUESTION, "--speedup", "2")) == \
        (None, "base model: no general adapter for 2x yet")
    assert default_adapter(generate_args("--prompt", QUESTION)) == \
        (None, "base model: a general prompt at 1x (the full-depth reference)")
    # an explicit --adapter still wins, "none" included; another model gets no adapter
    assert default_adapter(generate_args("--prompt", QUESTION, "--speedup", "3", "--adapter", "e2e-3x")) == \
        ("e2e-3x", "e2e-3x: asked for with --adapter")
    assert default_adapter(generate_args("--prompt", MR, "--adapter", "none")) == ("none", "base model: --adapter none")
    assert default_adapter(generate_args("--prompt", MR, "--model", "gpt2"))[0] is None
    # a batch that mixes the two kinds runs with the first prompt's pick, and says so
    adapter, why = default_adapter(generate_args("--prompt", MR, "--prompt", QUESTION, "--speedup", "3"))
    assert adapter.name == "e2e-3x" and "1 other prompt would get another" in why


@pytest.mark.slow
def test_the_default_for_a_general_prompt_at_1x_is_the_base_model_token_for_token(engine, cli, monkeypatch):
    """With the adapters as shipped (E2E only, e2e-1x among them), `generate` runs a general prompt at
    --speedup 1 on the base model at full depth: what transformers' greedy generate gives."""
    monkeypatch.delenv(adapters.ADAPTERS_ENV, raising=False)
    done = cli("generate", "--prompt", QUESTION, "--speedup", "1", "--max-new-tokens", "8", "--json")
    assert done.returncode == 0, done.stderr
    assert "[adapter] base model: a general prompt at 1x (the full-depth reference)" in done.stderr
    data = json.loads(done.stdout)
    assert "+" not in data["model"] and all(s["layers"] == list(range(30)) for s in data["steps"])
    prompt = engine.encode(QUESTION)
    with torch.no_grad():
        out = engine.model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                                    do_sample=False, max_new_tokens=8, pad_token_id=engine.pad_id,
                                    eos_token_id=engine.eos_ids)
    assert data["outputs"][0]["token_ids"] == out[0, len(prompt):].tolist()


@pytest.mark.slow
def test_generate_runs_the_picked_adapter_at_the_nearest_speedup_it_was_trained_for(cli, monkeypatch):
    """The shipped E2E adapters hold up only at their own speedups (docs/research/e2e-train-split.md, 4x): asked for
    4x, `generate` runs the picked one at its nearest trained speedup, says so, and its JSON shows that plan;
    an explicit --adapter runs the speedup asked."""
    monkeypatch.delenv(adapters.ADAPTERS_ENV, raising=False)
    picked = adapters.pick_adapter(4.0, prompt=MR)[0]
    if picked is None or 4.0 in picked.speedups:
        pytest.skip("needs shipped E2E adapters none of which is trained for 4x")
    ran = adapters.run_speedup(picked, 4.0)

    def generate(*extra):
        done = cli("generate", "--prompt", MR, "--speedup", "4", "--max-new-tokens", "2", "--json", *extra)
        assert done.returncode == 0, done.stderr
        return done.stderr, json.loads(done.stdout)["schedule"]

    stderr, schedule = generate()
    assert f"[adapter] {picked.name}: an E2E meaning representation at {ran:g}x" in stderr and "(4x asked" in stderr
    assert schedule["max_budget"] == schedule["min_budget"] == round(30 / ran)  # a constant budget
    stderr, schedule = generate("--adapter", picked.name)
    assert (schedule["max_budget"], schedule["min_budget"]) == (8, 7)  # 7.5 layers a token on average: 4x
