"""Multi-agent workflows (agents, prompts, parsers, rewards, data). Never imports Lightning."""

from drmas.envs.base import WORKFLOWS, ChatPrompt, Completion, PromptTemplate, Workflow

__all__ = ["WORKFLOWS", "ChatPrompt", "Completion", "PromptTemplate", "Workflow"]
