#!/usr/bin/env bash
# GPU check, run as one command on a lent GPU machine (see the tool library's device README).
# That machine has torch, lightning, transformers, tensorboard, but no network and no vllm.
# Prepare here first:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d .whl jsonargparse docstring_parser typeshed_client platformdirs gguf bm25s \
#       math-verify latex2sympy2_extended antlr4-python3-runtime      (pure-Python deps it lacks)
#   mkdir -p .devcache/models && cp -r ~/.cache/drmas/models/tiny-random-v1 .devcache/models/
# and run with carry [".whl", ".devcache"]. It trains the recipes for 2 iterations on the GPU
# (tiny random model, HF generate, bf16-mixed) and writes logs and a summary to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .devcache ] && export DRMAS_CACHE_DIR="$PWD/.devcache"

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, lightning, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'lightning', lightning.__version__, 'transformers', transformers.__version__)"
} > "$OUT/summary.txt" 2>&1

COMMON=(--config configs/tiny_random.yaml --trainer.accelerator gpu --trainer.devices 1 --model.engine hf
        --model.entropy_coef 0.01 --trainer.logger.init_args.save_dir /tmp/runs)
run() {
    local name=$1; shift
    local start=$SECONDS
    python3 "$@" > "$OUT/$name.log" 2>&1
    echo "$name: rc=$? in $((SECONDS - start)) s" >> "$OUT/summary.txt"
}
run math_solver_verifier recipes/math.py fit "${COMMON[@]}"
run math_tool_team_tree recipes/math.py fit "${COMMON[@]}" --data.workflow ReasonerToolUserWorkflow \
    --data.workflow.init_args.turns 2 --data.sampling tree --data.estimator at_grpo
run search recipes/search.py fit "${COMMON[@]}"

# what each run logged, to compare with the CPU runs
python3 - >> "$OUT/summary.txt" 2>&1 <<'PY'
import glob
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
for f in sorted(glob.glob("/tmp/runs/*/version_*/events.out.tfevents.*")):
    ea = EventAccumulator(f, size_guidance={"scalars": 0})
    ea.Reload()
    print("==", f.split("/")[3], f.split("/")[4])
    for tag in sorted(ea.Tags()["scalars"]):
        if tag.startswith(("train/", "rollout/success", "val/avg", "time/")) and not tag.endswith(("_low", "_high")):
            print(f"  {tag}: " + ", ".join(f"{e.step}:{e.value:.4g}" for e in ea.Scalars(tag)))
PY
cat "$OUT/summary.txt"
