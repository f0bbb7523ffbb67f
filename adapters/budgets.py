"""Default output budgets that leave room for thinking, where a provider's default would not (SPEC
§6: a reply cut off at the token limit is invalid, so a budget spent on thinking loses the answer's
points).

* **Anthropic** requires ``max_tokens``, and it bounds thinking plus the answer ("Thinking tokens
  count toward your max_tokens limit": the anthropic SDK's ``types/thinking_config_param.py``; the
  Thinking page of platform.claude.com). The current models think by default: Claude Opus 5 and
  later, Sonnet 5 and later, Haiku 5.5, and the Fable and Mythos models ("Opus 5.5 / Sonnet 5.5 /
  Haiku 5.5 think by default"; "Opus 5.5 and Fable 5.1 cannot disable thinking"; Opus 5's what's-new
  page: "thinking on by default"). For them, and for any model whose request turns thinking on
  (``thinking`` ``adaptive``), the default ``max_tokens`` is ``THINKING_BUDGET`` at effort low,
  medium and high (the Thinking page's adaptive-thinking examples use ``max_tokens=16000``) and
  ``DEEP_THINKING_BUDGET`` at xhigh and max ("When running at xhigh or max effort, set a large
  max_tokens so the model has room to think": Opus 5's what's-new page, whose example uses 64,000);
  every current model allows 128,000 output tokens. With manual thinking (``thinking`` ``enabled``
  and ``budget_tokens`` N, which must be below ``max_tokens``) it is N + ``ANSWER_TOKENS``.
  Otherwise (older models, or thinking turned off) it stays ``ANSWER_TOKENS``, the answer alone (one
  JSON object of a few short strings), so their requests and cache keys are unchanged.
* **OpenAI** Chat Completions and **Gemini** generateContent need no default: without
  ``max_completion_tokens`` / ``maxOutputTokens`` the model's own output maximum applies, which
  leaves room for its reasoning (OpenAI's reasoning guide asks to reserve at least 25,000 tokens for
  reasoning and outputs). A user's cap is sent as given; a reply cut off by it says whether it was
  cut off while thinking (``adapters.llm.truncated``).

A user's ``max_tokens`` always wins. The cost bound reserves whatever cap the request carries
(``Adapter.output_tokens_bound``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

ANSWER_TOKENS = 1024
THINKING_BUDGET = 16_000
DEEP_THINKING_BUDGET = 64_000
DEEP_EFFORTS = frozenset({"xhigh", "max"})

# claude-opus-5-5, claude-sonnet-5, claude-haiku-5-5, claude-fable-5-1, claude-mythos-5-1,
# claude-mythos-preview, also behind a proxy's prefix (anthropic.claude-opus-5-5-v1); not
# claude-opus-4-8 or claude-3-5-haiku-20241022
_CLAUDE = re.compile(r"claude-(?:(?:opus|sonnet|haiku)-(\d+)|fable|mythos)")
FIRST_THINKING_GENERATION = 5  # Opus, Sonnet and Haiku: generation 5 on think by default


def anthropic_thinks_by_default(model: str) -> bool:
    """Whether the Claude ``model`` thinks when the request has no ``thinking`` field (see the
    module docstring): every Opus, Sonnet and Haiku model from generation 5 on, and every Fable and
    Mythos model."""
    m = _CLAUDE.search(model)
    return m is not None and (m.group(1) is None or int(m.group(1)) >= FIRST_THINKING_GENERATION)


def anthropic_max_tokens(model: str, params: Mapping[str, Any]) -> int:
    """The default ``max_tokens`` of an Anthropic Messages request for ``model`` with ``params``
    (the user's ``thinking`` and ``output_config.effort`` among them): see the module docstring."""
    thinking = params.get("thinking") if isinstance(params.get("thinking"), Mapping) else {}
    kind = thinking.get("type")
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
            return budget + ANSWER_TOKENS
    if kind in ("disabled", "between_tools") or (
        kind is None and not anthropic_thinks_by_default(model)
    ):
        return ANSWER_TOKENS
    config = params.get("output_config") if isinstance(params.get("output_config"), Mapping) else {}
    return DEEP_THINKING_BUDGET if config.get("effort") in DEEP_EFFORTS else THINKING_BUDGET
