"""Bring your own agents: train a multi-agent program written against the OpenAI chat API.

    python -m drmas.recipes.agents fit  # the example math team, embedded model, CPU
    python -m drmas.recipes.agents fit --data.workflow.init_args.episode my_pkg.team:episode \\
        --data.workflow.init_args.agents '[writer, critic]' \\
        --data.workflow.init_args.train_file tasks.jsonl
    python -m drmas.recipes.agents fit --config qwen3_8b  # GPUs

The program runs as it is: each episode gets an OpenAI client pointed at drmas's endpoint, and
the request's ``model`` names the agent (docs/agents.md). Without an episode and a train_file it
trains the example math team the package ships (a checkout's ``examples/agents/math_team.py``),
whatever folder it runs from; a train_file of your own without a val_file validates on a
held-apart share of your own tasks.
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("agents")
