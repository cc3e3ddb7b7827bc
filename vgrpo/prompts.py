"""The one prompt and answer format, shared by `generate` (the dataset's prompt column), `train`,
`evaluate` and `smoke`, so base, trained and GGUF models always see the identical text.

The answer format is `<REASONING>...</REASONING><SOLUTION>n</SOLUTION>`.
"""

from __future__ import annotations

import base64
import io
import re

REASONING_START, REASONING_END = "<REASONING>", "</REASONING>"
SOLUTION_START, SOLUTION_END = "<SOLUTION>", "</SOLUTION>"

INSTRUCTION = (
    f"First describe the shapes you see and reason about the count between {REASONING_START} and "
    f"{REASONING_END}. Then give only the final number between {SOLUTION_START} and {SOLUTION_END}."
)

_SOLUTION = re.compile(re.escape(SOLUTION_START) + r"(.*?)" + re.escape(SOLUTION_END), re.DOTALL)
# At most 9 digits: longer runs are not counts (and int() refuses strings of over 4300 digits).
INTEGER = re.compile(r"(?<!\d)-?\d{1,9}(?!\d)")


def question_for(shape: str) -> str:
    return f"How many {shape} are in the image?"


def prompt_text(question: str) -> str:
    return f"{question} {INSTRUCTION}"


def conversation(question: str) -> list[dict]:
    """The prompt column TRL reads; TRL puts the `image` column in front of the text."""
    return [{"role": "user", "content": prompt_text(question)}]


def hf_messages(question: str, image) -> list[dict]:
    """The same prompt for a transformers processor: the image first, then the text (as TRL does)."""
    return [{"role": "user", "content": [{"type": "image", "image": image},
                                         {"type": "text", "text": prompt_text(question)}]}]


def llama_cpp_messages(question: str, image) -> list[dict]:
    """The same prompt for llama-cpp-python's chat API (image as a PNG data URI)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                         {"type": "text", "text": prompt_text(question)}]}]


def reference_answer(counts: dict[str, int], colours: dict[str, str], asked: str) -> str:
    """The answer the tiny model's warm start is taught: how many of each shape it sees, in a fixed
    order, then the asked count. Naming all three counts is what made counting learnable for a tiny
    model (tried: naming only the asked shape stayed near chance); short, because on a CPU an SFT step
    costs about linearly in answer tokens."""
    seen = ", ".join(f"{counts[shape]} {colours[shape]} {shape}" for shape in ("triangles", "circles", "squares"))
    return f"{REASONING_START}{seen}{REASONING_END}{SOLUTION_START}{counts[asked]}{SOLUTION_END}"


def brief_answer(counts: dict[str, int], colours: dict[str, str], asked: str) -> str:
    """A well-formed answer that names what it counts but states no count before the answer: the
    warm start's other style (`base.described_share`). The tiny model learns to answer it right more
    slowly than the described one, whose stated counts it can copy."""
    return (f"{REASONING_START}I count the {colours[asked]} {asked}.{REASONING_END}"
            f"{SOLUTION_START}{counts[asked]}{SOLUTION_END}")


def brief_style_fork(tokenizer) -> tuple[list[int], int]:
    """The tokens both warm-start answer styles begin with, and the brief style's first token after them:
    forbidding that token makes greedy decoding describe (evaluate's `base_described`)."""
    counts, colours = {"triangles": 2, "circles": 3, "squares": 1}, {"triangles": "red", "circles": "blue",
                                                                      "squares": "green"}  # any: only words differ
    brief = tokenizer(brief_answer(counts, colours, "circles"), add_special_tokens=False)["input_ids"]
    described = tokenizer(reference_answer(counts, colours, "circles"), add_special_tokens=False)["input_ids"]
    fork = next(i for i, (b, d) in enumerate(zip(brief, described, strict=False)) if b != d)
    return brief[:fork], brief[fork]


def brief_style_openings(tokenizer) -> list[list[int]]:
    """Every token sequence that spells the brief style's opening at the fork (`brief_style_fork`): its one
    token (`>I`) and each split of that text into tokens (`>` then `I`), which a sampler or a greedy path
    could take instead. Forbidding them all makes the warm start describe (evaluate's `base_described`)."""
    text = tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(brief_style_fork(tokenizer)[1])])

    def spellings(rest: str) -> list[list[int]]:
        found = []
        for end in range(1, len(rest) + 1):
            ids = tokenizer(rest[:end], add_special_tokens=False)["input_ids"]
            if len(ids) == 1 and tokenizer.decode(ids) == rest[:end]:
                found += [[ids[0]]] if end == len(rest) else [[ids[0], *tail] for tail in spellings(rest[end:])]
        return found

    return sorted(spellings(text), key=len)


def parse_answer(completion: str) -> int | None:
    """The answer a completion gives: the integer in its single `<SOLUTION>` block, else the last
    integer anywhere in it, else None. Evaluation accuracy uses this rule."""
    if not isinstance(completion, str):
        return None
    solutions = _SOLUTION.findall(completion)
    if len(solutions) == 1:
        numbers = INTEGER.findall(solutions[0])
        if len(numbers) == 1:
            return int(numbers[0])
    numbers = INTEGER.findall(completion)
    return int(numbers[-1]) if numbers else None


def reasoning_text(completion: str) -> str:
    """The reasoning part: inside <REASONING> tags when present, else everything before <SOLUTION>."""
    if REASONING_START in completion and REASONING_END in completion.split(REASONING_START, 1)[1]:
        return completion.split(REASONING_START, 1)[1].split(REASONING_END, 1)[0]
    return completion.split(SOLUTION_START, 1)[0]
