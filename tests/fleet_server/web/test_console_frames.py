"""A decision's boxes drawn over its image or on an empty frame (fleet_server/web/frames.py,
pure): scaling from frame pixels onto an image of another size, the frame size taken
from the outputs or the image, and the drawing without an image."""

from __future__ import annotations

import re

import pytest

from fleet_server.web.frames import (
    NO_FRAME_SIZE,
    NO_IMAGE,
    THUMB,
    Box,
    Picture,
    boxes_of,
    draw,
    fit,
    frame_of,
    scale_boxes,
)

OUTPUTS = {
    "boxes": [{"box": [320, 240, 640, 480], "score": 0.9, "label": "scratch"}],
    "crops": [{"box": [0, 0, 64, 48], "label": "ocr"}],
    "frame": {"width": 1280, "height": 960},
}
PICTURE = Picture("/api/v1/decisions/d-1/image", 320, 240)


def rects(svg: str) -> list[tuple[float, ...]]:
    """x, y, width, height of the box outlines (not the background)."""
    found = re.findall(
        r'<rect class="box[^"]*" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"',
        svg,
    )
    return [tuple(float(v) for v in r) for r in found]


def test_boxes_are_scaled_from_frame_pixels_to_the_image_as_shown() -> None:
    boxes = boxes_of(OUTPUTS)
    assert frame_of(OUTPUTS) == (1280, 960)
    scaled = scale_boxes(boxes, (1280, 960), (640, 480))
    assert [(b.x1, b.y1, b.x2, b.y2) for b in scaled] == [(160, 120, 320, 240), (0, 0, 32, 24)]
    assert [(b.label, b.crop) for b in scaled] == [("scratch", False), ("ocr", True)]
    svg = draw(boxes, image=PICTURE, frame=frame_of(OUTPUTS), label="decision d-1")
    # The 320 x 240 thumbnail is shown 640 x 480; the 1280 x 960 frame's boxes halve.
    assert '<img src="/api/v1/decisions/d-1/image" width="640" height="480"' in svg
    assert 'viewBox="0 0 640 480"' in svg
    assert rects(svg) == [(160, 120, 160, 120), (0, 0, 32, 24)]
    assert "scratch 0.90" in svg
    assert 'class="frame over"' in svg
    assert "frame-bg" not in svg  # the image shows through
    assert NO_FRAME_SIZE not in svg


def test_x_and_y_scale_apart_when_the_image_rounds_the_aspect() -> None:
    [box] = scale_boxes([Box(100, 100, 200, 200, "dent", None)], (1000, 500), (320, 161))
    assert (box.x1, box.x2) == pytest.approx((32, 64))
    assert (box.y1, box.y2) == pytest.approx((32.2, 64.4))


def test_the_list_thumbnail_is_small_lazy_and_without_text() -> None:
    svg = draw(boxes_of(OUTPUTS), image=PICTURE, frame=(1280, 960), within=THUMB, label="boxes")
    assert 'width="112" height="84" alt="" loading="lazy"' in svg
    assert rects(svg)[0] == (28, 21, 28, 21)
    assert "<text" not in svg
    assert 'aria-label="boxes: 2 boxes (scratch 0.90; ocr), on the uploaded image' in svg


def test_without_the_frame_size_the_image_size_stands_for_it_and_says_so() -> None:
    outputs = {"boxes": [{"box": [32, 24, 160, 120], "score": 0.5, "label": "dent"}]}
    assert frame_of(outputs) is None
    svg = draw(boxes_of(outputs), image=PICTURE, frame=frame_of(outputs))
    assert rects(svg) == [(64, 48, 256, 192)]  # image pixels, doubled to 640 x 480
    assert NO_FRAME_SIZE in svg


@pytest.mark.parametrize(
    "frame",
    [{"width": 0, "height": 480}, {"width": "640", "height": 480}, [640, 480], None],
)
def test_a_malformed_frame_size_counts_as_unknown(frame: object) -> None:
    assert frame_of({"frame": frame}) is None


def test_without_an_image_the_boxes_are_drawn_on_an_empty_frame_saying_so() -> None:
    svg = draw(boxes_of(OUTPUTS), frame=frame_of(OUTPUTS), label="decision d-1")
    assert "<img" not in svg
    assert 'class="frame"' in svg
    assert '<rect class="frame-bg" x="0" y="0" width="640" height="480"/>' in svg
    assert rects(svg)[0] == (160, 120, 160, 120)
    assert f">{NO_IMAGE}</text>" in svg
    assert f", {NO_IMAGE}" in svg  # in the aria-label and the title too
    # Without the frame's size the frame holds every box, at least 640 x 480.
    far = [Box(0, 0, 1280, 720, "wide", 0.7)]
    assert 'viewBox="0 0 640 360"' in draw(far)
    empty = draw([])
    assert f"{NO_IMAGE} · no boxes in the outputs" in empty
    small = draw(boxes_of(OUTPUTS), frame=(1280, 960), within=THUMB)
    assert 'viewBox="0 0 112 84"' in small
    assert f'font-size="10">{NO_IMAGE}</text>' in small  # the only text of a thumbnail
    assert small.count("<text") == 1


def test_fit_keeps_the_aspect_and_scales_up_or_down() -> None:
    assert fit((320, 240), (640, 480)) == (640, 480)
    assert fit((1920, 1080), (640, 480)) == (640, 360)
    assert fit((240, 320), (112, 84)) == (63, 84)


def test_a_label_or_url_is_escaped() -> None:
    boxes = [Box(1, 1, 5, 5, '<script>"x"</script>', 0.5)]
    svg = draw(boxes, image=Picture('/x"><script>', 32, 24), frame=(32, 24))
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg


def _label_ys(boxes: list[Box]) -> list[float]:
    svg = str(draw(boxes, image=Picture("/x.jpg", 640, 480), frame=(640, 480), within=(640, 480)))
    return [float(y) for y in re.findall(r'class="box-label" x="[\d.]+" y="([\d.]+)"', svg)]


def test_labels_of_boxes_at_one_place_do_not_print_over_each_other() -> None:
    same = [Box(100, 100, 300, 200, "scratch", 0.91), Box(101, 100, 299, 201, "dent", 0.62),
            Box(100, 101, 300, 200, "chip", 0.55)]  # fmt: skip
    ys = _label_ys(same)
    assert len(ys) == 3
    assert all(abs(a - b) >= 12 for i, a in enumerate(ys) for b in ys[i + 1 :]), ys
    apart = _label_ys([Box(10, 100, 60, 150, "a", 0.9), Box(400, 100, 460, 150, "b", 0.9)])
    assert apart[0] == apart[1]  # side by side: each at its own box
