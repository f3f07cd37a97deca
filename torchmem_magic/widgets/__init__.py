"""The live figure and its buttons in a notebook: the only modules that import ipywidgets or bqplot."""
