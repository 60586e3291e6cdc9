"""Prometheus HTTP service discovery (`http_sd_configs`).

The healthy service jobs and nodes the registry knows as target groups. Pure: the routes
in api/discovery.py read the rows and call these.

A target group is `{"targets": ["host:port"], "labels": {...}}`. Prometheus keeps
labels starting with `__meta_` for relabelling and drops them before storing, so
Corral's facts go there: `__meta_corral_node_id`, and each of the node's labels
as `__meta_corral_label_<name>` with the name reduced to what Prometheus accepts
(letters, digits and `_`; anything else becomes `_`). Two names that reduce to
the same one keep the value of the first in sorted order.
"""
import re

PREFIX = "__meta_corral_"
_NOT_IN_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def label_name(name: str) -> str:
    """A node label's name as a Prometheus meta label."""
    return f"{PREFIX}label_{_NOT_IN_LABEL_NAME.sub('_', name)}"


def target(address: str, port: int) -> str:
    """host:port, an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address and not address.startswith("[") else f"{address}:{port}"


def node_labels(node_id: str, kind: str, drained: bool, labels: dict) -> dict[str, str]:
    out = {f"{PREFIX}node_id": node_id, f"{PREFIX}node_kind": kind, f"{PREFIX}node_drained": str(drained).lower()}
    for name in sorted(labels):
        out.setdefault(label_name(name), str(labels[name]))
    return out


def service_group(job_id: str, name: str, address: str, port: int, attempt: int | None,
                  node: dict[str, str]) -> dict:
    """A service job's target group; `node`: its node's labels (node_labels)."""
    labels = {f"{PREFIX}service": name, f"{PREFIX}job_id": job_id, **node}
    if attempt is not None:
        labels[f"{PREFIX}attempt"] = str(attempt)
    return {"targets": [target(address, port)], "labels": labels}


def node_group(address: str, port: int, node: dict[str, str]) -> dict:
    """A node's target group, at `port` (SD_NODE_PORT: node_exporter's 9100 by default)."""
    return {"targets": [target(address, port)], "labels": node}
