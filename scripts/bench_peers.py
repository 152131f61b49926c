# Who: `make bench-peers`, on a machine that will run `skipdecode bench` with its llama.cpp row.
"""llama.cpp for the bench, built for this CPU: llama-cpp-python (the bench's llama.cpp row) and llama.cpp's
own `llama-server` and `llama-batched-bench` (the serving and batch comparisons), from one source.

    python scripts/bench_peers.py                # both, into the running interpreter's virtual environment
    python scripts/bench_peers.py --jobs 2       # fewer compiler processes
    python scripts/bench_peers.py --print-args   # only the CMAKE_ARGS this CPU gets, and why

CMAKE_ARGS come from skipdecode/evaluation/amx.py: `-DGGML_NATIVE=ON` where the kernel grants AMX or the CPU
has none, else the CPU's ISA flags one by one with AMX off (a native build crashes there at its first
forward pass). pip runs with --no-cache-dir, so that a wheel built earlier with other flags is never reused.
The two programs come from the llama.cpp source vendored in the same llama-cpp-python sdist
(requirements-peers.txt pins its version), built statically with cmake into <venv>/llama.cpp/bin; the
sdist and the build folder stay beside it (<venv>/llama.cpp/src, build) for a rebuild. Never part of `make
install` or `make test`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from skipdecode.evaluation.amx import amx_granted, cmake_args, cpu_flags  # noqa: E402

REQUIREMENTS = ROOT / "requirements-peers.txt"
PACKAGE = "llama-cpp-python"
TOOLS = ("llama-server", "llama-batched-bench")


def pinned_version(requirements: Path = REQUIREMENTS) -> str:
    """The llama-cpp-python version requirements-peers.txt pins (`==`)."""
    for line in requirements.read_text().splitlines():
        name, _, version = line.split("#")[0].strip().partition("==")
        if name.strip().lower() == PACKAGE:
            return version.strip()
    raise SystemExit(f"{requirements} pins no {PACKAGE}==VERSION")


def why(flags: set[str], granted: bool) -> str:
    """One line: what the CPU and the kernel say about AMX."""
    if "amx_tile" not in flags:
        return "this CPU has no AMX: a native build"
    if granted:
        return "this CPU has AMX and the kernel grants it: a native build"
    return "this CPU advertises AMX and the kernel does not grant it: its other ISA flags, AMX off"


def run(command: list[str], **kwargs) -> None:
    print("+ " + " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def install_bindings(python: str, args: str, jobs: int) -> None:
    """llama-cpp-python compiled with `args`: rebuilt even when installed (--force-reinstall, no cache);
    then its dependencies, which the first call leaves out."""
    env = {**os.environ, "CMAKE_ARGS": args, "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    pip = [python, "-m", "pip", "install", "--no-cache-dir"]
    run([*pip, "--force-reinstall", "--no-deps", "-r", str(REQUIREMENTS)], env=env)
    run([*pip, "-r", str(REQUIREMENTS)], env=env)


def source(python: str, version: str, home: Path) -> Path:
    """llama.cpp's source as vendored in the llama-cpp-python sdist of `version`, unpacked under `home`."""
    unpacked = home / "src" / f"{PACKAGE.replace('-', '_')}-{version}"
    if not (unpacked / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory() as download:
            run([python, "-m", "pip", "download", "--no-cache-dir", "--no-binary", ":all:", "--no-deps",
                 "--dest", download, f"{PACKAGE}=={version}"])
            sdist = next(Path(download).glob("*.tar.gz"))
            with tarfile.open(sdist) as archive:
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Pythons that have it
                archive.extractall(home / "src", **safe)
    return unpacked / "vendor" / "llama.cpp"


def build_tools(llama: Path, args: str, jobs: int, home: Path) -> Path:
    """llama-server and llama-batched-bench, static, copied into home/bin."""
    build, bin_dir = home / "build", home / "bin"
    run(["cmake", "-S", str(llama), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
         "-DLLAMA_CURL=OFF", *args.split()])
    run(["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs), "--target", *TOOLS])
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        shutil.copy2(build / "bin" / tool, bin_dir / tool)
    return bin_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the virtual environment's interpreter to install into (default: this one)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes")
    parser.add_argument("--print-args", action="store_true", help="print the CMAKE_ARGS and why; build nothing")
    parser.add_argument("--no-tools", action="store_true", help="only llama-cpp-python")
    options = parser.parse_args(argv)
    flags, granted = cpu_flags(), amx_granted()
    args = cmake_args(flags, granted)
    print(f"{why(flags, granted)}\nCMAKE_ARGS={args}", flush=True)
    if options.print_args:
        return 0
    # the virtual environment of that interpreter (not resolved: a venv's python is a link to the base one)
    home = Path(options.python).absolute().parent.parent / "llama.cpp"
    install_bindings(options.python, args, options.jobs)
    if not options.no_tools:
        bin_dir = build_tools(source(options.python, pinned_version(), home), args, options.jobs, home)
        for tool in TOOLS:
            run([str(bin_dir / tool), "--version"])
        print(f"llama.cpp's programs: {bin_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
