"""Adapters for where users already train and read their runs: loggers and trainers. None of their libraries
is a dependency of the package; each module says which extra installs what it needs."""
