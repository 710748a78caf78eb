#!/usr/bin/env bash
# The GPU check: one prepared command on the lent GPU machine (see the device tool's README). That
# machine has torch, lightning, transformers and tensorboard, but no network, no vLLM and none of
# the pure-Python packages below; prepare them here first, then carry them:
#
#     bash scripts/device_prepare.sh            # .whl/ and .devcarry/, and the carry list and size
#     bash scripts/device_check.sh --dry-run    # here: everything a CPU can do, nothing trained
#     (device) bash scripts/device_check.sh     # with carry [".whl", ".devcarry"]
#
# Modes: (none) builds the random models, runs the tests marked `gpu` (tests/gpu), the GPU UUID
# check (scripts/device_uuid.py), the first-minute pass on the HF engine (in the trainer's thread,
# and in a process of its own that takes the weights through the host) and the update bench on
# SmolLM2-135M- and 1.7B-shaped models; `recipes` trains each recipe for 2 iterations on
# tiny-random (HF generate, bf16-mixed, one of them FSDP2); `8b` trains one iteration of an
# 8B-shaped policy unsharded. Every step's result goes to $OUT/summary.txt, its output to
# $OUT/steps.log; the script exits 1 when any step failed, and 2 (one line) without a CUDA device.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-check}
OUT=${OUT:-/tmp/device_check}
PY=${PYTHON:-python3}
MODELS=${DEVICE_MODELS:-/tmp/drmas_models}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if [ "$MODE" != "--dry-run" ] && ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "device_check: no CUDA device here ($PY: torch.cuda.is_available() is not True); run it on the lent GPU machine, or with --dry-run" >&2
    exit 2
fi
[ -d .whl ] && [ -d .devcarry/tokenizer ] || {
    echo "device_check: .whl/ or .devcarry/ is missing: run scripts/device_prepare.sh here and carry both" >&2; exit 2; }

SUMMARY=$OUT/summary.txt LOG=$OUT/steps.log
: > "$SUMMARY"; : > "$LOG"
failed=0 steps=0
step() {  # step NAME SECONDS COMMAND...: run it, bounded, and record its result
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "===== $name: $*" >> "$LOG"
    timeout "$limit" "$@" >> "$LOG" 2>&1
    rc=$?
    steps=$((steps + 1))
    if [ $rc -eq 0 ]; then echo "$name: ok in $((SECONDS - start)) s" >> "$SUMMARY"
    else failed=$((failed + 1)); echo "$name: FAILED (exit $rc$([ $rc -eq 124 ] && echo ", over ${limit} s")) in $((SECONDS - start)) s" >> "$SUMMARY"; fi
}
record() { "$@" >> "$SUMMARY" 2>&1; }

SITE=$(mktemp -d /tmp/drmas_site.XXXX)
step wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export DRMAS_CACHE_DIR=${DRMAS_CACHE_DIR:-/tmp/drmas_cache}
record "$PY" -c "import torch, lightning, transformers; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(), torch.version.cuda, '| lightning', lightning.__version__, '| transformers', transformers.__version__)"
command -v nvidia-smi > /dev/null && record nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

if [ "$MODE" = "--dry-run" ]; then  # here: the packaging, the models, the tests' collection
    step imports 120 "$PY" -c "import jsonargparse, docstring_parser, typeshed_client, platformdirs, gguf, bm25s, math_verify; import drmas.cli"
    step models 600 "$PY" scripts/device_models.py .devcarry/tokenizer "$MODELS" --shapes s135
    step gpu_tests_collect 300 "$PY" -m pytest -q -p no:cacheprovider --collect-only -m gpu tests/gpu
    step gpu_tests_skip 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/gpu -rs
elif [ "$MODE" = "check" ]; then
    step models 300 "$PY" scripts/device_models.py .devcarry/tokenizer "$MODELS"
    step gpu_tests 300 env DRMAS_DEVICE_MODELS="$MODELS" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/gpu -s
    grep -oE "(memory plan|fsdp|logprobs|cuda ipc|release) .*" "$LOG" >> "$SUMMARY"
    step uuid 120 "$PY" scripts/device_uuid.py
    grep -E "^cuda:[0-9]+ GPU-" "$LOG" >> "$SUMMARY"
    PASS=(--config configs/tiny_random.yaml --trainer.accelerator gpu --trainer.devices 1 --model.engine hf
          --model.preflight true --trainer.max_epochs 1 --data.validation.tasks 0
          --checkpoint.every_n_iterations 0 --trainer.logger.init_args.save_dir /tmp/runs_pass)
    step preflight_hf 240 "$PY" recipes/search.py fit "${PASS[@]}"
    step preflight_hf_process 240 "$PY" recipes/search.py fit "${PASS[@]}" --data.rollout.staleness 1
    grep -E "^first-minute pass: " "$LOG" >> "$SUMMARY"
    for shape in s135 s1700; do  # the update's tokens/s and model FLOP/s against the bf16 dense peak
        step "bench_$shape" 240 "$PY" bench/bench_iteration.py --device cuda --model "$MODELS/$shape" \
            --modes parallel --iterations 2 --peak-tflops 989 --peak-name "H100/H200 SXM bf16 dense"
    done
    grep "^update " "$LOG" >> "$SUMMARY"
elif [ "$MODE" = "recipes" ]; then
    step models 300 "$PY" scripts/device_models.py .devcarry/tokenizer "$MODELS" --shapes
    COMMON=(--config configs/tiny_random.yaml --trainer.accelerator gpu --trainer.devices 1 --model.engine hf
            --model.loss.entropy_coef 0.01 --trainer.logger.init_args.save_dir /tmp/runs)
    step math_solver_verifier 240 "$PY" recipes/math_team.py fit "${COMMON[@]}"
    step math_tool_team_tree 240 "$PY" recipes/math_team.py fit "${COMMON[@]}" --data.workflow math_reasoner_tool_user \
        --data.workflow.init_args.max_turns 2 --data.rollout.sampling tree --data.rollout.estimator at_grpo
    step search 240 "$PY" recipes/search.py fit "${COMMON[@]}"
    step math_fsdp 240 "$PY" recipes/math_team.py fit "${COMMON[@]}" --trainer.strategy fsdp
    step scalars 120 "$PY" scripts/device_scalars.py /tmp/runs
    sed -n '/===== scalars/,$p' "$LOG" | tail -n +2 >> "$SUMMARY"
elif [ "$MODE" = "8b" ]; then  # one H200 trains an 8B policy unsharded (fp32 weights + grads + AdamW ~131 GB)
    step models 300 "$PY" scripts/device_models.py .devcarry/tokenizer "$MODELS" --shapes q8b
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/8b_gpu_mem_mib.csv" &
    SMI=$!
    step math_8b 480 "$PY" recipes/math_team.py fit --config configs/qwen3_8b.yaml --model.engine hf \
        --trainer.devices 1 --trainer.strategy auto --model.policies.shared.model "$MODELS/q8b" \
        --trainer.max_epochs 1 --data.rollout.group_size 2 --data.rollout.tasks_per_iteration 2 --data.validation.tasks 0 \
        --checkpoint.every_n_iterations 0 --model.policies.shared.generation.train.max_new_tokens 64 \
        --hf_checkpoint.dirpath /tmp/hf8b --trainer.logger.init_args.save_dir /tmp/runs8b
    kill $SMI
    echo "8b peak GPU memory: $(sort -n "$OUT/8b_gpu_mem_mib.csv" | tail -1) MiB" >> "$SUMMARY"
else
    echo "device_check: unknown mode '$MODE' (none, recipes, 8b or --dry-run)" >&2; exit 2
fi

echo "device_check ($MODE): $((steps - failed)) of $steps steps ok" >> "$SUMMARY"
cat "$SUMMARY"
[ "$failed" -eq 0 ] || exit 1
