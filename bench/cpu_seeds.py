"""The cpu profile as users will meet it: the warm start and GRPO rerun over seeds (base.seed = train.seed
= each seed; the same data), each followed by the SFT control, then per seed and as mean and range the test
accuracy of the warm start (greedy, and made to describe), after GRPO, and the SFT control, with the CPU
named. A float result differs between CPU kinds (rounding in their kernels), and one seed is one draw.

    .venv/bin/python bench/cpu_seeds.py --work /tmp/cpu-seeds 0 1 2 3 4   # ~15 min a seed (AMD EPYC Zen 4)
    .venv/bin/python bench/cpu_seeds.py --work /tmp/cpu-seeds --report             # the table from what is there
    .venv/bin/python bench/cpu_seeds.py --work /tmp/cpu-kl --set train.beta=0.3 --no-sft 0 1 2 3 4  # a variant

Each seed runs in its own clone (bench/pipeline.py's), `dvc exp run -S profile=cpu -S base.seed=S
-S train.seed=S -S evaluate.splits=[test] evaluate` (generate, base, train, evaluate on the test split:
the figures reported; export and smoke add nothing to them), then `bench/sft_control.py --repo <clone>`
for GRPO's wall time. `--set KEY=VALUE` (repeatable) runs a variant of the recipe. The clones share one
DVC cache, so `generate` runs once. A seed already done is not run again.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import click
from pipeline import cpu_name, environment, make_clone, sh  # bench/pipeline.py

BENCH = Path(__file__).resolve().parent


def run_seed(work: Path, seed: int, settings: tuple[str, ...] = (), sft: bool = True) -> None:
    folder = work / f"seed-{seed}"
    if (folder / "done").exists():
        click.echo(f"seed {seed}: done before, kept")
        return
    repo = folder / "repo"
    if not repo.exists():
        make_clone(repo)
        sh(["dvc", "cache", "dir", "--local", str(work / "dvc-cache")], repo)
    click.echo(f"seed {seed}: dvc exp run (warm start, GRPO, evaluate) in {repo}", err=True)
    overrides = ["profile=cpu", f"base.seed={seed}", f"train.seed={seed}", "evaluate.splits=[test]", *settings]
    sh(["dvc", "exp", "run", *[arg for override in overrides for arg in ("-S", override)], "evaluate"], repo)
    if not sft:
        (folder / "done").write_text("")
        return
    click.echo(f"seed {seed}: the SFT control", err=True)
    result = subprocess.run([sys.executable, str(BENCH / "sft_control.py"), "--repo", str(repo), "--out",
                             str(folder / "sft_control.json")], env=environment(repo), capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"sft_control failed for seed {seed}:\n{result.stderr[-3000:]}")
    (folder / "sft_control.log").write_text(result.stdout)
    (folder / "done").write_text("")


def seed_figures(folder: Path) -> dict:
    """One seed's test figures from its clone's reports/ and its sft_control.json."""
    repo = folder / "repo"
    test = json.loads((repo / "reports/eval/metrics.json").read_text())["test"]
    train = json.loads((repo / "reports/train/metrics.json").read_text())
    warm = json.loads((repo / "reports/base/metrics.json").read_text())
    sft_file = folder / "sft_control.json"
    sft = json.loads(sft_file.read_text()) if sft_file.exists() else {"accuracy": None, "sft_steps": None}
    described = test.get("base_described", {}).get("accuracy")
    gain = test.get("trained_minus_base_described", {})
    return {"images": test["trained"]["samples"], "greedy": test["base"]["accuracy"], "described": described,
            "grpo": test["trained"]["accuracy"], "sft": sft["accuracy"], "gain_ci": gain.get("accuracy_ci95"),
            "gain_p": gain.get("mcnemar_p"), "grpo_minutes": train["seconds"] / 60, "sft_steps": sft["sft_steps"],
            "warm_minutes": warm.get("seconds", 0) / 60}


def report(work: Path) -> None:
    folders = sorted((f for f in work.glob("seed-*") if (f / "done").exists()),
                     key=lambda f: int(f.name.split("-")[1]))
    if not folders:
        raise SystemExit(f"cpu_seeds: no finished seed in {work}")
    rows = {int(f.name.split("-")[1]): seed_figures(f) for f in folders}
    images = {r["images"] for r in rows.values()}
    click.echo(f"cpu profile over {len(rows)} seeds (base.seed = train.seed), test accuracy on {images.pop()} images; "
               f"CPU: {cpu_name()}")
    click.echo("| seed | warm start, greedy | warm start made to describe | after GRPO | GRPO minus made to describe "
               "(paired 95% CI, McNemar p) | SFT control (same minutes) |")
    click.echo("|---|---|---|---|---|---|")
    def share(value) -> str:
        return "-" if value is None else f"{value:.1%}"

    for seed, r in rows.items():
        gain = "-"  # a warm start without a brief style has no `made to describe` (the tiny profile)
        if r["described"] is not None:
            low, high = r["gain_ci"]
            gain = (f"{(r['grpo'] - r['described']) * 100:+.1f} [{low * 100:+.1f}, {high * 100:+.1f}], "
                    f"p {r['gain_p']:.3g}")
        sft = "-" if r["sft"] is None else f"{share(r['sft'])} ({r['sft_steps']} steps)"
        click.echo(f"| {seed} | {share(r['greedy'])} | {share(r['described'])} | {share(r['grpo'])} | {gain} | {sft} |")
    for key, label in (("greedy", "warm start, greedy"), ("described", "warm start made to describe"),
                       ("grpo", "after GRPO"), ("sft", "SFT control")):
        values = [r[key] for r in rows.values() if r[key] is not None]
        if values:
            click.echo(f"{label}: mean {statistics.mean(values):.1%}, range {min(values):.1%}-{max(values):.1%}")
    gains = [r["grpo"] - r["described"] for r in rows.values() if r["described"] is not None]
    if gains:
        click.echo(f"GRPO minus made to describe: mean {statistics.mean(gains) * 100:+.1f} points, range "
                   f"{min(gains) * 100:+.1f} to {max(gains) * 100:+.1f}")


@click.command()
@click.option("--work", type=click.Path(path_type=Path), required=True, help="Where the clones and figures go.")
@click.argument("seeds", type=int, nargs=-1)
@click.option("--report", "report_only", is_flag=True, help="Only print the table from the seeds done.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A params override after the profile (repeatable), e.g. train.max_steps=20: a variant.")
@click.option("--sft/--no-sft", default=True, show_default=True,
              help="Run the SFT control after each seed (a variant of GRPO can leave it to the profile's runs).")
def main(work: Path, seeds: tuple[int, ...], report_only: bool, settings: tuple[str, ...], sft: bool) -> None:
    work.mkdir(parents=True, exist_ok=True)
    if not report_only:
        for seed in seeds:
            run_seed(work, seed, settings, sft)
    report(work)


if __name__ == "__main__":
    main()
