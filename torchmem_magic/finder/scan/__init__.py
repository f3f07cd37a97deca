"""Find the tensors and autograd graphs that objects keep alive, without running user code.

`gc.get_referrers`, objgraph and pympler stop at the C++ autograd graph; this package walks it.
A scan is bounded in depth, objects, graph nodes and time, says so when it stops early, and keeps
only ids and numbers: every reference to a user object is dropped when it returns.

Modules, from the bottom up:

- `results`: what goes in and comes out of a scan (`Root`, `Budget`, `RootStats`, `ScanResult`),
  importable without loading the walker.
- `introspect`: the only code that reaches into user objects, through C-level accessors chosen by
  an object's type; each object's category and children.
- `paths`: lazy paths from a root to what it holds, spelled out only for tensors.
- `autograd`: the walk of the autograd graphs behind the tensors found, within a node cap.
- `scanner`: the traversal from the roots, and the entry point `scan_roots()`.

Import from the module that holds a name; this package re-exports nothing.
"""
