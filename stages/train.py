"""Stage 3: GRPO with LoRA on Qwen3-VL (Unsloth on CUDA, TRL + PEFT elsewhere), rule-based rewards,
DVCLive curves, checkpoints every `train.save_steps`, and the final adapter.

    python stages/train.py                                  # params.yaml -> models/adapter
    dvc exp run -S profile=tiny                             # the whole pipeline on a CPU
    dvc exp run -S train.resume=true                        # continue from checkpoints/
    dvc exp run -S train.num_processes=2                    # DDP under accelerate (zero2/zero3: accelerate_config)
"""

import subprocess
import sys
from pathlib import Path

import click

from vgrpo.cli import quiet_libraries, user_errors
from vgrpo.config import load_config


@click.command()
@click.option("--params", "params_path", default="params.yaml", show_default=True, help="Params file.")
@click.option("--data", "data_dir", default="data/shapes", show_default=True, help="Dataset from `generate`.")
@click.option("--base", "base_dir", default="models/base", show_default=True, help="Base model from `base`.")
@click.option("--adapter", "adapter_dir", default="models/adapter", show_default=True, help="LoRA adapter out.")
@click.option("--checkpoints", "checkpoints_dir", default="checkpoints", show_default=True,
              help="Trainer checkpoints (kept between runs for train.resume).")
@click.option("--reports", "reports_dir", default="reports/train", show_default=True, help="DVCLive output.")
def main(params_path, data_dir, base_dir, adapter_dir, checkpoints_dir, reports_dir) -> None:
    """Train the LoRA adapter with GRPO."""
    with user_errors():
        config = load_config(params_path)
        quiet_libraries()
        import torch

        from vgrpo import base, distributed
        from vgrpo.backends import (
            check_device_options,
            check_report_to,
            check_vllm_server,
            import_unsloth,
            resolve_backend,
        )
        from vgrpo.devices import load_dtype
        from vgrpo.shapes import load_dataset

        cuda = torch.cuda.is_available()
        check_device_options(config.train, cuda)
        check_report_to(config.train)
        dtype = load_dtype(config.model, config.train)
        distributed.check_processes(config.train, torch.cuda.device_count() if cuda else 0)
        load_dataset(data_dir, splits=("train",))  # fail on a missing dataset or base before any model loads
        source = base.read_source(Path(base_dir))
        base.base_model_path(Path(base_dir))
        check_vllm_server(config.train)
        if config.train.num_processes > 1 and not distributed.is_launched():
            command = distributed.launch_command(config.train, sys.argv)
            click.echo(f"train: {' '.join(command)}")
            sys.exit(subprocess.call(command))
        backend = resolve_backend(config.train.backend, cuda)
        click.echo(f"train: backend {backend} (asked: {config.train.backend}, CUDA: {cuda}), {dtype}"
                   f"{' 4-bit' if config.train.load_in_4bit else ''}, base {base.describe(source)}")
        if backend == "unsloth":
            import_unsloth()  # before transformers/TRL, so its patches apply
        from vgrpo.training import run_training

        summary = run_training(config, backend, dtype, Path(data_dir), Path(base_dir), Path(adapter_dir),
                               Path(checkpoints_dir), Path(reports_dir), log=click.echo)
        if summary is None:  # not rank 0: rank 0 reports
            return
        click.echo(f"train: {summary['steps']} steps in {summary['seconds']} s, final reward "
                   f"{summary['final_reward']}, world size {summary['world_size']}, adapter in {adapter_dir}")


if __name__ == "__main__":
    main()
