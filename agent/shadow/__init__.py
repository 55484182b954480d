"""The shadow canary on the device: a candidate bundle in a bundle's shadow slot runs on
a sampled share of the live frames, at background priority on the runtime's pool, after
the live decision; it never acts. Each sampled frame is compared with the live decision
(:mod:`agent.shadow.compare`), written to the decision log's ``shadow_results`` table
(:mod:`agent.shadow.store`) and summed for the health report (:mod:`agent.shadow.stats`).

- :mod:`agent.shadow.config`: the ``[shadow]`` section.
- :mod:`agent.shadow.sampler`: which live frames are offered (share, frame-rate cap).
- :mod:`agent.shadow.runner`: one pipeline's shadow thread.

Nothing is imported here, so that :mod:`agent.config` can import the config module
without the runtime.
"""
