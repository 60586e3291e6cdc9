"""Test helpers: wait on conditions with a deadline instead of sleeping."""
import time


def wait_for(predicate, timeout=10.0, interval=0.05, message="condition"):
    """Poll `predicate` until it returns something truthy and return that; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # a server that is not up yet, for instance
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {message}{detail}")
        time.sleep(interval)
