"""The V4L2 camera listing: the ioctl numbers and struct layouts against the kernel's own
``<linux/videodev2.h>`` (compiled with the system's C compiler: the bytes a real driver
fills in are what the parser reads), the sysfs walk on a tree made for the test, and the
real ioctl path on device nodes that are not cameras (no /dev/video* on the test machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from agent.setup import cameras
from agent.setup.cameras import (
    Camera,
    CameraProbeError,
    FrameSize,
    PixelFormat,
    choose_size,
    format_cameras,
    list_cameras,
    parse_capability,
    parse_fmtdesc,
    parse_frmsizeenum,
    probe,
)

BIN = Path(sys.executable).parent

_C = r"""
#include <stdio.h>
#include <stddef.h>
#include <string.h>
#include <linux/videodev2.h>

static void hex(const char *name, const void *p, size_t n) {
    const unsigned char *b = p;
    printf("\"%s\": \"", name);
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
    printf("\",\n");
}

int main(void) {
    struct v4l2_capability cap;
    memset(&cap, 0, sizeof cap);
    strcpy((char *)cap.driver, "uvcvideo");
    strcpy((char *)cap.card, "USB Camera: HD");
    strcpy((char *)cap.bus_info, "usb-0000:00:14.0-1");
    cap.version = 0x060100;
    cap.capabilities = V4L2_CAP_VIDEO_CAPTURE | V4L2_CAP_STREAMING | V4L2_CAP_DEVICE_CAPS;
    cap.device_caps = V4L2_CAP_META_CAPTURE | V4L2_CAP_STREAMING;

    struct v4l2_fmtdesc fmt;
    memset(&fmt, 0, sizeof fmt);
    fmt.index = 1;
    fmt.type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
    fmt.flags = V4L2_FMT_FLAG_COMPRESSED;
    strcpy((char *)fmt.description, "Motion-JPEG");
    fmt.pixelformat = V4L2_PIX_FMT_MJPEG;

    struct v4l2_frmsizeenum disc;
    memset(&disc, 0, sizeof disc);
    disc.pixel_format = V4L2_PIX_FMT_YUYV;
    disc.type = V4L2_FRMSIZE_TYPE_DISCRETE;
    disc.discrete.width = 1280;
    disc.discrete.height = 720;

    struct v4l2_frmsizeenum step;
    memset(&step, 0, sizeof step);
    step.pixel_format = V4L2_PIX_FMT_YUYV;
    step.type = V4L2_FRMSIZE_TYPE_STEPWISE;
    step.stepwise.min_width = 16;
    step.stepwise.max_width = 1920;
    step.stepwise.step_width = 8;
    step.stepwise.min_height = 16;
    step.stepwise.max_height = 1080;
    step.stepwise.step_height = 4;

    printf("{\n");
    printf("\"VIDIOC_QUERYCAP\": %lu,\n", (unsigned long)VIDIOC_QUERYCAP);
    printf("\"VIDIOC_ENUM_FMT\": %lu,\n", (unsigned long)VIDIOC_ENUM_FMT);
    printf("\"VIDIOC_ENUM_FRAMESIZES\": %lu,\n", (unsigned long)VIDIOC_ENUM_FRAMESIZES);
    printf("\"sizeof_capability\": %zu,\n", sizeof cap);
    printf("\"sizeof_fmtdesc\": %zu,\n", sizeof fmt);
    printf("\"sizeof_frmsizeenum\": %zu,\n", sizeof disc);
    printf("\"YUYV\": %u,\n", V4L2_PIX_FMT_YUYV);
    hex("capability", &cap, sizeof cap);
    hex("fmtdesc", &fmt, sizeof fmt);
    hex("discrete", &disc, sizeof disc);
    hex("stepwise", &step, sizeof step);
    printf("\"end\": 0\n}\n");
    return 0;
}
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """What the kernel header says, compiled and run on this machine."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed (make sysdeps installs gcc and linux-libc-dev)"
    work = tmp_path_factory.mktemp("v4l2")
    (work / "layout.c").write_text(_C)
    subprocess.run([cc, "-o", str(work / "layout"), str(work / "layout.c")], check=True)
    out = subprocess.run([str(work / "layout")], capture_output=True, text=True, check=True)
    data: dict[str, object] = json.loads(out.stdout)
    return data


def test_ioctl_numbers_and_struct_sizes_are_the_kernel_headers(kernel: dict[str, object]) -> None:
    assert kernel["VIDIOC_QUERYCAP"] == cameras.VIDIOC_QUERYCAP
    assert kernel["VIDIOC_ENUM_FMT"] == cameras.VIDIOC_ENUM_FMT
    assert kernel["VIDIOC_ENUM_FRAMESIZES"] == cameras.VIDIOC_ENUM_FRAMESIZES
    assert cameras.CAPABILITY.size == kernel["sizeof_capability"] == 104
    assert cameras.FMTDESC.size == kernel["sizeof_fmtdesc"] == 64
    assert cameras.FRMSIZEENUM.size == kernel["sizeof_frmsizeenum"] == 44


def test_structs_filled_by_c_parse_to_their_fields(kernel: dict[str, object]) -> None:
    cap = parse_capability(bytes.fromhex(str(kernel["capability"])))
    assert (cap.driver, cap.card) == ("uvcvideo", "USB Camera: HD")
    assert cap.bus_info == "usb-0000:00:14.0-1"
    assert cap.version == 0x060100
    # The node's own caps (device_caps) win: a UVC metadata node captures no video.
    assert cap.buffer_type is None
    assert parse_fmtdesc(bytes.fromhex(str(kernel["fmtdesc"]))) == ("MJPG", "Motion-JPEG", True)
    assert parse_frmsizeenum(bytes.fromhex(str(kernel["discrete"]))) == FrameSize(
        "discrete", 1280, 720
    )
    step = parse_frmsizeenum(bytes.fromhex(str(kernel["stepwise"])))
    assert step == FrameSize("stepwise", 16, 16, 1920, 1080, 8, 4)
    assert cameras.fourcc(int(str(kernel["YUYV"]))) == "YUYV"


def test_requests_pack_the_index_and_type_where_the_kernel_reads_them() -> None:
    raw = cameras.pack_fmtdesc(3, cameras.BUF_TYPE_VIDEO_CAPTURE_MPLANE)
    assert raw[:8] == (3).to_bytes(4, sys.byteorder) + (9).to_bytes(4, sys.byteorder)
    assert len(raw) == 64
    raw = cameras.pack_frmsizeenum(2, 0x56595559)
    assert raw[:8] == (2).to_bytes(4, sys.byteorder) + (0x56595559).to_bytes(4, sys.byteorder)
    assert raw[8:] == bytes(36)


def _sysfs(root: Path, entries: dict[str, str]) -> Path:
    """A sysfs tree with video4linux entries ``name -> device name``."""
    cls = root / "sys" / "class" / "video4linux"
    cls.mkdir(parents=True)
    for entry, name in entries.items():
        (cls / entry).mkdir()
        (cls / entry / "name").write_text(name + "\n")
        (cls / entry / "uevent").write_text(f"MAJOR=81\nMINOR=0\nDEVNAME={entry}\n")
    return root / "sys"


def test_no_video4linux_class_is_no_cameras(tmp_path: Path) -> None:
    assert list_cameras(tmp_path / "sys", tmp_path / "dev") == []
    assert format_cameras([]).startswith("no cameras found")


def test_the_machines_own_sysfs_lists_without_error() -> None:
    found = list_cameras()
    assert all(isinstance(c, Camera) for c in found)
    assert [c for c in found if c.capture and c.error] == []


def test_listed_nodes_that_are_not_cameras_carry_the_kernels_answer(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path, {"video0": "Not a camera", "video1": "Unplugged", "video10": "X"})
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "video0").symlink_to("/dev/null")  # a real character device: real ioctl, ENOTTY
    (dev / "video10").symlink_to("/dev/zero")
    found = list_cameras(sysfs, dev)
    assert [c.device for c in found] == [str(dev / n) for n in ("video0", "video1", "video10")]
    assert [c.name for c in found] == ["Not a camera", "Unplugged", "X"]
    assert "not a V4L2 device" in found[0].error
    assert "cannot open" in found[1].error
    assert not any(c.capture for c in found)


def test_list_cameras_command_says_no_cameras_found(tmp_path: Path) -> None:
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [
                str(BIN / "edge-agent"),
                "setup",
                "--list-cameras",
                "--no-discover",
                "--sysfs-root",
                str(tmp_path),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        if extra:
            assert json.loads(done.stdout) == {"v4l2": [], "onvif": [], "probe": None}
        else:
            assert done.stdout.strip().startswith("no cameras found"), done.stdout


def test_probe_of_a_character_device_that_is_not_v4l2_is_refused() -> None:
    with pytest.raises(CameraProbeError, match="not a V4L2 device"):
        probe(Path("/dev/null"))


def _cam(*sizes: FrameSize) -> Camera:
    fmt = PixelFormat("YUYV", "", False, sizes)
    return Camera("/dev/video0", "cam", capture=True, formats=(fmt,))


@pytest.mark.parametrize(
    ("sizes", "wanted"),
    [
        ((), (640, 480)),
        ((FrameSize("discrete", 1280, 720), FrameSize("discrete", 640, 480)), (640, 480)),
        ((FrameSize("discrete", 1920, 1080), FrameSize("discrete", 800, 600)), (800, 600)),
        ((FrameSize("discrete", 320, 240), FrameSize("discrete", 160, 120)), (320, 240)),
        ((FrameSize("stepwise", 16, 16, 1920, 1080, 8, 8),), (640, 480)),
        ((FrameSize("stepwise", 16, 16, 1920, 1080, 7, 7),), (640, 480)),
    ],
)
def test_the_frame_size_asked_for(sizes: tuple[FrameSize, ...], wanted: tuple[int, int]) -> None:
    choice = choose_size(_cam(*sizes))
    assert (choice.width, choice.height) == wanted


def test_list_cameras_on_a_network_without_a_route_lists_the_local_ones_and_says_why(
    tmp_path: Path,
) -> None:
    """A network namespace with only ``lo`` up and no route at all: the WS-Discovery probe
    can't leave. The local cameras are listed, and the report says discovery was skipped
    and why; exit 0."""
    sysfs = _sysfs(tmp_path, {"video0": "Line camera"})
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "video0").symlink_to("/dev/null")
    ns = f"edf-noroute-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, timeout=10)
        base = [
            "ip", "netns", "exec", ns, str(BIN / "edge-agent"), "setup", "--list-cameras",
            "--sysfs-root", str(sysfs), "--dev-dir", str(dev), "--discover-timeout", "1",
        ]  # fmt: skip
        text = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
        listed = subprocess.run(
            [*base, "--json"], capture_output=True, text=True, timeout=60, check=False
        )
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=10)
    assert text.returncode == 0, text.stderr
    assert f"{dev / 'video0'}  Line camera" in text.stdout
    assert "ONVIF cameras: not probed (discovery skipped, no probe could be sent: " in text.stdout
    assert "Network is unreachable" in text.stdout
    assert "camera discovery skipped" in text.stderr
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert [c["name"] for c in report["v4l2"]] == ["Line camera"]
    assert (report["onvif"], report["probe"]) == ([], None)
    assert report["skipped"].startswith("no probe could be sent: ")
