"""Bad input, misuse and many users at once: every bad request gets a clear message, nothing internal
leaks, and the server keeps answering.

Each bad input is tried at three levels: the library (a ValueError), the page's own callback (a gr.Error,
what the browser shows) and the public API of a served app (`gradio_client` raises with the message).
The served app here is a second `python app.py`, "guarded": a queue of 1, one request at a time, a time
limit of a few seconds, and an adapters folder holding an adapter made for another model and two broken
adapters for ours, so that the busy message, the time limit and internal errors can be provoked."""

from __future__ import annotations

import atexit
import functools
import json
import re
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import gradio as gr
import httpx
import pytest
from gradio_client import Client
from gradio_client.utils import Status

from app import verified
from appserver import DEFAULT, ROOT, app_url
from skipdecode.batcher import Batcher, follow
from skipdecode.sampling import Sampling
from skipdecode.schedule import Schedule, for_speedup

BASE = "SmolLM2-135M-Instruct"
TIME_LIMIT_S = 3
MR = "name[Strada], eatType[pub], area[city centre]"
LONG = "Write a long story about a lighthouse keeper and the storm of the century, with many details."

# (what is wrong, the request's arguments by name, what the message must say)
BAD_INPUTS = [
    ("empty prompt", dict(prompt=""), "enter a prompt first"),
    ("whitespace prompt", dict(prompt=" \n\t "), "enter a prompt first"),
    ("prompt over the token limit", dict(prompt="word " * 1500), "at most 1,024 prompt tokens"),
    ("prompt over the character limit", dict(prompt="a " * 10_000), "at most 16,384"),
    ("one very long token-free word", dict(prompt="x" * 9_000), "at most 1,024 prompt tokens"),
    ("prompt not text", dict(prompt=12345), "the prompt must be text"),
    ("control character (bell)", dict(prompt="ring the bell \x07 now"), "control characters (U+0007)"),
    ("terminal escape sequence", dict(prompt="\x1b[31mred\x1b[0m"), "control characters (U+001B)"),
    ("NUL byte", dict(prompt="a\x00b"), "control characters (U+0000)"),
    ("max new tokens 0", dict(max_new_tokens=0), "max new tokens must be between 1 and 512"),
    ("max new tokens 513", dict(max_new_tokens=513), "max new tokens must be between 1 and 512"),
    ("max new tokens 2.5", dict(max_new_tokens=2.5), "max new tokens must be a whole number"),
    ("max new tokens not a number", dict(max_new_tokens="many"), "max new tokens must be a number"),
    ("speedup above the schedule's limit", dict(speedup=50), "speedup must be a number in [1, 10]"),
    ("speedup below 1", dict(speedup=0.5), "speedup must be a number in [1, 10]"),
    ("speedup not a number", dict(speedup="fast"), "speedup must be a number"),
    ("max budget above the layers", dict(max_budget=99, min_budget=6), "max_budget must be an integer in [3, 30]"),
    ("min budget above max budget", dict(max_budget=10, min_budget=20), "min_budget must be an integer in [3, 10]"),
    ("min budget within warm-up", dict(max_budget=20, min_budget=2), "min_budget must be an integer in [3, 20]"),
    ("warm-up of every layer", dict(warmup=30), "warmup must be an integer in [0, 29]"),
    ("negative warm-up", dict(warmup=-1), "warmup must be an integer in [0, 29]"),
    ("negative horizon", dict(horizon=-3), "horizon must be an integer >= 1"),
    ("horizon beyond the token limit", dict(horizon=10**6), "horizon must be between 0 (= max new tokens) and 512"),
    ("unknown decay", dict(decay="zigzag"), "decay must be one of linear, power, exponential, cosine, step"),
    ("unknown mode", dict(mode="sideways"), "mode must be one of skip, early_exit"),
    ("unknown decoding", dict(decoding="beam"), "decoding must be one of greedy, sampling"),
    ("temperature 0 for sampling", dict(decoding="sampling", temperature=0), "temperature must be in (0, 2]"),
    ("temperature 5", dict(decoding="sampling", temperature=5), "temperature must be in (0, 2]"),
    ("top-p 0", dict(decoding="sampling", top_p=0), "top-p must be in (0, 1]"),
    ("top-p 1.5", dict(decoding="sampling", top_p=1.5), "top-p must be in (0, 1]"),
    ("negative top-k", dict(decoding="sampling", top_k=-1), "top_k must be an integer >= 0"),
    ("fractional seed", dict(decoding="sampling", seed=1.5), "seed must be a whole number"),
    ("one beam for beam search", dict(decoding="beam search", beams=1), "beams must be between 2 and 8"),
    ("too many beams", dict(decoding="beam search", beams=100), "beams must be between 2 and 8"),
    ("fractional beams", dict(decoding="beam search", beams=2.5), "beams must be a whole number"),
    ("a local path as model", dict(model="/etc/passwd"), "unknown model"),
    ("a hub repository as model", dict(model="HuggingFaceTB/SmolLM2-360M-Instruct"), "unknown model"),
    ("an adapter made for another model", dict(model="elsewhere"), "unknown model"),
    ("that adapter's label", dict(model="elsewhere (fine-tuned for 3x)"), "unknown model"),
]
DEFAULTS = dict(prompt="Hi", speedup=3.0, max_new_tokens=4, model=f"{BASE} (base)", decoding="greedy", temperature=0.7, top_p=0.9,
                top_k=0, seed=0, max_budget=0, min_budget=0, warmup=2, horizon=0, decay="linear", mode="skip",
                beams=4, verify=False)
CASES = [pytest.param(kwargs, message, id=name) for name, kwargs, message in BAD_INPUTS]


def nothing_internal(text: str) -> None:
    """What a client sees holds no stack trace and no local path."""
    for leak in ("Traceback", 'File "', str(ROOT), "/tmp/", "/root", "site-packages", ".py\""):
        assert leak not in text, f"{leak!r} reached the client: {text}"


# ---- the library: ValueError ---------------------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: Schedule(30, 99, 6), "max_budget must be an integer in [3, 30]"),
    (lambda: Schedule(30, 10, 20), "min_budget must be an integer in [3, 10]"),
    (lambda: Schedule(30, 20, 2), "min_budget must be an integer in [3, 20]"),
    (lambda: Schedule(30, 20, 6, warmup=30), "warmup must be an integer in [0, 29]"),
    (lambda: Schedule(30, 20, 6, horizon=0), "horizon must be an integer >= 1"),
    (lambda: Schedule(30, 20, 6, horizon=2.5), "horizon must be an integer >= 1"),
    (lambda: Schedule(30, 20, 6, decay="zigzag"), "decay must be one of"),
    (lambda: Schedule(30, 20, 6, mode="sideways"), "mode must be one of"),
    (lambda: for_speedup(50, 30), "speedup must be a number in [1, 10]"),
    (lambda: for_speedup(float("nan"), 30), "speedup must be a number in [1, 10]"),
    (lambda: Sampling(temperature=-1), "temperature must be a number in [0, 100]"),
    (lambda: Sampling(temperature=0.7, top_p=0), "top_p must be a number in (0, 1]"),
    (lambda: Sampling(temperature=0.7, top_p=1.5), "top_p must be a number in (0, 1]"),
    (lambda: Sampling(temperature=0.7, top_k=-1), "top_k must be an integer >= 0"),
    (lambda: Sampling(temperature=0.7, seed=2**64), "seed must be an integer in [-2**63, 2**64)"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_the_library_refuses_bad_settings_with_a_value_error(make, message):
    with pytest.raises(ValueError) as error:
        make()
    assert message in str(error.value)


def test_the_library_refuses_bad_prompts_with_a_value_error(engine):
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.encode("  \n ")
    context = engine.decoder.max_positions
    with pytest.raises(ValueError, match=f"exceeds the model's context of {context} tokens"):
        engine.generate([list(range(100, 100 + context))], None, max_new_tokens=1)
    batcher = Batcher(window_s=0.0)
    try:
        with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
            batcher.submit(engine, "Hi", max_new_tokens=0)
        with pytest.raises(ValueError, match="context"):
            batcher.submit(engine, "word " * (context - 10), max_new_tokens=64)
        assert batcher.submit(engine, "Hi", max_new_tokens=1).result().done  # nothing else was harmed
    finally:
        batcher.close()


def test_the_app_refuses_a_schedule_too_long_to_tabulate_before_building_it(monkeypatch):
    from app.settings import Settings
    from skipdecode.schedule import Schedule

    def built(*args, **kwargs):
        raise AssertionError("a Schedule was built")  # it would tabulate 10**12 budgets

    monkeypatch.setattr(Schedule, "__init__", built)
    with pytest.raises(ValueError, match="horizon must be between 0"):
        Settings(horizon=10**12).schedule(30)


# ---- the page's callbacks: gr.Error ----------------------------------------------------------------
@pytest.fixture(scope="module")
def callbacks(engine):
    from app.callbacks import Callbacks
    from app.choices import ModelChoice
    from app.studio import Studio, weights_per_token

    studio = Studio([ModelChoice(f"{BASE} (base)", BASE)], batcher=Batcher(window_s=0.0))
    label = studio.base.label  # the session's engine, instead of loading the same model again
    studio._engines[label], studio._costs[label] = engine, weights_per_token(engine)
    yield Callbacks(studio)
    studio.batcher.close()


def ui_args(kwargs: dict) -> list:
    """The Run button's inputs, top to bottom, for a request given by the API's argument names."""
    a = {**DEFAULTS, **kwargs}
    manual = bool(a["max_budget"] or a["min_budget"])
    budgets = (a["max_budget"], a["min_budget"]) if manual else (20, 6)  # the sliders' own values when unused
    return [a["prompt"], a["model"], a["speedup"], a["max_new_tokens"], a["decoding"], a["temperature"], a["top_p"],
            a["top_k"], a["seed"], manual, *budgets, a["warmup"], a["horizon"], a["decay"], a["mode"], a["beams"],
            verified.VERIFIED if a["verify"] else verified.FASTER]


def refusal(callbacks, kwargs: dict) -> str:
    """What the page says to a bad request: Run's stream ends with one message beside the prompt, raising nothing
    (an error there would put Gradio's error badges on the results), and Run ready again."""
    from app.callbacks import RUN, STREAMED

    *_, last = callbacks.stream_compare(*ui_args(kwargs))
    start = len(last) - len(STREAMED)
    note, run, fresh = (last[start + STREAMED.index(name)] for name in ("prompt_note", "run", "fresh"))
    assert note["visible"] is True and run.value == RUN and run.interactive and fresh is None
    assert all(update == gr.skip() for update in last[:len(last) - len(STREAMED)])  # the results left as they were
    return note["value"]


@pytest.mark.slow
@pytest.mark.parametrize("kwargs, message", CASES)
def test_the_page_shows_each_bad_input_as_a_message(callbacks, kwargs, message):
    shown = refusal(callbacks, kwargs)
    assert message in shown and 'class="sd-refused"' in shown
    nothing_internal(shown)


@pytest.mark.slow
def test_internal_errors_are_logged_and_the_page_gets_an_apology(callbacks, caplog, monkeypatch):
    from app.callbacks import INTERNAL_ERROR

    def broken(*args, **kwargs):
        raise RuntimeError(f"CUDA error at {ROOT}/skipdecode/engine.py:123")

    monkeypatch.setattr(callbacks.studio, "compare", broken)
    assert INTERNAL_ERROR in refusal(callbacks, {})
    assert "CUDA error" in caplog.text and "Traceback" in caplog.text  # the host sees everything


@pytest.mark.slow
def test_error_messages_are_cut_escaped_and_free_of_paths(callbacks):
    message = refusal(callbacks, dict(model="<img src=x onerror=alert(1)>" + "m" * 5000))
    assert "&lt;img" in message and "<img" not in message and len(message) < 600
    from app.callbacks import for_the_user

    leaked = ValueError(f"cannot read {ROOT}/assets/adapters/x/adapter_config.json or C:\\Users\\me\\a.json")
    assert for_the_user(leaked) == "cannot read [path] or [path]"


def test_an_unreadable_adapter_folder_is_left_out_and_never_breaks_auto(tmp_path, monkeypatch, caplog):
    from app.choices import AUTO, configured_models
    from app.studio import Studio

    for name, meta in (("good", {"base_model": BASE, "speedups": [3]}), ("half-written", '{"base_model": "Smo'),
                       ("no-speedups", {"base_model": BASE})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
        (tmp_path / name / "skipdecode.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    monkeypatch.setenv("SKIPDECODE_ADAPTERS", str(tmp_path))
    models = configured_models(BASE)
    assert [m.adapter for m in models] == [None, None, "good"]
    assert "half-written left out" in caplog.text and "no-speedups left out" in caplog.text
    # "auto" asks skipdecode.adapters.lora, which reads the whole folder at each request: while a folder in it
    # cannot be read, auto decodes with the base model (and says so in the log) instead of failing.
    studio = Studio(models, batcher=Batcher(window_s=0.0))
    try:
        assert studio.choice(AUTO, 3.0) == studio.base and "using the base model" in caplog.text
        assert studio.choice(models[2].label).adapter == "good"  # the adapter itself is still served
    finally:
        studio.batcher.close()


# ---- streaming text: long outputs and characters split over tokens ---------------------------------
def test_token_text_keeps_multibyte_characters_whole_and_matches_the_decoded_output(engine):
    from app.views import TokenText, token_pieces

    ids = engine.tokenizer("héllo 😀 wörld 🎉🎉 日本語, and more", add_special_tokens=False)["input_ids"]
    pieces = token_pieces(engine.tokenizer, ids)
    assert len(pieces) == len(ids) and "".join(pieces) == engine.tokenizer.decode(ids)
    # Each character sits whole on the token that completes it; the tokens holding its first bytes add "".
    assert {" 😀", " 🎉", "🎉", " 日", "語"} <= set(pieces) and "\ufffd" not in "".join(pieces)
    streamed = TokenText(engine.tokenizer)  # one token at a time, as the page receives them
    for n in range(1, len(ids) + 1):
        shown = streamed.pieces(ids[:n])
        assert len(shown) == n and "".join(shown) == engine.tokenizer.decode(ids[:n])
    assert shown == pieces


# ---- the served app: the public API of the guarded server -------------------------------------------
@functools.cache
def broken_adapters() -> Path:
    """An adapter made for another model, one whose loading fails with a message holding its local
    path (no weights), and one whose weights are garbage (an internal error). One temporary folder for
    the session (the guarded server may be launched before any fixture runs), removed at its end."""
    folder = Path(tempfile.mkdtemp(prefix="broken-adapters-"))
    atexit.register(shutil.rmtree, folder, True)
    lora = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "task_type": "CAUSAL_LM"}
    for name, base, weights in (("elsewhere", "AnotherModel-7B", None), ("noweights", BASE, None),
                                ("garbage", BASE, b"\x00\x01 not safetensors")):
        (folder / name).mkdir()
        (folder / name / "adapter_config.json").write_text(json.dumps(lora))
        (folder / name / "skipdecode.json").write_text(json.dumps({"base_model": base, "speedups": [3]}))
        if weights:
            (folder / name / "adapter_model.safetensors").write_bytes(weights)
    return folder


def guarded_server() -> dict:
    return dict(name="app-server-guarded",
                args=["--queue-size", "1", "--concurrency", "1", "--time-limit", str(TIME_LIMIT_S)],
                env={"SKIPDECODE_ADAPTERS": str(broken_adapters()), "SKIPDECODE_BATCH_WINDOW_S": "0.05"})


def servers(fixtures):
    """For conftest.py: the guarded server for the tests that use it, the default one for the many users."""
    found = [guarded_server()] if "guarded" in fixtures else []
    return found + [DEFAULT] if "url" in fixtures else found


@pytest.fixture(scope="module")
def adapters():
    return broken_adapters()


@pytest.fixture(scope="module")
def guarded():
    return app_url(**guarded_server())


@pytest.fixture(scope="module")
def client(guarded):
    return Client(guarded, verbose=False)


def answers(client) -> None:
    """The server still decodes: a one-token comparison comes back complete. (The base model by name:
    here "auto", the default, would pick one of the broken adapters.)"""
    result = client.predict("Hi", 2.0, 1, model=f"{BASE} (base)", api_name="/compare")
    assert len(result["full"]["token_ids"]) == 1 and result["quality"] is not None


@pytest.mark.slow
def test_the_api_takes_the_pages_settings_as_optional_parameters(client):
    params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/compare"]["parameters"]
    names = [p["parameter_name"] for p in params]
    assert names[:3] == ["prompt", "speedup", "max_new_tokens"] and not params[0]["parameter_has_default"]
    assert set(DEFAULTS) == set(names) and all(p["parameter_has_default"] for p in params[1:])
    result = client.predict("Hi", max_new_tokens=3, model=DEFAULTS["model"], max_budget=12, min_budget=4, warmup=1, decay="cosine",
                            api_name="/compare")
    assert result["schedule"] == {"num_layers": 30, "max_budget": 12, "min_budget": 4, "warmup": 1, "horizon": 3,
                                  "decay": "cosine", "mode": "skip"}


@pytest.mark.slow
@pytest.mark.parametrize("kwargs, message", CASES)
def test_each_bad_input_is_a_clear_api_error(client, kwargs, message):
    with pytest.raises(Exception) as error:
        client.predict(**{**DEFAULTS, **kwargs}, api_name="/compare")
    assert message in str(error.value)
    nothing_internal(str(error.value))


@pytest.mark.slow
def test_after_every_bad_input_the_server_still_answers(client):
    answers(client)


def queue_join(url: str, body: bytes) -> httpx.Response:
    return httpx.post(url + "gradio_api/queue/join", content=body, headers={"content-type": "application/json"})


def event(url: str, fn_index: int, data: list, timeout_s: float = 60.0) -> dict:
    """Run one of the page's own (private) events the way the browser does: join the queue, then read
    the server-sent events until the result. Returns the final message."""
    session = uuid.uuid4().hex
    joined = queue_join(url, json.dumps({"data": data, "fn_index": fn_index, "session_hash": session,
                                         "event_data": None, "trigger_id": None}).encode())
    joined.raise_for_status()
    with httpx.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session},
                      timeout=timeout_s) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    return message
    raise AssertionError("the event stream ended without a result")


def run_button_event(url: str) -> int:
    config = httpx.get(url + "config").json()
    run = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "sd-run")
    return next(d["id"] for d in config["dependencies"] if [run, "click"] in d["targets"])


@pytest.mark.slow
@pytest.mark.parametrize("kwargs, message, by", [
    (dict(model="/etc/passwd"), "not in the list of choices", "gradio"),  # Gradio's own check of the dropdown
    (dict(max_new_tokens=100_000), "is greater than maximum value 512", "gradio"),  # and of the slider's range
    (dict(max_budget=10, min_budget=20), "min_budget must be an integer in [3, 10]", "page"),  # ours
    (dict(prompt="tab\tok but bell \x07 not"), "control characters (U+0007)", "page"),
])
def test_the_pages_own_event_refuses_crafted_values(guarded, client, kwargs, message, by):
    """Crafted values sent to the Run button's own event (the stopper state as a browser sends it, null):
    Gradio refuses what its widgets cannot hold; our checks answer with the message beside the prompt."""
    from app.callbacks import STREAMED

    result = event(guarded, run_button_event(guarded), ui_args(kwargs) + [None])
    if by == "gradio":
        assert result["success"] is False and message in result["output"]["error"]
    else:
        data = result["output"]["data"]
        note = data[len(data) - len(STREAMED) + STREAMED.index("prompt_note")]
        assert result["success"] is True and message in note["value"]
    nothing_internal(json.dumps(result))
    answers(client)


@pytest.mark.slow
def test_bodies_that_are_not_text_or_not_json_are_refused(guarded, client):
    from app.callbacks import STREAMED

    for body in (b'{"data": ["\xff\xfe not utf-8"], "fn_index": 0, "session_hash": "x"}', b"{not json",
                 b'{"data": "' + b"A" * 2_000_000 + b'"}'):
        response = queue_join(guarded, body)
        assert 400 <= response.status_code < 500, response.status_code
        nothing_internal(response.text)
    # A lone surrogate is what invalid UTF-8 becomes once decoded with escapes; JSON can carry it.
    api = run_button_event(guarded)
    result = event(guarded, api, ui_args(dict(prompt="bad \ud800 half of a pair")) + [None])
    data = result["output"]["data"]  # the page's answer: a message beside the prompt
    assert "not valid UTF-8" in data[len(data) - len(STREAMED) + STREAMED.index("prompt_note")]["value"]
    answers(client)


@pytest.mark.slow
def test_an_integer_beyond_64_bits_does_not_take_the_server_down(client):
    job = client.submit(**{**DEFAULTS, "decoding": "sampling", "seed": 2**70}, api_name="/compare")
    with pytest.raises(Exception):  # Gradio's JSON layer drops it; the client hears of it at once
        job.result(timeout=60)
    answers(client)


@pytest.mark.slow
def test_a_broken_adapter_gives_a_message_without_its_path(client):
    with pytest.raises(Exception) as error:
        client.predict("Hi", 3.0, 2, model="noweights (fine-tuned for 3x)", api_name="/compare")
    assert "adapter 'noweights' does not fit" in str(error.value) and "[path]" in str(error.value)
    nothing_internal(str(error.value))
    answers(client)


@pytest.mark.slow
def test_an_internal_error_reaches_the_client_as_an_apology_and_the_host_as_a_traceback(client, guarded):
    from app.callbacks import INTERNAL_ERROR

    for attempt in range(2):  # the second time, the model is not reloaded: the same answer
        with pytest.raises(Exception) as error:
            client.predict("Hi", 3.0, 2, model="garbage (fine-tuned for 3x)", api_name="/compare")
        assert INTERNAL_ERROR in str(error.value)
        nothing_internal(str(error.value))
    log = (ROOT / "test-artifacts" / "app-server-guarded.log").read_text()
    assert "internal error while serving a request" in log and "SafetensorError" in log and "Traceback" in log
    assert "failed to load earlier" in log  # the second answer came from the remembered failure, not a reload
    answers(client)


@pytest.mark.slow
def test_no_local_path_is_served_or_shown(guarded, adapters):
    for path in ("/etc/passwd", str(ROOT / "app.py"), "app.py", str(adapters / "elsewhere" / "skipdecode.json"),
                 "../../../../etc/passwd"):
        response = httpx.get(guarded + "gradio_api/file=" + path)
        assert response.status_code in (403, 404), (path, response.status_code)
    for page in ("", "config", "gradio_api/info"):
        text = httpx.get(guarded + page).text
        assert str(ROOT) not in text and str(adapters) not in text and "site-packages" not in text, page


def test_remote_code_is_never_trusted():
    """No model loading in the library or the app turns trust_remote_code on."""
    sources = [*(ROOT / "skipdecode").glob("*.py"), *(ROOT / "app").glob("*.py"), ROOT / "app.py"]
    calls = [m for f in sources for m in re.finditer(r"trust_remote_code\s*=\s*(\w+)", f.read_text())]
    assert calls and all(m.group(1) == "False" for m in calls)


@pytest.mark.slow
def test_past_the_queue_users_are_told_busy_try_again_and_requests_stop_at_the_time_limit(guarded, client, browser):
    """Over the API and in Debian's headless chromium (what a visitor sees): with one request running and
    one waiting, the next is turned away at once with the busy message. The page also shows the message
    of a bad input. Then both requests stop at the time limit."""
    long = dict(max_new_tokens=512, model=DEFAULTS["model"], api_name="/compare")  # far beyond the limit here
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        page.goto(guarded)
        page.wait_for_selector("#sd-prompt textarea", timeout=60_000)
        page.fill("#sd-prompt textarea", "a " * 10_000)
        page.click("#sd-run")
        page.get_by_text("this app takes at most 16,384").first.wait_for(timeout=30_000)
        running = client.submit(LONG, 3.0, **long)  # one request at a time: this one runs...
        wait_for(lambda: running.status().code == Status.PROCESSING)
        waiting = Client(guarded, verbose=False).submit(LONG, 3.0, **long)  # ...this one waits in the queue
        wait_for(lambda: waiting.status().code == Status.IN_QUEUE)
        with pytest.raises(Exception) as error:  # ...and the next is turned away at once
            Client(guarded, verbose=False).predict("Hi", 3.0, 2, model=DEFAULTS["model"], api_name="/compare")
        assert "try again" in str(error.value).lower()
        # at once: while the first request still runs, not after the time limit ended it and freed the queue
        assert running.status().code == Status.PROCESSING, "turned away only once the running request ended"
        page.fill("#sd-prompt textarea", "Hi")
        page.click("#sd-run")
        page.get_by_text("currently busy. Please try again").first.wait_for(timeout=30_000)
        assert waiting.status().code == Status.IN_QUEUE, "the busy answers came while the queue was full"
        page.screenshot(path=str(ROOT / "test-artifacts" / "busy.png"))
    finally:
        page.close()
    for job in (running, waiting):
        with pytest.raises(Exception) as error:
            job.result(timeout=60)
        assert f"time limit ({TIME_LIMIT_S:g} s)" in str(error.value)
    answers(client)


def wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


# ---- many users at once (the default server; the load test script does 32 x 3) ---------------------
@pytest.mark.slow
def test_eight_users_at_once_all_get_their_own_correct_answer_in_shared_batches(url, served_engine):
    prompts = [f"Write one sentence describing this restaurant, using every fact: name[{name}], eatType[pub]"
               for name in ("Strada", "The Eagle", "Zizzi", "Aromi", "Cotto", "Giraffe", "Loch Fyne", "Wildwood")]
    clients = [Client(url, verbose=False) for _ in prompts]
    start, results = threading.Barrier(len(prompts)), [None] * len(prompts)

    def user(i):
        start.wait()
        results[i] = clients[i].predict(prompts[i], 3.0, 4, api_name="/compare")

    threads = [threading.Thread(target=user, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert all(r is not None for r in results), "a request was lost"
    for prompt, result in zip(prompts, results):
        assert result["prompt"] == prompt
        assert result["full"]["token_ids"] == served_engine.generate([prompt], None, 4).token_ids[0]
    # rows join the running continuous batch (skipdecode/slots.py): users share batches, and steps are shared
    # beyond one user's own two rows (a batch that empties before the last user arrives ends; the next starts)
    batches = {r[side]["batch"]["number"] for r in results for side in ("skipdecode", "full")}
    assert len(batches) < len(prompts) and max(r["skipdecode"]["batch"]["size"] for r in results) > 2, results


# ---- the batcher: cancelled rows, stuck workers, broken engines -------------------------------------
def test_a_cancelled_row_stops_growing_while_the_rest_of_its_batch_goes_on(engine):
    batcher = Batcher(window_s=0.1)
    try:
        keep, drop = batcher.submit_together([batcher_job(engine, "Describe a cafe."),
                                              batcher_job(engine, "Name a colour.")])
        updates = iter(follow([keep, drop]))
        next(updates)
        drop.cancel()
        final = keep.result()
        assert len(final.token_ids) == 24 and final.trace.steps[0].rows == 2
        assert final.trace.steps[-1].rows == 1  # the cancelled row was compacted away
    finally:
        batcher.close()


def batcher_job(engine, prompt):
    from skipdecode.batcher import Job

    return Job.of(engine, prompt, None, 24, stop_at_eos=False)


def test_a_reader_gives_up_at_its_deadline_even_if_the_worker_is_stuck(engine, monkeypatch):
    import skipdecode.batcher as batcher_module

    monkeypatch.setattr(batcher_module, "STALL_GRACE_S", 0.2)
    batcher = Batcher(window_s=0.0, time_limit_s=0.3)
    try:
        with batcher.exclusive():  # the worker cannot run a single position
            started = time.monotonic()
            ticket = batcher.submit(engine, "Hi", max_new_tokens=4)
            with pytest.raises(TimeoutError, match=r"time limit \(0.3 s\)"):
                ticket.result()
            # the reader's own rule (deadline + grace), not the worker's, which is held: it never answered
            assert time.monotonic() - started >= 0.3 + 0.2
        batcher.time_limit_s = 60  # the worker still serves the next request (0.3 s is too tight on a busy machine)
        assert batcher.submit(engine, "Hi", max_new_tokens=1).result().done
    finally:
        batcher.close()


class FailingAtOnce:
    """An engine whose run() fails when called, before any generator exists."""

    def __init__(self, engine):
        self.num_layers, self.decoder, self.encode = engine.num_layers, engine.decoder, engine.encode

    def run(self, *args, **kwargs):
        raise RuntimeError("cannot allocate the cache")


def test_an_engine_failing_before_its_first_position_fails_only_its_requests(engine):
    batcher = Batcher(window_s=0.0)
    try:
        with pytest.raises(RuntimeError, match="cannot allocate"):
            batcher.submit(FailingAtOnce(engine), "Hi", max_new_tokens=2).result()
        assert batcher.submit(engine, "Hi", max_new_tokens=1).result().done
    finally:
        batcher.close()
