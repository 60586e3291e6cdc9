"""Usage accounting end to end: real agents run jobs that burn CPU, and what `GET /usage`
and `corral usage` say each team used is the sum of what the jobs' own answers say
their nodes measured."""
import csv
import io
import os
import shutil
import subprocess

import pytest
import requests

from cluster import BIN, Cluster, started

pytestmark = pytest.mark.e2e

PYTHON3 = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
BURN = f"{PYTHON3} -c 'import time; t = time.process_time(); exec(\"while time.process_time() - t < 0.3: pass\")'"


def test_usage_is_the_sum_of_what_the_nodes_measured(tmp_path, request):
    with started(Cluster(tmp_path), request) as c:
        c.start_agent("usage-n1", slots=2)
        c.wait_nodes_healthy("usage-n1")
        jobs = [c.submit(command=BURN, max_retries=0)["job_id"] for _ in range(3)]
        jobs.append(c.submit(command="exit 3", max_retries=0)["job_id"])
        ended = [c.wait_status(job_id, "done", "failed", timeout=60) for job_id in jobs]
        measured = sum(job["cpu_seconds"] or 0.0 for job in ended)
        if os.geteuid() == 0:  # the agent measures through the job's cgroup
            assert measured >= 0.9, [job["cpu_seconds"] for job in ended]
        rows = requests.get(f"{c.scheduler_url}/usage", params={"group_by": "team"}, timeout=10).json()["rows"]
        assert [(row["group"], row["attempts"]) for row in rows] == [("default", 4)]
        assert abs(rows[0]["cpu_seconds"] - measured) < 1e-6
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        printed = subprocess.run([os.path.join(BIN, "corral"), "--addr", c.scheduler_url, "usage", "--group-by",
                                  "user", "--csv"], capture_output=True, text=True, env=env, timeout=60)
        assert printed.returncode == 0, printed.stderr
        lines = list(csv.DictReader(io.StringIO(printed.stdout)))
        assert [line["user"] for line in lines] == ["admin"]
        assert abs(float(lines[0]["cpu_seconds"]) - measured) < 1e-6
