"""Bring your own agents: train a multi-agent program written against the OpenAI chat API.

    python recipes/own_agents.py fit                     # the example math team, embedded model, CPU
    python recipes/own_agents.py fit --data.workflow.init_args.episode my_pkg.team:episode \\
        --data.workflow.init_args.agents '[writer, critic]' \\
        --data.workflow.init_args.train_file tasks.jsonl
    python recipes/own_agents.py fit --config configs/qwen3_8b.yaml      # GPUs

The program runs as it is: each episode gets an OpenAI client pointed at drmas's endpoint, and
the request's ``model`` names the agent (docs/agents.md). Without an episode and a train_file it
trains the example team of ``examples/agents/``, whatever folder it runs from; a train_file of
your own without a val_file validates on a held-apart share of your own tasks.
"""

import os

from drmas.checkout import CONFIGS
from drmas.cli import run_recipe

if __name__ == "__main__":
    run_recipe("agents", "agents", os.path.join(CONFIGS, "smollm2_135m_cpu.yaml"))
