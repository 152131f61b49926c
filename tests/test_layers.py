"""The library in layers: the runtime (skipdecode/ but its evaluation and training) decodes without the training and evaluation code
above it, and no module imports in a circle."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import tiny_adapter, tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "skipdecode"
UPPER = ("skipdecode.training", "skipdecode.evaluation")
# From the bottom up; a module may import its own layer and the layers below it, never one above.
LAYERS = ("runtime", "evaluation", "training", "cli")


def layer(module: str) -> str:
    if module in ("skipdecode.cli", "skipdecode.__main__"):
        return "cli"
    for name in ("evaluation", "training"):
        if module == f"skipdecode.{name}" or module.startswith(f"skipdecode.{name}."):
            return name
    return "runtime"


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__.py)."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, known) -> set[str]:
    """The package's modules that `name` imports anywhere in its file, inside functions too; relative imports
    resolved; `from a import b` counts as module a.b where that is a module, else as a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    return {t for t in targets if t in known and t != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = package_modules(root)
    return {name: imported(name, path, known) for name, path in known.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (its modules, the first again at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a module imports a layer above its own."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if LAYERS.index(layer(b)) > LAYERS.index(layer(a)))


def test_the_walk_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert {"skipdecode.schedule", "skipdecode.transformer", "skipdecode.cache"} <= graph["skipdecode.engine"]
    assert "skipdecode.adapters.lora" in graph["skipdecode.engine"]  # `from .adapters import ...` inside Engine.load
    assert "skipdecode.evaluation.general" in graph["skipdecode.evaluation.evaluate"]  # `eval --prompts`, lazily
    assert "skipdecode.schedule" in graph["skipdecode.training.train"]  # `from ..schedule import ...`
    assert {"skipdecode.training.train", "skipdecode.evaluation.evaluate"} <= graph["skipdecode.cli"]


def test_no_module_imports_in_a_circle():
    assert cycle(import_graph()) is None
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_each_layer_imports_only_the_layers_below_it():
    assert upward(import_graph()) == []
    assert upward({"skipdecode.adapters.lora": {"skipdecode.training.train"}, "skipdecode.training.train": set()}) \
        == [("skipdecode.adapters.lora", "skipdecode.training.train")]


def test_the_package_imports_no_module_by_a_name_the_walk_cannot_see():
    """importlib.import_module("skipdecode...") or __import__ would hide an edge from the walk above."""
    for name, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                assert not called.endswith(("import_module", "__import__")), f"{name}: {ast.unparse(node)}"


def test_every_package_folder_ships_in_the_wheel():
    """pyproject.toml lists the packages a wheel (the Docker image, a Space's `pip install .`) holds: each folder
    of the library with an __init__.py, or an install without the editable checkout cannot import it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / PACKAGE).rglob("__init__.py")}
    assert folders == listed


def test_the_library_knows_nothing_of_the_app():
    for name, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n == "app" or n.startswith("app.") for n in names), name


DECODE_AS_THE_APP_DOES = """
import json, sys
from skipdecode import Engine
from skipdecode.adapters.lora import pick_adapter, trained_schedule
from skipdecode.adapters.router import INSTRUCTION

base, speedup = sys.argv[1], 2.0
prompt = INSTRUCTION + "name[The Eagle], eatType[coffee shop], food[French], area[riverside]"
info, why = pick_adapter(speedup, base, prompt)
engine = Engine.load(base, adapter=info)
schedule = trained_schedule(info, speedup, engine.num_layers)
result = engine.generate([prompt], schedule, max_new_tokens=6)
print(json.dumps({"adapter": info and info.name, "why": why, "merged": engine.adapter is not None,
                  "horizon": schedule.horizon, "tokens": len(result.token_ids[0]),
                  "layers": result.trace.average_layers, "modules": sorted(sys.modules)}))
"""


def test_decoding_with_an_adapter_loads_no_training_or_evaluation_code(tmp_path):
    """The app's path to a decoded prompt (pick_adapter, Engine.load, trained_schedule, generate), in a fresh
    interpreter: the adapter is picked, merged and decoded on the plan its record holds, and not one module
    of skipdecode.training or skipdecode.evaluation is loaded on the way."""
    base = tiny_checkpoint(tmp_path / "tiny", layers=6)
    tiny_adapter(tmp_path / "adapters" / "tiny-2x", base)
    env = {**os.environ, "SKIPDECODE_ADAPTERS": str(tmp_path / "adapters")}
    done = subprocess.run([sys.executable, "-c", DECODE_AS_THE_APP_DOES, str(base)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout.splitlines()[-1])
    assert run["adapter"] == "tiny-2x" and run["merged"], run["why"]
    assert run["horizon"] == 12 and run["tokens"] >= 1  # the record's horizon, not a default
    assert run["layers"] < 6  # decoded skipping, on the adapter's plan
    assert "skipdecode.engine" in run["modules"] and "peft" in run["modules"]
    assert [m for m in run["modules"] if m.startswith(UPPER)] == []
