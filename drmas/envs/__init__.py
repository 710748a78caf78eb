"""Multi-agent workflows (agents, prompts, parsers, rewards, data). Never imports Lightning.

A turn-based domain subclasses :class:`TurnWorkflow` and registers itself in ``WORKFLOWS``;
see docs/architecture.md.
"""

from drmas.envs.base import WORKFLOWS, ChatPrompt, Completion, PromptTemplate, Workflow
from drmas.envs.episode import Action, EpisodeState, TurnWorkflow

__all__ = ["WORKFLOWS", "Action", "ChatPrompt", "Completion", "EpisodeState", "PromptTemplate",
           "TurnWorkflow", "Workflow"]
