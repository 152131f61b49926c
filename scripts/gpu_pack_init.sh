#!/usr/bin/env bash
# Who: a maintainer, here, before a scripts/gpu_run.sh general call whose runs start from an adapter (--init).
# An adapter too big to travel with the tree in one device call (a rank-64 one: 39 MB in float32), made
# into two pieces that `--init /tmp/init/NAME` lines of experiments/gpu_general_runs.txt can start from:
#   bash scripts/gpu_pack_init.sh checkpoints/runs/general-3x-N64s300
# writes the ignored .gpu-init/1/ (the first half of the weights, the adapter's json files, their sha256)
# and .gpu-init/2/ (the second half), and prints the two calls that join them on the warm machine, one
# carrying each folder, after the GGUF's pieces and before the `general` call (docs/research/general-adapters.md).
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:?usage: gpu_pack_init.sh ADAPTER_FOLDER}
name=$(basename "$run")
grep -qxF "/.gpu-init/" .git/info/exclude 2>/dev/null || echo "/.gpu-init/" >> .git/info/exclude
rm -rf .gpu-init && mkdir -p .gpu-init/1 .gpu-init/2
split -n 2 -a 1 -d "$run/adapter_model.safetensors" /tmp/gpu-init.part
mv /tmp/gpu-init.part0 .gpu-init/1/part && mv /tmp/gpu-init.part1 .gpu-init/2/part
cp "$run"/*.json .gpu-init/1/
sha256sum "$run/adapter_model.safetensors" | cut -c1-64 > .gpu-init/1/sha256
du -sh .gpu-init/1 .gpu-init/2
cat <<EOF
call 1, carry [".gpu-init/1"]:  mkdir -p /tmp/p && rm -rf /tmp/p/1 && cp -r .gpu-init/1 /tmp/p/
call 2, carry [".gpu-init/2"]:  d=/tmp/init/$name && mkdir -p \$d && cat /tmp/p/1/part .gpu-init/2/part > \$d/adapter_model.safetensors && cp /tmp/p/1/*.json \$d/ && [[ \$(sha256sum \$d/adapter_model.safetensors | cut -c1-64) == \$(cat /tmp/p/1/sha256) ]] && echo joined
EOF
