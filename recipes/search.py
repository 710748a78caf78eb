"""Dr. MAS multi-turn search: a verifier routes, a searcher searches, an answerer answers.

    python recipes/search.py fit                                   # embedded default, CPU, offline
    python recipes/search.py fit --config configs/qwen3_8b.yaml    # GPUs
    python recipes/search.py fit --data.rollout.sampling tree --data.rollout.estimator at_grpo
    python recipes/search.py fit --print_config
"""

import os
import sys

# Python puts this script's folder first on sys.path, where recipes/math.py would shadow the
# standard library's `math`; the checkout's root takes its place (so recipes run uninstalled).
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from drmas.cli import CONFIGS, run_recipe  # noqa: E402

if __name__ == "__main__":
    run_recipe("search", "search", os.path.join(CONFIGS, "smollm2_135m_cpu.yaml"))
