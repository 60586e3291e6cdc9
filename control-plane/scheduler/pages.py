"""Cutting a list answer to size.

A page holds at most `limit` items and about `max_bytes` of JSON, so no single request
makes a worker hold more than that (a job's env_vars and output tails can reach
megabytes). Pure."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Page:
    """The encoded items kept, in order, and the id of the last one when a next page
    may hold more (None: this is the last page)."""

    items: list[bytes]
    next_after: str | None

    def body(self) -> bytes:
        return b"[" + b",".join(self.items) + b"]"


def cut(encoded: Iterable[tuple[str, bytes]], limit: int, max_bytes: int) -> Page:
    """Take (id, JSON bytes) items in order until `limit` are kept or the next one would
    take the page past `max_bytes`; the first item is always kept, however large, so
    that every item can be read. `encoded` is consumed lazily: items past the cut are
    never encoded but for the one that did not fit."""
    items: list[bytes] = []
    size = 2  # the brackets
    last = None
    for item_id, data in encoded:
        extra = len(data) + (1 if items else 0)
        if items and size + extra > max_bytes:
            return Page(items, last)  # the rest goes on the next page
        items.append(data)
        size += extra
        last = item_id
        if len(items) >= limit:
            return Page(items, last)  # a full page: more may follow
    return Page(items, None)
