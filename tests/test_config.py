"""The run file: parsing, defaults, and errors that name the key and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dxi.runner.planning import numbers
from dxi.runner.planning.config import ConfigError, Price, load

GOOD = """\
data_dir = "data"
max_cost = 2.5

[evals]
select = ["when2call"]
limit = 3

[providers.local]
kind = "systemone"
base_url = "http://127.0.0.1:8000"
rpm = 600
max_in_flight = 4

[[models]]
provider = "embedded"
model = "sparrow-nano-general-v1.1"

[[models]]
name = "local decider"
provider = "local"
params = { temperature = 0 }
price = { input = 0.1, output = 0.0 }
epochs = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_a_good_file(tmp_path: Path):
    run = load(write(tmp_path, GOOD))
    assert run.max_cost == 2.5 and run.evals.select == ["when2call"] and run.evals.limit == 3
    assert [m.provider for m in run.models] == ["embedded", "local"]
    name, provider = run.provider_of(run.models[1])
    assert (name, provider.kind, provider.rpm, provider.max_in_flight) == (
        "local",
        "systemone",
        600.0,
        4,
    )
    assert run.provider_of(run.models[0])[1].kind == "embedded"
    assert run.models[1].price == Price(input=0.1, output=0.0) and run.models[1].epochs == 2
    assert run.resolve(run.data_dir) == tmp_path / "data"
    assert run.cache_dir == ".dxi-cache" and run.epochs == 1


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("rpm = 600", "rmp = 600", "line 11: providers.local.rmp: unknown key (a typo?)"),
        (
            "output = 0.0",
            'output = "free"',
            'line 22: models[1].price.output (the 2nd [[models]] table): expected a number, got the string "free"',
        ),
        # a type error in the user's terms, not msgspec's (the old: "Expected `int | null`, got
        # `str`")
        (
            "limit = 3",
            'sample = "100"',
            'line 6: evals.sample: expected a whole number, got the string "100"',
        ),
        (
            "limit = 3",
            "limit = 2.5",
            "line 6: evals.limit: expected a whole number, got the number 2.5",
        ),
        ("rpm = 600", "rpm = true", "line 11: providers.local.rpm: expected a number, got true"),
        (
            'select = ["when2call"]',
            'select = "when2call"',
            'line 5: evals.select: expected a list, got the string "when2call"',
        ),
        (
            "params = { temperature = 0 }",
            "params = 0",
            "line 21: models[1].params (the 2nd [[models]] table): expected a table, got the number 0",
        ),
        (
            'provider = "local"\n',
            "",
            "line 18: models[1].provider (the 2nd [[models]] table): missing (a required key)",
        ),
        (
            'kind = "systemone"',
            'kind = "carrier-pigeon"',
            "line 9: providers.local.kind: unknown adapter 'carrier-pigeon'",
        ),
        (
            'provider = "local"',
            'provider = "remote"',
            "line 20: models[1].provider (the 2nd [[models]] table): 'remote' is neither",
        ),
        (
            "epochs = 2",
            "epochs = 0",
            "line 23: models[1].epochs (the 2nd [[models]] table): must be a whole number from 1 to 1,000, got 0",
        ),
        (
            'select = ["when2call"]',
            'select = ["mmlu"]',
            "line 5: evals.select: unknown evaluation 'mmlu'",
        ),
        (
            "max_cost = 2.5",
            "max_cost = -1",
            "line 2: max_cost: must be a number from 0 to 1,000,000,000 (USD), got -1.0",
        ),
        (
            "max_in_flight = 4",
            "max_in_flight = 0",
            "line 12: providers.local.max_in_flight: must be a whole number from 1 to 100,000 (requests at once), got 0",
        ),
        (
            'name = "local decider"',
            'name = "embedded:sparrow-nano-general-v1.1"',
            "line 19: models[1].name (the 2nd [[models]] table): two models",
        ),
        ("limit = 3", "limit = 3\nlimt = 4", "line 7: evals.limt: unknown key"),
    ],
)
def test_errors_name_the_key_and_line(tmp_path: Path, old: str, new: str, message: str):
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(f"{path}, ") and message in str(err.value), str(err.value)
    assert "Expected `" not in str(err.value)


BAD_NUMBERS = [
    "0",
    "-3",
    "nan",
    "inf",
    "-inf",
    "10000000000000",
]  # zero, negative, NaN, infinite, too large


@pytest.mark.parametrize("value", BAD_NUMBERS)
@pytest.mark.parametrize("key", sorted(numbers.RUN_FILE_LIMITS))
def test_every_limit_of_a_provider_table_refuses_zero_negative_nan_infinite_and_too_large(
    tmp_path: Path, key: str, value: str
):
    """Each number of ``[providers.NAME]`` (the keys the limit flags override) is checked as the
    flag is (``runner.planning.numbers``): before issue 32 ``rpm = nan`` or
    ``max_stated_wait_s = inf`` passed (``nan <= 0`` is false) and made a run that never gives
    up."""
    if key in ("rpm", "max_in_flight"):
        text = GOOD.replace(f"{key} = ", f"{key} = {value}\n# was: ", 1)
    else:
        text = GOOD.replace("max_in_flight = 4\n", f"max_in_flight = 4\n{key} = {value}\n", 1)
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith(f"{key} = "))
    message = str(
        err.value
    )  # a whole number's key given NaN, infinite or a decimal: msgspec's own type error
    assert f"line {line}: providers.local.{key}: " in message, message
    number = f"expected a whole number, got the number {float(value)!r}"  # said in user's terms
    assert ": must be " in message or number in message, message


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("limit = 3", "limit = 0", "evals.limit"),
        ("limit = 3", "sample = -3", "evals.sample"),
        ("limit = 3", "sample = 5\nseed = -1", "evals.seed"),
        ("max_cost = 2.5", "max_cost = nan", "max_cost"),
        ("max_cost = 2.5", "max_cost = inf", "max_cost"),
        ("epochs = 2", "epochs = 10000000000000", "models[1].epochs"),
        ("output = 0.0", "output = nan", "models[1].price"),
    ],
)
def test_the_other_numbers_of_a_run_file_are_checked_too(
    tmp_path: Path, old: str, new: str, key: str
):
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load(path)
    assert f": {key}" in str(err.value) and "must be" in str(err.value), str(err.value)


def test_syntax_errors_and_missing_models(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"not valid TOML: .*line 1"):
        load(write(tmp_path, "data_dir = \n"))
    with pytest.raises(ConfigError, match=r"models: at least one \[\[models\]\] table is required"):
        load(write(tmp_path, 'data_dir = "x"\n'))


def test_the_shipped_example_is_valid():
    run = load(Path(__file__).parents[1] / "examples" / "run.toml")
    assert run.models and run.providers
