"""Dr. MAS multi-turn search: a verifier routes, a searcher searches, an answerer answers.

    python recipes/search.py fit                                   # embedded default, CPU, offline
    python recipes/search.py fit --config configs/qwen3_8b.yaml    # GPUs
    python recipes/search.py fit --data.sampling tree --data.estimator at_grpo
    python recipes/search.py fit --print_config
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
# vLLM must run in-process to share weights with the trainer (see DESIGN.md section 6).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its CPU backend warns on every request

from drmas.cli import run_recipe  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    run_recipe("drmas.envs.search.SearchWorkflow", "search", os.path.join(ROOT, "configs", "smollm2_135m_cpu.yaml"))
