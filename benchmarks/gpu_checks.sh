#!/usr/bin/env bash
# Every check that needs a GPU, in one command (a lent `device` machine or any CUDA node):
#   bash benchmarks/gpu_carry.sh                 # here, once: builds .gpu-carry/ (needs pip)
#   GPU_CHECKS_SECONDS=560 bash benchmarks/gpu_checks.sh [OUT_DIR] [PART..]   # there
# A lent machine gives a session 15 device-minutes in all, its start included, and a command 10:
# so one call, `carry: [".gpu-carry"]`, `timeout_s` 600, GPU_CHECKS_SECONDS a little under it, and
# if time is left a short second call (`second`, ~200 s). The parts run in order, each under its
# cap and what is left of GPU_CHECKS_SECONDS (none: no budget); a part with under 15 s left is
# skipped (exit 124), a part cut short keeps what it printed, and machine.txt ends with each part's
# exit status (124: cut or skipped) and end time. The default parts' caps sum to 560 s, so with
# GPU_CHECKS_SECONDS=560 every one starts; `second`'s sum to 200 s
# (tests/test_benchmark_tools.py checks both, from GPU_CHECKS_PLAN=1's listing of the caps).
#   [PART..] empty or `first`: tests (gloo beside) trainer_more compiled_more        (560 s)
#   `second`: steps attn dense                                                      (200 s)
#   `all`: every part (a CUDA node with no budget), the order below.
# GPU_CHECKS_PLAN=1 prints the parts and caps a call would run, and runs nothing.
# Two runs so far, both on an H200 (benchmarks/gpu_runs/: 2026-11-26, 2026-11-28; RESULTS.md).
# The presets hold what the second left open. [cap in s; what it took in the second run]
#   tests     [150; 124 for 25 tests on 8 xdist workers] tests/test_gpu.py on pytest-xdist workers
#             where xdist is installed: fused AdamW vs the CPU update, the trainer on CUDA (fp32 and
#             bf16, padded and unpadded) vs CPU, the trainer's waits for the GPU per step (one
#             expected), flash attention under unpad (and one compiled graph), sdpa's and cuDNN's
#             attention, the contrast cache, fine-tuning's steps on CUDA vs CPU and their waits,
#             encoding through a real out-of-memory error, fine-tuning's DDP handing the encoder
#             its pinned host inputs (one-process NCCL; new since the second run: 9fb8fdd). The
#             second run failed two, both fixed since (encoding on CUDA: e1ae105; the cuDNN test's
#             premise: 5b410e6).
#   trainer_more [210; cut at 70 after COSTA unpadded] the `trainer` part's benchmark with MLM
#             under compile: true first (the compiled step was 20-26% faster: whether the real
#             trainer gets it, with its variable batch shapes, decides paper.yaml's `compile`),
#             then MLM with --profile (where its step loses ~9 ms against the model step's: the
#             host's time per region, the GPU's idle time and what the host did meanwhile), then
#             MLM with --read-at-once (each step read at its end, as before a step's values were
#             taken after the next is queued: against the --profile row, what that lag buys),
#             then CPDAE with 2 micro-batches a step (its gathered contrast cached: the cache's
#             cost); appended to trainer.txt.
#   compiled_more [200; cut at 90 during BoW's compilation] the `steps` part's benchmark under
#             torch.compile for MLM, BoW, MLM on 2x rows and CPDAE in one process (each target a
#             ratio within it; each compilation ~40 s); appended to step_time_compiled.txt.
#   steps     [90; 37] benchmarks/pretrain_step_time.py for bert-base, 512 tokens, 32 per device,
#             bf16, 10 timed steps after 3: step time of the paper's objectives vs MLM (and MLM on
#             two views, CPDAE's rows; MLM with cuDNN's attention first, attn_implementation
#             sdpa_cudnn; BoW at its recipe's 30% whole-word masking and at MLM's 15%), samples/s,
#             MFU, the projected paper schedule, the host synchronisations in one step of each (sync
#             debug mode) and a profiled step of each: its kernels, the GPU's busy share of the step
#             (under 1: it waited for the host) and the costliest kernels; the profiles come after
#             every objective is timed (CUPTI stays loaded after one and, it seems, slowed the
#             objectives timed after it in the second run: BoW 1.21x of MLM there), then MLM is
#             timed again to show what they cost. Not --ops: the operations a step dispatches are
#             the same on any device and are counted on the CPU (RESULTS.md). The baselines' rows
#             (condenser ... ar_decoder) are in the first run's step_time.txt.
#   attn      [30; 11] benchmarks/attention_kernels.py: bert-base's attention (32 x 512, padding as
#             the trainer's chunks have it, dropout on) through the memory-efficient kernel, cuDNN's,
#             torch's choice (cuDNN's on an H200), flash without a mask (the bound) and flash varlen
#             over the real tokens (unpad; re-timed: its row timed a boolean gather beside the kernel
#             until 7af0b7d), each checked against float64; appended to step_time.txt.
#   dense     [80; 512 tokens ~60 in the first run] benchmarks/encode_and_search.py: bert-base
#             encoding at 512 tokens (bf16, as the stage runs: tokenised ahead on
#             encode.gpu_tokenizer_threads(), never yet timed, and in turn), exact search over
#             1M x 768 vectors (faiss-gpu where installed; torch GEMM + top-k) against the
#             same-shape cuBLAS GEMM in fp32 and bf16.
#   Not run yet, in `all` only (new since the second run; ask for it by name: `gcache`):
#   gcache    [120; not run] benchmarks/gradient_cache.py --device cuda: fine-tuning's gradient
#             cache on bert-base (random weights) under bf16 autocast (finetune.precision auto),
#             32 / 256 tokens, 16 passages a query. First bow.yaml's NQ / TriviaQA shape, a
#             contrast set of 64 queries (1,024 passages) with cache_chunk 8 (bow.yaml's) and 16:
#             GPU time a step and peak GPU memory (max_memory_allocated); its uncached row is
#             estimated at ~200 GiB (ARCHITECTURE.md), so "out of memory" is the expected answer
#             there. Then 16 queries (256 passages), uncached beside cache_chunk 4 and 8 (8: the
#             BoW chunk's own pass shape), where the uncached step fits: the time ratio (FLOP
#             estimate 4/3) and memory ratio at the CPU table's fractions (RESULTS.md). Cap:
#             ~55 s estimated (two processes, each ~20 s of imports, CUDA and a random bert-base,
#             then 6 rounds of 2-3 steps of ~0.1-0.5 s and a memory step a row), 120 with room for
#             a slower start; appended to step_time.txt (a lent machine sends back 8 files, and
#             `all` already writes 8).
#   Done in the second run, in `all` only:
#   compiled  [120; 98] the `steps` benchmark under torch.compile for MLM and COSTA.
#   js        [30; 11] benchmarks/cpdae_js.py: CPDAE's JS term (its own backward) against the
#             formula through autograd, at one GPU's shapes and paper.yaml's, with peak memory.
#   unpadded  [40; 26] the `steps` benchmark with unpad: true for the paper's four objectives on
#             full rows (no padding to skip): flash's variable-length op against the padded kernel.
#   trainer   [175; 139 without --profile] benchmarks/trainer_throughput.py: the real trainer
#             (data loader, workers, loop) on bert-base for 15 steps of paper.yaml's micro-batch per
#             objective (5 untimed), on the chunks in .gpu-carry/corpus, the four objectives padded
#             (each profiled after its timed steps), then MLM with unpad: true; its samples/s and
#             its share of time waiting for input beside the model step's.
#   gloo      [240; stopped with the tests at 124, 140 passed] the multi-process trainer and
#             launcher tests on the machine's CPU cores (gloo; CUDA hidden: two ranks cannot share
#             its one GPU under NCCL), each test's name and outcome printed as it ends. Asked for
#             with `tests`, it runs beside them on 4 of the other cores (it needs no GPU time) and is
#             stopped when they end, before any timing starts. The second run's one failure was the
#             test's (it gave its workers the GPU; fa87c9d).
# Output goes to OUT_DIR (default: $OUT, else results/gpu_checks), at most 8 files (what a lent
# machine sends back); record it in RESULTS.md.
# Nothing it imports may need a package the lent machine's image lacks (polars, faiss, snakemake,
# pyserini ...): tests/test_environments.py checks that, with those imports blocked.
# tests/test_benchmark_tools.py runs this script against a stand-in python3: every part in order,
# each benchmark call parsed by the benchmark's own command line, the budget, the gloo tests
# stopped, the presets' caps against their budgets, the files each leaves.
set -uo pipefail
cd "$(dirname "$0")/.."
# Each part's cap (s): what the header says it takes, with some room. A preset's caps must sum
# to at most its call's budget, or its last parts are cut or never start (the first run's were).
declare -A cap=([tests]=150 [compiled]=120 [steps]=90 [js]=30 [attn]=30 [trainer]=175
    [unpadded]=40 [trainer_more]=210 [compiled_more]=200 [dense]=80 [gcache]=120 [gloo]=240)
# What the second run (2026-11-28) left open first: the fixes' GPU tests, the compiled trainer
# and where the trainer's step loses time, the compiled objectives' ratios within one process;
# then the eager steps re-timed with the profiles after them, the varlen kernel re-timed, and
# encoding (broken on a GPU until e1ae105).
first="tests trainer_more compiled_more gloo"
second="steps attn dense"
all="tests compiled steps js attn gcache unpadded trainer dense compiled_more trainer_more gloo"
out=${1:-${OUT:-results/gpu_checks}}
parts=${*:2}
case $parts in
"" | first) parts=$first ;;
second) parts=$second ;;
all) parts=$all ;;
esac
beside=""  # gloo beside the tests: in its own process group, stopped when they end
[[ " $parts " == *" tests "* && " $parts " == *" gloo "* ]] && beside=yes
if [ -n "${GPU_CHECKS_PLAN:-}" ]; then  # what would run, and the budget it needs
    total=0
    for part in $parts; do
        seconds=${cap[$part]:-0}
        [[ $part == gloo && -n $beside ]] && seconds=0  # on the CPU, while the tests run
        echo "$part $seconds"
        total=$((total + seconds))
    done
    echo "total $total"
    exit 0
fi
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
    # The image's packages, not our pins (its torch 2.11 lacked an option the launcher passed):
    # what a failure there may owe to a version.
    python3 -c "import importlib.metadata as m
for p in ('numpy', 'pyarrow', 'tokenizers', 'huggingface_hub', 'triton', 'pytest-xdist'):
    try: print(p, m.version(p), end='; ')
    except m.PackageNotFoundError: print(p, 'none', end='; ')
print()"
} 2>&1 | tee "$out/machine.txt"
started=$SECONDS
budget=${GPU_CHECKS_SECONDS:-0}
# pytest spread over worker processes where pytest-xdist is installed (one GPU shared: the tests
# are checks, not timings); else in one process.
xdist() { python3 -c "import xdist" 2>/dev/null && echo "-n $1 --dist $2"; }

# capped SECONDS COMMAND...: the command under the smaller of its cap and what is left of the
# budget; its status is the command's (124 when cut).
capped() {
    local limit=$1 left
    shift
    if [ "$budget" -gt 0 ]; then
        left=$((budget - (SECONDS - started)))
        [ "$left" -lt 15 ] && return 124
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    timeout -k 5 "$limit" "$@"
}

# The gloo tests on the CPU (CUDA hidden), each test's name and outcome printed as it ends;
# spread test by test (two files: by file, one worker would run nearly all of them).
gloo_tests() {
    # shellcheck disable=SC2046  # the options are words
    CUDA_VISIBLE_DEVICES='' python3 -m pytest -v -p no:cacheprovider -o addopts="-ra" \
        $(xdist 4 load) tests/test_pretrain_train.py tests/test_launch.py > "$out/gloo.txt" 2>&1
}
export -f gloo_tests xdist  # run by `bash -c` (beside the tests: in its own process group)
export out

status=0
for part in $parts; do
    case $part in
    tests)
        gloo_pid=""
        if [ -n "$beside" ]; then
            setsid bash -c gloo_tests &
            gloo_pid=$!
        fi
        # shellcheck disable=SC2046  # the options are words
        # --durations: which tests take the part's time (125 s on the H200, more than its parts'
        # checks need), so that a later run can spend it on the timings instead.
        capped "${cap[tests]}" python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" \
            --durations=15 \
            $(xdist 8 load) tests/test_gpu.py 2>&1 | tee "$out/tests.txt"
        code=${PIPESTATUS[0]}
        if [ -n "$gloo_pid" ]; then
            if kill -0 "$gloo_pid" 2>/dev/null; then
                kill -TERM -- "-$gloo_pid" 2>/dev/null
                gloo_code=124
            else
                wait "$gloo_pid"
                gloo_code=$?
            fi
            wait "$gloo_pid" 2>/dev/null
            echo "gloo (beside the tests): exit $gloo_code at $((SECONDS - started)) s" \
                | tee -a "$out/machine.txt"
            [ "$gloo_code" -eq 0 ] || status=1
        fi
        (exit "$code") ;;
    steps|unpadded|compiled|compiled_more)
        bench=(python3 benchmarks/pretrain_step_time.py --device cuda --arch bert-base
            --max-len 512 --batch 32 --steps 10 --warmup 3 --peak-tflops 989 --profile)
        file=step_time_compiled.txt write=(tee)
        case $part in
        steps) bench+=(--objectives mlm mlm_2x mlm_cudnn costa cpdae cpdae_r bow bow_15)
            file=step_time.txt ;;
        unpadded) bench+=(--unpad --objectives mlm costa cpdae bow) file=step_time_unpadded.txt ;;
        compiled) bench+=(--compile --objectives mlm costa) ;;
        # MLM and MLM on 2x rows beside BoW and CPDAE: each target is a ratio within one process.
        compiled_more) bench+=(--compile --objectives mlm bow mlm_2x cpdae) write=(tee -a) ;;
        esac
        capped "${cap[$part]}" "${bench[@]}" 2>&1 | grep --line-buffered -v "it/s" \
            | "${write[@]}" "$out/$file" ;;
    js)
        capped "${cap[js]}" python3 benchmarks/cpdae_js.py --device cuda 2>&1 \
            | tee -a "$out/step_time.txt" ;;
    attn)
        capped "${cap[attn]}" python3 benchmarks/attention_kernels.py --device cuda 2>&1 \
            | tee -a "$out/step_time.txt" ;;
    gcache)
        # bow.yaml's contrast set (its uncached step expected out of memory), then one small
        # enough for the uncached step: the cache's time ratio. A failing shape: the next runs.
        capped "${cap[gcache]}" bash -c 'code=0; for shape in "64 --chunks 8 16" "16"; do
            # shellcheck disable=SC2086  # the options are words
            python3 benchmarks/gradient_cache.py --device cuda --arch bert-base \
                --group-size 16 --q-len 32 --p-len 256 --steps 5 --micro-batch $shape || code=1
        done; exit $code' 2>&1 | tee -a "$out/step_time.txt" ;;
    trainer|trainer_more)
        # One variant a line: a failing variant is recorded and the next still runs.
        if [ "$part" = trainer ]; then
            : > "$out/trainer.txt"
            variants="--objectives mlm costa bow cpdae --profile
--objectives mlm --unpad"
        else
            variants="--objectives mlm --compile
--objectives mlm --profile
--objectives mlm --read-at-once
--objectives cpdae --accumulate 2"
        fi
        capped "${cap[$part]}" bash -c 'code=0; while read -r variant; do
            # shellcheck disable=SC2086  # the options are words
            python3 benchmarks/trainer_throughput.py run --corpus .gpu-carry/corpus \
                --arch bert-base --steps 15 $variant < /dev/null || code=1
        done <<< "$1"; exit $code' _ "$variants" 2>&1 | grep --line-buffered -v "it/s" \
            | tee -a "$out/trainer.txt" ;;
    dense)
        capped "${cap[dense]}" python3 benchmarks/encode_and_search.py --device cuda \
            --archs bert-base --p-lens 512 --docs 8192 --batch 512 --corpus 1000000 --dim 768 \
            --queries 8192 --repeats 3 2>&1 | grep --line-buffered -v "it/s" \
            | tee "$out/dense.txt" ;;
    gloo)
        [ -n "$beside" ] && continue  # ran beside the tests
        capped "${cap[gloo]}" bash -c gloo_tests; (exit $?) ;;
    *) echo "unknown part: $part (${all// /, }; presets: first, second, all)" >&2
        exit 2 ;;
    esac
    code=${PIPESTATUS[0]}
    echo "$part: exit $code at $((SECONDS - started)) s" | tee -a "$out/machine.txt"
    [ "$code" -eq 0 ] || status=1
done
exit $status
