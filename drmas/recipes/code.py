"""Code with two agents (AT-GRPO): a coder writes a program, a tester writes tests.

    python -m drmas.recipes.code fit  # embedded problems, embedded model, CPU
    python -m drmas.recipes.code fit --data.workflow.init_args.train my_problems.jsonl
    python -m drmas.recipes.code fit --data.rollout.sampling tree --data.rollout.estimator at_grpo
    python -m drmas.recipes.code fit --config qwen3_8b  # GPUs
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("code")
