"""Bounded answers: a page of GET /jobs stops at a byte budget (always one job at
least) and says where to go on with `Link: rel="next"`; jobs keep their full shape."""
from urllib.parse import parse_qs, urlsplit

import pytest

from corral.scheduler import pages
from corral.scheduler.app import create_app
from corral.scheduler.settings import SchedulerSettings


def items(*sizes):
    return [(f"job-{i + 1}", b"x" * size) for i, size in enumerate(sizes)]


def test_a_page_stops_before_the_item_that_would_pass_the_budget():
    page = pages.cut(iter(items(40, 40, 40)), limit=10, max_bytes=100)
    assert (len(page.items), page.next_after) == (2, "job-2")  # 2 + 40 + 1 + 40 = 83; a third: 124
    assert len(page.body()) <= 100 and page.body() == b"[" + b"x" * 40 + b"," + b"x" * 40 + b"]"


def test_the_first_item_is_kept_however_large():
    page = pages.cut(iter(items(500, 10)), limit=10, max_bytes=100)
    assert (len(page.items), page.next_after) == (1, "job-1")


def test_a_full_page_may_have_more_and_a_short_one_is_the_last():
    assert pages.cut(iter(items(1, 1, 1)), limit=3, max_bytes=100).next_after == "job-3"
    assert pages.cut(iter(items(1, 1)), limit=3, max_bytes=100).next_after is None
    assert pages.cut(iter([]), limit=3, max_bytes=100) == pages.Page([], None)


def test_items_past_the_cut_are_never_read():
    read = []

    def encoded():
        for item in items(60, 60, 60, 60):
            read.append(item[0])
            yield item
    pages.cut(encoded(), limit=10, max_bytes=100)
    assert read == ["job-1", "job-2"]  # the one that did not fit, and nothing after it


@pytest.fixture
def client(database_url):
    settings = SchedulerSettings(database_url=database_url, page_max_bytes=256 * 1024)
    return create_app(settings).test_client()


def test_large_jobs_are_listed_in_pages_under_the_budget_and_whole(client):
    big = {f"V{i}": "v" * 30_000 for i in range(3)}  # about 90 KB of env_vars a job
    for _ in range(7):
        assert client.post("/jobs", json={"command": "true", "env_vars": big}).status_code == 201
    seen, path, sizes = [], "/jobs?limit=1000", []
    while path:
        response = client.get(path)
        assert response.status_code == 200
        sizes.append(len(response.data))
        page = response.json
        assert all(job["env_vars"] == big for job in page)  # never truncated
        seen += [job["job_id"] for job in page]
        link = response.headers.get("Link")
        path = None
        if link:
            url = link.split(";")[0].strip("<>")
            assert parse_qs(urlsplit(url).query)["limit"] == ["1000"]
            path = url
    assert seen == [f"job-{i}" for i in range(1, 8)]
    assert max(sizes) <= 256 * 1024 and len(sizes) >= 3


def test_one_job_over_the_budget_still_comes_alone(client):
    huge = {f"V{i}": "v" * 30_000 for i in range(12)}  # about 360 KB: more than the budget
    client.post("/jobs", json={"command": "true", "env_vars": huge})
    client.post("/jobs", json={"command": "true"})
    first = client.get("/jobs")
    assert [j["job_id"] for j in first.json] == ["job-1"] and first.json[0]["env_vars"] == huge
    assert "after=job-1" in first.headers["Link"]
    second = client.get("/jobs?after=job-1")
    assert [j["job_id"] for j in second.json] == ["job-2"] and "Link" not in second.headers
