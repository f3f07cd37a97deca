"""The forms people read, as plain functions of the data: text and HTML (text.py), the static SVG figure
(static.py). Standard library only."""
