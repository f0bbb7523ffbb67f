"""The official SDKs as the oracle of the wire formats (test-only dependencies: ``openai``,
``anthropic``, ``google-genai``): request bodies checked against the SDKs' request TypedDicts, every
key known and every value of its declared type (``conforms``), and reply fixtures against their
response models.

The SDKs' own validation is lenient on purpose (pydantic ignores unknown keys in a TypedDict; the
response models allow or drop extra fields), so ``conforms`` walks the TypedDicts itself and refuses
a key the SDK does not declare, and ``reply_problems`` (``unknown_keys``) refuses a reply field the
response model does not declare."""

from __future__ import annotations

import collections.abc as cabc
import types
import typing
from typing import Any

import orjson
import pydantic
from anthropic.types import message_create_params
from openai.types.chat import completion_create_params
from typing_extensions import is_typeddict

OPENAI_BODY = completion_create_params.CompletionCreateParamsNonStreaming
"""The OpenAI SDK's type of a Chat Completions request body (non-streaming)."""
ANTHROPIC_BODY = message_create_params.MessageCreateParamsNonStreaming
"""The Anthropic SDK's type of a Messages request body (non-streaming)."""

_STRIP = (
    {typing.Required, typing.NotRequired, typing.ReadOnly}
    if hasattr(typing, "ReadOnly")
    else {typing.Required, typing.NotRequired}
)


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) in _STRIP or typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def conforms(value: Any, tp: Any, path: str = "$") -> list[str]:
    """The problems of ``value`` against the type ``tp`` (a TypedDict, Union, Literal, list, dict,
    ...): unknown keys, missing required keys and values of another type, each with its path; []
    when it conforms."""
    tp = _unwrap(tp)
    if tp is Any or tp is object:
        return []
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({tp.__name__}), got {type(value).__name__}"]
        hints = typing.get_type_hints(tp, include_extras=True)
        problems = [f"{path}.{k}: not a field of {tp.__name__}" for k in value if k not in hints]
        # required keys from the hints themselves (the SDKs' string annotations hide Required from
        # __required_keys__), and those of a total class among its bases (__required_keys__: the
        # keys a base with total=False declares, inherited by a total subclass such as
        # CompletionCreateParamsStreaming, stay optional)
        required = [
            k
            for k, h in hints.items()
            if typing.get_origin(h) is typing.Required
            or (k in tp.__required_keys__ and typing.get_origin(h) is not typing.NotRequired)
        ]
        problems += [f"{path}.{k}: required by {tp.__name__}" for k in required if k not in value]
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
    if origin in (list, cabc.Iterable, cabc.Sequence) or (
        isinstance(origin, type) and origin.__name__ == "SequenceNotStr"
    ):
        if not isinstance(value, list):
            return [f"{path}: expected an array, got {type(value).__name__}"]
        return [
            p
            for i, v in enumerate(value)
            for p in conforms(v, args[0] if args else Any, f"{path}[{i}]")
        ]
    if origin in (dict, cabc.Mapping) or tp is dict:
        return [] if isinstance(value, dict) else [f"{path}: expected an object"]
    if tp is float:
        return (
            []
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            else [f"{path}: expected a number"]
        )
    if tp in (int, str, bool):
        ok = isinstance(value, tp) and (tp is bool or not isinstance(value, bool))
        return [] if ok else [f"{path}: expected {tp.__name__}, got {type(value).__name__}"]
    if isinstance(tp, typing.TypeAliasType if hasattr(typing, "TypeAliasType") else ()):
        return conforms(value, tp.__value__, path)
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        try:
            tp.model_validate_json(orjson.dumps(value), strict=True)
        except pydantic.ValidationError as exc:
            return [f"{path}: {exc}"]
        return unknown_keys(value, tp, path)
    if isinstance(tp, type):
        return [] if isinstance(value, tp) else [f"{path}: expected {tp.__name__}"]
    return []  # a construct the SDKs do not use for these bodies


def unknown_keys(value: Any, cls: type[pydantic.BaseModel], path: str = "$") -> list[str]:
    """Keys of ``value`` (at any depth) that the response model ``cls`` does not declare, by field
    name or alias: whatever the model's ``extra`` setting (the SDKs ignore or keep unknown keys
    silently)."""
    if not isinstance(value, dict):
        return []
    fields: dict[str, Any] = {}
    for name, f in cls.model_fields.items():
        fields[name] = f.annotation
        for alias in (f.alias, f.validation_alias if isinstance(f.validation_alias, str) else None):
            if alias:
                fields[alias] = f.annotation
    out = []
    for k, v in value.items():
        if k not in fields:
            out.append(f"{path}.{k}: not a field of {cls.__name__}")
        else:
            out += _keys_of(v, fields[k], f"{path}.{k}")
    return out


def _models_in(tp: Any) -> list[type[pydantic.BaseModel]]:
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        return [tp]
    return [m for a in typing.get_args(tp) for m in _models_in(a)]


def _keys_of(value: Any, tp: Any, path: str) -> list[str]:
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _keys_of(v, tp, f"{path}[{i}]")]
    inner = _unwrap(tp)
    if typing.get_origin(inner) is typing.Union and type(None) in typing.get_args(
        inner
    ):  # Optional[...]
        inner = _unwrap(next(a for a in typing.get_args(inner) if a is not type(None)))
    if typing.get_origin(inner) in (dict, cabc.Mapping) and isinstance(
        value, dict
    ):  # a map: each value by its type
        value_type = typing.get_args(inner)[1]
        return [p for k, v in value.items() for p in _keys_of(v, value_type, f"{path}.{k}")]
    models = _models_in(tp)
    if not isinstance(value, dict) or not models:
        return []
    tried = [unknown_keys(value, m, path) for m in models]
    return min(tried, key=len)


def reply_problems(
    model_cls: type[pydantic.BaseModel], reply: dict, allowed_extra: tuple[str, ...] = ()
) -> list[str]:
    """Validate ``reply`` against an SDK response model strictly (no type coercion) and list what
    does not conform, or is not declared; ``allowed_extra`` are paths known to be gateway extensions
    (kept as such)."""
    try:  # as JSON, the way the SDK reads a reply: strict, but enums from their strings
        model_cls.model_validate_json(orjson.dumps(reply), strict=True)
    except pydantic.ValidationError as exc:
        return [str(exc)]
    return [p for p in unknown_keys(reply, model_cls) if not p.startswith(allowed_extra)]


def gemini_problems(body: dict) -> list[str]:
    """The problems of a generateContent request body (REST, camelCase) against google-genai's
    types: each top-level field one the SDK sends (``contents``, ``systemInstruction``,
    ``generationConfig``), each of its type."""
    from google.genai import types as genai

    fields = {
        "contents": list[genai.Content],
        "systemInstruction": genai.Content,
        "generationConfig": genai.GenerationConfig,
    }
    problems = [
        f"$.{k}: not a field of the generateContent request" for k in body if k not in fields
    ]
    problems += [] if "contents" in body else ["$.contents: required"]
    for key, tp in fields.items():
        if key in body:
            problems += conforms(body[key], tp, f"$.{key}")
    return problems
