"""Prompt templates and output parsers of the three search agents.

The templates carry what a 135M model needs to produce the formats at all (measured with
SmolLM2-135M, see docs/search.md): a worked example as a previous chat turn, an assistant prefill with the
opening tag, stop strings at the closing tag, and an optional think block. The example's
entities do not exist in any data set, so an answer copied from it is simply wrong.
"""

from __future__ import annotations

import re
from dataclasses import replace

from drmas.workflows.base import PromptTemplate

__all__ = ["MAX_ACTION_CHARS", "default_templates", "format_information", "parse_answer", "parse_search",
           "parse_verify"]

MAX_ACTION_CHARS = 300
"""A query or answer longer than this is treated as malformed."""

_EXAMPLE_Q = "In which city was Dorvik Alsenne born?"
_EXAMPLE_INFO = (
    "<search>Dorvik Alsenne</search>\n<information>\n- Dorvik Alsenne is a sculptor born in Quellmar in 1871."
    "\n</information>"
)
_SYSTEM = "You are the {role} of a search team that answers questions about a fictional world."

# Information first, question last: the 135M answerer copies the right answer 5-7 times in 40
# this way, 0-1 times with the question first and the passages run together (measured).
_USER = "Gathered information:\n{information}\n\nQuestion: {question}\n"


def default_templates(think: bool = False) -> dict[str, PromptTemplate]:
    """Templates for ``verifier``, ``searcher`` and ``answerer``.

    With ``think=True`` the searcher and answerer are prefilled with ``<think>`` and their
    example reasons first; otherwise they are prefilled with the action tag directly (the think
    block stays optional for the parser).
    """
    # The explicit rule matters: with the bare question the untrained 135M model says yes to an
    # empty history 84% of the time (measured), so the searcher would hardly ever act.
    verify_instr = (
        "Say yes only if a passage above contains the answer; with (none), say no. Is the gathered "
        "information enough to answer the question? Reply <verify>yes</verify> or <verify>no</verify>."
    )
    verifier = PromptTemplate(
        system=_SYSTEM.format(role="verifier"),
        instruction=_USER + verify_instr,
        example_user=_USER.format(question=_EXAMPLE_Q, information="(none)") + verify_instr,
        example_assistant="<verify>no</verify>",
        prefill="<verify>",
        stop=("</verify>",),
    )
    search_instr = "Write one search query for the missing fact as <search>query</search>."
    searcher = PromptTemplate(
        system=_SYSTEM.format(role="searcher"),
        instruction=_USER + search_instr,
        example_user=_USER.format(question=_EXAMPLE_Q, information="(none)") + search_instr,
        example_assistant="<search>Dorvik Alsenne</search>",
        prefill="<search>",
        stop=("</search>",),
    )
    answer_instr = "Answer with a short phrase copied from the information, as <answer>answer</answer>."
    answerer = PromptTemplate(
        system=_SYSTEM.format(role="answerer"),
        instruction=_USER + answer_instr,
        example_user=_USER.format(question=_EXAMPLE_Q, information=_EXAMPLE_INFO) + answer_instr,
        example_assistant="<answer>Quellmar</answer>",
        prefill="<answer>",
        stop=("</answer>",),
    )
    if think:
        searcher = replace(
            searcher,
            example_assistant="<think>I know nothing yet; I need Dorvik Alsenne's birthplace.</think>\n"
            "<search>Dorvik Alsenne</search>",
            prefill="<think>",
        )
        answerer = replace(
            answerer,
            example_assistant="<think>Doc 1 says he was born in Quellmar.</think>\n<answer>Quellmar</answer>",
            prefill="<think>",
        )
    return {"verifier": verifier, "searcher": searcher, "answerer": answerer}


def format_information(history: list[tuple[str, list[str]]]) -> str:
    """The search history as the model sees it: each query and its passages."""
    if not history:
        return "(none)"
    blocks = []
    for query, passages in history:
        docs = "".join(f"- {p}\n" for p in passages)
        blocks.append(f"<search>{query}</search>\n<information>\n{docs}</information>")
    return "\n".join(blocks)


_THINK = r"\s*(?:<think>.*?</think>\s*)?"
_VERIFY = re.compile(r"\s*<verify>\s*(yes|no)\s*</verify>", re.IGNORECASE)
_SEARCH = re.compile(_THINK + r"<search>(.*?)</search>", re.DOTALL)
_ANSWER = re.compile(_THINK + r"<answer>(.*?)</answer>", re.DOTALL)


def parse_verify(text: str) -> bool | None:
    """``True`` for yes, ``False`` for no, ``None`` when malformed."""
    m = _VERIFY.match(text)
    return None if m is None else m.group(1).lower() == "yes"


def _tagged(pattern: re.Pattern[str], text: str) -> str | None:
    m = pattern.match(text)
    if m is None:
        return None
    value = " ".join(m.group(1).split())
    return value if 0 < len(value) <= MAX_ACTION_CHARS and "<" not in value else None


def parse_search(text: str) -> str | None:
    """The query, or ``None`` when malformed (no tags, unclosed, empty or oversized)."""
    return _tagged(_SEARCH, text)


def parse_answer(text: str) -> str | None:
    """The answer, or ``None`` when malformed."""
    return _tagged(_ANSWER, text)
