"""`make run` as a process: scripts/run_local.py with a state dir of the test's own
and short intervals; its output goes to a log file."""
import os
import subprocess
import sys

from cluster import base_env
from paths import REPO

RUN_LOCAL = os.path.join(REPO, "scripts", "run_local.py")


def run_local(tmp_path, **env) -> tuple[subprocess.Popen, str]:
    log = str(tmp_path / "run_local.log")
    full = base_env(str(tmp_path / "state"), POLL_INTERVAL_SECS=0.2, HEARTBEAT_INTERVAL_SECS=0.5,
                    AGENT_STOP_GRACE_SECS=2, AGENT_KILL_GRACE_SECS=1, **env)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, RUN_LOCAL], env=full, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log
