"""Serve app.py for real, in a subprocess on a free loopback port, for the HTTP and browser tests (and
the load test script).

One server per configuration and test session: the first test that asks starts it (or waits for the one
`prestart` launched ahead of it), and `stop` ends it (conftest.py does, after the last test that uses it; the
end of the session stops any left). The default one (DEFAULT) runs on the precision a visitor's CPU gets
("auto": the 4-bit default, not the tests' float32), with a long batching window (so requests fired together
batch deterministically) and an empty adapters folder (so the model is the base one, which the tests decode
themselves to check the API: conftest.py's `served_engine`)."""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
DEFAULT = dict(name="app-server")  # app_url()'s server, as conftest.py's plans name it
_servers: dict[str, Server] = {}  # name -> the session's server of that name, launched
_up: set[str] = set()  # names of those that answered
_empty: dict[str, str] = {}  # name -> the empty adapters folder made for that server, removed when it stops
_ports: set[int] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running `python app.py`; `stop()` ends it (and only it)."""

    url: str
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(20)


def launch(name: str = "app-server", args=(), env: dict | None = None) -> Server:
    """`python app.py` on a free loopback port with extra options and environment, started and not waited
    for (`wait_until_up`). Its output goes to test-artifacts/<name>.log."""
    port = free_port()
    while port in _ports:  # one launched a moment ago may not have bound its port yet
        port = free_port()
    _ports.add(port)
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / f"{name}.log"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port), *args],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Server(f"http://127.0.0.1:{port}/", process, log_path)


def wait_until_up(server: Server, timeout_s: float = 180.0) -> Server:
    """`server` once it answers; stopped, and an error raised, if it exits or stays silent for timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"app.py exited with {server.process.returncode}; see {server.log}")
        try:
            with urllib.request.urlopen(server.url, timeout=5) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"app.py did not answer on {server.url} within {timeout_s:.0f} s; see {server.log}")
        time.sleep(0.5)


def start(name: str = "app-server", args=(), env: dict | None = None, timeout_s: float = 180.0) -> Server:
    """`python app.py` on a free loopback port with extra options and environment, once it answers.
    Its output goes to test-artifacts/<name>.log."""
    return wait_until_up(launch(name, args, env), timeout_s)


def prestart(name: str = "app-server", args=(), env: dict | None = None) -> None:
    """Launch the session's server of this name now and go on: it loads (20-25 s here) while other tests
    run, and the first `app_url` of that name waits for it. The arguments are `app_url`'s."""
    if name in _servers:
        return
    if env is None:
        _empty[name] = tempfile.mkdtemp(prefix="no-adapters-")
        env = {"SKIPDECODE_BATCH_WINDOW_S": "0.8", "SKIPDECODE_ADAPTERS": _empty[name], "SKIPDECODE_DTYPE": "auto"}
    _servers[name] = launch(name, args, env)


def app_url(timeout_s: float = 180.0, name: str = "app-server", args=(), env: dict | None = None) -> str:
    """The base URL of the session's running `python app.py` of this name, started on first use (or
    earlier, by `prestart`). Without `env`, the adapters folder is an empty temporary one."""
    prestart(name, args, env)
    if name not in _up:
        wait_until_up(_servers[name], timeout_s)
        _up.add(name)
    return _servers[name].url


def stop(name: str) -> None:
    """Stop the session's server of this name, if one runs; a later `app_url` starts it again."""
    server = _servers.pop(name, None)
    _up.discard(name)
    if server is not None:
        server.stop()
    if name in _empty:
        os.rmdir(_empty.pop(name))


@atexit.register
def _stop_all() -> None:
    for name in list(_servers):
        stop(name)
