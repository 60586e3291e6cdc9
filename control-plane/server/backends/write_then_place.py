"""How a write and the placement it calls for share transactions, per backend.

A write (a submit, a report) frees slots or adds work, and placement fills them
(control-plane/scheduler/service.py). With one writer at a time (SQLite) both
share one transaction: every write transaction is serialised anyway
(`one_transaction`). With several writers (PostgreSQL) the write commits first,
outside the placement lock, which then covers only the placement, and only on
the nodes it places on (`commit_then_place`): submits and reports commit side by
side (their disk flushes shared), none holds up anyone's placement, the reports
of different nodes place side by side, and new work with no free slot anywhere
takes no lock at all.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

log = logging.getLogger("corral.scheduler.service")  # what it logs is the scheduler's

T = TypeVar("T")
R = TypeVar("R")


class Placer(Protocol):
    """What a strategy asks of the scheduler."""

    def placing(self, only_places: bool = False, nodes: Collection[str] | None = None,
                skip_busy: bool = False) -> AbstractContextManager[Any]:
        """A transaction under the placement lock (on `nodes`; None: every node)."""

    def open_nodes(self) -> Collection[str]:
        """The nodes that have a free slot now (read without a lock)."""


class WriteThenPlace(Protocol):
    def __call__(self, placer: Placer, write: Callable[[], T], place: Callable[[T], R], nothing: R,
                 scope: Callable[[T], Collection[str] | None], new_work: bool, only_places: bool,
                 scope_ahead: Collection[str] | None) -> tuple[T, R]: ...


def one_transaction(placer: Placer, write: Callable[[], T], place: Callable[[T], R], nothing: R,
                    scope: Callable[[T], Collection[str] | None], new_work: bool, only_places: bool,
                    scope_ahead: Collection[str] | None) -> tuple[T, R]:
    """One writer at a time: the write and its placement in one transaction under the
    placement lock."""
    with placer.placing():
        result = write()
        return result, place(result) if scope(result) != set() else nothing


def commit_then_place(placer: Placer, write: Callable[[], T], place: Callable[[T], R], nothing: R,
                      scope: Callable[[T], Collection[str] | None], new_work: bool, only_places: bool,
                      scope_ahead: Collection[str] | None) -> tuple[T, R]:
    """Several writers: the write commits first, then its placement under the lock of
    the nodes it places on. A placement that fails after the write committed is
    logged, not raised (the client must learn that its write stands), and gives
    `nothing`: the background pass places what it left.

    `scope_ahead` (a superset of `scope(result)` known before the write): the write
    and its placement share one transaction on those nodes' locks, taken first (one
    commit instead of two for an agent's reports and the claim riding on them). Should
    that transaction fail, the write is tried alone as above, so a placement's failure
    never costs the write."""
    if scope_ahead is not None:
        try:
            with placer.placing(only_places=False, nodes=scope_ahead):
                result = write()
                return result, place(result) if scope(result) != set() else nothing
        except Exception:
            log.exception("a write and its placement in one transaction failed; the write goes alone")
    result = write()  # the store's transaction, where it needs one (a submit is one statement)
    nodes = scope(result)
    if nodes is not None and not nodes:
        return result, nothing
    if new_work:
        # The nodes with a free slot (read after the commit, without a lock), which
        # the placement locks, but for those another placement holds (that one, or
        # the node's next claim, or the background pass, takes the oldest waiting
        # work there). None: nothing to place into, and a slot freed later is
        # filled by the placement of whoever frees it, which reads the queue after
        # that commit and so sees this write.
        nodes = placer.open_nodes()
        if not nodes:
            return result, nothing
    try:
        with placer.placing(only_places, nodes, skip_busy=new_work):
            return result, place(result)
    except Exception:
        log.exception("placement after a committed write failed; the background pass places it")
        return result, nothing
