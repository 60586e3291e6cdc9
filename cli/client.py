"""The scheduler's calls only `corral` makes: why a job waits, the nodes' figures,
arrays and concurrency limits, users, teams, personal tokens and the audit log (the
shared client has what the agents use too)."""
from urllib.parse import quote

import requests

from corral.shared.clients import SchedulerClient

# An event stream's read timeout: well above the server's keep-alive period (15 s by
# default), so that only a dead connection reaches it; the stream is then reopened.
EVENTS_READ_TIMEOUT_SECS = 65.0


def _seg(value: str) -> str:
    """An id as one path segment: a typed "array-1/../x" must not reach another route."""
    return quote(value, safe="")


class CliSchedulerClient(SchedulerClient):
    def why(self, job_id: str) -> dict:
        return self._call("GET", f"/jobs/{_seg(job_id)}/why")

    def list_nodes(self) -> list[dict]:
        return self._call("GET", "/nodes")

    def revoke_credential(self, node_id: str, min_generation: int | None = None) -> dict:
        """On the registry and the scheduler at once; a raise by one is not resent after a
        lost answer (a named generation is)."""
        body = {} if min_generation is None else {"min_generation": min_generation}
        return self._call("POST", f"/nodes/{_seg(node_id)}/credential/revoke", json=body,
                          resend=min_generation is not None)

    def get_array(self, array_id: str) -> dict:
        return self._call("GET", f"/arrays/{_seg(array_id)}")

    def cancel_array(self, array_id: str) -> dict:
        return self._call("POST", f"/arrays/{_seg(array_id)}/cancel")

    def list_concurrency(self) -> list[dict]:
        return self._call("GET", "/concurrency")

    def set_concurrency(self, key: str, limit: int, team: str | None = None) -> dict:
        body: dict = {"limit": limit} if team is None else {"limit": limit, "team": team}
        return self._call("PUT", f"/concurrency/{_seg(key)}", json=body)

    def remove_concurrency(self, key: str) -> None:
        # The 204 has no body to read.
        self._request("DELETE", f"/concurrency/{_seg(key)}")

    def list_schedules(self) -> list[dict]:
        return self._call("GET", "/schedules")

    def create_schedule(self, body: dict) -> dict:
        return self._call("POST", "/schedules", json=body)

    def get_schedule(self, name: str) -> dict:
        return self._call("GET", f"/schedules/{_seg(name)}")

    def change_schedule(self, name: str, changes: dict) -> dict:
        return self._call("PATCH", f"/schedules/{_seg(name)}", json=changes)

    def delete_schedule(self, name: str) -> None:
        self._request("DELETE", f"/schedules/{_seg(name)}")

    def schedule_runs(self, name: str, limit: int) -> list[dict]:
        return self._call("GET", f"/schedules/{_seg(name)}/runs", params={"limit": limit})

    def job_logs(self, job_id: str, stream: str, offset: int, attempt: int | None = None) -> requests.Response:
        """Up to a chunk of a job's complete output from `offset` (GET /jobs/{id}/logs):
        the answer, whose body is the bytes and whose headers say the stream's size."""
        params: dict = {"stream": stream, "offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        return self._request("GET", f"/jobs/{_seg(job_id)}/logs", params=params)

    def events(self, params: dict, last_event_id: str | None) -> requests.Response:
        """`GET /events` as it comes (the caller reads it with shared/sse.py and closes it)."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        return self._request("GET", "/events", params=params, headers=headers, stream=True,
                             timeout=(self.connect_timeout, EVENTS_READ_TIMEOUT_SECS))

    def whoami(self) -> dict:
        return self._call("GET", "/whoami")

    def create_token(self, body: dict) -> dict:
        """Not resent after a lost answer: a second token would be made, the first one's
        secret lost with the answer."""
        return self._call("POST", "/tokens", json=body, resend=False)

    def list_tokens(self, user: str | None = None) -> list[dict]:
        return self._call("GET", "/tokens", params={"user": user} if user else None)

    def revoke_token(self, token_id: str) -> dict:
        return self._call("DELETE", f"/tokens/{_seg(token_id)}")

    def create_user(self, body: dict) -> dict:
        return self._call("POST", "/users", json=body)

    def list_users(self) -> list[dict]:
        return self._call("GET", "/users")

    def delete_user(self, name: str) -> None:
        self._request("DELETE", f"/users/{_seg(name)}")

    def create_team(self, name: str) -> dict:
        return self._call("POST", "/teams", json={"name": name})

    def list_teams(self) -> list[dict]:
        return self._call("GET", "/teams")

    def change_team(self, name: str, changes: dict) -> dict:
        return self._call("PATCH", f"/teams/{_seg(name)}", json=changes)

    def delete_team(self, name: str) -> None:
        self._request("DELETE", f"/teams/{_seg(name)}")

    def fair_share(self) -> dict:
        return self._call("GET", "/usage/fair-share")

    def quota(self, team: str) -> dict:
        return self._call("GET", f"/teams/{_seg(team)}/quota")

    def set_quota(self, team: str, body: dict) -> dict:
        return self._call("PUT", f"/teams/{_seg(team)}/quota", json=body)

    def delete_quota(self, team: str) -> None:
        self._request("DELETE", f"/teams/{_seg(team)}/quota")

    def set_member(self, team: str, user: str, role: str) -> dict:
        return self._call("PUT", f"/teams/{_seg(team)}/members/{_seg(user)}", json={"role": role})

    def remove_member(self, team: str, user: str) -> None:
        self._request("DELETE", f"/teams/{_seg(team)}/members/{_seg(user)}")

    def usage(self, params: dict) -> dict:
        """`GET /usage`: `{"from_day", "to_day", "group_by", "rows": [...]}`."""
        return self._call("GET", "/usage", params={k: v for k, v in params.items() if v is not None})

    def audit(self, params: dict) -> dict:
        """One page of `GET /audit`: `{"events": [...], "next_before": id or None}`."""
        return self._call("GET", "/audit", params={k: v for k, v in params.items() if v is not None})
