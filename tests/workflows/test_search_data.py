"""The search recipe's data: answer matching, the synthetic world, Search-R1 files."""

from __future__ import annotations

import json
import re
import sys

import pytest

from drmas.workflows.search.answers import contains_answer, exact_match, normalize_answer
from drmas.workflows.search.data import SearchTask, load_corpus, load_search_r1, write_corpus
from drmas.workflows.search.world import synthetic_world

# ------------------------------------------------------------------------------------------
# answers
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("an apple", "apple"),
        ("  Paris,\tFrance \n", "paris france"),
        ("A.B. Smith", "ab smith"),  # initials merge, the "a" is not taken for an article
        ("A", "a"),  # an answer made of articles only is kept rather than emptied
        ("Theodore the Great", "theodore great"),  # "the" only as a whole word
        ("“Saint–Étienne’s”", "saintétiennes"),  # typographic punctuation goes too
        ("1,954", "1954"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match():
    assert exact_match("The Eiffel Tower!", ["eiffel tower"])
    assert exact_match("an apple", ["pear", "Apple"])
    assert exact_match("A.B. Smith", ["AB Smith"])
    assert exact_match("Tav", "Tav")  # a bare string counts as one gold, not as its characters
    assert not exact_match("T", "Tav")
    assert not exact_match("Tav", ["Tavrin"])
    assert not exact_match("eiffel", ["Eiffel Tower"])
    assert not exact_match("", ["the"])  # an empty prediction never matches
    assert not exact_match("paris", [])


def test_contains_answer_is_whole_word():
    assert not contains_answer("Tavrin was born in 1950.", ["Tav"])
    assert contains_answer("Born in 1950 in Tav, Orlo grew up there.", ["Tav"])
    assert contains_answer("He saw the Eiffel Tower at night.", ["Zzz", "eiffel tower"])
    assert not contains_answer("He saw the Eiffel Towers.", ["Eiffel Tower"])
    assert contains_answer("Moved to The Hague in 1980.", ["the hague"])
    assert not contains_answer("founded in 19545", ["1954"])
    assert not contains_answer("anything", ["", "!!"])  # empty golds match nothing


# ------------------------------------------------------------------------------------------
# synthetic world
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0)


def _all_tasks(world):
    return [t for split in world.splits.values() for t in split]


@pytest.fixture(scope="module")
def mentioning(world):
    """name -> the passages naming it as whole words (contains_answer, over a normalised corpus)."""
    padded = [f" {normalize_answer(p)} " for p in world.corpus]

    def find(name):
        key = f" {normalize_answer(name)} "
        return [p for p, n in zip(world.corpus, padded) if key in n]

    return find


def test_world_sizes_and_uids(world):
    assert {k: len(v) for k, v in world.splits.items()} == {"train": 1000, "val": 100, "test": 100}
    assert 1000 <= len(world.corpus) <= 2000
    assert len(set(world.corpus)) == len(world.corpus)
    tasks = _all_tasks(world)
    assert len({t.uid for t in tasks}) == len(tasks)
    assert world.splits["train"][17].uid == "world0-train-00017"
    assert all(re.fullmatch(r"world0-(train|val|test)-\d{5}", t.uid) for t in tasks)
    assert all(t.question.endswith("?") and len(t.answers) == 1 and t.answers[0] for t in tasks)


def test_same_seed_same_world_other_seed_other_names(world):
    assert synthetic_world(seed=0) == world
    other = synthetic_world(seed=1)
    assert other.corpus != world.corpus
    names = {t.entity for t in _all_tasks(world)}
    other_names = {t.entity for t in _all_tasks(other)}
    assert len(names & other_names) < 0.05 * len(names)


def test_splits_disjoint_by_question_and_entity(world):
    questions = {s: {t.question for t in ts} for s, ts in world.splits.items()}
    entities = {s: {t.entity for t in ts} for s, ts in world.splits.items()}
    for a, b in [("train", "val"), ("train", "test"), ("val", "test")]:
        assert not questions[a] & questions[b]
        assert not entities[a] & entities[b]
    assert sum(map(len, questions.values())) == len(_all_tasks(world))  # no repeated question


def test_sixty_forty_mix_in_every_split(world):
    for name, tasks in world.splits.items():
        two = [t for t in tasks if t.hops == 2]
        assert len(two) == round(0.4 * len(tasks)), name
        assert all(t.source == "synthetic-2hop" and t.bridge for t in two)
        one = [t for t in tasks if t.hops != 2]
        assert all(t.hops == 1 and t.source == "synthetic-1hop" and not t.bridge for t in one)


def test_one_hop_answer_is_in_a_passage_naming_the_entity(world, mentioning):
    for t in _all_tasks(world):
        if t.hops == 1:
            assert t.entity in t.question
            assert any(t.answers[0] in p for p in mentioning(t.entity)), t


def test_two_hop_questions_need_the_bridge(world, mentioning):
    for t in _all_tasks(world):
        if t.hops != 2:
            continue
        about_entity = mentioning(t.entity)
        assert t.entity in t.question and t.bridge not in t.question
        assert any(contains_answer(p, [t.bridge]) for p in about_entity), t
        assert any(t.answers[0] in p for p in mentioning(t.bridge)), t
        # no shortcut: the passages naming the entity never hold the answer
        assert not any(contains_answer(p, t.answers) for p in about_entity), t


def test_questions_use_several_templates(world):
    shapes = {t.question.replace(t.entity, "{e}") for t in world.splits["train"]}
    assert len(shapes) >= 20
    for relation_word in ("born", "founded", "country", "employ"):
        assert sum(relation_word in s for s in shapes) >= 2, relation_word


def test_small_world_and_too_many_questions():
    small = synthetic_world(seed=3, num_people=40, num_companies=10, num_cities=12, num_countries=3,
                            train_size=50, val_size=10, test_size=10)
    assert [len(small.splits[s]) for s in ("train", "val", "test")] == [50, 10, 10]
    with pytest.raises(ValueError, match="num_people"):
        synthetic_world(num_people=20, num_companies=5, num_cities=10, num_countries=2)


def test_bm25_finds_the_supporting_passage_from_the_question(world):
    bm25s = pytest.importorskip("bm25s")
    retriever = bm25s.BM25()
    def tokens(texts):
        return bm25s.tokenize(texts, stopwords="en", show_progress=False)

    retriever.index(tokens(list(world.corpus)), show_progress=False)
    one_hop = [t for t in world.splits["train"] if t.hops == 1][:300]
    docs, _ = retriever.retrieve(tokens([t.question for t in one_hop]), k=3, show_progress=False)
    found = [any(t.entity in world.corpus[i] and t.answers[0] in world.corpus[i] for i in row)
             for t, row in zip(one_hop, docs)]
    assert sum(found) >= 0.9 * len(found)


# ------------------------------------------------------------------------------------------
# Search-R1 files
# ------------------------------------------------------------------------------------------


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_load_search_r1_raw_shape(tmp_path):
    path = _write_jsonl(tmp_path / "nq_train.jsonl", [
        {"id": "train_0", "question": "who wrote the iliad", "golden_answers": ["Homer"]},
        {"id": "train_1", "question": "capital of france?", "golden_answers": "Paris"},
    ])
    assert load_search_r1(path, source="nq") == [
        SearchTask(uid="nq-0", question="who wrote the iliad?", answers=("Homer",), source="nq", hops=0),
        SearchTask(uid="nq-1", question="capital of france?", answers=("Paris",), source="nq", hops=0),
    ]
    assert [t.uid for t in load_search_r1(path)] == ["nq_train-0", "nq_train-1"]  # no source: the file name


def test_load_search_r1_verl_shape(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", [
        {"data_source": "hotpotqa", "question": "Which band had more members",
         "prompt": [{"role": "user", "content": "..."}],
         "reward_model": {"style": "rule", "ground_truth": {"target": ["Queen", "queen (band)"]}}},
        {"data_source": "nq", "question": "when was it built?",
         "reward_model": {"ground_truth": {"target": "1889"}}},
    ])
    tasks = load_search_r1(path)
    assert [(t.uid, t.source, t.question, t.answers) for t in tasks] == [
        ("hotpotqa-0", "hotpotqa", "Which band had more members?", ("Queen", "queen (band)")),
        ("nq-1", "nq", "when was it built?", ("1889",)),
    ]


def test_load_search_r1_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"data_source": "nq", "question": "who painted the mona lisa",
         "reward_model": {"style": "rule", "ground_truth": {"target": ["Leonardo da Vinci", "Leonardo"]}}},
        {"data_source": "nq", "question": "how tall is it?",
         "reward_model": {"style": "rule", "ground_truth": {"target": ["330 m"]}}},
    ]
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    tasks = load_search_r1(path)
    assert [(t.uid, t.question, t.answers) for t in tasks] == [
        ("nq-0", "who painted the mona lisa?", ("Leonardo da Vinci", "Leonardo")),
        ("nq-1", "how tall is it?", ("330 m",)),
    ]
    # a row without answers is reported by row number
    no_answers = {"data_source": "nq", "question": "q", "golden_answers": []}
    pq.write_table(pa.Table.from_pylist([rows[0], no_answers]), path)
    with pytest.raises(ValueError, match=r"test\.parquet: row 1 has no answers"):
        load_search_r1(path)


def test_answers_given_as_a_numpy_array():
    np = pytest.importorskip("numpy")
    from drmas.workflows.search.data import _gold_answers

    record = {"reward_model": {"ground_truth": {"target": np.array(["a b", "c"])}}}
    assert _gold_answers(record) == ["a b", "c"]


def test_parquet_without_pyarrow_names_the_install(tmp_path, monkeypatch):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import now fails
    with pytest.raises(ImportError, match=r"pip install 'drmas\[parquet\]'"):
        load_search_r1(path)


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nowhere" / "train.jsonl"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        load_search_r1(path)
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        load_corpus(path)


def test_record_without_answers_or_question_is_a_clear_error(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [
        {"question": "ok?", "golden_answers": ["yes"]},
        {"question": "no answers here", "reward_model": {"ground_truth": {"target": []}}},
    ])
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2 has no answers"):
        load_search_r1(path)
    _write_jsonl(path, [{"golden_answers": ["x"]}])
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 1 has no 'question'"):
        load_search_r1(path)
    path.write_text('{"question": "q", "golden_answers": ["a"]}\n\n{not json\n')
    with pytest.raises(ValueError, match=r"line 3 is not valid JSON"):
        load_search_r1(path)


def test_corpus_round_trip_keeps_title_and_text_whole(tmp_path):
    corpus = ['"Eiffel Tower"\nThe Eiffel Tower is in Paris.', "Tav is a city.", "ünïcode — passage"]
    path = tmp_path / "sub" / "corpus.jsonl"
    write_corpus(corpus, path)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines[0] == {"id": "0", "contents": corpus[0]}
    assert load_corpus(path) == corpus
    records = [{"title": "Tav", "text": "A city."}, {"text": "Untitled."}]
    other = _write_jsonl(tmp_path / "text.jsonl", records)
    assert load_corpus(other) == ["Tav\nA city.", "Untitled."]
    _write_jsonl(other, [{"id": 1}])
    with pytest.raises(ValueError, match="line 1 has neither"):
        load_corpus(other)


def test_world_corpus_round_trips_through_jsonl(world, tmp_path):
    write_corpus(world.corpus, tmp_path / "c.jsonl")
    assert tuple(load_corpus(tmp_path / "c.jsonl")) == world.corpus
