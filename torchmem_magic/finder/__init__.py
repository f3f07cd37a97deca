"""The leak finder: the forward scan from the user's names and the search back from live tensors (scan/),
the holders' sizes during the run (holder_tracking.py), suspects and their fixes (suspects.py), one run's
finder (leak_finder.py), where a notebook or a script keeps its names (notebook.py, stack_roots.py), and
`memcheck` (check.py). Uses torch where it is already imported; never IPython.

Imports: report/, render/, analysis/, core/."""
