"""What runs beside the user's loop: the step clocks and epoch markers (hooks.py, with what they ask of dynamo,
dynamo.py, and of the process they count in, forks.py), the run's clocks (steps.py), the sampling thread
(sampler.py), the memory guard (guard.py) and autograd's grad mode after an interrupt (grad_mode.py).

Imports: probes/, finder/ and every floor below."""
