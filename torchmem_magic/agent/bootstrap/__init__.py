"""The directory a watched command gets on PYTHONPATH: only its `sitecustomize` (see agent/boot.py)."""
