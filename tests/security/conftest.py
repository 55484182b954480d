"""The Hypothesis profile of the fuzz tests: deterministic (``derandomize``: the same
inputs on every run, in CI too), no deadline (a shared CI machine is slow at times), no
example database written, and quiet."""

from __future__ import annotations

from hypothesis import HealthCheck, Verbosity, settings

settings.register_profile(
    "edgefleet-fuzz",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    verbosity=Verbosity.quiet,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("edgefleet-fuzz")
