"""What tpuctl needs to know about a stack: its project, its nodes, where they live.

Built from the lead's `StackSettings` (components/stack_config.py) so the node ids,
slices and projects are exactly those `pulumi up` makes; tests build one directly.
A team's nodes live in the team's own project (docs/teams.md), so one stack's
nodes may span several projects: every node carries its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from components import catalog
from components.settings import SettingsError, StackSettings
from components.stack_config import StackFileError, settings_for


class TargetError(ValueError):
    """The stack cannot be read; the message says why."""


@dataclass(frozen=True)
class ExpectedNode:
    """One node of the stack config, resolved: its TPU node id and slice."""

    logical: str
    node_id: str
    zone: str
    tpu: catalog.Slice
    runtime_version: str
    spot: bool
    queued: bool
    project: str

    @property
    def region(self) -> str:
        return catalog.region_of(self.zone)


@dataclass(frozen=True)
class StackTarget:
    project: str
    stack: str
    nodes: tuple[ExpectedNode, ...]

    @property
    def zones(self) -> list[str]:
        return sorted({node.zone for node in self.nodes})

    @property
    def places(self) -> list[tuple[str, str]]:
        """(project, zone) of every node: where the TPU API lists them."""
        return sorted({(node.project, node.zone) for node in self.nodes})

    @property
    def projects(self) -> list[str]:
        """The projects the nodes live in; the stack's own when it has no nodes."""
        return sorted({node.project for node in self.nodes}) or [self.project]

    @property
    def queued_node_ids(self) -> list[str]:
        return [node.node_id for node in self.nodes if node.queued]

    def expected(self, node_id: str) -> ExpectedNode | None:
        return next((node for node in self.nodes if node.node_id == node_id), None)


def target_for(settings: StackSettings) -> StackTarget:
    nodes = tuple(
        ExpectedNode(
            logical=node.name,
            node_id=settings.naming.tpu_node(node.name, team),
            zone=node.zone,
            tpu=node.tpu,
            runtime_version=node.runtime,
            spot=node.spot,
            queued=node.provisioning == "queued",
            project=settings.node_project(team),
        )
        for team, node in settings.named_nodes
    )
    return StackTarget(project=settings.gcp_project, stack=settings.stack, nodes=nodes)


def load_target(stack: str) -> StackTarget:
    """The stack's target from Pulumi.yaml + Pulumi.<stack>.yaml, or one clear TargetError."""
    try:
        return target_for(settings_for(stack))
    except (SettingsError, StackFileError) as error:
        raise TargetError(str(error)) from None
