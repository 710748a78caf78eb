"""Generated arithmetic word problems (apples, trains, money, recipes, ...) with exact answers.

:func:`arithmetic_word_problems` needs no download and is easy enough for a 135M model to solve
some problems, which gives RL a reward signal to start from; difficulty is the number of
arithmetic operations (1-4).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from drmas.workflows.math.task import MathTask

__all__ = ["SPLITS", "arithmetic_word_problems"]

SPLITS = ("train", "val", "test")

# Share of each difficulty (1..4 operations) in a split: mostly easy, so a tiny model gets some.
_DIFFICULTY_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
_MAX_COUNT = 500  # largest intermediate value of a counting story
_MAX_MEASURE = Fraction(60)  # largest amount of a measuring story
_MAX_DENOMINATOR = 12

# (name, he, him, his)
_PEOPLE = (
    ("Ana", "she", "her", "her"), ("Ben", "he", "him", "his"), ("Carla", "she", "her", "her"),
    ("David", "he", "him", "his"), ("Emma", "she", "her", "her"), ("Farid", "he", "him", "his"),
    ("Grace", "she", "her", "her"), ("Hugo", "he", "him", "his"), ("Ines", "she", "her", "her"),
    ("Jamal", "he", "him", "his"), ("Keiko", "she", "her", "her"), ("Liam", "he", "him", "his"),
    ("Maya", "she", "her", "her"), ("Noah", "he", "him", "his"), ("Olga", "she", "her", "her"),
    ("Pablo", "he", "him", "his"), ("Rosa", "she", "her", "her"), ("Sam", "he", "him", "his"),
    ("Tara", "she", "her", "her"), ("Umar", "he", "him", "his"), ("Vera", "she", "her", "her"),
    ("Wei", "he", "him", "his"), ("Yara", "she", "her", "her"), ("Zane", "he", "him", "his"),
)

# Amounts of a measuring story: simple fractions a child meets in a recipe.
_AMOUNTS = tuple(Fraction(s) for s in ("1/2", "1/4", "3/4", "1/3", "2/3", "1", "3/2", "2", "5/2", "3", "5/4"))
_STARTS = tuple(Fraction(s) for s in ("1/2", "3/4", "1", "3/2", "2", "5/2", "3", "4", "5", "6", "7/2", "8"))


@dataclass(frozen=True)
class _Theme:
    """Sentence templates of one kind of story.

    Fields: {name} {he} {He} {him} {his} {His} {noun}; {a} the start amount; {a} groups of
    {b} for ``group``; {n} the operand of an operation; {sa} {sb} {s} the plural "s" of a unit
    after {a} {b} {n}. ``measure`` stories allow fractions; counting stories stay whole numbers
    (every division comes out even).
    """

    measure: bool
    nouns: tuple[str, ...]
    start: tuple[str, ...]
    question: str
    group: tuple[str, ...] = ()
    add: tuple[str, ...] = ()
    sub: tuple[str, ...] = ()
    mul: tuple[str, ...] = ()
    div: tuple[str, ...] = ()
    share: tuple[str, ...] = ()  # a final equal split; its own question follows
    share_question: str = ""


_THEMES: dict[str, _Theme] = {
    "fruit": _Theme(
        measure=False,
        nouns=("apples", "oranges", "pears", "plums", "peaches", "lemons"),
        start=("{name} has {a} {noun}.", "{name} picks {a} {noun} from the orchard."),
        question="How many {noun} does {name} have now?",
        group=("{name} buys {a} bags of {noun} with {b} {noun} in each bag.",),
        add=("{He} picks {n} more {noun}.", "{His} neighbour gives {him} {n} {noun}.",
             "{He} buys {n} more {noun} at the market."),
        sub=("{He} eats {n} of them.", "{He} gives {n} {noun} to a friend.",
             "{He} uses {n} {noun} to bake a pie."),
        mul=("By the end of the week {he} has {n} times as many {noun} as that.",),
        div=("{He} sorts the {noun} into {n} equal piles and keeps one pile.",),
        share=("{He} shares the {noun} equally among {n} friends.",),
        share_question="How many {noun} does each friend get?",
    ),
    "collection": _Theme(
        measure=False,
        nouns=("marbles", "stickers", "stamps", "trading cards", "seashells"),
        start=("{name} has {a} {noun}.", "{name} collects {a} {noun}."),
        question="How many {noun} does {name} have now?",
        group=("{name} has {a} packs of {noun} with {b} {noun} in each pack.",),
        add=("{He} wins {n} more {noun} in a game.", "{He} finds {n} more {noun}.",
             "{His} friend gives {him} {n} {noun}."),
        sub=("{He} loses {n} {noun}.", "{He} trades away {n} {noun}.",
             "{He} gives {n} {noun} to {his} brother."),
        mul=("After a swap meet {his} collection is {n} times as big.",),
        div=("{He} divides the {noun} equally into {n} boxes and keeps one box.",),
        share=("{He} divides the {noun} equally among {n} friends.",),
        share_question="How many {noun} does each friend get?",
    ),
    "money": _Theme(
        measure=False,
        nouns=("dollars",),
        start=("{name} has {a} dollars in {his} piggy bank.", "{name} has {a} dollars."),
        question="How many dollars does {name} have now?",
        group=("{name} earns {b} dollars a day for {a} days.",),
        add=("{He} earns {n} dollars walking dogs.", "{His} aunt gives {him} {n} dollars.",
             "{He} sells old toys for {n} dollars."),
        sub=("{He} spends {n} dollars on a book.", "{He} buys a toy for {n} dollars.",
             "{He} pays {n} dollars for lunch."),
        mul=("By the end of the year {his} savings have grown to {n} times that amount.",),
        share=("{He} splits the money equally among {n} cousins.",),
        share_question="How many dollars does each cousin get?",
    ),
    "train": _Theme(
        measure=False,
        nouns=("passengers",),
        start=("A train leaves the station with {a} passengers on board.",),
        question="How many passengers are on the train now?",
        group=("A train has {a} cars with {b} passengers in each car.",),
        add=("At the next stop, {n} passengers get on.", "At the market square, {n} more passengers board."),
        sub=("At the next stop, {n} passengers get off.", "At the school, {n} passengers leave the train."),
        mul=("At the city centre the number of passengers becomes {n} times as large.",),
        div=("At the stadium the passengers split into {n} equal groups and only one group stays on.",),
        share=("At the last station the passengers split equally into {n} buses.",),
        share_question="How many passengers ride in each bus?",
    ),
    "recipe": _Theme(
        measure=True,
        nouns=("flour", "sugar", "milk", "oats", "rice"),
        start=("{name} puts {a} cup{sa} of {noun} in a bowl.",),
        question="How many cups of {noun} are in the bowl now?",
        group=("{name} fills a bowl with {a} scoops of {noun}, each scoop holding {b} cup{sb}.",),
        add=("{He} adds {n} more cup{s} of {noun}.", "{His} friend pours in another {n} cup{s} of {noun}."),
        sub=("{He} takes out {n} cup{s} of {noun} for another cake.", "{He} spills {n} cup{s} of {noun}."),
        mul=("{He} wants a bigger cake, so {he} makes the amount in the bowl {n} times as large.",),
        div=("{He} pours the {noun} equally into {n} jars and puts one jar back in the bowl.",),
        share=("{He} divides the {noun} equally among {n} small bowls.",),
        share_question="How many cups of {noun} are in each small bowl?",
    ),
    "juice": _Theme(
        measure=True,
        nouns=("orange juice", "apple juice", "water", "lemonade"),
        start=("A jug holds {a} liter{sa} of {noun}.",),
        question="How many liters of {noun} are in the jug now?",
        group=("{name} fills a jug with {a} bottles of {noun}, each holding {b} liter{sb}.",),
        add=("{name} pours in {n} more liter{s}.", "{name} adds another {n} liter{s}."),
        sub=("{name} drinks {n} liter{s} of it.", "{name} pours out {n} liter{s} for the plants."),
        share=("{name} pours all of it equally into {n} glasses.",),
        share_question="How many liters of {noun} are in each glass?",
    ),
    "running": _Theme(
        measure=True,
        nouns=("km",),
        start=("{name} runs {a} km in the morning.",),
        question="How many km does {name} run in total?",
        group=("{name} runs {a} laps of a track that is {b} km long.",),
        add=("Then {he} runs {n} km more.", "After a short rest {he} jogs another {n} km."),
        share=("{He} splits the whole distance into {n} equal parts with a water break after each.",),
        share_question="How many km long is each part?",
    ),
}


def _plural(value: Fraction) -> str:
    """The "s" of "2 cups" and "3/2 cups", but not of "1 cup" or "3/4 cup"."""
    return "s" if value > 1 else ""


def _fmt(value: Fraction) -> str:
    """A number as plain text: "7", "3/4", "5/2" (improper, never mixed)."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _apply(value: Fraction, op: str, operand: Fraction) -> Fraction:
    if op in ("add",):
        return value + operand
    if op == "sub":
        return value - operand
    if op in ("mul", "group"):
        return value * operand
    if op in ("div", "share"):
        return value / operand
    raise ValueError(f"unknown operation {op!r}")


def _solve(start: Fraction, ops: Sequence[tuple[str, Fraction]]) -> Fraction:
    """The exact result of applying ``ops`` in order to ``start``."""
    value = Fraction(start)
    for op, operand in ops:
        value = _apply(value, op, Fraction(operand))
    return value


def _make_problem(
    theme: str,
    person: tuple[str, str, str, str],
    start: Fraction | int,
    ops: Sequence[tuple[str, Fraction | int]],
    noun: str | None = None,
    variants: Sequence[int] = (),
) -> tuple[str, Fraction]:
    """Render one story and compute its answer exactly.

    A leading ``("group", b)`` operation means "``start`` groups of ``b``" and replaces the start
    sentence; a trailing ``("share", n)`` asks for one of ``n`` equal parts. ``variants[i]``
    picks the template of sentence ``i`` (0 when missing), so tests can fix the wording.
    """
    spec = _THEMES[theme]
    name, he, him, his = person
    fields = {
        "name": name, "he": he, "He": he.capitalize(), "him": him, "his": his,
        "His": his.capitalize(), "noun": noun or spec.nouns[0],
    }

    def pick(templates: Sequence[str], i: int) -> str:
        if not templates:
            raise ValueError(f"theme {theme!r} has no template for this operation")
        return templates[(variants[i] if i < len(variants) else 0) % len(templates)]

    ops = [(op, Fraction(x)) for op, x in ops]
    sentences = []
    start = Fraction(start)
    if ops and ops[0][0] == "group":
        b = ops[0][1]
        sentences.append(
            pick(spec.group, 0).format(a=_fmt(start), sa=_plural(start), b=_fmt(b), sb=_plural(b), **fields)
        )
    else:
        sentences.append(pick(spec.start, 0).format(a=_fmt(start), sa=_plural(start), **fields))
    for i, (op, operand) in enumerate(ops):
        if op == "group":
            if i:
                raise ValueError("'group' can only be the first operation")
            continue
        if op == "share" and i != len(ops) - 1:
            raise ValueError("'share' can only be the last operation")
        sentences.append(pick(getattr(spec, op), i + 1).format(n=_fmt(operand), s=_plural(operand), **fields))
    question = spec.share_question if ops and ops[-1][0] == "share" else spec.question
    sentences.append(question.format(**fields))
    return " ".join(sentences), _solve(start, ops)


def _fits(value: Fraction, measure: bool) -> bool:
    if value <= 0:
        return False
    if measure:
        return value <= _MAX_MEASURE and value.denominator <= _MAX_DENOMINATOR
    return value.denominator == 1 and value <= _MAX_COUNT


def _operand(rng: random.Random, op: str, value: Fraction, measure: bool, small: bool) -> Fraction | None:
    """A random operand for ``op`` that keeps the story sensible, or None if there is none."""
    if op == "add":
        return rng.choice(_AMOUNTS) if measure else Fraction(rng.randint(2, 9 if small else 20))
    if op == "sub":
        if measure:
            options = [x for x in _AMOUNTS if x < value]
            return rng.choice(options) if options else None
        top = min(int(value) - 1, 9 if small else 25)
        return Fraction(rng.randint(2, top)) if top >= 2 else None
    if op == "mul":
        return Fraction(rng.randint(2, 3 if small or measure else 4))
    if op in ("div", "share"):
        options = [k for k in range(2, 6) if measure or int(value) % k == 0]
        return Fraction(rng.choice(options)) if options else None
    raise ValueError(f"unknown operation {op!r}")


def _random_problem(rng: random.Random, difficulty: int) -> tuple[str, Fraction] | None:
    """One random story with ``difficulty`` operations, or None when the draw did not fit."""
    keys = sorted(_THEMES)
    # Counting stories twice as often: whole-number answers are what a tiny model gets right first.
    theme_key = rng.choices(keys, [1 if _THEMES[k].measure else 2 for k in keys])[0]
    spec = _THEMES[theme_key]
    small = difficulty == 1
    group = bool(spec.group) and rng.random() < 0.25
    share = bool(spec.share) and rng.random() < 0.3 and difficulty - group >= 1
    middle = difficulty - group - share
    kinds = [op for op in ("add", "sub", "mul", "div") if getattr(spec, op)]
    weights = [{"add": 4, "sub": 4, "mul": 2, "div": 1}[op] for op in kinds]
    plan = (["group"] if group else []) + rng.choices(kinds, weights, k=middle) + (["share"] if share else [])

    if group:
        start = Fraction(rng.randint(2, 5 if small else 8))
        size = rng.choice(_AMOUNTS) if spec.measure else Fraction(rng.randint(2, 6 if small else 10))
        ops = [("group", size)]
    else:
        start = rng.choice(_STARTS) if spec.measure else Fraction(rng.randint(3, 12 if small else 30))
        ops = []
    value = _solve(start, ops)
    for op in plan[len(ops):]:
        operand = _operand(rng, op, value, spec.measure, small)
        if operand is None:
            return None
        value = _apply(value, op, operand)
        if not _fits(value, spec.measure):
            return None
        ops.append((op, operand))
    if not _fits(value, spec.measure):
        return None
    person = rng.choice(_PEOPLE)
    noun = rng.choice(spec.nouns)
    # A random first wording per kind of sentence, then the next one each time the kind repeats,
    # so that a story does not say "At the next stop" twice when it can avoid it.
    base = {kind: rng.randrange(6) for kind in ("start", *(op for op, _ in ops))}
    kinds_so_far = [op for op, _ in ops]
    variants = [base["start"]] + [base[op] + kinds_so_far[:i].count(op) for i, op in enumerate(kinds_so_far)]
    return _make_problem(theme_key, person, start, ops, noun=noun, variants=variants)


def _difficulties(n: int, rng: random.Random) -> list[int]:
    """``n`` difficulties in the set proportions, each present when ``n >= 4``, shuffled."""
    if n < 4:
        return [1 + i % 4 for i in range(n)]
    counts = [max(1, int(n * w)) for w in _DIFFICULTY_WEIGHTS]
    counts[0] += n - sum(counts)
    levels = [d for d, c in enumerate(counts, start=1) for _ in range(c)]
    rng.shuffle(levels)
    return levels


def arithmetic_word_problems(
    seed: int = 0, train_size: int = 2000, val_size: int = 100, test_size: int = 100
) -> dict[str, tuple[MathTask, ...]]:
    """Generated word problems with exact answers, split into ``train``/``val``/``test``.

    Deterministic in ``seed``; no problem text occurs twice (so the splits are disjoint); every
    split mixes 1- to 4-operation problems, about 40% of them one operation with small numbers.
    Answers are whole numbers or reduced fractions ("3/4").
    """
    sizes = {"train": train_size, "val": val_size, "test": test_size}
    for split, size in sizes.items():
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"{split}_size must be a non-negative integer, got {size!r}")
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, tuple[MathTask, ...]] = {}
    for split in SPLITS:
        tasks = []
        for i, difficulty in enumerate(_difficulties(sizes[split], rng)):
            for _ in range(1000):
                drawn = _random_problem(rng, difficulty)
                if drawn is not None and drawn[0] not in seen:
                    break
            else:  # pragma: no cover - the problem space is far larger than any split
                raise RuntimeError(f"could not draw a new {difficulty}-operation problem; ask for fewer")
            text, answer = drawn
            seen.add(text)
            tasks.append(MathTask(uid=f"arith-s{seed}-{split}-{i:05d}", problem=text, answer=_fmt(answer),
                                  source="arithmetic", difficulty=difficulty))
        splits[split] = tuple(tasks)
    return splits
