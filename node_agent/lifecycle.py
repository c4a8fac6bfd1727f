"""The job's life on the node as one state machine: states, events, transitions as data."""

# Pure: no process, no clock, no I/O. `step(state, event)` gives the next state and the
# actions the agent performs (`agent.Agent` turns watchers, the job's lines and exits,
# timers and signals into events, and actions into calls). The table is also in
# docs/design.md ("The job's life on the node"), held to this one by
# tests/agent/test_lifecycle.py, the way systemd documents a unit's states.
#
# States: `running` (the job runs), `stopping` (the agent sent SIGTERM: the job saves;
# `stopping-<why>` says why, so the exit is read right), `hung` (a phase passed its
# deadline: stacks, then the stop), and what follows an exit: `succeeded`, `failed`,
# `preempted` (stopped by the VM or systemd; the agent exits), `stopped` (a stop request,
# seam S4: the job is not started again while the request holds), `retrying` (backoff,
# then a new start), `waiting-for-data`, `restarting` (started again at once), `updating`
# (the new release runs next).
#
# Events while the job runs, by priority (the agent offers the first that holds, once a
# second): SIGTERM, NOTICE, STOP_REQUESTED, HANG, MAINTENANCE, UPDATE. After the job
# exits, `exit_event` names the exit as one event.

from __future__ import annotations

import dataclasses

from node_agent.contract import (
    EXIT_NO_DATA,
    EXIT_OK,
    EXIT_TRANSIENT,
    PERMANENT_EXITS,
    STOPPED_EXITS,
)


@dataclasses.dataclass(frozen=True)
class Transition:
    state: str
    event: str
    next: str
    actions: tuple[str, ...]


def _rows(*rows: tuple[str, str, str, str]) -> tuple[Transition, ...]:
    return tuple(Transition(state, event, next_state, tuple(actions.split()))
                 for state, event, next_state, actions in rows)


# (state, event, next state, actions): the whole table (docs/design.md shows it).
TABLE = _rows(
    ("running", "SIGTERM", "stopping-sigterm", "note stop_job"),
    ("running", "NOTICE", "stopping-notice", "note stop_job"),
    ("running", "STOP_REQUESTED", "stopping-request", "note stop_job"),
    ("running", "HANG", "hung", "publish_hang send_stacks stop_job"),
    ("running", "MAINTENANCE", "stopping-maintenance", "note stop_job"),
    ("running", "UPDATE", "stopping-update", "stop_job"),
    ("running", "EXIT_OK", "succeeded", "remember_done"),
    ("running", "EXIT_STOPPED", "preempted", "publish_stop"),
    ("running", "EXIT_PERMANENT", "failed", "publish_error"),
    ("running", "EXIT_NO_DATA", "waiting-for-data", "wait_for_data"),
    ("running", "EXIT_TRANSIENT", "retrying", "back_off"),
    ("running", "EXIT_CRASH", "retrying", "count_crash back_off"),
    ("stopping-sigterm", "EXIT_ANY", "preempted", "publish_stop"),
    ("stopping-notice", "EXIT_ANY", "preempted", "publish_stop"),
    ("stopping-request", "EXIT_ANY", "stopped", "publish_stopped"),
    ("stopping-maintenance", "EXIT_ANY", "restarting", "note"),
    ("stopping-update", "EXIT_ANY", "updating", "note"),
    ("hung", "EXIT_ANY", "restarting", "note_hang"),
    ("stopped", "STOP_CLEARED", "restarting", "note"),
    ("stopped", "SIGTERM", "preempted", "publish_stop"),
)
_BY_KEY = {(row.state, row.event): row for row in TABLE}
STATES = tuple(dict.fromkeys([row.state for row in TABLE] + [row.next for row in TABLE]))
EVENTS = tuple(dict.fromkeys(row.event for row in TABLE))


class NoTransitionError(ValueError):
    """An event the state does not take: a bug in the agent's wiring."""


def step(state: str, event: str) -> tuple[str, tuple[str, ...]]:
    """The next state and the actions for `event` in `state`. In a `stopping-*` or `hung`
    state every exit is `EXIT_ANY`: why the agent stopped the job decides."""
    row = _BY_KEY.get((state, event))
    if row is None and event.startswith("EXIT_"):
        row = _BY_KEY.get((state, "EXIT_ANY"))
    if row is None:
        raise NoTransitionError(f"no transition from {state} on {event}")
    return row.next, row.actions


def exit_event(code: int, *, stop_sent: bool, stopped_in_start_up: bool) -> str:
    """The job's exit as an event (docs/design.md, "What the agent does with an exit"):
    a clean stop (75, 76; a stop during start-up) is EXIT_STOPPED, as is any exit after a
    stop the VM or systemd asked for (`stop_sent`)."""
    if code == EXIT_OK:
        return "EXIT_OK"
    if code in STOPPED_EXITS or stop_sent or stopped_in_start_up:
        return "EXIT_STOPPED"
    if code in PERMANENT_EXITS:
        return "EXIT_PERMANENT"
    if code == EXIT_NO_DATA:
        return "EXIT_NO_DATA"
    if code == EXIT_TRANSIENT:
        return "EXIT_TRANSIENT"
    return "EXIT_CRASH"


def never_requested() -> str | None:
    """The default stop-request source (seam S4): no request, ever."""
    return None
