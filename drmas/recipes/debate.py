"""A debate: two debaters argue about a math word problem, a judge picks one; the verdict
decides the debaters' rewards at the episode's end (docs/debate.md).

    python -m drmas.recipes.debate fit  # embedded default, CPU, offline
    python -m drmas.recipes.debate fit --config tiny_random  # seconds, for tests
    python -m drmas.recipes.debate fit --data.workflow.init_args.zero_sum false \\
        --data.workflow.init_args.max_turns 2
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("debate")
