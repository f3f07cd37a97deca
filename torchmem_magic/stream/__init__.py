"""What a run streams and how, shared by a rank talking to its watcher and by the flight record on disk: the
messages (protocol.py), the socket and the outbox that never blocks a step (transport.py), a timeline whose
rows also go to a stream (relay.py), and a stream read back into a run's timeline and evidence (feed.py).

Imports: report/, analysis/, core/ and the standard library."""
