"""A run's report assembled from what it gathered (assemble.py), per-rank reports merged into one (merge.py),
saved and read back (saved.py), and two saved runs compared (compare.py).

Imports: render/, analysis/, core/ and the standard library only."""
