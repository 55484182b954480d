"""Hardware-in-the-loop harness: devices under test (simulated in network namespaces, or
real ones over SSH), fault injectors, scenarios with pass/fail invariants, and reports.

``hil list`` names the scenarios; ``hil run SCENARIO [--device sim|ssh://user@host]``
runs them against a real fleet-server and a real agent. See hil/README.md.
"""
