"""The flight recorder: what a `%%memwatch` run leaves on disk, so that a kernel the OOM killer
SIGKILLs still tells, after its restart, what its memory did until the end."""
