"""The tpu-stack policy pack (`pulumi preview --policy-pack policy`) and the permission
proof's table (permissions.py, iam_roles.json). May import: components, model and below.
"""
