"""The controls beside a GRPO run (vgrpo/controls.py): rejection-sampling fine-tuning on the warm start's own
verified samples (`rft`, GRPO's supervision) and supervised fine-tuning on the dataset's full labels
(`full_label_sft`), each with GRPO's LoRA, optimizer, learning rate, steps and batch, so a step count, not
a wall time, fixes them: the same on any CPU. Each is scored by the evaluate stage's own code, and set
beside GRPO image by image (paired 95% interval, McNemar's p) on every evaluated split.

    .venv/bin/python bench/controls.py --repo <a repo where `dvc exp run -S profile=cpu` ran>
    .venv/bin/python bench/controls.py --repo <repo> --control rft          # one of them
    .venv/bin/python bench/controls.py --repo <repo> --score-only           # score the saved adapters again

pass@k samples, so a score repeats to the byte only with the thread count it was scored with (another
sums floats in another order): `bench/cpu_seeds.py` runs this script with one thread (OMP_NUM_THREADS=1).

Writes <repo>/controls/<name>/: adapter/, eval/ (evaluate's metrics.json and predictions.jsonl) and
summary.json (the control's data, steps and its comparison with GRPO). eval/metrics.json has the control's
pass@k at GRPO's sampling settings where evaluate scored GRPO's (`evaluate.pass_samples`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def correct_by_id(predictions: Path, split: str, model: str) -> dict[str, bool]:
    return {r["id"]: r["correct"] for r in map(json.loads, predictions.open())
            if r["split"] == split and r["model"] == model}


def compare(repo: Path, control_eval: Path, splits: list[str], params) -> dict:
    """GRPO minus the control on each split, image by image."""
    from vgrpo.intervals import mcnemar_p, paired_bootstrap_ci

    out = {}
    for split in splits:
        grpo = correct_by_id(repo / "reports/eval/predictions.jsonl", split, "trained")
        control = correct_by_id(control_eval / "predictions.jsonl", split, "trained")
        ids = [i for i in grpo if i in control]
        g, c = [grpo[i] for i in ids], [control[i] for i in ids]
        out[split] = {"images": len(ids), "control": round(sum(c) / len(ids), 4), "grpo": round(sum(g) / len(ids), 4),
                      "grpo_minus_control": round((sum(g) - sum(c)) / len(ids), 4),
                      "ci95": paired_bootstrap_ci(c, g, params.bootstrap_samples, params.seed),
                      "mcnemar_p": mcnemar_p(c, g)}
    return out


@click.command()
@click.option("--repo", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A repo where the pipeline ran through evaluate (params.yaml, data/, models/base, reports/eval).")
@click.option("--control", "names", multiple=True, type=click.Choice(["rft", "full_label_sft"]),
              help="Which controls (default: both).")
@click.option("--score-only", is_flag=True,
              help="Score each control's saved adapter again (after evaluate's scoring changed); no training.")
def main(repo: Path, names: tuple[str, ...], score_only: bool) -> None:
    import torch

    from vgrpo.base import base_model_path
    from vgrpo.cli import quiet_libraries
    from vgrpo.config import load_config
    from vgrpo.controls import CONTROLS, evaluate_control, train_control
    from vgrpo.files import write_json
    from vgrpo.shapes import dataset_colours, load_dataset

    quiet_libraries()
    config = load_config(repo / "params.yaml")
    if not (repo / "reports/eval/predictions.jsonl").is_file():
        raise click.ClickException(f"{repo}: no reports/eval/predictions.jsonl (run the pipeline through evaluate)")
    untrained = [name for name in names or CONTROLS if not (repo / "controls" / name / "summary.json").is_file()]
    if score_only and untrained:
        raise click.ClickException(f"{repo / 'controls' / untrained[0]}: no trained control to score (run without "
                                   "--score-only first)")
    data = repo / "data/shapes"
    train_split = load_dataset(data, splits=("train",))["train"]
    for name in names or CONTROLS:
        out = repo / "controls" / name
        start = time.perf_counter()
        if score_only:  # the training's figures and seconds stay; the scores are new
            summary = json.loads((out / "summary.json").read_text())
        else:
            torch.manual_seed(config.train.seed)
            summary = {"control": name, **train_control(name, config, base_model_path(repo / "models/base"),
                                                        train_split, dataset_colours(data), out / "adapter")}
        scores = evaluate_control(config, data, repo / "models/base", out / "adapter", out / "eval")
        if not score_only:
            summary["seconds"] = round(time.perf_counter() - start, 1)
        summary["versus_grpo"] = compare(repo, out / "eval", config.evaluate.splits, config.evaluate)
        write_json(out / "summary.json", summary)
        click.echo(f"{name}: {summary['kept']} of {summary['sampled'] or summary['kept']} answers kept from "
                   f"{summary['prompts']} prompts, {summary['steps']} steps ({summary['seconds']} s)")
        for split, c in summary["versus_grpo"].items():
            low, high = c["ci95"]
            click.echo(f"  {split}: {name} {c['control']:.3f}, GRPO {c['grpo']:.3f}, GRPO minus {name} "
                       f"{c['grpo_minus_control'] * 100:+.1f} [{low * 100:+.1f}, {high * 100:+.1f}], McNemar p "
                       f"{c['mcnemar_p']:.3g} ({c['images']} images)")
        for split, m in scores.items():
            if "pass_at_k" in m["trained"]:
                rates = m["trained"]["pass_at_k"]
                ks = ", ".join(f"{k} {v:.3f}" for k, v in rates.items() if k.startswith("pass@"))
                click.echo(f"  {split}: {name} {ks} at GRPO's sampling settings ({rates['images']} images)")


if __name__ == "__main__":
    main()
