"""Reading a Server-Sent Events stream (the scheduler's `GET /events`), as the HTML
specification's parser does: lines end in LF, CRLF or CR; a blank line ends an
event; `id` sets the position (even in a block with no data: the stream's keep-
alives carry it); `event` names the type (default "message"); `data` lines are
joined with LF; lines starting with ':' are comments."""
from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Message:
    id: str | None     # the stream's position after this event (Last-Event-ID to resume)
    event: str
    data: str


class Parser:
    """Feed it text as it arrives; it yields whole events. `last_id` is where the
    stream has got to (what to send as Last-Event-ID on reconnecting)."""

    def __init__(self, last_id: str | None = None):
        self.last_id = last_id
        self._buffer = ""
        self._event = ""
        self._data: list[str] = []

    def feed(self, text: str) -> Iterator[Message]:
        self._buffer += text
        while True:
            match = _LINE_END.search(self._buffer)
            # A CR at the very end may be the first half of a CRLF: wait for more.
            if match is None or (match.group() == "\r" and match.end() == len(self._buffer)):
                return
            line, self._buffer = self._buffer[:match.start()], self._buffer[match.end():]
            message = self._line(line)
            if message is not None:
                yield message

    def _line(self, line: str) -> Message | None:
        if not line:
            data, event = self._data, self._event or "message"
            self._data, self._event = [], ""
            if not data:
                return None
            return Message(self.last_id, event, "\n".join(data))
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self.last_id = value
        return None


def messages(chunks: Iterable[bytes], parser: Parser | None = None) -> Iterator[Message]:
    """The events of a stream of byte chunks (UTF-8, split anywhere)."""
    parser = parser or Parser()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in chunks:
        yield from parser.feed(decoder.decode(chunk))
    yield from parser.feed(decoder.decode(b"", final=True))
