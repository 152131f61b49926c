#!/usr/bin/env bash
# Who: a maintainer, here, before scripts/gpu_run.sh: what that call carries to the GPU machine.
# What scripts/gpu_run.sh needs on a GPU machine, made here (needs `make install` and ../shared):
#   bash scripts/gpu_pack.sh
# .gpu/  wheels of the pinned versions the GPU image lacks, the default model's config and tokenizer, the
#        E2E test and dev CSVs, the chat prompt pool, the GGUF's sha256 (26 MB: it travels with `carry`)
# .gpu-pieces/1/ 2/ ...  the bundled GGUF in as many pieces as it takes for one to travel with the tracked
#                 tree in a call (64 MiB a call), one carried per call
# All are ignored (.git/info/exclude). Python 3.12 wheels: the GPU image's python.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
for d in .gpu .gpu2 .gpu-pieces; do grep -qxF "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
mkdir -p .gpu/whl .gpu/model .gpu/e2e .gpu/prompts
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl \
  transformers==5.23.0 tokenizers==0.23.3 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 \
  truststore==0.10.5 peft==0.21.2 nltk==3.10.4 gguf==0.19.0
ls .gpu/whl/rouge_score-*.whl >/dev/null 2>&1 || $py -m pip wheel -q --no-deps -w .gpu/whl rouge-score==0.1.2
model=$($py -c "import skipdecode.models as m; print(m.cached_default())")
cp "$model"/{chat_template.jinja,config.json,generation_config.json,tokenizer.json,tokenizer_config.json} .gpu/model/
cp ../shared/data/e2e/{testset_w_refs.csv,devset.csv,trainset.csv} .gpu/e2e/
cp ../shared/data/prompts/permissive_chat_prompts.jsonl .gpu/prompts/
gguf=$($py -c "import skipdecode.models as m; print(m.bundled_gguf())")
sha256sum "$gguf" | cut -c1-64 > .gpu/gguf.sha256
tree=$(git ls-files -z | xargs -0 stat -c %s | awk "{s += \$1} END {print s}")
room=$((62 * 1024 * 1024 - tree))  # what a call can carry beside the tree, with 2 MiB to spare
pieces=$(( ($(stat -c %s "$gguf") + room - 1) / room ))
rm -rf .gpu-pieces && split -n "$pieces" -a 2 -d "$gguf" /tmp/gguf.part
for i in $(seq 1 "$pieces"); do mkdir -p .gpu-pieces/$i; mv /tmp/gguf.part$(printf %02d $((i - 1))) .gpu-pieces/$i/part; done
echo "$pieces pieces"; du -sh .gpu .gpu-pieces/*
