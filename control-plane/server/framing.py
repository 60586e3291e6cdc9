"""Has a whole HTTP/1.x request arrived? Pure logic over the bytes received so far.

The gunicorn worker's event loop (control-plane/server/connections.py) hands a
connection to a request thread only once this says the request is complete, so a
slow client holds no thread. It frames the request as gunicorn's parser does
(gunicorn/http/message.py and body.py), never more strictly, and parses nothing for
the application: gunicorn parses the same bytes again. Each scan looks only at what
arrived since the last one, so a request sent a byte at a time costs constant work per byte.
"""
from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass

from gunicorn.http.body import CHUNK_EXT_RE
from gunicorn.http.errors import (ChunkMissingTerminator, InvalidChunkExtension, InvalidChunkSize, InvalidHeader,
                                  InvalidHeaderName, InvalidRequestLine, LimitRequestHeaders, ObsoleteFolding,
                                  ParseException)

CRLF = b"\r\n"
END_OF_HEAD = b"\r\n\r\n"
HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
# Transfer codings gunicorn accepts before the final `chunked` (message.py).
CODINGS_BEFORE_CHUNKED = frozenset({b"identity", b"gzip", b"deflate", b"compress"})
# What gunicorn's parser refuses in a head (message.py): in the request line, any
# byte but printable ASCII and space (method and version are tokens, the target
# printable ASCII); in a header name, any byte that is not a token character; in a
# header value, control bytes but tab (RFC 9110 5.5).
NOT_REQUEST_LINE = re.compile(rb"[^\x20-\x7e]")
NOT_TOKEN = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")
NOT_FIELD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class Verdict(enum.Enum):
    # Not complete yet: keep reading.
    MORE = "more"
    # The head and the whole body are buffered (`end` is where the request ends; bytes
    # after it are the client's next request).
    COMPLETE = "complete"
    # Stop buffering and let gunicorn's parser decide: the head is malformed in a way
    # the parser refuses as soon as it reads these bytes (a request line or head over
    # its limit, a bare LF, conflicting framing headers), or the Content-Length is over
    # the services' limit, which the application refuses (413) without reading the body.
    HAND_OVER = "hand-over"
    # The head is malformed in a way gunicorn's parser refuses only once the head ends
    # (a bare CR, a NUL or other control byte, a header line without a colon, a folded
    # line, an empty request line): `problem` is the parser's error, and the loop
    # answers at once instead of holding the client until the read timeout.
    BAD_HEAD = "bad-head"
    # The chunked body is malformed: `problem` is the parser's own error. A chunk-size
    # line longer than gunicorn allows is refused even when complete (its parser would
    # wait for a chunk of absurd size); a chunk past the body limit is a BodyTooLarge (413).
    BAD_BODY = "bad-body"


@dataclass(frozen=True)
class Limits:
    """What a request may be, in bytes (from gunicorn's settings and the app's body limit)."""
    request_line: int   # gunicorn's limit_request_line
    head: int           # request line and headers together, as gunicorn's parser counts them
    body: int           # a body up to this size is buffered whole; a larger one is handed over
    chunk_line: int = 8190       # a chunk-size line (gunicorn: limit_request_field_size)
    trailers: int = 8190 * 32    # the trailer section of a chunked body
    obsolete_folding: bool = False  # gunicorn's permit_obsolete_folding: a header line may continue one
    # False: malformed heads are left to the parser (with gunicorn's proxy_protocol on, a
    # PROXY line, binary in its v2, comes before the request line)
    check_head: bool = True
    # Raises gunicorn's error for a request line it refuses (its parse_request_line with
    # the server's settings), so that one is refused before the rest of the head is in.
    request_line_check: Callable[[bytes], None] | None = None


def head_limit(request_line: int, fields: int, field_size: int) -> int:
    """Bytes after which gunicorn's parser refuses a head that has not ended: one
    empty line, the request line and its CRLF, and its header buffer
    (fields x (field_size + 2) + 4, message.py's max_buffer_headers)."""
    return 2 + request_line + 2 + fields * (field_size + 2) + 4


class BodyTooLarge(ParseException):
    """A chunked body whose chunks' sizes add up past the services' body limit."""

    def __init__(self, size: int, limit: int):
        super().__init__()
        self.size, self.limit = size, limit

    def __str__(self) -> str:
        return f"chunked body of at least {self.size} bytes, over the limit of {self.limit}"


class RequestScanner:
    """Frames one request. Call scan() with the whole buffer each time it grows
    (the buffer only ever grows while one request is scanned)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.verdict = Verdict.MORE
        self.end: int | None = None          # COMPLETE: where the request ends in the buffer
        self.expects_continue = False        # the head asked for `100 Continue`
        self.head_end: int | None = None     # where the body starts, once the head is in
        self.problem: ParseException | None = None  # BAD_HEAD, BAD_BODY: what is wrong with it
        self._seen = 0                       # bytes looked at by earlier scans
        self._search_from = 0                # where the current terminator search resumes
        self._length: int | None = None      # Content-Length of the body
        self._chunked = False
        self._state = "size"                 # chunked: "size", "data", "trailers"
        self._pos = 0                        # chunked: start of the current element
        self._chunk_left = 0
        self._body_bytes = 0
        self._head = HeadChecker(limits.obsolete_folding, limits.request_line_check) if limits.check_head else None
        self._trailers: HeadChecker | None = None  # chunked: checks the trailer section's lines

    def scan(self, buf: bytes | bytearray) -> Verdict:
        if self.verdict is Verdict.MORE:
            self.verdict = self._scan(buf)
        self._seen = len(buf)
        return self.verdict

    def _scan(self, buf) -> Verdict:
        if self.head_end is None:
            verdict = self._scan_head(buf)
            if verdict is not None:
                return verdict
        if self._chunked:
            return self._scan_chunked(buf)
        end = self.head_end + (self._length or 0)
        if len(buf) < end:
            return Verdict.MORE
        self.end = end
        return Verdict.COMPLETE

    # ---- the head ----------------------------------------------------------------------

    def _scan_head(self, buf) -> Verdict | None:
        """None once the head is in and its framing is known; else a verdict."""
        start = 2 if buf[:2] == CRLF else 0  # one empty line may precede the request line
        found = buf.find(END_OF_HEAD, max(start, self._search_from))
        if _bare_lf(buf, self._seen, len(buf) if found < 0 else found + 4):
            return Verdict.HAND_OVER  # gunicorn refuses a bare LF in the head at once
        # Up to the end of the last header line (the empty line after it is no header).
        problem = None if self._head is None else self._head.check(buf, start, len(buf) if found < 0 else found + 2)
        if problem is not None:
            self.problem = problem
            return Verdict.BAD_HEAD
        line_end = buf.find(CRLF, start)
        if line_end < 0:
            return Verdict.HAND_OVER if len(buf) - start - 2 > self.limits.request_line else Verdict.MORE
        if line_end - start > self.limits.request_line:
            return Verdict.HAND_OVER  # 414 from the parser
        if found < 0:
            self._search_from = max(start, len(buf) - 3)
            return Verdict.HAND_OVER if len(buf) > self.limits.head else Verdict.MORE
        self.head_end = found + 4
        return self._framing(bytes(buf[start:line_end]), bytes(buf[line_end + 2:found]))

    def _framing(self, request_line: bytes, header_block: bytes) -> Verdict | None:
        """How the body is framed, from the headers gunicorn frames it by."""
        lengths, codings, http_10 = [], [], request_line.endswith(b" HTTP/1.0")
        for line in header_block.split(CRLF) if header_block else ():
            name, colon, value = line.partition(b":")
            if not colon:
                continue  # the parser refuses it, before any body is read
            name, value = name.strip(b" \t").lower(), value.strip(b" \t")
            if name == b"content-length":
                lengths.append(value)
            elif name == b"transfer-encoding":
                codings += [v.strip(b" \t").lower() for v in value.split(b",")]
            elif name == b"expect":
                if value.lower() != b"100-continue":
                    return Verdict.HAND_OVER  # 417 from the parser
                self.expects_continue = not http_10
        if codings:
            if lengths or http_10 or codings[-1] != b"chunked" or \
                    not set(codings[:-1]) <= CODINGS_BEFORE_CHUNKED:
                return Verdict.HAND_OVER  # refused by the parser (400 or 501)
            self._chunked = True
            self._pos = self._search_from = self.head_end
            return None
        if len(lengths) > 1 or (lengths and not lengths[0].isdigit()):
            return Verdict.HAND_OVER  # 400 from the parser
        self._length = int(lengths[0]) if lengths else 0
        if self._length > self.limits.body:
            return Verdict.HAND_OVER  # the application answers 413 without reading it
        return None

    # ---- a chunked body ----------------------------------------------------------------

    def _scan_chunked(self, buf) -> Verdict:
        while True:
            if len(buf) - self.head_end > self.limits.body + self.limits.body // 8 + 65536:
                return Verdict.HAND_OVER  # a body of tiny chunks: framing beyond any real client's
            if self._state == "size":
                found = buf.find(CRLF, max(self._pos, self._search_from))
                line_length = (len(buf) if found < 0 else found) - self._pos
                if line_length > self.limits.chunk_line:
                    return self._bad(InvalidChunkSize(
                        b"line over %d bytes with no terminator" % self.limits.chunk_line))
                if found < 0:
                    self._search_from = max(self._pos, len(buf) - 1)
                    return Verdict.MORE
                size = _chunk_size(bytes(buf[self._pos:found]))
                if isinstance(size, ParseException):
                    return self._bad(size)
                if self._body_bytes + size > self.limits.body:
                    # Refused (413) from the chunk's size, as a sized body is from its length: the
                    # application would wait for the chunk's data, which may never come, to see it.
                    return self._bad(BodyTooLarge(self._body_bytes + size, self.limits.body))
                self._pos = self._search_from = found + 2
                self._state, self._chunk_left = ("data", size) if size else ("trailers", 0)
            elif self._state == "data":
                end = self._pos + self._chunk_left
                if len(buf) < end + 2:
                    return Verdict.MORE
                if buf[end:end + 2] != CRLF:
                    return self._bad(ChunkMissingTerminator(bytes(buf[end:end + 2])))
                self._body_bytes += self._chunk_left
                self._pos = self._search_from = end + 2
                self._state = "size"
            else:
                if len(buf) - self._pos < 2:
                    return Verdict.MORE
                if buf[self._pos:self._pos + 2] == CRLF:
                    self.end = self._pos + 2
                    return Verdict.COMPLETE
                found = buf.find(END_OF_HEAD, max(self._pos, self._search_from))
                # A trailer line gunicorn refuses is refused now, not once the section ends.
                if self._trailers is None:
                    self._trailers = HeadChecker(self.limits.obsolete_folding, request_line=False)
                problem = self._trailers.check(buf, self._pos, len(buf) if found < 0 else found + 2)
                if problem is not None:
                    return self._bad(problem)
                if found < 0:
                    self._search_from = max(self._pos, len(buf) - 3)
                    if len(buf) - self._pos > self.limits.trailers:
                        return self._bad(LimitRequestHeaders("limit request trailer section size"))
                    return Verdict.MORE
                self.end = found + 4
                return Verdict.COMPLETE

    def _bad(self, problem: ParseException) -> Verdict:
        self.problem = problem
        return Verdict.BAD_BODY


class HeadChecker:
    """Checks a head line by line as its bytes arrive, each byte once, for what
    gunicorn's parser refuses only once the whole head is in (message.py:
    parse_request_line, parse_headers). A bare LF is not looked for here (the
    scanner hands it to the parser, which refuses it at once)."""

    def __init__(self, folding: bool, line_check: Callable[[bytes], None] | None = None, request_line: bool = True):
        self.folding = folding
        self.line_check = line_check
        self.line_start = -1         # where the current line starts; -1: not yet known
        self.checked = 0             # bytes before this are checked
        self.request_line = request_line  # the current line is the request line (False: trailers)
        self.colon = -1              # the current header line's first colon; -1: none yet
        self.continued = False       # the current line continues the header before it
        self.name = ""               # the last header's name

    def check(self, buf, start: int, end: int) -> ParseException | None:
        """What gunicorn refuses in buf[:end] (the head, or what arrived of it), or None.
        `start`: where the request line starts (after an empty line before it)."""
        if self.line_start < 0:
            if len(buf) < 2 and buf[:1] == b"\r":
                return None  # an empty line before the request line, or a bare CR: the next byte says
            self.line_start = self.checked = start
        while True:
            line_end = buf.find(CRLF, self.checked, end)
            stop = end if line_end < 0 else line_end
            if line_end < 0 and stop > self.checked and buf[stop - 1] == 0x0D:
                stop -= 1  # a CR whose LF may come next
            # Any CR before `stop` is a bare one: the first CRLF ends the line.
            problem = self._part(buf, self.checked, stop)
            if problem is not None:
                return problem
            self.checked = stop
            if line_end < 0:
                return None
            problem = self._line_done(buf, line_end)
            if problem is not None:
                return problem
            self.line_start = self.checked = line_end + 2

    def _part(self, buf, at: int, stop: int) -> ParseException | None:
        """Check buf[at:stop], the next bytes of the current line."""
        if at >= stop:
            return None
        line = self.line_start
        if self.request_line:
            if NOT_REQUEST_LINE.search(buf, at, stop):
                return InvalidRequestLine(_text(buf[line:stop]))
            return None
        if at == line and buf[at] in b" \t":
            if not self.folding or not self.name:
                # gunicorn: a folded line, or a name that is no token (one that starts a head)
                return ObsoleteFolding(self.name.upper()) if self.name else InvalidHeaderName(_text(buf[line:stop]))
            self.continued = True
        if not self.continued and self.colon < 0:
            colon = buf.find(b":", at, stop)
            name_end = stop if colon < 0 else colon
            if colon == line:
                return InvalidHeader(_text(buf[line:stop]))  # no name before the colon
            if NOT_TOKEN.search(buf, at, name_end):
                return InvalidHeaderName(_text(buf[line:name_end]))
            if colon < 0:
                return None
            self.colon = colon
            at = colon + 1
        if NOT_FIELD_VALUE.search(buf, at, stop):
            name = self.name if self.continued else _text(buf[line:self.colon])
            return InvalidHeader(name.upper())
        return None

    def _line_done(self, buf, line_end: int) -> ParseException | None:
        """The current line ended at `line_end` (its CRLF)."""
        line = self.line_start
        if self.request_line:
            self.request_line = False
            if line_end == line:
                return InvalidRequestLine("")
            if self.line_check is not None:
                try:
                    self.line_check(bytes(buf[line:line_end]))
                except ParseException as exc:
                    return exc
            return None
        if not self.continued:
            if self.colon < 0:
                return InvalidHeader(_text(buf[line:line_end]))  # a header line without a colon
            self.name = _text(buf[line:self.colon])
        self.colon, self.continued = -1, False
        return None


def _text(data) -> str:
    return bytes(data[:200]).decode("latin-1")


def _bare_lf(buf, start: int, end: int) -> bool:
    """Whether an LF not preceded by CR is in buf[start:end]."""
    at = buf.find(b"\n", start, end)
    while at >= 0:
        if at == 0 or buf[at - 1] != 0x0D:
            return True
        at = buf.find(b"\n", at + 1, end)
    return False


def _chunk_size(line: bytes) -> int | ParseException:
    """The size on a chunk-size line, or the error gunicorn raises for the line
    (body.py's parse_chunk_size: the size is checked before the extension)."""
    size, semicolon, extension = line.partition(b";")
    if semicolon:
        if b"\r" in extension:
            return InvalidChunkExtension("bare CR not allowed")
        size = size.rstrip(b" \t")
    if not size or not set(size) <= HEX_DIGITS:
        return InvalidChunkSize(size)
    if semicolon and not CHUNK_EXT_RE.fullmatch(b";" + extension):
        return InvalidChunkExtension("invalid chunk extension")
    return int(size, 16)
