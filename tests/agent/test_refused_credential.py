"""An agent whose credential the control plane refuses (401/403) says what to do in an
ERROR line and backs off (1 s doubling to 60 s) instead of retrying at its usual pace;
the first accepted call brings the usual pace back (agent/refusals.py)."""
import logging
import re
import types
from datetime import datetime

import pytest
import requests

from cluster import Cluster
from helpers import wait_for

from corral.agent.membership import Membership
from corral.agent.refusals import REFUSED_CAP_SECS
from corral.shared.clients import Rejected
from corral.shared.credentials import node_token

OPERATOR = "refused-test-operator-token-0123"
SECRET = "refused-test-agent-secret-456789"
TOKENS = {"CORRAL_API_TOKEN": OPERATOR, "CORRAL_AGENT_TOKEN": SECRET}
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}", "Content-Type": "application/json"}


class Waits:
    """A stop event that records each wait and stops the loop after `limit` of them."""

    def __init__(self, limit: int):
        self.delays: list[float] = []
        self.limit = limit

    def is_set(self) -> bool:
        return len(self.delays) >= self.limit

    def wait(self, delay: float) -> bool:
        self.delays.append(delay)
        return self.is_set()


def membership(token: str | None = "n1.token") -> Membership:
    settings = types.SimpleNamespace(node_id="n1", token=token, heartbeat_interval=0.5, long_poll_secs=20.0)
    jobs = types.SimpleNamespace(snapshot=lambda: [])
    return Membership(settings, None, None, jobs, lambda *a: True, lambda: 0.0, dict, lambda: False)


def test_refused_beats_back_off_to_a_minute_and_the_usual_pace_comes_back(caplog):
    answers = [Rejected(401, "the bearer token is not valid")] * 8 + [None, None,
                                                                      Rejected(503, "busy"), None]

    def beat():
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    waits = Waits(12)
    with caplog.at_level(logging.INFO, logger="corral.agent"):
        membership().beat(waits, beat, "heartbeat")
    # Refused: 1 s doubling up to the cap; accepted: the interval again; another failure
    # is retried sooner than the interval, as before.
    assert waits.delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, REFUSED_CAP_SECS, REFUSED_CAP_SECS, 0.5, 0.5, 0.5, 0.5]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 8
    assert "corral-scheduler node-token n1" in errors[0].getMessage()
    assert "CORRAL_NODE_TOKEN" in errors[0].getMessage()
    assert "the registry refused node n1's credential" in errors[0].getMessage()
    assert any("accepts node n1's credential again" in r.getMessage() for r in caplog.records)


def test_an_agent_without_a_credential_is_told_to_get_one(caplog):
    waits = Waits(1)

    def beat():
        raise Rejected(401, "this endpoint needs a bearer token (Authorization: Bearer TOKEN)")

    with caplog.at_level(logging.ERROR, logger="corral.agent"):
        membership(token=None).beat(waits, beat, "lease renewal", server="scheduler")
    message = caplog.records[-1].getMessage()
    assert "the scheduler refused" in message and "has no node credential" in message, message


def _refusals(text: str, what: str) -> list[datetime]:
    """When each refused `what` was logged (the agent's log lines start with a timestamp)."""
    return [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            for m in re.finditer(rf"^(\S+ \S+) ERROR .*{re.escape(what)} refused: ", text, re.MULTILINE)]


@pytest.mark.e2e
def test_a_real_agent_with_a_refused_credential_says_what_to_do_and_spaces_its_tries_out(tmp_path):
    c = Cluster(tmp_path)
    try:
        c.start_registry(**TOKENS)
        c.start_scheduler(**TOKENS)
        revoked = c.start_agent("ref-1", CORRAL_NODE_TOKEN=node_token(SECRET, "ref-1"))
        wrong = c.start_agent("ref-2", CORRAL_NODE_TOKEN=node_token("another-cluster-secret-000", "ref-2"))
        wait_for(lambda: any(n["node_id"] == "ref-1" for n in requests.get(
            c.registry_url + "/nodes?status=healthy", headers=AS_OPERATOR, timeout=5).json()),
            timeout=60, message="ref-1 to register")
        answer = requests.post(f"{c.scheduler_url}/nodes/ref-1/credential/revoke", headers=AS_OPERATOR, timeout=30)
        assert answer.status_code == 200 and answer.json()["min_generation"] == 2, answer.text
        # Four refused heartbeats in a row are 1, 2 and 4 s apart (at the usual pace,
        # HEARTBEAT_INTERVAL_SECS=0.5, there would have been a dozen by then).
        wait_for(lambda: len(_refusals(revoked.output(), "heartbeat")) >= 4, timeout=60,
                 message="four refused heartbeats")
        times = _refusals(revoked.output(), "heartbeat")
        gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
        assert all(gap >= 0.9 * 2 ** i for i, gap in enumerate(gaps[:3])), gaps
        text = revoked.output()
        assert "`corral-scheduler node-token ref-1` (with `--generation N`" in text, text[-3000:]
        assert "ref-1' (generation 1) was revoked" in text, text[-3000:]
        # A credential of another cluster is refused from the first registration on.
        wait_for(lambda: len(_refusals(wrong.output(), "registering node ref-2")) >= 2, timeout=60,
                 message="ref-2's refused registrations")
        assert "corral-scheduler node-token ref-2" in wrong.output()
        assert SECRET not in revoked.output() + wrong.output()
    finally:
        c.stop()
