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
# `bash scripts/device_check.sh update` instead measures the update's share of the bf16 matmul
# peak on a SmolLM2-135M-shaped model (bench/bench_iteration.py; random weights, as the 540 MB
# of real ones cannot be carried).
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

# what each run logged, to compare with the CPU runs
summarise() {
    python3 - "$1" >> "$OUT/summary.txt" 2>&1 <<'PY'
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
for f in sorted(glob.glob(sys.argv[1] + "/*/version_*/events.out.tfevents.*")):
    ea = EventAccumulator(f, size_guidance={"scalars": 0})
    ea.Reload()
    print("==", "/".join(f.split("/")[-3:-1]))
    for tag in sorted(ea.Tags()["scalars"]):
        if tag.startswith(("train/", "rollout/success", "val/avg", "time/")) and not tag.endswith(("_low", "_high")):
            print(f"  {tag}: " + ", ".join(f"{e.step}:{e.value:.4g}" for e in ea.Scalars(tag)))
PY
}
run() {
    local name=$1; shift
    local start=$SECONDS
    python3 "$@" > "$OUT/$name.log" 2>&1
    echo "$name: rc=$? in $((SECONDS - start)) s" >> "$OUT/summary.txt"
}

if [ "${1:-}" = "update" ]; then
    python3 - > "$OUT/update_init.log" 2>&1 <<'PY'
import glob, shutil, torch
from transformers import AutoConfig, AutoModelForCausalLM
# SmolLM2-135M's shape (the embedded model), random weights, the SmolLM2 tokenizer of tiny-random
cfg = AutoConfig.for_model("llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                           num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                           max_position_embeddings=8192, rope_theta=1e5, tie_word_embeddings=True,
                           bos_token_id=1, eos_token_id=2, pad_token_id=2)
AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained("/tmp/s135")
for f in glob.glob(".devcache/models/tiny-random-v1/*token*") + glob.glob(".devcache/models/tiny-random-v1/chat_template*"):
    shutil.copy(f, "/tmp/s135/")
PY
    echo "update init: rc=$?" >> "$OUT/summary.txt"
    python3 bench/bench_iteration.py --device cuda --model /tmp/s135 >> "$OUT/summary.txt" 2>&1
    echo "bench_iteration: rc=$?" >> "$OUT/summary.txt"
fi

if [ "${1:-}" != "8b" ] && [ "${1:-}" != "update" ]; then
    COMMON=(--config configs/tiny_random.yaml --trainer.accelerator gpu --trainer.devices 1 --model.engine hf
            --model.loss.entropy_coef 0.01 --trainer.logger.init_args.save_dir /tmp/runs)
    run math_solver_verifier recipes/math.py fit "${COMMON[@]}"
    run math_tool_team_tree recipes/math.py fit "${COMMON[@]}" --data.workflow math_reasoner_tool_user \
        --data.workflow.init_args.max_turns 2 --data.sampling tree --data.estimator at_grpo
    run search recipes/search.py fit "${COMMON[@]}"
    # FSDP2 on CUDA with one rank: sharding code path, bf16 mixed precision, sharded checkpoint
    run math_fsdp recipes/math.py fit "${COMMON[@]}" --trainer.strategy fsdp

    summarise /tmp/runs
fi

# `bash scripts/device_check.sh 8b`: that one H200 trains an 8B policy unsharded (fp32 weights + grads + AdamW state ~131 GB, gradient checkpointing):
# a random Qwen3-8B-shaped model (no weights can be downloaded there), one iteration of the
# math recipe with that config, GPU memory sampled every 0.5 s.
if [ "${1:-}" = "8b" ]; then
    python3 - > "$OUT/8b_init.log" 2>&1 <<'PY'
import glob, shutil, time, torch
from transformers import AutoConfig, AutoModelForCausalLM
t = time.time()
cfg = AutoConfig.for_model("qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                           max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=False)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
print("params", sum(p.numel() for p in model.parameters()) / 1e9, "B")
model.save_pretrained("/tmp/q8b")
for f in glob.glob(".devcache/models/tiny-random-v1/*token*") + glob.glob(".devcache/models/tiny-random-v1/chat_template*"):
    shutil.copy(f, "/tmp/q8b/")
print("init + save", round(time.time() - t, 1), "s")
PY
    echo "8b init: rc=$?" >> "$OUT/summary.txt"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/8b_gpu_mem_mib.csv" &
    SMI=$!
    run math_8b recipes/math.py fit --config configs/qwen3_8b.yaml --model.engine hf \
        --trainer.devices 1 --trainer.strategy auto \
        --model.policies.shared.model /tmp/q8b --trainer.max_epochs 1 --data.group_size 2 \
        --data.tasks_per_iteration 2 --data.val_tasks 0 --checkpoint.save_last false \
        --model.policies.shared.train_generation.max_new_tokens 64 --hf_checkpoint.dirpath /tmp/hf8b \
        --trainer.logger.init_args.save_dir /tmp/runs8b
    kill $SMI
    echo "8b peak GPU memory: $(sort -n "$OUT/8b_gpu_mem_mib.csv" | tail -1) MiB" >> "$OUT/summary.txt"
    summarise /tmp/runs8b
    # one 8B micro-batch of 2 x (512 prompt + 4096 response) tokens, forward + backward, full
    # logits vs chunked response-only log-probs (GPU memory above the fp32 model)
    python3 bench/bench_logprobs.py --model /tmp/q8b --seqs 2 --prompt 512 --response 4096 --device cuda \
        >> "$OUT/summary.txt" 2>&1
fi
cat "$OUT/summary.txt"
