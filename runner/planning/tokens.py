"""Token counts before a reply arrives: the one estimator behind the tokens-per-minute pacing
(``runner.sending.limits``), the dry run (``dxi estimate``, ``runner.planning.estimate``) and the
cost bound (``runner.sending.cost``).

Two figures, for two uses:

* **Expected** tokens (``TokenEstimate``): input = request bytes / ``BYTES_PER_TOKEN`` × a ratio
  learned from the usage replies report (1 before any is known), output = the mean reported output
  (before any: ``prior_output``, with ``THINKING_PRIOR`` for a model that thinks at an effort
  level). The TPM pacer learns the ratio as replies arrive; the dry run starts from the usage
  already in the cache (``TokenEstimate.learned``), per model and evaluation where it has some. No
  tokenizer is needed, so nothing is downloaded; the README gives the measured error against the
  usage real providers returned.
* An **upper bound** (``input_bound``, ``Adapter.output_tokens_bound``), for the cost bound, which
  must never be passed: input tokens <= the request body's UTF-8 bytes (every token of a byte-level
  BPE tokenizer, as used by the GPT, Llama, Qwen, Claude and Gemini families, covers at least one
  byte of the text, and the body holds every text sent plus its JSON syntax, which is longer than
  the chat template's few tokens per message) plus what a provider adds unseen
  (``Adapter.HIDDEN_INPUT_TOKENS``: Anthropic's tool-use system prompt); output tokens <= the
  request's own cap (``max_tokens`` and the like), which the provider enforces.
"""

from __future__ import annotations

BYTES_PER_TOKEN = 4.0  # first guess of request bytes per input token, corrected by reported usage
OUTPUT_PER_QUESTION = (
    8  # a JSON answer's tokens per question ("<id>": "<answer>", ...) before any usage is known
)


def input_bound(body_bytes: int, hidden: int = 0) -> int:
    """An upper bound of a request's input tokens: its body's UTF-8 byte count plus ``hidden``
    tokens the provider adds (see the module docstring)."""
    return body_bytes + hidden


THINKING_PRIOR: dict[str, dict[str, int]] = {
    "openai": {
        "minimal": 500,
        "low": 3_000,
        "medium": 6_000,
        "high": 12_000,
        "xhigh": 24_000,
        "max": 32_000,
    },
    "anthropic": {"low": 3_000, "medium": 6_000, "high": 12_000, "xhigh": 24_000, "max": 32_000},
    "gemini": {"minimal": 500, "low": 3_000, "medium": 6_000, "high": 12_000, "xhigh": 24_000},
}
"""Expected thinking (reasoning) tokens of one request, per provider and effort level, before any
usage of the model at that level is cached: **the project's own assumption**, not a provider's
figure. No provider publishes how many tokens a level spends on average (OpenAI: "Reducing reasoning
effort can result in faster responses and fewer tokens used on reasoning", openai SDK
``ReasoningEffort``; Anthropic and Google give caps and budgets, not averages), and the spend
depends on the task. It rests on one measurement of this suite (issue 34: an OpenAI reasoning model
at ``reasoning_effort`` low used ~3,000 output tokens per request) and doubles with each level above
it (as the budget-based mappings of effort levels grow: roughly twofold or more per level), with
``minimal`` a sixth of ``low``. The three providers share the numbers because nothing measured tells
them apart; each has only its own levels (``Adapter.EFFORT_LEVELS``). The figure is capped by the
request's own output cap (``max_tokens``, ..., ``adapters.budgets``) and replaced by the cache's
usage as soon as this model has replies at these parameters (``runner.planning.estimate``)."""
THINKING_FAMILY = {
    "openai": "openai",
    "logprobs": "openai",
    "anthropic": "anthropic",
    "gemini": "gemini",
}
"""The adapter kinds whose effort levels ``THINKING_PRIOR`` covers (an OpenAI-compatible logprobs
model thinks as the OpenAI one does; a local llama.cpp model's thinking is its template's, not
covered)."""
ANTHROPIC_DEFAULT_EFFORT = "high"
"""The effort of a Claude model that thinks by default when the request sets none (Anthropic's
effort parameter: "high" is the default)."""


def thinking_effort(kind: str, model: str, params: dict, effort: str | None) -> str | None:
    """The effort level a model's requests think at, for ``THINKING_PRIOR``; None when they do not
    think (``none``), or nothing says they do: ``effort`` (the adapter's ``effort``, its provider's
    field) when set, else for a Claude model that thinks by default (``adapters.budgets``) without
    ``thinking`` turned off, ``ANTHROPIC_DEFAULT_EFFORT``."""
    from dxi.adapters.budgets import anthropic_thinks_by_default

    family = THINKING_FAMILY.get(kind)
    if family is None or effort == "none":
        return None
    if effort is not None:
        return effort.lower() if effort.lower() in THINKING_PRIOR[family] else None
    thinking = params.get("thinking") if isinstance(params.get("thinking"), dict) else {}
    off = thinking.get("type") in ("disabled", "between_tools")
    if family == "anthropic" and anthropic_thinks_by_default(model) and not off:
        return ANTHROPIC_DEFAULT_EFFORT
    return None


def thinking_prior(kind: str, effort: str | None) -> int | None:
    """``THINKING_PRIOR`` of adapter ``kind`` at ``effort`` (``thinking_effort``'s); None: no
    prior."""
    family = THINKING_FAMILY.get(kind)
    return None if family is None or effort is None else THINKING_PRIOR[family].get(effort)


def prior_output(bound: int | None, questions: int, thinking: int | None = None) -> float:
    """Expected output tokens of one request before any usage is known: ``OUTPUT_PER_QUESTION`` per
    question plus 4 (the braces), plus ``thinking`` tokens for a model that thinks
    (``thinking_prior``), never above the request's ``bound`` (decision models: one per question; a
    language model's output cap)."""
    guess = OUTPUT_PER_QUESTION * questions + 4 + (thinking or 0)
    return float(guess if bound is None else min(bound, guess))


class TokenEstimate:
    """Tokens a request will use, estimated before it is sent: ``input(bytes)`` = bytes /
    ``BYTES_PER_TOKEN`` × ``ratio``; ``output`` = the mean reported output tokens (``None`` until
    one is known); ``estimate(bytes)`` = both (the TPM pacer's booking; an unknown output counts 0).

    ``observe`` follows the reported usage: a running mean over the first 20 replies, then an
    exponential average (weight 0.05), so a long run follows a drift without forgetting at once."""

    def __init__(self, ratio: float = 1.0, output: float | None = None, observed: int = 0) -> None:
        self.ratio, self.output, self._n = ratio, output, observed

    @classmethod
    def learned(
        cls, body_bytes: int, input_tokens: int, output_tokens: int, replies: int
    ) -> TokenEstimate:
        """The estimate that ``replies`` replies with these totals teach (ratio and mean output
        pooled)."""
        if replies <= 0 or body_bytes <= 0:
            return cls()
        return cls(input_tokens * BYTES_PER_TOKEN / body_bytes, output_tokens / replies, replies)

    @property
    def observed(self) -> int:
        """Replies learned from."""
        return self._n

    def input(self, body_bytes: int) -> float:
        return body_bytes / BYTES_PER_TOKEN * self.ratio

    def __call__(self, body_bytes: int) -> float:
        return self.input(body_bytes) + (self.output or 0.0)

    def observe(self, body_bytes: int, input_tokens: int | None, output_tokens: int | None) -> None:
        if not input_tokens or body_bytes <= 0:
            return
        self._n += 1
        alpha = max(0.05, 1 / self._n)
        self.ratio += alpha * (input_tokens * BYTES_PER_TOKEN / body_bytes - self.ratio)
        self.output = (
            (output_tokens or 0)
            if self.output is None
            else self.output + alpha * ((output_tokens or 0) - self.output)
        )
