"""A debate between two debaters and a judge on math word problems (per-agent final rewards)."""

from drmas.workflows.debate.workflow import DebateWorkflow, parse_verdict

__all__ = ["DebateWorkflow", "parse_verdict"]
