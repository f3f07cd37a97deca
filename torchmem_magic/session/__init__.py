"""One memwatch run and the parts that own its state: the session (run.py), its part on the training thread
(step_path.py) and on the sampler thread (background.py), what holds its start and end whatever happens
(lifecycle.py), the read-only view observers get (live_view.py), the actions a user asks for (actions.py),
and tracebacks IPython can show (tracebacks.py).

Imports: flight/, ranks/, tracing/, probes/, finder/ and every floor below; never widgets or IPython's
magics."""
