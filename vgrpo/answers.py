"""What a model answered on the smoke images (`Answer`, `Forced`, `Run`), shared by the llama.cpp runtime
and the transformers reference, and how far apart two next-token distributions are, seen through the
reference's likely tokens: a bf16 or 4-bit reference against a 16-bit file differs most on unlikely
tokens, which say nothing about the answer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Log-probs are compared where the reference gives a token p > 1e-3, not in the tail.
MIN_REFERENCE_P = 1e-3


@dataclass
class Answer:
    text: str
    token_ids: list[int]  # generated ids, the end-of-turn token included when the model stopped
    first_logprobs: np.ndarray  # log-probabilities of the first generated token, over the vocabulary
    seconds: float  # the whole request: image encoding, prompt, generation
    count_logprobs: np.ndarray | None = None  # log-probabilities where the answer states its first count
    blank_count_logprobs: np.ndarray | None = None  # the same, its prefix kept, with a blank image instead
    cut: bool = False  # generation hit its token limit before the model ended its turn


@dataclass
class Forced:
    """llama.cpp following the reference answer token by token (teacher forcing)."""
    choices: list[int]  # its own greedy choice at each position of the reference answer
    count_logprobs: np.ndarray | None  # its log-probabilities at the reference's first count
    blank_count_logprobs: np.ndarray | None = None  # the same with a blank image: does the image move it?


def blank_image(image):
    """A white image of the same size: no shape to count."""
    from PIL import Image

    return Image.new("RGB", image.size, "white")


def count_positions(ids: list[int], tokenizer) -> list[int]:
    """Where an answer states numbers (its digit tokens: the counts in its reasoning and its answer)."""
    return [i for i, token in enumerate(ids) if tokenizer.decode([token]).strip()[:1].isdigit()]


def count_position(ids: list[int], tokenizer) -> int | None:
    """The position of an answer's first digit: where the model says how many it sees."""
    return next(iter(count_positions(ids, tokenizer)), None)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


@dataclass
class Run:
    """One model on the smoke images: its greedy answer to each image's own question, and for llama.cpp
    what it does when made to follow the reference's answer (teacher forcing)."""
    answers: list[Answer]
    load_seconds: float
    image_embeddings: list[np.ndarray]  # what the vision side hands the language model, per image
    forced: list[Forced] | None = None
    count_positions: list[list[int]] | None = None  # the reference's: where each answer states a number


def likely_tokens(reference: np.ndarray) -> np.ndarray:
    """The tokens the reference gives p > MIN_REFERENCE_P (its top token always)."""
    likely = np.flatnonzero(reference > np.log(MIN_REFERENCE_P))
    return likely if likely.size else np.array([int(np.argmax(reference))])


def likely_tv(logprobs: np.ndarray, reference: np.ndarray) -> float:
    """Total-variation distance between two next-token distributions, seen through the reference's likely
    tokens (`likely_tokens`) plus one bucket for all the others (0: the same, 1: disjoint)."""
    likely = likely_tokens(reference)
    p, q = np.exp(logprobs[likely]), np.exp(reference[likely])
    return float(0.5 * (np.abs(p - q).sum() + abs(q.sum() - p.sum())))


def logprob_diff(logprobs: np.ndarray, reference: np.ndarray) -> float:
    """Largest |log p - log p_ref| over the reference's likely tokens (`likely_tokens`)."""
    likely = likely_tokens(reference)
    return float(np.abs(logprobs[likely] - reference[likely]).max())


def tokens_per_second(answers: list[Answer]) -> float:
    return sum(len(a.token_ids) for a in answers) / sum(a.seconds for a in answers)
