"""What a hotter answer token does to GRPO's rollouts before any training (`train.answer_temperature`): the warm
start's answers sampled as GRPO samples them (its temperature, inverse-CDF draws), 8 a prompt on the first
training images, once as they come and once per answer temperature, the answer's first token drawn among the
digits (the knob's sampler) or, with `--whole-vocabulary`, among every token.

    .venv/bin/python bench/cpu_seeds.py --work /tmp/cpu-seeds --no-controls 0     # first: a seed's clone
    .venv/bin/python bench/answer_temperature.py --repo /tmp/cpu-seeds/seed-0/repo --answer-temperature 0.7 \
        --answer-temperature 1.4
    .venv/bin/python bench/answer_temperature.py --repo /tmp/cpu-seeds/seed-0/repo --whole-vocabulary \
        --answer-temperature 1.4 --answer-temperature 2.0

Prints per sampler: the share of right answers, of described answers and of right ones among those, of
malformed answers (no number), of groups of 4 (GRPO's group size) with reward spread in correctness, and
pass@8. One thread (as bench/cpu_seeds.py runs), so the figures do not depend on the core count.
"""

import sys
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vgrpo.answer_sampling import AnswerTemperature, answer_opening_ids, digit_ids  # noqa: E402
from vgrpo.base import base_model_path  # noqa: E402
from vgrpo.config import load_config  # noqa: E402
from vgrpo.generation import generate  # noqa: E402
from vgrpo.models import load_model, load_processor  # noqa: E402
from vgrpo.prompts import brief_style_fork, parse_answer  # noqa: E402
from vgrpo.sampling import inverse_cdf_sampling  # noqa: E402
from vgrpo.shapes import load_dataset  # noqa: E402

SAMPLES = 8
GROUP = 4


def sampled_answers(model, processor, rows, temperature: float, processors: list, batch_size: int = 16) -> list[str]:
    copies = [row for row in rows for _ in range(SAMPLES)]
    texts = []
    torch.manual_seed(0)  # every sampler draws from the same random stream
    with inverse_cdf_sampling():
        for begin in range(0, len(copies), batch_size):
            ids = generate(model, processor, copies[begin:begin + batch_size], 40, do_sample=True,
                           temperature=temperature, logits_processors=processors)
            texts += processor.tokenizer.batch_decode(ids, skip_special_tokens=True)
    return texts


def figures(rows, texts: list[str], brief_text: str) -> str:
    answers = [parse_answer(text) for text in texts]
    right = [answer == int(rows[i // SAMPLES]["answer"]) for i, answer in enumerate(answers)]
    described = [brief_text not in text for text in texts]
    right_described = [r for r, d in zip(right, described, strict=True) if d]
    groups = [right[begin:begin + GROUP] for begin in range(0, len(right), GROUP)]
    reached = [any(right[i * SAMPLES:(i + 1) * SAMPLES]) for i in range(len(rows))]
    share = lambda flags: sum(flags) / max(1, len(flags))  # noqa: E731
    return (f"right {share(right):.3f}, described {share(described):.3f}, right among described "
            f"{share(right_described):.3f}, malformed {share([a is None for a in answers]):.3f}, groups of {GROUP} "
            f"with spread {share([len(set(g)) > 1 for g in groups]):.3f}, pass@{SAMPLES} {share(reached):.3f}")


@click.command()
@click.option("--repo", type=click.Path(path_type=Path, exists=True), required=True,
              help="A clone where the cpu profile's base stage ran (models/base, data/shapes, params.yaml).")
@click.option("--answer-temperature", "answer_temperatures", type=float, multiple=True, required=True)
@click.option("--whole-vocabulary", is_flag=True, help="Draw the answer token among every token, not the digits.")
@click.option("--images", type=int, default=64, show_default=True, help="The first training images.")
def main(repo: Path, answer_temperatures: tuple[float, ...], whole_vocabulary: bool, images: int) -> None:
    torch.set_num_threads(1)
    config = load_config(repo / "params.yaml")
    path = base_model_path(repo / "models" / "base")
    model, processor = load_model(path, "float32").eval(), load_processor(path, config.model)
    train = load_dataset(repo / "data" / "shapes", splits=("train",))["train"]
    rows = [train[i] for i in range(min(images, len(train)))]
    temperature = config.train.temperature
    opening = answer_opening_ids(processor.tokenizer)
    allowed = list(range(model.config.text_config.vocab_size)) if whole_vocabulary else digit_ids(processor.tokenizer)
    brief_text = processor.tokenizer.decode(brief_style_fork(processor.tokenizer)[1])
    where = "every token" if whole_vocabulary else "the digits"
    print(f"{len(rows)} training images x {SAMPLES} answers at temperature {temperature}, warm start of {repo}")
    print(f"as they come: {figures(rows, sampled_answers(model, processor, rows, temperature, []), brief_text)}")
    for answer_temperature in answer_temperatures:
        sampler = AnswerTemperature(opening, allowed, answer_temperature / temperature)
        texts = sampled_answers(model, processor, rows, temperature, [sampler])
        print(f"answer token at {answer_temperature} among {where}: {figures(rows, texts, brief_text)}")


if __name__ == "__main__":
    main()
