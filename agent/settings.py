"""The agent's settings, read from environment variables (flags override them in cli.py).

Every variable is parsed and checked here, once, so a bad value stops the agent at
start with one clear SettingError instead of failing later in a loop.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.shared.errors import SettingError
from corral.shared.settings import env_bool, env_float, env_int, env_str, state_dir
from corral.shared.validate import NAME_RE


# The scheduler refuses a report whose stdout or stderr is over 512 KiB characters;
# stay below that with room for the line the agent may append ("job timed out").
MAX_TAIL_BYTES = 512 * 1024


@dataclass(frozen=True)
class AgentSettings:
    node_id: str
    registry_url: str = "http://127.0.0.1:9000"
    scheduler_url: str = "http://127.0.0.1:9001"
    poll_interval: float = 3.0
    heartbeat_interval: float = 5.0
    state_dir: str = os.path.abspath("./var")
    slots: int = 1
    address: str = "127.0.0.1"
    labels: dict[str, str] = field(default_factory=dict)
    output_tail_bytes: int = 65536
    stop_grace: float = 10.0
    keep_work_dirs: bool = False
    token: str | None = None
    kill_grace: float = 5.0

    @property
    def agent_dir(self) -> str:
        """This node's own directory under the state dir (several agents may share a host)."""
        return os.path.join(self.state_dir, "agent-" + safe_path_part(self.node_id))

    @property
    def work_root(self) -> str:
        return os.path.join(self.agent_dir, "work")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "AgentSettings":
        node_id = env_str(env, "NODE_ID", None) or socket.gethostname()
        if not NAME_RE.match(node_id):
            # The registry would refuse it on every registration attempt; say so now.
            raise SettingError(f"NODE_ID must be 1-128 letters, digits, '.', '_' or '-', "
                               f"starting with a letter or digit; got {node_id!r}")
        return cls(
            node_id=node_id,
            registry_url=_url(env, "REGISTRY_URL", cls.registry_url),
            scheduler_url=_url(env, "SCHEDULER_URL", cls.scheduler_url),
            poll_interval=_positive_float(env, "POLL_INTERVAL_SECS", 3.0),
            heartbeat_interval=_positive_float(env, "HEARTBEAT_INTERVAL_SECS", 5.0),
            state_dir=state_dir(env),
            slots=env_int(env, "AGENT_SLOTS", os.cpu_count() or 1, minimum=1),
            address=env_str(env, "AGENT_ADDRESS", "127.0.0.1"),
            labels=parse_labels(env_str(env, "AGENT_LABELS", "") or ""),
            output_tail_bytes=env_int(env, "CORRAL_OUTPUT_TAIL_BYTES", 65536, minimum=0,
                                      maximum=MAX_TAIL_BYTES),
            stop_grace=env_float(env, "AGENT_STOP_GRACE_SECS", 10.0, minimum=0),
            keep_work_dirs=env_bool(env, "CORRAL_KEEP_WORK_DIRS", False),
            token=env_str(env, "CORRAL_AGENT_TOKEN", None),
            kill_grace=env_float(env, "AGENT_KILL_GRACE_SECS", 5.0, minimum=0),
        )


def parse_labels(raw: str) -> dict[str, str]:
    """"k=v,k2=v2" -> {"k": "v", "k2": "v2"}; an empty string means no labels."""
    labels: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not NAME_RE.match(key):
            raise SettingError(f"AGENT_LABELS must look like k=v,k2=v2 (keys: letters, digits, "
                               f"'.', '_', '-'); bad entry {item!r}")
        labels[key] = value
    return labels


def safe_path_part(value: str) -> str:
    """Node and job ids become directory names; keep them from escaping the state dir."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in value)
    return cleaned.lstrip(".") or "_"


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    value = env_float(env, name, default)
    if value <= 0:
        raise SettingError(f"{name} must be greater than 0, got {value}")
    return value


def _url(env: Mapping[str, str], name: str, default: str) -> str:
    value = env_str(env, name, default)
    if not value.startswith(("http://", "https://")):
        raise SettingError(f"{name} must be an http:// or https:// URL, got {value!r}")
    return value.rstrip("/")
