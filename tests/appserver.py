"""Serve app.py for real, in a subprocess on a free loopback port, for the HTTP and browser tests (and
the load test script).

One server per configuration and test session: the first test that asks starts it, the end of the
session stops it. The default one runs with a long batching window (so requests fired together batch
deterministically) and an empty adapters folder (so the model is the base one, which the tests decode
themselves to check the API)."""

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
_served: dict[str, str] = {}


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


def start(name: str = "app-server", args=(), env: dict | None = None, timeout_s: float = 180.0) -> Server:
    """`python app.py` on a free loopback port with extra options and environment, once it answers.
    Its output goes to test-artifacts/<name>.log."""
    port = free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / f"{name}.log"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port), *args],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}/", process, log_path)
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"app.py exited with {process.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(server.url, timeout=5) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"app.py did not answer on {server.url} within {timeout_s:.0f} s; see {log_path}")
        time.sleep(0.5)


def app_url(timeout_s: float = 180.0, name: str = "app-server", args=(), env: dict | None = None) -> str:
    """The base URL of the session's running `python app.py` of this name, started on first use.
    Without `env`, the adapters folder is an empty temporary one."""
    if name in _served:
        return _served[name]
    adapters = None
    if env is None:
        adapters = tempfile.mkdtemp(prefix="no-adapters-")
        env = {"SKIPDECODE_BATCH_WINDOW_S": "0.8", "SKIPDECODE_ADAPTERS": adapters}
    server = start(name, args, env, timeout_s)

    def stop():
        server.stop()
        if adapters:
            os.rmdir(adapters)

    atexit.register(stop)
    _served[name] = server.url
    return server.url
