"""The hierarchical search workflow of Dr. MAS: a verifier routes, a searcher searches, an
answerer answers.

Each turn (at most ``max_turns``) the verifier reads the question and the search history and
says ``<verify>yes</verify>`` or ``<verify>no</verify>``. On no, the searcher writes
``<search>query</search>`` and the retriever's top-k passages join the history as
``<information>..</information>``; on the last turn a no hands over to the answerer anyway, so
every episode ends with an answer. On yes the answerer writes ``<answer>..</answer>`` and the
episode ends.

Rewards. Team reward: exact match of the answer with a gold answer (normalised: lowercase, no
punctuation, no articles, single spaces). Role (local) rewards: verifier = routing correct
(yes exactly when a gold answer already appears in the gathered information); searcher = its
passages contain a gold answer; answerer = exact match. A malformed action gets
``-format_penalty`` as local reward (a malformed verify counts as no, a malformed search
retrieves nothing, a malformed answer is wrong). A search whose request still fails after the
retriever's retries (a server outage) retrieves nothing without a penalty and is counted as a
failed action (``rollout/searcher/failed_actions``); too many stop the run (see
:class:`~drmas.data.rollouts.Rollouts`).

- ``parallel`` sampling: every sample of a trajectory gets ``alpha * team + local``, where local is
  the format penalty, plus the role reward when ``role_rewards`` is on (off by default, as in
  Dr. MAS).
- ``tree`` sampling (AT-GRPO): for each (task, turn, agent) one prompt from the current state,
  ``n`` candidates, each scored on its own: role reward + format penalty, plus
  ``alpha * team`` when the episode ends at that step (the answerer). All candidates are
  recorded with the same ``traj_uid`` (the task's tree); the best is executed (ties: the lowest
  index, or a seeded random one with ``tie_break="random"``) and the next prompt is built from
  the advanced state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from drmas.workflows.base import WORKFLOWS, ChatPrompt, split_tasks
from drmas.workflows.episode import Action, EpisodeState, TurnWorkflow
from drmas.workflows.search.answers import contains_answer, exact_match
from drmas.workflows.search.data import SearchTask, load_corpus, load_search_r1
from drmas.workflows.search.prompts import (default_templates, format_information, parse_answer, parse_search,
                                       parse_verify)
from drmas.workflows.search.retrieval import RetrievalError, Retriever, make_retriever
from drmas.workflows.search.world import synthetic_world
from drmas.records import Completion

__all__ = ["SearchWorkflow"]

AGENTS = ("verifier", "searcher", "answerer")


@dataclass
class SearchState(EpisodeState):
    history: list[tuple[str, list[str]]] = field(default_factory=list)
    """The executed searches: (query, passages)."""
    answer: str | None = None

    @property
    def information(self) -> str:
        return format_information(self.history)

    def gathered_text(self) -> str:
        return " ".join(p for _, ps in self.history for p in ps)


@WORKFLOWS.register("search")
class SearchWorkflow(TurnWorkflow):
    agents = AGENTS
    # within a turn the verifier routes; an answer ends the episode, a search starts the next turn
    step_order = ("verifier", "answerer", "searcher")

    def __init__(
        self,
        world_seed: int = 0,
        train_file: str | None = None,
        val_file: str | None = None,
        test_file: str | None = None,
        corpus_file: str | None = None,
        retriever: str = "bm25",
        retriever_url: str | None = None,
        topk: int = 3,
        role_rewards: bool = False,
        think: bool = False,
        **options: Any,
    ) -> None:
        """
        Args:
            world_seed: seed of the embedded synthetic world (questions and corpus) used when
                no files are given.
            train_file: Search-R1-style JSONL/parquet of training questions (replaces the
                embedded train split); likewise ``val_file`` and ``test_file``.
            val_file: validation questions file.
            test_file: test questions file.
            corpus_file: JSONL corpus (``contents`` per line) for the in-process retrievers;
                required with question files unless ``retriever="http"``.
            retriever: ``bm25`` (in-process), ``dense`` (MiniLM), or ``http`` (a
                Search-R1-compatible server at ``retriever_url``).
            retriever_url: full URL of the server's ``/retrieve`` endpoint for ``http``.
            topk: passages returned per search.
            role_rewards: in parallel sampling, add the role rewards to the local term.
            think: prefill the searcher and answerer with ``<think>`` (the parser accepts an
                optional think block either way).
            **options: ``max_turns`` (each turn: the verifier, then the searcher or the answerer),
                ``alpha``, ``format_penalty``, ``tie_break``, ``templates``, as every turn-based workflow
                takes them (:class:`~drmas.workflows.episode.TurnWorkflow`).
        """
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        super().__init__(role_rewards=role_rewards, default_templates=default_templates(think), **options)
        self.topk = topk

        files = {"train": train_file, "val": val_file, "test": test_file}
        world = None
        if not all(files.values()) or (corpus_file is None and retriever != "http"):
            world = synthetic_world(seed=world_seed)
        self._splits = {
            split: tuple(load_search_r1(path)) if path else world.splits[split]  # type: ignore[union-attr]
            for split, path in files.items()
        }
        if retriever == "http":
            self.retriever: Retriever = make_retriever("http", url=retriever_url)
        else:
            if any(files.values()) and corpus_file is None:
                raise ValueError("question files need a corpus_file for the in-process retrievers")
            corpus = load_corpus(corpus_file) if corpus_file else list(world.corpus)  # type: ignore[union-attr]
            self.retriever = make_retriever(retriever, corpus)

    def tasks(self, split: str) -> Sequence[SearchTask]:
        return split_tasks(self._splits, split)

    # ---- one step -------------------------------------------------------------------------

    def initial_state(self, task: SearchTask) -> SearchState:
        return SearchState(task, "verifier")

    def prompt(self, agent: str, state: SearchState) -> ChatPrompt:
        return self.templates[agent].render(question=state.task.question, information=state.information)

    def evaluate(self, agent: str, states: Sequence[SearchState],
                 completions: Sequence[Completion]) -> list[Action]:
        if agent == "verifier":
            # role: routing is right when "yes" comes exactly when the answer was already found;
            # a malformed verdict counts as no
            says = [parse_verify(c.text) for c in completions]
            return [Action(yes is not None,
                           float(bool(yes) == contains_answer(st.gathered_text(), st.task.answers)),
                           value=bool(yes)) for st, yes in zip(states, says)]
        if agent == "answerer":
            out = []
            for st, c in zip(states, completions):
                answer = parse_answer(c.text)
                em = float(answer is not None and exact_match(answer, st.task.answers))
                out.append(Action(answer is not None, em, ends=True, team_reward=em, value=answer))
            return out
        # searcher: a malformed query retrieves nothing; role = its passages hold a gold answer.
        # A request that fails after its retries is a failed action for every query in it: no
        # passages, no penalty (the searcher did its part), counted by the rollout.
        queries = [parse_search(c.text) for c in completions]
        real = [q for q in queries if q is not None]
        failure = None
        try:
            results = self.retriever.search(real, self.topk) if real else []
        except RetrievalError as err:
            failure, results = str(err), [[] for _ in real]
        hits = iter(results)
        out = []
        for st, q in zip(states, queries):
            passages = [h.text for h in next(hits)] if q is not None else []
            found = float(contains_answer(" ".join(passages), st.task.answers))
            out.append(Action(q is not None, found, value=(q, passages),
                              failure=failure if q is not None else None))
        return out

    def advance(self, agent: str, state: SearchState, action: Action) -> None:
        if agent == "verifier":
            # on the last turn a "no" hands over to the answerer anyway: every episode ends with an answer
            state.agent = "answerer" if action.value or state.turn == self.max_turns - 1 else "searcher"
        elif agent == "answerer":
            state.answer, state.done = action.value, True
        else:
            query, passages = action.value
            if query is not None:
                state.history.append((query, passages))
            state.turn += 1
            state.agent = "verifier"

    def team_reward(self, state: SearchState) -> float:
        return float(state.answer is not None and exact_match(state.answer, state.task.answers))

    def episode_info(self, state: SearchState) -> dict:
        return {"answer": state.answer}
