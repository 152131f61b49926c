"""Serve app.py for real, in a subprocess on a free loopback port, for the HTTP and browser tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served_app(env: dict | None = None, timeout_s: float = 180.0):
    """Yields the base URL of a running `python app.py`; stops it afterwards."""
    port = free_port()
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    log = open(artifacts / f"app-{port}.log", "w")
    process = subprocess.Popen(
        [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)], cwd=ROOT,
        env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})},
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
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
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
