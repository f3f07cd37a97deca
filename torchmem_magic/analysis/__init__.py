"""Pure judgement: what the detector finds (findings.py); the leak verdict over a run's series, as ordered
rules (verdict.py), with a staircase's epochs (epochs.py) and the DataLoader workers' growth
(worker_growth.py); one holder's trend and the top holder (holder_trends.py); the verdict the curves and the
holders give together (holders.py); why a DataLoader worker died (forensics.py); and the fixed form of the
user's own line (fixes.py).

Imports: core/ and the standard library only."""
