"""Core: the exception tree, `@record`, provider-neutral messages, circuit breakers and budgets.

Imports no other layer of Conclave."""
