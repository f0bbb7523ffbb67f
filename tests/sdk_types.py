"""The official SDKs as the oracle of the wire formats (test-only dependencies: ``openai``, ``anthropic``,
``google-genai``): request bodies checked against the SDKs' request TypedDicts, every key known and every
value of its declared type (``conforms``), and reply fixtures against their response models.

The SDKs' own validation is lenient on purpose (pydantic ignores unknown keys in a TypedDict; the response
models allow extra fields), so ``conforms`` walks the TypedDicts itself and refuses a key the SDK does not
declare, and ``reply_problems`` refuses a reply field the response model does not declare."""
from __future__ import annotations

import collections.abc as cabc
import types
import typing
from typing import Any

import orjson
import pydantic
from typing_extensions import is_typeddict

_STRIP = {typing.Required, typing.NotRequired, typing.ReadOnly} if hasattr(typing, "ReadOnly") else {
    typing.Required, typing.NotRequired}


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) in _STRIP or typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def conforms(value: Any, tp: Any, path: str = "$") -> list[str]:
    """The problems of ``value`` against the type ``tp`` (a TypedDict, Union, Literal, list, dict, ...):
    unknown keys, missing required keys and values of another type, each with its path; [] when it conforms."""
    tp = _unwrap(tp)
    if tp is Any or tp is object:
        return []
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({tp.__name__}), got {type(value).__name__}"]
        hints = typing.get_type_hints(tp, include_extras=True)
        problems = [f"{path}.{k}: not a field of {tp.__name__}" for k in value if k not in hints]
        problems += [f"{path}.{k}: required by {tp.__name__}" for k in tp.__required_keys__ if k not in value]
        for k, v in value.items():
            if k in hints:
                problems += conforms(v, hints[k], f"{path}.{k}")
        return problems
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        branches = [conforms(value, a, path) for a in args]
        return [] if any(not b for b in branches) else min(branches, key=len)
    if origin is typing.Literal:
        return [] if value in args else [f"{path}: {value!r} is not one of {args}"]
    if tp is type(None):
        return [] if value is None else [f"{path}: expected null"]
    if origin in (list, cabc.Iterable, cabc.Sequence) or (isinstance(origin, type) and origin.__name__ == "SequenceNotStr"):
        if not isinstance(value, list):
            return [f"{path}: expected an array, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in conforms(v, args[0] if args else Any, f"{path}[{i}]")]
    if origin in (dict, cabc.Mapping) or tp is dict:
        return [] if isinstance(value, dict) else [f"{path}: expected an object"]
    if tp is float:
        return [] if isinstance(value, (int, float)) and not isinstance(value, bool) else [f"{path}: expected a number"]
    if tp in (int, str, bool):
        ok = isinstance(value, tp) and (tp is bool or not isinstance(value, bool))
        return [] if ok else [f"{path}: expected {tp.__name__}, got {type(value).__name__}"]
    if isinstance(tp, typing.TypeAliasType if hasattr(typing, "TypeAliasType") else ()):
        return conforms(value, tp.__value__, path)
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        try:
            tp.model_validate(value)
        except pydantic.ValidationError as exc:
            return [f"{path}: {exc}"]
        return []
    if isinstance(tp, type):
        return [] if isinstance(value, tp) else [f"{path}: expected {tp.__name__}"]
    return []  # a construct the SDKs do not use for these bodies


def extra_fields(model: pydantic.BaseModel, path: str = "$") -> list[str]:
    """Fields of a validated response ``model`` (at any depth) that its class does not declare."""
    out = [f"{path}.{k}: not a field of {type(model).__name__}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        out += _extra_in(getattr(model, name), f"{path}.{name}")
    return out


def _extra_in(value: Any, path: str) -> list[str]:
    if isinstance(value, pydantic.BaseModel):
        return extra_fields(value, path)
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _extra_in(v, f"{path}[{i}]")]
    return []


def reply_problems(model_cls: type[pydantic.BaseModel], reply: dict, allowed_extra: tuple[str, ...] = ()) -> list[str]:
    """Validate ``reply`` against an SDK response model strictly (no type coercion) and list what does not
    conform, or is not declared; ``allowed_extra`` are paths known to be gateway extensions (kept as such)."""
    try:  # as JSON, the way the SDK reads a reply: strict, but enums from their strings
        model = model_cls.model_validate_json(orjson.dumps(reply), strict=True)
    except pydantic.ValidationError as exc:
        return [str(exc)]
    return [p for p in extra_fields(model) if not p.startswith(allowed_extra)]
