#!/usr/bin/env bash
# Every check that needs a GPU, in one command (a lent `device` machine or any CUDA node):
#   bash benchmarks/gpu_carry.sh                     # here, once: builds .gpu-carry/ (needs pip)
#   bash benchmarks/gpu_checks.sh [OUT_DIR] [PART..] # there: with .gpu-carry/ carried along
# Parts, in this order (default: all). A lent machine's 10-minute command limit takes five calls,
# most needed first (a session's 30 device-minutes may not reach the last): "tests" (~7 min:
# ~30 trainer runs, each a fresh process), "steps unpadded", "trainer dense", "compiled", "gloo".
#   tests     tests/test_gpu.py: fused AdamW vs the CPU update, the trainer on CUDA (fp32 and
#             bf16, padded and unpadded) vs CPU, the trainer's waits for the GPU per step (one
#             expected), flash attention under unpad (and one compiled graph), fine-tuning's
#             steps on CUDA vs CPU and their waits, encoding through a real out-of-memory error.
#   steps     benchmarks/pretrain_step_time.py for bert-base, 512 tokens, 32 per device, bf16: step
#             time of each objective vs MLM, samples/s, MFU, the projected paper schedule, and the
#             host synchronisations in one step of each (torch's sync debug mode).
#   unpadded  the same with unpad: true, for the paper's four objectives: the batches have no
#             padding, so what it measures is attention over the real tokens alone (flash
#             attention's variable-length kernel, no mask) against the padded path's masked
#             (memory-efficient) kernel, and the row selections around the layers.
#   compiled  the same with torch.compile, for the paper's four objectives (each forward is one
#             graph: tests/test_pretrain_train.py).
#   dense     benchmarks/encode_and_search.py: bert-base encoding at 128 and 512 tokens (bf16, as
#             the stage runs), exact search over 1M x 768 vectors (faiss-gpu where installed; torch
#             GEMM + top-k) against the same-shape cuBLAS GEMM in fp32 and bf16.
#   trainer   benchmarks/trainer_throughput.py: the real trainer (data loader, workers, loop) on
#             bert-base for 30 steps of paper.yaml's micro-batch per objective, on the chunks in
#             .gpu-carry/corpus: its samples/s beside the model step's says whether the input
#             pipeline or the loop starves the GPU; MLM and COSTA again with unpad: true (the
#             layers skip the padding rows), MLM with compile: true.
#   gloo      the multi-process trainer and launcher tests on the machine's CPU cores (gloo; CUDA
#             hidden: two ranks cannot share its one GPU under NCCL).
# Output goes to OUT_DIR (default: $OUT, else results/gpu_checks); record it in RESULTS.md.
# Nothing it imports may need a package the lent machine's image lacks (polars, faiss, snakemake,
# pyserini ...): tests/test_environments.py checks that, with those imports blocked.
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
parts=${*:2}
parts=${parts:-tests steps unpadded compiled dense trainer gloo}
for part in $parts; do
    case $part in
    tests)
        python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" tests/test_gpu.py 2>&1 \
            | tee "$out/tests.txt" || status=1 ;;
    steps|unpadded|compiled)
        bench="python3 benchmarks/pretrain_step_time.py --device cuda --arch bert-base \
--max-len 512 --batch 32 --steps 20 --warmup 5 --peak-tflops 989"
        file=step_time.txt
        if [ "$part" = unpadded ]; then
            bench="$bench --unpad --objectives mlm costa cpdae bow" file=step_time_unpadded.txt
        elif [ "$part" = compiled ]; then
            bench="$bench --compile --objectives mlm costa cpdae bow" file=step_time_compiled.txt
        fi
        $bench 2>&1 | grep -v "it/s" | tee "$out/$file" || status=1 ;;
    dense)
        python3 benchmarks/encode_and_search.py --device cuda --archs bert-base \
            --p-lens 128 512 --docs 32768 --batch 512 --corpus 1000000 --dim 768 \
            --queries 8192 --repeats 3 2>&1 | tee "$out/dense.txt" || status=1 ;;
    trainer)
        : > "$out/trainer.txt"
        for variant in "--objectives mlm costa bow cpdae" "--objectives mlm costa --unpad" \
                "--objectives mlm --compile"; do
            python3 benchmarks/trainer_throughput.py run --corpus .gpu-carry/corpus \
                --arch bert-base --steps 30 $variant 2>&1 | grep -v "it/s" \
                | tee -a "$out/trainer.txt" || status=1
        done ;;
    gloo)
        CUDA_VISIBLE_DEVICES= python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" \
            tests/test_pretrain_train.py tests/test_launch.py 2>&1 | tee "$out/gloo.txt" \
            || status=1 ;;
    *) echo "unknown part: $part (tests, steps, unpadded, compiled, dense, trainer, gloo)" >&2
        exit 2 ;;
    esac
done
exit $status
