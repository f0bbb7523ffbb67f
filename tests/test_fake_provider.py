"""The fault-injecting provider itself: deterministic answers, pluggable wire formats, fault draws,
its rate limit, and its count of what it sent."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from dxi.adapters.decision import sum_tolerance

from .fakes import wire_formats
from .fakes.fake_provider import ROUTES, FakeProvider, Faults, serve, systemone

QUESTION = {
    "model": "m",
    "state": "Which city is in Peru?",
    "questions": {
        "q": {
            "type": "choice",
            "instructions": "Pick one.",
            "criteria": {"A": "Lima", "B": "Osaka", "C": "Perth"},
        },
        "harm": {"type": "noul", "instructions": "Is it harmful?"},
    },
}


def test_systemone_answers_are_seeded_by_the_request_and_valid():
    first, again = systemone("m")(QUESTION), systemone("m")(orjson.loads(orjson.dumps(QUESTION)))
    assert first == again  # another responder, the same request: the same answer
    other = systemone("m")({**QUESTION, "state": "Which city is in Japan?"})
    assert other["answers"] != first["answers"]
    probs = first["answers"]["q"]["probabilities"]
    assert list(probs) == ["A", "B", "C"] and abs(sum(probs.values()) - 1) <= sum_tolerance(3)
    assert probs[first["answers"]["q"]["choice"]] == max(probs.values())
    assert 0 <= first["answers"]["harm"]["noul"] <= 1
    assert first["usage"] == {"input_tokens": len(QUESTION["state"]) // 4 + 16, "output_tokens": 2}
    fixed = systemone("m", p_first=0.7, p_yes=0.8)(QUESTION)["answers"]
    assert (
        fixed["q"]["probabilities"] == {"A": 0.7, "B": 0.15, "C": 0.15}
        and fixed["harm"]["noul"] == 0.8
    )


async def test_the_language_model_formats_are_served_with_faults():
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["q", "harm"],
        "properties": {
            "q": {"type": "string", "enum": ["A", "B", "C"]},
            "harm": {"type": "string", "enum": ["yes", "no"]},
        },
    }
    request = {
        "model": "gpt-x",
        "messages": [{"role": "user", "content": "Pick one."}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "strict": True, "schema": schema},
        },
    }
    async with FakeProvider(script=["503"]) as server:
        async with aiohttp.ClientSession() as client:
            statuses, bodies = [], []
            for _ in range(2):
                async with client.post(server.url + "/v1/chat/completions", json=request) as resp:
                    statuses.append(resp.status)
                    bodies.append(await resp.read())
    assert statuses == [503, 200]
    reply = orjson.loads(bodies[1])
    assert reply == wire_formats.openai_chat(request)  # the wire-format responder, served as it is
    assert orjson.loads(reply["choices"][0]["message"]["content"]) == {"q": "C", "harm": "no"}
    assert (server.stats()["ok"], server.stats()["server_error"]) == (1, 1)


class Draws:
    """A stand-in random.Random whose ``random()`` returns the given values in turn."""

    def __init__(self, *values: float):
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def test_faults_are_drawn_by_their_probabilities():
    f = Faults(
        rate_limit=0.1, server_error=0.05, hang=0.02, reset=0.02, malformed=0.03, retry_after="0.5"
    )
    # cumulative bands: 429 [0, 0.10), 5xx [0.10, 0.15), hang [0.15, 0.17), reset [0.17, 0.19),
    # malformed [0.19, 0.22)
    draws = [
        f.draw(Draws(u))
        for u in (0.0, 0.099, 0.101, 0.149, 0.151, 0.169, 0.171, 0.189, 0.191, 0.219, 0.221)
    ]
    assert draws == [
        "429:0.5",
        "429:0.5",
        "5xx",
        "5xx",
        "hang",
        "hang",
        "reset",
        "reset",
        "malformed",
        "malformed",
        "ok",
    ]


def test_the_rate_limit_lets_a_burst_through_then_states_the_wait():
    server = FakeProvider(rpm=60, burst=2)
    assert server._admit() == 0.0 and server._admit() == 0.0
    assert (
        0.9 < server._admit() <= 1.0
    )  # the third waits for the next token, one second after the first


async def test_routes_are_pluggable_and_the_server_counts_what_it_sent():
    assert set(ROUTES) >= {"/v1/systemone", "/v1/chat/completions", "/v1/messages", "/v1/decisions"}

    def echo(payload: dict) -> dict:
        return {"echo": payload}

    async with FakeProvider(routes={"/v1/echo": echo}, script=["500", "ok", "ok"]) as server:
        async with aiohttp.ClientSession() as client:
            statuses = []
            for _ in range(3):
                async with client.post(f"{server.url}/v1/echo", data=b'{"x": 1}') as resp:
                    statuses.append((resp.status, await resp.read()))
    # an error in the route's format (OpenAI's, which proxies forward, for a route of no known
    # format)
    assert statuses == [
        (500, orjson.dumps(wire_formats.error_body("openai", 500))),
        (200, b'{"echo":{"x":1}}'),
        (200, b'{"echo":{"x":1}}'),
    ]
    stats = server.stats()
    assert (
        stats["arrivals"],
        stats["ok"],
        stats["server_error"],
        stats["keys_ok"],
        stats["duplicates"],
    ) == (3, 2, 1, 1, 1)


@pytest.mark.process
def test_a_served_process_reports_its_counts():
    with serve(model="m", latency="0") as server:
        import urllib.request

        req = urllib.request.Request(
            f"{server.url}/v1/systemone", data=orjson.dumps(QUESTION), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # 127.0.0.1 only
            assert orjson.loads(resp.read())["answers"]["q"]["probabilities"]["A"] == 0.7
        assert server.stats()["ok"] == 1
