"""How far a trained adapter moved the model from its warm start, as the KL between the two models' whole-answer
distributions, for GRPO's adapter and for a control's (bench/controls.py), on any split. "RL's Razor" (Shenfeld
et al., arXiv 2509.04259) finds that on-policy RL forgets less than supervised fine-tuning and that forgetting
follows the forward KL, KL(warm start || trained), on the new task's inputs: `--direction forward` measures that
one, on the warm start's own samples. The default, `--direction reverse`, is KL(trained || warm start) on the
trained model's samples (the direction of the KL penalty TRL's GRPO adds when `train.beta` > 0).

    R=<a repo where the cpu profile ran, with bench/controls.py's rft control>
    .venv/bin/python bench/kl_to_start.py --params R/params.yaml --data R/data/shapes --base R/models/base \
        --adapter R/models/adapter --split val --split ood
    .venv/bin/python bench/kl_to_start.py ... --adapter R/controls/rft/adapter --split val --split ood
    .venv/bin/python bench/kl_to_start.py ... --adapter R/models/adapter --direction forward --split val

For each image it samples `--samples` answers at GRPO's temperature (`train.temperature`, no top-k or top-p)
from the first model of the pair (the trained one for reverse, the warm start for forward) and sums, over each
answer's tokens (up to and including the one that ends it), the exact KL between the two models' next-token
distributions at that temperature: by the chain rule the mean is the KL between their answer distributions
(TRL's GRPO logs a one-sample estimate of the reverse per-token quantity as `kl`). Prints, per split, the mean
per answer with a 95% bootstrap interval over the images (`evaluate.bootstrap_samples` resamples), the mean
per token, how much of the KL falls on the answers' digit tokens (the counts, in the reasoning and the
answer), and how much at the style fork (the token after the opening both warm-start styles share, where an
answer turns brief or describes: `vgrpo.prompts.brief_style_fork`); the rest is on the other words. `--out` also
writes them as JSON.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vgrpo.config import SPLITS  # noqa: E402


def stop_tokens(model, tokenizer) -> set[int]:
    """The tokens that end an answer: generation's end-of-sequence ids and padding (`generate` pads after them)."""
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    return ids | {token for token in (tokenizer.eos_token_id, tokenizer.pad_token_id) if token is not None}


def digit_tokens(tokenizer) -> list[int]:
    """The ids of every vocabulary token that holds a digit: where an answer states a count."""
    return sorted(i for token, i in tokenizer.get_vocab().items() if any(c.isdigit() for c in token))


class AnswerMarks(NamedTuple):
    """The token ids that mark where an answer stops, where it states a count, and how it opens before the
    style fork (`vgrpo.prompts.brief_style_fork`): found once a run, not once a batch (a vocabulary scan)."""

    stops: list[int]
    digits: list[int]
    opening: list[int]


def answer_marks(model, tokenizer) -> AnswerMarks:
    """`AnswerMarks` for this model's generation config and tokenizer."""
    from vgrpo.prompts import brief_style_fork

    return AnswerMarks(sorted(stop_tokens(model, tokenizer)), digit_tokens(tokenizer), brief_style_fork(tokenizer)[0])


def style_fork_positions(answers, opening: list[int]):
    """True at the style fork of each answer that opens as both warm-start styles do (`opening`, from
    `vgrpo.prompts.brief_style_fork`): the position whose next token makes it brief or describe."""
    import torch

    fork = torch.zeros_like(answers, dtype=torch.bool)
    if answers.shape[1] > len(opening):
        fork[:, len(opening)] = (answers[:, :len(opening)] == torch.tensor(opening, device=answers.device)).all(1)
    return fork


DIRECTIONS = {"reverse": "KL(trained || warm start)", "forward": "KL(warm start || trained)"}


def sample_answers(model, inputs, max_new_tokens: int, temperature: float, direction: str):
    """One answer per row, sampled at `temperature` (no top-k or top-p) from the direction's first model
    (reverse: the trained one, adapter on; forward: the warm start, adapter off)."""
    import torch

    sampler = model.disable_adapter() if direction == "forward" else nullcontext()
    with torch.no_grad(), sampler:
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=True,
                                temperature=temperature, top_k=0, top_p=1.0)
    return output[:, inputs["input_ids"].shape[1]:]


def answer_kl(model, inputs, answers, marks: AnswerMarks, temperature: float,
              direction: str) -> dict[str, list[float]]:
    """For each answer, the sum over its tokens (up to and including the first stop) of the direction's KL
    between the two models' next-token distributions at `temperature` ("kl"), the parts of that sum at its digit
    tokens ("kl_on_digits") and at the style fork ("kl_at_style_fork", 0 for an answer that does not open as both
    styles do), its token count and its digit-token count."""
    import torch

    from vgrpo.generation import append_tokens

    with torch.no_grad():
        stops = torch.isin(answers, torch.tensor(marks.stops, device=answers.device))
        counted = (stops.long().cumsum(1) - stops.long()) == 0  # every token up to the first stop, that one too
        batch = append_tokens(inputs, answers)
        keep = answers.shape[1] + 1  # the last prompt position predicts the first answer token
        trained = (model(**batch, logits_to_keep=keep).logits[:, :-1].float() / temperature).log_softmax(-1)
        with model.disable_adapter():
            start = (model(**batch, logits_to_keep=keep).logits[:, :-1].float() / temperature).log_softmax(-1)
        first, second = (start, trained) if direction == "forward" else (trained, start)
        per_token = (first.exp() * (first - second)).sum(-1) * counted
        digits = torch.isin(answers, torch.tensor(marks.digits, device=answers.device))
        fork = style_fork_positions(answers, marks.opening)
        return {"kl": per_token.sum(1).tolist(), "kl_on_digits": (per_token * digits).sum(1).tolist(),
                "kl_at_style_fork": (per_token * fork).sum(1).tolist(),
                "tokens": counted.sum(1).tolist(), "digit_tokens": (counted & digits).sum(1).tolist()}


@click.command()
@click.option("--params", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--base", "base_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="The warm start (models/base).")
@click.option("--adapter", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="The trained LoRA adapter: models/adapter (GRPO) or controls/<name>/adapter.")
@click.option("--split", "splits", multiple=True, type=click.Choice(SPLITS), default=("val", "ood"), show_default=True)
@click.option("--images", type=click.IntRange(min=1), default=None, help="The first N images of each split (all).")
@click.option("--samples", type=click.IntRange(min=1), default=4, show_default=True, help="Answers sampled per image.")
@click.option("--direction", type=click.Choice(sorted(DIRECTIONS)), default="reverse", show_default=True,
              help="reverse: KL(trained || warm start) on the trained model's samples; forward: KL(warm start || "
                   "trained) on the warm start's samples (RL's Razor's measure).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write JSON here.")
def main(params: Path, data: Path, base_dir: Path, adapter: Path, splits: tuple[str, ...], images: int | None,
         samples: int, direction: str, seed: int, out: Path | None) -> None:
    from vgrpo.cli import quiet_libraries, user_errors
    from vgrpo.config import load_config
    from vgrpo.files import write_json
    from vgrpo.models import check_adapter
    from vgrpo.shapes import load_dataset

    with user_errors():  # bad params, no adapter, no dataset: one line before the model loads
        config = load_config(params)
        check_adapter(adapter)
        dataset = load_dataset(data, splits=splits)

    import numpy as np
    import torch

    from vgrpo.evaluation import load_base_and_adapter
    from vgrpo.generation import batch_inputs
    from vgrpo.intervals import bootstrap_ci

    quiet_libraries()
    model, processor = load_base_and_adapter(config, base_dir, adapter, "float32")
    temperature, batch_size = config.train.temperature, config.evaluate.batch_size
    marks = answer_marks(model, processor.tokenizer)
    torch.manual_seed(seed)
    results = {"adapter": str(adapter), "direction": DIRECTIONS[direction], "temperature": temperature,
               "samples_per_image": samples}
    for split in splits:
        rows = dataset[split]
        rows = [rows[i] for i in range(min(images or len(rows), len(rows)))]
        sums = {key: np.zeros(len(rows)) for key in ("kl", "kl_on_digits", "kl_at_style_fork")}
        tokens = digits = 0
        for begin in range(0, len(rows), batch_size):
            batch = rows[begin:begin + batch_size]
            inputs = batch_inputs(processor, batch, model.device)
            for _ in range(samples):
                answers = sample_answers(model, inputs, config.evaluate.max_new_tokens, temperature, direction)
                figures = answer_kl(model, inputs, answers, marks, temperature, direction)
                for key, by_image in sums.items():
                    by_image[begin:begin + len(batch)] += np.asarray(figures[key]) / samples
                tokens += sum(figures["tokens"])
                digits += sum(figures["digit_tokens"])
        per_image = sums["kl"]
        results[split] = {"images": len(rows), "kl_per_answer": round(float(per_image.mean()), 4),
                          "ci95": bootstrap_ci(per_image.tolist(), config.evaluate.bootstrap_samples, seed),
                          "kl_per_token": round(float(per_image.sum() * samples / tokens), 6), "tokens": tokens,
                          "kl_on_digits_per_answer": round(float(sums["kl_on_digits"].mean()), 4),
                          "digit_tokens": digits,
                          "kl_at_style_fork_per_answer": round(float(sums["kl_at_style_fork"].mean()), 4)}
        r = results[split]
        click.echo(f"{split}: {DIRECTIONS[direction]} {r['kl_per_answer']:.4f} nats per answer [{r['ci95'][0]:.4f}, "
                   f"{r['ci95'][1]:.4f}], {r['kl_per_token']:.5f} per token ({len(rows)} images x {samples} answers "
                   f"at temperature {temperature}); {r['kl_on_digits_per_answer']:.4f} per answer on its digit tokens "
                   f"({digits} of {tokens}), {r['kl_at_style_fork_per_answer']:.4f} at the style fork")
    if out is not None:
        write_json(out, results)


if __name__ == "__main__":
    main()
