"""The run file: parsing, defaults, and errors that name the key and the line."""
from __future__ import annotations

from pathlib import Path

import pytest

from dxi.runner.config import ConfigError, Price, load

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
    assert (name, provider.kind, provider.rpm, provider.max_in_flight) == ("local", "systemone", 600.0, 4)
    assert run.provider_of(run.models[0])[1].kind == "embedded"
    assert run.models[1].price == Price(input=0.1, output=0.0) and run.models[1].epochs == 2
    assert run.resolve(run.data_dir) == tmp_path / "data"
    assert run.cache_dir == ".dxi-cache" and run.epochs == 1


@pytest.mark.parametrize(("old", "new", "message"), [
    ("rpm = 600", "rmp = 600", "line 11: providers.local.rmp: unknown key (a typo?)"),
    ("output = 0.0", 'output = "free"', "line 22: models[1].price.output (the 2nd [[models]] table): Expected `float`, got `str`"),
    ('kind = "systemone"', 'kind = "carrier-pigeon"', "line 9: providers.local.kind: unknown adapter 'carrier-pigeon'"),
    ('provider = "local"', 'provider = "remote"', "line 20: models[1].provider (the 2nd [[models]] table): 'remote' is neither"),
    ("epochs = 2", "epochs = 0", "line 23: models[1].epochs (the 2nd [[models]] table): must be at least 1"),
    ('select = ["when2call"]', 'select = ["mmlu"]', "line 5: evals.select: unknown evaluation 'mmlu'"),
    ("max_cost = 2.5", "max_cost = -1", "line 2: max_cost: must be >= 0"),
    ("max_in_flight = 4", "max_in_flight = 0", "line 12: providers.local.max_in_flight: must be positive"),
    ('name = "local decider"', 'name = "embedded:sparrow-nano-general-v1.1"',
     "line 19: models[1].name (the 2nd [[models]] table): two models"),
    ("limit = 3", "limit = 3\nlimt = 4", "line 7: evals.limt: unknown key"),
])
def test_errors_name_the_key_and_line(tmp_path: Path, old: str, new: str, message: str):
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(f"{path}, ") and message in str(err.value)


def test_syntax_errors_and_missing_models(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"not valid TOML: .*line 1"):
        load(write(tmp_path, "data_dir = \n"))
    with pytest.raises(ConfigError, match=r"models: at least one \[\[models\]\] table is required"):
        load(write(tmp_path, 'data_dir = "x"\n'))


def test_the_shipped_example_is_valid():
    run = load(Path(__file__).parents[1] / "examples" / "run.toml")
    assert run.models and run.providers
