"""llama.cpp in a child process, so that its crash is one line of the bench and not the bench's end.

llama.cpp is C: where it faults (a native build's AMX kernel on a kernel that does not grant AMX, amx.py),
the signal kills whatever process loaded it. The bench therefore loads it here, in `python -m
skipdecode.evaluation.llamacpp_child`, and talks to it in JSON lines: one request a line on its stdin, one
answer a line on a pipe of its own (the child's stdout is pointed at its stderr, so nothing llama.cpp prints
can land in an answer). The timing happens in the child, around llama.cpp's own calls (llamacpp.py), so the
pipe costs none of the figures. When the child dies, `InChild` raises `Crashed` (an `Unavailable`): one line
with the signal and the command that rebuilds llama.cpp, and the bench goes on without the row.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from .amx import amx_refused
from .llamacpp import INSTALL, LlamaCpp, Unavailable, import_llama_cpp

CHILD = ("-m", __name__)  # the child's command after the interpreter; tests point it at a crashing stand-in


class Crashed(Unavailable):
    """The child died: llama.cpp's own fault, not the bench's."""


def crash_line(returncode: int) -> str:
    """One line for a child that ended with `returncode` (a signal when negative) before answering."""
    if returncode >= 0:  # Python's own exit (an import that failed, say): its traceback is on stderr above
        return f"no llama.cpp row: its child process ended with exit status {returncode} (its error is above)"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "unknown"
    what = f"signal {-returncode} ({name})"
    if amx_refused():
        return (f"llama.cpp crashed: {what}, likely in its AMX kernel (this CPU advertises AMX and the kernel does "
                f"not grant it); `{INSTALL}` rebuilds it without AMX. The bench goes on without its row")
    return (f"llama.cpp crashed: {what}; `{INSTALL}` rebuilds it for this CPU (without AMX where the kernel does "
            "not grant it). The bench goes on without its row")


class InChild:
    """llamacpp.LlamaCpp living in a child process: its `time`, `time_generate`, `gguf`, `threads` and
    `version`, as the bench reads them."""

    def __init__(self, gguf: Path, threads: int, context: int):
        self.gguf, self.threads = Path(gguf), threads
        answers, child_end = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, *CHILD, str(gguf), str(threads), str(context), str(child_end)],
            stdin=subprocess.PIPE, pass_fds=(child_end,), text=True)
        os.close(child_end)
        self.answers = os.fdopen(answers, "r")
        self.version = self._answer()["version"]

    def _answer(self) -> dict:
        line = self.answers.readline()
        if not line:  # the child is gone
            raise Crashed(crash_line(self.process.wait()))
        answer = json.loads(line)
        if "error" in answer:
            raise Unavailable(answer["error"])
        return answer

    def _call(self, method: str, ids: list[int], new_tokens: int):
        try:
            self.process.stdin.write(json.dumps({"call": method, "ids": list(ids), "new_tokens": new_tokens}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise Crashed(crash_line(self.process.wait())) from None
        answer = self._answer()
        return tuple(answer["figures"]), answer["tokens"]

    def time(self, ids: list[int], new_tokens: int):
        return self._call("time", ids, new_tokens)

    def time_generate(self, ids: list[int], new_tokens: int):
        return self._call("time_generate", ids, new_tokens)

    def close(self) -> None:
        """End the child (its stdin closed: it returns), and wait for it."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.answers.close()

    def __del__(self):
        if getattr(self, "answers", None) is not None and not self.answers.closed:
            self.close()


def for_engine(engine, context: int, threads: int) -> InChild:
    """llama.cpp on the GGUF file the engine's weights come from, in a child process, or Unavailable saying
    why not."""
    from ..models import DEFAULT_MODEL, default_gguf

    base = getattr(engine, "base_name", engine.name)
    if base != DEFAULT_MODEL:
        raise Unavailable(f"no llama.cpp row: it runs the bundled GGUF of {DEFAULT_MODEL}, and this run's model is "
                          f"{base}")
    try:
        gguf = default_gguf()
    except FileNotFoundError as error:
        raise Unavailable(f"no llama.cpp row: {error}") from None
    import_llama_cpp()  # here first: a missing install is said without starting a child
    return InChild(gguf, threads, context)


def serve(runner=LlamaCpp, argv=None) -> None:
    """The child's loop (argv: the GGUF, threads, context and the answers' file descriptor): build the
    runner, say its version, answer each request line until stdin closes."""
    gguf, threads, context, fd = sys.argv[1:] if argv is None else argv
    answers = os.fdopen(int(fd), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # whatever llama.cpp prints goes to stderr, not an answer
    try:
        made = runner(Path(gguf), int(threads), int(context))
    except Unavailable as error:
        reply = {"error": str(error)}
    except Exception as error:  # llama-cpp-python's refusal of the file, say: a reason, not a crash
        reply = {"error": f"no llama.cpp row: llama.cpp did not load {Path(gguf).name} ({error})"}
    else:
        reply = {"version": made.version}
    print(json.dumps(reply), file=answers, flush=True)
    if "error" in reply:
        return
    for line in sys.stdin:
        request = json.loads(line)
        try:
            figures, tokens = getattr(made, request["call"])(request["ids"], request["new_tokens"])
            reply = {"figures": list(figures), "tokens": [int(t) for t in tokens]}
        except Exception as error:  # llama_decode's failure (llamacpp.py raises it): the row's end, said why
            reply = {"error": f"no llama.cpp row: {error}"}
        print(json.dumps(reply), file=answers, flush=True)


if __name__ == "__main__":
    serve()
