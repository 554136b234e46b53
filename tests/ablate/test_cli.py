"""The CLI resolves recipe shorthands and turns library errors into usage errors."""

import json

from click.testing import CliRunner

from ablate.cli import main


def test_recipe_shows_each_gemm_operand():
    res = CliRunner().invoke(
        main, ["recipe", "--fp4", "fprop,dgrad,wgrad", "--intervention", "dht", "--base", "fp8"]
    )
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "mxfp4[fprop,dgrad,wgrad]+dht16/fp8"
    assert "wgrad  dy=mxfp4" in lines[3] and "hadamard=dht16" in lines[3]


def test_recipe_json_round_trips():
    res = CliRunner().invoke(main, ["recipe", "--fp4", "wgrad", "--intervention", "sr", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["wgrad"]["a"]["rounding"] == "sr" and d["fprop"]["a"] is None


def test_recipe_bad_gemm_is_a_usage_error_naming_allowed_values():
    res = CliRunner().invoke(main, ["recipe", "--fp4", "wgard"])
    assert res.exit_code == 2
    assert "allowed: fprop, dgrad, wgrad" in res.output
