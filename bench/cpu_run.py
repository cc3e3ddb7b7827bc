"""The CPU learning run: `dvc exp run -S profile=cpu` in a fresh clone of the pipeline, then the figures
docs/cpu-research.md reports (greedy, made to describe, after GRPO: GRPO chooses the answer style; the
counting is the warm start's), and the picture of its curves.

    .venv/bin/python bench/cpu_run.py                          # a temp clone, removed afterwards
    .venv/bin/python bench/cpu_run.py --keep /tmp/cpu-run      # keep the clone (bench/controls.py reads it)
    .venv/bin/python bench/cpu_run.py --picture docs/cpu_run.png
    .venv/bin/python bench/cpu_run.py --set train.max_steps=450   # a variant: `dvc exp run -S` each, after the profile
    .venv/bin/python bench/cpu_run.py --report /tmp/cpu-run    # the figures of a run made before (not timed)

Prints minutes per stage (from when DVC starts each), the warm start's held-out accuracy, base vs
trained on test with the paired bootstrap interval and McNemar's p, accuracy per count, how often
the reasoning states the right count and the answer repeats it, how often each answer is given, the
OOD split, the GRPO reward, reward-spread, entropy and held-out accuracy curves, and each GGUF
file's counting accuracy in llama.cpp. The picture is `dvc plots show`'s own Vega-Lite specs for
the reward and accuracy curves, drawn to PNG with vl-convert.
"""

import json
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import click
from pipeline import environment, make_clone  # bench/pipeline.py: the same throwaway clone

STAGES = ("generate", "base", "train", "evaluate", "export", "smoke", "card")


def exp_run_command(settings: tuple[str, ...] = ()) -> list[str]:
    """`dvc exp run -S profile=cpu [-S setting ...]` as argv."""
    return ["dvc", "exp", "run", "-S", "profile=cpu"] + [arg for setting in settings for arg in ("-S", setting)]


def timed_run(repo: Path, settings: tuple[str, ...] = ()) -> tuple[dict[str, float], float, str]:
    """`exp_run_command(settings)`, timing each stage from the moment DVC announces it."""
    command = exp_run_command(settings)
    process = subprocess.Popen(command, cwd=repo, env=environment(repo),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    start = time.perf_counter()
    marks, log = [], []
    for line in process.stdout:
        log.append(line)
        found = re.match(r"Running stage '(\w+)'", line)
        if found:
            marks.append((found.group(1), time.perf_counter()))
            print(f"  {time.perf_counter() - start:7.0f} s  {found.group(1)}", flush=True)
    if process.wait():
        raise SystemExit("".join(log[-60:]))
    end = time.perf_counter()
    seconds = {name: (marks[i + 1][1] if i + 1 < len(marks) else end) - at for i, (name, at) in enumerate(marks)}
    return seconds, end - start, "".join(log)


def read(repo: Path, path: str) -> dict:
    return json.loads((repo / path).read_text())


def curve(repo: Path, relative: str, field: str) -> list[tuple[int, float]]:
    path = repo / relative
    if not path.exists():
        return []
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    header = rows[0]
    return [(int(row[header.index("step")]), float(row[header.index(field)])) for row in rows[1:]]


def answers_given(repo: Path, split: str) -> dict[str, Counter]:
    """How often each model gave each answer (None: no number) on a split: reports/eval/predictions.jsonl."""
    given = defaultdict(Counter)
    for line in (repo / "reports/eval/predictions.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["split"] == split:
            given[record["model"]][record["parsed"]] += 1
    return given


def report(repo: Path, seconds: dict[str, float], total: float | None, settings: tuple[str, ...] = ()) -> None:
    """The figures of a finished run; with `total` (a timed run), minutes per stage first."""
    base = read(repo, "reports/base/metrics.json")
    train = read(repo, "reports/train/metrics.json")
    evaluation = read(repo, "reports/eval/metrics.json")
    smoke = read(repo, "reports/smoke/metrics.json")
    if total is not None:
        print(f"\nwall time, {' '.join(exp_run_command(settings))}: {total / 60:.1f} min; peak RSS "
              f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20:.2f} GB")
        for name in STAGES:
            print(f"  {name:<9} {seconds.get(name, 0) / 60:5.1f} min")
    val = base["val"]
    print(f"warm start: {base['sft_steps']} SFT steps in {base['seconds'] / 60:.1f} min; val accuracy "
          f"{val['accuracy']:.3f} ({val['samples']} images), format {val['format_compliance']:.3f}")
    print(f"GRPO: {train['steps']} steps in {train['seconds'] / 60:.1f} min ({train['seconds_per_step']} s/step), "
          f"adapter changed: {train['adapter_changed']}, steps with zero reward spread: {train['zero_spread_steps']}")
    rewards = curve(repo, "reports/train/plots/metrics/train/rewards/correctness_tags/mean.tsv", "mean")
    if rewards:
        tenth = max(1, len(rewards) // 10)
        first, last = (sum(v for _, v in part) / len(part) for part in (rewards[:tenth], rewards[-tenth:]))
        print(f"  correctness reward, mean of the first / last {tenth} steps: {first:.3f} -> {last:.3f}")
    zero_spread = curve(repo, "reports/train/plots/metrics/train/frac_reward_zero_std.tsv", "frac_reward_zero_std")
    entropy = curve(repo, "reports/train/plots/metrics/train/entropy.tsv", "entropy")
    if zero_spread and entropy:
        print(f"  groups without reward spread, mean over logged steps: "
              f"{sum(v for _, v in zero_spread) / len(zero_spread):.2f}; token entropy "
              f"{min(v for _, v in entropy):.3f}-{max(v for _, v in entropy):.3f}")
    accuracy = curve(repo, "reports/train/plots/metrics/eval/accuracy.tsv", "accuracy")
    if accuracy:
        print("  val accuracy along GRPO: " + ", ".join(f"step {s}: {a:.3f}" for s, a in accuracy))
    for split in ("val", "test", "ood"):
        m = evaluation[split]
        gain = m["trained_minus_base"]
        low, high = gain["accuracy_ci95"]
        print(f"{split:>5}: base {m['base']['accuracy']:.3f} -> trained {m['trained']['accuracy']:.3f} "
              f"({gain['accuracy']:+.3f}, paired 95% CI [{low:+.3f}, {high:+.3f}], McNemar p {gain['mcnemar_p']:.3g}, "
              f"n {m['base']['samples']})")
        if "base_described" in m:
            gain = m["trained_minus_base_described"]
            low, high = gain["accuracy_ci95"]
            print(f"       warm start made to describe {m['base_described']['accuracy']:.3f} -> trained "
                  f"{m['trained']['accuracy']:.3f} ({gain['accuracy']:+.3f}, paired 95% CI [{low:+.3f}, {high:+.3f}], "
                  f"McNemar p {gain['mcnemar_p']:.3g})")
        counts = m["trained"]["accuracy_by_count"]
        print("       by count, base -> trained: " + ", ".join(
            f"{c}: {m['base']['accuracy_by_count'][c]:.2f}->{counts[c]:.2f}" for c in counts))
        print("       reasoning states a count / the right count / answer repeats it, base -> trained: " + " / ".join(
            f"{m['base'][key]:.3f} -> {m['trained'][key]:.3f}"
            for key in ("count_stated_rate", "reasoning_count_accuracy", "answer_matches_reasoning")))
    answers = answers_given(repo, "test")
    print("test answers given, base -> trained: " + ", ".join(
        f"{value}: {answers['base'].get(value, 0)}->{answers['trained'].get(value, 0)}"
        for value in sorted(set(answers["base"]) | set(answers["trained"]), key=str)))
    files = ", ".join(f"{name} {m['accuracy']:.3f}" for name, m in smoke["files"].items())
    print(f"smoke ({smoke['num_images']} test images): merged model {smoke['hf']['accuracy']:.3f}; {files}; "
          f"gate passed: {smoke['gate']['passed']}")


def picture(repo: Path, out: Path) -> None:
    """The GRPO reward and held-out accuracy curves, as `dvc plots show` draws them, side by side."""
    import vl_convert

    plots = subprocess.run(["dvc", "plots", "show", "--json"], cwd=repo, env=environment(repo),
                           capture_output=True, text=True)
    if plots.returncode:
        lines = (plots.stderr or plots.stdout).strip().splitlines() or ["no output"]
        raise SystemExit(f"cpu_run: `dvc plots show --json` failed in {repo}: {lines[-1]}")
    shown = json.loads(plots.stdout).get("data")
    if not shown:
        raise SystemExit(f"cpu_run: `dvc plots show --json` found no plots in {repo} (not a finished cpu run?)")
    grpo = "reports/train/plots/metrics"
    titles = {  # plot file -> panel title, left to right
        f"{grpo}/train/rewards/correctness_tags/mean.tsv": "GRPO: correctness reward (mean per step)",
        f"{grpo}/eval/accuracy.tsv": "GRPO: held-out accuracy (greedy)",
        "reports/base/plots/metrics/sft/loss.tsv": "Warm start: SFT loss",
    }
    specs = []
    for name, title in titles.items():
        if name in shown:
            spec = dict(shown[name][0]["content"])
            spec.pop("$schema", None)
            spec["title"] = title
            specs.append(spec)
    # One PNG per spec, pasted side by side: DVC's templates declare their own `smooth` signal, which
    # Vega-Lite only accepts at the top level of a spec (not inside an hconcat).
    from io import BytesIO

    from PIL import Image

    panels = [Image.open(BytesIO(vl_convert.vegalite_to_png(spec, scale=1.5))).convert("RGB") for spec in specs]
    sheet = Image.new("RGB", (sum(p.width for p in panels), max(p.height for p in panels)), "white")
    x = 0
    for panel in panels:
        sheet.paste(panel, (x, 0))
        x += panel.width
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out)
    print(f"picture: {out}")


@click.command()
@click.option("--keep", "keep", type=click.Path(path_type=Path), help="Clone here and keep it.")
@click.option("--picture", "picture_path", type=click.Path(path_type=Path), help="Write the curves here (PNG).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A params override for `dvc exp run -S` (repeatable), e.g. train.max_steps=450.")
@click.option("--report", "report_repo", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Only print the figures of the run in this repo (no new run).")
def main(keep: Path | None, picture_path: Path | None, settings: tuple[str, ...], report_repo: Path | None) -> None:
    if report_repo:
        report(report_repo, {}, None)
        return
    tmp = None if keep else Path(tempfile.mkdtemp(prefix="vgrpo-cpu-"))
    repo = keep or tmp / "repo"
    make_clone(repo)
    seconds, total, log = timed_run(repo, settings)
    (repo / "exp-run.log").write_text(log)
    report(repo, seconds, total, settings)
    if picture_path:
        picture(repo, picture_path)
    if tmp:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
