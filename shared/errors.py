"""The error hierarchy. One Flask handler (shared.http) maps these to JSON answers."""


class CorralError(Exception):
    """Root of every error Corral raises on purpose; `status` is the HTTP code."""

    status = 500

    def __init__(self, message: str, **fields):
        super().__init__(message)
        self.message = message
        self.fields = fields  # more of the answer, for a client that acts on it (expected_seq)


class BadRequest(CorralError):
    status = 400


class BatchError(BadRequest):
    """Items of a batch are invalid: `errors` lists {"index": i, "error": "..."}, one per
    bad item, and nothing of the batch was stored. Answered as 400 with both `error`
    (a summary) and `errors`."""

    def __init__(self, errors: list[dict]):
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"item {first['index']}: {first['error']}{more}; nothing was stored")
        self.errors = errors


class Forbidden(CorralError):
    """The caller's token is valid but not for this: the other role, or another node."""

    status = 403


class NotFound(CorralError):
    status = 404


class Conflict(CorralError):
    """An illegal state transition, a stale attempt, a report from the wrong node."""

    status = 409


class TooLarge(CorralError):
    status = 413


class TooManyRequests(CorralError):
    """A bound on what may wait (MAX_PENDING_JOBS) refuses more for now: nothing was
    changed; try again after `retry_after` seconds (the Retry-After header)."""

    status = 429

    def __init__(self, message: str, retry_after: int, **fields):
        super().__init__(message, **fields)
        self.retry_after = retry_after


class Unavailable(CorralError):
    """A service the request needs (S3) did not answer: nothing was changed, retry shortly."""

    status = 503


class SettingError(CorralError):
    """A setting (environment variable or flag) has a value that cannot be used."""
