"""The wire contract: what the agent and the fleet server exchange.

One module per kind of message; both sides import from here and nothing else spells a
topic or a schema. So far: the model bundle manifest (:mod:`agent.wire.manifest`).
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
