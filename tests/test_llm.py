"""The language-model request and reply rules (adapters/llm.py; SPEC §3 "Language models", §6), by
hand."""

from __future__ import annotations

import math

import orjson
import pytest

from dxi.adapters import llm
from dxi.evals import CHOICE, YES_NO, Option, Question, Task

COLOUR = Question(
    "answer", CHOICE, "Which colour is the sky?", (Option("A", "blue"), Option("B", "green"))
)
HARM = Question("harm", YES_NO, "Is it harmful?")
TASK = Task("t/1", "x", "A clear day.", (COLOUR, HARM), gold={"answer": "A", "harm": "no"})


def test_render_exact_text():
    assert llm.render(TASK) == (
        "State:\nA clear day.\n\n"
        'Question "answer": Which colour is the sky?\nOptions:\nA. blue\nB. green\nAllowed answers: A, B\n\n'
        'Question "harm": Is it harmful?\nAllowed answers: yes, no'
    )
    assert (
        llm.render(TASK, [HARM])
        == 'State:\nA clear day.\n\nQuestion "harm": Is it harmful?\nAllowed answers: yes, no'
    )


def test_schema_has_an_enum_per_question_all_required_no_other_property():
    assert orjson.dumps(llm.answer_schema(TASK)) == (
        b'{"type":"object","properties":{"answer":{"type":"string","enum":["A","B"]},'
        b'"harm":{"type":"string","enum":["yes","no"]}},"required":["answer","harm"],"additionalProperties":false}'
    )


def test_messages_carry_the_fixed_system_prompt():
    assert llm.messages(TASK) == [
        {"role": "system", "content": llm.SYSTEM_PROMPT},
        {"role": "user", "content": llm.render(TASK)},
    ]
    assert llm.logprob_messages(TASK, HARM)[1]["content"] == llm.render(TASK, [HARM])


def decoded(text, **kw):
    reply = llm.decode_text(TASK, text, **kw)
    return reply.repaired, [(a.status, a.predicted, a.error) for a in reply.answers]


def test_plain_json_is_ok():
    assert decoded(' {"answer": "B", "harm": "yes"}\n') == (
        False,
        [("ok", "B", None), ("ok", "yes", None)],
    )


@pytest.mark.parametrize(
    "text", ['```json\n{"answer": "A", "harm": "no"}\n```', '```\n{"answer": "A", "harm": "no"}```']
)
def test_one_code_fence_is_accepted_as_repaired(text):
    assert decoded(text) == (True, [("ok", "A", None), ("ok", "no", None)])


@pytest.mark.parametrize(
    "text, reason",
    [
        ('Sure: {"answer": "A", "harm": "no"}', llm.NOT_JSON),
        ('{"answer": "A", "harm": "no"} I hope this helps', llm.NOT_JSON),
        ('Here you go:\n```json\n{"answer": "A", "harm": "no"}\n```', llm.NOT_JSON),
        ('```json\n{"answer": "A"}\n```\n```json\n{"harm": "no"}\n```', llm.NOT_JSON),
        (
            '```json\n{"answer": "A", "harm": \n```',
            "the Markdown code fence does not hold valid JSON",
        ),
        (
            '{"answer": "A", "ha',
            llm.NOT_JSON,
        ),  # cut off, even without a finish reason: never repaired
        ("The answer is A.", llm.NOT_JSON),
        ("", llm.EMPTY),
        ("  \n", llm.EMPTY),
        (None, llm.EMPTY),
        ('["A", "no"]', "the reply is JSON but not an object (list)"),
    ],
)
def test_deviations_are_invalid_with_the_reason(text, reason):
    assert decoded(text) == (False, [("invalid", None, reason), ("invalid", None, reason)])


def test_reasons_established_by_the_wire_format_win():
    truncated = llm.TRUNCATED.format("finish_reason length", "max_completion_tokens")
    assert decoded('{"answer": "A", "harm": "no"}', problem=truncated)[1][0] == (
        "invalid",
        None,
        truncated,
    )
    assert decoded(None, reasoning=True)[1][1] == ("invalid", None, llm.REASONING_ONLY)
    assert decoded("", problem="refusal: no")[1][0] == ("invalid", None, "refusal: no")


def test_a_reply_cut_off_at_the_token_limit_says_where():
    # begun: the answer was cut; thinking only: the limit went on thinking; neither: an empty reply
    assert llm.truncated("finish_reason length", "max_tokens", True, True) == (
        "cut off at the token limit (finish_reason length); a truncated reply is never repaired: raise max_tokens "
        "or lower --effort",
        "answer",
    )
    assert llm.truncated("finish_reason length", "max_tokens", False, True) == (
        "cut off at the token limit while thinking (finish_reason length), before any answer: raise max_tokens or "
        "lower --effort",
        "thinking",
    )
    assert llm.truncated("finish_reason length", "max_tokens", False, False) == (
        "cut off at the token limit (finish_reason length) before any answer was written: the reply is empty (a "
        "reasoning model may have spent the limit thinking unseen): raise max_tokens or lower --effort",
        "answer",
    )


def test_missing_question_and_value_outside_the_enum_are_invalid_per_answer():
    assert decoded('{"answer": "C"}') == (
        False,
        [
            ("invalid", None, '"C" is not one of the allowed answers (A, B)'),
            ("invalid", None, "missing from the reply"),
        ],
    )
    assert decoded('{"answer": "a", "harm": "Yes"}')[1] == [
        ("invalid", None, '"a" is not one of the allowed answers (A, B)'),
        ("invalid", None, '"Yes" is not one of the allowed answers (yes, no)'),
    ]
    assert decoded('{"answer": 1, "harm": null}')[1][0] == (
        "invalid",
        None,
        "1 is not one of the allowed answers (A, B)",
    )


def test_unexpected_keys_are_a_warning_not_an_error():
    reply = llm.decode_text(TASK, '{"answer": "A", "harm": "no", "why": "obvious"}')
    assert reply.status == "ok"
    assert [a.warning for a in reply.answers] == ["unexpected key(s) in the reply: why"] * 2


def test_usage_and_served_model_pass_through_invalid_replies():
    reply = llm.decode_text(TASK, "nope", input_tokens=12, output_tokens=3, served_model="m")
    assert (reply.input_tokens, reply.output_tokens, reply.served_model, reply.status) == (
        12,
        3,
        "m",
        "invalid",
    )
    assert reply.error == f"answer: {llm.NOT_JSON}; harm: {llm.NOT_JSON}"


def test_logprob_choice_renormalises_over_allowed_ids_by_hand():
    # A: 0.5; B: 0.2 (" B") + 0.1 ("B") = 0.3; "The" 0.1 and "b" 0.05 are not allowed -> mass 0.8
    top = [
        ("A", math.log(0.5)),
        (" B", math.log(0.2)),
        ("B", math.log(0.1)),
        ("The", math.log(0.1)),
        ("b", math.log(0.05)),
    ]
    a = llm.logprob_answer(COLOUR, top, 20)
    assert (a.status, a.predicted) == ("ok", "A")
    assert a.p_predicted == pytest.approx(0.625)
    assert dict(a.probabilities) == pytest.approx({"A": 0.625, "B": 0.375})
    assert (
        a.warning
        == "renormalised over the allowed answers, which held 0.8000 of the first token's probability"
    )


def test_logprob_missing_options_get_the_share_the_list_leaves_them_and_yes_no_is_case_insensitive():
    three = Question("q", CHOICE, "?", (Option("A", "x"), Option("B", "y"), Option("C", "z")))
    # listed 0.4 + 0.1 = 0.5; B is absent: at most 0.1 (the least listed), at most 0.5 (left): 0.1
    a = llm.logprob_answer(three, [("C", math.log(0.4)), ("A", math.log(0.1))], 20)
    assert a.predicted == "C" and dict(a.probabilities) == pytest.approx(
        {"A": 1 / 6, "B": 1 / 6, "C": 4 / 6}
    )
    assert a.warning == (
        "renormalised over the allowed answers, which held 0.5000 of the first token's probability; "
        "1 absent from the top 2 (B), each assumed to hold 0.1"
    )
    four = Question("q", CHOICE, "?", tuple(Option(i, i) for i in "ABCD"))
    # listed 0.9 + 0.08 leaves 0.02 for B, C, D together: each 0.02 / 3, below the least listed 0.08
    a = llm.logprob_answer(four, [("A", math.log(0.9)), ("The", math.log(0.08))], 20)
    share = (1 - 0.9 - 0.08) / 3
    assert dict(a.probabilities) == pytest.approx(
        {"A": 0.9 / (0.9 + 3 * share), **dict.fromkeys("BCD", share / (0.9 + 3 * share))}
    )
    assert a.warning.endswith("3 absent from the top 2 (B, C, D), each assumed to hold 0.00667")
    # a list that leaves nothing leaves nothing to the absent; a token listed at -inf keeps its 0
    a = llm.logprob_answer(
        three, [("A", math.log(0.5)), ("x", math.log(0.5)), ("B", -math.inf)], 20
    )
    assert dict(a.probabilities) == {"A": 1.0, "B": 0.0, "C": 0.0}
    yn = llm.logprob_answer(
        HARM, [("Yes", math.log(0.3)), (" no", math.log(0.6)), ("NO", math.log(0.1))], 20
    )
    assert (yn.predicted, yn.p_yes) == ("no", pytest.approx(0.3))
    assert yn.p_predicted == pytest.approx(0.7)


def test_logprob_without_any_allowed_answer_is_invalid():
    a = llm.logprob_answer(COLOUR, [("The", -0.1), ("I", -2.0)], 20)
    assert (a.status, a.error) == (
        "invalid",
        "none of the allowed answers (A, B) is among the top 20 first tokens",
    )


def test_logprob_values_that_are_not_log_probabilities_are_invalid():
    a = llm.logprob_answer(COLOUR, [("A", 3.0), ("B", -1.0)], 20)
    assert (a.status, a.error) == (
        "invalid",
        "top_logprobs: 3.0 for token 'A' is not a log-probability",
    )
    assert llm.logprob_answer(COLOUR, [("A", float("nan"))], 20).status == "invalid"
    assert llm.logprob_answer(COLOUR, [("A", -math.inf), ("B", -0.5)], 20).predicted == "B"
