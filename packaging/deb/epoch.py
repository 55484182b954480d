"""The build's one time stamp: every file, the .deb and the image carry it, so that equal
inputs give equal outputs (packaging/deb/build.py and packaging/oci/build.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def source_date_epoch() -> int:
    """``SOURCE_DATE_EPOCH``, else the last commit's time, else now."""
    given = os.environ.get("SOURCE_DATE_EPOCH")
    if given:
        return int(given)
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%ct"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return int(done.stdout.strip())
    except (subprocess.SubprocessError, OSError, ValueError):
        return int(time.time())
