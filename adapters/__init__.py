"""Adapters: one module per wire format behind one interface (``adapters.base.Adapter``).

``get("embedded:sparrow-nano-general-v1.1")`` parses a model string ``ADAPTER:MODEL[@BASE_URL]`` and
returns the adapter, importing its module only then. An unknown adapter name fails with the list of
known ones.
"""

from __future__ import annotations

import importlib
import re
from urllib.parse import urlsplit

from .base import (
    EFFORTS,
    Adapter,
    Answer,
    Limits,
    ModelIdentity,
    ModelSpec,
    Progress,
    Reply,
    Request,
)
from .errors import (
    AdapterError,
    ErrorIn200,
    Fatal,
    MalformedReply,
    ProviderStop,
    RateLimited,
    ReplyTooLarge,
    Retryable,
    Transient,
    Unreachable,
)

__all__ = [
    "EFFORTS",
    "Adapter",
    "AdapterError",
    "Answer",
    "ErrorIn200",
    "Fatal",
    "Limits",
    "MalformedReply",
    "ModelIdentity",
    "ModelSpec",
    "RateLimited",
    "ProviderStop",
    "Reply",
    "ReplyTooLarge",
    "Request",
    "Retryable",
    "Transient",
    "Unreachable",
    "adapter_class",
    "get",
    "parse_model",
    "KINDS",
    "Progress",
]

# adapter name -> "module:Class", imported on first use
KINDS: dict[str, str] = {
    "embedded": "dxi.adapters.embedded:Embedded",
    "systemone": "dxi.adapters.systemone:SystemOne",
    "openai": "dxi.adapters.openai:OpenAI",
    "anthropic": "dxi.adapters.anthropic:Anthropic",
    "gemini": "dxi.adapters.gemini:Gemini",
    "openai-decisions": "dxi.adapters.openai_decisions:OpenAIDecisions",
    "gemini-decisions": "dxi.adapters.gemini_decisions:GeminiDecisions",
    "logprobs": "dxi.adapters.logprobs:Logprobs",
    "llamacpp": "dxi.adapters.llamacpp:LlamaCpp",
    "llamacpp-logprobs": "dxi.adapters.llamacpp:LlamaCppLogprobs",
}


def parse_model(text: str) -> ModelSpec:
    """Parse ``ADAPTER:MODEL[@BASE_URL]`` (``systemone:http://host:port`` leaves the model to the
    server).

    Raises ValueError naming the string and the known adapters when it cannot be parsed.
    """
    kind, sep, rest = text.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise ValueError(
            f"unknown adapter {kind!r} in model {text!r}; known adapters: {', '.join(KINDS)} "
            f"(write ADAPTER:MODEL[@BASE_URL], e.g. embedded:sparrow-nano-general-v1.1)"
        )
    rest = rest.strip() if sep else ""
    model, base_url = rest, None
    if _URL.match(rest):  # systemone:http://host:port: the server names the model
        model, url = "", rest
    else:
        at = _AT_URL.search(rest)
        model, url = (rest[: at.start()], rest[at.end() :]) if at else (rest, None)
    if url is not None:
        scheme, _, after = url.partition("//")
        if scheme.lower() not in ("http:", "https:"):
            raise ValueError(
                f"model {text!r}: the base URL {url!r} is not http:// or https://; write "
                "@http://HOST:PORT (or @https://...)"
            )
        base_url = f"{scheme.lower()}//{after}"
    else:
        _, at_sign, tail = rest.rpartition("@")
        if at_sign and not tail.strip():  # a base URL left empty (an unset $URL): not the default
            raise ValueError(
                f"model {text!r}: nothing follows '@'; write @http://HOST:PORT (or "
                "@https://...) for a base URL, or leave '@' out for the adapter's default server"
            )
        if at_sign and _HOST_WITHOUT_SCHEME.match(
            tail
        ):  # not a version suffix such as claude-x@20240620
            raise ValueError(
                f"model {text!r}: {tail!r} looks like a base URL without its scheme; write "
                f"@http://{tail} (or @https://...), or the model name would include it and the "
                "requests would go to the adapter's default server"
            )
    if base_url is not None and not urlsplit(base_url).hostname:
        raise ValueError(
            f"model {text!r}: the base URL {base_url!r} names no host; write http://HOST:PORT"
        )
    return ModelSpec(kind, model or None, base_url)


# a URL's start (any scheme, any case, or none: "//host"), at the string's start or after "@"
_URL = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*:)?//")
_AT_URL = re.compile(r"@\s*(?=(?:[A-Za-z][A-Za-z0-9+.-]*:)?//)")

# host[:port][/path] after "@": localhost, an IPv4 address, a host name ending in a top-level
# domain, or anything with a port (not "@20240620" or "@1.5", which are model versions)
_HOST_WITHOUT_SCHEME = re.compile(
    r"^(?:localhost|\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-fA-F:]+\]|[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,})"
    r"(?::\d+)?(?:/.*)?$|^[\w.-]+:\d+(?:/.*)?$"
)


def adapter_class(kind: str) -> type[Adapter]:
    """The adapter class registered as ``kind`` (its module imported now); KeyError when unknown."""
    module, _, cls = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), cls)


def get(text: str | ModelSpec, limits: Limits | None = None) -> Adapter:
    """The adapter for a model string (or parsed spec), with its default limits unless ``limits`` is
    given. Raises ValueError for a model string the adapter cannot use (no model name, unknown
    option, ...)."""
    spec = parse_model(text) if isinstance(text, str) else text
    return adapter_class(spec.kind)(spec, limits)
