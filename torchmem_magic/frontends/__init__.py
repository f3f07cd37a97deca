"""Thin adapters over the session: the IPython magics (magics.py), the CI gate (gate.py), the command line's
`watch` with its terminal status and Prometheus gauges (command.py, watch_status.py, watch_metrics.py), and
what keeps a failing or interrupted cell's reply whole (late_interrupts.py, late_worker_deaths.py).

Imports: anything below (widgets/, session/, ...); the package's public modules (api.py) beside it."""
