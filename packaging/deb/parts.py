"""What differs between the two Debian packages: edgefleet-agent and edgefleet-server.

Data only (no I/O): the builder (build.py), the lock step (lock.py) and the tests read it.
"""

from __future__ import annotations

from dataclasses import dataclass

PYTHON_VERSION = "3.11"
"""Debian bookworm's /usr/bin/python3: the venvs are built for it and only for it."""
PYTHON_DEPENDS = ("python3 (>= 3.11~)", "python3 (<< 3.12)")
ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}
"""Debian architecture -> the machine name in wheel platform tags and ``file``'s output."""
GLIBC_MINOR = 36
"""bookworm's glibc is 2.36: wheels tagged manylinux_2_17 ... manylinux_2_36 run on it."""

SYSTEM_LIBS = {
    # soname prefix -> the Debian package that ships it (checked by the tests against
    # every DT_NEEDED of every ELF file in the staged venv that the venv does not bundle)
    "libc.so": "libc6",
    "libm.so": "libc6",
    "libdl.so": "libc6",
    "libpthread.so": "libc6",
    "librt.so": "libc6",
    "ld-linux": "libc6",
    "libstdc++.so": "libstdc++6",
    "libgcc_s.so": "libgcc-s1",
    "libz.so": "zlib1g",
}
"""Shared libraries the wheels take from the system (manylinux policy lets them)."""
VENDOR_PLUGINS = ("ai_edge_litert/vendors/",)
"""Shared objects under these site-packages paths are NPU plugins (Qualcomm QNN, Intel
OpenVINO, ...) that LiteRT loads only where the vendor's SDK is installed; the libraries
they link are the SDK's, in no Debian package, so they are not dependencies."""


@dataclass(frozen=True)
class Part:
    """One package: its name, commands, first-party code, user and Debian dependencies."""

    name: str
    package: str
    summary: str
    description: str
    commands: dict[str, str]
    """console command -> ``module:function``"""
    roots: tuple[str, ...]
    """first-party packages whose every module is the part's (the import scan's start)"""
    user: str
    groups: tuple[str, ...]
    unit: str
    config: str
    depends: tuple[str, ...]
    recommends: tuple[str, ...] = ()
    suggests: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    """distributions (``name[extras]``) loaded by name rather than by an import statement"""
    other_units: tuple[str, ...] = ()
    """units shipped but not enabled (an operator enables them where they belong); stopped
    on remove and upgrade, started again after an upgrade where enabled"""

    @property
    def prefix(self) -> str:
        """Where the venv lives on the target."""
        return f"/opt/edgefleet/{self.name}"

    @property
    def state_dir(self) -> str:
        return f"/var/lib/edgefleet/{self.name}"

    @property
    def credentials_dir(self) -> str:
        return f"/etc/edgefleet/credentials/{self.name}"

    @property
    def example(self) -> str:
        """The commented example config shipped as a conffile (from packaging/etc/)."""
        return f"{self.config}.example"

    @property
    def requirements(self) -> str:
        """The pinned requirements file (packaging/deb/), written by ``build.py --lock``."""
        return f"requirements-{self.name}.txt"


SYSUSERS = "systemd | systemd-standalone-sysusers"
"""postinst makes the user with systemd-sysusers: systemd's, or the standalone one where
systemd is not installed (an OCI image)."""

PARTS = {
    "agent": Part(
        name="agent",
        package="edgefleet-agent",
        summary="edgefleet agent: edge AI runtime with decisions and a fleet uplink",
        description=(
            "Runs ONNX and TFLite models on pinned cores against cameras and sensors,\n"
            "decides (pass, reject, review), drives local actions, keeps a decision log\n"
            "in SQLite (also offline) and reports to an edgefleet fleet server, which\n"
            "rolls out signed model bundles. Commands: edge-agent, edge-runtime.\n"
            "Carries its own Python virtualenv in /opt/edgefleet/agent."
        ),
        commands={"edge-agent": "agent.cli:main", "edge-runtime": "runtime.cli:main"},
        roots=("agent", "runtime", "firmware_profiles"),
        user="edgefleet",
        groups=("video",),
        unit="edgefleet-agent.service",
        config="agent.toml",
        depends=(SYSUSERS,),
        # a local broker for actions and sensors; not needed where [mqtt] names another host
        recommends=("mosquitto",),
        # ffmpeg: the vaapi decoder and keyframes_only; gstreamer1.0-tools: the gstreamer one;
        # libaravis-0.8-0: genicam cameras (docs/adr/0025-genicam-through-aravis.md)
        suggests=(
            "mosquitto-clients",
            "v4l-utils",
            "sqlite3",
            "ffmpeg",
            "gstreamer1.0-tools",
            "libaravis-0.8-0",
        ),
    ),
    "server": Part(
        name="server",
        package="edgefleet-server",
        summary="edgefleet fleet server: enrollment, signed bundles, rollouts, ingest",
        description=(
            "Enrolls edgefleet devices under a fleet CA, signs model bundles (TUF),\n"
            "rolls them out wave by wave over MQTT with health and quality gates, and\n"
            "gathers telemetry and decision logs; HTTP API and web console. Runs its own\n"
            "Mosquitto broker. Commands: fleet-server, fleetctl.\n"
            "Carries its own Python virtualenv in /opt/edgefleet/server."
        ),
        commands={
            "fleet-server": "fleet_server.cli.server:main",
            "fleetctl": "fleet_server.cli.fleetctl:main",
        },
        roots=("fleet_server",),
        user="edgefleet-server",
        groups=(),
        unit="edgefleet-fleet-server.service",
        # the Mosquitto shards on a broker host: `fleet-server brokers`
        other_units=("edgefleet-fleet-brokers.service",),
        config="fleet.toml",
        depends=(SYSUSERS, "mosquitto"),
        # SQLAlchemy loads the PostgreSQL driver by the URL's name (postgresql+psycopg)
        also=("psycopg[binary]",),
        # PostgreSQL is the storage past one replica; SQLite (in the venv) is the default
        suggests=("postgresql", "mosquitto-clients"),
    ),
}
