"""`train.revisit_unsolved`: prompts whose group drew no right answer are drawn again later in the run.

GRPO samples from the policy it is training; the RFT control samples its warm start once. A prompt whose
answers were all wrong teaches GRPO nothing (no reward spread), but the same prompt a few steps later meets a
policy that may have learned to reach it. The queue keeps such groups' rows and puts them back in place of
the first fresh groups of a later step, so GRPO draws as many answers as before (the control's budget is
unchanged); each prompt comes back once.
"""

from __future__ import annotations

from collections import deque


class UnsolvedPrompts:
    """A first-in, first-out queue of groups (each a prompt's rows, `group_size` in a row, as TRL's
    RepeatSampler lays them out) whose answers earned no correctness credit, at most `per_step` put back
    into each generation batch."""

    def __init__(self, per_step: int, group_size: int):
        self.per_step, self.group_size = per_step, group_size
        self.queue: deque[list[dict]] = deque()
        self.revisited = 0  # groups put back so far

    def splice(self, rows: list[dict]) -> tuple[list[dict], list[bool]]:
        """`rows` with up to `per_step` queued groups in place of its first groups; returns the rows and,
        per group, whether it is a revisit (a revisit is not queued again)."""
        groups = [rows[i:i + self.group_size] for i in range(0, len(rows), self.group_size)]
        if any(len(group) != self.group_size or len({(row["question"], row["answer"]) for row in group}) > 1
               for group in groups):
            raise ValueError(f"train.revisit_unsolved: the rollout batch is not whole groups of {self.group_size} "
                             "rows of one prompt each")
        returning = min(self.per_step, len(self.queue), len(groups))
        for i in range(returning):
            groups[i] = self.queue.popleft()
        self.revisited += returning
        return [row for group in groups for row in group], [i < returning for i in range(len(groups))]

    def record(self, rows: list[dict], correct: list[bool], revisits: list[bool]) -> None:
        """Queue the first-visit groups none of whose answers was right (`correct`, one per row)."""
        if len(correct) != len(rows):
            raise ValueError(f"train.revisit_unsolved: {len(correct)} answers scored for {len(rows)} rows")
        for g, revisit in enumerate(revisits):
            start = g * self.group_size
            if not revisit and not any(correct[start:start + self.group_size]):
                self.queue.append(rows[start:start + self.group_size])

    @property
    def queued(self) -> int:
        """Groups found unsolved on their first visit: those put back and those still waiting."""
        return self.revisited + len(self.queue)
