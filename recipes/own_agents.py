"""Bring your own agents: train a multi-agent program written against the OpenAI chat API.

The recipe 'agents' of drmas.recipes.agents (its docstring lists the commands), run from a
checkout: ``python recipes/own_agents.py fit``, as ``python -m drmas.recipes.agents fit`` from any folder.
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("agents")
