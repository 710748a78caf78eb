"""Bring your own agents: an OpenAI-compatible endpoint that trains a multi-agent program written
against the chat API, unchanged (the ``agents`` workflow; docs/agents.md)."""

from drmas.workflows.agents.workflow import AgentsWorkflow, RowTask, read_tasks

__all__ = ["AgentsWorkflow", "RowTask", "read_tasks"]
