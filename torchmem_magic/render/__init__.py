"""The forms people read, as plain functions of the data: text and HTML (text.py), the static SVG figure
(static.py) and its axes (axis_range.py), and the results users hold, `Report` and `MemcheckResult`, with
their reprs (results.py).

Imports: analysis/, core/ and the standard library only."""
