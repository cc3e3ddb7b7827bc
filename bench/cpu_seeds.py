"""What GRPO adds on the cpu profile, over seeds: per seed and as mean and range, the warm start (greedy, and
made to describe), pass@k at GRPO's sampling settings (warm start, after GRPO, RFT), after GRPO, the two
controls at GRPO's own budget (rejection-sampling fine-tuning on the warm start's verified samples, and
full-label SFT: bench/controls.py), GRPO's own share (after GRPO minus the better of the warm start made to
describe and RFT) with a paired 95% interval per seed and over the seeds' images pooled, beside a Student-t
interval with the seed as the unit, GRPO minus each of the three on its own (with both intervals), OOD, and
where wrong answers go wrong (the reasoning's count, or another shape's count it states); with the CPU named.
Every figure is printed for `val` (the split recipes are chosen on) and `test` (reported).

    .venv/bin/python bench/cpu_seeds.py --work /tmp/cpu-seeds --jobs 2 0 1 2 3 4     # over an hour a seed-job on 1 core
    .venv/bin/python bench/cpu_seeds.py --work /tmp/cpu-seeds --report                # the table from what is there
    .venv/bin/python bench/cpu_seeds.py --work /tmp/cpu-15 --set generate.warmup_max_count=null \
        --set generate.warmup_other_max_count=null 0 1 2 3 4       # the profile before its warm-up counts 1-8
    .venv/bin/python bench/cpu_seeds.py --work /tmp/cpu-68 --control rft --set generate.warmup_max_count=null \
        0 1 2 3 4                                 # a lever (6-8 in the other shapes' descriptions only), RFT only
    .venv/bin/python bench/cpu_seeds.py --work /tmp/cpu-kl --report --against /tmp/cpu-seeds   # a lever's GRPO
        # minus the profile's GRPO and RFT (its seeds, the same images), where the lever ran with --no-controls

Each seed runs in its own clone (bench/pipeline.py's): `dvc exp run -S profile=cpu -S base.seed=S -S
train.seed=S [--set ...] evaluate` (generate, base, train, evaluate: export and smoke add nothing to these
figures), then bench/controls.py in that clone. Every run uses one thread (OMP_NUM_THREADS=1), so a seed's
figures do not depend on the machine's core count (float sums run in one order) and `--jobs` seeds run side
by side. The clones share one DVC cache. A seed already done is not run again, nor a control it has: run
the command again with controls to add them to seeds run with --no-controls.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import yaml
from pipeline import ROOT, cpu_name, environment, make_clone, sh  # bench/pipeline.py

sys.path.insert(0, str(ROOT))
from vgrpo.intervals import mean_paired_bootstrap_ci, over_seeds_ci  # noqa: E402
from vgrpo.pass_at_k import pass_at_k  # noqa: E402
from vgrpo.prompts import reasoning_text  # noqa: E402
from vgrpo.rewards import SHAPE_WORDS, stated_count  # noqa: E402

PASS_MODELS = ("base", "base_described", "trained")  # evaluate's pass@k: the warm start, made to describe, GRPO
PASS_LABELS = {"base": "warm start", "base_described": "warm start made to describe", "trained": "after GRPO",
               "rft": "RFT control"}
PASS_RIVALS = ("base", "base_described", "rft")  # whose pass@k GRPO's is set beside, image by image
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def one_thread(repo: Path) -> dict:
    return {**environment(repo), **ONE_THREAD}


def run_seed(work: Path, seed: int, settings: tuple[str, ...], controls: tuple[str, ...]) -> None:
    folder = work / f"seed-{seed}"
    repo = prepare_clone(work, seed)
    if (folder / "done").exists():
        click.echo(f"seed {seed}: GRPO done before, kept", err=True)
    else:
        click.echo(f"seed {seed}: dvc exp run (warm start, GRPO, evaluate) in {repo}", err=True)
        overrides = ["profile=cpu", f"base.seed={seed}", f"train.seed={seed}", *settings]
        run_logged(["dvc", "exp", "run", *[arg for override in overrides for arg in ("-S", override)], "evaluate"],
                   repo, folder / "exp-run.log")
        (folder / "done").write_text("")
    missing = [name for name in controls if not (repo / "controls" / name / "eval/predictions.jsonl").is_file()]
    if missing:  # a seed run with --no-controls gets its controls when the command is run again with them
        click.echo(f"seed {seed}: the controls ({', '.join(missing)})", err=True)
        which = [arg for name in missing for arg in ("--control", name)]
        # the clone's copy, over the clone's vgrpo: the code as it was when the seed's clone was made
        run_logged([sys.executable, str(repo / "bench/controls.py"), "--repo", str(repo), *which], repo,
                   folder / f"controls-{'-'.join(missing)}.log")


def run_logged(command: list[str], repo: Path, log: Path) -> None:
    """Run in the clone on one thread, its output into `log`; exit with one line naming the log if it fails."""
    result = subprocess.run(command, cwd=repo, env=one_thread(repo), capture_output=True, text=True)
    log.write_text(result.stdout + result.stderr)
    if result.returncode:
        raise SystemExit(f"{log.parent.name}: {log.stem} failed, see {log}")


def prepare_clone(work: Path, seed: int) -> Path:
    """The seed's clone of the pipeline (bench/pipeline.py's), sharing one DVC cache with the others."""
    repo = work / f"seed-{seed}" / "repo"
    if not repo.exists():
        make_clone(repo)
        sh(["dvc", "cache", "dir", "--local", str(work / "dvc-cache")], repo)
    return repo


def records(path: Path, split: str) -> list[dict]:
    """A predictions.jsonl's rows on `split` (none when the run is absent, e.g. a control not run)."""
    if not path.is_file():
        return []
    return [r for r in map(json.loads, path.open()) if r["split"] == split]


def correct_by_id(rows: list[dict], model: str) -> dict[str, bool]:
    return {r["id"]: r["correct"] for r in rows if r["model"] == model}


def share_above(rows: list[dict], model: str, highest: int) -> float | None:
    """The share of a model's answers that name a count above `highest` (the training range's top)."""
    parsed = [r["parsed"] for r in rows if r["model"] == model]
    return sum(p is not None and p > highest for p in parsed) / len(parsed) if parsed else None


def slot_slips(rows: list[dict], model: str) -> tuple[int, int]:
    """Of a model's answers that are not the count its reasoning states for the asked shape (where it states
    one), how many are another shape's count stated there: (slips, such answers). A slip is a lookup of the
    wrong shape in the model's own description, not a miscount."""
    slips = missed = 0
    for r in rows:
        if r["model"] != model or r.get("reasoning_count") is None or r["parsed"] == r["reasoning_count"]:
            continue
        missed += 1
        reasoning = reasoning_text(r["completion"])
        slips += r["parsed"] in {stated_count(reasoning, shape) for shape in SHAPE_WORDS if shape != r["target_shape"]}
    return slips, missed


def same_answer(rows: list[dict], other_rows: list[dict], model: str = "trained") -> float | None:
    """The share of images on which two runs' `model` answers are the same number."""
    answers = {r["id"]: r["parsed"] for r in rows if r["model"] == model}
    others = {r["id"]: r["parsed"] for r in other_rows if r["model"] == model}
    shared = [i for i in answers if i in others]
    return sum(answers[i] == others[i] for i in shared) / len(shared) if shared else None


def control_metrics(repo: Path, name: str, split: str) -> dict:
    """A control's evaluate metrics on `split` (its `trained` entry); empty where the control was not run."""
    path = repo / "controls" / name / "eval/metrics.json"
    return json.loads(path.read_text()).get(split, {}).get("trained", {}) if path.is_file() else {}


def control_reasoning(control: dict, name: str) -> dict:
    """A control's (reasoning states the asked count right, answer is the reasoning's count), keyed by the
    control's name; empty where the control was not run or was scored before evaluate measured it."""
    if "reasoning_count_accuracy" not in control:
        return {}
    return {name: (control["reasoning_count_accuracy"], control["answer_matches_reasoning"])}


def seed_figures(folder: Path, split: str, highest: int) -> dict:
    """One seed's figures on `split`, from its clone's reports/ and controls/ (`highest`: generate.max_count)."""
    repo = folder / "repo"
    metrics = json.loads((repo / "reports/eval/metrics.json").read_text())
    m = metrics[split]
    evaluated = records(repo / "reports/eval/predictions.jsonl", split)
    controls = {name: records(repo / "controls" / name / "eval/predictions.jsonl", split)
                for name in ("rft", "full_label_sft")}
    runs = {"greedy": correct_by_id(evaluated, "base"), "described": correct_by_id(evaluated, "base_described"),
            "grpo": correct_by_id(evaluated, "trained"),
            **{name: correct_by_id(rows, "trained") for name, rows in controls.items()}}
    above = {"described": share_above(evaluated, "base_described", highest),
             "grpo": share_above(evaluated, "trained", highest),
             "rft": share_above(controls["rft"], "trained", highest)}
    ood = metrics.get("ood", {})
    train = json.loads((repo / "reports/train/metrics.json").read_text())
    rft = control_metrics(repo, "rft", split)
    return {"runs": runs, "above": above, "images": m["trained"]["samples"],
            "same_as_rft": same_answer(evaluated, controls["rft"]),
            "pass": {**{name: m[name].get("pass_at_k") for name in PASS_MODELS if name in m},
                     "rft": rft.get("pass_at_k")},
            "ood": {name: ood[name]["accuracy"] for name in ("base", "base_described", "trained") if name in ood},
            "reasoning": {**{name: (m[name]["reasoning_count_accuracy"], m[name]["answer_matches_reasoning"])
                             for name in ("base_described", "trained") if name in m},
                          **control_reasoning(rft, "rft")},
            "slips": {"base_described": slot_slips(evaluated, "base_described"),
                      "trained": slot_slips(evaluated, "trained"), "rft": slot_slips(controls["rft"], "trained")},
            "zero_spread_groups": train.get("zero_spread_groups"), "grpo_minutes": train["seconds"] / 60}


def accuracy(run: dict[str, bool]) -> float | None:
    return sum(run.values()) / len(run) if run else None


def paired_difference(rows: dict[int, dict], rivals: dict[int, str]) -> tuple[list[float], list[float]]:
    """GRPO minus each seed's rival (`rivals`: seed -> a key of its runs), per seed, and a paired bootstrap
    over the seeds' images of the mean of those differences: (per-seed, [low, high])."""
    pairs = []
    for seed, r in rows.items():
        grpo, rival = r["runs"]["grpo"], r["runs"][rivals[seed]]
        ids = [i for i in grpo if i in rival]
        if not ids:  # a difference over no image is no figure: say which runs do not match
            raise click.ClickException(f"seed {seed}: GRPO's and {rivals[seed]}'s predictions share no image "
                                       "(runs of different datasets?)")
        pairs.append(([rival[i] for i in ids], [grpo[i] for i in ids]))
    per_seed = [(sum(trained) - sum(base)) / len(base) for base, trained in pairs]
    return per_seed, mean_paired_bootstrap_ci(pairs, samples=2000, seed=0)


def per_image_pass_at_k(rates: dict, k: int) -> list[float]:
    """Each image's pass@k, from the right answers per image evaluate keeps."""
    return [pass_at_k(rates["samples_per_image"], right, k) for right in rates["right_per_image"]]


def paired_pass_rates(rows: dict[int, dict], rival: str) -> list[tuple[dict, dict]]:
    """(rival's, GRPO's) pass@k figures of each seed where both kept their right answers per image (runs scored
    before evaluate kept them, or a model not sampled, are left out), checked to be on the same images."""
    pairs = []
    for seed, r in rows.items():
        other, grpo = r["pass"].get(rival) or {}, r["pass"].get("trained") or {}
        if "right_per_image" not in other or "right_per_image" not in grpo:
            continue
        if len(other["right_per_image"]) != len(grpo["right_per_image"]):  # another evaluate.pass_samples?
            raise click.ClickException(f"seed {seed}: GRPO's pass@k is on {len(grpo['right_per_image'])} images and "
                                       f"{rival}'s on {len(other['right_per_image'])}: not the same images")
        pairs.append((other, grpo))
    return pairs


def pass_at_k_differences(rows: dict[int, dict], rival: str) -> tuple[dict[str, tuple[float, list[float]]], int]:
    """GRPO's pass@k minus `rival`'s (a PASS_LABELS key), image by image (both sample the same images), over the
    seeds that kept the right answers per image: {k: (mean over the seeds, paired 95% interval)}, images."""
    paired = paired_pass_rates(rows, rival)
    differences = {}
    for k in evaluate_pass_ks(rows) if paired else []:
        pairs = [(per_image_pass_at_k(other, k), per_image_pass_at_k(grpo, k)) for other, grpo in paired]
        per_seed = [statistics.mean(grpo) - statistics.mean(other) for other, grpo in pairs]
        differences[f"pass@{k}"] = (statistics.mean(per_seed), mean_paired_bootstrap_ci(pairs, samples=2000, seed=0))
    return differences, sum(len(other["right_per_image"]) for other, _ in paired)


def evaluate_pass_ks(rows: dict[int, dict]) -> list[int]:
    """The k of pass@k that GRPO's evaluation measured (evaluate.pass_k), from the first seed that has it."""
    found = next((r["pass"]["trained"] for r in rows.values() if r["pass"].get("trained")), {})
    return [int(key.removeprefix("pass@")) for key in found if key.startswith("pass@")]


def better_rival(runs: dict[str, dict[str, bool]]) -> str:
    """The better, on this split, of the warm start made to describe and RFT: what GRPO's own share is over.
    A warm start taught only to describe (`base.described_share: 1.0`) has no brief style to forbid: its
    greedy answers are the described ones."""
    warm_start = "described" if runs["described"] else "greedy"
    return max((name for name in (warm_start, "rft") if runs[name]), key=lambda name: accuracy(runs[name]))


def own_share(rows: dict[int, dict]) -> tuple[list[float], list[float]]:
    """GRPO minus the better of the warm start made to describe and RFT, per seed, with its interval."""
    return paired_difference(rows, {seed: better_rival(r["runs"]) for seed, r in rows.items()})


def seeds_interval(per_seed: list[float]) -> str:
    """The interval with the seed as the unit, for a report line: it includes 0 where one or two seeds carry a
    mean that the images' interval calls sure."""
    interval = over_seeds_ci(per_seed)
    return "" if interval is None else f", over the seeds (t) [{interval[0] * 100:+.1f}, {interval[1] * 100:+.1f}]"


def echo_gap(rows: dict[int, dict], key: str, label: str) -> None:
    """The line `GRPO minus <label>` against every seed's run `key`, with both intervals and the range; none
    where a seed lacks that run."""
    if all(r["runs"][key] for r in rows.values()):
        diffs, (low, high) = paired_difference(rows, dict.fromkeys(rows, key))
        click.echo(f"GRPO minus {label}: mean {statistics.mean(diffs) * 100:+.1f} points [{low * 100:+.1f}, "
                   f"{high * 100:+.1f}]{seeds_interval(diffs)}, range {min(diffs) * 100:+.1f} to "
                   f"{max(diffs) * 100:+.1f}")


def share(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def against_figures(folder: Path, against: Path, split: str) -> dict:
    """One seed of a lever beside the same seed of another work folder (the profile as it is): the lever's GRPO,
    the other folder's GRPO and RFT, image by image, and how often the two warm starts made to describe answer
    alike (100% where the lever leaves the warm start alone on the same CPU kind)."""
    other = against / folder.name
    if not (other / "done").exists():
        raise click.ClickException(f"--against {against}: {folder.name} is not finished there")
    mine, theirs = (yaml.safe_load((f / "repo/params.yaml").read_text())["generate"] for f in (folder, other))
    differing = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if differing:  # other images: nothing to pair
        raise click.ClickException(f"--against {against}: {folder.name}'s generate.{differing[0]} is "
                                   f"{mine.get(differing[0])!r} here and {theirs.get(differing[0])!r} there")
    evaluated = records(folder / "repo/reports/eval/predictions.jsonl", split)
    others = records(other / "repo/reports/eval/predictions.jsonl", split)
    return {"runs": {"grpo": correct_by_id(evaluated, "trained"), "their_grpo": correct_by_id(others, "trained"),
                     "their_rft": correct_by_id(records(other / "repo/controls/rft/eval/predictions.jsonl", split),
                                                "trained")},
            "same_warm_start": same_answer(evaluated, others, "base_described")}


def report_against(folders: list[Path], against: Path, split: str) -> None:
    """The lever's GRPO minus the other folder's GRPO and RFT, paired over the same seeds' images."""
    rows = {int(f.name.split("-")[1]): against_figures(f, against, split) for f in folders}
    alike = [r["same_warm_start"] for r in rows.values() if r["same_warm_start"] is not None]
    if alike:
        click.echo(f"against {against}: the two warm starts made to describe give the same answer on "
                   f"{statistics.mean(alike):.1%} of the images (mean over {len(alike)} seeds)")
    for key, label in (("their_grpo", "GRPO"), ("their_rft", "RFT")):
        echo_gap(rows, key, f"{against}'s {label}")


def report(work: Path, split: str, against: Path | None = None) -> None:
    folders = sorted((f for f in work.glob("seed-*") if (f / "done").exists()), key=lambda f: int(f.name.split("-")[1]))
    if not folders:
        raise SystemExit(f"cpu_seeds: no finished seed in {work}")
    generate = yaml.safe_load((folders[0] / "repo/params.yaml").read_text())["generate"]
    rows = {int(f.name.split("-")[1]): seed_figures(f, split, generate["max_count"]) for f in folders}
    images = {r["images"] for r in rows.values()}
    click.echo(f"cpu profile over {len(rows)} seeds (base.seed = train.seed), data generate.seed "
               f"{generate['seed']}, {split} accuracy on {images.pop()} images; one thread per run; CPU: {cpu_name()}")
    click.echo("| seed | warm start, greedy | made to describe | pass@1/4/16 warm start | "
               "pass@1/4/16 made to describe | pass@1/4/16 after GRPO | pass@1/4/16 RFT | after GRPO | RFT | "
               "full-label SFT | GRPO's own share | OOD after GRPO |")
    click.echo("|---|---|---|---|---|---|---|---|---|---|---|---|")
    per_seed, interval = own_share(rows)
    for (seed, r), own in zip(rows.items(), per_seed, strict=True):
        runs = r["runs"]
        passes = ["/".join(f"{v:.2f}" for k, v in (r["pass"].get(name) or {}).items() if k.startswith("pass@")) or "-"
                  for name in PASS_LABELS]
        click.echo(f"| {seed} | {share(accuracy(runs['greedy']))} | {share(accuracy(runs['described']))} | "
                   f"{' | '.join(passes)} | {share(accuracy(runs['grpo']))} | {share(accuracy(runs['rft']))} | "
                   f"{share(accuracy(runs['full_label_sft']))} | {own * 100:+.1f} | {share(r['ood'].get('trained'))} |")
    for key, label in (("greedy", "warm start, greedy"), ("described", "warm start made to describe"),
                       ("grpo", "after GRPO"), ("rft", "RFT control"), ("full_label_sft", "full-label SFT control")):
        values = [accuracy(r["runs"][key]) for r in rows.values() if r["runs"][key]]
        if values:
            click.echo(f"{label}: mean {statistics.mean(values):.1%}, range {min(values):.1%}-{max(values):.1%}")
    click.echo(f"GRPO's own share (after GRPO minus the better of made to describe and RFT): mean "
               f"{statistics.mean(per_seed) * 100:+.1f} points, paired 95% interval over the seeds' images "
               f"[{interval[0] * 100:+.1f}, {interval[1] * 100:+.1f}]{seeds_interval(per_seed)}, range "
               f"{min(per_seed) * 100:+.1f} to {max(per_seed) * 100:+.1f}")
    for key, label in (("greedy", "the warm start, greedy"), ("described", "the warm start made to describe"),
                       ("rft", "RFT"), ("full_label_sft", "full-label SFT")):
        echo_gap(rows, key, label)
    for name, label in PASS_LABELS.items():
        found = [r["pass"][name] for r in rows.values() if r["pass"].get(name)]
        if found:
            ks = [k for k in found[0] if k.startswith("pass@")]
            means = ", ".join(f"{k} {statistics.mean(p[k] for p in found):.2f}" for k in ks)
            click.echo(f"pass@k {label}, at GRPO's sampling settings: mean over {len(found)} seeds {means}")
    for name in PASS_RIVALS:  # a pass@k gap beyond which images were sampled, or not
        differences, images = pass_at_k_differences(rows, name)
        label = PASS_LABELS[name]
        if differences:
            shown = ", ".join(f"{k} {d:+.2f} [{low:+.2f}, {high:+.2f}]" for k, (d, (low, high)) in differences.items())
            click.echo(f"pass@k after GRPO minus {label}, paired over {images} images: {shown}")
    oods = [r["ood"].get("trained") for r in rows.values() if r["ood"]]
    if oods:
        click.echo(f"OOD (counts above the training range) after GRPO: mean {statistics.mean(oods):.1%}")
    for name, label in (("base_described", "made to describe"), ("trained", "after GRPO"), ("rft", "RFT")):
        # where an answer goes wrong: the reasoning's count of the asked shape, or copying it into the answer
        found = [r["reasoning"][name] for r in rows.values() if name in r["reasoning"]]
        if found:
            stated, copied = statistics.mean(f[0] for f in found), statistics.mean(f[1] for f in found)
            click.echo(f"{label}: the reasoning states the asked count right on {stated:.1%}, "
                       f"the answer is the reasoning's count on {copied:.1%} "
                       f"(mean over {len(found)} seeds)")
    for name, label in (("base_described", "made to describe"), ("trained", "after GRPO"), ("rft", "RFT")):
        slips, missed = (sum(r["slips"][name][i] for r in rows.values()) for i in (0, 1))
        if missed:  # which wrong copies a reward could teach: the answer took another shape's stated count
            click.echo(f"{label}: of the {missed} answers that are not the reasoning's count, {slips} "
                       f"({slips / missed:.1%}) are another shape's count stated there (all seeds)")
    for key, label in (("described", "made to describe"), ("grpo", "after GRPO"), ("rft", "RFT")):
        found = [r["above"][key] for r in rows.values() if r["above"][key] is not None]
        if found:  # an answer above the training range must be reachable for OOD accuracy above 0
            click.echo(f"{label}: answers above the training range (> {generate['max_count']}) "
                       f"{statistics.mean(found):.1%} (mean over {len(found)} seeds)")
    agree = [r["same_as_rft"] for r in rows.values() if r["same_as_rft"] is not None]
    if agree:  # learning the same thing shows as the same answers, image by image
        click.echo(f"after GRPO and RFT give the same answer on {statistics.mean(agree):.1%} of the images "
                   f"(mean over {len(agree)} seeds)")
    spread = [r["zero_spread_groups"] for r in rows.values() if r["zero_spread_groups"] is not None]
    if spread:
        click.echo(f"GRPO's groups without reward spread: mean {statistics.mean(spread):.0%}")
    if against is not None:
        report_against(folders, against, split)


@click.command()
@click.option("--work", type=click.Path(path_type=Path), required=True, help="Where the clones and figures go.")
@click.argument("seeds", type=int, nargs=-1)
@click.option("--report", "report_only", is_flag=True, help="Only print the table from the seeds done.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A params override after the profile (repeatable), e.g. train.max_steps=45: a variant.")
@click.option("--controls/--no-controls", default=True, show_default=True,
              help="Train and score the controls after each seed's GRPO.")
@click.option("--control", "control_names", multiple=True, type=click.Choice(["rft", "full_label_sft"]),
              help="Only these controls (repeatable; default: both).")
@click.option("--jobs", default=1, show_default=True, help="Seeds run side by side (each on one thread).")
@click.option("--split", "splits", multiple=True, default=("val", "test"), show_default=True,
              help="The splits the table is printed for.")
@click.option("--against", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Another work folder of the same seeds and data (the profile as it is): this one's GRPO minus "
                   "its GRPO and RFT, image by image.")
def main(work: Path, seeds: tuple[int, ...], report_only: bool, settings: tuple[str, ...], controls: bool,
         control_names: tuple[str, ...], jobs: int, splits: tuple[str, ...], against: Path | None) -> None:
    if control_names and not controls:
        raise click.UsageError(f"--control {control_names[0]} names a control and --no-controls runs none: drop one")
    unfinished = [seed for seed in seeds if against is not None and not (against / f"seed-{seed}" / "done").exists()]
    if unfinished:  # found before an hour of runs, not at the report after them
        raise click.UsageError(f"--against {against}: seed-{unfinished[0]} is not finished there")
    work.mkdir(parents=True, exist_ok=True)
    controls_to_run = (control_names or ("rft", "full_label_sft")) if controls else ()
    if not report_only and seeds:
        for seed in seeds:  # every clone first: each seed runs the code as it was when the command started
            prepare_clone(work, seed)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(lambda seed: run_seed(work, seed, settings, controls_to_run), seeds))
    for split in splits:
        report(work, split, against)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
