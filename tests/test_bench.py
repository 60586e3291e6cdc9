"""Smoke test of the benchmark scripts: `scripts/bench.py --quick` and
`scripts/simulate_fleet.py --sizes 5 --quick` run as subprocesses (in parallel),
print well-formed JSON lines with the expected scenarios and numeric fields, and
leave no process behind. The values themselves are not checked."""
import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from helpers import wait_for

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_NUMBERS = {
    "submit_single": ["jobs_per_sec", "request_p50_ms"],
    "submit_batch": ["jobs_per_sec", "ratio_to_submit_single"],
    "dispatch_latency": ["p50_ms", "p99_ms", "max_ms"],
    "throughput": ["jobs_per_sec", "latency_p50_ms", "latency_p99_ms"],
    "baseline": ["jobs_per_sec", "ratio_throughput_to_baseline"],
    "memory": ["scheduler_master_hwm_mb", "scheduler_worker_hwm_mb_max", "agent_hwm_mb_max", "agent_rss_mb_max"],
    "node_floor": ["jobs_per_sec", "starter_cpu_ms_per_job", "job_processes_cpu_ms_per_job"],
}
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


def test_the_benchmark_scripts_print_json_lines_and_leave_nothing_running():
    marker = uuid.uuid4().hex
    env = dict(os.environ, BENCH_SMOKE_MARKER=marker)
    commands = {"bench": [sys.executable, "scripts/bench.py", "--quick"],
                "fleet": [sys.executable, "scripts/simulate_fleet.py", "--sizes", "5", "--quick"]}
    procs = {name: subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True) for name, argv in commands.items()}
    outputs = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=100)
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

    bench = json_lines(outputs["bench"])
    check_meta(bench[0])
    by_name = {r["scenario"]: r for r in bench[1:]}
    assert set(by_name) == {*BENCH_NUMBERS, "cpu_bound"}, list(by_name)
    assert len(bench) == 1 + len(by_name), "one line per scenario"
    assert isinstance(by_name["cpu_bound"].get("skipped"), str)
    for scenario, fields in BENCH_NUMBERS.items():
        record = by_name[scenario]
        if scenario in MAY_SKIP and "skipped" in record:
            assert isinstance(record["skipped"], str) and record["skipped"], record
            continue
        assert "skipped" not in record and "error" not in record, record
        for field in fields:
            assert is_number(record.get(field)), (scenario, field, record)
        assert isinstance(record["runs"], list) and len(record["runs"]) == 1

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
