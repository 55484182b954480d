"""What decoding costs a gateway per camera: H.264 and H.265 at 720p and 1080p, decoded
the way the agent captures (OpenCV's FFmpeg backend), as CPU per frame and how many
cameras at a given frame rate fill the machine's cores.

A test pattern decodes almost for free, so the clips are camera-like: a textured scene
with moving parts and per-frame sensor noise (the noise is what real cameras add and
what makes real video expensive), encoded the way IP cameras stream (constant bitrate,
no B-frames, a key frame every 2 s) at their usual bitrates. The clips are made once
with ffmpeg (libx264, libx265) and cached.

Each clip is decoded ``--rounds`` times; the figures are the median round's:

- ``decode_ms_p50``: wall time of one ``read()`` (decode and colour conversion);
- ``decode_cpu_per_frame_ms``: the process's CPU time (every decoder thread) per frame;
- ``cameras_full_at_<fps>fps``: ``cores x 1000 / (cpu_per_frame_ms x fps)``, the cameras
  whose decoding alone takes every core;
- ``cpu_ms_per_video_s``: CPU per second of video, every frame decoded;
- ``keyframes_cpu_ms_per_video_s``: the same with ffmpeg decoding only the key frames
  (``-skip_frame nokey``, one frame per 2 s here), for comparison: the agent's OpenCV
  capture can't skip frames before decoding (OpenCV does not pass decoder options), so
  a camera that needs fewer frames should stream them (a detect sub-stream).

``--source PATH_OR_URL`` measures one given stream instead (a file or ``rtsp://``).

``hil bench decode --json PATH`` (or ``python -m hil.bench.decode``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from agent import decodecost
from hil.errors import HilError

FPS = 15
SECONDS = 8
GOP_S = 2
CLIPS: dict[str, tuple[int, int, str, int]] = {
    # name: (width, height, codec, bitrate in kbit/s) -- IP cameras' usual defaults
    "720p-h264": (1280, 720, "h264", 2048),
    "1080p-h264": (1920, 1080, "h264", 4096),
    "720p-h265": (1280, 720, "h265", 1024),
    "1080p-h265": (1920, 1080, "h265", 2048),
}
ENCODE_TIMEOUT_S = 300.0
KEY_LOOPS = 8
"""The key-frame-only decode reads the clip this many times (ffmpeg's start, about
0.1 s, spread over 64 s of video)."""
MAX_FRAMES = 2_000
"""Bound on the frames one round of a file reads."""
LIVE_FRAMES = 150
"""Frames one round of a live source (a URL) reads by default (``--frames``): 10 s at
15 fps. Its ``decode_ms_p50`` includes the wait for each frame; its CPU figures don't."""
ROUND_MAX_S = 600.0
"""Bound on the seconds one round reads."""


class DecodeBenchError(HilError):
    """The decode bench can't make a clip or read a source.

    Attributes:
        what: the clip or source.
        reason: what went wrong.
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


@dataclass(frozen=True)
class Row:
    """The figures of one clip or source."""

    clip: str
    width: int
    height: int
    codec: str
    bitrate_kbps: int | None
    frames: int
    decode_ms_p50: float
    decode_ms_p99: float
    decode_cpu_per_frame_ms: float
    cameras_full_at_15fps: float
    cameras_full_at_5fps: float
    cpu_ms_per_video_s: float
    keyframes_cpu_ms_per_video_s: float | None


# -- clips ------------------------------------------------------------------------------


def _scene(width: int, height: int, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """A static, textured background: low-frequency shading plus fine texture."""
    small = rng.integers(40, 200, (height // 40 + 1, width // 40 + 1, 3), dtype=np.uint8)
    base = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
    noise = rng.normal(0, 12, (height, width)).astype(np.float32)
    texture = cv2.GaussianBlur(noise, (3, 3), 0)[..., None]
    out: npt.NDArray[np.uint8] = np.clip(base.astype(np.float32) + texture, 0, 255).astype(np.uint8)
    return out


def _frames(width: int, height: int, count: int) -> Any:
    """Camera-like frames: the scene, parts moving across it, sensor noise per frame."""
    rng = np.random.default_rng(7)
    scene = _scene(width, height, rng)
    part_w, part_h = width // 5, height // 6
    part = _scene(part_w, part_h, rng)
    speed = max(1, width // (FPS * 3))  # a part crosses the view in 3 s
    for i in range(count):
        img = scene.copy()
        for k, y in enumerate((height // 4, height // 2 + height // 8)):
            x = (i * speed + k * width // 2) % (width + part_w) - part_w
            xa, xb = max(0, x), min(width, x + part_w)
            if xb > xa:
                img[y : y + part_h, xa:xb] = part[:, xa - x : xb - x]
        noise = rng.normal(0, 2.5, img.shape).astype(np.int16)
        yield np.clip(img.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def make_clip(path: Path, width: int, height: int, codec: str, kbps: int) -> None:
    """Encode :data:`SECONDS` of camera-like video into ``path`` (MP4) with ffmpeg.

    Raises:
        DecodeBenchError: ffmpeg is missing or fails.
    """
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise DecodeBenchError(path.name, "ffmpeg is not installed (make sysdeps)")
    rate = f"{kbps}k"
    enc = (
        ["-c:v", "libx264", "-preset", "veryfast", "-bf", "0", "-g", str(FPS * GOP_S)]
        if codec == "h264"
        else ["-c:v", "libx265", "-preset", "veryfast", "-tag:v", "hvc1",
              "-x265-params", f"bframes=0:keyint={FPS * GOP_S}:log-level=error"]
    )  # fmt: skip
    tmp = path.with_suffix(".tmp.mp4")
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        ffmpeg, "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "bgr24",
        "-s", f"{width}x{height}", "-r", str(FPS), "-i", "-", *enc,
        "-b:v", rate, "-maxrate", rate, "-bufsize", rate, "-pix_fmt", "yuv420p", str(tmp),
    ]  # fmt: skip
    log = path.with_suffix(".log")
    with log.open("wb") as errors:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=errors)
        assert proc.stdin is not None
        try:
            for frame in _frames(width, height, FPS * SECONDS):
                proc.stdin.write(frame.tobytes())
            proc.stdin.close()
            proc.wait(timeout=ENCODE_TIMEOUT_S)
        except (BrokenPipeError, subprocess.TimeoutExpired) as exc:
            proc.kill()
            proc.wait()
            raise DecodeBenchError(path.name, f"ffmpeg failed: {exc}") from exc
    if proc.returncode != 0:
        why = log.read_text(errors="replace")[-300:]
        raise DecodeBenchError(path.name, f"ffmpeg exit {proc.returncode}: {why}")
    tmp.replace(path)


# -- decoding ---------------------------------------------------------------------------


def decode_round(source: str, max_frames: int = MAX_FRAMES) -> tuple[int, list[float], float]:
    """Read ``source`` with OpenCV's FFmpeg backend as the agent does: frames read, each
    read's wall ms, and the CPU seconds they took (:mod:`agent.decodecost`).

    Raises:
        DecodeBenchError: the source does not open or gives no frame.
    """
    cap = cv2.VideoCapture(source, cv2.CAP_FFMPEG)
    if not cap.isOpened():
        raise DecodeBenchError(source, "does not open")

    def read() -> Any:
        ok, frame = cap.read()
        return frame if ok else None

    try:
        r = decodecost.decode_round(read, max_frames=max_frames, max_s=ROUND_MAX_S)
    finally:
        cap.release()
    if not r.frames:
        raise DecodeBenchError(source, "gave no frame")
    return r.frames, r.walls_ms, r.cpu_total_s


def keyframes_cpu_ms(path: Path) -> float | None:
    """ffmpeg (one thread) decoding only the key frames of ``path``: CPU ms per second of
    video (None when ffmpeg is missing or fails)."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        return None
    cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    fps = cap.get(cv2.CAP_PROP_FPS) or FPS
    frames = cap.get(cv2.CAP_PROP_FRAME_COUNT)
    cap.release()
    if frames <= 0:
        return None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [ffmpeg, "-v", "error", "-threads", "1", "-skip_frame", "nokey",
         "-stream_loop", str(KEY_LOOPS - 1), "-i", str(path),
         "-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "bgr24", "-y", os.devnull],
        capture_output=True, timeout=ENCODE_TIMEOUT_S, check=False,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        return None
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return round(cpu * 1000 / (KEY_LOOPS * frames / fps), 2)


def measure(
    source: str,
    name: str,
    rounds: int,
    spec: tuple[int, int, str, int] | None,
    max_frames: int = MAX_FRAMES,
) -> Row:
    """The figures of ``source`` over ``rounds`` rounds (the median round's CPU).

    Raises:
        DecodeBenchError: as :func:`decode_round`.
    """
    results = [decode_round(source, max_frames) for _ in range(max(1, rounds))]
    per_frame = sorted(cpu * 1000 / n for n, _w, cpu in results)
    cpu_ms = statistics.median(per_frame)
    walls = sorted(w for _n, ws, _c in results for w in ws)
    cores = os.cpu_count() or 1
    cap = cv2.VideoCapture(source, cv2.CAP_FFMPEG)
    width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
    height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    fourcc = int(cap.get(cv2.CAP_PROP_FOURCC))
    cap.release()
    codec = spec[2] if spec else fourcc.to_bytes(4, "little").decode("ascii", "replace")
    path = Path(source)
    return Row(
        clip=name,
        width=width,
        height=height,
        codec=codec,
        bitrate_kbps=spec[3] if spec else None,
        frames=results[0][0],
        decode_ms_p50=round(statistics.median(walls), 3),
        decode_ms_p99=round(decodecost.percentile(walls, 0.99), 3),
        decode_cpu_per_frame_ms=round(cpu_ms, 3),
        cameras_full_at_15fps=decodecost.cameras_full(cpu_ms, 15, cores),
        cameras_full_at_5fps=decodecost.cameras_full(cpu_ms, 5, cores),
        cpu_ms_per_video_s=round(cpu_ms * FPS, 1),
        keyframes_cpu_ms_per_video_s=keyframes_cpu_ms(path) if path.is_file() else None,
    )


def run(
    clips: list[str], cache: Path, rounds: int, source: str | None, frames: int = LIVE_FRAMES
) -> dict[str, Any]:
    """The bench's figures (see the module docstring).

    Raises:
        DecodeBenchError: a clip can't be made or a source read.
    """
    rows: list[Row] = []
    if source is not None:
        live = "://" in source  # a camera sends at its own rate and never ends
        rows.append(measure(source, "source", rounds, None, frames if live else MAX_FRAMES))
    else:
        for name in clips:
            spec = CLIPS[name]
            path = cache / f"{name}-{spec[3]}k.mp4"
            if not path.exists():
                print(f"bench: encoding {path.name}", file=sys.stderr)
                make_clip(path, *spec)
            rows.append(measure(str(path), name, rounds, spec))
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "cores": os.cpu_count(),
        "opencv": cv2.__version__,
        "rows": [asdict(r) for r in rows],
    }


def render(figures: dict[str, Any]) -> str:
    head = ("clip", "codec", "kbit/s", "decode ms p50", "CPU ms/frame", "cams@15fps",
            "cams@5fps", "CPU ms/s", "key frames only CPU ms/s")  # fmt: skip
    keys = ("clip", "codec", "bitrate_kbps", "decode_ms_p50", "decode_cpu_per_frame_ms",
            "cameras_full_at_15fps", "cameras_full_at_5fps", "cpu_ms_per_video_s",
            "keyframes_cpu_ms_per_video_s")  # fmt: skip
    lines = [" | ".join(head)]
    lines += [" | ".join(str(r[k]) for k in keys) for r in figures["rows"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hil bench decode",
        description="Decode cost per camera stream: CPU per frame and cameras per gateway.",
        epilog="examples: hil bench decode --json .cache/bench-decode.json\n"
        "          hil bench decode --source rtsp://127.0.0.1:8554/cam --rounds 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clips", nargs="+", choices=list(CLIPS), default=list(CLIPS),
                        help="which clips (default all)")  # fmt: skip
    parser.add_argument("--source", help="measure this file or URL instead of the clips")
    parser.add_argument("--rounds", type=int, default=3, help="decodes of each clip")
    parser.add_argument(
        "--frames", type=int, default=LIVE_FRAMES, help="frames read per round from a URL"
    )
    parser.add_argument("--cache", default=".cache/bench-decode", help="where clips are kept")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    try:
        figures = run(args.clips, Path(args.cache), args.rounds, args.source, args.frames)
    except DecodeBenchError as exc:
        print(f"hil bench decode: {exc}", file=sys.stderr)
        return 1
    print(render(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
