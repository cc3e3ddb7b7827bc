"""How much of the cpu run's GRPO gain is the choice of answer style. The cpu profile's warm start
knows two styles (`base.described_share`): described (all three counts, then the answer) and brief
("I count the blue circles.", then the answer). This answers the test images greedily with the warm
start and with the trained (merged) model twice: as they come, and with the brief style's first token
forbidden, so that greedy decoding must describe. It also measures how strongly each model prefers the
brief style: the probability of that first token, teacher-forced, right where the two styles part.

    .venv/bin/python bench/cpu_run.py --keep /tmp/cpu-run      # first: a cpu run
    .venv/bin/python bench/answer_styles.py --repo /tmp/cpu-run

Prints, for each model: the brief style's first-token probability (mean, min, max over the images),
then for each way: test accuracy and the share of brief answers; last, what GRPO added over its starting
point's better decoding: trained (as it answers) minus the warm start made to describe, on the same
images, with the paired 95% interval and McNemar's p (vgrpo.evaluation's, as `evaluate` computes them).
"""

import sys
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vgrpo.base import base_model_path  # noqa: E402
from vgrpo.config import load_config  # noqa: E402
from vgrpo.generation import append_tokens, batch_inputs, completion_texts  # noqa: E402
from vgrpo.intervals import mcnemar_p, paired_bootstrap_ci  # noqa: E402
from vgrpo.models import load_model, load_processor  # noqa: E402
from vgrpo.prompts import brief_style_fork, parse_answer  # noqa: E402
from vgrpo.shapes import load_dataset  # noqa: E402


@torch.no_grad()
def brief_token_probabilities(net, processor, rows, prefix: list[int], brief_token: int,
                              batch_size: int = 16) -> list[float]:
    """Per row: the probability of `brief_token` after the prompt and `prefix` (one forward pass)."""
    probabilities = []
    for begin in range(0, len(rows), batch_size):
        inputs = batch_inputs(processor, rows[begin:begin + batch_size], net.device)
        inputs = append_tokens(inputs, torch.tensor([prefix] * inputs["input_ids"].shape[0]))
        logits = net(**inputs, logits_to_keep=1).logits[:, -1].float()
        probabilities += logits.softmax(-1)[:, brief_token].tolist()
    return probabilities


@click.command()
@click.option("--repo", type=click.Path(path_type=Path, exists=True), required=True,
              help="A repo where `dvc exp run -S profile=cpu` ran (bench/cpu_run.py --keep).")
def main(repo: Path) -> None:
    config = load_config(repo / "params.yaml")
    test = load_dataset(repo / "data/shapes", splits=("test",))["test"]
    rows = [test[i] for i in range(min(config.evaluate.max_samples["test"], len(test)))]
    right = {}  # (model, way) -> per image: answered right?
    for name, path in (("warm start", base_model_path(repo / "models/base")), ("trained", repo / "models/merged")):
        processor = load_processor(path, config.model)
        net = load_model(path, "float32").eval()
        prefix, brief_token = brief_style_fork(processor.tokenizer)
        probabilities = brief_token_probabilities(net, processor, rows, prefix, brief_token)
        print(f"{name:10s} brief style's first-token probability: mean {sum(probabilities) / len(rows):.3f}, "
              f"min {min(probabilities):.3f}, max {max(probabilities):.3f} ({len(rows)} images)")
        for way, forbidden in (("as it answers", None), ("brief style forbidden", [[brief_token]])):
            texts = completion_texts(net, processor, rows, config.evaluate.max_new_tokens, bad_words_ids=forbidden)
            correct = [parse_answer(t) == int(r["answer"]) for t, r in zip(texts, rows, strict=True)]
            right[(name, way)] = correct
            brief = sum(brief_token in processor.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts)
            print(f"{name:10s} {way:22s} test accuracy {sum(correct) / len(rows):.3f} ({len(rows)} images), "
                  f"brief answers {brief / len(rows):.3f}")
    described, trained = right[("warm start", "brief style forbidden")], right[("trained", "as it answers")]
    low, high = paired_bootstrap_ci(described, trained, config.evaluate.bootstrap_samples, config.evaluate.seed)
    print(f"trained minus warm start made to describe: {(sum(trained) - sum(described)) / len(rows):+.3f} "
          f"(paired 95% CI [{low:+.3f}, {high:+.3f}], McNemar p {mcnemar_p(described, trained):.3g}, "
          f"{len(rows)} images)")


if __name__ == "__main__":
    main()
