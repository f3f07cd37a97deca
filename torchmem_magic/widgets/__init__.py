"""The live figure and its buttons in a notebook (live.py, controls.py, curve_strip.py, rank_curves.py), and
which thread sends its updates (live_route.py, update_route.py): the only modules that import ipywidgets or
bqplot.

Imports: session/ and every floor below."""
