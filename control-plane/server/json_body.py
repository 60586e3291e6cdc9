"""Decoding a JSON request body strictly. Pure: bytes in, a Python value or JSONBodyError out.

Python's json module accepts more than the services can store or answer: NaN and
Infinity, numbers too large for a float, duplicate keys (the last one wins), and
string escapes of lone UTF-16 surrogates (`"\\ud800"`), which decode to a str that
cannot be encoded to UTF-8, so the database write fails. `decode` refuses all of
these, and bodies that are not UTF-8, with a message that says what is wrong.
"""
import json
import math
import re
import sys
from typing import Any


class JSONBodyError(ValueError):
    """The body is not JSON the services accept (a ValueError, as json's own errors are)."""


# A surrogate in a decoded string can only come from a \uD800-\uDFFF escape, because
# the body is decoded as strict UTF-8 first. Nearly no body has one, so this cheap scan
# of the text decides whether the decoded value is walked at all. It also matches an
# escaped backslash followed by "ud800" (a false alarm that the walk clears).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_constant(name: str) -> float:
    raise JSONBodyError(f"the body holds {name}, which is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JSONBodyError(f"the number {text[:32]}{'...' if len(text) > 32 else ''} is too large")
    return value


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JSONBodyError(f"the body has the key {_printable(key)!r} twice in one object")
            seen.add(key)
    return obj


# One decoder for every call (json.loads with hooks would build a new one each time).
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_refuse_constant,
                            object_pairs_hook=_object_without_duplicates)


def decode(raw: bytes | str) -> Any:
    """The JSON value of a request body; JSONBodyError when it is not acceptable."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONBodyError(f"the body is not valid UTF-8 (byte 0x{raw[exc.start]:02x} "
                                f"at offset {exc.start})") from None
    else:
        text = raw
    if text.startswith("\ufeff"):
        raise JSONBodyError("the body starts with a byte order mark; send UTF-8 JSON without one")
    try:
        value = _DECODER.decode(text)
    except JSONBodyError:
        raise
    except json.JSONDecodeError as exc:
        raise JSONBodyError(f"the body is not valid JSON: {exc}") from None
    except ValueError:
        # The only other ValueError of the decoder: an integer longer than Python
        # converts (sys.get_int_max_str_digits(), a guard against quadratic parsing).
        raise JSONBodyError(f"the body holds an integer of more than {sys.get_int_max_str_digits()} "
                            f"digits") from None
    except RecursionError:
        raise JSONBodyError("the body is nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text):
        where = _lone_surrogate(value)
        if where is not None:
            raise JSONBodyError(f"the string at {where} holds a lone UTF-16 surrogate escape "
                                f"(\\ud800-\\udfff without its pair), which is not a character")
    return value


def _lone_surrogate(value: Any) -> str | None:
    """Where in `value` (keys and values, at any depth) a string holds a surrogate:
    a path such as `jobs[0].command`, or None. A loop, not recursion: the value may
    be nested nearly as deep as the recursion limit."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path or "the top level"
        elif isinstance(item, dict):
            for key, member in item.items():
                member_path = f"{path}.{_printable(key)}" if path else _printable(key)
                if _SURROGATE.search(key):
                    return f"{member_path} (a key)"
                stack.append((member_path, member))
        elif isinstance(item, list):
            stack.extend((f"{path}[{index}]", member) for index, member in enumerate(item))
    return None


def _printable(key: str) -> str:
    """A key as it can appear in a message: surrogates escaped, at most 64 characters."""
    shown = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return shown if len(shown) <= 64 else shown[:61] + "..."
