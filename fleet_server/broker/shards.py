"""Which broker shard a device is given at enrollment: a pure function of its id, its
labels and the configured shards.

A device whose label ``[broker] shard_label`` (``site``) has a value listed in a shard's
``sites`` goes to that shard (a site's cameras share a broker near them). Any other
device is spread by a hash of its id over all shards, ``main`` included: SHA-256, not
Python's ``hash`` (salted per process), so every replica and every restart gives the
same answer. The shard is stored with the device (``devices.shard``) and sent in its
enrollment; devices enrolled before shards existed (NULL) are on ``main``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

MAIN = "main"


def assign_shard(
    device_id: str,
    labels: Mapping[str, str],
    shard_sites: Sequence[tuple[str, Sequence[str]]],
    label: str = "site",
) -> str:
    """The shard of ``device_id``.

    Args:
        device_id: the device.
        labels: its labels (the fleet's, from its enrollment token).
        shard_sites: each extra shard's name and sites, in configuration order (``main``
            is implied and first).
        label: the label whose value is matched against the sites.
    """
    site = labels.get(label)
    if site is not None:
        for name, sites in shard_sites:
            if site in sites:
                return name
    names = [MAIN, *(name for name, _ in shard_sites)]
    if len(names) == 1:
        return MAIN
    digest = hashlib.sha256(b"edgefleet shard v1\n" + device_id.encode("utf-8")).digest()
    return names[int.from_bytes(digest[:8], "big") % len(names)]
