"""The `rehearse` verb (ops/rehearse.py): boot a stack's node on this machine."""

from ops.rehearse import register

__all__ = ["register"]
