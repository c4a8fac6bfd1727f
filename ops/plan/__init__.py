"""The offline plan: the program run under the mock engine, its report, the diff against
a base; the verb is ops/commands/plan.py. May import components, policy, model and below."""
