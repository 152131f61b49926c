"""Serve app.py for real, in a subprocess on a free loopback port, for the HTTP and browser tests.

One server per test session: the first test module that asks starts it, the end of the session stops it.
It runs with a long batching window (so requests fired together batch deterministically) and an empty
adapters folder (so the model is the base one, which the tests decode themselves to check the API)."""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_served: dict[str, str] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_url(timeout_s: float = 180.0) -> str:
    """The base URL of the session's running `python app.py`, started on first use."""
    if "url" in _served:
        return _served["url"]
    port = free_port()
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    log = open(artifacts / "app-server.log", "w")
    adapters = tempfile.mkdtemp(prefix="no-adapters-")
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "SKIPDECODE_BATCH_WINDOW_S": "0.8",
           "SKIPDECODE_ADAPTERS": adapters}
    process = subprocess.Popen([sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop():
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        os.rmdir(adapters)

    atexit.register(stop)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"app.py exited with {process.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"app.py did not answer on {url} within {timeout_s:.0f} s; see {log.name}")
        time.sleep(0.5)
    _served["url"] = url
    return url
