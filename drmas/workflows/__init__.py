"""Multi-agent workflows (agents, prompts, parsers, rewards, data). Never imports Lightning.

A turn-based workflow subclasses :class:`TurnWorkflow` and registers itself in ``WORKFLOWS``;
see docs/architecture.md.
"""

from drmas.workflows.base import WORKFLOWS, ChatPrompt, Completion, PromptTemplate, Workflow
from drmas.workflows.episode import Action, EpisodeState, TurnWorkflow

__all__ = ["WORKFLOWS", "Action", "ChatPrompt", "Completion", "EpisodeState", "PromptTemplate",
           "TurnWorkflow", "Workflow"]
