"""tpu-stack's Pulumi side: ComponentResources and dynamic providers only.

One ComponentResource per file (project, network, storage, identity, package, tpu_node,
teams, team_stack, ci, budget_stop, platform), the dynamic providers (queued_tpu,
fallback_tpu), the marker reads (budget_hold), the stack's files (stack_config) and the
program (program.py). Every decision they make comes from `model/` (pure, tested
without Pulumi). May import: model, functions, cloud, node_agent, tpu_training.
"""
