"""GPU check: what the first real day on a borrowed GPU needs, in one run, with one JSON summary of every
case's figures and outcome. It runs on a CPU as well (the test suite runs it there twice, with the tiny
model and with a hub model from a local stand-in), where each CUDA-only case is skipped with one line.

    scripts/gpu_check.sh                                         # the tiny model, built here
    MODEL=Qwen/Qwen3-VL-8B-Instruct scripts/gpu_check.sh         # a hub model, downloaded by the base stage
    scripts/gpu_check.sh --work /tmp/check --steps 2             # where it works, GRPO steps per case

Cases, each a real run of the stage scripts (stages/*.py) on the check's small data (the tiny profile's
sizes; the model, dtype, backend and 4-bit set per case):
- train: backend hf and unsloth, in the GPU's 16-bit dtype (bf16 where native, else fp16), also in fp16
  where bf16 is native, and in 4-bit; two processes (DDP) when there are two GPUs. On a CPU: hf, float32.
- downstream: evaluate, export and smoke on the adapter of hf 16-bit, unsloth 16-bit and hf 4-bit (on a
  CPU: hf float32).
- dvc: `dvc exp run` in a `git clone` of this repo (its last commit), profile full and gpu16 for a hub
  model, tiny for the tiny model, with train.max_steps STEPS, backend auto and small evaluate/smoke
  samples. CUDA only: on a CPU, the pipeline's own tests run the tiny profile under DVC.
Outcomes: passed; failed (with the log's last line); does not fit (the stage's one-line memory stop,
vgrpo.memory); skipped (why). Figures: seconds, seconds per GRPO step, peak VRAM, evaluate's samples/s,
smoke's gate, the GPU memory freed before llama.cpp and its layers on the GPU. Summary: WORK/summary.json.
Exit 1 when a case failed.
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
    def __init__(self, work: Path, model: str, revision: str, steps: int, python: str):
        self.work, self.model, self.revision, self.steps, self.python = work, model, revision, steps, python
        self.default_model = yaml.safe_load((ROOT / "params.yaml").read_text())["model"]["name"]
        self.cases: list[dict] = []
        (work / "logs").mkdir(parents=True, exist_ok=True)

    # --- params -----------------------------------------------------------------------------------

    def params(self, name: str, overrides: dict[str, object]) -> Path:
        """params.yaml of the tiny profile (the check's sizes) with the model under test and `overrides`
        ("group.key": value), composed from conf/ as `dvc exp run -S profile=tiny -S ...` would."""
        settings = {"train.max_steps": self.steps, "train.save_steps": 1000, "train.eval_steps": 0,
                    **{f"evaluate.max_samples.{split}": EVAL_SAMPLES for split in ("val", "test", "ood")},
                    "evaluate.attention_samples": 1}
        if self.model != "tiny":  # a hub model: no warm start (that is for the model built here)
            settings.update({"model.name": self.model, "model.revision": self.revision, "base.sft_steps": 0,
                             "generate.warmup_size": 0})
        raw = compose("tiny", [f"{key}={json.dumps(value)}" for key, value in {**settings, **overrides}.items()])
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    # --- running ----------------------------------------------------------------------------------

    def run(self, case: str, command: list[str], cwd: Path = ROOT) -> tuple[bool, str]:
        """Run a command, its output appended to logs/CASE.log; (success, last line of its stderr)."""
        log = self.work / "logs" / f"{case}.log"
        with log.open("a") as out:
            out.write(f"$ {shlex.join(command)}\n")
            out.flush()
            env = {**os.environ, "PATH": f"{Path(self.python).parent}{os.pathsep}{os.environ['PATH']}"}  # dvc
            result = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
            out.write(result.stderr)
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        return result.returncode == 0, lines[-1] if lines else f"exit {result.returncode}"

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
        outcome = "does not fit" if "is planned at" in line else "failed"
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
        outcome = "passed" if m["adapter_changed"] else "failed"  # a run that moved nothing did not train
        self.record(case, "train", outcome, backend=m["backend"], dtype=m["dtype"], load_in_4bit=m["load_in_4bit"],
                    world_size=m["world_size"], steps=m["steps"], seconds_per_step=m["seconds_per_step"],
                    peak_vram_gb=m["peak_vram_gb"], adapter_changed=m["adapter_changed"],
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
        sets = {"train.max_steps": self.steps, "train.backend": "auto", "smoke.num_images": 8,
                **{f"evaluate.max_samples.{s}": EVAL_SAMPLES for s in ("val", "test", "ood")}}
        if profile != "tiny" and self.model != self.default_model:
            sets.update({"model.name": self.model, "model.revision": self.revision})
        command = ["dvc", "exp", "run", "-S", f"profile={profile}",
                   *[arg for key, value in sets.items() for arg in ("-S", f"{key}={value}")]]
        if ok:
            ok, line = self.run(case, command, cwd=clone)
        if self.failed(case, "dvc", ok, line, start):
            return
        train = json.loads((clone / "reports/train/metrics.json").read_text())
        smoke = json.loads((clone / "reports/smoke/metrics.json").read_text())
        self.record(case, "dvc", "passed", seconds_per_step=train["seconds_per_step"],
                    peak_vram_gb=train["peak_vram_gb"], smoke_gate=smoke["gate"]["passed"],
                    seconds=round(time.time() - start, 1))


@click.command()
@click.option("--work", "work_dir", default="/tmp/vgrpo-gpu-check", show_default=True, help="Where it works.")
@click.option("--steps", default=5, show_default=True, help="GRPO steps per training case.")
@click.option("--model", default=lambda: os.environ.get("MODEL", "tiny"), show_default="$MODEL or tiny",
              help="tiny, or a hub id (downloaded by the base stage).")
@click.option("--revision", default=lambda: os.environ.get("REVISION"), help="Hub revision (default: params.yaml's "
              "model.revision for the model it names, else main).")
def main(work_dir: str, steps: int, model: str, revision: str | None) -> None:
    """Run every case this machine can, print one line each, write WORK/summary.json."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    revision = revision or (raw["model"]["revision"] if model == raw["model"]["name"] else "main")
    check = Check(work, model, revision, steps, sys.executable)
    device = device_info()
    click.echo(f"device: {device.get('name', 'CPU (no CUDA)')}, model: {model}"
               + ("" if model == "tiny" else f"@{revision}") + f", {steps} GRPO steps a case")
    started = time.time()
    if check.data_and_base():
        cuda, native = device["cuda"], device.get("native_bf16", False)
        sixteen = "bfloat16" if native else "float16"
        no_cuda = "needs CUDA"
        trains = {"hf-float32": ({"train.backend": "hf", "model.dtype": "float32", "train.optim": "adamw_torch"},
                                 "" if not cuda else "the GPU runs the 16-bit cases")}
        for backend in ("hf", "unsloth"):
            gpu = {"train.backend": backend, "train.optim": "adamw_8bit", "train.gradient_checkpointing": True}
            trains[f"{backend}-16bit"] = ({**gpu, "model.dtype": sixteen}, "" if cuda else no_cuda)
            trains[f"{backend}-fp16"] = ({**gpu, "model.dtype": "float16"},
                                         no_cuda if not cuda else "" if native else f"{backend}-16bit is float16 here")
            trains[f"{backend}-4bit"] = ({**gpu, "model.dtype": "auto", "train.load_in_4bit": True},
                                        "" if cuda else no_cuda)
        trains["hf-ddp-2gpu"] = ({"train.backend": "hf", "model.dtype": "auto", "train.optim": "adamw_8bit",
                                  "train.num_processes": 2, "train.accelerate_config": "ddp"},
                                 "" if device.get("count", 0) >= 2 else "needs two GPUs")
        trained = set()
        for case, (overrides, why_not) in trains.items():
            if why_not:
                check.skip(case, "train", why_not)
            elif check.train(case, overrides):
                trained.add(case)
        for source in ("hf-float32", "hf-16bit", "unsloth-16bit", "hf-4bit"):
            case = f"downstream-{source}"
            if source in trained:
                check.downstream(case, source)
            else:
                check.skip(case, "downstream", f"no adapter from {source}")
        profiles = ("tiny",) if model == "tiny" else ("full", "gpu16")
        for profile in profiles:
            if cuda:
                check.dvc(profile)
            else:
                check.skip(f"dvc-{profile}", "dvc", f"{no_cuda} (profile {profile} on a CPU: the test suite runs "
                           "the tiny profile under DVC)")
    failed = [c["case"] for c in check.cases if c["outcome"] == "failed"]
    summary = {"device": device, "model": model, "revision": None if model == "tiny" else revision, "steps": steps,
               "seconds": round(time.time() - started, 1), "passed": not failed, "cases": check.cases}
    (work / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    click.echo(f"summary: {work / 'summary.json'}" + (f"; failed: {', '.join(failed)}" if failed else "; no failures"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
