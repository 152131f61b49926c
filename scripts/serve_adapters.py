# Who: a maintainer, when a trained run replaces a served adapter in assets/adapters.
"""Put trained runs in the served set under the names the app and the CLI use.

    python scripts/serve_adapters.py checkpoints/runs/e2e-train-1x=e2e-1x checkpoints/runs/e2e-train-all=e2e-all \
        checkpoints/runs/e2e-train-5x=e2e-5x

Copies each RUN folder to `assets/adapters/NAME` (replacing what was there), rewrites the runs' records of
the adapters they started or distilled from (`init`, `teacher`) from a run's path to its served name where
that run is served in the same call, and writes the model card again under the new name. Why: a run
records its ancestors by absolute path on the machine that trained it; served, the lineage must read by
name on any clone (eval's held-out check follows it), and the card must name what the app serves. A run
trained on from the adapter it replaces records that one as NAME@COMMIT (the commit that served it, so `git
show COMMIT:assets/adapters/NAME` finds it), not by a name that would now point at itself; so does a run
trained on from the run folder the replaced adapter was served from (the same weights), and so does every
adapter already served that named the replaced one.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

from skipdecode.adapters.lora import (RECORD, WEIGHTS, adapters_dir, available_adapters, read_adapter, weights_digest,
                                 write_record)
from skipdecode.speculative.shortlist import FILE as SHORTLIST
from skipdecode.training.card import finish_adapter, write_card

FILES = ("adapter_config.json", WEIGHTS, RECORD)


def serve(pairs: list[tuple[Path, str]], folder: Path | None = None) -> list[Path]:
    """Copy each (run, name) into the adapters folder; returns the served folders."""
    folder = folder or adapters_dir()
    names = {Path(run).resolve(): name for run, name in pairs}
    replaced = {name: f"{name}@{_head()}" for _, name in pairs if (folder / name).exists()}
    served_now = {digest: tag for name, tag in replaced.items() if (digest := _weights(folder / name))}
    served = []
    for run, name in pairs:
        dest = folder / name
        # a draft's shortlist (skipdecode/speculative/shortlist.py) is counted on its task's targets, not on the weights:
        # the adapter that replaces it keeps it
        shortlist = (dest / SHORTLIST).read_bytes() if (dest / SHORTLIST).exists() else None
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for file in FILES:
            shutil.copy2(Path(run) / file, dest / file)
        if shortlist is not None:
            (dest / SHORTLIST).write_bytes(shortlist)
        meta = read_adapter(dest).meta
        for key in ("init", "teacher"):
            ancestor = meta["config"].get(key)
            if ancestor:  # a run being served now, the adapter being replaced (by name or by its run's path)
                meta["config"][key] = _served_name(ancestor, names, replaced, served_now)
        write_record(dest, meta)
        finish_adapter(dest)
        served.append(dest)
    _rename_replaced_ancestors(folder, served, replaced)
    return served


def _rename_replaced_ancestors(folder: Path, served: list[Path], replaced: dict) -> None:
    """Adapters served earlier that started or learned from one this call replaced name it by commit from now
    on (e2e-all's teacher `e2e-1x` becomes `e2e-1x@COMMIT` when a new e2e-1x is served): the name alone would
    now point at weights they never saw."""
    for other in (info for info in available_adapters(folder) if info.path not in served):
        meta = other.meta
        renamed = {key: replaced[meta["config"][key]] for key in ("init", "teacher")
                   if meta["config"].get(key) in replaced}
        if renamed:
            meta["config"].update(renamed)
            write_record(other.path, meta)
            write_card(other.path)  # the record changed, not the weights


def _served_name(ancestor: str, names: dict, replaced: dict, served_now: dict) -> str:
    """What a card should call its init or teacher once this call has served (only hashes when it must)."""
    path = Path(ancestor).resolve()
    if path in names:
        return names[path]
    if ancestor in replaced:
        return replaced[ancestor]
    return served_now.get(_weights(path), ancestor)


def _weights(folder: Path) -> str | None:
    """The adapter's weights, to know a run folder as the served copy of it (None: not an adapter folder)."""
    return weights_digest(folder) if (folder / WEIGHTS).is_file() else None


def _head() -> str:
    """The commit that serves what is in the adapters folder now."""
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else "git-unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", metavar="RUN=NAME")
    args = parser.parse_args()
    pairs = []
    for pair in args.pairs:
        run, sep, name = pair.partition("=")
        if not sep or not name or not (Path(run) / RECORD).exists():
            parser.error(f"{pair!r}: expected RUN=NAME, RUN a trained adapter folder")
        pairs.append((Path(run), name))
    for dest in serve(pairs):
        print(f"served {dest}")


if __name__ == "__main__":
    main()
