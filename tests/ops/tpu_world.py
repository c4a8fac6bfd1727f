"""The project, zones, labels and stack targets the tpuctl tests share."""

from model import catalog
from model.fleet import ExpectedNode, StackTarget

PROJECT = "acme-ml-dev"
ZONE = "us-central1-b"
OTHER_ZONE = "europe-west4-a"
STACK_LABELS = {"stack": "dev", "managed-by": "pulumi"}


def expected_node(
    node_id: str,
    zone: str = ZONE,
    accelerator_type: str = "v2-8",
    runtime_version: str = "tpu-vm-tf-2.18.0-pjrt",
    spot: bool = False,
) -> ExpectedNode:
    return ExpectedNode(
        logical=node_id.removeprefix("dev-"),
        node_id=node_id,
        zone=zone,
        tpu=catalog.parse_accelerator_type(accelerator_type),
        runtime_version=runtime_version,
        spot=spot,
        queued=False,
        project=PROJECT,
    )


def target(*nodes: ExpectedNode) -> StackTarget:
    return StackTarget(project=PROJECT, stack="dev", nodes=tuple(nodes))
