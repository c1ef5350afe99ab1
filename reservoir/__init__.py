"""The top of the program: the `reservoir` command and its wiring to the agent, the webhook and certs.

Nothing below imports this package (the layers are checked by import-linter, see pyproject.toml).
"""
