"""HTTP clients for the registry and the scheduler APIs.

Every call has a timeout. Failures come back as one exception type per kind of
failure so callers can decide: `Unreachable` (connection refused, timeout, 5xx:
try again later) and `Rejected` (a 4xx: the request itself is wrong or stale,
retrying the same thing will not help).
"""
import requests

DEFAULT_TIMEOUT = (3.05, 10.0)  # (connect, read) seconds


class ClientError(Exception):
    pass


class Unreachable(ClientError):
    """The peer did not answer usefully: network error, timeout or a 5xx."""


class Rejected(ClientError):
    """The peer answered 4xx; `status` and `message` say why."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class _Client:
    def __init__(self, base_url: str, token: str | None = None, timeout=DEFAULT_TIMEOUT,
                 session: requests.Session | None = None):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def _call(self, method: str, path: str, *, json=None, params=None, timeout=None):
        url = self.base_url + path
        try:
            response = self.session.request(method, url, json=json, params=params,
                                            timeout=timeout or self.timeout)
        except requests.RequestException as exc:
            raise Unreachable(f"{method} {url}: {_reason(exc)}") from None
        if response.status_code >= 500:
            raise Unreachable(f"{method} {url}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise Rejected(response.status_code, _error_message(response))
        try:
            return response.json()
        except ValueError:
            raise Unreachable(f"{method} {url}: the answer is not JSON") from None

    def close(self) -> None:
        self.session.close()

    def clone(self):
        """A client for the same server and token with a session of its own, for
        another thread (a requests.Session is not meant to be shared by threads)."""
        copy = type(self)(self.base_url, timeout=self.timeout)
        if "Authorization" in self.session.headers:
            copy.session.headers["Authorization"] = self.session.headers["Authorization"]
        return copy

    def healthz(self, timeout: float = 2.0) -> dict:
        return self._call("GET", "/healthz", timeout=timeout)


def _reason(exc: requests.RequestException) -> str:
    """A short reason for a failed call, instead of urllib3's nested repr."""
    if isinstance(exc, requests.ConnectTimeout):
        return "timed out connecting"
    if isinstance(exc, requests.ReadTimeout):
        return "timed out waiting for the answer"
    text = str(exc)
    for known in ("Connection refused", "Name or service not known", "No route to host",
                  "Network is unreachable", "Connection reset by peer", "Temporary failure in name resolution"):
        if known in text:
            return known.lower()
    return f"{exc.__class__.__name__}: {text[:200]}"


def _error_message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    return str(body)[:200]


class RegistryClient(_Client):
    def register_node(self, node: dict) -> dict:
        return self._call("POST", "/nodes", json=node)

    def heartbeat(self, node_id: str, running: int | None = None) -> dict:
        body = {} if running is None else {"running": running}
        return self._call("POST", f"/nodes/{node_id}/heartbeat", json=body)

    def list_nodes(self, kind: str | None = None, status: str | None = None) -> list[dict]:
        params = {k: v for k, v in (("type", kind), ("status", status)) if v}
        return self._call("GET", "/nodes", params=params)

    def register_service(self, service: dict) -> dict:
        return self._call("POST", "/services", json=service)

    def list_services(self, **filters) -> list[dict]:
        return self._call("GET", "/services", params=filters)

    def remove_service(self, job_id: str) -> dict:
        return self._call("DELETE", f"/services/{job_id}")


class SchedulerClient(_Client):
    def submit(self, request: dict) -> dict:
        return self._call("POST", "/jobs", json=request)

    def get_job(self, job_id: str) -> dict:
        return self._call("GET", f"/jobs/{job_id}")

    def list_jobs(self, **filters) -> list[dict]:
        return self._call("GET", "/jobs", params={k: v for k, v in filters.items() if v is not None})

    def pending_for(self, node_id: str) -> list[dict]:
        """What the agents poll: the pending jobs placed on `node_id`, up to its free slots."""
        return self.list_jobs(node_id=node_id, status="pending")

    def renew_lease(self, node_id: str) -> dict:
        """Tell the scheduler this node's agent is alive; answers lease_secs and the
        attempts it has running on the node."""
        return self._call("POST", f"/nodes/{node_id}/lease", json={})

    def running_on(self, node_id: str) -> list[dict]:
        return self.list_jobs(node_id=node_id, status="running", limit=1000)

    def report(self, job_id: str, node_id: str, attempt: int, status: str, **result) -> dict:
        """Report a status change of one attempt. A Rejected(409) means the attempt is stale."""
        body = {"node_id": node_id, "attempt": attempt, "status": status, **result}
        return self._call("POST", f"/jobs/{job_id}/status", json=body)
