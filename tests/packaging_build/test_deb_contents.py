"""edgefleet-agent's .deb as dpkg-deb reads it: control fields, conffiles, maintainer
scripts, the user, links, shebangs and the venv run by this bookworm's /usr/bin/python3."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.packaging_build.conftest import ROOT, VERSION, Built, load_module

PREFIX = "opt/edgefleet/agent"
SITE = f"{PREFIX}/lib/python3.11/site-packages"
BOOKWORM_PYTHON = Path("/usr/bin/python3")


def test_control_names_the_package_its_version_arch_and_bookworm_python(
    agent_deb: Built,
) -> None:
    assert agent_deb.field("Package") == "edgefleet-agent"
    assert agent_deb.field("Version") == VERSION
    assert agent_deb.field("Architecture") == "amd64"
    depends = [d.strip() for d in agent_deb.field("Depends").split(",")]
    assert "python3 (>= 3.11~)" in depends
    assert "python3 (<< 3.12)" in depends
    assert "systemd | systemd-standalone-sysusers" in depends
    assert any(re.fullmatch(r"libc6 \(>= 2\.\d+\)", d) for d in depends), depends
    # the server's stack is not the agent's
    assert "mosquitto" not in depends
    assert int(agent_deb.field("Installed-Size")) > 50_000


def test_the_only_conffile_is_the_example_and_no_config_is_shipped(agent_deb: Built) -> None:
    conffiles = (agent_deb.control / "conffiles").read_text().split()
    assert conffiles == ["/etc/edgefleet/agent.toml.example"]
    assert (agent_deb.tree / "etc/edgefleet/agent.toml.example").read_bytes() == (
        ROOT / "packaging/etc/agent.toml.example"
    ).read_bytes()
    assert not (agent_deb.tree / "etc/edgefleet/agent.toml").exists()
    assert sorted(p.name for p in (agent_deb.tree / "etc/edgefleet").iterdir()) == [
        "agent.toml.example"
    ]


def test_commands_are_links_into_the_venv_with_its_shebang(agent_deb: Built) -> None:
    for command in ("edge-agent", "edge-runtime"):
        link = agent_deb.tree / "usr/bin" / command
        assert link.is_symlink()
        assert os.readlink(link) == f"/{PREFIX}/bin/{command}"
        script = agent_deb.tree / PREFIX / "bin" / command
        assert script.read_text().splitlines()[0] == f"#!/{PREFIX}/bin/python"
        assert script.stat().st_mode & 0o111
    assert not (agent_deb.tree / "usr/bin/fleet-server").exists()
    bindir = agent_deb.tree / PREFIX / "bin"
    assert os.readlink(bindir / "python3") == "/usr/bin/python3"
    assert os.readlink(bindir / "python") == "python3"
    cfg = (agent_deb.tree / PREFIX / "pyvenv.cfg").read_text()
    assert "home = /usr/bin\n" in cfg
    assert "include-system-site-packages = false\n" in cfg


def test_the_unit_and_the_user_are_in_the_package(agent_deb: Built) -> None:
    unit = agent_deb.tree / "lib/systemd/system/edgefleet-agent.service"
    assert unit.read_bytes() == (ROOT / "packaging/systemd/edgefleet-agent.service").read_bytes()
    sysusers = (agent_deb.tree / "usr/lib/sysusers.d/edgefleet-agent.conf").read_text()
    rows = [line.split() for line in sysusers.splitlines() if line and line[0] != "#"]
    assert rows[0][:3] == ["u", "edgefleet", "-"]
    assert ["m", "edgefleet", "video"] in rows


def test_systemd_sysusers_makes_the_user_from_the_shipped_file(
    agent_deb: Built, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\n")
    conf = agent_deb.tree / "usr/lib/sysusers.d/edgefleet-agent.conf"
    done = subprocess.run(
        ["systemd-sysusers", f"--root={root}", str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    passwd = (root / "etc/passwd").read_text()
    user = next(line.split(":") for line in passwd.splitlines() if line.startswith("edgefleet:"))
    assert int(user[2]) < 1000, "a system user"
    assert user[5] == "/var/lib/edgefleet/agent"
    video = next(line for line in (root / "etc/group").read_text().splitlines() if "video" in line)
    assert video.split(":")[3].split(",") == ["edgefleet"]


@pytest.mark.parametrize("name", ["postinst", "prerm", "postrm"])
def test_maintainer_scripts_are_posix_sh_with_every_value_filled(
    agent_deb: Built, name: str
) -> None:
    script = agent_deb.control / name
    assert script.stat().st_mode & 0o111
    text = script.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert not re.search(r"@[A-Z_]+@", text)
    done = subprocess.run(
        ["dash", "-n", str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "UNIT=edgefleet-agent.service" in text


def test_postinst_starts_the_service_only_when_configured(agent_deb: Built) -> None:
    text = (agent_deb.control / "postinst").read_text()
    assert 'systemd-sysusers ${DPKG_ROOT:+--root="$DPKG_ROOT"} edgefleet-agent.conf' in text
    assert "CONFIG=/etc/edgefleet/agent.toml\n" in text
    start = text.index('deb-systemd-invoke "$_action"')
    guard = text.rindex('if [ -e "$DPKG_ROOT$CONFIG" ]', 0, start)
    assert guard < start
    assert 'deb-systemd-helper enable "$UNIT"' in text


def test_purge_deletes_state_config_and_credentials_and_remove_keeps_them(
    agent_deb: Built,
) -> None:
    text = (agent_deb.control / "postrm").read_text()
    purge = text[text.index('if [ "$1" = "purge" ]') :]
    purge = purge[: purge.index("\nfi\n")]
    assert '"$DPKG_ROOT/var/lib/edgefleet/agent"' in purge
    assert '"$DPKG_ROOT/etc/edgefleet/credentials/agent"' in purge
    assert '"$DPKG_ROOT/etc/edgefleet/agent.toml"' in purge
    before_purge = text[: text.index('if [ "$1" = "purge" ]')]
    assert "/var/lib/edgefleet" not in before_purge


def test_md5sums_list_every_file_but_the_conffile(agent_deb: Built) -> None:
    listed = {}
    for line in (agent_deb.control / "md5sums").read_text().splitlines():
        digest, path = line.split("  ", 1)
        listed[path] = digest
    files = {
        p.relative_to(agent_deb.tree).as_posix()
        for p in agent_deb.tree.rglob("*")
        if p.is_file() and not p.is_symlink()
    }
    assert set(listed) == files - {"etc/edgefleet/agent.toml.example"}
    for path in ("usr/share/doc/edgefleet-agent/copyright", f"{PREFIX}/bin/edge-agent"):
        assert listed[path] == hashlib.md5((agent_deb.tree / path).read_bytes()).hexdigest()  # noqa: S324


def test_no_file_names_the_build_machine(agent_deb: Built) -> None:
    """Shebangs, RECORD files and the code objects in .pyc files name /opt/edgefleet/agent,
    never the directory the package was staged in."""
    needles = [str(ROOT).encode(), b"/tmp/edgefleet-", b".cache/packaging"]
    offenders = []
    for path in agent_deb.tree.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.suffix != ".so":
            data = path.read_bytes()
            offenders += [str(path) for n in needles if n in data]
    assert not offenders, offenders[:10]
    pyc = next((agent_deb.tree / SITE / "agent/__pycache__").glob("cli.cpython-311.pyc"))
    assert f"/{SITE}/agent/cli.py".encode() in pyc.read_bytes()


def test_first_party_code_is_the_agents_only(agent_deb: Built) -> None:
    site = agent_deb.tree / SITE
    for present in ("agent", "runtime", "firmware_profiles"):
        assert (site / present / "__init__.py").is_file()
    for absent in ("fleet_server", "hil", "fastapi", "uvicorn", "sqlalchemy", "psycopg"):
        assert not (site / absent).exists(), absent
    record = next(site.glob("edgefleet-*.dist-info/RECORD")).read_text()
    assert "fleet_server/" not in record


def _venv_python(agent_deb: Built, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with the unpacked venv's interpreter (a link to this machine's
    /usr/bin/python3, bookworm's 3.11), with no environment and outside the checkout."""
    python = agent_deb.tree / PREFIX / "bin/python"
    return subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=agent_deb.tree,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )


def test_the_venv_imports_the_runtime_stack_on_bookworms_python(agent_deb: Built) -> None:
    assert BOOKWORM_PYTHON.resolve().name == "python3.11", "this test needs bookworm's python3"
    code = (
        "import sys, importlib.metadata as m\n"
        "import numpy, cv2, onnxruntime\n"
        "from ai_edge_litert.interpreter import Interpreter\n"
        "import agent.cli, runtime.cli\n"
        "print(sys.prefix, m.version('edgefleet'), onnxruntime.get_available_providers()[-1])\n"
        "print(*sys.path, sep='\\n')\n"
    )
    done = _venv_python(agent_deb, code)
    assert done.returncode == 0, done.stderr[-3000:]
    first, *paths = done.stdout.splitlines()
    prefix, version, provider = first.split()
    assert prefix == str(agent_deb.tree / PREFIX)
    assert version == VERSION
    assert provider == "CPUExecutionProvider"
    assert not [p for p in paths if str(ROOT) in p], "the checkout leaked into sys.path"


@pytest.mark.parametrize("command", ["edge-agent", "edge-runtime"])
def test_the_commands_run_from_the_venv(agent_deb: Built, command: str) -> None:
    script = agent_deb.tree / PREFIX / "bin" / command
    code = (
        f"import runpy, sys; sys.argv = ['{command}', '--help']; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    done = _venv_python(agent_deb, code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout


def test_wheels_are_x86_64_and_link_only_what_depends_names(agent_deb: Built) -> None:
    """Every shared object is x86-64 (``file``), and every library one needs that the venv
    does not bundle comes from a package in Depends (as dpkg -S finds it here), but for
    LiteRT's NPU plugins, which link their vendor's SDK."""
    parts = load_module("parts")
    site = agent_deb.tree / SITE
    objects = [p for p in site.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    assert len(objects) > 20
    bundled = {p.name for p in objects}
    needed: set[str] = set()
    for obj in objects:
        kind = subprocess.run(
            ["file", "-b", str(obj)], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        assert "x86-64" in kind, f"{obj}: {kind}"
        dyn = subprocess.run(
            ["readelf", "-d", str(obj)], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        if not any(v in obj.as_posix() for v in parts.VENDOR_PLUGINS):
            needed |= set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn))
    external = sorted(n for n in needed if n not in bundled)
    depends = {d.split()[0] for d in agent_deb.field("Depends").replace("|", ",").split(",")}
    for soname in external:
        package = next(
            (pkg for prefix, pkg in parts.SYSTEM_LIBS.items() if soname.startswith(prefix)), None
        )
        assert package is not None, f"{soname} is needed, bundled by no wheel, not in SYSTEM_LIBS"
        assert package in depends, f"{soname} ({package}) is not in Depends"
        owner = subprocess.run(
            ["dpkg", "-S", f"*/{soname}"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
        assert re.search(rf"^{re.escape(package)}(:\w+)?: ", owner, re.M), f"{soname}: {owner}"


def test_the_servers_brokers_unit_is_shipped_stopped_with_it_and_never_enabled() -> None:
    """edgefleet-server also ships edgefleet-fleet-brokers.service: postinst never enables
    it (an operator does, on a broker host) and restarts it after an upgrade only (where
    deb-systemd-invoke finds it enabled); prerm stops it; postrm masks and purges it."""
    build, parts = load_module("build"), load_module("parts")
    server = parts.PARTS["server"]
    brokers = "edgefleet-fleet-brokers.service"
    assert server.other_units == (brokers,)
    assert (ROOT / "packaging/systemd" / brokers).is_file()
    scripts = {
        name: build.maintainer_script(name, server) for name in ("postinst", "prerm", "postrm")
    }
    for name, text in scripts.items():
        assert f'OTHER_UNITS="{brokers}"' in text, name
        done = subprocess.run(
            ["dash", "-n"], input=text, capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, (name, done.stderr)
    postinst = scripts["postinst"]
    assert 'deb-systemd-helper enable "$_unit"' not in postinst
    restart = postinst.index('deb-systemd-invoke restart "$_unit"')
    assert postinst.rindex('if [ -n "$2" ]; then', 0, restart) > postinst.index("daemon-reload")
    assert 'deb-systemd-invoke stop "$_unit"' in scripts["prerm"]
    assert 'deb-systemd-helper purge "$_unit"' in scripts["postrm"]
    agent = build.maintainer_script("prerm", parts.PARTS["agent"])
    assert 'OTHER_UNITS=""' in agent
