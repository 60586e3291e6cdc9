"""Complete logs end to end: a real agent ships a job's whole output (megabytes of
bytes that are not text) to a real two-worker scheduler while the job runs, the
scheduler is killed with SIGKILL mid-shipping and started again, and every byte
reads back exactly, through the API and `corral job logs --full`."""
import os
import shlex
import shutil
import subprocess

import pytest
import requests

from cluster import BIN, Cluster, started
from helpers import wait_for

pytestmark = pytest.mark.e2e

PIECES, PIECE = 30, 100_000  # 3 MB of stdout, written over about 3 s
# A python3 every job user may run (the test's own virtualenv may be out of their reach).
PYTHON3 = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
# The job writes piece i as sha256(i) repeated; every byte value turns up, and a piece
# out of place or doubled would not read back the same.
PROGRAM = f"""
import hashlib, sys, time
for i in range({PIECES}):
    digest = hashlib.sha256(str(i).encode()).digest()
    sys.stdout.buffer.write((digest * ({PIECE} // 32 + 1))[:{PIECE}])
    sys.stdout.buffer.flush()
    if i % 5 == 0:
        sys.stderr.write(f"piece {{i}}\\n")
        sys.stderr.flush()
    time.sleep(0.1)
"""


def expected_stdout() -> bytes:
    import hashlib
    return b"".join((hashlib.sha256(str(i).encode()).digest() * (PIECE // 32 + 1))[:PIECE] for i in range(PIECES))


def logs(url: str, job_id: str, stream: str = "stdout") -> tuple[bytes, bool]:
    """The whole stream as the scheduler has it, and whether it is complete."""
    data = b""
    while True:
        answer = requests.get(f"{url}/jobs/{job_id}/logs", params={"stream": stream, "offset": len(data)},
                              timeout=10)
        answer.raise_for_status()
        if not answer.content:
            return data, answer.headers["X-Corral-Log-Complete"] == "true"
        data += answer.content


def stored_size(url: str, job_id: str) -> int:
    try:
        answer = requests.get(f"{url}/jobs/{job_id}/logs", params={"limit": 1}, timeout=5)
    except requests.RequestException:
        return 0
    return int(answer.headers.get("X-Corral-Log-Size", 0)) if answer.ok else 0


def test_every_byte_survives_a_kill_9_of_the_scheduler_mid_shipping(tmp_path, request):
    with started(Cluster(tmp_path), request) as c:
        c.start_agent("logs-n1", AGENT_OUTPUT_INTERVAL_SECS=0.2)
        c.wait_nodes_healthy("logs-n1")
        job_id = c.submit(command=f"{PYTHON3} -c {shlex.quote(PROGRAM)}", max_retries=0)["job_id"]
        # Shipping has started, and most of the output is still to come.
        wait_for(lambda: 0 < stored_size(c.scheduler_url, job_id) < PIECES * PIECE // 2, timeout=30,
                 message="the first chunks to be stored")
        c.procs["scheduler"].kill()
        c.start_scheduler()
        assert c.wait_status(job_id, "done", timeout=60)["exit_code"] == 0
        wait_for(lambda: logs(c.scheduler_url, job_id)[1] and logs(c.scheduler_url, job_id, "stderr")[1],
                 timeout=60, message="the last chunks of both streams")
        stdout, _ = logs(c.scheduler_url, job_id)
        assert len(stdout) == PIECES * PIECE
        assert stdout == expected_stdout()
        stderr, _ = logs(c.scheduler_url, job_id, "stderr")
        assert stderr == "".join(f"piece {i}\n" for i in range(0, PIECES, 5)).encode()
        # The command line prints the same bytes.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        printed = subprocess.run([os.path.join(BIN, "corral"), "--addr", c.scheduler_url, "job", "logs", "--full",
                                  job_id], capture_output=True, env=env, timeout=60)
        assert printed.returncode == 0, printed.stderr.decode()
        assert printed.stdout == stdout
