"""What both services' HTTP contracts are made of: pydantic models of request and
answer bodies, and the one-line refusals of a bad request.

A `Request` is strict (no coercion, no unknown fields, null is "not given"), and
`Request.check(body)` words pydantic's first error as Corral does ("'port' must be
between 1 and 65535"), from the kind of error, the field and its `Says` metadata.
`Answer` models are what the views fill and `respond` sends; the OpenAPI documents
are generated from both (control-plane/server/openapi.py).
"""
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from flask import Response, current_app
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from corral.shared.errors import BadRequest
from corral.shared.validate import NAME_PATTERN

# Patterns in the dialect both pydantic (Rust regex) and JSON Schema (ECMA 262) read
# alike: `$` is the end of the text only, so "node-1\n" is no name.
M = typing.TypeVar("M", bound=BaseModel)

NO_NUL_PATTERN = r"^[^\x00]*$"
NAME_WHAT = "letters, digits, '.', '_' or '-' (at most 128)"


@dataclass(frozen=True)
class Says:
    """How a field's refusals read. `what` a matching string (or a map's key) is;
    `every`: the sentence, after the field's name, of any refusal of the value itself
    (its type or range); `hint`: what to do about a string that is too long."""

    what: str = ""
    every: str = ""
    hint: str = ""


def refused(message: str) -> PydanticCustomError:
    """A refusal with its own sentence, raised by a validator."""
    return PydanticCustomError("refused", "{message}", {"message": message})


class Request(BaseModel):
    """A request body."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)

    @classmethod
    def check(cls, body: Any) -> typing.Self:
        """The body as this model, or a BadRequest with the first refusal."""
        try:
            return cls.model_validate(body)
        except ValidationError as exc:
            raise BadRequest(refusal(cls, exc.errors(include_url=False))) from None


class Answer(BaseModel):
    """An answer body (or part of one)."""

    model_config = ConfigDict(use_attribute_docstrings=True)


_DEFAULTS: dict[type[BaseModel], dict[str, Any]] = {}


def built(model: type[M], fields: dict[str, Any]) -> M:
    """`model` with these values, not validated: for answers built from rows the store
    wrote after validating them, many to an answer (a batch answers 500 jobs, and
    validating them again was a tenth of its time; `model_construct` is slower still,
    a Python loop over the fields). Fields not given take their defaults and are left
    out of the JSON, as with validation; the JSON has the keys in the order given
    (the model's order, as validation writes them, when given so). Nested models
    must be given as models (`built` them too). The API tests check such answers
    against their schemas."""
    defaults = _DEFAULTS.get(model)
    if defaults is None:
        defaults = _DEFAULTS[model] = {name: info.default for name, info in model.model_fields.items()
                                       if not info.is_required()}
    instance = model.__new__(model)
    values = dict(fields)
    for name, default in defaults.items():
        values.setdefault(name, default)
    object.__setattr__(instance, "__dict__", values)
    object.__setattr__(instance, "__pydantic_fields_set__", set(fields))
    object.__setattr__(instance, "__pydantic_extra__", None)
    object.__setattr__(instance, "__pydantic_private__", None)
    return instance


def optional_key(**constraints: Any) -> Any:
    """A field of an answer that is left out when it does not apply (neither null nor required):
    answers are serialized without the fields their view did not set."""
    return Field(default=None, json_schema_extra=_no_default, **constraints)


def _no_default(schema: dict) -> None:
    schema.pop("default", None)


# ---- pieces both services use ---------------------------------------------------

Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
"""ISO-8601 UTC with milliseconds, e.g. 2026-11-29T08:00:00.000Z (shared.timeutil.iso)."""


Text = Annotated[str, Field(min_length=1, pattern=NO_NUL_PATTERN)]
"""A non-empty string without NUL characters (its field sets its max_length)."""
Name = Annotated[str, Field(min_length=1, pattern=NAME_PATTERN), Says(what=NAME_WHAT)]
"""A node's or a job's name."""
NodeId = Annotated[str, Field(min_length=1, pattern=NAME_PATTERN), Says(what="a node id")]
MapValue = Annotated[str, Field(max_length=32 * 1024, pattern=NO_NUL_PATTERN)]
MAP_SAYS = Says(every="must be an object of strings")
MAX_MAP_ENTRIES = 256


class Error(Answer):
    """Every error answer."""

    error: str
    """What was wrong, for a human."""


class ItemError(Answer):
    index: int = Field(ge=0)
    error: str


class BatchError(Answer):
    """A batch with invalid items: `errors` names each one by its index; nothing was stored."""

    error: str
    """A summary, for a human."""
    errors: list[ItemError] = optional_key()


class Health(Answer):
    status: Literal["ok"]


class Readiness(Answer):
    status: Literal["ready", "not ready"]
    error: str = optional_key()
    """Why it is not ready."""
    checks: dict[str, Any]
    """What was checked, and what it found."""


# ---- answering -------------------------------------------------------------------

_ADAPTERS: dict[Any, TypeAdapter] = {}


def encode(value: Answer) -> bytes:
    """An answer's JSON, as its model serializes it: an optional key left unset is left out."""
    return value.__pydantic_serializer__.to_json(value, by_alias=True, exclude_unset=True)


def respond(value: Answer | list, status: int = 200, of: Any = None) -> Response:
    """A JSON answer serialized by its model (a list needs `of`: its type, e.g. list[Job])."""
    if isinstance(value, Answer):
        data = encode(value)
    else:
        adapter = _ADAPTERS.get(of)
        if adapter is None:
            adapter = _ADAPTERS[of] = TypeAdapter(of)
        data = adapter.dump_json(value, by_alias=True, exclude_unset=True)
    return current_app.response_class(data, status=status, mimetype="application/json")


# ---- refusals --------------------------------------------------------------------

def refusal(model: type[BaseModel], errors: list[Any]) -> str:
    """The one refusal to answer for pydantic's `errors` about a body of `model`: the
    first error, unless an object it is in has unknown fields (checked first, as the
    list of allowed fields is the most useful answer)."""
    first = errors[0]
    owners = [e["loc"][:-1] for e in errors
              if e["type"] == "extra_forbidden" and first["loc"][:len(e["loc"]) - 1] == e["loc"][:-1]]
    if owners:
        return _unknown_fields(model, min(owners, key=len), errors)
    return _sentence(model, first)


def _unknown_fields(model: type[BaseModel], where: tuple, errors: list[Any]) -> str:
    names = sorted(e["loc"][-1] for e in errors if e["type"] == "extra_forbidden" and e["loc"][:-1] == where)
    owner: type[BaseModel] | None = model
    for part in where:  # down to the object that has the unknown fields
        if owner is not None and isinstance(part, str):
            owner = _model_in(owner.model_fields[part].annotation) if part in owner.model_fields else None
    allowed = ", ".join(sorted((owner or model).model_fields))
    return f"unknown field {names[0]!r}; allowed fields: {allowed}"


def _walk(model: type[BaseModel], loc: tuple) -> tuple[str, FieldInfo | None, tuple]:
    """The innermost field `loc` names: (its name, its FieldInfo, what of loc is past
    it: a map's key, an item's index)."""
    current: type[BaseModel] | None = model
    name, info, rest = "", None, loc
    for i, part in enumerate(loc):
        if current is not None and isinstance(part, str) and part in current.model_fields:
            name, info, rest = part, current.model_fields[part], loc[i + 1:]
            current = _model_in(info.annotation)
        elif not isinstance(part, int):
            current = None  # a map's key: nothing below it is a model
    return name, info, rest


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _metadata(info: FieldInfo | None) -> list:
    """The field's metadata and that of Annotated types in its annotation (`NodeId | None`)."""
    if info is None:
        return []
    found = list(info.metadata)
    stack = [info.annotation]
    while stack:
        annotation = stack.pop()
        found += getattr(annotation, "__metadata__", ())
        stack += typing.get_args(annotation)
    return found


def _says(info: FieldInfo | None) -> Says:
    return next((item for item in _metadata(info) if isinstance(item, Says)), Says())


def _bound(info: FieldInfo | None, name: str) -> Any:
    """A constraint of the field: "ge", "le", "min_length", "max_length"."""
    return next((getattr(item, name) for item in _metadata(info) if hasattr(item, name)), None)


def _choices(annotation: Any) -> list[str]:
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return [choice for arg in typing.get_args(annotation) for choice in _choices(arg)]


def _sentence(model: type[BaseModel], error: Any) -> str:
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "refused":
        return ctx["message"]
    name, info, rest = _walk(model, tuple(error["loc"]))
    says = _says(info)
    if kind == "missing":
        return f"{name!r} is required"
    if rest and not isinstance(rest[0], int):  # an entry of a map
        key = rest[0]
        if rest[-1] == "[key]":
            return f"{name!r} key {key!r} is not {says.what}"
        if kind == "string_type":
            return f"{name!r} value for {key!r} must be a string"
        return f"{name!r} value for {key!r} is too long or contains NUL"
    if value is None and (kind.endswith("_type") or kind == "literal_error"):
        return f"{name!r} is required"  # null counts as not given
    if kind == "too_long" and isinstance(value, dict):
        return f"{name!r} has more than {ctx['max_length']} entries"
    if kind in ("too_short", "too_long"):
        return (f"{name!r} must hold {_bound(info, 'min_length')} to {_bound(info, 'max_length')} "
                f"items, not {len(value)}")
    if says.every:
        return f"{name!r} {says.every}"
    if kind == "list_type":
        return f"{name!r} must be a JSON array"
    if kind == "string_pattern_mismatch":
        if "\x00" in value:
            return f"{name!r} must not contain NUL characters"
        return f"{name!r} must be {says.what or 'of the form ' + ctx['pattern']}"
    if kind in ("string_type", "literal_error") and not isinstance(value, str):
        return f"{name!r} must be a string"
    if kind == "literal_error":
        return f"{name!r} must be one of {', '.join(_choices(info.annotation if info else None))}"
    if kind in ("greater_than_equal", "less_than_equal"):
        return f"{name!r} must be between {_bound(info, 'ge')} and {_bound(info, 'le')}"
    if kind == "string_too_long":
        return f"{name!r} is longer than {ctx['max_length']} characters" + (f"; {says.hint}" if says.hint else "")
    return f"{name!r} {_PHRASES.get(kind, 'is not valid')}"


_PHRASES = {
    "string_too_short": "must not be empty",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "bool_type": "must be true or false",
    "dict_type": "must be an object",
    "model_type": "must be an object",
}
