"""The budget-stop function (docs/design.md, "Budgets that stop TPUs")."""
