"""GPU check: what the first real day on a borrowed GPU needs, in one run, with one JSON summary of every
case's figures and outcome. It runs on a CPU as well, every case a CPU can run (the test suite runs it
there twice, with the tiny model and with a hub model from a local stand-in); a case a CPU cannot run
(Unsloth, float16, two GPUs) is skipped with one line that says why.

    scripts/gpu_check.sh                                         # the tiny model, built here
    MODEL=Qwen/Qwen3-VL-8B-Instruct scripts/gpu_check.sh         # a hub model, downloaded by the base stage
    scripts/gpu_check.sh --work /workspace/gpu-check --steps 2   # where it works (default: gpu-check/ in the clone)

Cases, each a real run of the stage scripts (stages/*.py) with params composed from conf/ as `dvc exp run`
composes them: for the tiny model its `tiny` profile; for a hub model profile `full` (16-bit cases) or
`gpu16` (4-bit cases), with only the steps, samples and images cut, pass@k to one test image (completions
and evaluation tokens stay the profile's, so tagged answers are not truncated; the merge stays bfloat16):
- train: backend hf and unsloth, in the machine's 16-bit dtype (bf16 where native and on a CPU, else
  fp16), also in fp16 where bf16 is native, and in 4-bit; two processes (DDP) when there are two GPUs;
  on a CPU also hf in float32. A case passes when the adapter moved, the vision tower's LoRA included
  when it trains (train.vision_lr_scale > 0): the largest lora_B per tower is recorded.
- downstream: evaluate, export and smoke on the adapter of hf float32 (CPU), hf 16-bit, unsloth 16-bit
  and hf 4-bit.
- dvc: `dvc exp run` in a `git clone` of this repo (its last commit), profile full and gpu16 for a hub
  model, tiny for the tiny model, with train.max_steps STEPS, backend auto and small evaluate/smoke
  samples.
Outcomes: passed; failed (with the log's last line); does not fit (the stage's one-line memory stop,
vgrpo.memory, wherever it shows in the log); skipped (why). Figures: seconds, seconds per GRPO step, peak
VRAM, evaluate's samples/s, smoke's gate, the GPU memory freed before llama.cpp and its layers on the GPU.
Summary: WORK/summary.json. Exit 1 when a case failed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import click
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vgrpo.config import compose  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EVAL_SAMPLES = 8  # per split: enough to run every code path, quick on a CPU
PASS_IMAGES = 1  # pass@k's test images, each answered max(pass_k) times by base and trained (7 min at 8 on a CPU)
# Every case and dvc run evaluates and smoke-tests this little: enough to run every code path.
SMALL_EVALUATION = {**{f"evaluate.max_samples.{split}": EVAL_SAMPLES for split in ("val", "test", "ood")},
                    "evaluate.attention_samples": 1, "evaluate.pass_samples.test": PASS_IMAGES,
                    "smoke.num_images": EVAL_SAMPLES}
MEMORY_STOP = "is planned at"  # in vgrpo.memory's one-line stop: the case does not fit this GPU


def device_info() -> dict:
    import llama_cpp
    import torch

    info = {"cuda": torch.cuda.is_available(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "llama_cpp_gpu_offload": bool(llama_cpp.llama_supports_gpu_offload())}
    if info["cuda"]:
        free, total = torch.cuda.mem_get_info()
        info.update(name=torch.cuda.get_device_name(0), count=torch.cuda.device_count(),
                    capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                    native_bf16=torch.cuda.is_bf16_supported(including_emulation=False),
                    free_gb=round(free / 1e9, 2), total_gb=round(total / 1e9, 2))
    return info


class Check:
    def __init__(self, work: Path, model: str, revision: str, steps: int, python: str, settings: tuple[str, ...] = ()):
        self.work, self.model, self.revision, self.steps, self.python = work, model, revision, steps, python
        self.settings = list(settings)  # --set KEY=VALUE: after everything else, in every case and dvc run
        self.default_model = yaml.safe_load((ROOT / "params.yaml").read_text())["model"]["name"]
        self.cases: list[dict] = []
        (work / "logs").mkdir(parents=True, exist_ok=True)

    # --- params -----------------------------------------------------------------------------------

    def params(self, name: str, overrides: dict[str, object]) -> Path:
        """params.yaml for a case, composed from conf/ as `dvc exp run -S profile=... -S ...` would: the tiny
        model's `tiny` profile, or for a hub model `gpu16` when the case loads 4-bit weights and `full`
        otherwise, with the check's steps, samples and images, and `overrides` ("group.key": value)."""
        settings = {"train.max_steps": self.steps, "train.save_steps": 1000, "train.eval_steps": 0, **SMALL_EVALUATION}
        profile = "tiny"
        if self.model != "tiny":  # a hub model: its recipe's profile, on few images (no warm start: that is the tiny's)
            profile = "gpu16" if overrides.get("train.load_in_4bit") else "full"
            settings.update({"model.name": self.model, "model.revision": self.revision, "base.sft_steps": 0,
                             "generate.warmup_size": 0, "generate.train_size": 4 * self.steps,
                             **{f"generate.{split}_size": EVAL_SAMPLES for split in ("val", "test", "ood")}})
        raw = compose(profile, [f"{key}={json.dumps(value)}" for key, value in {**settings, **overrides}.items()]
                      + self.settings)
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    # --- running ----------------------------------------------------------------------------------

    def run(self, case: str, command: list[str], cwd: Path = ROOT) -> tuple[bool, str]:
        """Run a command, its output appended to logs/CASE.log; (success, the line that says why it failed:
        a memory stop wherever it is, as `dvc exp run` prints its own ERROR after the stage's, else the
        last line of its stderr)."""
        log = self.work / "logs" / f"{case}.log"
        with log.open("a") as out:
            out.write(f"$ {shlex.join(command)}\n")
            out.flush()
            env = {**os.environ, "PATH": f"{Path(self.python).parent}{os.pathsep}{os.environ['PATH']}"}  # dvc
            result = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
            out.write(result.stderr)
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        why = next((line for line in lines if MEMORY_STOP in line), lines[-1] if lines else f"exit {result.returncode}")
        return result.returncode == 0, why

    def stage(self, case: str, name: str, params: Path, *args: str) -> tuple[bool, str]:
        return self.run(case, [self.python, str(ROOT / "stages" / f"{name}.py"), "--params", str(params), *args])

    def record(self, case: str, kind: str, outcome: str, **figures) -> dict:
        entry = {"case": case, "kind": kind, "outcome": outcome, **figures}
        self.cases.append(entry)
        detail = ", ".join(f"{k} {v}" for k, v in figures.items() if k != "log" and v is not None)
        click.echo(f"{case:<22} {outcome}{': ' + detail if detail else ''}")
        return entry

    def failed(self, case: str, kind: str, ok: bool, line: str, start: float) -> bool:
        """Record a failure (or a memory stop) and say so; True when the case cannot go on."""
        if ok:
            return False
        outcome = "does not fit" if MEMORY_STOP in line else "failed"
        self.record(case, kind, outcome, reason=line.removeprefix("error: "), seconds=round(time.time() - start, 1),
                    log=str(self.work / "logs" / f"{case}.log"))
        return True

    def skip(self, case: str, kind: str, why: str) -> None:
        self.record(case, kind, "skipped", reason=why)

    # --- cases ------------------------------------------------------------------------------------

    def data_and_base(self) -> bool:
        start = time.time()
        params = self.params("setup", {})
        ok, line = self.stage("setup", "generate", params, "--out", str(self.work / "data/shapes"))
        if ok:
            ok, line = self.stage("setup", "base", params, "--data", str(self.work / "data/shapes"), "--out",
                                  str(self.work / "models/base"), "--reports", str(self.work / "reports/base"))
        if self.failed("setup", "setup", ok, line, start):
            return False
        source = json.loads((self.work / "models/base/source.json").read_text())
        self.record("setup", "setup", "passed", base=source.get("sha") or source.get("name"),
                    seconds=round(time.time() - start, 1))
        return True

    def train(self, case: str, overrides: dict) -> bool:
        start = time.time()
        params = self.params(case, overrides)
        out = self.work / case
        ok, line = self.stage(case, "train", params, "--data", str(self.work / "data/shapes"), "--base",
                              str(self.work / "models/base"), "--adapter", str(out / "adapter"), "--checkpoints",
                              str(out / "checkpoints"), "--reports", str(out / "reports/train"))
        if self.failed(case, "train", ok, line, start):
            return False
        m = json.loads((out / "reports/train/metrics.json").read_text())
        config = yaml.safe_load(params.read_text())["train"]
        towers = m["adapter_max_lora_b_by_tower"]
        vision_trains = config["finetune_vision_layers"] and config["vision_lr_scale"] > 0
        # a run that moved nothing did not train; nor did one whose vision LoRA stayed at zero while it should learn
        outcome = "passed" if m["adapter_changed"] and (towers["vision"] > 0 or not vision_trains) else "failed"
        self.record(case, "train", outcome, backend=m["backend"], dtype=m["dtype"], load_in_4bit=m["load_in_4bit"],
                    world_size=m["world_size"], steps=m["steps"], seconds_per_step=m["seconds_per_step"],
                    peak_vram_gb=m["peak_vram_gb"], adapter_changed=m["adapter_changed"],
                    max_lora_b_language=towers["language"], max_lora_b_vision=towers["vision"],
                    reason=None if outcome == "passed" else "the adapter did not move" if not m["adapter_changed"]
                    else "the vision tower's LoRA did not move (train.vision_lr_scale > 0)",
                    seconds=round(time.time() - start, 1))
        return outcome == "passed"

    def downstream(self, case: str, trained: str) -> None:
        """evaluate, export and smoke on the adapter the train case `trained` wrote, loaded as it trained."""
        start = time.time()
        params, out = self.work / f"{trained}.yaml", self.work / case
        data, base, adapter = (str(self.work / "data/shapes"), str(self.work / "models/base"),
                               str(self.work / trained / "adapter"))
        steps = [("evaluate", ["--data", data, "--base", base, "--adapter", adapter, "--reports",
                               str(out / "reports/eval")]),
                 ("export", ["--base", base, "--adapter", adapter, "--data", data, "--merged",
                             str(out / "models/merged"), "--gguf", str(out / "models/gguf")]),
                 ("smoke", ["--merged", str(out / "models/merged"), "--gguf", str(out / "models/gguf"), "--data",
                            data, "--eval-predictions", str(out / "reports/eval/predictions.jsonl"), "--reports",
                            str(out / "reports/smoke")])]
        for name, args in steps:
            ok, line = self.stage(case, name, params, *args)
            if self.failed(case, "downstream", ok, f"{name}: {line}", start):
                return
        evaluation = json.loads((out / "reports/eval/metrics.json").read_text())
        smoke = json.loads((out / "reports/smoke/metrics.json").read_text())
        self.record(case, "downstream", "passed", adapter_of=trained,
                    eval_samples_per_second=evaluation["speed"]["samples_per_second"],
                    eval_peak_vram_gb=evaluation["speed"]["peak_vram_gb"],
                    test_accuracy={m: evaluation["test"][m]["accuracy"] for m in ("base", "trained")},
                    smoke_gate=smoke["gate"]["passed"], smoke_peak_vram_gb=smoke.get("peak_vram_gb"),
                    memory_freed_gb=smoke["hf"]["memory_freed_gb"], model_released=smoke["hf"]["model_released"],
                    gguf={name: {"n_gpu_layers": m["n_gpu_layers"], "tokens_per_second": m["tokens_per_second"],
                                 "accuracy": m["accuracy"]} for name, m in smoke["files"].items()},
                    seconds=round(time.time() - start, 1))

    def dvc(self, profile: str) -> None:
        """`dvc exp run` of `profile` in a clone, as a user starts the real run, cut to STEPS steps."""
        case, start = f"dvc-{profile}", time.time()
        clone = self.work / case
        ok, line = self.run(case, ["git", "clone", "-q", str(ROOT), str(clone)])
        sets = {"train.max_steps": self.steps, "train.backend": "auto", **SMALL_EVALUATION}
        if profile != "tiny" and self.model != self.default_model:
            sets.update({"model.name": self.model, "model.revision": self.revision})
        command = ["dvc", "exp", "run", "-S", f"profile={profile}",
                   *[arg for key, value in sets.items() for arg in ("-S", f"{key}={value}")],
                   *[arg for setting in self.settings for arg in ("-S", setting)]]
        if ok:
            ok, line = self.run(case, command, cwd=clone)
        if self.failed(case, "dvc", ok, line, start):
            return
        train = json.loads((clone / "reports/train/metrics.json").read_text())
        smoke = json.loads((clone / "reports/smoke/metrics.json").read_text())
        towers = train["adapter_max_lora_b_by_tower"]
        self.record(case, "dvc", "passed" if train["adapter_changed"] else "failed",
                    reason=None if train["adapter_changed"] else "the adapter did not move",
                    seconds_per_step=train["seconds_per_step"], peak_vram_gb=train["peak_vram_gb"],
                    max_lora_b_language=towers["language"], max_lora_b_vision=towers["vision"],
                    smoke_gate=smoke["gate"]["passed"], seconds=round(time.time() - start, 1))


def train_cases(device: dict) -> dict[str, tuple[dict, str]]:
    """Each training case: its overrides, and why this machine cannot run it ("" when it can)."""
    cuda, native = device["cuda"], device.get("native_bf16", False)
    sixteen = "bfloat16" if native or not cuda else "float16"  # a CPU runs bfloat16, not float16
    cases = {"hf-float32": ({"train.backend": "hf", "model.dtype": "float32"},
                            "the GPU runs the 16-bit cases" if cuda else "")}
    for backend in ("hf", "unsloth"):
        gpu = {"train.backend": backend, "train.optim": "adamw_8bit", "train.gradient_checkpointing": True}
        unsloth = "Unsloth needs CUDA" if backend == "unsloth" and not cuda else ""
        cases[f"{backend}-16bit"] = ({**gpu, "model.dtype": sixteen}, unsloth)
        cases[f"{backend}-fp16"] = ({**gpu, "model.dtype": "float16"}, unsloth or (
            "float16 needs CUDA (a CPU runs the bfloat16 case)" if not cuda
            else "" if native else f"{backend}-16bit is float16 here"))
        cases[f"{backend}-4bit"] = ({**gpu, "model.dtype": "auto", "train.load_in_4bit": True}, unsloth)
    cases["hf-ddp-2gpu"] = ({"train.backend": "hf", "model.dtype": "auto", "train.optim": "adamw_8bit",
                             "train.num_processes": 2, "train.accelerate_config": "ddp"},
                            "" if device.get("count", 0) >= 2 else "needs two GPUs")
    return cases


@click.command()
@click.option("--work", "work_dir", default=str(ROOT / "gpu-check"), show_default="gpu-check/ in this clone",
              help="Where it works: on the host's disk (in Docker, under the mounted /workspace).")
@click.option("--steps", default=5, show_default=True, help="GRPO steps per training case.")
@click.option("--model", default=lambda: os.environ.get("MODEL", "tiny"), show_default="$MODEL or tiny",
              help="tiny, or a hub id (downloaded by the base stage).")
@click.option("--revision", default=lambda: os.environ.get("REVISION"), help="Hub revision (default: params.yaml's "
              "model.revision for the model it names, else main).")
@click.option("--skip", "skipped", multiple=True, metavar="CASE",
              help="Leave this case out (repeatable), e.g. dvc-tiny where the pipeline's tests already run it.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A params override for every case and dvc run, after the check's own (repeatable).")
def main(work_dir: str, steps: int, model: str, revision: str | None, skipped: tuple[str, ...],
         settings: tuple[str, ...]) -> None:
    """Run every case this machine can, print one line each, write WORK/summary.json."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    revision = revision or (raw["model"]["revision"] if model == raw["model"]["name"] else "main")
    check = Check(work, model, revision, steps, sys.executable, settings)
    device = device_info()
    click.echo(f"device: {device.get('name', 'CPU (no CUDA)')}, model: {model}"
               + ("" if model == "tiny" else f"@{revision}") + f", {steps} GRPO steps a case")
    started = time.time()

    def why_not(case: str, reason: str) -> str:
        return "left out by --skip" if case in skipped else reason

    if check.data_and_base():
        trained = set()
        for case, (overrides, reason) in train_cases(device).items():
            if why_not(case, reason):
                check.skip(case, "train", why_not(case, reason))
            elif check.train(case, overrides):
                trained.add(case)
        for source in ("hf-float32", "hf-16bit", "unsloth-16bit", "hf-4bit"):
            case = f"downstream-{source}"
            reason = why_not(case, "" if source in trained else f"no adapter from {source}")
            if reason:
                check.skip(case, "downstream", reason)
            else:
                check.downstream(case, source)
        for profile in ("tiny",) if model == "tiny" else ("full", "gpu16"):
            case = f"dvc-{profile}"
            if case in skipped:
                check.skip(case, "dvc", "left out by --skip")
            else:
                check.dvc(profile)
    failed = [c["case"] for c in check.cases if c["outcome"] == "failed"]
    summary = {"device": device, "model": model, "revision": None if model == "tiny" else revision, "steps": steps,
               "seconds": round(time.time() - started, 1), "passed": not failed, "cases": check.cases}
    (work / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    click.echo(f"summary: {work / 'summary.json'}" + (f"; failed: {', '.join(failed)}" if failed else "; no failures"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
