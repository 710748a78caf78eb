"""Dr. MAS multi-turn search: a verifier routes, a searcher searches, an answerer answers.

    python recipes/search.py fit                                   # embedded default, CPU, offline
    python recipes/search.py fit --config configs/qwen3_8b.yaml    # GPUs
    python recipes/search.py fit --data.rollout.sampling tree --data.rollout.estimator at_grpo
    python recipes/search.py fit --print_config
"""

import os

from drmas.checkout import CONFIGS
from drmas.cli import run_recipe

if __name__ == "__main__":
    run_recipe("search", "search", os.path.join(CONFIGS, "smollm2_135m_cpu.yaml"))
