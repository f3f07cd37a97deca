"""Pure judgement: the leak verdict over a run's series (verdict.py), whether a holder grows and the verdict
the curves and the holders give together (holders.py), why a DataLoader worker died (forensics.py), and the
fixed form of the user's own line (fixes.py).

Imports: core/ and the standard library only."""
