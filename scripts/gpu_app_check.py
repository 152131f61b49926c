# Who: a host, against any running app (its API under concurrent users); a maintainer, through scripts/gpu_app.sh.
"""The served app checked over HTTP with gradio_client, as a user of its API would: run by scripts/gpu_app.sh
against `python app.py` on a GPU (docs/hosting.md), and usable against any running app.

    python scripts/gpu_app_check.py http://127.0.0.1:7860/ [--new-tokens 64] [--concurrent 16] [--out FILE]

1. One comparison each for an E2E test MR and a general question (3x): the speedups the API reports (layers,
   weights, measured), each side's ms per decoding step, the models and precision it says it ran.
2. Batch: the Batch tab's event is private (only /compare is public), so concurrent /compare requests are
   what batches over HTTP; the public endpoints are listed to show it.
3. `--concurrent` users at once, each with its own client and E2E test MR: all must answer; wall time, each
   measured speedup, the batch sizes the server reports.
4. Every bad input of docs/robustness.md (`BAD_INPUTS` of tests/test_robustness.py): each must be an AppError
   whose message says what to change and holds nothing internal; then a good request must still be answered.
Prints the summary as JSON; exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from loadtest import Outcome, ask, batches, latency, prompts  # also puts the repository and tests/ on sys.path

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402
from test_robustness import BAD_INPUTS, DEFAULTS, nothing_internal  # noqa: E402

TIMEOUT = {"httpx_kwargs": {"timeout": 120.0}}  # not httpx's 5 s: a busy host answered a refusal later than that
GENERAL = "Explain in one paragraph why the sky is blue."
SPEEDUP = 3.0


def side(result: dict, name: str) -> dict:
    """One side of a comparison: its text (cut), tokens, batch and mean ms per decoding step."""
    part = result[name]
    steps = part["trace"]["steps"]
    return {"text": part["text"][:160], "tokens": len(part["token_ids"]), "batch_size": part["batch"]["size"],
            "ms_per_step": round(sum(s["ms"] for s in steps) / len(steps), 3) if steps else None,
            "decode_tokens_per_s": part["trace"]["decode_tokens_per_s"]}


def comparison(client: Client, prompt: str, new_tokens: int, problems: list[str]) -> dict:
    started = time.perf_counter()
    result = client.predict(prompt, SPEEDUP, new_tokens, api_name="/compare")
    seconds = time.perf_counter() - started
    speed = result["speedup"]
    if result["prompt"] != prompt:
        problems.append(f"comparison: the answer is for another prompt ({prompt[:40]!r})")
    if not speed["measured"] or speed["measured"] <= 0 or not speed["layers"]:
        problems.append(f"comparison: no measured speedup for {prompt[:40]!r}: {speed}")
    if not (result["skipdecode"]["token_ids"] and result["full"]["token_ids"]):
        problems.append(f"comparison: an empty output for {prompt[:40]!r}")
    return {"prompt": prompt, "seconds": round(seconds, 2), "model": result["model"],
            "full_model": result["full_model"], "dtype": result["dtype"], "speedup": speed,
            "skipdecode": side(result, "skipdecode"), "full": side(result, "full")}


def endpoints(client: Client) -> dict:
    named = list(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    return {"public_endpoints": named, "batch_on_api": any("batch" in e for e in named),
            "note": "the Batch tab's event is private; concurrent /compare requests batch on the server instead"}


def concurrent(url: str, users: int, new_tokens: int, timeout_s: float, problems: list[str]) -> dict:
    texts = prompts(users)
    clients = [Client(url, verbose=False, **TIMEOUT) for _ in range(users)]
    go = threading.Barrier(users)
    limits = argparse.Namespace(request_timeout=timeout_s, deadline=time.monotonic() + timeout_s)

    def user(u: int) -> Outcome:
        go.wait()
        return ask(clients[u], Outcome(u, 0, texts[u], dict(speedup=SPEEDUP, max_new_tokens=new_tokens)), limits)

    started = time.perf_counter()
    with ThreadPoolExecutor(users) as pool:
        outcomes = list(pool.map(user, range(users)))
    wall = time.perf_counter() - started
    for o in outcomes:
        if o.error or o.result is None:
            problems.append(f"concurrent user {o.user}: {o.error or 'no answer'}")
        elif o.result["prompt"] != o.prompt:
            problems.append(f"concurrent user {o.user}: the answer is for another prompt")
    answered = [o for o in outcomes if o.result]
    return {"users": users, "answered": len(answered), "wall_s": round(wall, 2), "latency": latency(outcomes),
            "measured_speedups": [o.result["speedup"]["measured"] for o in answered],
            "layers_speedups": sorted({o.result["speedup"]["layers"] for o in answered}),
            "models": sorted({o.result["model"] for o in answered}),
            "skipdecode_batches": batches(answered, "skipdecode"), "full_batches": batches(answered, "full"),
            "skipdecode_ms_per_step": [side(o.result, "skipdecode")["ms_per_step"] for o in answered],
            "full_ms_per_step": [side(o.result, "full")["ms_per_step"] for o in answered]}


def bad_inputs(client: Client, problems: list[str]) -> dict:
    refused, slowest = [], 0.0
    for name, kwargs, message in BAD_INPUTS:
        started = time.perf_counter()
        try:
            client.predict(**{**DEFAULTS, **kwargs}, api_name="/compare")
        except AppError as error:
            text = str(error)
            try:
                nothing_internal(text)
            except AssertionError as leak:
                problems.append(f"bad input {name!r}: {leak}")
            if message not in text:
                problems.append(f"bad input {name!r}: the message {text[:120]!r} lacks {message!r}")
            refused.append(name)
        except Exception as error:  # noqa: BLE001 (anything but an AppError is a failure, reported)
            problems.append(f"bad input {name!r}: {type(error).__name__} instead of AppError: {str(error)[:120]}")
        else:
            problems.append(f"bad input {name!r}: accepted")
        slowest = max(slowest, time.perf_counter() - started)
    after = client.predict("Hi", 2.0, 1, api_name="/compare")
    if not after["full"]["token_ids"]:
        problems.append("after the bad inputs: no answer to a good request")
    return {"sent": len(BAD_INPUTS), "refused_as_app_error": len(refused), "slowest_refusal_s": round(slowest, 2),
            "good_request_after": bool(after["full"]["token_ids"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrent", type=int, default=16, help="users sending a comparison at once")
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--stages", default="comparisons,batch,concurrent,bad_inputs", help="which to run, in order")
    parser.add_argument("--out", type=Path, help="also write the summary as JSON here")
    args = parser.parse_args(argv)
    problems: list[str] = []
    client = Client(args.url, verbose=False, **TIMEOUT)
    summary = {"url": args.url, "new_tokens": args.new_tokens, "speedup_asked": SPEEDUP}
    stages = [("comparisons", lambda: [comparison(client, prompt, args.new_tokens, problems)
                                       for prompt in (prompts(1)[0], GENERAL)]),
              ("batch", lambda: endpoints(client)),
              ("concurrent", lambda: concurrent(args.url, args.concurrent, args.new_tokens, args.request_timeout,
                                                problems)),
              ("bad_inputs", lambda: bad_inputs(client, problems))]
    for name, stage in [(name, stage) for name, stage in stages if name in args.stages.split(",")]:
        started = time.perf_counter()
        try:
            summary[name] = stage()
        except Exception as error:  # noqa: BLE001 (a stage that breaks is a failure; the next ones still run)
            problems.append(f"{name}: {type(error).__name__}: {str(error)[:300]}")
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    summary["problems"] = problems
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # not sys.exit: a request that timed out leaves gradio_client's threads waiting on it
