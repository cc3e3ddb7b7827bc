"""Training curves for DVC: a Trainer callback that logs every numeric value with DVCLive."""

from __future__ import annotations

from transformers import TrainerCallback

# What the Trainer logs once, at the end of a run: figures of the run, not curves (a curve of one point).
END_OF_RUN = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss")


class LiveCurves(TrainerCallback):
    """Per-step curves and a summary with DVCLive (`<prefix>/<key>.tsv`), keyed by the trainer's global
    step, so a resumed run continues the same curves. The end-of-run figures go to the summary only."""

    def __init__(self, live, prefix: str = "train"):
        self.live, self.prefix = live, prefix

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self.live.step = state.global_step
        end_of_run = any(key in logs for key in END_OF_RUN)
        for key, value in logs.items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            if end_of_run:
                self.live.summary[f"{self.prefix}/{key}"] = value
            else:
                self.live.log_metric(f"{self.prefix}/{key}", value)
        self.live.make_summary()
