"""Serve the pack to the Pulumi engine (blocks): `pulumi preview --policy-pack policy`."""

import sys
from pathlib import Path

# The engine runs this file from policy/; the policies read model/catalog.py.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import PolicyPack

from policy.tpu_policies import POLICIES

PolicyPack(name="tpu-stack-guardrails", policies=POLICIES)
