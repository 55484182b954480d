"""The wire contract: what the agent and the fleet server exchange. Both sides import it
and nothing else spells a topic or a schema; it imports nothing of the agent but the
shared kernel (:mod:`agent.kernel`).

- :mod:`agent.wire.topics`: every MQTT topic name (a device's own subtree).
- Device messages (:mod:`agent.wire.messages` gathers them): :mod:`~agent.wire.envelope`
  (what every message carries, its errors), :mod:`~agent.wire.reports` (state, heartbeat,
  health, telemetry), :mod:`~agent.wire.decisions` (decision uploads, thumbnails),
  :mod:`~agent.wire.events` (events, the install report), :mod:`~agent.wire.codec`
  (parse and encode within the size limits).
- The bundle manifest (:mod:`agent.wire.manifest`, its postprocess section
  :mod:`agent.wire.postprocess`), re-exported below.
- The fetch protocol for repository files over MQTT (:mod:`agent.wire.fetch`) and
  enrollment over HTTP (:mod:`agent.wire.enroll`).
- Reading what comes from outside: :mod:`agent.wire.untrusted` (bounded JSON),
  :mod:`agent.wire.compress` (gzip payloads), :mod:`agent.wire.jpeg` (thumbnail sizes);
  :mod:`agent.wire.base` is the base model that keeps unknown fields.
"""

from agent.wire.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    BundleManifest,
    ClassificationPost,
    DetectionPost,
    ModelVariant,
    Preprocess,
    ScorePost,
    TensorInfo,
    dump_manifest,
    load_manifest,
)

__all__ = [
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "BundleManifest",
    "ClassificationPost",
    "DetectionPost",
    "ModelVariant",
    "Preprocess",
    "ScorePost",
    "TensorInfo",
    "dump_manifest",
    "load_manifest",
]
