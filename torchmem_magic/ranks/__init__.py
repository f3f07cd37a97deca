"""The watcher's side of a multi-process run: what ranks stream (protocol.py) over which socket
(transport.py), each rank's feed rebuilt (feed.py) and judged live (live.py), the relayed timeline
(relay.py), and what a forked rank is handed (settings.py)."""
