"""The controller (issue 43): one level-triggered reconcile of a platform's TPU fleet.

Layers (docs/design.md, "The controller"):

- manifest.py: the desired state each stack writes to GCS (pure, JSON in and out);
- plan.py: the pure planner: desired state, actual state (the TPU API's lists), holds,
  moves in flight and the agents' status in; one list of steps, each with its reason, out.
  `tpuctl reconcile`, `tpuctl janitor` and `tpuctl recover` show its plan;
- store.py: the controller's objects in GCS: manifests, the lease, moves, the audit;
- apply.py: carries out a plan's steps against the TPU API, a move in three recorded
  phases (intent, delete confirmed gone, create) so a killed run is finished by the next;
- run.py: one run: lease, read, plan, apply, audit. The Cloud Run function
  (functions/controller/main.py) and `tpuctl reconcile --apply` both call it;
- agents.py: the agents' last status (idle stops), one listing per logs bucket a
  manifest names;
- views.py: `tpuctl janitor` and `tpuctl recover`: the plan's steps of their kinds.
"""
