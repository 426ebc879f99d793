"""A resumed job's client: the steps it replays since its checkpoint are logged once (a replay that
comes out different is reported), and a new checkpoint replaces the previous one on disk."""

from __future__ import annotations

from engine.client import Client
from engine.service.driver import resume_point
from engine.service.eventlog import EventLog, read_events


def test_replayed_steps_are_not_logged_twice_and_a_different_replay_is_reported(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    first = Client(None, log)
    first.log_metrics(1, {"loss": 0.5, "reward_mean": 0.25})
    first.log_timings(1, {"total": 1.0})
    first.log_metrics(2, {"loss": 0.25, "reward_mean": 0.5})
    checkpoint, logged = resume_point(read_events(log.path))
    assert checkpoint is None
    assert sorted(logged) == [1, 2]

    again = Client(None, log, logged=logged)
    again.log_metrics(1, {"loss": 0.5, "reward_mean": 0.25})  # replayed, the same: nothing written
    again.log_timings(1, {"total": 2.0})
    again.log_metrics(2, {"loss": 0.125, "reward_mean": 0.5})  # replayed, different: reported
    again.log_metrics(3, {"loss": 0.0625, "reward_mean": 0.75})  # new
    events = read_events(log.path)
    assert [e["data"]["step"] for e in events if e["kind"] == "metrics"] == [1, 2, 3]
    assert [e["data"]["step"] for e in events if e["kind"] == "timings"] == [1]
    assert [e["data"]["message"] for e in events if e["kind"] == "log"] == [
        "step 2 replayed after a restart with different metrics: loss"]


def test_a_new_checkpoint_is_where_a_job_resumes_and_replaces_the_previous_one(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    client = Client(None, log)
    old, new = tmp_path / "ckpt" / "step-1", tmp_path / "ckpt" / "step-2"
    for path in (old, new):
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"weights")
    client.log_checkpoint(1, "step-1", str(old), {"evals": []})
    client.log_metrics(2, {"loss": 0.5})
    client.log_checkpoint(2, "step-2", str(new), {"evals": [0.5]})
    assert not old.exists()  # a job keeps its latest checkpoint only
    assert new.exists()
    checkpoint, logged = resume_point(read_events(log.path))
    assert checkpoint == {"step": 2, "tag": "step-2", "path": str(new), "state": {"evals": [0.5]}}
    assert sorted(logged) == [2]
