"""What the directives service needs of the running agent, declared here so that this
package never imports the agent that runs it (:class:`agent.app.Agent` implements it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol


class RunningAgent(Protocol):
    """The agent a directive is applied to: who it is, where it keeps its state, and its
    pipelines, which run a bundle on trial and are switched to what the installer now
    resolves."""

    @property
    def device_id(self) -> str:
        """The device id directives and reports are addressed with."""
        ...

    @property
    def state_dir(self) -> Path:
        """The agent's state directory (trust root, staging)."""
        ...

    def reload(self) -> None:
        """Load every pipeline again with the bundles the installer resolves now."""
        ...

    def reload_if_changed(self) -> bool:
        """Reload when a pipeline's bundles now resolve elsewhere; whether it did."""
        ...

    def bundle_health(self, bundle: str) -> Mapping[str, float]:
        """Health of ``bundle`` in the running pipelines: ``worker_crashes``,
        ``inference_errors``, ``p95_ms`` and ``inferences``.

        Raises:
            RuntimeError: no running pipeline uses the bundle.
        """
        ...
