"""The app served for real (`python app.py` on a free loopback port), driven over HTTP by gradio_client."""

import json
import threading

import pytest
from gradio_client import Client

from appserver import DEFAULT
from skipdecode.beam import Beam
from skipdecode.schedule import for_speedup

pytestmark = pytest.mark.slow
MR = "name[Strada], eatType[pub], area[city centre]"
PROMPT = "Write one sentence describing this restaurant, using every fact: " + MR
TOKENS = 6


def servers(fixtures):
    """For conftest.py: the default server, for the tests that use `url`."""
    return [DEFAULT] if "url" in fixtures else []


@pytest.fixture(scope="module")
def client(url):
    return Client(url, verbose=False)


def test_api_lists_the_compare_endpoint_with_its_three_parameters(client):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert list(endpoints) == ["/compare"]  # the UI's own events stay private
    params = endpoints["/compare"]["parameters"]
    assert [p["parameter_name"] for p in params[:3]] == ["prompt", "speedup", "max_new_tokens"]
    assert all(p["parameter_has_default"] for p in params[3:])  # the page's other settings are optional
    assert client.config["run_history"] is False  # nothing kept in a shared PC's browser (docs/hosting.md)


def test_compare_returns_both_outputs_traces_and_quality(client, served_engine):
    from app.record import Record

    result = client.predict(PROMPT, 3.0, TOKENS, api_name="/compare")
    Record.model_validate_json(json.dumps(result))  # the API's answer is the run's record: Export's, Replay's
    L = served_engine.num_layers
    skip, full = result["skipdecode"], result["full"]
    # Full decoding over HTTP is exactly the engine's own full decoding of the same prompt.
    assert full["token_ids"] == served_engine.generate([PROMPT], None, TOKENS).token_ids[0]
    assert full["text"] == served_engine.tokenizer.decode(full["token_ids"], skip_special_tokens=True)
    # The SkipDecode run followed the schedule for 3x over the requested horizon, position by position.
    schedule = for_speedup(3.0, L, horizon=TOKENS)
    assert result["schedule"] == schedule.to_dict()
    steps = skip["trace"]["steps"]
    assert len(steps) == len(skip["token_ids"]) - 1  # the prefill chose the first token
    for step in steps:
        assert step["budget"] == schedule.budget(step["step"]) == len(step["layers"])
        assert step["layers"] == list(schedule.layers(step["step"])) and step["ms"] > 0
    assert all(step["budget"] == L for step in full["trace"]["steps"])
    speed = result["speedup"]
    assert speed["layers"] == pytest.approx(L / (sum(s["budget"] for s in steps) / len(steps)), rel=1e-3)
    assert speed["measured"] > 0
    q = result["quality"]
    assert set(q["skipdecode_vs_full"]) == {"bleu", "rouge_l", "chrf"}
    assert q["perplexity"]["full"] > 0 and q["perplexity"]["skipdecode"] > 0
    assert 0 <= q["token_agreement"]["agreement"] <= 1
    # An E2E test MR is also scored against its human references.
    assert len(result["references"]) == 4 and set(q["references"]) == {"skipdecode", "full"}


def test_divergence_is_full_depths_choice_from_the_same_prefix_at_every_skipdecode_token(client):
    """`divergence`: one entry per SkipDecode token; agreement and first follow from the entries; where the
    two outputs still share their prefix, full depth's choice is full decoding's own next token."""
    result = client.predict(PROMPT, 3.0, 12, api_name="/compare")
    found, skip, full = result["divergence"], result["skipdecode"]["token_ids"], result["full"]["token_ids"]
    assert set(found) == {"agreement", "first", "tokens", "top"}
    assert [t["position"] for t in found["tokens"]] == list(range(len(skip)))
    assert [t["token"] for t in found["tokens"]] == skip
    assert all(set(t) == {"position", "token", "full_token", "full_prob", "skip_prob"} for t in found["tokens"])
    same = [t["token"] == t["full_token"] for t in found["tokens"]]
    assert found["agreement"] == round(sum(same) / len(same), 4)
    assert found["first"] == (same.index(False) if False in same else None)
    for t, agrees in zip(found["tokens"], same):
        assert 0 <= t["skip_prob"] <= t["full_prob"] <= 1 and (t["skip_prob"] == t["full_prob"]) == agrees
    shared = result["quality"]["token_agreement"]["prefix"]  # the outputs are equal up to here
    assert [t["full_token"] for t in found["tokens"][: shared + 1]] == full[: shared + 1]


def test_at_speedup_1_full_depth_agrees_everywhere_but_near_ties(client):
    """SkipDecode at 1x runs every layer: full depth's teacher-forced choice differs only where float
    rounding (one column at a time against all at once) flips two near-equal candidates."""
    for prompt in (PROMPT, "Explain in one paragraph why the sky is blue."):
        found = client.predict(prompt, 1.0, 32, api_name="/compare")["divergence"]
        assert len(found["tokens"]) > 10
        for t in found["tokens"]:
            if t["token"] != t["full_token"]:
                assert t["full_prob"] - t["skip_prob"] < 1e-3, t
        assert found["agreement"] >= 0.95


def test_beam_search_over_http_is_the_engines_search_on_both_sides(client, served_engine):
    result = client.predict(PROMPT, 3.0, TOKENS, decoding="beam search", beams=3, api_name="/compare")
    schedule, beam = for_speedup(3.0, served_engine.num_layers, horizon=TOKENS), Beam(3)
    assert result["full"]["token_ids"] == served_engine.generate([PROMPT], None, TOKENS, beam=beam).token_ids[0]
    assert result["skipdecode"]["token_ids"] == served_engine.generate([PROMPT], schedule, TOKENS, beam=beam).token_ids[0]
    assert result["decoding"].startswith("beam search, 3 beams")
    # one row per beam, joining the continuous batch together: every step holds the three beams at least
    assert min(s["rows"] for s in result["skipdecode"]["trace"]["steps"]) >= 3


def test_requests_arriving_together_from_different_clients_share_one_batch(url):
    """On the CPU default every row of one model joins its continuous batch (skipdecode/slots.py): both
    visitors' SkipDecode and full-decoding rows (one model here) share steps, each row at its own position."""
    results, start = [None, None], threading.Barrier(2)

    def user(i):
        client = Client(url, verbose=False)
        start.wait()
        results[i] = client.predict(["Describe a cafe.", "Name a colour."][i], 2.0, 16, api_name="/compare")

    threads = [threading.Thread(target=user, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    batches = {r[side]["batch"]["number"] for r in results for side in ("skipdecode", "full")}
    assert len(batches) == 1  # one model on both sides: one continuous batch
    shared = [max(s["rows"] for s in r[side]["trace"]["steps"]) for r in results for side in ("skipdecode", "full")]
    assert min(shared) >= 2 and max(shared) > 2  # each visitor's two rows shared steps, and with the other's
    assert [r[side]["batch"]["size"] for r in results for side in ("skipdecode", "full")] == shared
    assert results[0]["skipdecode"]["text"] != results[1]["skipdecode"]["text"]


@pytest.mark.parametrize("args, message", [
    (("   ", 3.0, 4), "enter a prompt"),
    ((PROMPT, 3.0, 0), "max new tokens must be between 1 and 512"),
    ((PROMPT, 3.0, 5000), "max new tokens must be between 1 and 512"),
    ((PROMPT, 50.0, 4), "speedup must be a number in"),
    (("bell \x07 here", 3.0, 4), "control characters"),
])
def test_bad_input_gets_a_clear_message_and_the_server_stays_up(client, args, message):
    with pytest.raises(Exception) as error:
        client.predict(*args, api_name="/compare")
    assert message in str(error.value)
    assert client.predict("Hi", 2.0, 1, api_name="/compare")["full"]["token_ids"]


def test_listens_on_all_interfaces_only_on_spaces_or_when_told(monkeypatch):
    import importlib.util

    from appserver import ROOT

    spec = importlib.util.spec_from_file_location("app_entry", ROOT / "app.py")  # `app` is the package
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    assert entry.server_name() == "127.0.0.1"
    monkeypatch.setenv("SPACE_ID", "user/skipdecode-studio")
    assert entry.server_name() == "0.0.0.0"
    monkeypatch.setenv("GRADIO_SERVER_NAME", "10.0.0.5")
    assert entry.server_name() == "10.0.0.5"


def test_the_model_list_is_fixed_at_start_and_auto_picks_the_adapter_for_the_speedup(tmp_path, monkeypatch):
    import json

    from app.choices import AUTO, configured_models
    from app.settings import Settings
    from app.studio import Studio
    from skipdecode.batcher import Batcher

    ours = "SmolLM2-135M-Instruct"
    for name, speedups, base in (("all", [1, 2, 3, 4, 5], ours), ("skip3x", [3], ours), ("other", [3], "another")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text("{}")
        config = {"horizon": 32, **({"spread": 1.0} if name == "skip3x" else {})}
        (folder / "skipdecode.json").write_text(json.dumps({"base_model": base, "speedups": speedups,
                                                            "config": config}))
    monkeypatch.setenv("SKIPDECODE_ADAPTERS", str(tmp_path))
    models = configured_models(ours)
    assert [m.label for m in models][:2] == [AUTO, "SmolLM2-135M-Instruct (base)"]
    assert {m.adapter for m in models} == {None, "all", "skip3x"}  # not the adapter made for another model
    studio = Studio(models, batcher=Batcher())
    assert studio.choice(AUTO, 3.0).adapter == "skip3x" and studio.choice(AUTO, 2.0).adapter == "all"
    assert studio.choice(AUTO, 3.0).horizon == 32 and studio.choice(AUTO, 1.0).adapter == "all"
    # each adapter decodes on the schedule shape it learned: skip3x a constant budget, "all" the default
    three, two = (studio.choice(AUTO, s) for s in (3.0, 2.0))
    assert Settings(speedup=3.0).schedule(30, three.horizon, spread=three.spread).min_budget == 10
    assert Settings(speedup=3.0).schedule(30, two.horizon, spread=two.spread).min_budget == 5
    # Between the speedups it was trained for, "auto" runs an adapter at the nearest one (its reason says so);
    # a model chosen by name, or budgets set by hand, run what was asked.
    asked = Settings(speedup=3.25)
    assert studio.run_settings(asked, AUTO, studio.choice(AUTO, 3.25)).speedup == 3.0
    assert "3.25x asked" in studio.pick(AUTO, 3.25)[1]
    assert studio.run_settings(asked, three.label, three).speedup == 3.25
    assert studio.run_settings(Settings(speedup=3.25, manual_budgets=True), AUTO, three).speedup == 3.25
    with pytest.raises(ValueError, match="unknown model"):
        studio.choice("/etc/passwd")


@pytest.mark.slow
def test_auto_compares_the_speedups_adapter_with_the_fine_tuned_full_depth_baseline(served_engine, monkeypatch):
    """With the shipped adapters, "auto" runs SkipDecode with the adapter made for its speedup and full
    decoding with the one made for 1x, as the paper compares; the full side is that adapter's own decoding.
    On the precision a visitor's CPU gets ("auto": the 4-bit default, where an adapter is a few MB beside the
    shared base), not the tests' float32 (tests/conftest.py): the studio loads six models here."""
    from app import views
    from app.callbacks import Callbacks
    from app.choices import AUTO, configured_models
    from app.settings import Settings
    from app.studio import Studio
    from skipdecode.adapters.lora import adapter_for, run_speedup
    from skipdecode.batcher import Batcher
    from skipdecode.engine import Engine

    skip_adapter, full_adapter = adapter_for(3.0), adapter_for(1.0)
    if skip_adapter is None or full_adapter is None or skip_adapter == full_adapter:
        pytest.skip("needs adapters for 3x and for 1x in assets/adapters")
    monkeypatch.setenv("SKIPDECODE_DTYPE", "auto")
    studio = Studio(configured_models(), batcher=Batcher())
    prompt = "Write one sentence describing this restaurant, using every fact: name[Strada], eatType[pub]"
    *_, done = studio.compare(prompt, Settings(speedup=3.0, max_new_tokens=6), AUTO)
    assert done.model.startswith(skip_adapter.name) and done.full_model.startswith(full_adapter.name)
    baseline = Engine.load(None, adapter=full_adapter)
    assert done.full.token_ids == baseline.generate([prompt], None, 6).token_ids[0]
    assert done.quality["perplexity"]["full"] > 0
    assert done.why == (f"{skip_adapter.name}: an E2E meaning representation at 3x",
                        f"{full_adapter.name}: an E2E meaning representation at 1x")
    # At a speedup no adapter was trained for, the nearest one it was (4x: 5x or 3x), the run and the page agree.
    *_, done = studio.compare(prompt, Settings(speedup=4.0, max_new_tokens=6), AUTO)
    ran = run_speedup(adapter_for(4.0, prompt=prompt), 4.0)
    assert ran in (3, 5) and f"at {ran:g}x, the nearest speedup" in done.why[0] and "(4x asked" in done.why[0]
    assert done.schedule.average_budget() == pytest.approx(30 / ran, rel=0.05)
    note = Callbacks(studio).preview(AUTO, 4.0, 6, False, 20, 6, 2, 0, "linear", "skip", prompt)[1]
    assert f"runs {done.model.split()[0]} at {ran:g}×" in note

    # Any other prompt: never an E2E adapter; full decoding is the base model itself, and the page says why.
    general = "Explain in one paragraph why the sky is blue."
    *_, done = studio.compare(general, Settings(speedup=3.0, max_new_tokens=4), AUTO)
    assert done.full_model == studio.base.label and done.why[1] == "base model: a general prompt at 1x (the full-depth reference)"
    if done.model == studio.base.label:  # no general adapter served for 3x
        assert done.why[0] == "base model: no general adapter for 3x yet"
    else:
        assert "a general prompt at 3x" in done.why[0]
    assert done.full.token_ids == served_engine.generate([general], None, 4).token_ids[0]  # the base model, loaded apart
    # Before anything runs, the schedule preview warns when "auto" has only the untrained base model to skip with.
    note = Callbacks(studio).preview(AUTO, 3.0, 6, False, 20, 6, 2, 0, "linear", "skip", general)[1]
    assert ("to word salad" in note) == (done.model == studio.base.label), note
    note = Callbacks(studio).preview(AUTO, 3.0, 6, False, 20, 6, 2, 0, "linear", "skip", prompt)[1]
    assert "word salad" not in note  # an MR: e2e-all is trained for 3x

    # The Batch tab compares the same way: questions against the base model, MRs against the 1x adapter.
    questions = [general, "Give three names for a friendly robot."]
    *_, run = studio.batch(questions, Settings(speedup=2.0, max_new_tokens=4), AUTO)
    assert run.models[1] == studio.base.label and run.why[1] == done.why[1]
    assert [u.token_ids for u in run.full] == served_engine.generate(questions, None, 4).token_ids
    assert f"full decoding: **{views.safe('the base model')}**" in views.batch_status(run)  # as text in Markdown
    *_, run = studio.batch([prompt], Settings(speedup=3.0, max_new_tokens=6), AUTO)
    assert run.models[0].startswith(skip_adapter.name) and run.models[1].startswith(full_adapter.name)
    assert run.full[0].token_ids == baseline.generate([prompt], None, 6).token_ids[0]
    studio.batcher.close()
