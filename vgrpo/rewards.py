"""Reward functions for GRPO, selectable by name in `params.yaml` (`train.rewards: {name: weight}`).

Each takes TRL's `completions` (strings, or conversational lists of messages) plus the dataset's
columns as keyword lists (`answer`, `target_shape`, `target_colour`, `counts`; the rest are ignored) and
returns one float per completion. A reward never raises: odd completions or column values score
as a wrong answer would.

The answer format is `<REASONING>...</REASONING><SOLUTION>n</SOLUTION>` (see `vgrpo.prompts`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from vgrpo.config import ConfigError
from vgrpo.prompts import INTEGER, REASONING_END, REASONING_START, SOLUTION_END, SOLUTION_START, reasoning_text

Reward = Callable[..., list[float]]
# Used when the dataset has no target_colour column (the defaults of generate.colours).
DEFAULT_COLOURS = {"triangles": "red", "circles": "blue", "squares": "green"}
SHAPE_WORDS = {
    "triangles": ("triangle", "triangles", "triangular"),
    "circles": ("circle", "circles", "circular"),
    "squares": ("square", "squares", "rectangular"),
}
# Whole words only: the seed matched substrings, so "so" scored inside "also".
_REASONING_PHRASE = re.compile(r"(?<!\w)(?:therefore|so|total|the\s+count\s+is|the\s+answer\s+is)(?!\w)",
                               re.IGNORECASE)


def _text(completion) -> str:
    """A completion's text: the string itself, or the concatenated text of its messages."""
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, list):
        return ""
    pieces = []
    for message in completion:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            pieces.append(content)
        elif isinstance(content, list):
            pieces += [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
    return "".join(pieces)


def _column(kwargs: dict, name: str, n: int) -> list:
    """A dataset column padded with None to n rows, so a missing or short column cannot raise."""
    values = kwargs.get(name)
    values = list(values)[:n] if isinstance(values, list | tuple) else []
    return values + [None] * (n - len(values))


def _integer(value) -> int | None:
    """The integer a whole string (or int) states, else None; never int() on an unbounded string."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and INTEGER.fullmatch(value.strip()):  # the evaluation's rule: <= 9 digits
        return int(value.strip())
    return None


def _tagged_answer(text: str) -> int | None:
    """The integer alone in the one `<SOLUTION>` block, else None."""
    if text.count(SOLUTION_START) != 1 or text.count(SOLUTION_END) != 1:
        return None
    start, end = text.index(SOLUTION_START) + len(SOLUTION_START), text.index(SOLUTION_END)
    return _integer(text[start:end]) if start <= end else None


def _well_formed(text: str) -> bool:
    """Each tag exactly once, in order, around non-blank reasoning and solution."""
    tags = (REASONING_START, REASONING_END, SOLUTION_START, SOLUTION_END)
    if any(text.count(tag) != 1 for tag in tags):
        return False
    starts = [text.index(tag) for tag in tags]
    if starts != sorted(starts):
        return False
    reasoning = text[starts[0] + len(REASONING_START):starts[1]]
    solution = text[starts[2] + len(SOLUTION_START):starts[3]]
    return bool(reasoning.strip() and solution.strip())


def _describes(text: str, shape, colour) -> bool:
    if not isinstance(shape, str) or shape not in SHAPE_WORDS:
        return False
    # The row's own colour when the column has one: "red" means nothing for purple triangles.
    colour = colour if isinstance(colour, str) and colour.strip() else DEFAULT_COLOURS[shape]
    words = "|".join(re.escape(word) for word in (*SHAPE_WORDS[shape], colour.strip()))
    return re.search(rf"(?<!\w)(?:{words})(?!\w)", text, re.IGNORECASE) is not None


def correctness_tags(completions, **kwargs) -> list[float]:
    """+2.0 when the single `<SOLUTION>` block holds just the right integer, else 0.0."""
    answers = _column(kwargs, "answer", len(completions))
    rewards = []
    for completion, answer in zip(completions, answers, strict=True):
        given, expected = _tagged_answer(_text(completion)), _integer(answer)
        rewards.append(2.0 if given is not None and given == expected else 0.0)
    return rewards


def correctness_partial(completions, **kwargs) -> list[float]:
    """+2.0 x max(0, 1 - |n - answer| / answer) for the integer n alone in the single `<SOLUTION>` block:
    full credit when right, partial credit when close (CrowdVLM-R1's fuzzy count reward, arXiv 2504.03724)."""
    answers = _column(kwargs, "answer", len(completions))
    rewards = []
    for completion, answer in zip(completions, answers, strict=True):
        given, expected = _tagged_answer(_text(completion)), _integer(answer)
        if given is None or expected is None or expected <= 0:
            rewards.append(0.0)
        else:
            rewards.append(round(2.0 * max(0.0, 1.0 - abs(given - expected) / expected), 6))
    return rewards


def format_tags(completions, **kwargs) -> list[float]:
    """+1.0 for `<REASONING>x</REASONING><SOLUTION>y</SOLUTION>`; -2.0 if truncated; else -1.0."""
    rewards = []
    for text in map(_text, completions):
        # No closing tag means generation hit max_completion_length: the worst case to learn from.
        if SOLUTION_END not in text:
            rewards.append(-2.0)
        else:
            rewards.append(1.0 if _well_formed(text) else -1.0)
    return rewards


def correctness_free(completions, **kwargs) -> list[float]:
    """+1.0 when the last integer anywhere in the response is the answer, else 0.0."""
    answers = _column(kwargs, "answer", len(completions))
    rewards = []
    for completion, answer in zip(completions, answers, strict=True):
        numbers, expected = INTEGER.findall(_text(completion)), _integer(answer)
        rewards.append(1.0 if numbers and expected is not None and int(numbers[-1]) == expected else 0.0)
    return rewards


def description(completions, **kwargs) -> list[float]:
    """+0.5 when the response names the target shape, its colour or its adjective, else 0.0."""
    n = len(completions)
    rows = zip(completions, _column(kwargs, "target_shape", n), _column(kwargs, "target_colour", n), strict=True)
    return [0.5 if _describes(_text(completion), shape, colour) else 0.0 for completion, shape, colour in rows]


def reasoning(completions, **kwargs) -> list[float]:
    """+0.2 when the response uses a reasoning phrase ("therefore", "so", "the answer is", ...), else 0.0."""
    return [0.2 if _REASONING_PHRASE.search(_text(completion)) else 0.0 for completion in completions]


def stated_count(reasoning: str, shape: str) -> int | None:
    """The number written just before a shape's name (optionally with a colour word between), if one is."""
    if shape not in SHAPE_WORDS:
        return None
    words = "|".join(SHAPE_WORDS[shape][:2])
    found = re.search(rf"(?<!\d)(\d{{1,9}})\s+(?:[a-z]+\s+)?(?:{words})(?!\w)", reasoning, re.IGNORECASE)
    return int(found.group(1)) if found else None


def counts_described(completions, **kwargs) -> list[float]:
    """+1/3 for each shape whose true count the reasoning states ("2 red triangles"), else 0.0."""
    n = len(completions)
    rewards = []
    for completion, counts in zip(completions, _column(kwargs, "counts", n), strict=True):
        reasoning_part = reasoning_text(_text(completion))
        if not isinstance(counts, dict):
            rewards.append(0.0)
            continue
        right = sum(stated_count(reasoning_part, shape) == _integer(counts.get(shape)) for shape in SHAPE_WORDS)
        rewards.append(right / len(SHAPE_WORDS))
    return rewards


def answer_follows_reasoning(completions, **kwargs) -> list[float]:
    """+1.0 when the `<SOLUTION>` number is the count the reasoning states for the asked shape, else 0.0."""
    n = len(completions)
    rewards = []
    for completion, shape in zip(completions, _column(kwargs, "target_shape", n), strict=True):
        text = _text(completion)
        stated = stated_count(reasoning_text(text), shape) if isinstance(shape, str) else None
        rewards.append(1.0 if stated is not None and _tagged_answer(text) == stated else 0.0)
    return rewards


REWARDS: dict[str, Reward] = {
    "correctness_tags": correctness_tags,
    "correctness_partial": correctness_partial,
    "format_tags": format_tags,
    "correctness_free": correctness_free,
    "description": description,
    "reasoning": reasoning,
    "counts_described": counts_described,
    "answer_follows_reasoning": answer_follows_reasoning,
}


def reward_functions(weights: dict[str, float]) -> tuple[list[Reward], list[float]]:
    """`train.rewards` -> (TRL's `reward_funcs`, `GRPOConfig.reward_weights`), in the same order. A weight
    of 0 turns a reward off (a profile merges into the default's table, so it cannot remove a key)."""
    for name in weights:
        if name not in REWARDS:
            raise ConfigError(f"train.rewards.{name}: unknown reward (expected one of {', '.join(REWARDS)})")
    used = {name: float(weight) for name, weight in weights.items() if weight}
    return [REWARDS[name] for name in used], list(used.values())
