"""The project, zones and labels the tpuctl tests share."""

PROJECT = "acme-ml-dev"
ZONE = "us-central1-b"
OTHER_ZONE = "europe-west4-a"
STACK_LABELS = {"stack": "dev", "managed-by": "pulumi"}
