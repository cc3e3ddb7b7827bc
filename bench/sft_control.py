"""The honest control for the CPU run: instead of GRPO, continue the warm start's supervised
fine-tuning for the same wall time that GRPO took (or for `--steps` steps: with 11 steps of 16 it
sees about as many answers as the cpu profile's 45 GRPO steps of 4 prompts saw prompts), then answer
the same test images greedily. If more SFT does as well as GRPO, the GRPO gain is just more training.

    .venv/bin/python bench/cpu_run.py --keep /tmp/cpu-run     # first: a cpu run to compare with
    .venv/bin/python bench/sft_control.py --repo /tmp/cpu-run
    .venv/bin/python bench/sft_control.py --repo /tmp/cpu-run --steps 11   # about as many answers as GRPO's prompts
    .venv/bin/python bench/sft_control.py --repo /tmp/cpu-run --steps 45 --learning-rate 1e-4
    .venv/bin/python bench/sft_control.py --repo /tmp/cpu-run --out /tmp/sft.json   # the figures as JSON too

Uses the run's own warm-started base (models/base), params (the `base` group's SFT recipe, on
the run's `train` split, whose images GRPO trained on), the GRPO wall time from
reports/train/metrics.json, and the test images evaluate used (the first evaluate.max_samples.test).
GRPO and SFT are compared on those images with the paired 95% interval and McNemar's p that `evaluate`
computes (GRPO's answers: reports/eval/predictions.jsonl).
"""

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import click
from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vgrpo import warm_start  # noqa: E402
from vgrpo.base import base_model_path  # noqa: E402
from vgrpo.config import load_config  # noqa: E402
from vgrpo.evaluation import mcnemar_p, paired_bootstrap_ci  # noqa: E402
from vgrpo.generation import completion_texts  # noqa: E402
from vgrpo.models import load_model, load_processor  # noqa: E402
from vgrpo.prompts import parse_answer  # noqa: E402
from vgrpo.shapes import dataset_colours, load_dataset  # noqa: E402


class StopAfter(TrainerCallback):
    """Stop training once `seconds` of training have passed."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self.start >= self.seconds:
            control.should_training_stop = True


@click.command()
@click.option("--repo", type=click.Path(path_type=Path, exists=True), required=True,
              help="A repo where `dvc exp run -S profile=cpu` ran (bench/cpu_run.py --keep).")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="Stop after this many SFT steps instead of GRPO's wall time (steps x batch = answers seen).")
@click.option("--learning-rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Constant learning rate (default: the warm start's base.learning_rate).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Also write the figures here (JSON).")
def main(repo: Path, steps: int | None, learning_rate: float | None, out: Path | None) -> None:
    config = load_config(repo / "params.yaml")
    budget = None if steps else json.loads((repo / "reports/train/metrics.json").read_text())["seconds"]
    evaluation = json.loads((repo / "reports/eval/metrics.json").read_text())
    dataset = load_dataset(repo / "data/shapes", splits=("train", "test"))
    test = dataset["test"].select(range(min(config.evaluate.max_samples["test"], len(dataset["test"]))))

    path = base_model_path(repo / "models/base")
    processor = load_processor(path, config.model)
    net = load_model(path, "float32")
    if config.base.freeze_embeddings:
        net.get_input_embeddings().weight.requires_grad_(False)
    # plain SFT on the reference answers, whatever the warm start's answer_smoothing was
    params = dataclasses.replace(config.base, sft_steps=steps or 100_000, lr_scheduler_type="constant",
                                 warmup_ratio=0.0, learning_rate=learning_rate or config.base.learning_rate,
                                 answer_smoothing=0.0)
    train_dataset = warm_start.sft_dataset(dataset["train"], dataset_colours(repo / "data/shapes"))
    with tempfile.TemporaryDirectory() as tmp:
        trainer = warm_start.sft_trainer(net, processor, params, train_dataset, Path(tmp),
                                         callbacks=[] if steps else [StopAfter(budget)])
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    net.eval()
    texts = completion_texts(net, processor, [test[i] for i in range(len(test))], config.evaluate.max_new_tokens)
    sft = [parse_answer(text) == int(row["answer"]) for text, row in zip(texts, test, strict=True)]
    grpo_right = {r["id"]: r["correct"] for r in map(json.loads, (repo / "reports/eval/predictions.jsonl").open())
                  if r["split"] == "test" and r["model"] == "trained"}
    grpo = [grpo_right[row_id] for row_id in test["id"]]
    accuracy = evaluation["test"]
    limit = f"{steps} steps" if steps else f"GRPO's {budget / 60:.1f} min"
    print(f"budget: {limit}; SFT continued {trainer.state.global_step} steps in "
          f"{seconds / 60:.1f} min (lr {params.learning_rate:g}, constant, batch {params.batch_size})")
    print(f"test accuracy ({len(test)} images, greedy): warm start {accuracy['base']['accuracy']:.3f}, "
          f"+ GRPO {accuracy['trained']['accuracy']:.3f}, + more SFT {sum(sft) / len(sft):.3f}")
    low, high = paired_bootstrap_ci(sft, grpo, config.evaluate.bootstrap_samples, config.evaluate.seed)
    print(f"GRPO minus more SFT: {(sum(grpo) - sum(sft)) / len(sft):+.3f} (paired 95% CI [{low:+.3f}, {high:+.3f}], "
          f"McNemar p {mcnemar_p(sft, grpo):.3g}, {len(sft)} images)")
    if out:
        out.write_text(json.dumps({"sft_steps": trainer.state.global_step, "seconds": round(seconds, 1),
                                   "test_images": len(sft), "accuracy": round(sum(sft) / len(sft), 4)}) + "\n")


if __name__ == "__main__":
    main()
