"""What a study cost, from its runs' own start and end times in MLflow (start-up and the final evaluation included):
one function for every report kind that states it (the known-results study's Compute section, the ladder's).

    run-hours   the runs' summed durations: each run is one process of one thread, so this is core-hours of training
    busy        the wall time during which at least one run was going (the union of the runs' intervals): a study
                that spans sessions does not count the pauses between them
    elapsed     the first start to the last end, pauses included
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end] intervals: the time at least one of them was running."""
    total, cur_start, cur_end = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_end is None or a > cur_end:
            total += 0.0 if cur_end is None else cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    return total + (0.0 if cur_end is None else cur_end - cur_start)


@dataclass(frozen=True)
class Cost:
    runs: int  # runs with both a start and an end time
    run_seconds: float
    busy_seconds: float
    elapsed_seconds: float

    @property
    def run_hours(self) -> float:
        return self.run_seconds / 3600.0

    @property
    def concurrency(self) -> float:
        """Runs going at once, on average over the busy time."""
        return self.run_seconds / self.busy_seconds if self.busy_seconds > 0 else float("nan")


def cost_of(runs: pd.DataFrame) -> Cost:
    """The cost of `runs` (MLflow's start_time and end_time columns, in ms); runs missing either are not counted."""
    t = runs[["start_time", "end_time"]].dropna().astype(float) / 1000.0  # ms -> s
    if not len(t):
        return Cost(0, 0.0, 0.0, 0.0)
    return Cost(len(t), float((t["end_time"] - t["start_time"]).sum()),
                busy_seconds(list(zip(t["start_time"], t["end_time"]))),
                float(t["end_time"].max() - t["start_time"].min()))
