"""Responder factories for ``tests.fakes.fake_provider``'s ``route_factories``
(``{path: "tests.fakes.responders:<factory>"}``): each takes the model name and returns a pure
function from the parsed request JSON to the reply JSON, for a provider that behaves in one odd
way the tests need (a choice just below the highest, a gateway that rounds, hostile prose)."""

from __future__ import annotations

from . import wire_formats

HOSTILE_REPLY = (
    "<script>alert('reply')</script><img src=x onerror=alert(2)> I think the answer is B."
)


def choice_just_below_highest(model: str):
    """A System One responder that returns, for every choice, a choice 1e-4 below the highest
    probability (the first option 0.3, the returned second 0.2999, the rest spread), and P(yes)
    0.7."""

    def respond(payload: dict) -> dict:
        answers = {}
        for name, q in payload["questions"].items():
            if q.get("type") == "choice":
                options = list(q["criteria"])
                rest = round((1 - 0.3 - 0.2999) / (len(options) - 2), 4)
                probs = [0.3, 0.2999] + [rest] * (len(options) - 2)
                answers[name] = {
                    "type": "choice",
                    "choice": options[1],
                    "probabilities": dict(zip(options, probs, strict=True)),
                }
            else:
                answers[name] = {"type": "noul", "noul": 0.7}
        return {
            "model": model or "near-decider",
            "answers": answers,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }

    return respond


def two_decimal_gateway(model: str):
    """A System One responder behind a gateway that rounds every probability to 2 decimals: each
    choice's first two options 0.331 and 0.334 (both 0.33 once rounded: a tie made by rounding), the
    second returned as the choice, the rest sharing 0.335 before rounding; P(yes) 0.7."""

    def respond(payload: dict) -> dict:
        answers = {}
        for name, q in payload["questions"].items():
            if q.get("type") == "choice":
                options = list(q["criteria"])
                raw = [0.331, 0.334] + [0.335 / (len(options) - 2)] * (len(options) - 2)
                answers[name] = {
                    "type": "choice",
                    "choice": options[1],
                    "probabilities": {o: round(p, 2) for o, p in zip(options, raw, strict=True)},
                }
            else:
                answers[name] = {"type": "noul", "noul": 0.7}
        return {
            "model": model or "rounding",
            "answers": answers,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }

    return respond


def hostile_when2call_chat(model: str):
    """Chat Completions responder: When2Call requests get hostile prose (an invalid reply), others
    the fake model's valid JSON (``wire_formats.openai_chat``)."""

    def respond(request: dict) -> dict:
        reply = wire_formats.openai_chat(request)
        if "Tools available" in request["messages"][-1]["content"]:
            reply["choices"][0]["message"]["content"] = HOSTILE_REPLY
        return reply

    return respond


def uncounted_chat(model: str):
    """Chat Completions responder of a server that counts no tokens (as ``sparrow-decider serve``):
    the fake model's replies (``wire_formats.openai_chat``) with a usage of 0 tokens."""

    def respond(request: dict) -> dict:
        reply = wire_formats.openai_chat(request)
        reply["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        return reply

    return respond
