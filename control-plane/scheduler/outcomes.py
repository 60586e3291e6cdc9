"""What became of one item of a batch request (outcomes the store hands to views.py).

An agent's report, an output tail, a log chunk: applied, with what it left, or refused,
with why. The store and job_logs.py return these plain results; views.py shapes them
into the answers' items."""
from dataclasses import dataclass
from typing import Generic, TypeVar

from corral.shared.errors import CorralError

T = TypeVar("T")


@dataclass(frozen=True)
class JobState:
    """A job's status and attempt as an item left them."""

    status: str
    attempt: int


@dataclass(frozen=True)
class LogPosition:
    """Where a job's log stream is after a chunk: whether the chunk was stored (False: a
    repeat), the stream's bytes, whether its final chunk came, the seq its next one takes."""

    stored: bool
    size: int
    complete: bool
    next_seq: int


@dataclass(frozen=True)
class ItemOutcome(Generic[T]):
    index: int                        # the item's place in the request
    job_id: str                       # the job it names
    value: T | None = None            # applied: what it left (None where nothing is said)
    error: CorralError | None = None  # refused: why (nothing of the item was written)
