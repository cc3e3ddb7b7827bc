"""A few GRPO steps on the tiny model with deterministic "sampling", for tests/test_distributed.py.

Run directly (one process) or under `accelerate launch --multi_gpu --num_processes 2` (two ranks);
rank 0 saves the LoRA weights. Sampling is made deterministic per (position in the group, token
position), so both setups see the same completions whatever their random streams; the reward
varies within a group, so the update is not zero. Greedy decoding would give identical completions
in a group and no gradient at all.

    python tests/grpo_equivalence_run.py OUT.safetensors PER_DEVICE_BATCH DATA_DIR BASE_DIR
"""

import dataclasses
import sys
from pathlib import Path

import torch
from accelerate import PartialState
from safetensors.torch import save_file
from transformers import LogitsProcessor, LogitsProcessorList

from vgrpo import models
from vgrpo.base import base_model_path
from vgrpo.config import config_from_dict
from vgrpo.shapes import load_dataset
from vgrpo.training import build_trainer

GROUP = 4
STEPS = 3


class ForcedByPosition(LogitsProcessor):
    """Only token 1000 + (7 g + 3 t) mod 97 is allowed, g = row's place in its group, t = token index."""

    def __init__(self):
        self.start = None

    def __call__(self, input_ids, scores):
        self.start = input_ids.shape[1] if self.start is None else self.start
        step = input_ids.shape[1] - self.start
        rows = torch.arange(input_ids.shape[0], device=scores.device)
        forced = 1000 + (7 * (rows % GROUP) + 3 * step) % 97
        out = torch.full_like(scores, float("-inf"))
        out[rows, forced] = 0.0
        return out


def first_token_reward(completions, completion_ids, **kwargs) -> list[float]:
    """Differs between positions in a group (the first token depends on it)."""
    return [(ids[0] % 5) / 4 for ids in completion_ids]


def main(out: str, per_device_batch: int, data_dir: str, base_dir: str) -> None:
    from vgrpo.config import compose

    config = config_from_dict(compose("tiny"))
    train = dataclasses.replace(config.train, num_generations=GROUP, per_device_train_batch_size=per_device_batch,
                                max_steps=STEPS, save_steps=1000, learning_rate=1e-3, beta=0.0, warmup_ratio=0.0,
                                lr_scheduler_type="constant", max_completion_length=6, loss_type="grpo")
    config = dataclasses.replace(config, train=train)
    state = PartialState(cpu=True)
    model, processor = models.load_for_training(base_model_path(Path(base_dir)), config.model, config.train, "hf",
                                                "float32")
    original_generate = model.generate

    def generate(*args, **kwargs):
        return original_generate(*args, logits_processor=LogitsProcessorList([ForcedByPosition()]), **kwargs)

    model.generate = generate
    dataset = load_dataset(data_dir)["train"]
    trainer = build_trainer(config, model, processor, dataset, [first_token_reward], [1.0],
                            Path(out).parent / f"ckpt-{state.num_processes}")
    trainer.train()
    if state.is_main_process:
        lora = {name: p.detach().contiguous() for name, p in trainer.accelerator.unwrap_model(trainer.model)
                .named_parameters() if "lora_" in name}
        save_file(lora, out, metadata={"world_size": str(state.num_processes)})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
