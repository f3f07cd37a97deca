"""Watching every process of a multi-process run (DDP ranks): the agent inside each rank, the
transport to the watcher, the watcher's side, and how per-rank reports merge into one."""
