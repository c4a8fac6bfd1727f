"""`tpuctl`'s argument parsing: the typer application the verbs register on and how
its help labels options. Imports typer and ops.terminal only."""
