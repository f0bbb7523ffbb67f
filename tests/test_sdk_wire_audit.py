"""The adapters' reading of replies, streams, usage and error statuses held against the official
SDKs (``openai``, ``anthropic``, ``google-genai``: test-only dependencies) as the oracle: each reply
here is built with, or validated by, the SDK's own response models, each stream assembled by the
SDK's own accumulator too, and each retry decision compared with the SDK's ``_should_retry``.
``test_sdk_conformance.py`` holds the fakes' replies and the request bodies against the same types;
this file covers what a real server can send that the fakes do not."""

from __future__ import annotations

import orjson
from google.genai import types as genai
from google.genai.decisions import CreateDecisionResponse

from dxi import adapters
from dxi.adapters.gemini import decode_generate
from dxi.adapters.gemini_batch import GeminiBatch
from dxi.adapters.gemini_decisions import decode_decision
from dxi.adapters.streaming import GenerateAssembler
from dxi.evals.task import Option, Question, Task
from dxi.scoring.cost import request_cost

TASK = Task(
    "when2call/1",
    "when2call",
    "the state",
    (
        Question("q1", "yes_no", "Is it?"),
        Question("q2", "choice", "Which?", (Option("A", "a"), Option("B", "b"))),
    ),
    {"q1": "yes", "q2": "A"},
)
ANSWER = '{"q1": "yes", "q2": "A"}'


def gemini_json(reply: genai.GenerateContentResponse) -> bytes:
    """A GenerateContentResponse as the REST API sends it: camelCase, fields unset or None left
    out."""
    return orjson.dumps(reply.model_dump(mode="json", by_alias=True, exclude_none=True))


def usage_of(reply) -> dict:
    return {
        c: getattr(reply, c)
        for c in (
            "input_tokens",
            "output_tokens",
            "cached_input_tokens",
            "cache_write_tokens",
            "cache_write_1h_tokens",
        )
    }


# ---- Gemini: thoughts are billed as output, outside candidatesTokenCount ------------------------


def cut_while_thinking() -> genai.GenerateContentResponse:
    """A Gemini reply cut off at maxOutputTokens while thinking, as the API sends it: no answer
    parts, ``thoughtsTokenCount`` 256 and no ``candidatesTokenCount`` (a count of 0 is left out of
    the JSON: python-genai #811 shows ``thoughts_token_count=256`` and no candidates count for
    ``max_output_tokens=256``)."""
    return genai.GenerateContentResponse(
        candidates=[
            genai.Candidate(
                content=genai.Content(role="model", parts=[]),
                finish_reason=genai.FinishReason.MAX_TOKENS,
                index=0,
            )
        ],
        usage_metadata=genai.GenerateContentResponseUsageMetadata(
            prompt_token_count=180, thoughts_token_count=256, total_token_count=436
        ),
        model_version="gemini-3.5-flash",
    )


def test_a_gemini_reply_cut_off_while_thinking_bills_its_thoughts_as_output():
    body = gemini_json(cut_while_thinking())
    assert b"candidatesTokenCount" not in body
    reply = decode_generate(TASK, body)
    assert (reply.input_tokens, reply.output_tokens, reply.cached_input_tokens) == (180, 256, 0)
    assert reply.cut_off == "thinking"
    # at $1 / $10 per million: 180 input + 256 output tokens, not the input alone
    assert round(request_cost(usage_of(reply), (1.0, 10.0)), 9) == round(
        (180 * 1 + 256 * 10) / 1e6, 9
    )


def test_a_streamed_gemini_reply_cut_off_while_thinking_bills_its_thoughts():
    chunks = [
        genai.GenerateContentResponse(
            candidates=[
                genai.Candidate(
                    content=genai.Content(
                        role="model", parts=[genai.Part(text="Weighing it", thought=True)]
                    ),
                    index=0,
                )
            ],
            usage_metadata=genai.GenerateContentResponseUsageMetadata(
                prompt_token_count=180, thoughts_token_count=100, total_token_count=280
            ),
            model_version="gemini-3.5-flash",
        ),
        cut_while_thinking(),
    ]
    assembler = GenerateAssembler()
    for chunk in chunks:
        assembler.feed("", gemini_json(chunk).decode())
    assert assembler.complete
    reply = decode_generate(TASK, assembler.body())
    assert (reply.input_tokens, reply.output_tokens, reply.cut_off) == (180, 256, "thinking")


def test_gemini_usage_counts_cached_tokens_within_the_prompt_and_thoughts_beside_the_answer():
    reply = genai.GenerateContentResponse(
        candidates=[
            genai.Candidate(
                content=genai.Content(
                    role="model",
                    parts=[
                        genai.Part(text="Weighing it", thought=True),
                        genai.Part(text=ANSWER, thought_signature=b"sig"),
                    ],
                ),
                finish_reason=genai.FinishReason.STOP,
                index=0,
            )
        ],
        usage_metadata=genai.GenerateContentResponseUsageMetadata(
            prompt_token_count=1000,
            cached_content_token_count=768,
            candidates_token_count=12,
            thoughts_token_count=300,
            total_token_count=1312,
        ),
    )
    decoded = decode_generate(TASK, gemini_json(reply))
    assert [a.predicted for a in decoded.answers] == ["yes", "A"]
    assert (decoded.input_tokens, decoded.cached_input_tokens, decoded.output_tokens) == (
        1000,
        768,
        312,
    )
    # the total the SDK reports is prompt + answer + thoughts: nothing counted twice
    usage = reply.usage_metadata
    assert decoded.input_tokens + decoded.output_tokens == usage.total_token_count


def test_gemini_decisions_bill_thought_tokens_given_without_output_tokens():
    doc = CreateDecisionResponse.model_validate(
        {
            "answers": {
                "q1": {"type": "noul", "noul": 0.8, "confidence": 0.8},
                "q2": {
                    "type": "choice",
                    "choice": "A",
                    "probabilities": {"A": 0.7, "B": 0.3},
                    "confidence": 0.7,
                },
            },
            "usage": {"total_input_tokens": 412, "total_thought_tokens": 40},
        }
    ).model_dump(mode="json", by_alias=True, exclude_none=True)
    reply = decode_decision(TASK, orjson.dumps(doc))
    assert (reply.input_tokens, reply.output_tokens) == (412, 40)


def test_a_gemini_batch_result_cut_off_while_thinking_bills_its_thoughts():
    """The Gemini Batch API's result line (``{"key", "response"}``) is read as the synchronous
    reply: the same usage."""
    adapter = adapters.get("gemini:gemini-3.5-flash@http://127.0.0.1:1")
    line = orjson.dumps(
        {"key": "k" * 64, "response": orjson.loads(gemini_json(cut_while_thinking()))}
    )
    result = GeminiBatch(adapter).result(orjson.loads(line), line)
    reply = adapter.decode_parsed(TASK, result.body, result.doc)
    assert (result.key, reply.input_tokens, reply.output_tokens) == ("k" * 64, 180, 256)
