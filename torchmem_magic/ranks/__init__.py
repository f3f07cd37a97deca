"""The watcher's side of a multi-process run: every rank's stream collected and its report assembled
(feed.py), each rank judged live (live.py), what a forked rank is handed (settings.py), what a launcher
started in the block inherits (launch_env.py), and a multi-node job's store (job.py, store_client.py,
publisher.py, remote.py).

Imports: stream/, tracing/, probes/ and every floor below; never flight/."""
