"""What `skipdecode bench` writes: the markdown table and its headline, the table put between the markers
of docs/speed.md (`--readme`), and the CSV and JSON of the rows."""

from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

TABLE_FILE = Path("docs") / "speed.md"  # where `--readme` with no path writes the table (between the markers)
README_BEGIN, README_END = "<!-- skipdecode bench: begin -->", "<!-- skipdecode bench: end -->"
DEFAULT_OUT = Path(__file__).resolve().parents[3] / "assets" / "results" / "bench.csv"  # the app shows it


COLUMNS = [("method", "method", "{}"), ("speedup", "x", "{:g}"), ("batch_size", "batch", "{}"),
           ("layers_per_token", "layers/token", "{:.1f}"), ("batch_layers_per_step", "layers/step", "{:.1f}"),
           ("ms_per_token", "ms/token", "{:.1f}"), ("floor_ms_per_token", "floor ms", "{:.1f}"),
           ("vs_floor", "vs floor", "{:.2f}"),
           ("tokens_per_s", "tok/s", "{:.1f}"), ("e2e_tokens_per_s", "e2e tok/s", "{:.1f}"),
           ("first_token_ms", "TTFT ms", "{:.1f}"),
           ("measured_speedup", "speedup", "{:.2f}"), ("bound", "bound", "{:.2f}"),
           ("efficiency", "efficiency", "{:.2f}"), ("hf_generate_tokens_per_s", "HF tok/s", "{:.1f}"),
           ("vs_hf", "vs HF", "{:.2f}"), ("vs_llamacpp", "vs llama.cpp", "{:.2f}"), ("bleu", "BLEU", "{:.1f}"), ("ser", "SER %", "{:.1f}"),
           ("agreement", "agree", "{:.2f}"), ("step", "step", "{}")]


def markdown(rows, goal_rows) -> str:
    lines = ["| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(row[key]) if key in row else "" for key, _, fmt in COLUMNS) + " |")
    lines.append("")
    for g in goal_rows:
        lines.append(f"- {g['goal']}: {g['value']:.2f} (goal {g['op']} {g['threshold']:g}): "
                     f"{'holds' if g['holds'] else 'does NOT hold'}")
    return "\n".join(lines)


def headline(report: dict) -> str:
    m = report["machine"]
    labels = ", ".join(f"{k} {v}" for k, v in report["labels"].items())
    isa = f" [{' '.join(m['isa']) or 'no avx2'}]" if "isa" in m else ""
    precision = f"; {report['precision']}" if "precision" in report else ""
    bandwidth = f"; read bandwidth {report['read_gb_s']} GB/s" if "read_gb_s" in report else ""
    steps = f"; decode steps: {', '.join(report['steps'])}" if report.get("steps") else ""
    return (f"{report['model']} on {m['cpu']}{isa} ({m['cores']} cores, {m['torch_threads']} torch threads, "
            f"{m['device']}), torch {m['torch']}, {report['date']}{precision}{steps}{bandwidth}; load average "
            f"{m['load_average'][0]} before, {report['load_average_after'][0]} after; {labels}; "
            f"{report['seconds']:.0f} s")


def readme_parts(path: Path) -> tuple[str, str]:
    """The text before and after the README's benchmark section (checked before a long run starts)."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if README_BEGIN not in text or README_END not in text.split(README_BEGIN, 1)[1]:
        raise ValueError(f"{path} has no '{README_BEGIN}' ... '{README_END}' section to fill")
    head, rest = text.split(README_BEGIN, 1)
    return head, rest.split(README_END, 1)[1]


def update_readme(path: Path, report: dict) -> None:
    """Put this run's table between the README's markers, so the figures there are this command's."""
    head, tail = readme_parts(path)
    body = (f"\n`{report['command']}`\n\n{headline(report)}\n\n"
            f"{markdown(report['rows'], report['goals'])}\n")
    path.write_text(head + README_BEGIN + body + README_END + tail, encoding="utf-8")


def write_results(rows, report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with open(out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def output_path(out: str | None, readme: str | None) -> str:
    """--out as given ('' for none); else assets/results/bench.csv for a run that writes the docs' table
    (--readme), which the app's Results tab then shows beside it; any other run goes to a fresh temporary
    folder, so that a quick measurement never replaces the shipped table."""
    if out is not None:
        return out
    if readme:
        return str(DEFAULT_OUT)
    return str(Path(tempfile.mkdtemp(prefix="skipdecode-bench-")) / "bench.csv")
