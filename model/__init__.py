"""The stack's model: settings, TPU facts and every decision made from them, pure.

Holds the settings (schema, loading, rules), the catalog (the only source of TPU
facts), naming (the only place GCP names are made), cost, capacity, candidates,
subnets, locality, the meter and the archives. Imports no pulumi and no cloud
client: `components/` turns this model into Pulumi resources, `ops/` into verbs.
May import: tpu_training (the job's schema), node_agent (its contract), functions
(the budget function's pure arithmetic), cloud.
"""
