"""GenICam cameras (GigE Vision by broadcast on every interface, USB3 Vision on the bus)
as Aravis finds them, for ``edge-agent cameras`` and ``setup --list-cameras``.

Discovery says vendor, model, serial number, interface and address; the user id
(``DeviceUserID``, the name an integrator gave the camera) is read by opening each camera
briefly. A camera another program controls (a running agent) can't be opened: it is
listed without its user id, with why.
"""

from __future__ import annotations

from typing import Any

from agent.capture.genicam import aravis


def listing(*, user_ids: bool = True) -> dict[str, Any]:
    """``{"cameras": [...], "error": ""}``; ``error`` says why none could be looked for
    (libaravis missing)."""
    try:
        found = aravis.devices()
    except aravis.AravisUnavailable as e:
        return {"cameras": [], "error": e.message}
    cameras = []
    for d in found:
        cam: dict[str, Any] = {
            "id": d.id,
            "vendor": d.vendor,
            "model": d.model,
            "serial": d.serial,
            "user_id": "",
            "interface": d.protocol,
            "address": d.address,
            "note": "",
        }
        if user_ids:
            cam["user_id"], cam["note"] = _user_id(d.id)
        cameras.append(cam)
    return {"cameras": cameras, "error": ""}


def _user_id(device_id: str) -> tuple[str, str]:
    try:
        camera = aravis.ArvCamera(device_id)
    except aravis.ArvError as e:
        return "", f"not opened: {e.message}"
    try:
        if not camera.feature_available("DeviceUserID"):
            return "", ""
        return camera.string("DeviceUserID"), ""
    except aravis.ArvError as e:
        return "", f"DeviceUserID not read: {e.message}"
    finally:
        camera.close()


def format_lines(found: dict[str, Any]) -> list[str]:
    """The GenICam part of the terminal report."""
    lines = ["GenICam cameras (Aravis: GigE Vision, USB3 Vision):"]
    if found["error"]:
        return [*lines, f"  ({found['error']})"]
    if not found["cameras"]:
        lines.append("  none found")
    for cam in found["cameras"]:
        user = f' "{cam["user_id"]}"' if cam["user_id"] else ""
        lines.append(
            f"  {cam['vendor']} {cam['model']} serial {cam['serial']}{user}  "
            f"[{cam['interface']} {cam['address']}]"
        )
        if cam["note"]:
            lines.append(f"    ({cam['note']})")
        lines.append(f"    choose: --camera genicam:{cam['serial'] or cam['id']}")
    return lines
