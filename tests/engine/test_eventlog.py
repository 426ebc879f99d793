"""The per-job event log: append-only JSON lines, read by cursor, resumable after a crash."""

import json

import pytest

from engine.client import Client
from engine.service.eventlog import EventLog, LogEnded, has_ended, read_events


@pytest.fixture
def path(tmp_path):
    return tmp_path / "job" / "events.jsonl"  # the folder does not exist yet


def _fill(path, n: int) -> EventLog:
    log = EventLog(path)
    for i in range(n):
        log.append("metrics", {"step": i + 1, "value": i * 0.5}, durable=i % 2 == 0)
    return log


def test_append_and_read(path):
    log = _fill(path, 3)
    assert log.seq == 3
    events = read_events(path)
    assert [e["seq"] for e in events] == [1, 2, 3]
    assert [e["kind"] for e in events] == ["metrics"] * 3
    assert events[2]["data"] == {"step": 3, "value": 1.0}
    assert all(isinstance(e["ts"], float) for e in events)
    log.close()


def test_read_by_cursor_and_limit(path):
    _fill(path, 5).close()
    assert [e["seq"] for e in read_events(path, after_seq=2)] == [3, 4, 5]
    assert [e["seq"] for e in read_events(path, after_seq=2, limit=2)] == [3, 4]
    assert [e["seq"] for e in read_events(path, limit=1)] == [1]
    assert read_events(path, after_seq=5) == []
    assert read_events(path.with_name("missing.jsonl")) == []


def test_a_consumer_paging_by_cursor_sees_every_event_once(path):
    _fill(path, 7).close()
    seen, cursor = [], 0
    while page := read_events(path, after_seq=cursor, limit=3):
        seen += [e["seq"] for e in page]
        cursor = page[-1]["seq"]
    assert seen == list(range(1, 8))


def test_seq_continues_after_reopening(path):
    _fill(path, 2).close()
    log = EventLog(path)
    assert log.seq == 2
    assert log.append("state", {"state": "running"}) == 3
    log.close()
    assert [e["seq"] for e in read_events(path)] == [1, 2, 3]


def test_torn_last_line_is_ignored(path):
    _fill(path, 3).close()
    with path.open("a") as f:
        f.write('{"seq": 4, "kind": "metr')  # the process died mid-write
    assert [e["seq"] for e in read_events(path)] == [1, 2, 3]


def test_resuming_after_a_torn_line_keeps_new_events_readable(path):
    _fill(path, 3).close()
    with path.open("a") as f:
        f.write('{"seq": 4, "kind": "metr')
    log = EventLog(path)
    assert log.seq == 3
    assert log.append("state", {"state": "running"}) == 4
    assert log.append("log", {"message": "resumed"}) == 5
    log.close()
    events = read_events(path)
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
    assert events[3]["data"] == {"state": "running"}
    # every line on disk is one whole event
    assert [json.loads(line)["seq"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_client_logs_metrics_timings_and_lines(path):
    log = EventLog(path)
    client = Client(router=None, events=log)  # logging needs no worker
    client.log_metrics(1, {"reward_mean": 0.5})
    client.log_timings(1, {"generate": 1.25})
    client.log("hello")
    log.close()
    events = read_events(path)
    assert [(e["kind"], e["data"]) for e in events] == [
        ("metrics", {"step": 1, "reward_mean": 0.5}),
        ("timings", {"step": 1, "generate": 1.25}),
        ("log", {"message": "hello"}),
    ]


def test_a_last_line_without_its_newline_is_torn_too(path):
    _fill(path, 2).close()
    with path.open("a") as f:
        f.write(json.dumps({"seq": 3, "kind": "log", "ts": 0.0, "data": {}}))  # died before the "\n"
    assert [e["seq"] for e in read_events(path)] == [1, 2]
    log = EventLog(path)
    assert log.append("log", {"message": "again"}) == 3
    log.close()
    assert [e["data"] for e in read_events(path)][-1] == {"message": "again"}


CONSUMER = r"""
import sqlite3, sys, time
from engine.service.eventlog import read_events

log, db, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
con = sqlite3.connect(db, isolation_level=None)
con.execute("CREATE TABLE IF NOT EXISTS cursor (seq INTEGER)")
con.execute("CREATE TABLE IF NOT EXISTS seen (seq INTEGER)")  # not unique: a double delivery would show
if con.execute("SELECT COUNT(*) FROM cursor").fetchone()[0] == 0:
    con.execute("INSERT INTO cursor VALUES (0)")
while True:
    cursor = con.execute("SELECT seq FROM cursor").fetchone()[0]
    if cursor >= total:
        break
    page = read_events(log, after_seq=cursor, limit=5)
    if not page:
        time.sleep(0.005)
    for event in page:
        # the event's effect and the cursor move in one transaction: a kill loses or keeps both
        con.execute("BEGIN")
        con.execute("INSERT INTO seen VALUES (?)", (event["seq"],))
        con.execute("UPDATE cursor SET seq = ?", (event["seq"],))
        con.execute("COMMIT")
"""


def test_a_killed_consumer_resumes_by_cursor_and_sees_every_event_once(tmp_path):
    """A consumer in its own process follows a log that is still being written, is killed with
    SIGKILL three times, and restarts from its committed cursor each time."""
    import sqlite3
    import subprocess
    import sys
    import time

    from tests.engine.repo import REPO

    total, path, db = 400, tmp_path / "events.jsonl", tmp_path / "consumer.sqlite"
    log = EventLog(path)

    def start():
        return subprocess.Popen([sys.executable, "-c", CONSUMER, str(path), str(db), str(total)], cwd=REPO)

    def progress() -> int:
        if not db.exists():
            return 0
        con = sqlite3.connect(db)
        try:
            return con.execute("SELECT COUNT(*) FROM seen").fetchone()[0]
        except sqlite3.OperationalError:
            return 0
        finally:
            con.close()

    consumer, kills = start(), 0
    for i in range(total):
        log.append("metrics", {"step": i + 1}, durable=i % 50 == 0)
        if i % 100 == 99 and kills < 3:
            deadline = time.monotonic() + 60
            while progress() < i - 20 and time.monotonic() < deadline:
                time.sleep(0.01)
            consumer.kill()  # SIGKILL: no clean-up, possibly mid-transaction
            consumer.wait()
            kills += 1
            consumer = start()
        time.sleep(0.001)
    log.close()
    assert consumer.wait(timeout=120) == 0
    assert kills == 3
    con = sqlite3.connect(db)
    seen = [row[0] for row in con.execute("SELECT seq FROM seen ORDER BY rowid")]
    con.close()
    assert seen == list(range(1, total + 1))


def test_a_second_writer_goes_on_after_the_first_and_nothing_follows_the_end(tmp_path):
    """The supervisor writes a dead driver's end while the driver may still run for a moment: seq
    goes on after what the driver wrote, and the driver can append nothing after the end."""
    path = tmp_path / "events.jsonl"
    driver = EventLog(path)
    driver.append("metrics", {"step": 1})
    supervisor = EventLog(path)
    driver.append("usage", {"call": 1})  # after the supervisor opened the log
    assert supervisor.append("state", {"state": "failed", "reason": "driver ended"}) == 3
    with pytest.raises(LogEnded):
        driver.append("usage", {"call": 2})
    with pytest.raises(LogEnded):
        EventLog(path).append("log", {"line": "late"})
    assert supervisor.append("log", {"line": "its own end may be followed"}) == 4
    events = read_events(path)
    assert [e["seq"] for e in events] == [1, 2, 3, 4]
    assert events[2]["data"] == {"state": "failed", "reason": "driver ended"}


def test_a_note_racing_the_writers_own_end_is_not_written(tmp_path):
    """A resume the service notes while the job's loop is failing it: the summary may follow the
    loop's own end, a state note may not (else the failed job would look running again)."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.append("state", {"state": "paused"}, after_own_end=False)  # before any end: written
    log.append("state", {"state": "failed", "reason": "x"})
    with pytest.raises(LogEnded):
        log.append("state", {"state": "running"}, after_own_end=False)
    assert log.append("summary", {"steps": 1}) == 3
    assert [e["data"].get("state") for e in read_events(path)] == ["paused", "failed", None]


@pytest.mark.parametrize("filler", [0, 2000], ids=["short", "longer-than-the-tail"])
def test_has_ended_finds_a_terminal_state_from_the_tail_or_the_whole_log(tmp_path, filler):
    running, ended, late = tmp_path / "running.jsonl", tmp_path / "ended.jsonl", tmp_path / "late.jsonl"
    for path in (running, ended, late):
        log = EventLog(path)
        log.append("state", {"state": "running"})
        for i in range(filler):
            log.append("log", {"message": f"line {i} " + "x" * 40})
        if path is ended:
            log.append("state", {"state": "succeeded"})
            log.append("summary", {"steps": 3})
        if path is late:  # its end, then more than the tail's bytes (read whole)
            log.append("state", {"state": "failed", "reason": "r"})
            log.append("summary", {"pad": "y" * (70 << 10)})
        log.close()
    with running.open("a") as f:
        f.write('{"seq": 9999, "kind": "state", "data": {"state": "succ')  # torn: not an end
    assert not has_ended(running)
    assert has_ended(ended)
    assert has_ended(late)
