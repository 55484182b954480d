"""The console in a real browser: Playwright drives Debian's headless Chromium
(``/usr/bin/chromium``, never a downloaded one) against ``fleet-server serve`` (its
managed Mosquitto, ingest and rollout service) with seeded data, users of each role made
with ``fleetctl users add`` and four light agents that answer directives.

Each page is saved as a screenshot under ``.cache/screenshots/console/`` (the test
artifacts); the decision review's are also saved at 1200 x 760 under ``docs/`` there,
the size of the few committed under docs/screenshots/.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from fleet_server.db import open_database, store
from tests.fleet_server.fleet_api_support import OPERATOR_TOKEN, http
from tests.fleet_server.web.console_seed import FEATURED, HOT
from tests.fleet_server.web.console_server import (
    PASSWORD,
    ROLLOUT_DEVICES,
    USERS,
    RunningConsole,
    running_console,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
SHOTS = Path(__file__).resolve().parents[3] / ".cache" / "screenshots" / "console"
VIEWPORT = {"width": 1280, "height": 860}
DOCS_VIEWPORT = {"width": 1200, "height": 760}
WAIT_MS = 30_000

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningConsole]:
    with running_console(tmp_path_factory.mktemp("console")) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: make sysdeps installs it"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(WAIT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def shot(page: Page, name: str, *, full: bool = True) -> None:
    page.screenshot(path=SHOTS / f"{name}.png", full_page=full)


def docs_shot(page: Page, name: str) -> None:
    """The page's top at :data:`DOCS_VIEWPORT`, as docs/screenshots/ holds them."""
    (SHOTS / "docs").mkdir(exist_ok=True)
    page.set_viewport_size(DOCS_VIEWPORT)  # type: ignore[arg-type]
    try:
        page.screenshot(path=SHOTS / "docs" / f"{name}.png")
    finally:
        page.set_viewport_size(VIEWPORT)  # type: ignore[arg-type]


LOADED = "img => img.complete && img.naturalWidth > 0"
"""True once an <img> has finished loading a picture (a broken one has naturalWidth 0)."""


def wait_loaded(page: Page, img: Locator) -> int:
    """Wait until ``img`` has loaded its picture; its natural width."""
    handle = img.element_handle()
    page.wait_for_function(LOADED, arg=handle, timeout=WAIT_MS)
    width: int = img.evaluate("img => img.naturalWidth")
    return width


def sign_in(page: Page, fleet: RunningConsole, name: str, where: str = "/ui/") -> None:
    page.goto(fleet.url + where)
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page.get_by_test_id("user")).to_have_text(f"{name} · {USERS[name]}")


def rollouts(fleet: RunningConsole) -> list[dict[str, Any]]:
    body: list[dict[str, Any]] = http(
        "GET", fleet.url + "/api/v1/rollouts", token=OPERATOR_TOKEN
    ).body
    return body


def installs(fleet: RunningConsole, device_id: str) -> list[dict[str, Any]]:
    """The install events stored for the device (every record, as the API lists them)."""
    url = f"{fleet.url}/api/v1/events?kind=install&device_id={device_id}"
    body: dict[str, list[dict[str, Any]]] = http("GET", url, token=OPERATOR_TOKEN).body
    return [e for e in body["events"] if e["payload"].get("release") == 3]


def test_each_role_signs_in_and_sees_what_it_may(fleet: RunningConsole, page: Page) -> None:
    page.goto(fleet.url + "/ui/login")
    page.fill("input[name=username]", "olga")
    page.fill("input[name=password]", "wrong password for olga")
    page.click("button[type=submit]")
    expect(page.get_by_test_id("error")).to_have_text("wrong user name or password")
    shot(page, "login")
    for name, role in USERS.items():
        page.context.clear_cookies()
        sign_in(page, fleet, name, "/ui/rollouts")
        expect(page).to_have_url(fleet.url + "/ui/rollouts")
        expect(page.get_by_test_id("new-rollout")).to_have_count(1 if role == "operator" else 0)
        page.click("text=Sign out")
        expect(page).to_have_url(re.compile(r"/ui/login$"))


def test_the_overview_filters_and_a_device_page_shows_its_health_over_time(
    fleet: RunningConsole, page: Page
) -> None:
    sign_in(page, fleet, "vic")
    expect(page.get_by_test_id("group")).to_have_count(6)
    shot(page, "overview")
    page.select_option("select[name=site]", "plant-b")  # applies at once (page script)
    expect(page).to_have_url(re.compile(r"site=plant-b"))
    expect(page.get_by_test_id("group")).to_have_count(2)
    page.goto(fleet.url + "/ui/")
    page.fill("input[name=q]", HOT)
    page.click("button:has-text('Filter')")
    row = page.locator("table.devices tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("Problem")
    expect(row).to_contain_text("°C")
    page.goto(fleet.url + "/ui/")
    page.click(f"a:text-is('{FEATURED}')")
    expect(page.locator("h1")).to_contain_text(FEATURED)
    expect(page.locator("figure[data-chart] svg")).to_have_count(9)
    latency = page.locator("figure[data-chart=latency] svg")
    expect(latency).to_have_attribute("aria-label", re.compile(r"detector p99: [\d.]+ ms"))
    expect(latency).to_contain_text("budget 40 ms")
    expect(page.get_by_test_id("slots")).to_contain_text("1.3.2")
    expect(page.locator("table.events")).to_contain_text("soc temperature 79")
    shot(page, "device")


def test_the_overview_shows_a_device_going_offline_without_a_reload(
    fleet: RunningConsole, page: Page
) -> None:
    sign_in(page, fleet, "vic", f"/ui/?q={HOT}")
    row = page.locator("table.devices tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator(".badge.on")).to_have_text("online")
    engine = open_database(fleet.db_url)
    try:
        store.mark_seen(engine, HOT, time.time(), False)  # as the ingest does on its last will
        try:
            # the page fetches itself every 5 s: no reload, no click
            expect(row.locator(".badge.off")).to_have_text("offline", timeout=20_000)
            expect(page.get_by_test_id("summary")).to_contain_text("0 online")
        finally:
            store.mark_seen(engine, HOT, time.time(), True)
    finally:
        engine.dispose()


def test_the_bundles_page_shows_versions_signatures_and_where_they_run(
    fleet: RunningConsole, page: Page
) -> None:
    sign_in(page, fleet, "lena", "/ui/bundles")
    expect(page.get_by_test_id("repo-state")).to_contain_text("validly signed")
    rows = page.get_by_test_id("bundle-row")
    expect(rows).to_have_count(4)
    expect(rows.filter(has_text="1.4.0")).to_contain_text("active")
    expect(rows.filter(has_text="1.4.0")).to_contain_text("40 ms")
    expect(page.locator("text=invalid")).to_have_count(0)
    shot(page, "bundles")


def test_an_operator_creates_a_rollout_watches_a_wave_advance_and_pauses_it(
    fleet: RunningConsole, page: Page
) -> None:
    sign_in(page, fleet, "olga", "/ui/rollouts")
    page.get_by_test_id("new-rollout").click()
    page.select_option("select[name=bundle]", "detector@1.5.0")
    page.fill("input[name=selector]", "site=plant-a,line=4")
    page.fill("input[name=waves]", "1,2,100%")
    page.fill("input[name=soak]", "2s")
    page.check("input[name=approval]")
    page.get_by_test_id("preview").click()
    waves = page.get_by_test_id("preview-wave")
    expect(waves).to_have_count(3)
    first = waves.nth(0).locator("td.ids").inner_text()
    assert first in ROLLOUT_DEVICES
    shot(page, "rollout-preview")
    page.get_by_test_id("create").click()
    expect(page.get_by_test_id("done")).to_have_text("Rollout created.")
    rollout_id = page.url.split("/ui/rollouts/")[1].split("?")[0]
    # wave 1 installs on its light agent, soaks 2 s and passes; the page refreshes itself
    phase = page.get_by_test_id("phase")
    expect(phase).to_contain_text("awaiting approval")
    expect(phase).to_contain_text("wave 1 of 3")
    expect(page.locator("table.rollout-devices tr", has_text=first)).to_contain_text("done")
    shot(page, "rollout-wave1")
    page.click("[data-action=approve]")
    expect(page.get_by_test_id("done")).to_contain_text("Approved")
    expect(phase).to_contain_text("wave 2 of 3")  # the wave advanced
    expect(page.get_by_test_id("wave-row").nth(1)).to_contain_text("done 1")
    page.click("[data-action=pause]")
    expect(phase).to_contain_text("paused")
    expect(page.locator("[data-action=resume]")).to_have_count(1)
    shot(page, "rollout-paused")
    view = http("GET", f"{fleet.url}/api/v1/rollouts/{rollout_id}", token=OPERATOR_TOKEN).body
    assert view["phase"] == "paused"
    assert view["counts"]["done"] == 2
    page.goto(fleet.url + "/ui/rollouts")
    expect(page.locator("table.rollouts")).to_contain_text(rollout_id)
    shot(page, "rollouts")
    # the install reached the fleet twice (outbox event, retained install/state): once shown
    deadline = time.monotonic() + 20
    while len(installs(fleet, first)) < 2:
        assert time.monotonic() < deadline, installs(fleet, first)
        time.sleep(0.2)
    page.goto(f"{fleet.url}/ui/devices/{first}")
    expect(page.locator("table.events tr", has_text="committed detector r3")).to_have_count(1)


def test_a_gate_the_operator_blanks_on_the_form_is_off_in_the_created_rollout(
    fleet: RunningConsole, page: Page
) -> None:
    sign_in(page, fleet, "olga", "/ui/rollouts/new")
    page.select_option("select[name=bundle]", "detector@1.5.0")
    page.fill("input[name=selector]", "site=plant-a,line=3")
    page.fill("input[name=waves]", "1,100%")
    page.fill("input[name=soak]", "1h")
    page.check("input[name=approval]")
    expect(page.locator("input[name=max_p99_ratio]")).to_have_value("1.25")  # the defaults
    expect(page.locator("input[name=max_outcome_tvd]")).to_have_value("0.1")
    page.fill("input[name=max_p99_ratio]", "")  # "blank: off"
    page.fill("input[name=max_outcome_tvd]", "")
    page.get_by_test_id("preview").click()
    expect(page.get_by_test_id("preview-wave")).to_have_count(2)
    expect(page.locator("input[name=max_p99_ratio]")).to_have_value("")  # kept blank
    expect(page.locator("input[name=max_outcome_tvd]")).to_have_value("")
    page.get_by_test_id("create").click()
    expect(page.get_by_test_id("done")).to_have_text("Rollout created.")
    rollout_id = page.url.split("/ui/rollouts/")[1].split("?")[0]
    engine = open_database(fleet.db_url)
    try:
        record = store.load_rollout(engine, rollout_id)
    finally:
        engine.dispose()
    assert record is not None
    gates = record.policy["gates"]
    assert (gates["max_p99_ratio"], gates["max_outcome_tvd"]) == (None, None), gates
    assert gates["max_install_failures"] == 0
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("[data-action=cancel]")  # its devices are free for the other tests
    expect(page.get_by_test_id("phase")).to_contain_text("cancelled")


def test_a_line_manager_is_refused_a_rollout_on_the_page_and_by_hand(
    fleet: RunningConsole, page: Page
) -> None:
    spec = {"bundle": "detector@1.5.0", "selector": "site=plant-b,line=2", "waves": "1,100%",
            "soak_s": "1h"}  # fmt: skip
    made = http("POST", fleet.url + "/api/v1/rollouts", spec, token=OPERATOR_TOKEN)
    assert made.status == 201, made.body
    rid = made.body["rollout_id"]
    deadline = time.monotonic() + 20
    while [r["phase"] for r in rollouts(fleet) if r["rollout_id"] == rid] != ["assigning"]:
        assert time.monotonic() < deadline, "the rollout service did not start the rollout"
        time.sleep(0.2)
    before = rollouts(fleet)  # its devices have no agents: it stays assigning
    sign_in(page, fleet, "lena", "/ui/rollouts")
    expect(page.get_by_test_id("new-rollout")).to_have_count(0)
    page.goto(f"{fleet.url}/ui/rollouts/{rid}")
    expect(page.get_by_test_id("phase")).to_be_visible()
    expect(page.locator("[data-action]")).to_have_count(0)
    page.goto(fleet.url + "/ui/rollouts/new")
    expect(page.get_by_test_id("error")).to_contain_text("may not rollouts:write")
    shot(page, "refused")
    csrf = page.request.get(fleet.url + "/api/v1/me").json()["csrf_token"]
    form = {"csrf_token": csrf, "rollout_id": "ro-00000000a11e", "bundle": "detector@1.5.0",
            "selector": "*", "waves": "100%", "soak": "1m"}  # fmt: skip
    assert page.request.post(fleet.url + "/ui/rollouts", form=form).status == 403
    paused = page.request.post(f"{fleet.url}/ui/rollouts/{rid}/pause", form={"csrf_token": csrf})
    assert paused.status == 403
    api = page.request.post(
        fleet.url + "/api/v1/rollouts", data=spec, headers={"X-CSRF-Token": csrf}
    )
    assert api.status == 403
    after = rollouts(fleet)
    assert [r["rollout_id"] for r in after] == [r["rollout_id"] for r in before]
    assert [r["phase"] for r in after] == [r["phase"] for r in before]


def test_a_line_manager_filters_decisions_overrides_one_and_sees_it_in_the_export(
    fleet: RunningConsole, page: Page
) -> None:
    sign_in(page, fleet, "lena", "/ui/decisions")
    page.fill("input[name=outcome]", "reject")
    page.select_option("select[name=reviewed]", "no")
    page.click("button:has-text('Filter')")
    rows = page.get_by_test_id("decision-row")
    expect(rows.first).to_be_visible()
    expect(rows.locator("span.badge.out-pass")).to_have_count(0)
    thumbs = rows.locator("td.thumb .shot img")
    expect(thumbs).to_have_count(rows.count())  # every reject kept and uploaded its image
    assert wait_loaded(page, thumbs.first) == 320  # the device's thumbnail, shown small
    assert thumbs.first.get_attribute("loading") == "lazy"
    expect(rows.first.locator("svg.frame.over rect.box").first).to_be_visible()
    for k in range(min(6, rows.count())):  # the rows a docs shot shows
        wait_loaded(page, thumbs.nth(k))
    shot(page, "decisions")
    docs_shot(page, "decision-list")
    rows.first.locator("a").first.click()
    frame = page.get_by_test_id("frame")
    expect(frame.locator("svg.frame")).to_have_attribute("aria-label", re.compile(r"\d box"))
    image = frame.locator("img")
    assert wait_loaded(page, image) == 320
    shown, over = image.bounding_box(), frame.locator("svg.frame.over").bounding_box()
    assert shown is not None
    assert over == shown  # the boxes lie exactly over the image
    assert shown["width"] > 320  # scaled up to the card (640 wide at most)
    assert shown["height"] == pytest.approx(shown["width"] * 3 / 4, abs=1)
    x = "\N{MULTIPLICATION SIGN}"
    expect(page.get_by_test_id("image-note")).to_contain_text(f"(320 {x} 240 px of 640 {x} 480)")
    docs_shot(page, "decision-review")
    decision_id = page.url.split("/ui/decisions/")[1].split("?")[0]
    page.check("input[value=override]")
    page.select_option("select[name=outcome]", "pass")
    page.fill("textarea[name=note]", "a reflection, not a scratch")
    page.get_by_test_id("save-review").click()
    expect(page.get_by_test_id("done")).to_have_text("Review saved.")
    expect(page.get_by_test_id("current-review")).to_contain_text("overridden from reject")
    shot(page, "decision")
    page.goto(fleet.url + "/ui/decisions?outcome=reject")
    expect(page.get_by_test_id("accuracy")).to_contain_text("reject → pass: 1")
    href = page.get_by_test_id("export").get_attribute("href")
    assert href is not None
    exported = page.request.get(fleet.url + href)
    assert exported.status == 200, exported.text()
    [row] = [ln for ln in exported.text().splitlines() if ln.startswith(decision_id)]
    assert "override,pass,a reflection, not a scratch,lena" in row.replace('"', "")


PHONE = {"width": 375, "height": 740}
WIDE_ENOUGH = "() => document.documentElement.scrollWidth <= window.innerWidth"


def test_every_page_fits_a_phone_without_scrolling_sideways(
    fleet: RunningConsole, browser: Browser
) -> None:
    """At 375 px (a phone held upright) no page scrolls sideways: wide tables scroll in
    their own box, the header wraps, and the user menu stays reachable."""
    context = browser.new_context(viewport=PHONE)  # type: ignore[arg-type]
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    try:
        page.goto(fleet.url + "/ui/login")
        assert page.evaluate(WIDE_ENOUGH), "the sign-in page scrolls sideways"
        sign_in(page, fleet, "olga")
        decision = page.request.get(fleet.url + "/api/v1/decisions?limit=1").json()
        pages = ["/ui/", f"/ui/devices/{FEATURED}", "/ui/bundles", "/ui/rollouts",
                 "/ui/rollouts/new", "/ui/drift", "/ui/decisions", "/ui/audit", "/ui/users",
                 f"/ui/decisions/{decision['rows'][0]['id']}"]  # fmt: skip
        for path in pages:
            page.goto(fleet.url + path)
            expect(page.get_by_test_id("user")).to_be_visible()
            wide = page.evaluate("() => document.documentElement.scrollWidth")
            assert page.evaluate(WIDE_ENOUGH), f"{path} is {wide} px wide at 375 px"
            shot(page, "phone" + path.replace("/", "-").rstrip("-"))
    finally:
        context.close()


def test_a_line_manager_reviews_by_keyboard_and_lands_in_the_same_filter(
    fleet: RunningConsole, page: Page
) -> None:
    """c confirms and opens the next of the filter; o and Enter override; b goes back to
    the same filtered list."""
    query = f"device={FEATURED}&outcome=review&reviewed=no"
    sign_in(page, fleet, "lena", f"/ui/decisions?{query}")
    page.get_by_test_id("decision-row").first.locator("a").first.click()
    left = page.get_by_test_id("queue-left")
    first = int(left.inner_text().split()[0])
    assert first >= 4
    seen = [page.url.split("/ui/decisions/")[1].split("?")[0]]
    for n in range(1, 4):
        page.keyboard.press("c")  # confirm, and on to the next of the filter
        expect(left).to_have_text(re.compile(rf"^{first - n} left"))
        expect(page.get_by_test_id("done")).to_have_text("Review saved.")
        seen.append(page.url.split("/ui/decisions/")[1].split("?")[0])
    assert len(set(seen)) == 4
    page.keyboard.press("o")
    page.select_option("select[name=outcome]", "pass")  # focused by o
    page.keyboard.press("Enter")
    expect(left).to_have_text(re.compile(rf"^{first - 4} left"))
    page.keyboard.press("b")
    expect(page).to_have_url(re.compile(r"/ui/decisions\?"))
    assert "outcome=review" in page.url
    assert "reviewed=no" in page.url
    shown = {
        a.get_attribute("href").split("/ui/decisions/")[1].split("?")[0]  # type: ignore[union-attr]
        for a in page.get_by_test_id("decision-row").locator("td:nth-child(3) a").all()
    }
    assert not shown & set(seen)  # the reviewed ones left this filter
