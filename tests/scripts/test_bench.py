"""Smoke test of the benchmark scripts: `scripts/bench.py --quick` and
`scripts/simulate_fleet.py --sizes 5 --quick` run as subprocesses (in parallel),
print well-formed JSON lines with the expected scenarios and numeric fields, and
leave no process behind; `scripts/bench.py --quick --backends sqlite,postgresql`
does the same on both backends (starting its own PostgreSQL) and records the
server's settings, and with `--database-url` it uses a running server and drops
every database it made there. The values themselves are not checked."""
import json
import os
import signal
import subprocess
import sys
import uuid

import psycopg
import pytest

import pg
from helpers import wait_for
from paths import REPO

pytestmark = pytest.mark.e2e

BENCH_NUMBERS = {
    "submit_single": ["jobs_per_sec", "request_p50_ms"],
    "submit_batch": ["jobs_per_sec", "ratio_to_submit_single"],
    "dispatch_latency": ["p50_ms", "p99_ms", "max_ms"],
    "throughput": ["jobs_per_sec", "latency_p50_ms", "latency_p99_ms"],
    "baseline": ["jobs_per_sec", "ratio_throughput_to_baseline"],
    "memory": ["scheduler_master_hwm_mb", "scheduler_worker_hwm_mb_max", "agent_hwm_mb_max", "agent_rss_mb_max"],
    "dispatch_cross_replica": ["p50_ms", "p99_ms", "max_ms"],
    "capacity": ["jobs_per_sec", "scheduler_cpu_ms_per_job", "registry_cpu_ms_per_job", "simulator_cpu_ms_per_job"],
    "idle_fleet": ["schedulers_cpu_pct", "registry_cpu_pct", "simulator_cpu_pct"],
    "schedules": ["lag_p50_ms", "lag_p99_ms", "start_lag_p50_ms", "scheduler_cpu_pct"],
    "logs": ["stored_mb_per_sec", "scheduler_cpu_ms_per_mb", "agent_cpu_ms_per_mb", "read_mb_per_sec"],
    "node_floor": ["jobs_per_sec", "starter_cpu_ms_per_job", "job_processes_cpu_ms_per_job"],
    "placement": ["round_robin_ms", "binpack_ms", "spread_ms", "round_robin_explain_ms", "binpack_quotas_ms",
                  "fair_share_order_ms"],
    "submit_pending": ["empty_p50_ms", "empty_p99_ms", "pending_p50_ms", "pending_p99_ms", "p99_ratio"],
    "events_load": ["none_p50_ms", "none_p99_ms", "streams_p50_ms", "streams_p99_ms", "none_done_p50_ms",
                    "streams_done_p50_ms", "none_idle_cpu_pct", "streams_idle_cpu_pct"],
    "submit_auth": ["operator_jobs_per_sec", "personal_jobs_per_sec", "operator_request_p50_ms",
                    "personal_request_p50_ms", "personal_to_operator_jobs_per_sec"],
}
NO_DATABASE = ("node_floor", "placement")
# What only a PostgreSQL backend measures: the server's own CPU.
PG_NUMBERS = {"capacity": ["database_cpu_ms_per_job"], "idle_fleet": ["database_cpu_pct"]}
PG_SETTINGS = ("version", "fsync", "synchronous_commit", "shared_buffers", "max_connections", "wal_level")
# Scenarios that may say "skipped" in a quick run: cpu_bound always, submit_batch
# on a scheduler without POST /jobs/batch, node_floor without root (no cgroups).
MAY_SKIP = {"cpu_bound", "submit_batch", "node_floor"}
FLEET_NUMBERS = ["idle_scheduler_cpu_pct", "stream_scheduler_cpu_pct", "idle_registry_cpu_pct",
                 "dispatch_p50_ms", "dispatch_p99_ms", "stream_rate_achieved"]


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def json_lines(stdout: str) -> list[dict]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "nothing on stdout"
    records = [json.loads(line) for line in lines]  # every line is JSON
    assert all(isinstance(r, dict) and "scenario" in r for r in records), records
    return records


def check_meta(record: dict) -> None:
    assert record["scenario"] == "meta"
    assert record["date"] and record["command"]
    assert is_number(record["machine"]["nproc"]) and record["machine"]["cpu_model"] is not None
    assert is_number(record["machine"]["ram_gib"])


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker.encode() in f.read():
                    with open(f"/proc/{entry}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                            found.append(int(entry))
        except OSError:
            pass
    return found


def run_scripts(commands: dict[str, list[str]], marker: str, timeout: float) -> dict[str, str]:
    """Run the scripts in parallel (the marker in their environment); their stdout by name."""
    env = dict(os.environ, BENCH_SMOKE_MARKER=marker)
    procs = {name: subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True) for name, argv in commands.items()}
    outputs = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            outputs[name] = out
            assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{err[-4000:]}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:  # SIGTERM lets the script stop its clusters
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
    return outputs


def check_scenario(scenario: str, record: dict, fields: list[str]) -> None:
    if scenario in MAY_SKIP and "skipped" in record:
        assert isinstance(record["skipped"], str) and record["skipped"], record
        return
    assert "skipped" not in record and "error" not in record, record
    for field in fields:
        assert is_number(record.get(field)), (scenario, field, record)
    assert isinstance(record["runs"], list) and len(record["runs"]) == 1


# The scripts run for about a minute each here; the runs' own timeouts come first.
@pytest.mark.timeout(300)
def test_the_benchmark_scripts_print_json_lines_and_leave_nothing_running():
    marker = uuid.uuid4().hex
    outputs = run_scripts({"bench": [sys.executable, "scripts/bench.py", "--quick"],
                           "fleet": [sys.executable, "scripts/simulate_fleet.py", "--sizes", "5", "--quick"]},
                          marker, timeout=240)

    bench = json_lines(outputs["bench"])
    check_meta(bench[0])
    assert list(bench[0]["backends"]) == ["sqlite"]
    check_targets(bench[-1], [("dispatch_latency", "sqlite")] * 2 + [("dispatch_cross_replica", "sqlite")] * 2
                  + [("capacity", "sqlite"), ("idle_fleet", "sqlite"), ("schedules", "sqlite")]
                  + [("submit_pending", "sqlite")] + [("placement", None)] * 6)
    bench = bench[:-1]
    by_name = {r["scenario"]: r for r in bench[1:]}
    assert set(by_name) == {*BENCH_NUMBERS, "cpu_bound"}, list(by_name)
    assert len(bench) == 1 + len(by_name), "one line per scenario"
    assert isinstance(by_name["cpu_bound"].get("skipped"), str)
    for scenario, fields in BENCH_NUMBERS.items():
        record = by_name[scenario]
        assert record["backend"] == (None if scenario in NO_DATABASE else "sqlite"), record
        check_scenario(scenario, record, fields)
    # Two schedulers where the scenario says so; every simulated job done, none failed.
    assert by_name["dispatch_cross_replica"]["settings"]["schedulers"] == 2
    assert by_name["idle_fleet"]["settings"]["schedulers"] == 2
    capacity = by_name["capacity"]
    assert capacity["done"] == capacity["jobs"] > 0 and capacity["api_failed"] == 0, capacity
    schedules = by_name["schedules"]  # every slot of the window made exactly one job
    assert schedules["jobs"] == schedules["slots"] > 0 and schedules["slots_with_two_jobs"] == 0, schedules
    pending = by_name["submit_pending"]  # the second measure ran with the added jobs queued, none refused
    assert pending["pending_jobs"] >= pending["settings"]["added"] and pending["errors"] == 0, pending
    logs = by_name["logs"]  # every job's output stored whole, one read back byte for byte
    assert logs["complete"] == logs["jobs"] > 0 and logs["runs"][0]["read_bytes_ok"] is True, logs

    fleet = json_lines(outputs["fleet"])
    check_meta(fleet[0])
    assert [r["scenario"] for r in fleet[1:]] == ["fleet"]
    line = fleet[1]
    assert line["agents"] == 5 and line["mode"] in ("long-poll", "polling"), line
    assert "error" not in line, line
    for field in FLEET_NUMBERS:
        assert is_number(line.get(field)), (field, line)
    assert line["claimed"] == line["jobs"] > 0, line

    # Servers, agents and jobs all inherit the marker through their environment.
    wait_for(lambda: not processes_with(marker), timeout=15,
             message="every process the scripts started to be gone")


@pytest.mark.timeout(300)
@pytest.mark.skipif(pg.missing() is not None, reason=pg.missing() or "")
def test_the_benchmark_runs_on_both_backends_with_its_own_postgresql_and_leaves_nothing_behind():
    marker = uuid.uuid4().hex
    scenarios = ["submit_single", "submit_batch", "dispatch_cross_replica", "capacity", "idle_fleet"]
    argv = [sys.executable, "scripts/bench.py", "--quick", "--backends", "sqlite,postgresql",
            "--scenarios", ",".join(scenarios)]
    bench = json_lines(run_scripts({"bench": argv}, marker, timeout=240)["bench"])

    check_meta(bench[0])
    server = bench[0]["backends"]["postgresql"]
    assert {name: server[name] for name in ("fsync", "synchronous_commit")} == {"fsync": "on",
                                                                                  "synchronous_commit": "on"}
    assert all(server.get(name) for name in PG_SETTINGS), server
    check_targets(bench[-1], [("submit_single", "postgresql"), ("submit_batch", "postgresql")]
                  + [("dispatch_cross_replica", b) for b in ("sqlite", "postgresql")] * 2
                  + [("capacity", "sqlite"), ("capacity", "postgresql")]
                  + [("idle_fleet", b) for b in ("sqlite", "postgresql")])
    bench = bench[:-1]
    # A line per scenario and backend, in the order of the scenarios, SQLite first.
    assert [(r["scenario"], r["backend"]) for r in bench[1:]] == [
        (s, b) for s in scenarios for b in ("sqlite", "postgresql")]
    for record in bench[1:]:
        scenario = record["scenario"]
        fields = BENCH_NUMBERS[scenario] + (PG_NUMBERS.get(scenario, []) if record["backend"] == "postgresql" else [])
        check_scenario(scenario, record, fields)
        if record["backend"] == "postgresql":  # compared with SQLite's run of the same round
            ratios = record["ratio_to_sqlite"]  # the first field compared is the scenario's main figure
            assert is_number(ratios[BENCH_NUMBERS[scenario][0]]), record
    pg_lines = {r["scenario"]: r for r in bench[1:] if r["backend"] == "postgresql"}
    assert pg_lines["capacity"]["settings"]["schedulers"] == 2  # replicas are what PostgreSQL is for
    assert pg_lines["capacity"]["done"] == pg_lines["capacity"]["jobs"] > 0

    # The server (started as its own user, with the marker in its environment) and the
    # servers and simulated agents are gone, and with them every database.
    wait_for(lambda: not processes_with(marker), timeout=15,
             message="every process the bench started, PostgreSQL included, to be gone")


@pytest.mark.timeout(240)
def test_the_benchmark_uses_the_postgresql_server_it_is_given_and_drops_the_databases_it_made(pg_server):
    before = databases(pg_server)
    marker = uuid.uuid4().hex
    argv = [sys.executable, "scripts/bench.py", "--quick", "--database-url", pg_server.url("postgres"),
            "--scenarios", "submit_single,capacity"]
    bench = json_lines(run_scripts({"bench": argv}, marker, timeout=180)["bench"])

    check_meta(bench[0])
    assert list(bench[0]["backends"]) == ["postgresql"]
    assert bench[0]["backends"]["postgresql"]["server"] == "given by --database-url"
    check_targets(bench[-1], [("submit_single", "postgresql"), ("capacity", "postgresql")])
    bench = bench[:-1]
    assert [(r["scenario"], r["backend"]) for r in bench[1:]] == [("submit_single", "postgresql"),
                                                                  ("capacity", "postgresql")]
    for record in bench[1:]:
        check_scenario(record["scenario"], record, BENCH_NUMBERS[record["scenario"]])
    assert is_number(bench[2]["database_cpu_ms_per_job"])  # the server runs here: its CPU is measured
    assert databases(pg_server) == before
    wait_for(lambda: not processes_with(marker), timeout=15, message="every process the bench started to be gone")


def check_targets(line: dict, expected: list[tuple[str, str]]) -> None:
    """The last line: a check per target whose scenario ran, none met in a --quick run."""
    assert line["scenario"] == "targets" and line["quick"] is True, line
    assert sorted((c["scenario"], c["backend"]) for c in line["checks"]) == sorted(expected), line
    assert all(is_number(c["median"]) and c["met"] is False for c in line["checks"]), line
    assert (line["met"], line["missed"]) == (0, len(expected))


def test_a_full_run_checks_its_medians_against_the_targets():
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        import bench
    finally:
        sys.path.remove(os.path.join(REPO, "scripts"))
    lines = [{"scenario": "submit_single", "backend": "postgresql", "jobs_per_sec": 1000.0},
             {"scenario": "submit_single", "backend": "sqlite", "jobs_per_sec": 10.0},  # no target on SQLite
             {"scenario": "dispatch_latency", "backend": "sqlite", "p50_ms": 15.2, "p99_ms": 30.0},
             {"scenario": "capacity", "backend": "postgresql", "error": "no job was done"}]
    checks = bench.check_targets(lines, quick=False)
    assert [(c["scenario"], c["backend"], c["field"], c["met"]) for c in checks["checks"]] == [
        ("submit_single", "postgresql", "jobs_per_sec", True),
        ("dispatch_latency", "sqlite", "p50_ms", False), ("dispatch_latency", "sqlite", "p99_ms", True)]
    assert (checks["met"], checks["missed"]) == (2, 1)
    assert not any(c["met"] for c in bench.check_targets(lines, quick=True)["checks"])


def databases(server: pg.PgServer) -> set[str]:
    with psycopg.connect(server.url("postgres"), connect_timeout=10) as conn:
        return {name for (name,) in conn.execute("SELECT datname FROM pg_database")}
