"""Rewards score the seed's examples as specified, and never raise whatever TRL hands them."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vgrpo.config import REWARD_NAMES, ConfigError
from vgrpo.prompts import REASONING_END, REASONING_START, SOLUTION_END, SOLUTION_START
from vgrpo.rewards import REWARDS, reward_functions, stated_count

FREE_TEXT = ("The image contains two red triangles, three blue circles, and one green square. "
             "The question asks for circles, so the answer is 3.")
TAGGED = "<REASONING>I see three blue circles.</REASONING><SOLUTION>3</SOLUTION>"


def score(name: str, text, answer="3", target_shape="circles", **columns) -> float:
    """One completion's reward, with the columns TRL passes (and some it passes that must be ignored)."""
    rewards = REWARDS[name]([text], answer=[answer], target_shape=[target_shape], prompts=[[]],
                            completion_ids=[[1, 2]], trainer_state=None, log_metric=print,
                            **{key: [value] for key, value in columns.items()})
    assert len(rewards) == 1 and isinstance(rewards[0], float)
    return rewards[0]


def scores(text, **columns) -> dict[str, float]:
    return {name: score(name, text, **columns) for name in REWARDS}


def test_seed_free_text_answer():
    assert scores(FREE_TEXT) == {"correctness_tags": 0.0, "correctness_partial": 0.0, "format_tags": -2.0,
                                 "correctness_free": 1.0,
                                 "description": 0.5, "reasoning": 0.2, "counts_described": 0.0,
                                 "answer_follows_reasoning": 0.0}
    free_text_rewards = ("correctness_free", "description", "reasoning")
    assert sum(score(name, FREE_TEXT) for name in free_text_rewards) == pytest.approx(1.7)


def test_well_formed_answer():
    assert score("correctness_tags", TAGGED) == 2.0
    assert score("format_tags", TAGGED) == 1.0
    assert score("correctness_tags", "<REASONING>x</REASONING><SOLUTION>\n 3 \n</SOLUTION>") == 2.0


@pytest.mark.parametrize(("text", "correctness", "format_"), [
    ("<REASONING>three circles</REASONING><SOLUTION>3", 0.0, -2.0),  # truncated
    ("<REASONING>x</REASONING><SOLUTION>3</SOLUTION><SOLUTION>3</SOLUTION>", 0.0, -1.0),  # two blocks
    ("<SOLUTION>3</SOLUTION><REASONING>three</REASONING>", 2.0, -1.0),  # out of order
    ("<REASONING>three</REASONING> then <SOLUTION>3</SOLUTION>", 2.0, 1.0),
    ("<REASONING> \n </REASONING><SOLUTION>3</SOLUTION>", 2.0, -1.0),  # empty reasoning
    ("<REASONING>three</REASONING><SOLUTION> </SOLUTION>", 0.0, -1.0),  # empty solution
    ("<REASONING>three</REASONING><SOLUTION>4</SOLUTION>", 0.0, 1.0),  # wrong answer
    ("<REASONING>three</REASONING><SOLUTION>3 circles</SOLUTION>", 0.0, 1.0),  # not just the number
    ("<REASONING>three</REASONING><SOLUTION>1 2</SOLUTION>", 0.0, 1.0),
    ("<REASONING>three</REASONING><SOLUTION>0000000003</SOLUTION>", 0.0, 1.0),  # 10 digits: not a count
    ("<REASONING>three</REASONING></SOLUTION>3<SOLUTION>", 0.0, -1.0),
    ("", 0.0, -2.0),
])
def test_tag_rewards(text, correctness, format_):
    assert score("correctness_tags", text) == correctness
    assert score("format_tags", text) == format_


@pytest.mark.parametrize(("text", "expected"), [
    ("so the answer is 4", 0.0),
    ("3 or 4? 4", 0.0),
    ("<SOLUTION>3</SOLUTION>", 1.0),
    ("I count 2, then 3.", 1.0),
    ("3 circles", 1.0),
    ("no number", 0.0),
    ("1234567893", 0.0),  # 10 digits are not a count, not "3"
])
def test_correctness_free(text, expected):
    assert score("correctness_free", text) == expected


@pytest.mark.parametrize("answer", [None, "", "abc", "9" * 100_000, " 3 ", 3])
def test_odd_answers(answer):
    expected = 2.0 if answer in (" 3 ", 3) else 0.0
    assert score("correctness_tags", TAGGED, answer=answer) == expected
    assert score("correctness_free", TAGGED, answer=answer) == expected / 2


@pytest.mark.parametrize(("text", "expected"), [("also", 0.0), ("So", 0.2), ("so,", 0.2), ("in TOTAL", 0.2),
                                                ("Therefore", 0.2), ("totally", 0.0), ("the count is", 0.2),
                                                ("the  answer\nis", 0.2), ("isotope", 0.0), ("", 0.0)])
def test_reasoning_matches_whole_words(text, expected):
    assert score("reasoning", text) == expected


@pytest.mark.parametrize(("text", "shape", "expected"), [
    ("a Circle", "circles", 0.5),
    ("circular blobs", "circles", 0.5),
    ("BLUE ones", "circles", 0.5),
    ("bluish semicircles", "circles", 0.0),
    ("three red things", "triangles", 0.5),
    ("triangular", "triangles", 0.5),
    ("rectangular", "squares", 0.5),
    ("green", "squares", 0.5),
    ("green", "circles", 0.0),
    ("triangle", "hexagons", 0.0),
    ("triangle", None, 0.0),
    ("triangle", ["triangles"], 0.0),
])
def test_description(text, shape, expected):
    assert score("description", text, target_shape=shape) == expected


def test_description_colour_comes_from_the_row():
    assert score("description", "two purple shapes", target_shape="triangles", target_colour="purple") == 0.5
    assert score("description", "two red shapes", target_shape="triangles", target_colour="purple") == 0.0
    assert score("description", "two red shapes", target_shape="triangles", target_colour=None) == 0.5
    rewards = REWARDS["description"](["purple", "purple"], target_shape=["triangles", "squares"],
                                     target_colour=["purple", "orange"])
    assert rewards == [0.5, 0.0]


@pytest.mark.parametrize("text", [FREE_TEXT, TAGGED, "<REASONING>three circles</REASONING><SOLUTION>3", "also"])
def test_conversational_completions_score_like_strings(text):
    half = len(text) // 2
    conversations = [
        [{"role": "assistant", "content": text}],
        [{"role": "assistant", "content": [{"type": "text", "text": text[:half]}]},
         {"role": "assistant", "content": [{"type": "text", "text": text[half:]}]}],
    ]
    for conversation in conversations:
        assert scores(conversation) == scores(text)


def test_missing_columns_score_zero():
    for name, reward in REWARDS.items():
        rewards = reward([TAGGED, FREE_TEXT])
        assert rewards == {"format_tags": [1.0, -2.0], "reasoning": [0.0, 0.2]}.get(name, [0.0, 0.0])


ROW_COUNTS = {"triangles": 2, "circles": 3, "squares": 0}


@pytest.mark.parametrize("text, expected", [
    ("<REASONING>2 red triangles, 3 blue circles, 0 green squares</REASONING><SOLUTION>3</SOLUTION>", 1.0),
    ("<REASONING>2 red triangles, 4 blue circles, 0 green squares</REASONING><SOLUTION>3</SOLUTION>", 2 / 3),
    ("<REASONING>3 circles</REASONING><SOLUTION>3</SOLUTION>", 1 / 3),
    ("<REASONING>I see circles.</REASONING><SOLUTION>3 circles, 2 triangles</SOLUTION>", 0.0),  # not the reasoning
    ("<REASONING>12 red triangles</REASONING>", 0.0),
    ("<REASONING>I see circles.</REASONING> 3 blue circles <SOLUTION>3</SOLUTION>", 0.0),  # evaluate's cut
    ("2 red triangles <SOLUTION>3</SOLUTION>", 1 / 3),  # no reasoning tags: everything before the answer
    ("", 0.0),
])
def test_counts_described(text, expected):
    assert score("counts_described", text, counts=ROW_COUNTS) == pytest.approx(expected)


@pytest.mark.parametrize("text, shape, expected", [
    ("<REASONING>2 red triangles, 3 blue circles, 0 green squares</REASONING><SOLUTION>3</SOLUTION>", "circles", 1.0),
    ("<REASONING>2 red triangles, 4 blue circles, 0 green squares</REASONING><SOLUTION>4</SOLUTION>", "circles", 1.0),
    ("<REASONING>2 red triangles, 4 blue circles, 0 green squares</REASONING><SOLUTION>3</SOLUTION>", "circles", 0.0),
    ("<REASONING>2 red triangles, 3 blue circles</REASONING><SOLUTION>2</SOLUTION>", "circles", 0.0),  # other shape
    ("<REASONING>I count the blue circles.</REASONING><SOLUTION>3</SOLUTION>", "circles", 0.0),  # states no count
    ("<REASONING>3 blue circles</REASONING>", "circles", 0.0),  # no answer
    ("<REASONING>3 blue circles</REASONING><SOLUTION>3</SOLUTION>", None, 0.0),
])
def test_answer_follows_reasoning(text, shape, expected):
    """Consistency, not correctness: the answer repeats the count the reasoning states for the asked shape."""
    assert score("answer_follows_reasoning", text, target_shape=shape) == expected


@pytest.mark.parametrize("text, answer, expected", [
    ("<SOLUTION>4</SOLUTION>", "4", 2.0),
    ("<SOLUTION>3</SOLUTION>", "4", 1.5),  # one off a count of 4: three quarters of the credit
    ("<SOLUTION>5</SOLUTION>", "4", 1.5),
    ("<SOLUTION>2</SOLUTION>", "1", 0.0),  # one off a count of 1 is 100% off
    ("<SOLUTION>9</SOLUTION>", "2", 0.0),  # never negative
    ("<SOLUTION>three</SOLUTION>", "3", 0.0),
    ("<SOLUTION>3</SOLUTION><SOLUTION>3</SOLUTION>", "3", 0.0),  # one block, as correctness_tags
])
def test_correctness_partial(text, answer, expected):
    assert REWARDS["correctness_partial"]([text], answer=[answer]) == [expected]


@pytest.mark.parametrize("reasoning, shape, expected", [
    ("2 red triangles, 3 blue circles, 0 green squares", "circles", 3),
    ("there are 4 circles here", "circles", 4),
    ("1 circle", "circles", 1),
    ("2 red triangles", "circles", None),
    ("3 circles", "hexagons", None),  # not a shape the task asks about
])
def test_stated_count(reasoning, shape, expected):
    assert stated_count(reasoning, shape) == expected


def test_registry_matches_config():
    assert tuple(REWARDS) == REWARD_NAMES
    assert all(reward.__name__ == name for name, reward in REWARDS.items())  # TRL logs rewards/<__name__>


def test_reward_functions_keeps_params_order():
    funcs, weights = reward_functions({"format_tags": 0.5, "correctness_tags": 2})
    assert funcs == [REWARDS["format_tags"], REWARDS["correctness_tags"]]
    assert weights == [0.5, 2.0] and all(isinstance(weight, float) for weight in weights)
    assert reward_functions({}) == ([], [])


def test_unknown_reward_is_a_config_error():
    with pytest.raises(ConfigError) as error:
        reward_functions({"correctness_tags": 1.0, "vibes": 1.0})
    assert str(error.value) == ("train.rewards.vibes: unknown reward (expected one of correctness_tags, "
                                "correctness_partial, format_tags, correctness_free, description, reasoning, "
                                "counts_described, answer_follows_reasoning)")


# Built once: huge strings drawn by hypothesis itself would be slow and hit its size limits.
HUGE = ["9" * 100_000, SOLUTION_START * 10_000, SOLUTION_END * 9_000, "so " * 33_000, " " * 100_000 + "3",
        (REASONING_START + "x" + REASONING_END) * 4_000 + SOLUTION_START + "3" + SOLUTION_END, "the" + " " * 100_000]
FRAGMENTS = [REASONING_START, REASONING_END, SOLUTION_START, SOLUTION_END, "<SOLUTION", "SOLUTION>", "</", "<", ">",
             "3", "-3", "٣", "３", "𝟑", "1234567890", " ", "\n", "so", "also", "triangle", "Circular", "red",
             "the count is"]
texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", *HUGE]),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=12).map("".join),
)
junk = st.one_of(st.none(), st.integers(), st.floats(), st.booleans(), st.binary(max_size=4))
parts = st.one_of(junk, texts, st.dictionaries(st.text(max_size=4), junk, max_size=2),
                  st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": st.one_of(texts, junk)}))
messages = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["assistant", "tool"]),
                           "content": st.one_of(texts, junk, st.lists(parts, max_size=4))}),
    junk, texts, st.lists(junk, max_size=2), st.dictionaries(st.text(max_size=4), junk, max_size=2),
)
completions = st.one_of(texts, junk, st.lists(messages, max_size=4),
                        st.lists(st.lists(messages, max_size=2), max_size=2),  # nested junk
                        st.dictionaries(st.text(max_size=4), texts, max_size=2))
answers = st.one_of(junk, st.text(max_size=12), st.sampled_from(["", "3", " 3\n", "٣", "-1", "abc", "9" * 10_000]))
shapes = st.one_of(junk, st.text(max_size=12), st.lists(st.text(max_size=3), max_size=2),
                   st.sampled_from(["triangles", "circles", "squares", "hexagons", "", "CIRCLES"]))
colours = st.one_of(junk, st.text(max_size=8), st.sampled_from(["red", "purple", "", " ", "(", "light blue"]))
counts = st.one_of(junk, st.dictionaries(st.sampled_from(["triangles", "circles", "squares", "x"]),
                                         st.one_of(junk, st.integers(-2, 10), st.text(max_size=3)), max_size=4))


@st.composite
def batches(draw):
    """Completions plus columns that are usually the right length, sometimes short, odd or missing."""
    batch = draw(st.lists(completions, max_size=4))
    columns = {}
    for name, values in (("answer", answers), ("target_shape", shapes), ("target_colour", colours),
                         ("counts", counts)):
        size = draw(st.one_of(st.just(len(batch)), st.integers(0, 5)))
        column = draw(st.one_of(st.lists(values, min_size=size, max_size=size), junk, st.just("missing")))
        if column != "missing":
            columns[name] = column
    return batch, columns


@settings(max_examples=2_000, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_rewards_never_raise(batch):
    completions, columns = batch
    for reward in REWARDS.values():
        rewards = reward(completions, **columns, prompts=None, trainer_state=object())
        assert len(rewards) == len(completions)
        assert all(type(value) is float for value in rewards)
