"""The rules of remote actions without processes: which parameters a request may carry,
which verified requests are carried out (counter, expiry, replay), what the redaction
takes out, how the rotating files are read back, and the rate of uploads; requests
verified against a real signed repository."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from tuf.api.metadata import Targets  # type: ignore[attr-defined, unused-ignore]

from agent.remote.config import LogsConfig
from agent.remote.counter import CARRY_OUT, REFUSE, SILENT, Handled, HandledCounter, decide
from agent.remote.logfile import DroppingQueueHandler, UtcFormatter
from agent.remote.logread import Entry, FileSource, LogQuery, parse_stamp, unit_of_this_process
from agent.remote.redact import Redactor
from agent.remote.request import ActionRequest, claimed_request_id, verify_action
from agent.remote.upload import TokenBucket
from agent.update.errors import DirectiveRefused
from agent.wire.actions import MAX_LINES, check_params
from fleet_server.repository import KeyStore, Passphrases, Repository
from fleet_server.repository.director import sign_action

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def _request(counter: int, digest: str = "d", expires: datetime | None = None) -> ActionRequest:
    return ActionRequest(counter, expires or NOW + timedelta(minutes=5), "cam-1", f"r{counter}",
                         "logs", {}, digest)  # fmt: skip


# -- parameters -------------------------------------------------------------------------


def test_parameters_get_their_defaults_and_a_bad_one_is_named() -> None:
    assert check_params("logs", {"lines": 5}) == {"since_s": 3600, "lines": 5, "grep": "",
                                                   "follow_s": 0}  # fmt: skip
    assert check_params("restart", {}) == {}
    for action, params, why in (
        ("logs", {"lines": 0}, "logs.lines: 0 is not in [1, 10000]"),
        ("logs", {"lines": MAX_LINES + 1}, "logs.lines: 10001 is not in"),
        ("logs", {"lines": True}, "logs.lines: True is not a whole number"),
        ("logs", {"grep": "a\nb"}, "logs.grep: holds a control character"),
        ("logs", {"level": "info"}, "logs: unknown parameter(s) level"),
        ("restart", {"force": 1}, "restart: unknown parameter(s) force (known: none)"),
        ("reboot", {}, "action 'reboot' is not one of logs, restart, reload, diagnostics"),
    ):
        with pytest.raises(ValueError, match="^" + why.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("]", r"\]")):  # fmt: skip
            check_params(action, params)


# -- which requests are carried out ---------------------------------------------------------


def test_a_new_counter_before_its_expiry_is_carried_out_and_recorded() -> None:
    d = decide(_request(5), Handled(4, "x"), retained=False, now=NOW)
    assert (d.what, d.record) == (CARRY_OUT, True)


def test_the_retained_copy_of_the_last_request_is_passed_over_in_silence() -> None:
    d = decide(_request(5, "same"), Handled(5, "same"), retained=True, now=NOW)
    assert (d.what, d.record) == (SILENT, False)


def test_the_last_request_sent_again_live_is_a_replay() -> None:
    d = decide(_request(5, "same"), Handled(5, "same"), retained=False, now=NOW)
    assert d.what == REFUSE
    assert d.reason == "replayed: request r5 was handled already"


def test_a_lower_or_equal_counter_is_refused_whatever_its_expiry() -> None:
    for counter in (3, 5):
        d = decide(_request(counter, "other"), Handled(5, "same"), retained=True, now=NOW)
        assert d.what == REFUSE
        assert f"counter {counter} is not above 5" in d.reason
        assert not d.record


def test_an_expired_request_is_refused_and_its_counter_kept_so_it_is_answered_once() -> None:
    d = decide(_request(6, expires=NOW), Handled(5), retained=True, now=NOW)
    assert (d.what, d.record) == (REFUSE, True)
    assert d.reason.startswith("expired at 2026-11-28T12:00:00+00:00")


def test_the_handled_counter_is_durable_never_lowered_and_unreadable_means_zero(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counter = HandledCounter(tmp_path)
    assert counter.read() == Handled()
    counter.write(Handled(7, "abc"))
    counter.write(Handled(3, "old"))
    assert HandledCounter(tmp_path).read() == Handled(7, "abc")
    counter.path.write_text('{"counter": -1}')
    with caplog.at_level(logging.ERROR):
        assert counter.read() == Handled()
    assert counter.unreadable == 1
    assert "is unreadable" in caplog.text


# -- verification against a real repository ---------------------------------------------


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Repository, KeyStore, Targets]:
    directory = tmp_path_factory.mktemp("repo")
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": "rules test passphrase"})
    keys = KeyStore.create(directory / "keys", root_keys=1, root_threshold=1, passphrases=pp)
    repo = Repository(directory / "repo")
    repo.init(keys)
    return repo, keys, repo.targets().signed


def _sign(repo: Repository, keys: KeyStore, **over: object) -> bytes:
    args: dict[str, object] = {"device_id": "cam-1", "request_id": "r-1", "action": "logs",
                               "params": {"lines": 3}, "counter": 9,
                               "expires": NOW + timedelta(hours=1)}  # fmt: skip
    args.update(over)
    return sign_action(repo, keys, **args)  # type: ignore[arg-type]


def test_a_signed_request_verifies_with_its_fields_and_defaults(
    signed: tuple[Repository, KeyStore, Targets],
) -> None:
    repo, keys, targets = signed
    req = verify_action(_sign(repo, keys), targets, device_id="cam-1")
    assert (req.counter, req.request_id, req.action) == (9, "r-1", "logs")
    assert req.params == {"since_s": 3600, "lines": 3, "grep": "", "follow_s": 0}
    assert req.expires == NOW + timedelta(hours=1)
    assert len(req.digest) == 64


def test_a_request_for_another_device_or_tampered_is_refused_naming_why(
    signed: tuple[Repository, KeyStore, Targets],
) -> None:
    repo, keys, targets = signed
    with pytest.raises(DirectiveRefused, match="for device 'cam-2', this is 'cam-1'"):
        verify_action(_sign(repo, keys, device_id="cam-2"), targets, device_id="cam-1")
    tampered = _sign(repo, keys).replace(b'"lines": 3', b'"lines": 9')
    with pytest.raises(DirectiveRefused, match="not signed by the director"):
        verify_action(tampered, targets, device_id="cam-1")
    with pytest.raises(DirectiveRefused, match="not a TUF targets document"):
        verify_action(b"{not json", targets, device_id="cam-1")


def test_a_parameter_this_agent_does_not_know_is_refused_though_signed(
    signed: tuple[Repository, KeyStore, Targets],
) -> None:
    repo, keys, targets = signed
    data = _sign(repo, keys, params={"lines": 3, "level": "debug"})
    with pytest.raises(DirectiveRefused, match=r"unknown parameter\(s\) level"):
        verify_action(data, targets, device_id="cam-1")


def test_the_claimed_request_id_is_read_unverified_and_checked() -> None:
    assert claimed_request_id(b'{"signed": {"custom": {"request_id": "r-7"}}}') == "r-7"
    assert claimed_request_id(b'{"signed": {"custom": {"request_id": "a/b"}}}') == "unknown"
    assert claimed_request_id(b"\xff\xfe") == "unknown"
    assert claimed_request_id(b"[" * 100_000) == "unknown"


# -- redaction ------------------------------------------------------------------------------


def test_redaction_takes_out_urls_key_values_bearer_pem_and_known_values(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "EDGEFLEET_API_TOKEN").write_text("cred-file-token-77\n")
    redact = Redactor(["given-secret-1"], credentials_dir=creds)
    cases = {
        "open rtsp://admin:pw1@10.0.0.5/s": "open rtsp://admin:***@10.0.0.5/s",
        "password=hunter2 user=bob": "password=*** user=bob",
        '{"api_key": "abcd1234", "n": 1}': '{"api_key": "***", "n": 1}',
        "Authorization: Bearer eyJhbGciOiJIUzI1": "Authorization: *** ***",
        "passphrase: 'a b c' next": "passphrase: '***' next",
        "GET /x?token=abc&y=1": "GET /x?token=***&y=1",
        "sent cred-file-token-77 and given-secret-1": "sent *** and ***",
        "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----": (
            "-----BEGIN EC PRIVATE KEY----- ***"
        ),
        "a token expired; the password was wrong": "a token expired; the password was wrong",
    }
    for text, expected in cases.items():
        assert redact(text) == expected
    assert redact.replaced == 10  # Authorization: Bearer x counts twice (key and token)


def test_json_values_are_redacted_by_key_and_names_of_secrets_are_kept() -> None:
    redact = Redactor()
    value = {"mqtt": {"password_env": "BROKER_PW", "password": "x1", "token": None,
                      "uri": "http://u:p@h/"}, "list": [{"secret": "s"}]}  # fmt: skip
    assert redact.value(value) == {
        "mqtt": {"password_env": "BROKER_PW", "password": "***", "token": None,
                 "uri": "http://u:***@h/"},
        "list": [{"secret": "***"}],
    }  # fmt: skip


# -- the rotating files, read back ---------------------------------------------------------------


def _write(path: Path, role: str, entries: list[tuple[float, str]]) -> None:
    fmt = UtcFormatter(role)
    with path.open("a", encoding="utf-8") as f:
        for ts, msg in entries:
            record = logging.LogRecord("agent.x", logging.INFO, __file__, 1, msg, None, None)
            record.created, record.msecs = ts, (ts * 1000) % 1000
            f.write(fmt.format(record) + "\n")


def test_files_of_every_process_are_merged_by_time_filtered_and_followed(tmp_path: Path) -> None:
    t0 = 1_795_800_000.0
    _write(
        tmp_path / "hotpath.log.1", "hotpath", [(t0 + 1, "old one"), (t0 + 3, "boom\nTraceback x")]
    )
    _write(tmp_path / "hotpath.log", "hotpath", [(t0 + 5, "hot five")])
    _write(tmp_path / "companion.log", "companion", [(t0 + 2, "comp two"), (t0 + 4, "Comp four")])
    src = FileSource(tmp_path)
    got = src.tail(LogQuery(since=t0 + 2, lines=10))
    assert [e.ts for e in got] == [t0 + 2, t0 + 3, t0 + 4, t0 + 5]
    assert got[1].text.endswith("boom\nTraceback x")  # a traceback stays with its entry
    assert parse_stamp(got[0].text) == t0 + 2

    def msgs(entries: list[Entry]) -> list[str]:
        return [e.text.rpartition(": ")[2] for e in entries]

    assert msgs(src.tail(LogQuery(0, 2))) == ["Comp four", "hot five"]
    assert msgs(src.tail(LogQuery(0, 10, grep="comp"))) == ["comp two", "Comp four"]
    assert msgs(src.tail(LogQuery(0, 10, grep="Comp"))) == ["Comp four"]
    _write(tmp_path / "companion.log", "companion", [(t0 + 6, "comp six")])
    assert msgs(src.follow(LogQuery(0, 10))) == ["comp six"]
    assert src.follow(LogQuery(0, 10)) == []


def test_unit_of_this_process_comes_from_its_cgroup(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/system.slice/edgefleet-agent.service\n")
    assert unit_of_this_process(cgroup) == "edgefleet-agent.service"
    cgroup.write_text("0::/user.slice/user-1000.slice\n")
    assert unit_of_this_process(cgroup) is None


def test_the_log_files_rotate_at_their_size(tmp_path: Path) -> None:
    from agent.remote.logfile import install

    cfg = LogsConfig(file="always", max_file_kb=16, backups=1)
    root = logging.getLogger()
    path = install(cfg, tmp_path, "companion")
    assert path == tmp_path / "logs" / "companion.log"
    handler = root.handlers[-1]
    assert isinstance(handler, DroppingQueueHandler)
    assert handler.listener is not None
    try:
        for i in range(600):
            logging.getLogger("agent.t").warning("line %d %s", i, "x" * 40)
    finally:
        root.removeHandler(handler)
        handler.stop()  # what was queued is written
    assert DroppingQueueHandler.dropped == 0
    files = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert files == ["companion.log", "companion.log.1"]
    assert all(p.stat().st_size <= 16 * 1024 for p in (tmp_path / "logs").iterdir())


# -- rate -------------------------------------------------------------------------------


def test_the_bucket_lets_a_chunk_through_then_paces_to_the_rate() -> None:
    clock = [0.0]
    bucket = TokenBucket(rate=1000.0, capacity=500.0, clock=lambda: clock[0])
    assert bucket.delay(500) == 0.0
    assert bucket.delay(500) == pytest.approx(0.5)
    clock[0] = 1.5
    assert bucket.delay(500) == pytest.approx(0.0)
    assert bucket.waited_s == pytest.approx(0.5)
