"""The GPU memory plan (vgrpo/memory.py) and what runs before a model loads: the one-line stop when a run
cannot fit (naming the profile to use), the stop before a hub model too large for a CPU downloads,
float16 with the vision tower in float32, and the stop on logits that are not finite.

No GPU here: the plan is checked against the 8B's published size and, for the tiny model, against the
parameters a real load and PEFT count; the GPU's free memory is the one input given by hand."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
from conftest import ROOT, lora_model, profile_params, stage, tiny_adapter, tiny_config, tiny_params, write_params
from safetensors.torch import load_file, save_file

from vgrpo import memory, models
from vgrpo.config import VgrpoError, config_from_dict

T4_FREE = 15.0e9  # a T4 holds 15,360 MiB (16.1 GB); with the CUDA context made, about 15 GB are free


def profile(name: str):
    return config_from_dict(profile_params(name))


def shape_8b(config):
    return memory.model_shape(memory.QWEN3_VL_8B, models.lora_target_modules(config.train), config.train.lora_r)


def test_the_8b_shape_is_its_published_size():
    shape = shape_8b(profile("full"))
    assert shape.parameters == pytest.approx(8.767e9, rel=1e-3)  # Qwen3-VL-8B-Instruct: 8.77 B parameters
    assert memory.weights_bytes(shape, "bfloat16", False) / 1e9 == pytest.approx(17.53, abs=0.01)
    # 4-bit: the decoder's linear layers (6.9 B) in NF4, embeddings, lm_head and vision in 16 bits
    assert memory.weights_bytes(shape, "bfloat16", True) / 1e9 == pytest.approx(7.23, abs=0.01)


def test_the_full_profile_cannot_fit_a_16_gb_gpu_and_gpu16_can():
    full, small = profile("full"), profile("gpu16")
    assert small.train.load_in_4bit and not full.train.load_in_4bit
    for dtype in ("float16", "bfloat16"):  # T4 (float16) and a 16 GB card with bf16
        assert memory.train_plan(full, shape_8b(full), dtype)["weights"] > T4_FREE / 1e9
        shape = shape_8b(small)
        plans = [memory.train_plan(small, shape, dtype), memory.evaluate_plan(small, shape, dtype, shape.lora * 4),
                 memory.smoke_plan(small, shape, dtype)]
        assert max(plan["total"] for plan in plans) <= 13.0  # 2 GB of margin for what a plan does not count


def test_too_large_a_plan_stops_in_one_line_naming_the_profile():
    full = profile("full")
    plan = memory.train_plan(full, shape_8b(full), "float16")
    with pytest.raises(VgrpoError) as err:
        memory.check_fits(plan, "training", full, int(T4_FREE), "Tesla T4", stored_bytes=17_534_000_000)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"params.yaml: profile full: training is planned at {plan['total']:g} GB of GPU memory "
                           "(weights 18.69, ")
    assert line.endswith("; the weight files: 17.5 GB, models/base/source.json) and Tesla T4 has 15.0 GB free: use "
                         "profile gpu16 (dvc exp run -S profile=gpu16), which loads the base in 4 bits")
    small = profile("gpu16")
    memory.check_fits(memory.train_plan(small, shape_8b(small), "float16"), "training", small, int(T4_FREE), "T4")
    with pytest.raises(VgrpoError, match=r"8.0 GB free: lower train.max_completion_length"):
        memory.check_fits(memory.train_plan(small, shape_8b(small), "float16"), "training", small, int(8e9), "A")


def test_the_tiny_models_shape_counts_what_a_real_load_and_peft_count(tiny_base):
    config = tiny_config()
    shape = memory.model_shape(str(tiny_base), models.lora_target_modules(config.train), config.train.lora_r)
    model = models.load_model(str(tiny_base), "float32")
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert shape.vision == sum(p.numel() for p in model.model.visual.parameters())
    peft_model, _ = lora_model(tiny_base, config)
    assert shape.lora == sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)


def test_a_model_too_large_for_a_cpu_stops_in_one_line_naming_the_cpu_profiles():
    with pytest.raises(VgrpoError) as err:
        memory.check_cpu_can_run(17_534_000_000, "Qwen/Qwen3-VL-8B-Instruct")
    assert str(err.value) == (
        "params.yaml: model.name: Qwen/Qwen3-VL-8B-Instruct has 17.5 GB of weights and this machine has no CUDA GPU "
        "(it would load in float32 on the CPU): run it on a GPU, or use a CPU profile: dvc exp run -S profile=tiny, "
        "or -S profile=cpu (tiny (the plumbing check) or cpu (GRPO that learns on 2 cores))")
    memory.check_cpu_can_run(200_000_000, "tiny")  # the tiny model passes


# --- float16 ------------------------------------------------------------------------------------

def test_float16_keeps_the_vision_tower_in_float32(tiny_base, tiny_dataset):
    """On GPUs without native bf16 the model runs in float16; Qwen3-VL's vision MLP overflows there, so the
    vision tower keeps float32 weights and stays out of autocast. Run here on the CPU, in float16."""
    from vgrpo.generation import next_token_logits
    from vgrpo.shapes import load_dataset

    model = models.load_model(str(tiny_base), "float16").eval()
    dtypes = {("vision" if models.is_vision_parameter(n) else "text"): p.dtype for n, p in model.named_parameters()}
    assert dtypes == {"vision": torch.float32, "text": torch.float16}
    row = load_dataset(tiny_dataset, splits=("test",))["test"][0]
    processor = models.load_processor(str(tiny_base), tiny_config().model)
    logits = next_token_logits(model, processor, row)
    assert torch.isfinite(logits).all()
    pixels = processor.image_processor(images=[row["image"]], return_tensors="pt")
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as a float16 trainer's autocast would on a GPU
        features = model.model.visual(pixels["pixel_values"], grid_thw=pixels["image_grid_thw"])
    assert features.pooler_output.dtype == torch.float32
    merged = models.load_model(str(tiny_base), "float16", vision_float32=False)  # a merge saves one dtype
    assert {p.dtype for p in merged.parameters()} == {torch.float16}


def test_logits_that_are_not_finite_stop_evaluate_in_one_line(tiny_base, tiny_dataset, tmp_path):
    """A base whose final norm holds inf (as float16 overflow leaves a model): evaluate stops before
    generating, naming the fix."""
    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    weights = load_file(base / "model.safetensors")
    weights["model.language_model.norm.weight"] = torch.full_like(weights["model.language_model.norm.weight"],
                                                                  float("inf"))
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    adapter = tiny_adapter(tmp_path / "adapter", tiny_base)
    params = write_params(tmp_path / "params.yaml", tiny_params())
    result = stage("evaluate", "--params", str(params), "--data", str(tiny_dataset), "--base", str(base),
                   "--adapter", str(adapter), "--reports", str(tmp_path / "reports"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: evaluate: the base model: the model's next-token logits are not finite (inf or nan) in float32: "
        "float16 overflowed or the weights are damaged; set model.dtype: float32, or bfloat16 on a GPU that runs it "
        "natively")
    assert not (tmp_path / "reports" / "metrics.json").exists()


@pytest.mark.slow
def test_memory_plan_benchmark_prints_the_readme_table():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(ROOT / "bench" / "memory_plan.py")], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert any(r.startswith("| T4 16 GB | gpu16 | float16, 4-bit |") for r in rows), result.stdout
    assert any(r.startswith("| T4 16 GB | full | float16 |") and "does not fit" in r for r in rows), result.stdout


def test_plan_follows_the_knobs():
    small = profile("gpu16")
    shape = shape_8b(small)
    longer = dataclasses.replace(small, train=dataclasses.replace(small.train, max_completion_length=1024))
    assert memory.train_plan(longer, shape, "float16")["total"] > memory.train_plan(small, shape, "float16")["total"]
    unchecked = dataclasses.replace(small, train=dataclasses.replace(small.train, gradient_checkpointing=False))
    assert (memory.train_plan(unchecked, shape, "float16")["activations"]
            > 10 * memory.train_plan(small, shape, "float16")["activations"])
