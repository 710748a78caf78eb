"""Math reasoning with two agents: Dr. MAS solver/verifier (default) or AT-GRPO reasoner/tool user.

    python -m drmas.recipes.math fit  # embedded default, CPU, offline
    python -m drmas.recipes.math fit --config qwen3_8b  # GPUs
    python -m drmas.recipes.math fit --data.workflow math_reasoner_tool_user \\
        --data.rollout.sampling tree --data.rollout.estimator at_grpo           # the AT-GRPO team (4 turns;
                                                                # --data.workflow.init_args.max_turns 2
                                                                # on a CPU)
    python -m drmas.recipes.math fit --print_config
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("math")
