"""The embedded synthetic world of the search recipe: a small fictional encyclopedia (people,
cities, countries, companies) with 1-hop and 2-hop questions.

Every name is made of random syllables, so a model cannot answer from memory and has to search;
it needs no download, and it is small enough for BM25 on CPU.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from drmas.workflows.search.answers import contains_answer
from drmas.workflows.search.data import SPLITS, SearchTask

__all__ = ["World", "synthetic_world"]


@dataclass(frozen=True)
class World:
    """A passage corpus and the question splits that are answerable from it."""

    corpus: tuple[str, ...]
    splits: dict[str, tuple[SearchTask, ...]]



# Short, plain syllables: names stay a few tokens long for a small model's tokenizer.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "th", "st")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou")
_CODAS = ("", "", "", "", "", "n", "r", "l", "s", "m", "th")
_CITY_ENDINGS = ("a", "on", "ia", "ar", "el", "is", "ov", "en", "ath", "ir")
_COUNTRY_ENDINGS = ("ia", "and", "ora", "esh", "ara", "land")
_COMPANY_KINDS = ("Industries", "Works", "Holdings", "Labs", "Trading", "Foundry", "Mills", "Systems",
                  "Shipping", "Press")
_PROFESSIONS = ("cartographer", "glassblower", "astronomer", "shipwright", "botanist", "archivist", "potter",
                "engineer", "violinist", "surveyor", "chemist", "weaver", "architect", "translator",
                "geologist", "beekeeper", "clockmaker", "painter", "pilot", "librarian")
_INDUSTRIES = ("shipping", "textile", "mining", "printing", "glass", "railway", "brewing", "software",
               "instrument", "timber", "salt", "pharmaceutical")
_HOBBIES = ("sailing", "playing chess", "collecting stamps", "growing orchids", "fishing", "hiking",
            "baking bread", "restoring old clocks", "birdwatching", "writing poetry")
_CITY_FEATURES = ("harbour", "old bridges", "salt markets", "clock tower", "glassworks", "river festival",
                  "university", "cathedral", "spice bazaar", "lighthouse")
_CITY_SIZES = ("small", "large", "busy", "quiet", "coastal", "mountain", "river")

# Question templates per relation; {e} is the entity asked about.
_TEMPLATES: dict[str, tuple[str, ...]] = {
    # 1-hop
    "birth_city": ("In which city was {e} born?", "What is the birthplace of {e}?",
                   "{e} was born in which city?"),
    "birth_year": ("In what year was {e} born?", "When was {e} born?", "What is the birth year of {e}?"),
    "employer": ("Which company does {e} work for?", "Who employs {e}?",
                 "What is the name of the company where {e} works?"),
    "profession": ("What is the profession of {e}?", "What does {e} do for a living?",
                   "What job does {e} have?"),
    "company_city": ("In which city was {e} founded?", "{e} was founded in which city?"),
    "company_year": ("In what year was {e} founded?", "When was {e} founded?"),
    "company_founder": ("Who founded {e}?", "Who is the founder of {e}?", "Who established {e}?"),
    "city_country": ("In which country is {e}?", "{e} is located in which country?",
                     "Which country is {e} in?"),
    "country_capital": ("What is the capital of {e}?", "Which city is the capital of {e}?"),
    # 2-hop
    "birth_country": ("In which country was {e} born?", "{e} was born in which country?",
                      "What is the country of birth of {e}?"),
    "employer_founder": ("Who founded the company that employs {e}?",
                         "Who is the founder of the company {e} works for?",
                         "Who established {e}'s employer?"),
    "employer_city": ("In which city was the company that employs {e} founded?",
                      "In which city was {e}'s employer founded?"),
    "employer_year": ("In what year was the company that employs {e} founded?",
                      "When was the company {e} works for founded?"),
    "founder_birth_city": ("In which city was the founder of {e} born?",
                           "In which city was the person who founded {e} born?"),
    "founder_birth_year": ("In what year was the founder of {e} born?", "When was the founder of {e} born?"),
    "company_country": ("In which country was {e} founded?", "{e} was founded in which country?"),
}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


class _Namer:
    """Draws pronounceable fictional words; every word it returns is new."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def raw(self, syllables: int) -> str:
        r = self.rng
        return "".join(r.choice(_ONSETS) + r.choice(_VOWELS) + r.choice(_CODAS) for _ in range(syllables))

    def fresh(self, candidate: str) -> bool:
        """Claim ``candidate`` if it is long enough and unused (case-insensitive)."""
        key = candidate.lower()
        if len(key) < 4 or key in self.used:
            return False
        self.used.add(key)
        return True

    def word(self, min_syl: int, max_syl: int) -> str:
        while True:
            w = self.raw(self.rng.randint(min_syl, max_syl)).capitalize()
            if self.fresh(w):
                return w

    def with_ending(self, stems: Sequence[str] | None, endings: Sequence[str]) -> str:
        """A stem (from ``stems``, or a fresh one) plus an ending, e.g. "Torv" + "el"."""
        while True:
            stem = self.rng.choice(stems) if stems else self.raw(self.rng.randint(1, 2))
            w = (stem + self.rng.choice(endings)).capitalize()
            if self.fresh(w):
                return w


@dataclass
class _Person:
    name: str
    profession: str
    birth_city: str
    birth_year: int
    employer: str = ""
    home_city: str = ""
    moved_year: int = 0
    hobby: str = ""


@dataclass
class _Company:
    name: str
    industry: str
    city: str
    founder: str
    year: int


class _Corpus:
    """Passages plus, for each entity name, the passages that mention it."""

    def __init__(self) -> None:
        self.passages: list[str] = []
        self.mentions: dict[str, list[int]] = {}

    def add(self, text: str, *names: str) -> None:
        for name in names:
            assert name in text, (name, text)
            self.mentions.setdefault(name, []).append(len(self.passages))
        self.passages.append(text)

    def about(self, name: str) -> Iterator[str]:
        return (self.passages[i] for i in self.mentions.get(name, ()))


def synthetic_world(
    seed: int = 0,
    num_people: int = 300,
    num_companies: int = 60,
    num_cities: int = 80,
    num_countries: int = 12,
    train_size: int = 1000,
    val_size: int = 100,
    test_size: int = 100,
    two_hop_fraction: float = 0.4,
) -> World:
    """A fictional encyclopedia and its questions, deterministic in ``seed``.

    Each person has a birth passage (city, year), a career passage (profession, employer) and
    a distractor passage (another city and year, a hobby); each company a founding passage
    (city, year) and a founder passage; each city and country one passage. A 1-hop question is
    answered by one passage that names the entity; a 2-hop question needs a passage that names
    the entity and gives a bridge entity, then the bridge's passage. Splits are disjoint in the
    entities asked about, and each holds ``two_hop_fraction`` 2-hop questions (rounded).
    """
    if num_people < 2 or num_companies < 1 or num_cities < 2 or num_countries < 1:
        raise ValueError("synthetic_world needs at least 2 people, 1 company, 2 cities and 1 country")
    if not 0.0 <= two_hop_fraction <= 1.0:
        raise ValueError(f"two_hop_fraction must be in [0, 1], got {two_hop_fraction}")
    rng = random.Random(seed)
    namer = _Namer(rng)

    countries = [namer.with_ending(None, _COUNTRY_ENDINGS) for _ in range(num_countries)]
    # Cities share stems in pairs ("Torvel", "Torvon"): look-alike names are good distractors.
    stems = [namer.raw(rng.randint(1, 2)) for _ in range(max(1, (num_cities * 2) // 3))]
    cities = [namer.with_ending(stems, _CITY_ENDINGS) for _ in range(num_cities)]
    city_country = {c: countries[i % num_countries] for i, c in enumerate(cities)}
    capitals = {k: next(c for c in cities if city_country[c] == k) for k in countries}

    firsts = [namer.word(2, 2) for _ in range(max(8, num_people // 2))]
    surnames = [namer.word(2, 3) for _ in range(max(8, (num_people * 2) // 3))]  # shared by relatives
    names: list[str] = []
    taken: set[str] = set()
    while len(names) < num_people:
        full = f"{rng.choice(firsts)} {rng.choice(surnames)}"
        if full not in taken:
            taken.add(full)
            names.append(full)
    people = [_Person(n, rng.choice(_PROFESSIONS), rng.choice(cities), rng.randint(1920, 1995))
              for n in names]
    by_name = {p.name: p for p in people}

    # A fifth of the companies reuse an earlier company's word ("Zhaiven Labs", "Zhaiven Press").
    company_names: list[str] = []
    words: list[str] = []
    while len(company_names) < num_companies:
        word = rng.choice(words) if words and rng.random() < 0.2 else namer.word(2, 3)
        words.append(word)
        name = f"{word} {rng.choice(_COMPANY_KINDS)}"
        if name not in company_names:
            company_names.append(name)
    founders = rng.sample(names, min(num_companies, num_people))
    companies = []
    for i, name in enumerate(company_names):
        founder = by_name[founders[i % len(founders)]]
        year = rng.randint(founder.birth_year + 22, min(founder.birth_year + 45, 2023))
        companies.append(_Company(name, rng.choice(_INDUSTRIES), rng.choice(cities), founder.name, year))
    for p in people:
        p.employer = rng.choice(company_names)
        p.home_city = rng.choice([c for c in cities if c != p.birth_city])
        p.moved_year = rng.randint(p.birth_year + 18, min(p.birth_year + 40, 2023))
        p.hobby = rng.choice(_HOBBIES)
    by_company = {c.name: c for c in companies}

    corpus = _Corpus()
    for p in people:
        prof = f"{_article(p.profession)} {p.profession}"
        corpus.add(rng.choice((f"{p.name} was born in {p.birth_city} in {p.birth_year}.",
                               f"Born in {p.birth_year} in {p.birth_city}, {p.name} grew up there.")),
                   p.name, p.birth_city)
        corpus.add(rng.choice((f"{p.name} works as {prof} at {p.employer}.",
                               f"{p.name} is {prof} employed by {p.employer}.")), p.name, p.employer)
        corpus.add(f"{p.name} moved to {p.home_city} in {p.moved_year} and enjoys {p.hobby}.",
                   p.name, p.home_city)
    for c in companies:
        corpus.add(f"{c.name} was founded in {c.city} in {c.year}.", c.name, c.city)
        corpus.add(f"{c.name}, {_article(c.industry)} {c.industry} company, was founded by {c.founder}.",
                   c.name, c.founder)
    for city in cities:
        corpus.add(f"{city} is a {rng.choice(_CITY_SIZES)} city in the country of {city_country[city]}, "
                   f"known for its {rng.choice(_CITY_FEATURES)}.", city, city_country[city])
    for k in countries:
        corpus.add(f"{k} is a country whose capital is {capitals[k]}.", k, capitals[k])

    # Candidate questions per entity: (relation, entity, answer, bridge).
    def person_questions(p: _Person) -> list[tuple[str, str, str, str]]:
        emp = by_company[p.employer]
        return [("birth_city", p.name, p.birth_city, ""), ("birth_year", p.name, str(p.birth_year), ""),
                ("employer", p.name, p.employer, ""), ("profession", p.name, p.profession, ""),
                ("birth_country", p.name, city_country[p.birth_city], p.birth_city),
                ("employer_founder", p.name, emp.founder, emp.name),
                ("employer_city", p.name, emp.city, emp.name),
                ("employer_year", p.name, str(emp.year), emp.name)]

    def company_questions(c: _Company) -> list[tuple[str, str, str, str]]:
        f = by_name[c.founder]
        return [("company_city", c.name, c.city, ""), ("company_year", c.name, str(c.year), ""),
                ("company_founder", c.name, c.founder, ""),
                ("founder_birth_city", c.name, f.birth_city, f.name),
                ("founder_birth_year", c.name, str(f.birth_year), f.name),
                ("company_country", c.name, city_country[c.city], c.city)]

    sizes = {"train": train_size, "val": val_size, "test": test_size}
    total = sum(sizes.values())
    if total <= 0:
        raise ValueError("at least one split must be non-empty")
    groups = [[(p, person_questions) for p in people], [(c, company_questions) for c in companies],
              [(c, lambda c: [("city_country", c, city_country[c], "")]) for c in cities],
              [(k, lambda k: [("country_capital", k, capitals[k], "")]) for k in countries]]
    pools: dict[str, tuple[list, list]] = {s: ([], []) for s in SPLITS}
    for group in groups:
        rng.shuffle(group)
        start = 0
        for split in SPLITS:  # entities go to splits in proportion to the split sizes
            end = len(group) if split == SPLITS[-1] else start + round(len(group) * sizes[split] / total)
            for entity, make in group[start:end]:
                for rel, ent, answer, bridge in make(entity):
                    if _valid(corpus, ent, answer, bridge):
                        pools[split][1 if bridge else 0].append((rel, ent, answer, bridge))
            start = end

    splits: dict[str, tuple[SearchTask, ...]] = {}
    for split in SPLITS:
        n2 = round(sizes[split] * two_hop_fraction)
        n1 = sizes[split] - n2
        one, two = pools[split]
        if len(one) < n1 or len(two) < n2:
            raise ValueError(
                f"split {split!r} needs {n1} 1-hop and {n2} 2-hop questions but its entities only give "
                f"{len(one)} and {len(two)}: raise num_people/num_companies or lower the split sizes")
        chosen = rng.sample(one, n1) + rng.sample(two, n2)
        rng.shuffle(chosen)
        splits[split] = tuple(
            SearchTask(uid=f"world{seed}-{split}-{i:05d}",
                       question=rng.choice(_TEMPLATES[rel]).format(e=ent), answers=(answer,),
                       source="synthetic-2hop" if bridge else "synthetic-1hop", hops=2 if bridge else 1,
                       entity=ent, bridge=bridge)
            for i, (rel, ent, answer, bridge) in enumerate(chosen))

    passages = list(corpus.passages)
    rng.shuffle(passages)  # entity order would otherwise leak through passage ids
    return World(corpus=tuple(passages), splits=splits)


def _valid(corpus: _Corpus, entity: str, answer: str, bridge: str) -> bool:
    """Keep a question only if it needs exactly its number of hops.

    1-hop: some passage naming the entity holds the answer. 2-hop: a passage naming the entity
    holds the bridge, a passage naming the bridge holds the answer, and no passage naming the
    entity holds the answer (else one search would do), and the answer is not the entity.
    """
    if not bridge:
        return any(contains_answer(t, [answer]) for t in corpus.about(entity))
    return (
        answer != entity
        and not any(contains_answer(t, [answer]) for t in corpus.about(entity))
        and any(contains_answer(t, [bridge]) for t in corpus.about(entity))
        and any(contains_answer(t, [answer]) for t in corpus.about(bridge))
    )
