# Who: a host or maintainer, before serving many users and after a change to batching, models or memory.
"""Load and soak test of SkipDecode Studio: real users over HTTP (gradio_client), on this machine's loopback.

    python scripts/loadtest.py load    # 32 users x 3 requests at once: every answer checked, p50/p95, batch sizes
    python scripts/loadtest.py soak    # 200 requests one after another: the server's resident memory over time
    python scripts/loadtest.py models  # every model choice twice, then 50 at random: memory stays bounded
    python scripts/loadtest.py class   # a class: 30 visitors over 15 s, one comparison each, against the solo time
    python scripts/loadtest.py         # all three, each against a freshly started app

Each phase starts `python app.py` (as `make demo` serves it) on a free 127.0.0.1 port, talks to it only
there, and stops it at the end. Bounded: a fixed number of requests, a time limit per request and one for
the whole run. Answers are checked against the engine's own decoding of the same prompt, alone, in this
process: the full-decoding tokens must be equal, and so must the SkipDecode tokens under the schedule the
server reports. Prints a report; `--out` also writes it as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from appserver import free_port, start  # noqa: E402  (the launcher the HTTP tests use)


@dataclass
class Outcome:
    """One request as its user saw it."""

    user: int
    index: int
    prompt: str
    settings: dict
    seconds: float = 0.0
    result: dict | None = field(default=None, repr=False)
    error: str | None = None


def client(url: str):
    """A visitor's gradio_client. The visitors run on this machine's two cores beside the server (a class's
    browsers run elsewhere), and gradio_client builds a TLS context (the whole CA bundle read) for each HTTP call
    it makes, plain http included, three calls a request: under 60 visitors over 15 s the clients took 11.5 of
    the machine's 40 CPU-seconds over 20 s, beside the server (docs/robustness.md). One context, built once,
    serves every visitor's calls (httpx takes it as `verify`)."""
    from gradio_client import Client

    return Client(url, verbose=False, ssl_verify=_tls())


@functools.cache
def _tls():
    import ssl

    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def prompts(count: int) -> list[str]:
    """Distinct E2E test-set prompts (so a mixed-up answer cannot pass for the right one)."""
    from skipdecode.evaluation.data import read_items, resolve

    items = read_items(resolve(None, "testset_w_refs.csv"))
    if len(items) < count:
        raise SystemExit(f"need {count} distinct E2E test MRs, found {len(items)}")
    return [item.prompt for item in items[:count]]


def chat_prompts(count: int) -> list[str]:
    """General chat prompts no test or validation run uses: the pool's held-out prompts from the far end of
    their hash order (the validation set is its start), short enough for a visitor's typing."""
    from skipdecode.evaluation import general

    held = general.by_hash(general.read_prompts(general.pool_file()), general.held_out)
    chosen = [p for p in reversed(held) if 20 <= len(p) <= 200][:count]
    if len(chosen) < count:
        raise SystemExit(f"need {count} held-out chat prompts, found {len(chosen)}")
    return chosen


def base_label() -> str:
    """The served base model by its label (requests name it, so "auto" and any adapter never apply)."""
    from app.choices import base_model, public_name

    return f"{public_name(base_model())} (base)"


def machine(server_pid: int | None = None) -> dict:
    """The machine's load while we ran: the load average, and what else was using the CPU (ps's %CPU:
    CPU time over the process's lifetime)."""
    ps = subprocess.run(["ps", "-eo", "pid,ppid,ni,pcpu,rss,args", "--sort=-pcpu"], capture_output=True, text=True)
    busy = []
    for line in ps.stdout.splitlines()[1:]:
        pid, ppid, nice, cpu, rss, args = line.split(None, 5)
        # Not this script, its children (ps itself among them) or the server under test.
        if float(cpu) >= 20 and os.getpid() not in (int(pid), int(ppid)) and int(pid) != server_pid:
            busy.append({"pid": int(pid), "nice": nice, "cpu_percent": float(cpu), "rss_mb": int(rss) // 1024,
                         "command": args[:90]})
    return {"cores": os.cpu_count(), "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()], "busy": busy}


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def ask(client, outcome: Outcome, args) -> Outcome:
    started = time.perf_counter()
    try:
        job = client.submit(outcome.prompt, **outcome.settings, api_name="/compare")
        outcome.result = job.result(timeout=min(args.request_timeout, max(args.deadline - time.monotonic(), 1.0)))
    except Exception as error:  # noqa: BLE001 (reported, and counted as a failure)
        outcome.error = f"{type(error).__name__}: {error}"
    outcome.seconds = time.perf_counter() - started
    return outcome


def check(outcomes: list[Outcome], max_new_tokens: int) -> tuple[list[str], str]:
    """Every answer against the engine's own decoding of its prompt, alone (on the server's default weights:
    the GGUF's 4-bit blocks on a CPU, see skipdecode/kernels/q4.py). Returns the problems, each starting with
    "user U request K:", and which weights ran (Engine.weights_label)."""
    from skipdecode.engine import Engine
    from skipdecode.evaluation.quality import common_prefix
    from skipdecode.schedule import Schedule

    engine = Engine.load()
    problems = []
    for o in outcomes:
        if o.error is not None or o.result is None:
            problems.append(f"user {o.user} request {o.index}: {o.error or 'no answer'}")
            continue
        r = o.result
        if r["prompt"] != o.prompt:
            problems.append(f"user {o.user} request {o.index}: the answer is for another prompt")
            continue
        full = engine.generate([o.prompt], None, max_new_tokens).token_ids[0]
        skip = engine.generate([o.prompt], Schedule(**r["schedule"]), max_new_tokens).token_ids[0]
        for name, ours, served in (("full", full, r["full"]["token_ids"]), ("skipdecode", skip, r["skipdecode"]["token_ids"])):
            if served != ours:
                same = common_prefix(ours, served)
                problems.append(f"user {o.user} request {o.index}: {name} tokens differ from the engine's own "
                                f"from position {same} (batch of {r[name]['batch']['size']})")
        if r["quality"] is None:
            problems.append(f"user {o.user} request {o.index}: no quality scores")
    return problems, engine.weights_label


def batches(outcomes: list[Outcome], side: str) -> dict:
    """How many requests ran in each batch, and the most rows a step of it held, from what the answers say (a
    continuous batch keeps its number while requests join and leave it; a batch of one position holds its
    requests' rows from start to end)."""
    requests, rows = Counter(), Counter()
    for o in outcomes:
        if o.result:
            batch = o.result[side]["batch"]
            requests[batch["number"]] += 1
            rows[batch["number"]] = max(rows[batch["number"]], batch["size"])
    counts = sorted(requests.values(), reverse=True)
    return {"batches": len(counts), "requests": sum(counts), "sizes": counts,
            "mean_per_batch": round(sum(counts) / len(counts), 2) if counts else None,
            "most_rows_a_step": max(rows.values(), default=None)}


def latency(outcomes: list[Outcome]) -> dict:
    seconds = [o.seconds for o in outcomes if o.error is None]
    if not seconds:
        return {}
    p50, p95 = np.percentile(seconds, [50, 95])
    return {"p50_s": round(float(p50), 2), "p95_s": round(float(p95), 2), "max_s": round(max(seconds), 2),
            "min_s": round(min(seconds), 2)}


def load(args) -> dict:
    """`users` users at once, each sending `requests` requests one after another."""
    texts = prompts(args.users * args.requests)
    settings = dict(speedup=args.speedup, max_new_tokens=args.max_new_tokens, model=base_label())
    server = start("loadtest-load-server")
    try:
        before = machine()
        clients = [client(server.url) for _ in range(args.users)]
        go = threading.Barrier(args.users)

        def user(u: int) -> list[Outcome]:
            go.wait()
            return [ask(clients[u], Outcome(u, k, texts[u * args.requests + k], settings), args)
                    for k in range(args.requests)]

        started = time.perf_counter()
        with ThreadPoolExecutor(args.users) as pool:
            outcomes = [o for done in pool.map(user, range(args.users)) for o in done]
        wall = time.perf_counter() - started
        during = machine(server.process.pid)
        server_rss = rss_mb(server.process.pid)
    finally:
        server.stop()
    problems, weights = check(outcomes, args.max_new_tokens)
    wrong = {problem.split(":")[0] for problem in problems}  # "user U request K"
    return {"phase": "load", "weights": weights, "users": args.users, "requests_per_user": args.requests, "settings": settings,
            "sent": len(texts), "answered": sum(o.result is not None for o in outcomes),
            "errors": sum(o.error is not None for o in outcomes), "correct": len(outcomes) - len(wrong),
            "problems": problems, "wall_s": round(wall, 1), "requests_per_s": round(len(outcomes) / wall, 2),
            "latency": latency(outcomes), "skipdecode_batches": batches(outcomes, "skipdecode"),
            "full_batches": batches(outcomes, "full"), "server_rss_mb": round(server_rss),
            "machine_before": before, "machine_after": during}


def soak(args) -> dict:
    """Requests one after another, varied (prompt, speedup, token limit, sampling, now and then bad
    input), and the server's resident memory as they go."""
    texts = prompts(40)
    bad = [dict(prompt="   "), dict(speedup=50.0), dict(max_new_tokens=0), dict(prompt="bell \x07")]
    server = start("loadtest-soak-server")
    samples, outcomes = [], []
    try:
        visitor = client(server.url)
        model = base_label()
        for i in range(args.soak):
            settings = dict(speedup=[1.0, 2.0, 3.0, 4.0, 5.0][i % 5], max_new_tokens=[8, 12, 16][i % 3], model=model)
            if i % 4 == 3:
                settings.update(decoding="sampling", temperature=0.8, top_p=0.9, seed=i)
            outcome = Outcome(0, i, texts[i % len(texts)], settings)
            if i % 10 == 9:  # bad input must be refused, and cost nothing that stays
                outcome.settings = {**settings, **{k: v for k, v in bad[(i // 10) % len(bad)].items() if k != "prompt"}}
                outcome.prompt = bad[(i // 10) % len(bad)].get("prompt", outcome.prompt)
            ask(visitor, outcome, args)
            outcomes.append(outcome)
            if (i + 1) % 20 == 0:
                samples.append({"after": i + 1, "rss_mb": round(rss_mb(server.process.pid), 1)})
                print(f"  soak: {i + 1} requests, server RSS {samples[-1]['rss_mb']:.0f} MB", flush=True)
        during = machine(server.process.pid)
    finally:
        server.stop()
    meant_bad = [o for o in outcomes if o.index % 10 == 9]
    good = [o for o in outcomes if o.index % 10 != 9]
    first, last = samples[0]["rss_mb"], samples[-1]["rss_mb"]
    return {"phase": "soak", "requests": len(outcomes), "good_answered": sum(o.error is None for o in good),
            "good_sent": len(good), "bad_refused": sum(o.error is not None for o in meant_bad), "bad_sent": len(meant_bad),
            "failures": [f"request {o.index}: {o.error}" for o in good if o.error],
            "rss_after_first_20_mb": first, "rss_after_last_mb": last,
            "rss_change_percent": round(100 * (last - first) / first, 2), "rss_samples": samples,
            "latency": latency(good), "machine": during}


def classroom(args) -> dict:
    """A class: `visitors` people, arriving evenly over `spread` seconds, each pressing Run once on a prompt of
    their own (a comparison, the page's default model choice), after `solo` visitors one at a time. Each
    batching mode against a fresh app; every answer checked against its prompt decoded alone."""
    from app.choices import AUTO

    texts = chat_prompts(args.visitors + args.solo)
    settings = dict(speedup=args.speedup, max_new_tokens=args.class_tokens, model=AUTO)
    runs = {}
    for mode in (["positions", "continuous"] if args.batching == "both" else [args.batching]):
        server = start(f"loadtest-class-{mode}", args=("--batching", mode))
        try:
            solo = [ask(client(server.url), Outcome(-1, k, texts[args.visitors + k], settings), args)
                    for k in range(args.solo)]
            clients = [client(server.url) for _ in range(args.visitors)]
            begin = time.monotonic() + 1.0

            def visitor(v: int) -> Outcome:
                time.sleep(max(begin + v * args.spread / args.visitors - time.monotonic(), 0.0))
                return ask(clients[v], Outcome(v, 0, texts[v], settings), args)

            with ThreadPoolExecutor(args.visitors) as pool:
                outcomes = list(pool.map(visitor, range(args.visitors)))
            makespan = time.monotonic() - begin
            during = machine(server.process.pid)
        finally:
            server.stop()
        shared = [max((s["rows"] for side in ("skipdecode", "full") for s in o.result[side]["trace"]["steps"]),
                      default=0) for o in outcomes if o.result]
        tokens = sum(len(o.result[side]["token_ids"]) for o in outcomes if o.result for side in ("skipdecode", "full"))
        solo_s = float(np.median([o.seconds for o in solo if o.error is None] or [float("nan")]))
        lat = latency(outcomes)
        runs[mode] = {"solo_s": round(solo_s, 2), "latency": lat,
                      "p95_over_solo": round(lat.get("p95_s", float("nan")) / solo_s, 2),
                      "errors": sum(o.error is not None for o in outcomes), "makespan_s": round(makespan, 1),
                      "tokens_per_s": round(tokens / makespan, 1), "rows_sharing_a_step": sorted(shared),
                      "problems": check_models(solo + outcomes, args.class_tokens), "machine": during}
    peer = llama_server_class(args, texts) if args.llama_server else None
    return {"phase": "class", "visitors": args.visitors, "spread_s": args.spread, "settings": settings, "runs": runs,
            "llama_server": peer}


def llama_server_class(args, texts: list[str]) -> dict:
    """The same arrivals against llama.cpp's own server (`--llama-server`: -np 16, continuous batching, 2
    threads) on the very GGUF file the Studio runs: full depth only, one answer a visitor, then two (the token
    volume of a comparison's two sides), greedy, through its chat template."""
    import urllib.request

    from skipdecode.models import default_gguf

    port = free_port()
    server = subprocess.Popen([str(args.llama_server), "-m", str(default_gguf()), "--host", "127.0.0.1", "--port",
                               str(port), "-np", "16", "--cont-batching", "-t", "2", "-c", str(16 * 1024)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def post(prompt: str) -> int:
        """One answer, stopping at EOS as the Studio's do; the tokens it generated."""
        body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": args.class_tokens,
                           "temperature": 0}).encode()
        request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=args.request_timeout) as answer:
            return json.loads(answer.read())["usage"]["completion_tokens"]

    runs = {}
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        for answers in (1, 2):
            def timed(v: int) -> tuple[float, int]:
                started = time.perf_counter()
                with ThreadPoolExecutor(answers) as pool:
                    tokens = sum(pool.map(post, [texts[v]] * answers))
                return time.perf_counter() - started, tokens

            solo = float(np.median([timed(args.visitors + k)[0] for k in range(args.solo)]))
            begin = time.monotonic() + 1.0

            def visitor(v: int) -> tuple[float, int]:
                time.sleep(max(begin + v * args.spread / args.visitors - time.monotonic(), 0.0))
                return timed(v)

            with ThreadPoolExecutor(args.visitors) as pool:
                done = list(pool.map(visitor, range(args.visitors)))
            makespan, seconds = time.monotonic() - begin, [s for s, _ in done]
            p50, p95 = np.percentile(seconds, [50, 95])
            runs[f"{answers} answer{'s' if answers > 1 else ''} a visitor"] = {
                "solo_s": round(solo, 2), "p50_s": round(float(p50), 2), "p95_s": round(float(p95), 2),
                "max_s": round(max(seconds), 2), "p95_over_solo": round(float(p95) / solo, 2),
                "tokens_per_s": round(sum(t for _, t in done) / makespan, 1)}
    finally:
        server.terminate()
        server.wait(30)
    return runs


def check_models(outcomes: list[Outcome], max_new_tokens: int) -> list[str]:
    """Each answer against the engine of the model the server says it ran (the adapter for "auto"),
    decoding the prompt alone: one model loaded at a time, so the check's own memory stays small."""
    from app.choices import configured_models
    from skipdecode.engine import Engine
    from skipdecode.schedule import Schedule

    choices = {m.label: m for m in configured_models()}
    problems, answered = [], []
    for o in outcomes:
        if o.error is not None or o.result is None:
            problems.append(f"request {o.index}: {o.error or 'no answer'}")
        elif o.result["prompt"] != o.prompt:
            problems.append(f"request {o.index}: the answer is for another prompt")
        else:
            answered.append(o)
    for label in sorted({o.result[side] for o in answered for side in ("model", "full_model")}):
        engine = Engine.load(choices[label].model, adapter=choices[label].adapter)
        for o in answered:
            r = o.result
            for side, key, schedule in (("model", "skipdecode", Schedule(**r["schedule"])), ("full_model", "full", None)):
                if r[side] == label and engine.generate([o.prompt], schedule, max_new_tokens).token_ids[0] != r[key]["token_ids"]:
                    problems.append(f"request {o.index}: {key} tokens of {label} differ from its engine's own")
        del engine
    return problems


def models(args) -> dict:
    """Every model choice twice, one after another, then `random` more requests with random choices:
    the server's resident memory after each. Its budget: `budget` x the memory after the first request
    (the page's default, "auto" at 3x, which loads the base model and two adapters)."""
    import random

    texts = prompts(40)
    server = start("loadtest-models-server")
    outcomes, samples = [], []
    try:
        visitor = client(server.url)
        from app.choices import configured_models

        choices = [m.label for m in configured_models()]
        pick = random.Random(0)
        plan = [(label, 3.0) for _ in range(2) for label in choices]
        plan += [(pick.choice(choices), pick.choice([1.0, 2.0, 3.0, 5.0])) for _ in range(args.random)]
        for i, (label, speedup) in enumerate(plan):
            settings = dict(speedup=speedup, max_new_tokens=args.model_tokens, model=label)
            outcomes.append(ask(visitor, Outcome(0, i, texts[i % len(texts)], settings), args))
            samples.append({"after": i + 1, "model": label, "rss_mb": round(rss_mb(server.process.pid), 1)})
            print(f"  models: request {i + 1}/{len(plan)} ({label}, {speedup:g}x): server RSS "
                  f"{samples[-1]['rss_mb']:.0f} MB", flush=True)
        during = machine(server.process.pid)
    finally:
        server.stop()
    problems = check_models(outcomes, args.model_tokens)
    first, peak = samples[0]["rss_mb"], max(s["rss_mb"] for s in samples)
    return {"phase": "models", "choices": choices, "requests": len(outcomes), "problems": problems,
            "rss_after_first_mb": first, "rss_peak_mb": peak, "rss_last_mb": samples[-1]["rss_mb"],
            "peak_over_first": round(peak / first, 3), "budget": args.budget, "rss_samples": samples,
            "machine": during}


def report(result: dict) -> None:
    m = (result.get("machine_after") or result.get("machine")
         or next(iter(result.get("runs", {}).values()), {}).get("machine"))
    load_note = (f"machine: {m['cores']} cores, load average {m['loadavg_1_5_15']}; also busy: "
                 + ("; ".join(f"{b['command'][:60]} ({b['cpu_percent']:.0f}% CPU, nice {b['nice']})"
                              for b in m["busy"]) or "nothing"))
    if result["phase"] == "class":
        print(f"CLASS: {result['visitors']} visitors over {result['spread_s']:g} s, one comparison each "
              f"({result['settings']})")
        for mode, run in result["runs"].items():
            lat = run["latency"]
            print(f"  {mode}: solo {run['solo_s']} s; p50 {lat.get('p50_s')} s, p95 {lat.get('p95_s')} s, max "
                  f"{lat.get('max_s')} s: p95 {run['p95_over_solo']}x solo; {run['errors']} errors, "
                  f"{len(run['problems'])} problems; {run['tokens_per_s']} tokens/s over {run['makespan_s']} s; "
                  f"rows sharing a step, at most: {run['rows_sharing_a_step']}")
            for problem in run["problems"]:
                print("  PROBLEM:", problem)
        for name, run in (result["llama_server"] or {}).items():
            print(f"  llama-server, {name}: solo {run['solo_s']} s; p50 {run['p50_s']} s, p95 {run['p95_s']} s, max "
                  f"{run['max_s']} s: p95 {run['p95_over_solo']}x solo; {run['tokens_per_s']} tokens/s")
    elif result["phase"] == "models":
        print(f"MODELS: {len(result['choices'])} model choices walked twice, then {result['requests'] - 2 * len(result['choices'])} "
              f"at random: {result['requests']} requests, {len(result['problems'])} problems")
        print(f"  server RSS after the first request {result['rss_after_first_mb']:.0f} MB, peak "
              f"{result['rss_peak_mb']:.0f} MB ({result['peak_over_first']:.2f}x; budget {result['budget']:g}x), "
              f"last {result['rss_last_mb']:.0f} MB")
        for problem in result["problems"]:
            print("  PROBLEM:", problem)
    elif result["phase"] == "load":
        lat, sb, fb = result["latency"], result["skipdecode_batches"], result["full_batches"]
        print(f"LOAD: {result['users']} users x {result['requests_per_user']} requests = {result['sent']} sent, "
              f"{result['answered']} answered, {result['errors']} errors, {result['correct']} checked correct")
        print(f"  weights: {result['weights']}")
        print(f"  latency p50 {lat.get('p50_s')} s, p95 {lat.get('p95_s')} s, max {lat.get('max_s')} s; "
              f"{result['requests_per_s']} requests/s over {result['wall_s']} s")
        for name, b in (("SkipDecode", sb), ("full decoding", fb)):
            print(f"  {name}: {b['requests']} requests in {b['batches']} batches (requests per batch {b['sizes']}; "
                  f"at most {b['most_rows_a_step']} rows a step)")
        for problem in result["problems"]:
            print("  PROBLEM:", problem)
    else:
        print(f"SOAK: {result['requests']} requests one after another: {result['good_answered']}/{result['good_sent']} "
              f"good ones answered, {result['bad_refused']}/{result['bad_sent']} bad ones refused")
        print(f"  server RSS after the first 20: {result['rss_after_first_20_mb']:.0f} MB, after the last: "
              f"{result['rss_after_last_mb']:.0f} MB ({result['rss_change_percent']:+.1f}%); latency p50 "
              f"{result['latency'].get('p50_s')} s, p95 {result['latency'].get('p95_s')} s")
        for failure in result["failures"]:
            print("  FAILURE:", failure)
    print("  " + load_note)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", nargs="?", choices=["load", "soak", "models", "class", "all"], default="all")
    parser.add_argument("--visitors", type=int, default=30, help="class: visitors, one comparison each")
    parser.add_argument("--spread", type=float, default=15.0, help="class: seconds over which they arrive")
    parser.add_argument("--solo", type=int, default=3, help="class: visitors one at a time first, for the solo time")
    parser.add_argument("--class-tokens", type=int, default=48, help="class: new tokens per answer")
    parser.add_argument("--llama-server", type=Path, help="class: llama.cpp's llama-server binary, for the same "
                        "arrivals against it (make bench-peers builds it)")
    parser.add_argument("--batching", choices=["continuous", "positions", "both"], default="both",
                        help="class: the app's batching (both: each against a fresh app, positions first)")
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--requests", type=int, default=3, help="requests per user, one after another")
    parser.add_argument("--soak", type=int, default=200, help="sequential requests of the soak")
    parser.add_argument("--random", type=int, default=50, help="random model choices after the walk")
    parser.add_argument("--model-tokens", type=int, default=4, help="new tokens per request of the models phase")
    parser.add_argument("--budget", type=float, default=1.5,
                        help="models phase: peak memory at most this x the memory after the first request")
    parser.add_argument("--speedup", type=float, default=3.0)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds a user waits for an answer")
    parser.add_argument("--time-limit", type=float, default=1800.0, help="seconds the whole run may take")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not (1 <= args.users <= 64 and 1 <= args.requests <= 10 and 20 <= args.soak <= 1000
            and 1 <= args.visitors <= 64 and 0 < args.spread <= 120 and 1 <= args.solo <= 10):
        parser.error("bounded on purpose: users 1..64, requests 1..10, soak 20..1000, visitors 1..64, spread up to "
                     "120 s, solo 1..10")
    args.deadline = time.monotonic() + args.time_limit
    results = []
    for phase in (("load", load), ("soak", soak), ("models", models), ("class", classroom)):
        if args.phase == phase[0] or (args.phase == "all" and phase[0] != "class"):  # "all": the first three
            print(f"{phase[0]}: starting a fresh app…", flush=True)
            results.append(phase[1](args))
            report(results[-1])
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(["python scripts/loadtest.py", *(argv or sys.argv[1:])]),
                                        "results": results}, indent=1))
    ok = all(not r.get("problems") and not r.get("failures") and r.get("errors", 0) == 0 for r in results)
    ok = ok and all(not run["problems"] and not run["errors"] for r in results for run in r.get("runs", {}).values())
    soak_ok = all(abs(r["rss_change_percent"]) < 10 for r in results if r["phase"] == "soak")
    models_ok = all(r["peak_over_first"] <= r["budget"] for r in results if r["phase"] == "models")
    return 0 if ok and soak_ok and models_ok else 1


if __name__ == "__main__":
    sys.exit(main())
