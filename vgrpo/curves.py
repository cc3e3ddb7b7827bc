"""Training curves for DVC: a Trainer callback that logs every numeric value with DVCLive."""

from __future__ import annotations

from transformers import TrainerCallback


class LiveCurves(TrainerCallback):
    """Per-step curves and a summary with DVCLive (`<prefix>/<key>.tsv`), keyed by the trainer's global
    step, so a resumed run continues the same curves."""

    def __init__(self, live, prefix: str = "train"):
        self.live, self.prefix = live, prefix

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self.live.step = state.global_step
        for key, value in logs.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.live.log_metric(f"{self.prefix}/{key}", value)
        self.live.make_summary()
