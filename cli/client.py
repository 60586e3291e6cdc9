"""The scheduler's calls only `corral` makes: why a job waits, the nodes' figures,
arrays and concurrency limits (the shared client has what the agents use too)."""
from urllib.parse import quote

from corral.shared.clients import SchedulerClient


def _seg(value: str) -> str:
    """An id as one path segment: a typed "array-1/../x" must not reach another route."""
    return quote(value, safe="")


class CliSchedulerClient(SchedulerClient):
    def why(self, job_id: str) -> dict:
        return self._call("GET", f"/jobs/{_seg(job_id)}/why")

    def list_nodes(self) -> list[dict]:
        return self._call("GET", "/nodes")

    def get_array(self, array_id: str) -> dict:
        return self._call("GET", f"/arrays/{_seg(array_id)}")

    def cancel_array(self, array_id: str) -> dict:
        return self._call("POST", f"/arrays/{_seg(array_id)}/cancel")

    def list_concurrency(self) -> list[dict]:
        return self._call("GET", "/concurrency")

    def set_concurrency(self, key: str, limit: int) -> dict:
        return self._call("PUT", f"/concurrency/{_seg(key)}", json={"limit": limit})

    def remove_concurrency(self, key: str) -> None:
        # The 204 has no body to read.
        self._request("DELETE", f"/concurrency/{_seg(key)}")
