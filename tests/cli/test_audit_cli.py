"""`corral audit`: the filters sent to GET /audit, its pages followed by `next_before` up to
--limit, and the table."""
import json

import pytest
from responses import matchers

from cli_support import SCHED, corral, iso, one_line_error


def an_event(event_id: int, **fields) -> dict:
    event = {"id": event_id, "at": iso(60), "user": "alice", "team": "ml", "action": "cancelJob",
             "target": "job-1", "method": "POST", "path": "/jobs/job-1/cancel", "address": "127.0.0.1",
             "status": 200, "token_id": "tok-1"}
    event.update(fields)
    return event


def query(**params):
    return [matchers.query_param_matcher({k: str(v) for k, v in params.items()})]


def test_audit_sends_the_filters_and_prints_a_table(mock):
    events = [an_event(9), an_event(8, user=None, team=None, action="createToken", target=None, status=403,
                                    address="10.0.0.7")]
    mock.get(f"{SCHED}/audit", json={"events": events, "next_before": None}, match=query(
        user="alice", team="ml", action="cancelJob", since="2026-11-29T10:00:00.000Z",
        until="2026-12-01T00:00:00Z", limit=50))
    result = corral("audit", "--user", "alice", "--team", "ml", "--action", "cancelJob", "--since", "2h",
                    "--until", "2026-12-01T00:00:00Z", "--limit", "50")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["TIME", "USER", "TEAM", "ACTION", "TARGET", "STATUS", "ADDRESS"]
    assert lines[1].split() == ["2026-11-29", "11:59:00Z", "alice", "ml", "cancelJob", "job-1", "200", "127.0.0.1"]
    assert lines[2].split() == ["2026-11-29", "11:59:00Z", "-", "-", "createToken", "-", "403", "10.0.0.7"]
    assert result.stderr == ""


def test_audit_follows_next_before_up_to_the_limit(mock):
    mock.get(f"{SCHED}/audit", json={"events": [an_event(i) for i in (1500, 1499)], "next_before": 1499},
             match=query(limit=5))
    mock.get(f"{SCHED}/audit", json={"events": [an_event(i) for i in (1498, 1497)], "next_before": 1497},
             match=query(limit=3, before=1499))
    mock.get(f"{SCHED}/audit", json={"events": [an_event(1496)], "next_before": 1496},
             match=query(limit=1, before=1497))
    result = corral("audit", "--limit", "5", "--json")
    assert result.exit_code == 0, result.output
    assert [e["id"] for e in json.loads(result.stdout)] == [1500, 1499, 1498, 1497, 1496]
    assert len(mock.calls) == 3


@pytest.mark.slow
def test_audit_asks_pages_of_at_most_1000_and_says_when_there_are_more(mock):
    mock.get(f"{SCHED}/audit", json={"events": [an_event(i) for i in range(3000, 2000, -1)], "next_before": 2001},
             match=query(limit=1000))
    mock.get(f"{SCHED}/audit", json={"events": [an_event(i) for i in range(2000, 1500, -1)], "next_before": 1501},
             match=query(limit=500, before=2001))
    result = corral("audit", "--limit", "1500")
    assert result.exit_code == 0
    assert len(result.stdout.splitlines()) == 1 + 1500
    assert result.stderr == "(more events: --limit above 1500)\n"


def test_audit_stops_at_the_last_page_and_on_a_repeated_cursor(mock):
    mock.get(f"{SCHED}/audit", json={"events": [an_event(3)], "next_before": 3}, match=query(limit=100))
    mock.get(f"{SCHED}/audit", json={"events": [an_event(3)], "next_before": 3}, match=query(limit=99, before=3))
    assert len(json.loads(corral("audit", "--json").stdout)) == 2
    assert len(mock.calls) == 2


def test_no_events(mock):
    mock.get(f"{SCHED}/audit", json={"events": [], "next_before": None})
    result = corral("audit")
    assert result.exit_code == 0 and result.stdout == "" and result.stderr == "no events\n"


def test_a_bad_time_is_refused_before_anything_is_sent(mock):
    assert one_line_error(corral("audit", "--since", "yesterday"), code=2).startswith("corral: --since 'yesterday'")


def test_a_scheduler_without_the_audit_log_says_it_may_be_older(mock):
    mock.get(f"{SCHED}/audit", json={"error": "no such resource"}, status=404)
    assert one_line_error(corral("audit")) == "corral: no such resource (the server may be older than this corral)"
