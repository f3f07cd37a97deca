"""The bottom floor: what a run measured, as plain data, and the facts every floor shares. The data model
(model.py), the resources table (resources.py), the timeline's bounded series (timeline.py), the series'
shape maths (slopes.py), units, options, and the step sampling and step requests' plain state.

Imports: the standard library only (no torch, IPython, psutil or widgets), and nothing above it."""
