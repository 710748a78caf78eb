"""A debate: two debaters argue about a math word problem, a judge picks one; the verdict
decides the debaters' rewards at the episode's end (docs/debate.md).

    python recipes/debate.py fit                                   # embedded default, CPU, offline
    python recipes/debate.py fit --config configs/tiny_random.yaml # seconds, for tests
    python recipes/debate.py fit --data.workflow.init_args.zero_sum false \\
        --data.workflow.init_args.max_turns 2
"""

import os

from drmas.checkout import CONFIGS
from drmas.cli import run_recipe

if __name__ == "__main__":
    run_recipe("debate", "debate", os.path.join(CONFIGS, "smollm2_135m_cpu.yaml"))
