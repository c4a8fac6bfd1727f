"""The stack config, typed and checked: the only place a rule about it lives.

`load_settings(raw)` takes the config as the Pulumi CLI hands it to the program
(`tpu-stack:<key>` → value) and returns a `StackSettings`, or raises one
`SettingsError` that lists every problem with its key path and what is allowed,
e.g. `tpu-stack:nodes[0].topology: 3x3 is not a v5e topology (1x1, 2x2, …)`.

Two passes: pydantic checks shape and types (unknown keys refused), then plain
functions check what depends on several values or on the catalog. Both run on
every file: where pydantic refuses a part, a copy with that part taken out (an
unknown key, an invalid optional value back to its default, a list entry) or a
blank in its place (a required value) still goes through the rules, so one
message lists every problem, never one kind after another.

The package: `schema` (the pydantic models), `load` (reading, repair, the all-at-once
error list), `rules/` (nodes, placement, teams, CI); layered schema <- cost <- rules <-
load, with no circle."""
