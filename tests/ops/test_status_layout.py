"""`tpuctl status` is narrow by default: the columns a user needs first fit 100 columns,
`--wide` shows every column, a long value wraps inside its cell and a node's name is
never cut."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from ops.tpu.api import NodeStatus
from ops.tpu.status_views import COLUMNS, status_table
from tests.ops.tpu_world import ZONE, expected_node, target

NARROW = ["node", "state", "health", "job", "step", "goodput", "message"]
LONG_NODE = "platform-nlp-sweep"  # the platform stack's
MESSAGE = ("finished: exported to gs://acme-ml-vision-prod-checkpoints/export/"
           "platform-nlp-sweep/ after 5000 steps")


def node(node_id: str, **job: str) -> NodeStatus:
    return NodeStatus(ZONE, node_id, "READY", "HEALTHY", "v5litepod-8", "tpu-vm-tf-2.18.0-pjrt",
                      True, {}, {}, "", job={"state": "running", "step": "1200",
                                             "updated": "2026-12-04T21:00:00+00:00", **job})


def render(renderable: object, width: int) -> list[str]:
    out = StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue().splitlines()


def headers(lines: list[str]) -> list[str]:
    header = next(line for line in lines if "node" in line and "state" in line)
    return [cell.strip() for cell in header.strip("┃│ ").split("┃") if cell.strip()]


def stack() -> tuple[object, list[NodeStatus]]:
    nodes = [node("dev-trainer", message="step 1200 loss 0.31"),
             node(LONG_NODE, state="succeeded", message=MESSAGE)]
    return target(*(expected_node(n.node_id) for n in nodes)), nodes


def test_the_default_shows_the_columns_users_need_first_within_100_columns() -> None:
    expected, nodes = stack()
    lines = render(status_table(expected, nodes), 10_000)  # a pipe: nothing wraps
    assert lines[0] == "stack dev (acme-ml-dev)"
    assert headers(lines) == NARROW
    nodes[1].job["message"] = "step 5000 loss 0.12"
    lines = render(status_table(expected, nodes), 10_000)
    assert max(len(line) for line in lines) <= 100
    wide = render(status_table(expected, nodes, wide=True), 10_000)
    assert max(len(line) for line in wide) > 100  # what --wide adds does not fit


def test_a_narrow_terminal_wraps_the_message_and_keeps_every_name_whole() -> None:
    expected, nodes = stack()
    lines = render(status_table(expected, nodes), 100)
    assert max(len(line) for line in lines) <= 100
    assert any(LONG_NODE in line for line in lines)
    assert "…" not in "".join(lines)
    message = "".join(line.split("│")[-2].strip() for line in lines if line.count("│") > 2)
    assert MESSAGE.replace(" ", "") in message.replace(" ", "")


def test_wide_shows_every_column() -> None:
    expected, nodes = stack()
    lines = render(status_table(expected, nodes, wide=True), 10_000)
    # lost $ and agent: only where some node has a value (none here)
    assert headers(lines) == [column.header for column in COLUMNS if not column.filled]
    assert len(COLUMNS) == 15


def test_a_large_stack_in_plain_columns_is_narrow_too() -> None:
    nodes = [node(f"dev-n{i:03d}") for i in range(250)]
    lines = render(status_table(target(*(expected_node(n.node_id) for n in nodes)), nodes),
                   10_000)
    assert lines[1].split() == NARROW
    assert lines[2].split() == ["dev-n000", "READY", "HEALTHY", "running", "1200"]
