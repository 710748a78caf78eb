"""Dr. MAS multi-turn search: a verifier routes, a searcher searches, an answerer answers.

    python -m drmas.recipes.search fit  # embedded default, CPU, offline
    python -m drmas.recipes.search fit --config qwen3_8b  # GPUs
    python -m drmas.recipes.search fit --data.rollout.sampling tree --data.rollout.estimator at_grpo
    python -m drmas.recipes.search fit --print_config
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("search")
