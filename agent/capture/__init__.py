"""Capture: cameras (V4L2, RTSP, HTTP/MJPEG, files, image directories, test patterns)
read in their own threads, each handing over only its newest frame.

    camera = Camera(CameraConfig(name="cam1", kind="synthetic", fps=15))
    camera.start()
    frame = camera.latest(timeout_s=1.0)   # Frame or None
    camera.stop()
"""

from agent.capture.camera import Camera, CameraStats
from agent.capture.config import CameraConfig
from agent.capture.frame import Frame
from agent.capture.sources import EndOfStream, Source, open_source

__all__ = [
    "Camera",
    "CameraConfig",
    "CameraStats",
    "EndOfStream",
    "Frame",
    "Source",
    "open_source",
]
