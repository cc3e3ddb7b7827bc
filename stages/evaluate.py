"""Stage 4: base vs trained on held-out (val, test) and out-of-distribution (ood) counts, same images,
same prompt, same image budget; where the warm start knows a brief answer style, also the warm start
made to describe (its brief style's first token forbidden); pass@k at GRPO's sampling settings; metrics,
predictions, plots and attention heatmaps for DVC.

    python stages/evaluate.py                       # params.yaml -> reports/eval
    dvc exp run -S evaluate.batch_size=8            # reruns evaluate (and what follows) only
"""

from pathlib import Path

import click

from vgrpo.cli import quiet_libraries, user_errors
from vgrpo.config import load_config


@click.command()
@click.option("--params", "params_path", default="params.yaml", show_default=True, help="Params file.")
@click.option("--data", "data_dir", default="data/shapes", show_default=True, help="Dataset from `generate`.")
@click.option("--base", "base_dir", default="models/base", show_default=True, help="Base model from `base`.")
@click.option("--adapter", "adapter_dir", default="models/adapter", show_default=True, help="Adapter from `train`.")
@click.option("--reports", "reports_dir", default="reports/eval", show_default=True, help="Output directory.")
def main(params_path, data_dir, base_dir, adapter_dir, reports_dir) -> None:
    """Evaluate the base model and the trained adapter."""
    with user_errors():
        config = load_config(params_path)
        quiet_libraries()
        from tqdm import tqdm

        from vgrpo.devices import load_dtype
        from vgrpo.evaluation import run_evaluation

        dtype = load_dtype(config.model, config.train)
        with tqdm(desc="evaluate", unit="sample") as progress:
            metrics = run_evaluation(config, dtype, Path(data_dir), Path(base_dir), Path(adapter_dir),
                                     Path(reports_dir), progress)
        if metrics["adapter"]["max_lora_b"] == 0:
            click.echo("evaluate: the adapter is all zeros: base and trained are the same model")
        for split in config.evaluate.splits:
            m, gain = metrics[split], metrics[split]["trained_minus_base"]
            low, high = gain["accuracy_ci95"]
            click.echo(f"{split:>5}: accuracy base {m['base']['accuracy']:.3f} -> trained "
                       f"{m['trained']['accuracy']:.3f} ({gain['accuracy']:+.3f}, paired 95% CI "
                       f"[{low:+.3f}, {high:+.3f}], McNemar p = {gain['mcnemar_p']:.3g}, n = {m['base']['samples']})")
            passes = {name: m[name]["pass_at_k"] for name in ("base", "base_described", "trained")
                      if "pass_at_k" in m.get(name, {})}
            if passes:  # pass@k at GRPO's sampling settings: selection or new capability?
                ks = [key for key in next(iter(passes.values())) if key.startswith("pass@")]
                click.echo(f"{split:>5}: {'/'.join(ks)} at temperature {config.train.temperature:g} "
                           f"({next(iter(passes.values()))['images']} images): " + ", ".join(
                               f"{name} " + "/".join(f"{p[k]:.3f}" for k in ks) for name, p in passes.items()))
            if "base_described" in m:  # the warm start made to describe: what GRPO added over its better decoding
                gain = m["trained_minus_base_described"]
                low, high = gain["accuracy_ci95"]
                click.echo(f"{split:>5}: warm start made to describe {m['base_described']['accuracy']:.3f} -> trained "
                           f"{m['trained']['accuracy']:.3f} ({gain['accuracy']:+.3f}, paired 95% CI "
                           f"[{low:+.3f}, {high:+.3f}], McNemar p = {gain['mcnemar_p']:.3g})")


if __name__ == "__main__":
    main()
