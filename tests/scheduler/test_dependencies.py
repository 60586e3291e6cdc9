"""The pure rules of job dependencies."""
import pytest

from corral.scheduler.dependencies import cancels, outcome


@pytest.mark.parametrize("condition, status, expected", [
    ("done", "done", "met"), ("done", "failed", "unmeetable"), ("done", "cancelled", "unmeetable"),
    ("failed", "failed", "met"), ("failed", "done", "unmeetable"), ("failed", "cancelled", "unmeetable"),
    ("finished", "done", "met"), ("finished", "failed", "met"), ("finished", "cancelled", "met"),
    ("done", "pending", None), ("finished", "running", None), ("failed", "pending", None),
])
def test_each_condition_against_each_status(condition, status, expected):
    assert outcome(condition, status) == expected


def test_an_unmeetable_condition_cancels_unless_the_job_runs_anyway():
    assert cancels("unmeetable", "cancel") and not cancels("unmeetable", "run")
    assert not cancels("met", "cancel")
