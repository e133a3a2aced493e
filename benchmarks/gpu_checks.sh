#!/usr/bin/env bash
# Every check that needs a GPU, in one command (a lent `device` machine or any CUDA node):
#   bash benchmarks/gpu_carry.sh            # here, once: builds .gpu-carry/ (needs pip)
#   bash benchmarks/gpu_checks.sh [OUT_DIR] # there: with .gpu-carry/ carried along
# 1. tests/test_gpu.py: fused AdamW vs the CPU update, the trainer on CUDA (fp32 and bf16) vs CPU.
# 2. benchmarks/pretrain_step_time.py for bert-base, 512 tokens, 32 per device, bf16: step time
#    of each objective vs MLM, samples/s, MFU and the projected paper schedule (eager, then
#    torch.compile for MLM and COSTA).
# Output goes to OUT_DIR (default: $OUT, else results/gpu_checks); record it in RESULTS.md.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-results/gpu_checks}}
mkdir -p "$out"
if [ -d .gpu-carry ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu-site .gpu-carry/wheels/*.whl || exit 1
    export PYTHONPATH=/tmp/gpu-site:$PWD/.gpu-carry/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/workflow:${PYTHONPATH:-} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', \
torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$out/machine.txt"
status=0
python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" tests/test_gpu.py 2>&1 \
    | tee "$out/tests.txt" || status=1
bench="python3 benchmarks/pretrain_step_time.py --device cuda --arch bert-base --max-len 512 \
--batch 32 --steps 20 --warmup 5 --peak-tflops 989"
$bench 2>&1 | grep -v "it/s" | tee "$out/step_time.txt" || status=1
$bench --compile --objectives mlm costa 2>&1 | grep -v "it/s" | tee "$out/step_time_compiled.txt" \
    || status=1
exit $status
