"""The pure core's tests: the package's data, analysis, report assembly and text forms, with nothing but the
standard library and pytest (no torch, IPython, psutil, numpy or widgets), on every supported Python.

`make test` runs this directory again in a venv per Python (3.10, 3.12, 3.13), from outside the checkout, against
the package installed there from this checkout without its dependencies: TORCHMEM_CORE_INSTALLED=1 says so,
and the tests then insist on that installed copy."""
