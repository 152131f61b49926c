"""Hosting: app/gpu.py (ZeroGPU's conventions, inert elsewhere), the browser set-up `make test` runs, and
no failed Hub lookups in the logs when the Hub cannot be reached.

The `spaces` package is not installed here: ZeroGPU is simulated by its environment variable and a fake
`spaces` module whose GPU decorator records what it was given.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
import warnings
from pathlib import Path

import pytest

from app import gpu

ROOT = Path(__file__).resolve().parent.parent
SETUP_BROWSER = ROOT / "scripts" / "setup_browser.sh"


@pytest.fixture
def fake_spaces(monkeypatch):
    """A `spaces` module whose GPU(duration=...) records the duration and marks the function it wraps."""
    module = types.ModuleType("spaces")
    module.__spec__ = importlib.machinery.ModuleSpec("spaces", None)
    module.calls = []

    def GPU(task=None, *, duration=None):
        def decorate(fn):
            module.calls.append((getattr(fn, "__name__", fn), duration))

            def wrapped(*args, **kwargs):
                return ("on the GPU", fn(*args, **kwargs))
            wrapped.zerogpu = True
            return wrapped
        return decorate(task) if callable(task) else decorate

    module.GPU = GPU
    monkeypatch.setitem(sys.modules, "spaces", module)
    monkeypatch.delenv(gpu.ZERO_GPU_ENV, raising=False)
    monkeypatch.delenv(gpu.DURATION_ENV, raising=False)
    return module


def on_zero_gpu(monkeypatch):
    monkeypatch.setenv(gpu.ZERO_GPU_ENV, "true")


def test_zero_gpu_needs_both_the_variable_and_the_package(fake_spaces, monkeypatch):
    assert not gpu.zero_gpu()  # the package alone: a CPU or dedicated-GPU Space also has `spaces`
    on_zero_gpu(monkeypatch)
    assert gpu.zero_gpu()
    monkeypatch.delitem(sys.modules, "spaces")
    assert not gpu.zero_gpu()  # the variable alone, `spaces` not installed (this machine)


def test_off_zero_gpu_everything_is_unchanged(fake_spaces):
    def decode(prompt):
        yield prompt

    assert gpu.gpu_task(decode) is decode and gpu.gpu_task(decode, duration=30) is decode
    callbacks = types.SimpleNamespace(**{name: decode for name in gpu.GPU_CALLBACKS})
    assert gpu.gpu_callbacks(callbacks) is callbacks and all(f is decode for f in vars(callbacks).values())
    assert gpu.time_limit(300.0) == 300.0
    assert fake_spaces.calls == []


def test_on_zero_gpu_the_task_is_decorated_with_its_duration(fake_spaces, monkeypatch):
    on_zero_gpu(monkeypatch)

    def decode(prompt):
        return prompt.upper()

    assert gpu.gpu_task(decode, duration=42)("hi") == ("on the GPU", "HI")
    gpu.gpu_task(decode)
    (_, fixed), (_, estimate) = fake_spaces.calls
    assert fixed == 42 and callable(estimate)  # by default each call's own duration (request_seconds)
    assert estimate("hi") == round(gpu.FIXED_S)  # a handler that decodes nothing: the fixed part
    monkeypatch.setenv(gpu.DURATION_ENV, "90")
    assert gpu.time_limit(300.0) == 90 - gpu.MARGIN_S and gpu.time_limit(20.0) == 20.0
    monkeypatch.setenv(gpu.DURATION_ENV, "0")
    with pytest.raises(ValueError, match=gpu.DURATION_ENV):
        estimate("hi")


def test_each_request_asks_for_the_seconds_its_tokens_beams_and_verification_need(fake_spaces, monkeypatch):
    """ZeroGPU's duration callable (request_seconds) gets a handler's own arguments, positional as Gradio
    passes them: more tokens, beams or verification ask for more, never over $SKIPDECODE_GPU_DURATION_S."""
    from app.callbacks import Callbacks
    from app.verified import VERIFIED

    handlers = Callbacks(studio=None)

    def compare(tokens, decoding="greedy", beams=4, family=None):  # the page's Run: stream_compare's 18 inputs
        return gpu.request_seconds(handlers.stream_compare, "name[The Eagle]", "auto", 3, tokens, decoding, 0.7,
                                   0.9, 0, 0, False, 0, 0, 2, 0, "linear", "skip", beams, family)

    greedy = compare(48)
    assert gpu.FIXED_S < greedy < compare(96) < gpu.DEFAULT_DURATION_S  # a short request queues sooner
    assert compare(48, family=VERIFIED) > greedy and compare(16, "beam search", 3) > compare(16)
    assert compare(16, "sampling", beams=8) == compare(16)  # beams count only for beam search
    api = gpu.request_seconds(handlers.compare_api, "name[The Eagle]", max_new_tokens=48, verify=True)
    assert api == compare(48, family=VERIFIED)  # the HTTP API by keyword: the same estimate
    assert compare(512, "beam search", 4) == gpu.DEFAULT_DURATION_S  # capped
    monkeypatch.setenv(gpu.DURATION_ENV, "30")
    assert compare(512) == 30 and compare(8) <= 30
    assert gpu.request_seconds(handlers.throughput, "a\nb", "auto", 3, 32) > \
        gpu.request_seconds(handlers.batch, "a\nb", "auto", 3, 32)  # its batch sizes decode in turn
    assert gpu.request_seconds(handlers.batch, "a", "auto", 3, "many") == 30  # bad input: the studio says so
    assert gpu.request_seconds(handlers.kv_cache, None) == round(gpu.FIXED_S)  # no decoding: the fixed part


def test_on_zero_gpu_the_model_running_handlers_are_decorated_as_bound_methods(fake_spaces, monkeypatch):
    from app.callbacks import Callbacks

    on_zero_gpu(monkeypatch)
    assert all(callable(getattr(Callbacks, name, None)) for name in gpu.GPU_CALLBACKS)  # no stale names
    callbacks = gpu.gpu_callbacks(Callbacks(studio=None))
    assert sorted(name for name, _ in fake_spaces.calls) == sorted(gpu.GPU_CALLBACKS)
    assert all(getattr(callbacks, name).zerogpu for name in gpu.GPU_CALLBACKS)
    assert not hasattr(callbacks.preview, "zerogpu") and not hasattr(callbacks.results, "zerogpu")
    assert not hasattr(Callbacks.stream_compare, "zerogpu")  # the class, other instances: untouched


def run_app(monkeypatch) -> dict:
    """app.py's main() with the studio, the page and the server faked: what it set up, in order."""
    spec = importlib.util.spec_from_file_location("app_entry", ROOT / "app.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    seen = {}

    class Studio:
        def __init__(self, limits, batcher):
            seen.update(limits=limits, batcher=batcher)

        def warm_up(self):
            seen["warm_up"] = True

    demo = types.SimpleNamespace(queue=lambda **kw: None, launch=lambda **kw: seen.update(launched=kw))
    monkeypatch.setattr(entry, "Studio", Studio)
    monkeypatch.setattr(entry, "build", lambda studio, concurrency: demo)
    monkeypatch.setattr(gpu, "preload", lambda studio: seen.update(preloaded=True))
    monkeypatch.delenv(entry.TIME_LIMIT_ENV, raising=False)
    entry.main([])
    seen["entry"] = entry
    seen["batcher"].close()
    return seen


def test_the_app_on_a_cpu_warms_up_as_before(fake_spaces, monkeypatch):
    from app.settings import Limits
    from skipdecode.batcher import Batcher

    seen = run_app(monkeypatch)
    assert type(seen["batcher"]) is Batcher and seen["warm_up"] and "preloaded" not in seen
    assert seen["limits"].time_limit_s == Limits.time_limit_s and seen["launched"]


def test_run_history_is_off_unless_the_host_turns_it_on(fake_spaces, monkeypatch):
    """Gradio keeps each visitor's runs in the browser unless told not to: on a shared classroom PC the next
    student would see the last one's prompts. Off by default; on, the page links the history."""
    import gradio

    monkeypatch.delenv("SKIPDECODE_RUN_HISTORY", raising=False)
    launched = run_app(monkeypatch)["launched"]
    assert launched["run_history"] is False and "runs" not in launched["footer_links"]
    assert "run_history" in gradio.Blocks.launch.__code__.co_varnames  # the parameter this Gradio takes
    monkeypatch.setenv("SKIPDECODE_RUN_HISTORY", "on")
    seen = run_app(monkeypatch)
    assert seen["launched"]["run_history"] is True and "runs" in seen["launched"]["footer_links"]
    assert seen["entry"].RUN_HISTORY_ENV == "SKIPDECODE_RUN_HISTORY"
    monkeypatch.setenv("SKIPDECODE_RUN_HISTORY", "maybe")
    with pytest.raises(SystemExit):  # argparse's error: the variable named, no server started
        run_app(monkeypatch)


def test_the_app_on_zero_gpu_loads_the_models_and_decodes_nothing_in_the_server(fake_spaces, monkeypatch):
    on_zero_gpu(monkeypatch)
    seen = run_app(monkeypatch)
    assert isinstance(seen["batcher"], gpu.ProcessBatcher) and seen["preloaded"] and "warm_up" not in seen
    assert seen["limits"].time_limit_s == gpu.DEFAULT_DURATION_S - gpu.MARGIN_S and seen["launched"]


def test_preload_loads_every_configured_model_but_auto(caplog):
    from app.choices import AUTO, ModelChoice

    loaded = []

    def engine(choice):
        loaded.append(choice)
        if choice.adapter == "broken":
            raise ValueError("adapter 'broken' does not fit")

    models = [ModelChoice(AUTO), ModelChoice("base"), ModelChoice("broken", adapter="broken"),
              ModelChoice("e2e-all", adapter="e2e-all")]
    gpu.preload(types.SimpleNamespace(models=models, engine=engine))
    assert loaded == models[1:]  # a model that fails to load leaves the others loading, and is logged
    assert "broken failed to load: adapter 'broken' does not fit" in caplog.text


def test_a_forked_worker_gets_a_batcher_thread_of_its_own():
    """What a ZeroGPU worker is: a fork of the server. The server's Batcher has no thread there (a job
    would wait for its time limit); a ProcessBatcher starts one and decodes as the server does."""
    import torch

    import skipdecode.batcher as batching
    from conftest import IdTokenizer, tiny_model
    from skipdecode.engine import Engine

    engine = Engine(tiny_model("llama", layers=2), IdTokenizer())
    plain, per_process = batching.Batcher(window_s=0.0, time_limit_s=0.5), gpu.ProcessBatcher(window_s=0.0)
    server = per_process.current
    expected = per_process.submit(engine, [5, 6, 7], max_new_tokens=3, stop_at_eos=False).result().token_ids
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        outcome = {}
        try:
            torch.set_num_threads(1)  # as torch's own forked workers do
            batching.STALL_GRACE_S = 0.0
            try:
                plain.submit(engine, [5, 6, 7], max_new_tokens=3, stop_at_eos=False).result()
            except TimeoutError:
                outcome["plain"] = "timed out"
            ticket = per_process.submit(engine, [5, 6, 7], max_new_tokens=3, stop_at_eos=False)
            outcome.update(tokens=ticket.result().token_ids, own=per_process.current is not server)
        except BaseException as error:  # noqa: BLE001 (reported to the parent, which fails the test)
            outcome["error"] = repr(error)
        finally:
            os.write(write, json.dumps(outcome).encode())
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 60
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            pytest.fail("the forked worker did not finish")
        time.sleep(0.05)
    with os.fdopen(read) as pipe:
        outcome = json.loads(pipe.read())
    plain.close(), per_process.close()
    assert outcome == {"plain": "timed out", "tokens": expected, "own": True}
    assert per_process.current is server


# ---- the browser set-up that `make test` runs ------------------------------------------------------
def fake_bin(tmp_path: Path, uid: int, apt: bool = True, sudo: bool | None = None) -> Path:
    """A PATH holding only fake `id`, `apt-get` (logs its arguments, "installs" chromium) and `sudo`."""
    folder = tmp_path / "bin"
    folder.mkdir()
    scripts = {"id": f"echo {uid}"}
    if apt:
        chmod = shutil.which("chmod")
        scripts["apt-get"] = (f'echo "$*" >> {tmp_path}/apt.log\n'
                              f'if [ "$1" = install ]; then : > "$CHROMIUM"; {chmod} +x "$CHROMIUM"; fi')
    if sudo is not None:  # True: sudo without a password; False: it would ask for one
        scripts["sudo"] = ('[ "$1" = -n ] && shift\n[ "$1" = true ] && exit 0\n'
                           '[ "$1" = env ] && shift 2\nexec "$@"' if sudo else "exit 1")
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def setup_browser(tmp_path: Path, path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(path), "CHROMIUM": str(tmp_path / "chromium")}
    return subprocess.run([shutil.which("bash"), str(SETUP_BROWSER), *args], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("uid, apt, sudo, decision", [
    (0, True, None, "root"),
    (1000, True, True, "sudo"),
    (1000, True, False, "manual"),
    (1000, True, None, "manual"),
    (0, False, None, "manual"),
])
def test_the_browser_set_up_decides_how_to_install(tmp_path, uid, apt, sudo, decision):
    result = setup_browser(tmp_path, fake_bin(tmp_path, uid, apt, sudo), "--check")
    assert (result.returncode, result.stdout) == (0, decision + "\n")
    assert not (tmp_path / "apt.log").exists()  # --check installs nothing


def test_the_browser_set_up_does_nothing_when_chromium_is_there(tmp_path):
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(0o755)
    path = fake_bin(tmp_path, 1000)
    assert setup_browser(tmp_path, path, "--check").stdout == "present\n"
    assert setup_browser(tmp_path, path).returncode == 0 and not (tmp_path / "apt.log").exists()


@pytest.mark.parametrize("uid, sudo", [(0, None), (1000, True)])
def test_the_browser_set_up_installs_debians_chromium_when_it_can(tmp_path, uid, sudo):
    result = setup_browser(tmp_path, fake_bin(tmp_path, uid, sudo=sudo))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "apt.log").read_text() == "update -qq\ninstall -y -qq chromium\n"
    assert os.access(tmp_path / "chromium", os.X_OK)


@pytest.mark.parametrize("apt, command", [(True, "sudo sh -c 'apt-get update -qq && apt-get install -y -qq chromium'"),
                                          (False, "your system's package for chromium")])
def test_the_browser_set_up_stops_naming_the_command_when_it_cannot(tmp_path, apt, command):
    result = setup_browser(tmp_path, fake_bin(tmp_path, 1000, apt, sudo=False))
    assert result.returncode == 1 and command in result.stderr and "then run make test again" in result.stderr
    assert not (tmp_path / "apt.log").exists()


# ---- offline: no failed Hub lookups in the logs ---------------------------------------------------
NETWORK_WORDS = ("fetch", "huggingface.co", "connect", "resolve", "offline", "hub")


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Every name lookup fails, as on a machine without a route to the Hub; the test thread's attempts are
    recorded (another thread of the session, if any, is not this test's doing)."""
    attempts, test_thread = [], threading.get_ident()

    def refuse(host, *args, **kwargs):
        if threading.get_ident() == test_thread:
            attempts.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


def network_messages(caught, caplog, capfd) -> list[str]:
    texts = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    texts += capfd.readouterr().err.splitlines()
    return [t for t in texts if any(word in t.lower() for word in NETWORK_WORDS)]


@pytest.mark.slow
def test_merging_a_shipped_adapter_looks_nothing_up(unreachable_hub, caplog, capfd):
    """The shipped adapters name the Hub's SmolLM2 as their base; merging one onto the bundled model
    reads only local files: no lookup at all, no warning about one."""
    from skipdecode.engine import Engine

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = Engine.load(adapter="e2e-all")
    assert engine.adapter.name == "e2e-all"
    assert unreachable_hub == [] and network_messages(caught, caplog, capfd) == []


@pytest.mark.slow
def test_the_hub_copy_of_the_default_falls_back_to_the_bundle_quietly(unreachable_hub, caplog, capfd):
    """A Space reaches the Hub; this machine does not: the default's Hub id then loads the bundled copy,
    and the failed attempt leaves nothing in the logs."""
    from skipdecode.models import DEFAULT_HUB_ID, _hub_or_bundled, cached_default

    cached_default()  # written outside the check: the first run dequantizes the bundled GGUF
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _hub_or_bundled(DEFAULT_HUB_ID) == str(cached_default())
    assert unreachable_hub and network_messages(caught, caplog, capfd) == []



def test_the_served_code_parses_with_python_310s_grammar():
    """ZeroGPU runs Python 3.10 only: no file a Space gets may use later syntax (`except*`, `type X = ...`,
    generic classes `class A[T]`, ...). ast's feature_version rejects what 3.10's grammar lacks."""
    import ast

    from test_publish_space import publish_space

    served = [f.path for f in publish_space.space_files() if f.path.endswith(".py")]
    assert "app.py" in served and "app/gpu.py" in served
    for path in served:
        ast.parse((ROOT / path).read_text(encoding="utf-8"), filename=path, feature_version=(3, 10))
    with pytest.raises(SyntaxError):  # the check can fail: 3.11's except* is refused
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))
