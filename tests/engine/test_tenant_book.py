"""The controller's record of the tenants' pushed weights and budgets (engine.service.tenants): it
survives a restart, and a new scheduler's budgets come back less the usage logged since each push.
Files only: no Ray."""

from __future__ import annotations

import json

import pytest

from engine.accounting.metering import UsageRecord
from engine.paths import events_path
from engine.service.eventlog import EventLog
from engine.service.tenants import FILE_NAME, TenantBook


def log_usage(data_dir, job: str, *records: UsageRecord) -> None:
    log = EventLog(events_path(data_dir, job))
    log.append("state", {"state": "running"})
    for record in records:
        log.append("usage", record.to_dict())
    log.close()


def usage(tenant: str, start: float, end: float, devices: float = 2.0) -> UsageRecord:
    return UsageRecord(job="j", role="actor", fn="generate", wpg="w", devices=devices, start=start, end=end,
                       tenant=tenant)


def test_pushes_survive_a_restart_and_budgets_come_back_less_the_usage_since(tmp_path):
    book = TenantBook(tmp_path)
    book.pushed("acme", weight=3.0, budget=100.0, at=1000.0)
    book.pushed("globex", weight=2.0, budget=None, at=1000.0)
    book.pushed("initech", budget=50.0, at=1010.0)  # a budget alone: weight 1
    log_usage(tmp_path, "job-a",
              usage("acme", 990.0, 999.0),  # ended before the push: the old budget paid for it
              usage("acme", 998.0, 1004.0),  # ran across the push: the new one pays, as the scheduler charged it
              usage("acme", 1004.0, 1005.5),
              usage("initech", 1000.0, 1009.0),  # before initech's push
              usage("globex", 1000.0, 1100.0))  # no budget: nothing to rebuild
    log_usage(tmp_path, "job-b", usage("initech", 1010.0, 1012.0, devices=0.5))
    restarted = TenantBook(tmp_path)
    assert restarted.tenants == book.tenants
    assert restarted.for_scheduler() == {
        "acme": {"weight": 3.0, "budget": pytest.approx(100.0 - 2.0 * 6.0 - 2.0 * 1.5)},
        "globex": {"weight": 2.0, "budget": None},
        "initech": {"weight": 1.0, "budget": pytest.approx(50.0 - 0.5 * 2.0)},
    }


def test_a_budget_pushed_alone_keeps_the_weight_and_the_file_is_replaced_whole(tmp_path):
    book = TenantBook(tmp_path)
    book.pushed("acme", weight=3.0, budget=100.0, at=1.0)
    book.pushed("acme", budget=None, at=2.0)
    assert book.for_scheduler() == {"acme": {"weight": 3.0, "budget": None}}
    assert json.loads((tmp_path / FILE_NAME).read_text()) == {
        "tenants": {"acme": {"weight": 3.0, "budget": None, "at": 2.0}}}
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME]  # no temporary file left behind


def test_an_unreadable_file_starts_afresh(tmp_path):
    (tmp_path / FILE_NAME).write_text("{not json")
    book = TenantBook(tmp_path)
    assert book.tenants == {}
    assert book.for_scheduler() == {}
