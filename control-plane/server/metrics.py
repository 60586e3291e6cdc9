"""Prometheus metrics plumbing shared by the registry and the scheduler (GET /metrics).

A scrape lands on any gunicorn worker, so counters use prometheus_client's
multiprocess mode (files in PROMETHEUS_MULTIPROC_DIR, summed over every worker,
dead ones too), which it picks when first imported: hence the master sets the
directory before forking, and nothing imports prometheus_client at module level.
What the database knows (jobs by status, nodes) is computed at scrape time instead.
"""
import glob
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterable

from flask import Flask, Response

from corral.shared.errors import SettingError
from corral.shared.settings import Setting, state_dir

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
METRICS_DIR = Setting(
    MULTIPROC_ENV, "metrics_dir", "text", None,
    "where the workers keep their metrics (its `*.db` files are removed at start)", form="a directory",
    shown="`$CORRAL_STATE_DIR/metrics/<program>-<pid>`")
# Private directories (when PROMETHEUS_MULTIPROC_DIR is unset): <state dir>/metrics/<prog>-<master pid>.
PRIVATE_PARENT = "metrics"

_lock = threading.Lock()
# The directory this master made (removed at its exit); None when configured.
_private_dir: str | None = None


# ---- the master: the multiprocess directory ---------------------------------------

def prepare_multiprocess_dir(prog: str) -> str:
    """Choose, empty and export the multiprocess directory; call in the gunicorn master
    before any worker forks. Returns the directory.

    PROMETHEUS_MULTIPROC_DIR when set (its *.db files are deleted: they belong to
    an earlier run), else a private directory under the state dir, named for this
    master's pid; private directories of masters that are gone are removed.
    """
    configured = METRICS_DIR.read(os.environ)
    if configured:
        path = os.path.abspath(configured)
    else:
        parent = os.path.join(state_dir(os.environ), PRIVATE_PARENT)
        _remove_stale_private_dirs(parent, prog)
        path = os.path.join(parent, f"{prog}-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith(".db"):
                os.remove(os.path.join(path, name))
    except OSError as exc:
        raise SettingError(f"cannot prepare the metrics directory {path} ({MULTIPROC_ENV}): {exc}") from None
    os.environ[MULTIPROC_ENV] = path
    _check_mode_not_chosen_yet()
    global _private_dir
    _private_dir = None if configured else path
    return path


def install_gunicorn_hooks(cfg) -> None:
    """Add ours to gunicorn's `child_exit` and `on_exit`, before any hook a gunicorn
    config file set (which still runs)."""
    their_child_exit, their_on_exit = cfg.child_exit, cfg.on_exit

    def child_exit(server, worker):
        worker_exited(worker.pid)
        their_child_exit(server, worker)

    def on_exit(server):
        if _private_dir:
            shutil.rmtree(_private_dir, ignore_errors=True)
        their_on_exit(server)

    cfg.set("child_exit", child_exit)
    cfg.set("on_exit", on_exit)


def worker_exited(pid: int) -> None:
    """A worker ended: let prometheus_client drop its live gauges (its counters and
    histograms stay in the sums, so a restart loses no counts)."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid)


def _remove_stale_private_dirs(parent: str, prog: str) -> None:
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        head, _, pid = name.rpartition("-")
        if head == prog and pid.isdigit() and not _process_exists(int(pid)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user
        pass
    return True


def _check_mode_not_chosen_yet() -> None:
    """prometheus_client chose single-process values if it was imported before the
    variable was set: the workers' counts would then never reach /metrics."""
    values = sys.modules.get("prometheus_client.values")
    if values is not None and not getattr(values.ValueClass, "_multiprocess", False):
        raise RuntimeError("prometheus_client was imported before the metrics directory was set; "
                           "metrics must be created lazily (corral.server.metrics.Family)")


# ---- the workers: metrics created on first use -------------------------------------

class Family:
    """A counter or histogram, declared at import and created on first use.

    Attribute access goes to the prometheus_client metric (`FAMILY.labels(...).inc()`).
    `initial` lists label values whose series exist from the start (at 0), so
    that a rate over them is 0 instead of missing.
    """

    _metric = None

    def __init__(self, kind: str, name: str, documentation: str, labelnames: tuple[str, ...] = (),
                 initial: Iterable[tuple[str, ...]] = (), **options):
        self.kind = kind
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.initial = tuple(initial)
        self.options = options

    def create(self):
        with _lock:
            if self._metric is None:
                import prometheus_client
                cls = {"counter": prometheus_client.Counter, "histogram": prometheus_client.Histogram}[self.kind]
                metric = cls(self.name, self.documentation, self.labelnames, **self.options)
                for values in self.initial:
                    metric.labels(*values)
                self._metric = metric
        return self._metric

    def __getattr__(self, attribute):
        metric = self._metric
        return getattr(self.create() if metric is None else metric, attribute)

    def sample_names(self) -> set[str]:
        """The names of the samples this family exports."""
        if self.kind == "counter":
            return {self.name + "_total"}
        return {self.name + suffix for suffix in ("_bucket", "_sum", "_count")}


def sample_names(families: Iterable[Family], scrape_gauges: Iterable[str]) -> set[str]:
    """Every sample name a /metrics built from these can carry (for dashboards and their tests)."""
    return set(scrape_gauges).union(*(family.sample_names() for family in families))


def on_commit(db, action: Callable, *args) -> None:
    """Run `action(*args)` once the current transaction commits (at once outside one);
    never if it rolls back. Errors are logged: a metric never fails a request."""

    def run():
        try:
            action(*args)
        except Exception:  # after the commit: the change stands whatever a metric does
            log.exception("updating a metric failed")

    db.after_commit(run)


# ---- GET /metrics ---------------------------------------------------------------------

def gauge(name: str, documentation: str, labelnames: tuple[str, ...], values: dict):
    """A gauge computed at scrape time: `values` maps label-value tuples to numbers."""
    from prometheus_client.core import GaugeMetricFamily
    family = GaugeMetricFamily(name, documentation, labels=list(labelnames))
    for labelvalues, value in values.items():
        family.add_metric(list(labelvalues), value)
    return family


def counter(name: str, documentation: str, labelnames: tuple[str, ...], values: dict):
    """A counter read at scrape time from totals that only grow (exported as `name`_total)."""
    from prometheus_client.core import CounterMetricFamily
    family = CounterMetricFamily(name, documentation, labels=list(labelnames))
    for labelvalues, value in values.items():
        family.add_metric(list(labelvalues), value)
    return family


# The database's own health, on PostgreSQL (control-plane/server/backends/postgres.py `health`).
DATABASE_GAUGES = ("corral_db_live_tuples", "corral_db_dead_tuples", "corral_db_oldest_transaction_age_seconds",
                   "corral_db_clock_skew_seconds")


def database_gauges(db) -> list:
    """The gauges of the database's health (PostgreSQL only; none on SQLite)."""
    health = getattr(db, "health", None)
    if health is None:
        return []
    seen = health()
    tables = seen["tables"]
    return [
        gauge("corral_db_live_tuples", "Live rows of each of this service's tables (PostgreSQL's estimate).",
              ("table",), {(name,): live for name, (live, _) in tables.items()}),
        gauge("corral_db_dead_tuples", "Dead rows of each of this service's tables not yet vacuumed; a number "
              "that keeps growing means autovacuum cannot keep up (see docs/operations.md, "
              "Keeping the queue table healthy).",
              ("table",), {(name,): dead for name, (_, dead) in tables.items()}),
        gauge("corral_db_oldest_transaction_age_seconds", "Age of the oldest open transaction in the database "
              "(any client): a long one holds vacuum back.", (), {(): seen["oldest_transaction_secs"]}),
        gauge("corral_db_clock_skew_seconds", "The database server's clock minus this host's, as last measured.",
              (), {(): seen["clock_skew_secs"]}),
    ]


class _ScrapeTime:
    """A collector for one scrape: the families `scrape()` computes (from the database)."""

    def __init__(self, scrape: Callable[[], list]):
        self.scrape = scrape

    def collect(self):
        try:
            return self.scrape()
        except Exception:  # the process's counters are still worth serving
            log.exception("computing the database gauges for /metrics failed; they are left out")
            return []


class _AllWorkers:
    """prometheus_client's MultiProcessCollector, leaving out empty files: a worker's
    file exists at 0 bytes for a moment while it is created (for good if the worker
    was killed just then), and reading one fails the whole scrape
    (prometheus/client_python#1199)."""

    def __init__(self, path: str):
        self.path = path

    def collect(self):
        from prometheus_client.multiprocess import MultiProcessCollector
        files = []
        for name in glob.glob(os.path.join(self.path, "*.db")):
            try:
                if os.path.getsize(name) > 0:
                    files.append(name)
            except OSError:  # removed meanwhile (a dead worker's live gauges)
                continue
        return MultiProcessCollector.merge(files, accumulate=True)


class _ThisProcess:
    """Outside gunicorn (no multiprocess directory): this process's own metrics."""

    def collect(self):
        from prometheus_client import REGISTRY
        return REGISTRY.collect()


def serve_metrics(app: Flask, families: Iterable[Family], scrape: Callable[[], list] | None = None) -> None:
    """GET /metrics in the Prometheus text format: the counters and histograms of all
    workers, plus what `scrape()` computes now. Creates `families` in this process,
    so that their series exist from the start."""
    for family in families:
        family.create()

    @app.get("/metrics")
    def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        registry = CollectorRegistry(auto_describe=False)
        if os.environ.get(MULTIPROC_ENV):
            registry.register(_AllWorkers(os.environ[MULTIPROC_ENV]))
        else:
            registry.register(_ThisProcess())
        if scrape is not None:
            registry.register(_ScrapeTime(scrape))
        return Response(generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
