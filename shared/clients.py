"""HTTP clients of the registry and the scheduler APIs: every call has a timeout, and
fails as `Unreachable` (refused, timed out, a 5xx: try again later) or `Rejected`
(a 4xx: the same request will not do better).

A client may hold several URLs of one service (replicas): a call goes to the one
that answered last and moves on when it fails, sending a request again only when
that is safe (docs/operations.md, "A list of URLs", says which are).
"""
import json
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlsplit

import requests
import urllib3

from corral.shared import states
from corral.shared.settings import split_urls
from corral.shared.wire import (IDEMPOTENCY_HEADER, LOG_FINAL_HEADER, LOG_NODE_HEADER, LOG_OFFSET_HEADER,
                                LONG_POLL_HEADER)

E = TypeVar("E")  # an entry split_batches cuts into batches
DEFAULT_TIMEOUT = (3.05, 10.0)  # (connect, read) seconds
# A long-poll claim may wait wait_secs before answering: its read timeout is that plus this.
CLAIM_READ_MARGIN_SECS = 10.0
# State-changing requests carry this content type even without a body (control-plane/server/guards.py).
JSON_HEADERS = {"Content-Type": "application/json"}
# Answers of a proxy that may have passed the request on before it failed.
MAYBE_DONE_STATUSES = (502, 504)


class ClientError(Exception):
    pass


class Unreachable(ClientError):
    """The peer did not answer usefully: network error, timeout or a 5xx.
    For calls made by a client: `tried` lists (base URL, reason) of every URL the call
    went to, in order; `base_url` is the last of them and `reason` (e.g. "connection
    refused") says why it failed, or, after several URLs, why each did."""

    def __init__(self, message: str, *, base_url: str | None = None, reason: str | None = None,
                 tried: Sequence[tuple[str, str]] = ()):
        super().__init__(message)
        self.tried = list(tried) or ([(base_url, reason or message)] if base_url else [])
        self.base_url = base_url or (self.tried[-1][0] if self.tried else None)
        self.reason = reason or message


class Rejected(ClientError):
    """The peer answered 4xx; `status` and `message` say why, `fields` the rest of its
    JSON answer (where to go on from, for a log chunk)."""

    def __init__(self, status: int, message: str, fields: dict | None = None):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.fields = fields or {}


@dataclass
class _Failed(Exception):
    """One URL's failure within a call: why, and whether the server may have acted on
    the request all the same (its answer was lost)."""
    reason: str
    maybe_done: bool


class _Client:
    """`base_urls`: one base URL, several (a list, or one string of comma-separated
    URLs) of replicas of one service; `token`: sent as `Authorization: Bearer` (an
    operator's token, or a node's credential); `verify`: True (the system's CAs), or
    a CA bundle file for https://. Not for sharing between threads: see clone()."""

    def __init__(self, base_urls: str | Sequence[str], token: str | None = None, timeout=DEFAULT_TIMEOUT,
                 session: requests.Session | None = None, verify: bool | str = True):
        self.base_urls = split_urls(base_urls)
        self._current = 0  # the index of the URL a call goes to first
        self.timeout = timeout
        self.session = session or requests.Session()
        # The environment's proxy and CA settings are read once, here: requests would
        # otherwise scan os.environ on every call (a quarter of an agent's CPU per job
        # in a profile), and could replace our Authorization header from a .netrc.
        from_env = {url: self.session.merge_environment_settings(url, {}, None, None, None) for url in self.base_urls}
        self.session.trust_env = False
        self._proxies = {url: settings["proxies"] for url, settings in from_env.items()}
        self.verify = from_env[self.base_urls[0]]["verify"] if verify is True else verify
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    @property
    def base_url(self) -> str:
        """The URL the next call goes to first: the one that answered last."""
        return self.base_urls[self._current]

    def _call(self, method: str, path: str, *, json=None, params=None, timeout=None, headers=None,
              resend: bool = True):
        return self._json(self._request(method, path, json=json, params=params, timeout=timeout,
                                        headers=headers, resend=resend))

    def _request(self, method: str, path: str, *, json=None, params=None, timeout=None,
                 headers=None, resend: bool = True, stream: bool = False,
                 data: bytes | None = None) -> requests.Response:
        """The answer of a call that succeeded (2xx-4xx handled as for `_call`), for callers
        that need its headers. The call fails over from URL to URL (see the module's
        docstring); `resend`: whether it may go to the next URL after a server that
        may have acted on it (a lost answer, a proxy's 502 or 504). False for requests
        that must not happen twice (a claim, an operator's retry): those move on only
        when the first server surely did not act (refused, timed out connecting, 500 or
        503: Corral's servers roll a failed request's transaction back);
        `stream`: the body is read by the caller as it comes (it closes the answer);
        `data`: raw bytes to send (the caller's headers say their type)."""
        if json is None and data is None and method not in ("GET", "HEAD"):
            headers = {**JSON_HEADERS, **(headers or {})}
        count = len(self.base_urls)
        tried: list[tuple[str, str]] = []
        for step in range(count):
            index = (self._current + step) % count
            base = self.base_urls[index]
            try:
                response = self._send(method, base, path, json=json, params=params, headers=headers,
                                      timeout=timeout or self.timeout, stream=stream, data=data)
            except _Failed as failure:
                tried.append((base, failure.reason))
                if failure.maybe_done and not resend:
                    self._current = (index + 1) % count  # the next call tries another first
                    break
                continue
            self._current = index
            if response.status_code >= 400:
                raise _rejected(response)
            return response
        raise _unreachable(method, path, tried)

    def _send(self, method: str, base: str, path: str, *, timeout, **kwargs) -> requests.Response:
        """One request to one URL; an answer below 500, else _Failed."""
        try:
            response = self.session.request(method, base + path, timeout=timeout, verify=self.verify,
                                            proxies=self._proxies[base], **kwargs)
        except requests.RequestException as exc:
            raise _Failed(_reason(exc), _maybe_done(exc)) from None
        if response.status_code >= 500:
            response.close()
            raise _Failed(f"HTTP {response.status_code}", response.status_code in MAYBE_DONE_STATUSES)
        return response

    def _json(self, response: requests.Response):
        try:
            return response.json()
        except ValueError:
            reason = "the answer is not JSON"
            raise Unreachable(f"{response.request.method} {response.url}: {reason}",
                              base_url=self.base_url, reason=reason) from None

    def close(self) -> None:
        self.session.close()

    @property
    def connect_timeout(self) -> float:
        return self.timeout[0] if isinstance(self.timeout, tuple) else self.timeout

    def clone(self):
        """A client for the same servers and token with a session of its own, for
        another thread (a requests.Session is not meant to be shared by threads); it
        starts at this client's current URL."""
        copy = type(self)(self.base_urls, timeout=self.timeout, verify=self.verify)
        copy._current = self._current
        if "Authorization" in self.session.headers:
            copy.session.headers["Authorization"] = self.session.headers["Authorization"]
        return copy

    def healthz(self, timeout: float = 2.0) -> dict:
        return self._call("GET", "/healthz", timeout=timeout)


def _unreachable(method: str, path: str, tried: list[tuple[str, str]]) -> Unreachable:
    """The failure of a call, naming every URL it went to."""
    if len(tried) == 1:
        (base, reason), = tried
        return Unreachable(f"{method} {base}{path}: {reason}", base_url=base, reason=reason, tried=tried)
    reason = "; ".join(f"{base}: {why}" for base, why in tried)
    return Unreachable(f"{method} {path}: {reason}", reason=reason, tried=tried)


def _maybe_done(exc: requests.RequestException) -> bool:
    """Whether the server may have got the request and acted on it: anything but a
    connection that was never made (refused, timed out, a name that does not
    resolve, a failed TLS handshake)."""
    if isinstance(exc, (requests.ConnectTimeout, requests.exceptions.SSLError)):
        return False
    if isinstance(exc, requests.ConnectionError):
        cause = exc.args[0] if exc.args else None
        return not isinstance(getattr(cause, "reason", cause), urllib3.exceptions.NewConnectionError)
    return True


def _reason(exc: requests.RequestException) -> str:
    """A short reason for a failed call, instead of urllib3's nested repr."""
    if isinstance(exc, requests.ConnectTimeout):
        return "timed out connecting"
    if isinstance(exc, requests.ReadTimeout):
        return "timed out waiting for the answer"
    text = str(exc)
    if isinstance(exc, requests.exceptions.SSLError):
        if "CERTIFICATE_VERIFY_FAILED" in text:
            return "the server's TLS certificate is not trusted (give its CA bundle)"
        return f"TLS error: {text[:200]}"
    for known in ("Connection refused", "Name or service not known", "No route to host",
                  "Network is unreachable", "Connection reset by peer", "Temporary failure in name resolution"):
        if known in text:
            return known.lower()
    return f"{exc.__class__.__name__}: {text[:200]}"


def _seg(value: str) -> str:
    """An id as one path segment: a typed "job-1/../x" must not reach another route."""
    return quote(value, safe="")


def _rejected(response: requests.Response) -> Rejected:
    try:
        body = response.json()
    except ValueError:
        return Rejected(response.status_code, response.text[:200] or response.reason)
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return Rejected(response.status_code, body["error"], body)
    return Rejected(response.status_code, str(body)[:200])


def split_batches(entries: list[E], item_of: Callable[[E], dict], max_items: int, max_bytes: int) -> list[list[E]]:
    """`entries` in order, cut into batches of at most `max_items` whose items
    (`item_of(entry)`, the JSON objects sent) add up to about `max_bytes` at most; an
    item larger than that goes alone. No batch when there are no entries."""
    batches: list[list] = []
    size = 0
    for entry in entries:
        length = len(json.dumps(item_of(entry)))
        if not batches or len(batches[-1]) >= max_items or size + length > max_bytes:
            batches.append([])
            size = 0
        batches[-1].append(entry)
        size += length
    return batches


def _one_result_each(answer, count: int, route: str, what: str) -> list[dict]:
    """The `results` of a batch answer, checked: one object with an integer `code` per item sent."""
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or len(results) != count \
            or not all(isinstance(r, dict) and isinstance(r.get("code"), int) for r in results):
        raise ValueError(f"{route}: an answer without one result per {what}: {str(answer)[:200]}")
    return results


class RegistryClient(_Client):
    def register_node(self, node: dict) -> dict:
        return self._call("POST", "/nodes", json=node)

    def heartbeat(self, node_id: str, running: int | None = None, refusing_work: str | None = None) -> dict:
        """`refusing_work`: why the node takes no new work now; omitted when it does (the
        registry clears it, and a registry of the previous release is not sent a field it
        does not know)."""
        body = {} if running is None else {"running": running}
        if refusing_work is not None:
            body["refusing_work"] = refusing_work
        return self._call("POST", f"/nodes/{node_id}/heartbeat", json=body)

    def list_nodes(self, kind: str | None = None, status: str | None = None) -> list[dict]:
        params = {k: v for k, v in (("type", kind), ("status", status)) if v}
        return self._call("GET", "/nodes", params=params)

    def register_service(self, service: dict) -> dict:
        return self._call("POST", "/services", json=service)

    def list_services(self, **filters) -> list[dict]:
        return self._call("GET", "/services", params=filters)

    def remove_service(self, job_id: str, attempt: int | None = None) -> dict:
        """With `attempt`: only while the record is that attempt's (409 otherwise)."""
        params = {} if attempt is None else {"attempt": attempt}
        return self._call("DELETE", f"/services/{job_id}", params=params)

    def drain(self, node_id: str) -> dict:
        """No new work goes to the node; answers the node (`drained: true`)."""
        return self._call("POST", f"/nodes/{_seg(node_id)}/drain")

    def undrain(self, node_id: str) -> dict:
        return self._call("POST", f"/nodes/{_seg(node_id)}/undrain")

    def revoke_credential(self, node_id: str, min_generation: int | None = None) -> dict:
        """Refuse the node's credentials below a generation (control-plane/server/revocations.py). A
        named generation may be sent again; a raise by one only once."""
        body = {} if min_generation is None else {"min_generation": min_generation}
        return self._call("POST", f"/nodes/{_seg(node_id)}/credential/revoke", json=body,
                          resend=min_generation is not None)


@dataclass
class ClaimResult:
    jobs: list[dict]
    not_waited: str | None = None  # the X-Corral-Long-Poll header: "busy", "stopping" or "again"


def _idempotent(key: str | None) -> dict[str, str]:
    """The Idempotency-Key header of one logical submit: the caller's key, else a new one."""
    return {IDEMPOTENCY_HEADER: key or str(uuid.uuid4())}


class SchedulerClient(_Client):
    def submit_batch(self, requests_: list[dict], idempotency_key: str | None = None) -> list[dict]:
        """Submit up to 1,000 jobs in one transaction (all or nothing); the jobs, in order.
        Without an `idempotency_key`, one of its own (see submit)."""
        return self._call("POST", "/jobs/batch", json={"jobs": requests_}, headers=_idempotent(idempotency_key))

    def claim(self, node_id: str, max_jobs: int, wait_secs: float, limits_enforced: bool | None = None,
              default_limits: dict | None = None, private_tmp: bool | None = None) -> ClaimResult:
        """Take up to `max_jobs` jobs placed on `node_id`, waiting up to `wait_secs` for some
        (a long poll)."""
        body: dict[str, object] = {"max": max_jobs, "wait_secs": wait_secs}
        if limits_enforced is not None:
            body["limits_enforced"] = limits_enforced
        if private_tmp is not None:
            body["private_tmp"] = private_tmp
        if default_limits:
            body["default_limits"] = default_limits
        timeout = (self.connect_timeout, wait_secs + CLAIM_READ_MARGIN_SECS)
        # Not resent after a lost answer: it may have handed out jobs (the module's docstring).
        response = self._request("POST", f"/nodes/{_seg(node_id)}/claim", json=body, timeout=timeout, resend=False)
        jobs = self._json(response)
        if not isinstance(jobs, list):
            raise Unreachable(f"POST /nodes/{node_id}/claim: the answer is not a list of jobs",
                              base_url=self.base_url, reason="the answer is not a list of jobs")
        return ClaimResult(jobs, response.headers.get(LONG_POLL_HEADER))

    def report_batch(self, reports: list[dict]) -> list[dict]:
        """Send many status reports (each a report body plus `job_id`); one result per report,
        in order. ValueError when the answer does not have one."""
        return self.report_and_claim(reports, None)[0]

    def report_and_claim(self, reports: list[dict], claim: dict | None) -> tuple[list[dict], list[dict]]:
        """report_batch, with a claim riding on it (`claim`: node_id, max, limits_enforced,
        private_tmp, default_limits): the node's next jobs come back with the results, already running."""
        body: dict[str, object] = {"reports": reports}
        if claim is not None:
            body["claim"] = claim
        # Reports may be sent twice; a claim riding on them may not (the module's docstring).
        answer = self._call("POST", "/jobs/reports", json=body, resend=claim is None)
        results = _one_result_each(answer, len(reports), "POST /jobs/reports", "report")
        claimed = answer.get("claimed") if claim is not None else None
        if claimed is None:
            claimed = []
        elif not isinstance(claimed, list):
            raise ValueError("POST /jobs/reports: 'claimed' is not a list of jobs")
        return results, claimed

    def send_output(self, items: list[dict]) -> list[dict]:
        """Live output: the current tails of running jobs (`job_id`, `node_id`, `attempt`,
        and `stdout` and/or `stderr`); one result per item, in order (`code` 200: stored,
        409: the attempt is no longer running there). ValueError when the answer does not
        have one result per item."""
        answer = self._call("POST", "/jobs/output", json={"outputs": items})
        return _one_result_each(answer, len(items), "POST /jobs/output", "item")

    def put_log_chunk(self, job_id: str, attempt: int, stream: str, seq: int, data: bytes, offset: int,
                      final: bool, node_id: str) -> dict:
        """A chunk of an attempt's complete output (PUT /jobs/{id}/attempts/{n}/logs/...):
        the answer {"stored", "size", "complete", "next_seq"}. A refusal is Rejected, its
        `fields` say where the stream is (409: expected_seq, expected_offset)."""
        headers = {"Content-Type": "application/octet-stream", LOG_NODE_HEADER: node_id,
                   LOG_OFFSET_HEADER: str(offset)}
        if final:
            headers[LOG_FINAL_HEADER] = "1"
        return self._json(self._request("PUT", f"/jobs/{_seg(job_id)}/attempts/{attempt}/logs/{stream}/{seq}",
                                        data=data, headers=headers))

    def put_log_chunks(self, chunks: list[dict]) -> list[dict]:
        """Many small chunks at once (POST /jobs/logs; `data` in base64): one result per
        chunk, in order, each what put_log_chunk would have answered or refused (`code`).
        ValueError when the answer does not have one result per chunk."""
        answer = self._call("POST", "/jobs/logs", json={"chunks": chunks})
        return _one_result_each(answer, len(chunks), "POST /jobs/logs", "chunk")

    def submit(self, request: dict, idempotency_key: str | None = None) -> dict:
        """Submit one job. Without an `idempotency_key`, a random one of its own, so that a
        resend to another replica after a lost answer returns the job the first created."""
        return self._call("POST", "/jobs", json=request, headers=_idempotent(idempotency_key))

    def get_job(self, job_id: str) -> dict:
        return self._call("GET", f"/jobs/{_seg(job_id)}")

    def job_events(self, job_id: str) -> list[dict]:
        return self._call("GET", f"/jobs/{_seg(job_id)}/events")

    def cancel(self, job_id: str) -> dict:
        return self._call("POST", f"/jobs/{_seg(job_id)}/cancel")

    def drain(self, node_id: str, deadline_secs: float | None = None) -> dict:
        """No new work goes to the node from the answer on (the registry's flag and the
        scheduler's copy); with `deadline_secs`, what it runs is stopped that much later
        and requeued. Answers `{"node_id", "drained": true, "deadline", "stopping"}`."""
        body = {} if deadline_secs is None else {"deadline_secs": deadline_secs}
        return self._call("POST", f"/nodes/{_seg(node_id)}/drain", json=body)

    def undrain(self, node_id: str) -> dict:
        return self._call("POST", f"/nodes/{_seg(node_id)}/undrain")

    def retry(self, job_id: str) -> dict:
        """An operator's decision, taken once: not resent after a lost answer."""
        return self._call("POST", f"/jobs/{_seg(job_id)}/retry", resend=False)

    def list_jobs(self, **filters) -> list[dict]:
        return self._call("GET", "/jobs", params={k: v for k, v in filters.items() if v is not None})

    def list_jobs_page(self, **filters) -> tuple[list[dict], dict | None]:
        """One page of GET /jobs, and the query of the next page (from the `Link: rel="next"`
        header; None on the last page)."""
        response = self._request("GET", "/jobs", params={k: v for k, v in filters.items() if v is not None})
        link = response.links.get("next", {}).get("url")
        return self._json(response), dict(parse_qsl(urlsplit(link).query)) if link else None

    def pending_for(self, node_id: str) -> list[dict]:
        """What the agents poll: the pending jobs placed on `node_id`, up to its free slots."""
        return self.list_jobs(node_id=node_id, status=states.PENDING)

    def renew_lease(self, node_id: str, usage: dict | None = None) -> dict:
        """Tell the scheduler this node's agent is alive, and what its jobs use
        ({"memory_mb", "cpu_percent"}) when given; answers lease_secs and the attempts
        it has running on the node."""
        return self._call("POST", f"/nodes/{node_id}/lease", json={} if usage is None else {"usage": usage})

    def running_on(self, node_id: str) -> list[dict]:
        return self.list_jobs(node_id=node_id, status=states.RUNNING, limit=1000)

    def report(self, job_id: str, node_id: str, attempt: int, status: str, **result) -> dict:
        """Report a status change of one attempt. A Rejected(409) means the attempt is stale."""
        body = {"node_id": node_id, "attempt": attempt, "status": status, **result}
        return self._call("POST", f"/jobs/{job_id}/status", json=body)
