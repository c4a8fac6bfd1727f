"""Goodput: every second of a node's work on a job in one category (docs/design.md)."""

from __future__ import annotations

from collections.abc import Mapping

from node_agent.contract import EXIT_OK, EXIT_PREEMPTED
from node_agent.job_lines import JOB_CATEGORIES, JobRun

CATEGORIES = (*JOB_CATEGORIES, "waiting_for_data", "lost_progress", "infrastructure_recovery")

def settle_run(run: JobRun, code: int, wall: float) -> dict[str, float]:
    """The seconds one finished job process adds to each category.

    The job's own report counts; what it did not report (interpreter start and exit,
    or the time after its last report when it died) is the remainder of its wall time.
    A run that ended without saving its last steps (a crash, a kill, a failed stop
    save) lost them: their share of its productive seconds moves to `lost_progress`,
    and so does the unreported remainder of a run that had been training. A run the
    agent stopped as hung lost the seconds from its last progress line to its exit
    (`run.hang["lost"]`, within the unreported remainder) whatever phase it hung in.
    """
    added = {category: run.reported.get(category, 0.0) for category in JOB_CATEGORIES}
    remainder = max(0.0, wall - sum(added.values()))
    hung = min(remainder, float((run.hang or {}).get("lost", 0.0)))  # type: ignore[arg-type]
    clean = code in (EXIT_OK, EXIT_PREEMPTED) or run.step <= run.start_step
    if clean:
        added["program_startup"] += remainder - hung
        if hung:
            added["lost_progress"] = hung
        return added
    durable = max(run.start_step, run.saved_step or 0)
    trained = run.reported_step - run.start_step
    per_step = added["productive"] / trained if trained > 0 else 0.0
    lost = min(added["productive"], per_step * max(0, run.step - durable))
    added["productive"] -= lost
    added["lost_progress"] = lost + remainder
    return added


class Goodput:
    """Seconds per category over every run of one job on this node (restarts too:
    the totals live in the status object). `percent`: productive (kept) seconds over
    all accounted seconds."""

    def __init__(self, job: str, totals: Mapping[str, object] | None = None):
        self.job = job
        self.totals = {category: 0.0 for category in CATEGORIES}
        for category in CATEGORIES:
            value = (totals or {}).get(category)
            if isinstance(value, (int, float)) and value >= 0:
                self.totals[category] = float(value)

    @classmethod
    def resume(cls, job: str, previous: Mapping[str, object]) -> Goodput:
        """The totals an earlier agent published for this same job, else zeros."""
        earlier = previous.get("goodput")
        if isinstance(earlier, dict) and earlier.get("job") == job:
            return cls(job, earlier)
        return cls(job)

    def add(self, category: str, seconds: float) -> None:
        self.totals[category] += max(0.0, seconds)

    def merge(self, added: Mapping[str, float]) -> None:
        for category, seconds in added.items():
            self.add(category, seconds)

    def view(self, live: Mapping[str, float] | None = None) -> dict[str, object]:
        """The status object: totals (plus a running job's report so far) and percent."""
        totals = dict(self.totals)
        for category, seconds in (live or {}).items():
            totals[category] = totals.get(category, 0.0) + seconds
        accounted = sum(totals.values())
        percent = round(100.0 * totals["productive"] / accounted, 1) if accounted else None
        return {k: round(v, 3) for k, v in totals.items()} | {
            "total": round(accounted, 3), "percent": percent, "job": self.job}

