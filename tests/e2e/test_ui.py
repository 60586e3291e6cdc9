"""The dashboard at /ui, end to end in a real browser.

Headless Chromium from Debian's packages (`chromium`, `chromium-driver`; .ci/run
installs them) is driven by Selenium against a real cluster (gunicorn registry
and scheduler, a real agent). Selenium is pointed at /usr/bin/chromium and
/usr/bin/chromedriver explicitly, and its Selenium Manager (which downloads
browsers and drivers) is made to fail if anything calls it. Every wait is a
WebDriverWait or wait_for deadline on a condition.

Screenshots go to the test's tmp dir and, when CORRAL_SCREENSHOT_DIR is set,
there as well (ui-<test>.png).
"""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import requests

import schedule_support
from cluster import Cluster, one_node_cluster
from corral.shared.timeutil import epoch
from helpers import wait_for
from paths import REPO

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
NODE = "ui-node-1"
WAIT_SECS = 30
OPERATOR_TOKEN = "ui-operator-token-0123456789"
AGENT_TOKEN = "ui-agent-token-0123456789"
STATIC_FILES = ("index.html", "dashboard.js", "dashboard.css")


def _missing_browser() -> str | None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        return (f"{' and '.join(missing)} missing: apt-get install --no-install-recommends "
                f"chromium chromium-driver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


needs_browser = pytest.mark.skipif(_missing_browser() is not None, reason=_missing_browser() or "")


# ---- the static files ship with the package ----------------------------------------

@pytest.mark.slow
def test_a_normal_install_serves_the_dashboard(tmp_path):
    """setup.cfg's package_data puts static/ into the package as built for a wheel
    (build_py is that step), and the built package serves the page from there."""
    build = tmp_path / "build"
    subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py",
                    "-d", str(build)], cwd=REPO, check=True, capture_output=True, timeout=120)
    for name in STATIC_FILES:
        assert (build / "corral" / "scheduler" / "static" / name).is_file(), f"{name} is not in the package"
    script = (
        "import sys, corral.scheduler\n"
        "from corral.scheduler.app import create_app\n"
        "from corral.scheduler.settings import SchedulerSettings\n"
        "assert corral.scheduler.__file__.startswith(sys.argv[1]), corral.scheduler.__file__\n"
        "client = create_app(SchedulerSettings(database_url='sqlite:///' + sys.argv[2])).test_client()\n"
        "for path in ('/ui', '/ui/dashboard.js', '/ui/dashboard.css'):\n"
        "    response = client.get(path)\n"
        "    assert response.status_code == 200 and response.data, (path, response.status_code)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "DATABASE_URL"))}
    env["PYTHONPATH"] = str(build)
    subprocess.run([sys.executable, "-c", script, str(build), str(tmp_path / "s.db")], cwd=str(tmp_path),
                   env=env, check=True, timeout=60)


def test_the_shell_is_static_and_locked_down(tmp_path):
    from corral.scheduler.app import create_app
    from corral.scheduler.settings import SchedulerSettings
    client = create_app(SchedulerSettings(database_url=f"sqlite:///{tmp_path}/s.db")).test_client()
    page = client.get("/ui")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert client.get("/ui/dashboard.js").mimetype == "text/javascript"
    assert client.get("/ui/dashboard.css").mimetype == "text/css"
    # Nothing is fetched from elsewhere: no build step, no CDN.
    for name in STATIC_FILES:
        text = client.get("/ui" if name == "index.html" else f"/ui/{name}").get_data(as_text=True)
        assert "http://" not in text and "https://" not in text, name


# ---- GET /nodes, the dashboard's node list ------------------------------------------

def test_nodes_show_health_drain_slots_used_and_last_heartbeat(tmp_path):
    from corral.scheduler.app import create_app
    from corral.scheduler.settings import SchedulerSettings
    now = 1_800_000_000.0
    app = create_app(SchedulerSettings(database_url=f"sqlite:///{tmp_path}/s.db", max_jobs_per_node=2),
                     clock=lambda: now)
    client, store = app.test_client(), app.extensions["corral.store"]
    beat = "2027-01-15T08:00:00.250Z"
    store.nodes.sync_nodes([
        {"node_id": "ui-a", "address": "10.0.0.1", "kind": "compute", "slots": 4, "status": "healthy",
         "drained": False, "last_heartbeat": beat},
        {"node_id": "ui-b", "address": "10.0.0.2", "kind": "compute", "slots": 1, "status": "healthy",
         "drained": True, "last_heartbeat": beat},
        {"node_id": "ui-c", "address": "10.0.0.3", "kind": "compute", "slots": 1, "status": "unhealthy",
         "drained": True, "last_heartbeat": "not a time"},
    ], now)
    assert client.post("/jobs", json={"command": "true"}).json["node_id"] == "ui-a"  # the only one taking work
    nodes = client.get("/nodes").json
    assert [n["node_id"] for n in nodes] == ["ui-a", "ui-b", "ui-c"]
    a, b, c = nodes
    assert (a["status"], a["drained"], a["slots"], a["capacity"], a["slots_used"]) == ("healthy", False, 4, 2, 1)
    assert a["last_heartbeat"] == beat and a["address"] == "10.0.0.1"
    assert (b["status"], b["drained"], b["slots_used"]) == ("healthy", True, 0)
    assert (c["status"], c["drained"], c["last_heartbeat"]) == ("unhealthy", True, None)


# ---- the browser ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def ui_cluster(tmp_path_factory):
    # A sample a second, so that the charts follow the tests' jobs within one.
    with one_node_cluster(tmp_path_factory.mktemp("ui"), NODE, slots=2, STATS_INTERVAL_SECS=1) as c:
        yield c


@pytest.fixture(scope="module")
def browser(monkeypatch_module):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common import driver_finder

    def no_selenium_manager(*args, **kwargs):
        raise AssertionError("Selenium Manager must not run: it would download a browser or driver")

    # Service(executable_path=...) already skips it; this makes sure nothing else calls it.
    monkeypatch_module.setattr(driver_finder.SeleniumManager, "binary_paths", no_selenium_manager)
    profile = tempfile.mkdtemp(prefix="corral-ui-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,1000", f"--user-data-dir={profile}", "--no-first-run",
                 "--disable-background-networking", "--disable-extensions"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def wait(driver, condition, message: str, timeout: float = WAIT_SECS):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition, message=message)


def css(driver, selector: str):
    from selenium.webdriver.common.by import By
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0] if found else None


def read(driver, selector: str, what):
    """`what(element)` for the first element `selector` finds; None when there is none.
    Read again when the page redrew the element between finding and reading it."""
    from selenium.common.exceptions import StaleElementReferenceException

    def attempt(d):
        element = css(d, selector)
        try:
            return (what(element) if element is not None else None,)
        except StaleElementReferenceException:
            return False

    return wait(driver, attempt, f"a steady read of {selector}", timeout=10)[0]


def read_all(driver, selector: str, what) -> list:
    """`what(element)` for every element `selector` finds, read again when the page
    redrew them in between (it does whenever an event or a poll brings new data)."""
    from selenium.common.exceptions import StaleElementReferenceException

    def attempt(d):
        try:
            return [what(element) for element in css_all(d, selector)], True
        except StaleElementReferenceException:
            return None, False

    return wait(driver, lambda d: (lambda got: got if got[1] else None)(attempt(d)),
                f"a steady read of {selector}", timeout=10)[0]


def css_all(driver, selector: str):
    from selenium.webdriver.common.by import By
    return driver.find_elements(By.CSS_SELECTOR, selector)


def click(driver, selector: str) -> None:
    """Click the first element `selector` finds, found again if the page redrew it."""
    from selenium.common.exceptions import StaleElementReferenceException

    def attempt(d):
        try:
            d.find_element("css selector", selector).click()
            return True
        except StaleElementReferenceException:
            return False

    wait(driver, attempt, f"to click {selector}", timeout=10)


def text_of(driver, selector: str) -> str | None:
    return read(driver, selector, lambda element: element.text)


def attribute_of(driver, selector: str, name: str) -> str | None:
    return read(driver, selector, lambda element: element.get_attribute(name))


def mark_page(driver) -> None:
    """A value that lives as long as the page: gone after any reload."""
    driver.execute_script("window.corralTestMark = 'still here';")


def page_not_reloaded(driver) -> bool:
    return driver.execute_script("return window.corralTestMark") == "still here"


def screenshot(driver, tmp_path, name: str) -> str:
    path = str(tmp_path / f"ui-{name}.png")
    assert driver.save_screenshot(path), "the screenshot was not saved"
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("CORRAL_SCREENSHOT_DIR")
    if target:
        os.makedirs(target, exist_ok=True)
        shutil.copy(path, os.path.join(target, os.path.basename(path)))
    return path


def shows_an_error(driver, url: str, name: str, page: str) -> None:
    """`url` names something the scheduler does not have: the error banner names it, and
    the page for it stays hidden."""
    driver.get(url)
    wait(driver, lambda d: d.find_element("id", "error").is_displayed() and name in (text_of(d, "#error") or ""),
         f"the error banner naming {name}")
    assert not driver.find_element("id", page).is_displayed()


def open_ui(driver, cluster, fragment: str = "#/") -> None:
    driver.get(f"{cluster.scheduler_url}/ui{fragment}")
    wait(driver, lambda d: text_of(d, "#live") and text_of(d, "#live").startswith("live"),
         "the dashboard to load its data")


@pytest.mark.e2e
@needs_browser
def test_the_page_shows_counts_and_the_node(browser, ui_cluster, tmp_path):
    open_ui(browser, ui_cluster)
    wait(browser, lambda d: text_of(d, f'#nodes tr[data-node-id="{NODE}"] .status') == "healthy",
         f"{NODE} to be listed healthy")
    node_row = text_of(browser, f'#nodes tr[data-node-id="{NODE}"]')
    assert "0 / 1" in node_row or "1 / 1" in node_row, node_row  # slots used / MAX_JOBS_PER_NODE (1)
    assert "ago" in node_row  # its last heartbeat
    for status in ("all", "pending", "running", "done", "failed", "cancelled"):
        assert css(browser, f"#count-{status} .count") is not None, status
    assert browser.find_element("id", "token-form").is_displayed() is False
    screenshot(browser, tmp_path, "overview")


@pytest.mark.e2e
@needs_browser
def test_a_submitted_job_appears_and_turns_done_without_a_reload(browser, ui_cluster, tmp_path):
    open_ui(browser, ui_cluster)
    done_before = int(text_of(browser, "#count-done .count"))
    mark_page(browser)
    job = ui_cluster.submit(command="echo hello from the dashboard test", instance_id=NODE)
    row = f'#jobs tr[data-job-id="{job["job_id"]}"]'
    wait(browser, lambda d: css(d, row) is not None, f"{job['job_id']} to appear")
    wait(browser, lambda d: attribute_of(d, row, "data-status") == "done", f"{job['job_id']} to turn done")
    assert text_of(browser, f"{row} .status") == "done"
    wait(browser, lambda d: int(text_of(d, "#count-done .count") or -1) > done_before, "the done count to grow")
    assert page_not_reloaded(browser)
    assert ui_cluster.job(job["job_id"])["status"] == "done"

    # Its page: fields, events and output.
    click(browser, f"{row} a")
    wait(browser, lambda d: text_of(d, "#job-title") == job["job_id"], "the job page")
    wait(browser, lambda d: "hello from the dashboard test" in (text_of(d, "#job-stdout") or ""), "its output")
    assert text_of(browser, "#field-exit_code") == "0"
    assert (text_of(browser, "#field-ended_by"), text_of(browser, "#field-kill_signal")) == ("exit", "TERM")
    assert (text_of(browser, "#field-preemptible"), text_of(browser, "#field-preemptions")) == ("true", "0")
    assert len(css_all(browser, "#job-events tbody tr")) >= 3  # submitted, placed, ...
    assert page_not_reloaded(browser)
    screenshot(browser, tmp_path, "job-done")


def stream_state(driver) -> str | None:
    return attribute_of(driver, "#live", "data-stream")


def refreshed_by(driver) -> str | None:
    return attribute_of(driver, "#live", "data-refreshed-by")


@pytest.mark.e2e
@needs_browser
def test_the_page_follows_the_event_stream(browser, ui_cluster, tmp_path):
    """With GET /events open the page polls only every 5 s: a job that appears and turns
    done is drawn by refreshes that its events asked for."""
    open_ui(browser, ui_cluster)
    wait(browser, lambda d: stream_state(d) == "open", "the event stream to open")
    assert text_of(browser, "#live").startswith("live (events)")
    mark_page(browser)
    job = ui_cluster.submit(command="echo streamed", instance_id=NODE)
    row = f'#jobs tr[data-job-id="{job["job_id"]}"]'
    wait(browser, lambda d: attribute_of(d, row, "data-status") == "done" and refreshed_by(d) == "event",
         f"{job['job_id']} drawn done by a refresh an event asked for")
    assert page_not_reloaded(browser) and stream_state(browser) == "open"

    # A job's page is reloaded by that job's events: here, its cancel.
    sleeper = ui_cluster.submit(command="sleep 30", instance_id=NODE)
    browser.get(f"{ui_cluster.scheduler_url}/ui#/jobs/{sleeper['job_id']}")
    wait(browser, lambda d: text_of(d, "#job-title") == sleeper["job_id"], "the sleeping job's page")
    wait(browser, lambda d: text_of(d, "#field-status") == "running", "it to show running")
    cancelled = requests.post(f"{ui_cluster.scheduler_url}/jobs/{sleeper['job_id']}/cancel",
                              headers={"Content-Type": "application/json"}, timeout=10)
    assert cancelled.status_code == 200, cancelled.text
    wait(browser, lambda d: text_of(d, "#field-status") == "cancelled" and refreshed_by(d) == "event",
         "the cancel drawn by its event")
    assert text_of(browser, "#field-ended_by") == "cancel"
    screenshot(browser, tmp_path, "job-followed")


@pytest.mark.e2e
@needs_browser
def test_without_the_stream_the_page_polls(browser, tmp_path):
    """A scheduler with no thread for streams answers GET /events with a 503: the page
    says it polls, and still shows new jobs."""
    c = Cluster(tmp_path, EVENTS_STREAMS_MAX=0)  # streams have a budget of their own, apart from claims
    try:
        c.start()
        assert requests.get(c.scheduler_url + "/events", timeout=10).status_code == 503
        open_ui(browser, c)
        assert stream_state(browser) == "down"
        assert text_of(browser, "#live").startswith("live (polling)")
        job = c.submit(command="true")
        row = f'#jobs tr[data-job-id="{job["job_id"]}"]'
        wait(browser, lambda d: css(d, row) is not None, f"{job['job_id']} to appear")
        assert refreshed_by(browser) == "poll" and stream_state(browser) == "down"
    finally:
        c.stop()


@pytest.mark.e2e
@needs_browser
def test_filters_narrow_the_job_list(browser, ui_cluster):
    failed = ui_cluster.submit(command="exit 4", max_retries=0, instance_id=NODE)
    ui_cluster.wait_status(failed["job_id"], "failed", timeout=WAIT_SECS)
    done = ui_cluster.submit(command="true", instance_id=NODE)
    ui_cluster.wait_status(done["job_id"], "done", timeout=WAIT_SECS)
    open_ui(browser, ui_cluster)
    mark_page(browser)
    from selenium.webdriver.support.ui import Select
    # The list view shows once its first answer came (on a loaded machine, after the page).
    wait(browser, lambda d: d.find_element("id", "filter-status").is_displayed(), "the filters to show")
    Select(browser.find_element("id", "filter-status")).select_by_value("failed")
    wait(browser, lambda d: css(d, f'#jobs tr[data-job-id="{failed["job_id"]}"]') is not None
         and css(d, f'#jobs tr[data-job-id="{done["job_id"]}"]') is None, "only failed jobs to be listed")
    statuses = set(read_all(browser, "#jobs tbody tr", lambda row: row.get_attribute("data-status")))
    assert statuses == {"failed"}
    assert "status=failed" in browser.current_url
    Select(browser.find_element("id", "filter-type")).select_by_value("service")
    wait(browser, lambda d: text_of(d, "#jobs-empty") == "No jobs match.", "no service jobs to be listed")
    assert page_not_reloaded(browser)


@pytest.mark.e2e
@needs_browser
def test_cancelling_a_running_job_from_its_page(browser, ui_cluster, tmp_path):
    job = ui_cluster.submit(command="echo started, now waiting; sleep 60", instance_id=NODE)
    open_ui(browser, ui_cluster, f"#/jobs/{job['job_id']}")
    mark_page(browser)
    wait(browser, lambda d: text_of(d, "#job-status") == "running", f"{job['job_id']} to run")
    # Live output: the agent sends the tail while the job runs, and the page follows it.
    wait(browser, lambda d: "started, now waiting" in (text_of(d, "#job-stdout") or ""), "its output so far")
    assert text_of(browser, "#job-status") == "running"
    button = browser.find_element("id", "cancel-job")
    wait(browser, lambda d: button.is_enabled(), "the cancel button to be enabled")
    assert not browser.find_element("id", "retry-job").is_enabled()
    button.click()
    wait(browser, lambda d: text_of(d, "#job-status") == "cancelled", "the page to show cancelled")
    assert ui_cluster.job(job["job_id"])["status"] == "cancelled"
    wait(browser, lambda d: not d.find_element("id", "cancel-job").is_enabled(), "cancel to be disabled")
    assert "cancelled" in text_of(browser, "#job-events tbody")
    assert page_not_reloaded(browser)
    screenshot(browser, tmp_path, "job-cancelled")


@pytest.mark.e2e
@needs_browser
def test_retrying_a_failed_job_from_its_page(browser, ui_cluster, shared_dir):
    once = os.path.join(shared_dir, "failed-once")
    job = ui_cluster.submit(command=f"if [ -e {once} ]; then echo second try; else touch {once}; exit 3; fi",
                            max_retries=0, instance_id=NODE)
    ui_cluster.wait_status(job["job_id"], "failed", timeout=WAIT_SECS)
    open_ui(browser, ui_cluster, f"#/jobs/{job['job_id']}")
    wait(browser, lambda d: text_of(d, "#job-status") == "failed", "the page to show failed")
    assert text_of(browser, "#field-exit_code") == "3"
    mark_page(browser)
    button = browser.find_element("id", "retry-job")
    wait(browser, lambda d: button.is_enabled(), "the retry button to be enabled")
    button.click()
    wait(browser, lambda d: text_of(d, "#job-status") == "done", "the retried job to turn done")
    assert "second try" in text_of(browser, "#job-stdout")
    assert ui_cluster.job(job["job_id"])["status"] == "done"
    assert page_not_reloaded(browser)


# ---- charts: GET /stats/history drawn as SVG, and a node's page ----------------------------

def finished_in_the_hour(cluster) -> dict[str, int]:
    """Jobs finished by status in the samples of the last hour, as the API gives them."""
    samples = requests.get(cluster.scheduler_url + "/stats/history?nodes=none", timeout=10).json()["samples"]
    newest = epoch(samples[-1]["at"]) if samples else 0.0
    totals = {"done": 0, "failed": 0, "cancelled": 0}
    for sample in samples:
        # The chart's first minute is the first whole one within the hour.
        if epoch(sample["at"]) // 60 > (newest - 3600) // 60:
            for status in totals:
                totals[status] += sample["finished"][status]
    return totals


def finished_in_the_chart(driver) -> dict[str, int]:
    """The same, as the bars of the chart add up."""
    totals = {"done": 0, "failed": 0, "cancelled": 0}
    bars = read_all(driver, "#chart-finished rect[data-status]",
                    lambda bar: (bar.get_attribute("data-status"), int(bar.get_attribute("data-count"))))
    for status, count in bars:
        totals[status] += count
    return totals


def legend_value(driver, chart: str, series: str) -> str | None:
    return text_of(driver, f'#legend-{chart} [data-series="{series}"] .legend-value')


def cancel(cluster, *jobs) -> None:
    for job in jobs:
        requests.post(f"{cluster.scheduler_url}/jobs/{job['job_id']}/cancel",
                      headers={"Content-Type": "application/json"}, timeout=10)


@pytest.mark.e2e
@needs_browser
def test_the_charts_show_jobs_finished_pending_running_latency_and_node_usage(browser, ui_cluster, tmp_path):
    before = finished_in_the_hour(ui_cluster)
    done = [ui_cluster.submit(command="true", instance_id=NODE) for _ in range(3)]
    failed = ui_cluster.submit(command="exit 3", max_retries=0, instance_id=NODE)
    for job in done:
        ui_cluster.wait_status(job["job_id"], "done", timeout=WAIT_SECS)
    ui_cluster.wait_status(failed["job_id"], "failed", timeout=WAIT_SECS)
    wait_for(lambda: (lambda now: now["done"] >= before["done"] + 3 and now["failed"] >= before["failed"] + 1)(
        finished_in_the_hour(ui_cluster)), timeout=WAIT_SECS, message="a sample counting the test's jobs")
    # The node takes one job at a time (MAX_JOBS_PER_NODE 1): one runs, the next waits.
    running = ui_cluster.submit(command="sleep 60", instance_id=NODE)
    ui_cluster.wait_status(running["job_id"], "running", timeout=WAIT_SECS)
    waiting = ui_cluster.submit(command="true", instance_id=NODE)
    try:
        open_ui(browser, ui_cluster)
        mark_page(browser)
        # The bars add up to what the samples of the hour say, the test's jobs among them.
        wait(browser, lambda d: finished_in_the_chart(d) == finished_in_the_hour(ui_cluster),
             "the finished chart to show the samples' counts")
        shown = finished_in_the_chart(browser)
        assert shown["done"] >= before["done"] + 3 and shown["failed"] >= before["failed"] + 1
        assert legend_value(browser, "finished", "done") == f"{shown['done']} in the hour"
        # Pending and running: the latest sample's, as lines and in the legend.
        wait(browser, lambda d: legend_value(d, "queue", "running") == "1"
             and legend_value(d, "queue", "pending") == "1", "one running and one pending")
        assert int(attribute_of(browser, '#chart-queue path[data-series="running"]', "data-points")) >= 1
        # Dispatch latency: the test's jobs started, so there is a p50 and a p95.
        assert int(attribute_of(browser, '#chart-latency path[data-series="p50"]', "data-points")) >= 1
        p95 = legend_value(browser, "latency", "p95")
        assert p95.endswith((" ms", " s")), p95
        # Node usage now: the running job holds the node's one slot.
        slots = f'#chart-nodes [data-node-id="{NODE}"] g[data-resource="slots"]'
        wait(browser, lambda d: attribute_of(d, slots, "data-reserved") == "1", "the node's slot in use")
        assert attribute_of(browser, slots, "data-allocatable") == "1"
        assert "1 of 1" in text_of(browser, f"{slots} .usage-figures")
        browser.execute_script("document.getElementById('activity').scrollIntoView()")
        screenshot(browser, tmp_path, "overview-charts")
        assert page_not_reloaded(browser)
    finally:
        cancel(ui_cluster, running, waiting)


@pytest.mark.e2e
@needs_browser
def test_a_node_page_shows_its_details_usage_and_running_jobs(browser, ui_cluster, tmp_path):
    running = ui_cluster.submit(command="sleep 60", instance_id=NODE)
    ui_cluster.wait_status(running["job_id"], "running", timeout=WAIT_SECS)
    try:
        open_ui(browser, ui_cluster)
        mark_page(browser)
        wait(browser, lambda d: css(d, f'#nodes tr[data-node-id="{NODE}"] a') is not None, "the node list")
        click(browser, f'#nodes tr[data-node-id="{NODE}"] a')
        wait(browser, lambda d: text_of(d, "#node-title") == NODE, "the node page")
        assert "#/nodes/" + NODE in browser.current_url
        assert text_of(browser, "#node-status") == "healthy"
        assert text_of(browser, "#node-field-address") == "127.0.0.1"
        wait(browser, lambda d: css(d, f'#node-jobs tr[data-job-id="{running["job_id"]}"]') is not None,
             "its running job")
        assert "sleep 60" in text_of(browser, f'#node-jobs tr[data-job-id="{running["job_id"]}"]')
        assert attribute_of(browser, '#node-usage-now g[data-resource="slots"]', "data-reserved") == "1"
        # Its usage over time: a sample has seen the slot taken.
        wait(browser, lambda d: legend_value(d, "node-slots", "used") == "1", "the slot chart to show it used")
        assert int(attribute_of(browser, '#chart-node-slots path[data-series="used"]', "data-points")) >= 2
        assert legend_value(browser, "node-slots", "allocatable") == "1"
        assert int(attribute_of(browser, '#chart-node-memory path[data-series="reserved"]', "data-points")) >= 2
        screenshot(browser, tmp_path, "node")
        # Its jobs: the overview filtered by the node.
        browser.find_element("id", "node-jobs-link").click()
        wait(browser, lambda d: css(d, f'#jobs tr[data-job-id="{running["job_id"]}"]') is not None, "its jobs")
        assert f"node_id={NODE}" in browser.current_url
        assert page_not_reloaded(browser)
        # A node the scheduler does not know: the error, as on any page.
        shows_an_error(browser, f"{ui_cluster.scheduler_url}/ui#/nodes/no-such-node", "no-such-node", "node-page")
    finally:
        cancel(ui_cluster, running)


# ---- schedules: the list, a schedule's page, a scheduled job ----------------------------

@pytest.mark.e2e
@needs_browser
def test_schedules_are_listed_with_their_runs_and_a_scheduled_job_links_to_its_schedule(browser, ui_cluster,
                                                                                          tmp_path):
    url = ui_cluster.scheduler_url
    every, nightly = "ui-every-second", "ui-nightly"
    schedule_support.create(url, name=every, interval_secs=1, job={"command": "true"})
    schedule_support.create(url, name=nightly, cron="30 2 * * *", time_zone="Europe/Berlin", enabled=False,
                            job={"command": "true"})
    try:
        open_ui(browser, ui_cluster)
        mark_page(browser)
        every_row, nightly_row = (f'#schedules tr[data-schedule="{name}"]' for name in (every, nightly))
        wait(browser, lambda d: css(d, f"{every_row} .last-run a.run-job") is not None,
             f"{every} to show its last run's job")
        assert text_of(browser, f"{every_row} .last-run .status") in ("pending", "running", "done")
        assert attribute_of(browser, f"{every_row} .last-run a.run-job", "href").split("#")[1].startswith("/jobs/job-")
        assert text_of(browser, f"{every_row} .when") == "every 1 s"
        assert text_of(browser, f"{every_row} .enabled") == "yes"
        assert text_of(browser, f"{every_row} .overlap") == "allow"
        assert "ago" in text_of(browser, f"{every_row} .last-run")  # its slot
        assert attribute_of(browser, f"{every_row} .next-run span[title]", "title").endswith("Z")  # UTC as tooltip
        # Disabled: no next run; never run.
        assert text_of(browser, f"{nightly_row} .when") == "30 2 * * * (Europe/Berlin)"
        assert text_of(browser, f"{nightly_row} .enabled") == "no"
        assert text_of(browser, f"{nightly_row} .next-run") == "—"
        assert text_of(browser, f"{nightly_row} .last-run") == "—"
        assert not browser.find_element("id", "schedules-empty").is_displayed()
        screenshot(browser, tmp_path, "overview-schedules")

        # Its page: the definition and the runs, each slot a second after the one before.
        click(browser, f"{every_row} .name a")
        wait(browser, lambda d: text_of(d, "#schedule-title") == every, "the schedule page")
        assert text_of(browser, "#schedule-state") == "enabled"
        assert text_of(browser, "#schedule-field-interval_secs") == "1"
        assert text_of(browser, "#schedule-field-overlap") == "allow"
        assert '"command": "true"' in text_of(browser, "#schedule-field-job")
        run_rows = "#schedule-runs tbody tr[data-job-id]"
        wait(browser, lambda d: len(d.find_elements("css selector", run_rows)) >= 3, "three runs with jobs")
        wait(browser, lambda d: css(d, "#schedule-runs tbody .status.done") is not None, "a run whose job is done")
        slots = [epoch(slot) for slot in read_all(browser, run_rows, lambda row: row.get_attribute("data-slot"))]
        assert [newer - older for newer, older in zip(slots, slots[1:])] == [1.0] * (len(slots) - 1), slots
        assert page_not_reloaded(browser)
        screenshot(browser, tmp_path, "schedule")

        # A run's job: its page names the schedule (a link back) and the slot.
        job_id, slot = read_all(browser, run_rows, lambda row: (row.get_attribute("data-job-id"),
                                                                row.get_attribute("data-slot")))[0]
        click(browser, f'{run_rows}[data-job-id="{job_id}"] a')
        wait(browser, lambda d: text_of(d, "#job-title") == job_id, "the scheduled job's page")
        assert text_of(browser, "#sched-schedule") == f"{every}, slot {slot}"
        assert ui_cluster.job(job_id)["schedule"] == every
        click(browser, "#sched-schedule a")
        wait(browser, lambda d: text_of(d, "#schedule-title") == every, "back to the schedule page")

        # Disabled, it has no next run; the page follows without a reload.
        schedule_support.disable(url, every)
        wait(browser, lambda d: text_of(d, "#schedule-state") == "disabled", "the page to show it disabled")
        assert text_of(browser, "#schedule-field-next_run_at") == "—"
        assert page_not_reloaded(browser)

        # A schedule that is not there: the error, as on any page.
        shows_an_error(browser, f"{url}/ui#/schedules/no-such-schedule", "no-such-schedule", "schedule-page")
    finally:
        # The jobs it made stay; no more come for the tests after this one.
        for name in (every, nightly):
            requests.delete(f"{url}/schedules/{name}", headers={"Content-Type": "application/json"}, timeout=10)


# ---- scheduling: why a job waits, what nodes reserve -------------------------------------

POOL_NODE = "ui-pool-node"


@pytest.mark.e2e
@needs_browser
def test_a_pending_job_shows_why_it_waits_and_nodes_show_what_they_reserve(browser, tmp_path):
    c = Cluster(tmp_path, MAX_JOBS_PER_NODE=2)  # room for the waiting job: only its constraint keeps it off
    try:
        c.start()
        # 16,384 MB less 1,024 kept for the system: 15,360 MB allocatable.
        c.start_agent(POOL_NODE, slots=2, AGENT_LABELS="pool=batch,zone=b", AGENT_MAX_MEMORY_MB=16384,
                      AGENT_RESERVED_MEMORY_MB=1024, AGENT_MAX_CPU_PERCENT=400)
        c.wait_nodes_healthy(POOL_NODE)
        running = c.submit(command="sleep 60", memory_mb=3072, cpu_percent=100)
        c.wait_status(running["job_id"], "running", timeout=WAIT_SECS)
        waiting = c.submit(command="true", priority=80, pool="batch",
                           constraints=[{"label": "zone", "op": "=", "value": "a"}])
        reason = wait_for(lambda: c.job(waiting["job_id"])["pending_reason"] if (
            c.job(waiting["job_id"])["pending_reason"] or {}).get("code") == "constraints_unmet" else None,
            timeout=WAIT_SECS, message="the scheduler to find no node meets zone = a")

        open_ui(browser, c)
        mark_page(browser)
        node_row = f'#nodes tr[data-node-id="{POOL_NODE}"]'
        wait(browser, lambda d: text_of(d, f"{node_row} .memory .resource-reserved") == "reserved 3,072 of 15,360 MB",
             "the node's reserved and allocatable memory")
        assert text_of(browser, f"{node_row} .cpu .resource-reserved") == "reserved 100% of 400%"
        assert text_of(browser, f"{node_row} .pool") == "batch"
        labels = read_all(browser, f"{node_row} .label", lambda e: e.text)
        assert labels == ["pool=batch", "zone=b"]

        job_row = f'#jobs tr[data-job-id="{waiting["job_id"]}"]'
        wait(browser, lambda d: attribute_of(d, job_row, "data-reason") == "constraints_unmet", "the job's reason")
        assert text_of(browser, f"{job_row} .reason-code") == "constraints_unmet"
        assert attribute_of(browser, f"{job_row} .reason", "title") == reason["message"]
        assert text_of(browser, f'#jobs tr[data-job-id="{running["job_id"]}"] .waiting') == "—"
        screenshot(browser, tmp_path, "overview-scheduling")
        # Its code lists the jobs that wait for the same reason.
        click(browser, f"{job_row} a.reason-code")
        wait(browser, lambda d: css(d, f'#jobs tr[data-job-id="{running["job_id"]}"]') is None,
             "only the jobs waiting for constraints_unmet to be listed")
        assert "pending_reason=constraints_unmet" in browser.current_url
        assert css(browser, job_row) is not None
        assert attribute_of(browser, "#filter-reason", "value") == "constraints_unmet"

        # Its page: the whole reason, its scheduling fields, and the node that came closest.
        click(browser, f"{job_row} a")
        wait(browser, lambda d: text_of(d, "#job-title") == waiting["job_id"], "the job page")
        assert text_of(browser, "#job-reason-code") == "constraints_unmet"
        assert text_of(browser, "#job-reason-message") == reason["message"] == "no healthy node satisfies zone = a"
        assert text_of(browser, "#reason-constraint") == "zone = a"
        assert text_of(browser, "#sched-priority") == "80"
        assert text_of(browser, "#sched-pool") == "batch"
        assert text_of(browser, "#sched-constraints") == "zone = a"
        assert text_of(browser, "#sched-run_at") == "—"
        assert text_of(browser, "#sched-reserved") == "nothing (not placed)"
        why_row = f'#job-why-nodes tr[data-node-id="{POOL_NODE}"]'
        wait(browser, lambda d: css(d, why_row) is not None, "the closest nodes")
        assert read_all(browser, f"{why_row} li", lambda e: e.text) == [
            "zone = a (the node has zone=b)"]
        assert page_not_reloaded(browser)
        screenshot(browser, tmp_path, "job-waiting")

        # A job that waits for another links to it, with its condition and its key.
        follower = c.submit(command="true", concurrency_key="nightly",
                            depends_on=[{"job_id": running["job_id"], "condition": "finished"}])
        open_ui(browser, c, f"#/jobs/{follower['job_id']}")
        wait(browser, lambda d: text_of(d, "#sched-depends_on")
             == f"{running['job_id']} (finished); cancelled if one cannot hold", "the job it waits for")
        assert text_of(browser, "#sched-concurrency_key") == "nightly"
        assert text_of(browser, "#sched-array") == "—"
        assert text_of(browser, "#job-reason-code") == "dependency"

        # A running job has no reason, and shows what it reserves.
        click(browser, "#sched-depends_on a")
        wait(browser, lambda d: text_of(d, "#job-title") == running["job_id"], "the page of the job it waits for")
        wait(browser, lambda d: text_of(d, "#sched-reserved") == "3,072 MB, 100% CPU", "what the job reserves")
        assert not browser.find_element("id", "job-waiting").is_displayed()
    finally:
        c.stop()


# ---- GPUs and other countable resources ---------------------------------------------------

GPU_NODE, CPU_NODE = "ui-gpu-node", "ui-cpu-node"
A100, A100_MIG = "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
UI_GPUS = [{"index": "0", "uuid": "GPU-5fd4c4a2-0e3b-8d7a-1c2f-3b4a5c6d7e80", "model": A100, "memory_mb": 81920},
           {"index": "1", "uuid": "GPU-5fd4c4a2-0e3b-8d7a-1c2f-3b4a5c6d7e81", "model": A100, "memory_mb": 81920},
           {"index": "2:1", "uuid": "MIG-4b1a2c3d-0e3b-8d7a-1c2f-3b4a5c6d7e82", "model": A100_MIG, "memory_mb": 4864}]


def register_node(cluster, node_id: str, **fields) -> None:
    """Register a node with the registry as its agent would (there is no agent: nothing
    claims what is placed there, so a job placed on it keeps its devices reserved)."""
    response = requests.post(cluster.registry_url + "/nodes", timeout=10,
                             json={"node_id": node_id, "address": "10.0.0.8", "slots": 4, **fields})
    assert response.status_code in (200, 201), response.text


@pytest.mark.e2e
@needs_browser
def test_a_node_with_gpus_shows_each_device_the_job_holding_it_and_its_resources(browser, tmp_path):
    # A heartbeat timeout longer than the test: the registered nodes stay healthy without heartbeats.
    c = Cluster(tmp_path, MAX_JOBS_PER_NODE=4, HEARTBEAT_TIMEOUT_SECS=600)
    try:
        c.start()
        register_node(c, GPU_NODE, gpus=UI_GPUS, resources={"fpga": 2, "licence.matlab": 4})
        register_node(c, CPU_NODE)
        c.wait_nodes_healthy(GPU_NODE, CPU_NODE)
        # The scheduler copies the registry's devices with the node list (every NODE_REFRESH_SECS).
        wait_for(lambda: any(n["node_id"] == GPU_NODE and len(n["gpus"]) == 3
                             for n in requests.get(c.scheduler_url + "/nodes", timeout=10).json()),
                 timeout=WAIT_SECS, message="the scheduler to list the node's GPUs")
        # 40,960 MB or more each: the two whole A100s, not the MIG instance (an A100 too, of 4,864 MB).
        job = c.submit(command="train", gpus=2, gpu_model="a100", gpu_memory_mb=40960, resources={"fpga": 1})
        placed = wait_for(lambda: (lambda j: j if j["gpus_assigned"] else None)(c.job(job["job_id"])),
                          timeout=WAIT_SECS, message="the GPU job to be placed with its devices")
        assert placed["node_id"] == GPU_NODE
        assert sorted(placed["gpus_assigned"]) == [g["uuid"] for g in UI_GPUS[:2]]
        plain = c.submit(command="true", instance_id=CPU_NODE)

        # The node list: GPUs in use and free, their models and memory; resources reserved of declared.
        open_ui(browser, c)
        mark_page(browser)
        gpu_row, cpu_row = (f'#nodes tr[data-node-id="{node}"]' for node in (GPU_NODE, CPU_NODE))
        wait(browser, lambda d: text_of(d, f"{gpu_row} .gpu-count") == "2 in use, 1 free", "the node's GPUs in use")
        assert read_all(browser, f"{gpu_row} .gpu-model", lambda e: e.text) == [
            f"2 × {A100} (81,920 MB)", f"1 × {A100_MIG} (4,864 MB)"]
        assert read_all(browser, f"{gpu_row} .countable", lambda e: e.text) == [
            "fpga: 1 of 2 reserved", "licence.matlab: 0 of 4 reserved"]
        tooltip = attribute_of(browser, f"{gpu_row} .gpus-summary", "title")
        assert f"0 {UI_GPUS[0]['uuid']}: {job['job_id']}" in tooltip and f"2:1 {UI_GPUS[2]['uuid']}: free" in tooltip
        assert (text_of(browser, f"{cpu_row} .gpus"), text_of(browser, f"{cpu_row} .countables-cell")) == ("—", "—")
        # Node usage now: a bar of GPUs for the node that has them, none for the other.
        gpu_bar = f'#chart-nodes [data-node-id="{GPU_NODE}"] g[data-resource="gpus"]'
        assert (attribute_of(browser, gpu_bar, "data-reserved"), attribute_of(browser, gpu_bar, "data-allocatable")) \
            == ("2", "3")
        assert css(browser, f'#chart-nodes [data-node-id="{CPU_NODE}"] g[data-resource="gpus"]') is None
        browser.execute_script("document.getElementById('nodes-section').scrollIntoView()")
        screenshot(browser, tmp_path, "overview-gpus")

        # Its page: each device with the job it is reserved for, or free; each resource.
        click(browser, f"{gpu_row} a")
        wait(browser, lambda d: text_of(d, "#node-title") == GPU_NODE, "the GPU node's page")
        wait(browser, lambda d: len(css_all(d, "#node-gpus tbody tr")) == 3, "its three devices")
        assert text_of(browser, "#node-field-gpus") == "2 reserved of 3"
        assert read_all(browser, "#node-gpus tbody tr", lambda tr: [td.text for td in tr.find_elements(
            "css selector", "td")]) == [
            ["0", A100, "81,920 MB", UI_GPUS[0]["uuid"], job["job_id"]],
            ["1", A100, "81,920 MB", UI_GPUS[1]["uuid"], job["job_id"]],
            ["2:1", A100_MIG, "4,864 MB", UI_GPUS[2]["uuid"], "free"]]
        assert read_all(browser, "#node-resources tbody tr", lambda tr: [td.text for td in tr.find_elements(
            "css selector", "td")]) == [["fpga", "2", "1", "1"], ["licence.matlab", "4", "0", "4"]]
        assert read_all(browser, "#node-field-resources .countable", lambda e: e.text) == [
            "fpga: 1 of 2 reserved", "licence.matlab: 0 of 4 reserved"]
        assert not shown(browser, "#node-gpus-empty") and not shown(browser, "#node-resources-empty")
        browser.execute_script("document.getElementById('node-usage-now').scrollIntoView()")
        screenshot(browser, tmp_path, "node-gpus")

        # The job holding them: what it asks for and the devices reserved for it.
        click(browser, f'#node-gpus tr[data-uuid="{UI_GPUS[0]["uuid"]}"] .holder a')
        wait(browser, lambda d: text_of(d, "#job-title") == job["job_id"], "the GPU job's page")
        assert text_of(browser, "#sched-gpus") == "2, model contains a100, at least 40,960 MB each"
        assert text_of(browser, "#sched-resources") == "fpga: 1"
        assert sorted(read_all(browser, "#sched-gpus_assigned .gpu-uuid", lambda e: e.text)) == [
            g["uuid"] for g in UI_GPUS[:2]]
        assert (text_of(browser, "#field-gpus"), text_of(browser, "#field-gpu_model")) == ("2", "a100")
        assert page_not_reloaded(browser)
        screenshot(browser, tmp_path, "job-gpus")

        # A node and a job without any: none shown, no empty tables.
        open_ui(browser, c, "#/nodes/" + CPU_NODE)
        wait(browser, lambda d: text_of(d, "#node-title") == CPU_NODE, "the other node's page")
        assert (text_of(browser, "#node-field-gpus"), text_of(browser, "#node-field-resources")) == ("none", "none")
        assert shown(browser, "#node-gpus-empty") and not shown(browser, "#node-gpus")
        assert shown(browser, "#node-resources-empty") and not shown(browser, "#node-resources")
        assert css(browser, '#node-usage-now g[data-resource="gpus"]') is None
        open_ui(browser, c, f"#/jobs/{plain['job_id']}")
        wait(browser, lambda d: text_of(d, "#job-title") == plain["job_id"], "the plain job's page")
        assert [text_of(browser, f"#sched-{name}") for name in ("gpus", "resources", "gpus_assigned")] == [
            "none", "none", "none"]
    finally:
        c.stop()


# ---- with an operator token ------------------------------------------------------------

@pytest.mark.e2e
@needs_browser
def test_the_page_asks_for_the_operator_token_and_sends_it_as_a_header(browser, tmp_path):
    tokens = {"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": AGENT_TOKEN}
    c = Cluster(tmp_path, **tokens)
    try:
        c.start_registry(**tokens)
        c.start_scheduler()
        assert requests.get(c.scheduler_url + "/stats", timeout=10).status_code == 401
        browser.get(f"{c.scheduler_url}/ui#/")
        wait(browser, lambda d: d.find_element("id", "token-form").is_displayed(), "the token form")
        browser.find_element("id", "token-input").send_keys("not-the-token-at-all")
        click(browser, "#token-form button[type=submit]")
        wait(browser, lambda d: text_of(d, "#token-error") == "That token was refused.", "a refused token")
        browser.find_element("id", "token-input").send_keys(OPERATOR_TOKEN)
        click(browser, "#token-form button[type=submit]")
        wait(browser, lambda d: (text_of(d, "#live") or "").startswith("live"), "the data with the token")
        # The event stream sends the token as a header too (GET /events needs it).
        wait(browser, lambda d: stream_state(d) == "open", "the event stream with the token")
        assert not browser.find_element("id", "token-form").is_displayed()
        assert css(browser, "#count-all .count") is not None
        assert OPERATOR_TOKEN not in browser.current_url
        assert browser.execute_script("return sessionStorage.getItem('corral.token')") == OPERATOR_TOKEN
        assert browser.execute_script("return localStorage.length") == 0
    finally:
        browser.execute_script("sessionStorage.clear()")
        c.stop()


# ---- users, teams, personal tokens ------------------------------------------------------

TOKENS = {"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": AGENT_TOKEN}


@pytest.fixture(scope="module")
def accounts_cluster(tmp_path_factory):
    """A scheduler with the cluster's tokens, so that personal tokens mean something (no
    node: the tests' jobs wait, which is all a list needs)."""
    c = Cluster(tmp_path_factory.mktemp("ui-accounts"), **TOKENS)
    try:
        c.start_registry(**TOKENS)
        c.start_scheduler()
        yield c
    finally:
        c.stop()


def call(cluster, method: str, path: str, token: str = OPERATOR_TOKEN, expect: int = 200, **kwargs):
    """The scheduler's API with a bearer token, answering `expect`."""
    response = requests.request(method, cluster.scheduler_url + path, timeout=10,
                                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                                **kwargs)
    assert response.status_code == expect, (method, path, response.status_code, response.text)
    return response.json() if response.content else None


def personal_token(cluster, user: str) -> str:
    return call(cluster, "POST", "/tokens", json={"name": "ui-test", "user": user}, expect=201)["token"]


def sign_in(driver, cluster, token: str, fragment: str = "#/") -> None:
    """Open the page in a tab with no token yet, and give it `token` in the form."""
    driver.get(f"{cluster.scheduler_url}/ui{fragment}")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    wait(driver, lambda d: d.find_element("id", "token-form").is_displayed(), "the token form")
    assert "your token" in text_of(driver, "#token-form").lower()
    driver.find_element("id", "token-input").send_keys(token)
    click(driver, "#token-form button[type=submit]")
    wait(driver, lambda d: (text_of(d, "#live") or "").startswith("live"), "the data with the token")


def shown(driver, selector: str) -> bool:
    return read(driver, selector, lambda element: element.is_displayed()) is True


def job_ids(driver) -> set[str]:
    return set(read_all(driver, "#jobs tbody tr", lambda tr: tr.get_attribute("data-job-id")))


def go_to(driver, page: str) -> None:
    """Through the header's link to `page` (users, teams, tokens, audit), until it shows."""
    click(driver, f"#nav-{page}")
    wait(driver, lambda d: shown(d, f"#{page}-page"), f"the {page} page")


def audited(driver) -> list[tuple[str, str]]:
    """The audit page's entries: (action, the answer's status), as listed."""
    return read_all(driver, "#audit tbody tr", lambda tr: (
        tr.get_attribute("data-action"), tr.find_element("css selector", ".answer").text))


def ids_in_the_audit(driver) -> list[int]:
    return read_all(driver, "#audit tbody tr", lambda tr: int(tr.get_attribute("data-id")))


def accept_the_confirmation(driver) -> None:
    from selenium.webdriver.support import expected_conditions
    wait(driver, expected_conditions.alert_is_present(), "the confirmation", timeout=10)
    driver.switch_to.alert.accept()


@pytest.mark.e2e
@needs_browser
def test_a_members_token_shows_their_teams_jobs_with_team_and_submitter(browser, accounts_cluster, tmp_path):
    """bob, a member of ml, signs in with his personal token: the header names him, the
    list shows ml's jobs (not web's) with their team and submitter, filtered by submitter
    (his own with "mine"); the pages of users and teams are not his. alice, ml's admin,
    sees ml's page and makes him an admin of it."""
    from selenium.webdriver.common.keys import Keys
    c = accounts_cluster
    for team in ("ui-ml", "ui-web"):
        call(c, "POST", "/teams", json={"name": team}, expect=201)
    call(c, "POST", "/users", json={"name": "ui-alice", "teams": {"ui-ml": "admin"}}, expect=201)
    call(c, "POST", "/users", json={"name": "ui-bob", "teams": {"ui-ml": "member"}}, expect=201)
    call(c, "POST", "/users", json={"name": "ui-carol", "teams": {"ui-web": "member"}}, expect=201)
    tokens = {user: personal_token(c, user) for user in ("ui-alice", "ui-bob", "ui-carol")}
    jobs = {user: call(c, "POST", "/jobs", token=tokens[user], json={"command": f"echo {user}"}, expect=201)["job_id"]
            for user in tokens}
    try:
        sign_in(browser, c, tokens["ui-bob"])
        mark_page(browser)
        assert text_of(browser, "#whoami-user") == "ui-bob"
        assert text_of(browser, "#whoami-role") == "no cluster role"
        assert text_of(browser, "#whoami-teams") == "teams: ui-ml"
        wait(browser, lambda d: job_ids(d) == {jobs["ui-alice"], jobs["ui-bob"]}, "ml's jobs, and only those")
        alice_row = f'#jobs tr[data-job-id="{jobs["ui-alice"]}"]'
        assert (text_of(browser, f"{alice_row} .team"), text_of(browser, f"{alice_row} .submitted-by")) == (
            "ui-ml", "ui-alice")
        # What a member's token may not read is left out, with the API's refusal.
        assert not shown(browser, "#nodes-section") and not shown(browser, "#counts")
        assert "may not do this" in text_of(browser, "#overview-refused")
        assert [shown(browser, f"#nav-{page}") for page in ("tokens", "users", "teams", "audit")] == [
            True, False, False, False]
        screenshot(browser, tmp_path, "member-jobs")

        # Filters: "mine", then a submitter typed in; both live in the address.
        click(browser, "#filter-mine")
        wait(browser, lambda d: job_ids(d) == {jobs["ui-bob"]}, "bob's own job only")
        assert "submitted_by=ui-bob" in browser.current_url
        # Typed over (clearing the field first would be a change of its own), then Enter.
        browser.find_element("id", "filter-submitter").send_keys(Keys.CONTROL, "a", Keys.NULL, "ui-alice",
                                                                   Keys.ENTER)
        wait(browser, lambda d: job_ids(d) == {jobs["ui-alice"]}, "alice's job only")
        assert "submitted_by=ui-alice" in browser.current_url
        assert not browser.find_element("id", "filter-mine").is_selected()
        # Her job's page names its team and submitter.
        click(browser, f"{alice_row} td:first-child a")
        wait(browser, lambda d: text_of(d, "#job-title") == jobs["ui-alice"], "alice's job page")
        assert (text_of(browser, "#field-team"), text_of(browser, "#field-submitted_by")) == ("ui-ml", "ui-alice")
        assert page_not_reloaded(browser)
        # Another team's job is not there for him, as any job that does not exist.
        shows_an_error(browser, f"{c.scheduler_url}/ui#/jobs/{jobs['ui-carol']}", jobs["ui-carol"], "job-page")
        # The users and teams pages are not his, nor the audit log (the API's refusal).
        for page in ("users", "teams"):
            shows_an_error(browser, f"{c.scheduler_url}/ui#/{page}", f"the {page} page is for cluster admins",
                           f"{page}-page")
        shows_an_error(browser, f"{c.scheduler_url}/ui#/audit", "the audit log is for cluster admins", "audit-page")

        # alice leads ml: its page (not web's), where she makes bob an admin of it.
        sign_in(browser, c, tokens["ui-alice"], "#/teams")
        assert [shown(browser, f"#nav-{page}") for page in ("users", "teams", "audit")] == [False, True, True]
        ml = '#teams tr[data-team="ui-ml"]'
        wait(browser, lambda d: css(d, f'{ml} li[data-user="ui-bob"]') is not None, "ml and its members")
        assert css(browser, '#teams tr[data-team="ui-web"]') is None
        assert not shown(browser, "#team-form")  # teams are made by cluster admins
        click(browser, f'{ml} li[data-user="ui-bob"] button.make-admin')
        wait(browser, lambda d: attribute_of(d, f'{ml} li[data-user="ui-bob"]', "data-role") == "admin",
             "bob an admin of ml")
        assert text_of(browser, "#teams-result") == "ui-bob is an admin of ui-ml"
        # Every server process knows within 2 s (each keeps what a token stands for that long).
        wait_for(lambda: {"team": "ui-ml", "role": "admin"} in call(c, "GET", "/whoami", token=tokens["ui-bob"])[
            "teams"], timeout=WAIT_SECS, message="bob's token to stand for an admin of ml")
    finally:
        browser.execute_script("sessionStorage.clear()")


@pytest.mark.e2e
@needs_browser
def test_a_cluster_admin_makes_a_team_and_a_user_adds_the_member_and_makes_and_revokes_their_token(
        browser, accounts_cluster, tmp_path):
    from selenium.webdriver.support.ui import Select
    c = accounts_cluster
    try:
        sign_in(browser, c, OPERATOR_TOKEN, "#/teams")
        assert text_of(browser, "#whoami-user") == "admin"
        assert text_of(browser, "#whoami-role") == "cluster admin"
        assert all(shown(browser, f"#nav-{page}") for page in ("tokens", "users", "teams", "audit"))
        mark_page(browser)

        # A team; making it twice is refused, and the refusal is shown.
        for attempt in range(2):
            browser.find_element("id", "team-name").send_keys("ui-research")
            click(browser, "#team-form button[type=submit]")
            wait(browser, lambda d: text_of(d, "#team-result"), "the answer")
        assert text_of(browser, "#team-result") == "team 'ui-research' exists"
        assert "error-text" in attribute_of(browser, "#team-result", "class")
        wait(browser, lambda d: css(d, '#teams tr[data-team="ui-research"]') is not None, "the new team listed")

        # A user, made with no team, then added to it as a member.
        go_to(browser, "users")
        browser.find_element("id", "user-name").send_keys("ui-dora")
        click(browser, "#user-form button[type=submit]")
        wait(browser, lambda d: text_of(d, "#user-result") == "made user ui-dora", "the user made")
        wait(browser, lambda d: text_of(d, '#users tr[data-user="ui-dora"] .cluster-role') == "none", "listed")
        go_to(browser, "teams")
        Select(browser.find_element("id", "member-team")).select_by_value("ui-research")
        browser.find_element("id", "member-user").send_keys("ui-dora")
        click(browser, "#member-form button[type=submit]")
        member = '#teams tr[data-team="ui-research"] li[data-user="ui-dora"]'
        wait(browser, lambda d: attribute_of(d, member, "data-role") == "member", "dora a member of the team")
        assert text_of(browser, "#member-result") == "ui-dora is a member of ui-research"
        screenshot(browser, tmp_path, "teams")
        go_to(browser, "users")
        wait(browser, lambda d: text_of(d, '#users tr[data-user="ui-dora"] .teams') == "ui-research", "her team")
        # Another, made with the team picked, as its admin, and it her default team.
        browser.find_element("id", "user-name").send_keys("ui-erin")
        click(browser, '#user-teams [data-team="ui-research"] input')
        Select(browser.find_element("css selector", '#user-teams [data-team="ui-research"] select')
               ).select_by_value("admin")
        Select(browser.find_element("id", "user-default-team")).select_by_value("ui-research")
        click(browser, "#user-form button[type=submit]")
        erin = '#users tr[data-user="ui-erin"]'
        wait(browser, lambda d: text_of(d, f"{erin} .teams") == "ui-research (admin)", "erin an admin of the team")
        assert text_of(browser, f"{erin} .default-team") == "ui-research"
        screenshot(browser, tmp_path, "users")

        # A token for her: its secret shown once, working, then gone; in the list without it.
        go_to(browser, "tokens")
        assert shown(browser, "#new-token-user-label")  # a cluster admin makes tokens for others
        browser.find_element("id", "new-token-name").send_keys("dora-laptop")
        browser.find_element("id", "new-token-user").send_keys("ui-dora")
        click(browser, "#token-create-form button[type=submit]")
        made = wait(browser, lambda d: text_of(d, "#token-create-result"), "the token made")
        token_id = made.split()[1]
        assert made == f"made {token_id} for ui-dora"
        assert shown(browser, "#new-token") and "Shown only once." in text_of(browser, "#new-token")
        secret = text_of(browser, "#new-token-secret")
        assert secret.startswith("corral_pat_")
        assert call(c, "GET", "/whoami", token=secret)["user"] == "ui-dora"
        click(browser, "#copy-token")
        wait(browser, lambda d: text_of(d, "#copy-result"), "the copy said")
        screenshot(browser, tmp_path, "token-made")
        token_row = f'#tokens tr[data-token-id="{token_id}"]'
        wait(browser, lambda d: text_of(d, f"{token_row} .user") == "ui-dora", "the token listed")
        assert text_of(browser, f"{token_row} .name") == "dora-laptop"
        wait(browser, lambda d: text_of(d, f"{token_row} .last-used") != "never", "its use (the whoami above)")
        click(browser, "#dismiss-token")
        wait(browser, lambda d: not shown(d, "#new-token"), "the secret dismissed")
        assert secret not in browser.page_source

        # Revoked: marked so in the list, and refused.
        click(browser, f"{token_row} button.revoke")
        accept_the_confirmation(browser)
        wait(browser, lambda d: attribute_of(d, token_row, "data-revoked") == "yes", "the token revoked")
        assert text_of(browser, "#tokens-result") == f"revoked {token_id}"
        assert css(browser, f"{token_row} button.revoke") is None
        wait_for(lambda: requests.get(c.scheduler_url + "/whoami", headers={"Authorization": f"Bearer {secret}"},
                                      timeout=10).status_code == 401, timeout=WAIT_SECS, message="the token refused")
        assert page_not_reloaded(browser)
        screenshot(browser, tmp_path, "tokens")

        # The user removed, then the team (a team with members is refused: the message says so).
        go_to(browser, "teams")
        click(browser, '#teams tr[data-team="ui-research"] button.delete')
        accept_the_confirmation(browser)
        wait(browser, lambda d: text_of(d, "#teams-result") == "team 'ui-research' has members: remove them first",
             "deleting a team with a member refused")
        assert "error-text" in attribute_of(browser, "#teams-result", "class")
        go_to(browser, "users")
        for user in ("ui-dora", "ui-erin"):
            click(browser, f'#users tr[data-user="{user}"] button.delete')
            accept_the_confirmation(browser)
            wait(browser, lambda d: css(d, f'#users tr[data-user="{user}"]') is None, f"{user} gone")
        assert text_of(browser, "#users-result") == "deleted user ui-erin"
        go_to(browser, "teams")
        click(browser, '#teams tr[data-team="ui-research"] button.delete')
        accept_the_confirmation(browser)
        wait(browser, lambda d: css(d, '#teams tr[data-team="ui-research"]') is None, "the team gone")
        assert text_of(browser, "#teams-result") == "deleted team ui-research"

        # The audit log: all that, refusals included, newest first.
        go_to(browser, "audit")
        done = [("deleteTeam", "204"), ("deleteUser", "204"), ("deleteUser", "204"), ("deleteTeam", "409"),
                ("revokeToken", "200"), ("createToken", "201"), ("createUser", "201"), ("setMember", "200"),
                ("createUser", "201"), ("createTeam", "409"), ("createTeam", "201")]
        wait(browser, lambda d: audited(d)[:len(done)] == done, "the admin's changes, newest first")
        revoked = '#audit tr[data-action="revokeToken"]'
        assert (text_of(browser, f"{revoked} .target"), text_of(browser, f"{revoked} .user")) == (token_id, "admin")
        assert text_of(browser, f"{revoked} .request") == f"DELETE /tokens/{token_id}"
        screenshot(browser, tmp_path, "audit")
        # Filtered by action, a page at a time: revoking it again (it changes nothing) is an entry each time.
        for _ in range(54):
            call(c, "DELETE", f"/tokens/{token_id}")
        browser.find_element("id", "audit-action").send_keys("revokeToken")
        click(browser, "#audit-filters button[type=submit]")
        wait(browser, lambda d: len(audited(d)) == 50 and {a for a, _ in audited(d)} == {"revokeToken"},
             "the newest 50 revocations")
        assert "action=revokeToken" in browser.current_url
        newest = ids_in_the_audit(browser)
        click(browser, "#audit-older")
        wait(browser, lambda d: len(audited(d)) == 5, "the 5 older ones")
        assert max(ids_in_the_audit(browser)) < min(newest)
        assert not shown(browser, "#audit-older") and shown(browser, "#audit-newest")
        click(browser, "#audit-newest")
        wait(browser, lambda d: ids_in_the_audit(d) == newest, "back to the newest")
        assert page_not_reloaded(browser)
    finally:
        browser.execute_script("sessionStorage.clear()")


@pytest.mark.e2e
@needs_browser
def test_a_cluster_admin_sets_and_removes_a_teams_quota_and_its_admin_sees_it(browser, accounts_cluster, tmp_path):
    from selenium.webdriver.support.ui import Select
    c = accounts_cluster
    call(c, "POST", "/teams", json={"name": "ui-quota"}, expect=201)
    call(c, "POST", "/users", json={"name": "ui-gus", "teams": {"ui-quota": "admin"}}, expect=201)
    jobs_line = '#teams tr[data-team="ui-quota"] .quota li[data-resource="jobs"]'
    try:
        sign_in(browser, c, OPERATOR_TOKEN, "#/teams")
        wait(browser, lambda d: text_of(d, '#teams tr[data-team="ui-quota"] .quota') == "no quota", "no quota yet")
        Select(browser.find_element("id", "quota-team")).select_by_value("ui-quota")
        # A wrong amount is refused in the page; nothing is sent.
        browser.find_element("id", "quota-guaranteed").send_keys("cores=4")
        click(browser, "#quota-form button[type=submit]")
        wait(browser, lambda d: "RESOURCE one of cpu_percent" in (text_of(d, "#quota-result") or ""), "the refusal")
        assert call(c, "GET", "/teams/ui-quota/quota")["guaranteed"] == {}
        # One the API refuses: its reason is shown.
        browser.find_element("id", "quota-guaranteed").clear()
        browser.find_element("id", "quota-guaranteed").send_keys("jobs=2")
        browser.find_element("id", "quota-lending").send_keys("jobs=3")
        click(browser, "#quota-form button[type=submit]")
        wait(browser, lambda d: "lending_limit.jobs 3 is over guaranteed.jobs 2" in (text_of(d, "#quota-result") or ""),
             "the API's refusal")
        browser.find_element("id", "quota-lending").clear()
        browser.find_element("id", "quota-borrowing").send_keys("jobs=1,cpu_percent=400")
        click(browser, "#quota-form button[type=submit]")
        wait(browser, lambda d: text_of(d, "#quota-result") == "set the quota of ui-quota", "the quota set")
        wait(browser, lambda d: text_of(d, jobs_line) == "jobs: uses 0 · guaranteed 2 · borrows up to 1 · lends all",
             "the quota listed")
        assert call(c, "GET", "/teams/ui-quota/quota")["borrowing_limit"] == {"jobs": 1, "cpu_percent": 400}
        screenshot(browser, tmp_path, "quota")
        # The team's admin sees it and may not change it.
        sign_in(browser, c, personal_token(c, "ui-gus"), "#/teams")
        wait(browser, lambda d: text_of(d, jobs_line) is not None, "the quota shown to the team's admin")
        assert not shown(browser, "#quota-form")
        # Removed by the cluster admin.
        sign_in(browser, c, OPERATOR_TOKEN, "#/teams")
        Select(browser.find_element("id", "quota-team")).select_by_value("ui-quota")
        click(browser, "#quota-remove")
        wait(browser, lambda d: text_of(d, "#quota-result") == "removed the quota of ui-quota", "removed")
        wait(browser, lambda d: text_of(d, '#teams tr[data-team="ui-quota"] .quota') == "no quota", "no quota again")
    finally:
        browser.execute_script("sessionStorage.clear()")


# ---- usage ---------------------------------------------------------------------------------

def usage_table(driver) -> dict[str, str]:
    """The usage page's table: each group's attempts, as shown."""
    return dict(read_all(driver, "#usage tbody tr", lambda tr: (
        tr.get_attribute("data-group"), tr.find_element("css selector", ".attempts").text)))


def usage_series(driver) -> list[str]:
    return read_all(driver, "#chart-usage path.line", lambda path: path.get_attribute("data-series"))


def attempts_by(cluster, group_by: str, token: str = OPERATOR_TOKEN, **query) -> dict[str, str]:
    rows = call(cluster, "GET", "/usage", token=token, params={"group_by": group_by, **query})["rows"]
    return {r["group"]: str(r["attempts"]) for r in rows}


@pytest.mark.e2e
@needs_browser
def test_the_usage_page_shows_each_teams_attempts_and_cpu_hours(browser, tmp_path):
    """Two teams' users run jobs on a real agent; the usage page shows, for the operator,
    both teams in its table (as GET /usage counts their attempts) and a line each in the
    chart, a refused range as the API's message; for a member, their team's only."""
    from selenium.webdriver.support.ui import Select

    from corral.shared.credentials import node_token
    c = Cluster(tmp_path, **TOKENS)
    try:
        c.start_registry(**TOKENS)
        c.start_scheduler()
        c.start_agent("ui-usage-node", slots=2, CORRAL_NODE_TOKEN=node_token(AGENT_TOKEN, "ui-usage-node"))
        runs = {"ui-usage-ann": ("ui-usage-a", ["true", "true", "true"]),
                "ui-usage-ben": ("ui-usage-b", ["sleep 0.2", "sleep 0.2"])}
        tokens, jobs = {}, []
        for user, (team, commands) in runs.items():
            call(c, "POST", "/teams", json={"name": team}, expect=201)
            call(c, "POST", "/users", json={"name": user, "teams": {team: "member"}}, expect=201)
            tokens[user] = personal_token(c, user)
            jobs += [call(c, "POST", "/jobs", token=tokens[user], json={"command": command}, expect=201)["job_id"]
                     for command in commands]
        wait_for(lambda: all(call(c, "GET", f"/jobs/{job}")["status"] == "done" for job in jobs),
                 timeout=2 * WAIT_SECS, message="the jobs to run on the agent and end")
        by_team = attempts_by(c, "team")
        assert by_team == {"ui-usage-a": "3", "ui-usage-b": "2"}

        # The operator: by day (the default, the last 7 days), then by team, with a line per team.
        sign_in(browser, c, OPERATOR_TOKEN, "#/usage")
        assert shown(browser, "#nav-usage")
        wait(browser, lambda d: usage_table(d) == attempts_by(c, "day"), "the usage by day")
        mark_page(browser)
        Select(browser.find_element("id", "usage-group")).select_by_value("team")
        wait(browser, lambda d: usage_table(d) == by_team, "both teams with their attempts")
        assert "group_by=team" in browser.current_url
        assert usage_series(browser) == ["ui-usage-a", "ui-usage-b"]
        assert read_all(browser, "#legend-usage .legend-item", lambda item: item.get_attribute("data-series")) == [
            "ui-usage-a", "ui-usage-b"]
        # Each line has a point for each of the 7 days (a day without usage at 0).
        assert set(read_all(browser, "#chart-usage path.line", lambda p: p.get_attribute("data-points"))) == {"7"}
        cpu = {r["group"]: f"{r['cpu_seconds'] / 3600:.2f}"
               for r in call(c, "GET", "/usage", params={"group_by": "team"})["rows"]}
        assert text_of(browser, '#usage tr[data-group="ui-usage-a"] .cpu-hours') == cpu["ui-usage-a"]
        assert text_of(browser, '#legend-usage [data-series="ui-usage-a"] .legend-value') == f"{cpu['ui-usage-a']} h"
        screenshot(browser, tmp_path, "usage")
        # A range the API refuses: its message, in place of the chart and the table.
        refusal = call(c, "GET", "/usage", params={"from": "2026-12-07", "to": "2026-12-01"}, expect=400)["error"]
        browser.execute_script("window.location.hash = arguments[0]", "#/usage?from=2026-12-07&to=2026-12-01")
        wait(browser, lambda d: shown(d, "#usage-refused") and text_of(d, "#usage-refused") == refusal,
             "the refusal of the range")
        assert not shown(browser, "#usage-results")
        assert page_not_reloaded(browser)

        # A member: their team's usage only.
        sign_in(browser, c, tokens["ui-usage-ben"], "#/usage?group_by=team")
        wait(browser, lambda d: usage_table(d) == {"ui-usage-b": "2"}, "ben's team only")
        assert attempts_by(c, "team", token=tokens["ui-usage-ben"]) == {"ui-usage-b": "2"}
        assert usage_series(browser) == ["ui-usage-b"]
    finally:
        browser.execute_script("sessionStorage.clear()")
        c.stop()
