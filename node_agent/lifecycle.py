"""The job's life on the node as one state machine: states, events, transitions as data."""

# Pure: no process, no clock, no I/O. `step(life, event)` gives the next `Life` and the
# actions; node_agent/life.py turns what happens into events (an observer per waiting
# state) and performs the actions (a handler each). A `Life` carries what the rules
# read besides the state (crashes and hangs in a row, the stop's reason, the update's
# release, the job's word on the TPU); a row's guard picks among a (state, event)'s
# rows, so crash limits, the hang back-off, the VM's stop winning and progress resetting
# counts are rows. docs/design.md ("The job's life on the node") shows the table and
# every state and event, held to this one by tests/agent/test_lifecycle.py, as systemd
# documents a unit's states (and skypilot's sky/jobs/state.py a managed job's). The
# table is text and the enums are made from its names: the zipapp's bytes are scarce.

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from node_agent.contract import (
    EXIT_NO_DATA,
    EXIT_OK,
    EXIT_TRANSIENT,
    PERMANENT_EXITS,
    STOPPED_EXITS,
)

CRASH_RETRIES = 3  # exit 1 or a signal, in a row without progress, before `failed`

# state event[:guard] next[:changes] actions...: the table, in the order guards are
# tried. ".": the state of the row above; `*group`: each of GROUPS' states; `*`: any
# state (AGENT_ERROR, a bug on a rare path: logged, backed off, a job still running
# followed again, never started twice). RELEASE: a new release, installed, while no job
# runs (UPDATE: while it runs); ONE_PASS: `run` without --stay, so no waiting.
ROWS = """
running SIGTERM stopping-sigterm note stop_job
. NOTICE stopping-notice note stop_job
. STOP_REQUESTED stopping-request:reason note stop_job
. HANG hung publish_hang send_stacks stop_job
. MAINTENANCE stopping-maintenance note stop_job
. UPDATE stopping-update:release stop_job
. EXIT_OK succeeded remember_done
. EXIT_STOPPED preempted publish_stop
. EXIT_PERMANENT failed publish_error
. EXIT_NO_DATA:after_progress waiting-for-data:crashes=0 reset_backoff wait_for_data
. EXIT_NO_DATA waiting-for-data wait_for_data
. EXIT_TRANSIENT:after_progress retrying:crashes=0,tpu_word reset_backoff back_off
. EXIT_TRANSIENT retrying:tpu_word back_off
. EXIT_CRASH:after_progress retrying:crashes=1 reset_backoff back_off
. EXIT_CRASH:at_crash_limit failed:crashes+1 publish_error
. EXIT_CRASH retrying:crashes+1 back_off
*stops EXIT_ANY:after_vm_stop preempted publish_stop
stopping-sigterm EXIT_ANY preempted publish_stop
stopping-notice EXIT_ANY preempted publish_stop
stopping-request EXIT_ANY stopped publish_stopped
stopping-maintenance EXIT_ANY restarting note reset_backoff
stopping-update EXIT_ANY updating note run_update
hung EXIT_ANY:after_new_save restarting:hangs=1 note_hang reset_backoff
. EXIT_ANY:hung_before retrying:hangs+1 note_hang back_off
. EXIT_ANY restarting:hangs+1 note_hang
stopped STOP_CLEARED restarting note
. SIGTERM preempted exit_preempted
. NOTICE preempted exit_preempted
. RELEASE updating:release run_update
. ONE_PASS preempted exit_preempted
release WORKER_IDLE idle publish_idle
. DONE_EARLIER succeeded publish_done_earlier
. BEGIN starting begin_accounting
restarting RESTART starting
*waits SIGTERM preempted exit_preempted
. NOTICE preempted publish_not_started exit_preempted
. RELEASE updating:release run_update
starting ADOPTED running
. STOP_REQUESTED stopped:reason publish_stopped
. GO installing install
installing INSTALLED running start_job
. INSTALL_TRANSIENT retrying back_off
. NO_DATA waiting-for-data wait_for_data
. TPU_HELD retrying back_off
waiting-for-data DATA_FOUND starting note
retrying WAITED starting
* AGENT_ERROR retrying back_off
"""
_LINES: list[list[str]] = []
for _line in ROWS.strip().splitlines():
    _LINES.append([_LINES[-1][0], *_line.split()[1:]] if _line[0] == "." else _line.split())
GROUPS = {"*stops": ("stopping-sigterm", "stopping-notice", "stopping-request",
                        "stopping-maintenance", "stopping-update", "hung"),
          "*waits": ("starting", "installing", "waiting-for-data", "retrying")}


def _enum(name: str, values: list[str]) -> Any:
    # Members named after their values (`stopping-sigterm`: STOPPING_SIGTERM); a str
    # enum, so a member equals its string.
    return enum.Enum(name, {value.upper().replace("-", "_"): value
                            for value in dict.fromkeys(values)}, type=str)


State = _enum("State", [name.split(":")[0] for line in _LINES for name in line[:3:2]
                        if "*" not in name])
Event = _enum("Event", [line[1].split(":")[0] for line in _LINES])
Action = _enum("Action", [name for line in _LINES for name in line[3:]])


@dataclasses.dataclass(frozen=True)
class Life:
    """The job's life: its state and what the rules read besides."""

    state: Any = State.RELEASE
    crashes: int = 0  # crashes in a row without progress
    hangs: int = 0  # hangs in a row without a new save
    stop_reason: str = ""  # the stop request that holds (`stopping-request`, `stopped`)
    update_to: Any = None  # the release an update runs next (node_agent.desired.Desired)
    tpu_busy: bool = False  # the job said another process holds the TPU


@dataclasses.dataclass(frozen=True)
class Happened:
    """An event with what the guards, the Life and the actions read of it."""

    event: Any
    progressed: bool = False  # an exit: the run made a step
    saved_new: bool = False  # an exit: the run saved a checkpoint past its start
    vm_stop: bool = False  # an exit: a SIGTERM or notice came while the agent stopped it
    tpu_busy: bool = False  # an exit: the job said another process holds the TPU
    # STOP_REQUESTED: the request; UPDATE, RELEASE: the release to run next; an exit: its
    # code; HANG: the hang; what else the actions show.
    detail: Any = None


# Guards (shown after the event in docs/design.md) and what a row changes in the Life
# (after the next state), by the names the table uses.
GUARDS: dict[str, Callable[[Life, Happened], bool]] = {
    "after_vm_stop": lambda life, it: it.vm_stop,
    "after_progress": lambda life, it: it.progressed,
    "at_crash_limit": lambda life, it: life.crashes >= CRASH_RETRIES,
    "after_new_save": lambda life, it: it.saved_new,
    "hung_before": lambda life, it: life.hangs > 0,
}
# A count's change is in its name: `crashes+1`, `hangs=1`.
CHANGES: dict[str, Callable[[Life, Happened], dict[str, Any]]] = {
    "reason": lambda life, it: {"stop_reason": it.detail},
    "release": lambda life, it: {"update_to": it.detail},
    "tpu_word": lambda life, it: {"tpu_busy": life.tpu_busy or it.tpu_busy},
}


@dataclasses.dataclass(frozen=True)
class Transition:
    state: Any
    on: Any
    when: str  # a GUARDS name, or ""
    to: Any
    changes: str  # CHANGES names joined by commas, or ""
    actions: tuple[Any, ...]

    @property
    def event(self) -> str:
        """The event as docs/design.md shows it: with its guard."""
        return self.on.value + f" {self.when}" * bool(self.when)

    @property
    def next(self) -> str:
        """The next state as docs/design.md shows it: with what changes in the Life."""
        return self.to.value + f", {self.changes}" * bool(self.changes)


TABLE = tuple(Transition(state if state == "*" else State(state), Event(event), when,
                         State(to), changes, tuple(map(Action, actions)))
              for head, (event, _, when), (to, _, changes), *actions in (
                  (line[0], line[1].partition(":"), line[2].partition(":"), *line[3:])
                  for line in _LINES)
              for state in GROUPS.get(head, (head,)))
_BY_KEY: dict[tuple[Any, Any], list[Transition]] = {}
for _row in TABLE:
    _BY_KEY.setdefault((_row.state, _row.on), []).append(_row)


class NoTransitionError(ValueError):
    """An event the state does not take: a bug in the agent's wiring."""


def transition(life: Life, happened: Happened) -> Transition:
    """The row taken: the first of (state, event), then of (state, EXIT_ANY) for an exit,
    whose guard holds."""
    rows = _BY_KEY.get((life.state, happened.event), []) + _BY_KEY.get(("*", happened.event), [])
    if happened.event.value.startswith("EXIT_"):
        rows += _BY_KEY.get((life.state, Event.EXIT_ANY), [])
    for row in rows:
        if not row.when or GUARDS[row.when](life, happened):
            return row
    raise NoTransitionError(f"{life.state.value} takes no {happened.event.value}")


def step(life: Life | str, event: Happened | str) -> tuple[Any, tuple[Any, ...]]:
    """The next Life and the actions for `event` in `life`. Given a bare state (a
    string), the next state."""
    happened = event if isinstance(event, Happened) else Happened(Event(event))
    if not isinstance(life, Life):
        new, actions = step(Life(State(life)), happened)
        return new.state, actions
    row = transition(life, happened)
    changes: dict[str, Any] = {}
    for name in row.changes.split(",") * bool(row.changes):
        count, add, value = name.partition("+") if "+" in name else name.partition("=")
        changes |= CHANGES[name](life, happened) if name in CHANGES else \
            {count: int(value) + getattr(life, count) * (add == "+")}
    return dataclasses.replace(life, state=row.to, **changes), row.actions


def exit_event(code: int, *, stop_sent: bool, stopped_in_start_up: bool) -> Any:
    """The job's exit as an event (docs/design.md, "What the agent does with an exit"):
    a clean stop (75, 76; a stop during start-up) is EXIT_STOPPED, as is any exit after a
    stop the VM or systemd asked for (`stop_sent`)."""
    if code == EXIT_OK:
        return Event.EXIT_OK
    if code in STOPPED_EXITS or stop_sent or stopped_in_start_up:
        return Event.EXIT_STOPPED
    if code in PERMANENT_EXITS:
        return Event.EXIT_PERMANENT
    if code == EXIT_NO_DATA:
        return Event.EXIT_NO_DATA
    if code == EXIT_TRANSIENT:
        return Event.EXIT_TRANSIENT
    return Event.EXIT_CRASH


def never_requested() -> str | None:
    """The default stop-request source (seam S4): no request, ever."""
    return None
