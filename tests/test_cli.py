"""The command line: once run as a user runs it (a subprocess, stdout parsed), otherwise through its
`main()` in this process, the same code without an interpreter's start (4-5 s each here)."""

import json
import subprocess
import sys

import pytest

from conftest import PROMPTS


def run(*args):
    return subprocess.run([sys.executable, "-m", "skipdecode", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_generate_json_is_one_object_with_the_documented_fields():
    done = run("generate", "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--speedup", "3",
               "--max-new-tokens", "12", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # the whole of stdout is exactly one JSON object
    assert set(data) == {"model", "num_layers", "schedule", "outputs", "steps", "prefill_ms", "decode_ms",
                         "tokens_per_s", "prefix_tokens"}
    assert data["prefix_tokens"] == 0  # two prompts: a batch, which the prefix cache does not serve
    assert data["num_layers"] == 30 and data["schedule"]["mode"] == "skip"
    assert [o["prompt"] for o in data["outputs"]] == PROMPTS[:2]
    assert all(o["token_ids"] and isinstance(o["text"], str) for o in data["outputs"])
    budgets = [s["budget"] for s in data["steps"]]
    assert budgets == sorted(budgets, reverse=True) and budgets[0] < 30
    assert all(len(s["layers"]) == s["budget"] and s["layers"][-1] == 29 for s in data["steps"])
    assert data["tokens_per_s"] > 0


def test_generate_speedup_one_is_full_decoding(cli):
    done = cli("generate", "--prompt", PROMPTS[1], "--speedup", "1", "--max-new-tokens", "6", "--json")
    data = json.loads(done.stdout)
    assert all(s["layers"] == list(range(30)) for s in data["steps"])


def test_generate_bad_schedule_is_a_clear_error(cli):
    done = cli("generate", "--prompt", "hi", "--max-budget", "4", "--min-budget", "9")
    assert done.returncode == 2
    assert "min_budget must be an integer in [3, 4]" in done.stderr
    assert "Traceback" not in done.stderr


def test_schedule_command_prints_every_position(cli):
    done = cli("schedule", "--speedup", "3", "--num-layers", "30", "--horizon", "10", "--json")
    data = json.loads(done.stdout)
    assert len(data["steps"]) == 11 and data["steps"][0]["layers"][:2] == [0, 1]
    text = cli("schedule", "--speedup", "3", "--num-layers", "30", "--horizon", "10")
    assert text.returncode == 0 and "warm-up 2" in text.stdout and "#" in text.stdout
    flat = json.loads(cli("schedule", "--speedup", "3", "--num-layers", "30", "--spread", "1", "--json").stdout)
    assert {s["budget"] for s in flat["steps"]} == {10}
    both = cli("schedule", "--max-budget", "10", "--min-budget", "5", "--spread", "1", "--num-layers", "30")
    assert both.returncode == 2 and "--spread shapes a --speedup schedule" in both.stderr
