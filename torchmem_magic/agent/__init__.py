"""Inside each watched rank: the session a rank runs and streams to its watcher (rank.py), and how a
watched command's Python processes are armed to start one at their first step (boot.py, bootstrap/)."""
