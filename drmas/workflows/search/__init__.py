"""The hierarchical search workflow of Dr. MAS (verifier, searcher, answerer) and its parts."""

from drmas.workflows.search.answers import contains_answer, exact_match, normalize_answer
from drmas.workflows.search.data import SearchTask, load_corpus, load_search_r1, write_corpus
from drmas.workflows.search.world import World, synthetic_world
from drmas.workflows.search.retrieval import (RETRIEVERS, HTTPRetriever, RetrievalError, Retriever,
                                              make_retriever)
from drmas.workflows.search.workflow import SearchWorkflow

__all__ = [
    "RETRIEVERS",
    "HTTPRetriever",
    "RetrievalError",
    "Retriever",
    "SearchTask",
    "SearchWorkflow",
    "World",
    "contains_answer",
    "exact_match",
    "load_corpus",
    "load_search_r1",
    "make_retriever",
    "normalize_answer",
    "synthetic_world",
    "write_corpus",
]
