"""tpu-stack's Pulumi components and the pure logic behind them.

One ComponentResource per file (project, network, storage, identity, package,
tpu_node, platform); settings, catalog, naming, archive and cost hold the logic
and are tested without Pulumi.
"""
