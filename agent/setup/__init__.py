"""``edge-agent setup``: a fresh install made a configured device (profile, cameras,
config, enrollment, the service's resource drop-in). See :mod:`agent.setup.device`."""
