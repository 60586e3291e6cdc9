"""Scheduler settings, read from the environment (see the README for each)."""
import os
from collections.abc import Mapping
from dataclasses import dataclass

from corral.shared import settings as s
from corral.shared.http import DEFAULT_MAX_BODY_BYTES

from .retry import Backoff


@dataclass(frozen=True)
class SchedulerSettings:
    database_url: str
    sqlite_synchronous: str = "NORMAL"
    registry_url: str = "http://127.0.0.1:9000"
    max_jobs_per_node: int = 1
    max_job_retries: int = 1
    retry_base_secs: float = 2.0
    retry_factor: float = 2.0
    retry_cap_secs: float = 300.0
    job_timeout_secs: float = 3600.0
    timeout_check_secs: float = 10.0
    node_refresh_secs: float = 2.0
    dispatch_interval_secs: float = 1.0
    heartbeat_timeout_secs: float = 20.0   # also the agents' lease period
    node_lost_grace_secs: float = 15.0
    max_node_losses: int = 3
    output_tail_bytes: int = 64 * 1024
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.retry_base_secs, self.retry_factor, self.retry_cap_secs)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "SchedulerSettings":
        return cls(
            database_url=s.database_url(env, "scheduler.db"),
            sqlite_synchronous=s.sqlite_synchronous(env),
            registry_url=s.env_str(env, "REGISTRY_URL", "http://127.0.0.1:9000"),
            max_jobs_per_node=s.env_int(env, "MAX_JOBS_PER_NODE", 1, minimum=1, maximum=10_000),
            max_job_retries=s.env_int(env, "MAX_JOB_RETRIES", 1, minimum=0, maximum=20),
            retry_base_secs=s.env_float(env, "RETRY_BASE_SECS", 2.0, minimum=0.0, maximum=86400.0),
            retry_factor=s.env_float(env, "RETRY_FACTOR", 2.0, minimum=1.0, maximum=10.0),
            retry_cap_secs=s.env_float(env, "RETRY_CAP_SECS", 300.0, minimum=0.0, maximum=7 * 86400.0),
            job_timeout_secs=s.env_float(env, "JOB_TIMEOUT_SECS", 3600.0, minimum=0.1),
            timeout_check_secs=s.env_float(env, "TIMEOUT_CHECK_SECS", 10.0, minimum=0.05),
            node_refresh_secs=s.env_float(env, "NODE_REFRESH_SECS", 2.0, minimum=0.05),
            dispatch_interval_secs=s.env_float(env, "DISPATCH_INTERVAL_SECS", 1.0, minimum=0.05),
            heartbeat_timeout_secs=s.env_float(env, "HEARTBEAT_TIMEOUT_SECS", 20.0, minimum=0.1),
            node_lost_grace_secs=s.env_float(env, "NODE_LOST_GRACE_SECS", 15.0, minimum=0.0),
            max_node_losses=s.env_int(env, "MAX_NODE_LOSSES", 3, minimum=0, maximum=100),
            output_tail_bytes=s.env_int(env, "CORRAL_OUTPUT_TAIL_BYTES", 64 * 1024, minimum=256),
            max_body_bytes=s.env_int(env, "CORRAL_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, minimum=1024),
        )
