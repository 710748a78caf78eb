"""Answer normalisation and matching for open-domain QA rewards.

Follows the usual SQuAD / Search-R1 convention (lowercase, drop punctuation and articles,
collapse whitespace) so that our exact-match numbers are comparable with published ones.
"""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Sequence

__all__ = ["normalize_answer", "exact_match", "contains_answer"]

_ARTICLES = frozenset({"a", "an", "the"})
_DROP_ASCII_PUNCT = str.maketrans("", "", string.punctuation)


def _strip_punct(text: str) -> str:
    text = text.translate(_DROP_ASCII_PUNCT)  # fast path; rewards call this on every passage
    if text.isascii():
        return text
    # string.punctuation misses typographic marks such as ’ “ – that models often emit.
    return "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))


def normalize_answer(s: str) -> str:
    """Lowercase, delete punctuation, drop the articles a/an/the, collapse whitespace.

    Punctuation is deleted (not replaced by a space), so "A.B. Smith" becomes "ab smith".
    Articles are only dropped when something else remains: an answer that consists of
    articles alone ("A", "The") keeps them, otherwise it would normalise to "" and match
    any other empty answer.
    """
    text = _strip_punct(s.lower())
    words = text.split()
    kept = [w for w in words if w not in _ARTICLES]
    return " ".join(kept if kept else words)


def exact_match(prediction: str, golds: Sequence[str]) -> bool:
    """True when the normalised prediction equals any normalised gold answer."""
    if isinstance(golds, str):  # a bare string would otherwise be matched character by character
        golds = [golds]
    pred = normalize_answer(prediction)
    return bool(pred) and any(pred == normalize_answer(g) for g in golds)


def contains_answer(text: str, golds: Sequence[str]) -> bool:
    """True when some normalised gold occurs in the normalised text as whole words.

    Used for role rewards (do the retrieved passages contain the answer?); the whole-word
    rule keeps gold "Tav" from matching "Tavrin".
    """
    if isinstance(golds, str):
        golds = [golds]
    padded = f" {normalize_answer(text)} "
    for gold in golds:
        g = normalize_answer(gold)
        if g and f" {g} " in padded:
            return True
    return False
