"""Reading JSON replies strictly: a key named twice is reported, never silently resolved (the last
value winning), and ``NaN`` / ``Infinity`` are read as numbers so that the answers they touch are
refused one by one. Used for reply bodies and for the JSON object a language model writes."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from .errors import MalformedReply


class DuplicateKeys(dict):
    """A JSON object that named some keys more than once: the last value of each is kept, as JSON
    parsers do, and ``duplicates`` names the keys, so a decoder can refuse the answers they
    touch."""

    duplicates: tuple[str, ...] = ()


def duplicates(obj: Any) -> tuple[str, ...]:
    """The keys ``obj`` (parsed by ``load_json``) named more than once; () for any other value."""
    return obj.duplicates if isinstance(obj, DuplicateKeys) else ()


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    twice = []
    for k, v in pairs:
        if k in out:
            twice.append(k)
        out[k] = v
    if not twice:
        return out
    marked = DuplicateKeys(out)
    marked.duplicates = tuple(dict.fromkeys(twice))
    return marked


_STRING = re.compile(
    rb'"(?:[^"\\]|\\.)*"(\s*:)?'
)  # every JSON string, and whether a colon follows (a key)


def _keys_in(value: Any) -> int:
    if isinstance(value, dict):
        return len(value) + sum(_keys_in(v) for v in value.values())
    if isinstance(value, list):
        return sum(_keys_in(v) for v in value)
    return 0


def load_json(body: bytes | str) -> Any:
    """Parse a reply body (or a model's JSON text). Objects that name a key twice come back as
    ``DuplicateKeys`` (see ``duplicates``); ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON, but
    some servers send them) are read as floats, so the values they touch are refused one by one
    rather than the whole reply. Raises MalformedReply (with the text received) when it is not JSON.

    The fast path is orjson; the body is parsed again by the standard library only when it holds
    more keys than the parsed value (a duplicate) or orjson refuses it."""
    return _parse(body.encode() if isinstance(body, str) else body)[0]


def _parse(raw: bytes) -> tuple[Any, bool]:
    """``load_json``'s value, and whether the standard library parsed it (only then can an object
    in it be ``DuplicateKeys``)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            return json.loads(raw, object_pairs_hook=_pairs), True
        except (ValueError, RecursionError):
            raise MalformedReply(
                f"reply is not JSON ({exc})", raw[:2000].decode("utf-8", "replace")
            ) from None
    if isinstance(doc, (dict, list)):
        # A key named twice drops a key (and its colon) from the parsed value: the body then holds
        # more colons than the value written back. Equal counts prove there is none unless a colon
        # hid as \u003a, so bodies with \u escapes are counted exactly (every key token against
        # every key parsed).
        if raw.count(b":") != orjson.dumps(doc).count(b":") or (
            b"\\u" in raw and sum(1 for m in _STRING.finditer(raw) if m.group(1)) != _keys_in(doc)
        ):
            return json.loads(raw, object_pairs_hook=_pairs), True
    return doc, False


def load_reply(body: bytes | str, answers: str | None = None) -> Any:
    """Parse a provider's reply body (the wire format's envelope, or one streamed event of it) as
    ``load_json`` does, refusing it when an object anywhere in it names a key twice (``"usage"`` or
    ``"choices"`` twice: which one the provider meant is ambiguous, and JSON parsers keep the last
    silently): MalformedReply naming the key and where. ``answers``: a top-level field whose keys
    the decoder judges one answer at a time (a decision model's ``answers``: a question or option
    named twice there makes that answer invalid, ``adapters.decision``), not looked into. The
    model's own JSON text (a string inside the body) is ``load_json``'s, its duplicates the
    answers'. Costs nothing more than ``load_json`` on a body that names no key twice (only a body
    the standard library parsed again is looked into)."""
    raw = body.encode() if isinstance(body, str) else body
    doc, reparsed = _parse(raw)
    if reparsed and (where := _named_twice(doc, "", answers)) is not None:
        key, path = where
        raise MalformedReply(
            f"reply names the key {key!r} twice{f' in {path}' if path else ''}: which value is "
            "meant is ambiguous",
            raw[:2000].decode("utf-8", "replace"),
        )
    return doc


def _named_twice(value: Any, path: str, skip: str | None) -> tuple[str, str] | None:
    """The first key named twice in ``value`` (at ``path``) and the path of its object; None when
    none is."""
    if isinstance(value, DuplicateKeys):
        return value.duplicates[0], path
    if isinstance(value, dict):
        for key, item in value.items():
            if path or key != skip:
                found = _named_twice(item, f"{path}.{key}" if path else str(key), skip)
                if found is not None:
                    return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _named_twice(item, f"{path}[{i}]", skip)) is not None:
                return found
    return None
