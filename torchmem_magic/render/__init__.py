"""Renderers: text/HTML (stdlib only) and the live bqplot figure (the only widget code)."""
