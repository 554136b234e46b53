"""An intervention's grammar (``backends.recipes.intervention``): one parser and one label for the
study's word and the report's label, one default Hadamard size, the dht policy by name, imported
without torch; and the recipe built from a parsed word reads back the same label."""

from __future__ import annotations

import subprocess
import sys

import pytest

from backends.quant import DETERMINISTIC, SIGN_POLICIES
from backends.recipes import GEMMS, HadamardSpec, Recipe
from backends.recipes.intervention import (
    DEFAULT_SIZE,
    NONE,
    SIGNS,
    Hadamard,
    Intervention,
    UnknownPart,
    label,
    parse,
    parse_label,
)

WORDS = {  # a study's word -> its label
    "none": "none",
    "": "none",
    "sr": "sr",
    "rht": "rht16",
    "dht": "dht16",
    "fht32": "fht32",
    "sr+rht64": "sr+rht64",
    "rht64+sr": "sr+rht64",
    " sr + dht ": "sr+dht16",
}


def test_importing_the_grammar_imports_no_torch():
    code = (
        "import sys, backends, backends.recipes, backends.recipes.intervention as g; "
        "assert g.label(g.parse('sr+dht')) == 'sr+dht16'; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_backends_still_gives_every_name_and_room_on_access():
    import backends

    assert backends.Recipe is Recipe and backends.Intervention is Intervention
    assert backends.quant.DETERMINISTIC == "none" and callable(backends.convert)
    with pytest.raises(AttributeError, match="no attribute 'parse_intervention'"):
        backends.parse_intervention  # noqa: B018


@pytest.mark.parametrize("word, text", sorted(WORDS.items()))
def test_a_word_parses_to_its_canonical_label(word, text):
    iv = parse(word, shorthand=True)
    assert label(iv) == text
    assert parse(text) == iv  # the label reads back as the same value


def test_a_hadamard_without_a_size_gets_the_one_default():
    assert DEFAULT_SIZE == 16
    assert parse("dht") == Intervention(hadamard=Hadamard("dht", DEFAULT_SIZE))
    assert parse("rht").hadamard == Hadamard("rht", 16) and Hadamard("fht").size == 16


def test_labels_carry_the_quantizers_of_named_recipes_in_a_fixed_order():
    iv = parse("fht16+4over6+sr")
    assert iv == Intervention(sr=True, four_over_six=True, hadamard=Hadamard("fht", 16))
    assert label(iv) == "sr+4over6+fht16" and label(iv, sizes=False) == "sr+4over6+fht"
    assert label(parse("eden+rht128")) == "eden+rht128"
    assert not iv.shorthand and parse("sr+rht").shorthand


def test_a_per_gemm_label_is_one_label_when_the_gemms_agree():
    sr, plain = parse("sr"), NONE
    assert label({"fprop": sr, "dgrad": sr}) == "sr" and label({}) == "none"
    per = {"fprop": plain, "dgrad": sr, "wgrad": parse("sr+fht16")}
    text = label(per)
    assert text == "fprop:none,dgrad:sr,wgrad:sr+fht16"
    assert parse_label(text) == per and parse_label("sr+rht64") == parse("sr+rht64")
    assert label(per, sizes=False) == "fprop:none,dgrad:sr,wgrad:sr+fht"


@pytest.mark.parametrize(
    "word, shorthand, message",
    [
        ("rth", True, "unknown 'rth'; allowed: none, sr, rht, dht, fht"),
        ("sr16", True, "unknown 'sr16'"),
        ("eden", True, "unknown 'eden'; allowed: none, sr, rht"),
        ("4over6+sr", True, "unknown '4over6+sr'"),
        ("xyz", False, "allowed: none, sr, eden, 4over6, rht[N]"),
        ("sr+sr", False, "'sr' given twice in 'sr+sr'"),
        ("rht+dht32", False, "only one Hadamard transform allowed in 'rht+dht32'"),
    ],
)
def test_a_bad_word_is_refused_naming_what_is_allowed(word, shorthand, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+").replace("[", r"\[")):
        parse(word, shorthand=shorthand)


def test_an_unknown_part_is_named():
    with pytest.raises(UnknownPart) as e:
        parse("sr+xyz")
    assert (e.value.text, e.value.part) == ("sr+xyz", "xyz")
    with pytest.raises(ValueError, match="ROLE:INTERVENTION with ROLE one of fprop, dgrad, wgrad"):
        parse_label("wgard:sr")


def test_each_hadamard_kind_names_a_sign_policy_and_dht_is_the_deterministic_one():
    assert set(SIGNS.values()) == set(SIGN_POLICIES)
    assert SIGNS["dht"] == DETERMINISTIC == HadamardSpec().signs
    for kind, signs in SIGNS.items():
        spec = HadamardSpec.of(Hadamard(kind, 32))
        assert (spec.size, spec.signs) == (32, signs)
        assert spec.part() == Hadamard(kind, 32) and spec.short() == f"{kind}32"


@pytest.mark.parametrize("word", ["none", "sr", "dht", "rht64", "sr+fht32"])
def test_the_recipe_of_a_word_reads_back_its_label_on_every_targeted_gemm(word):
    iv = parse(word)
    for fp4, apply_to in ((GEMMS, None), (("wgrad",), None), (GEMMS, ("dgrad",))):
        r = Recipe.from_shorthand(fp4, iv, apply_to=apply_to)
        assert r == Recipe.from_shorthand(fp4, word, apply_to=apply_to)  # typed or written
        assert r.short() == Recipe.from_shorthand(fp4, word, apply_to=apply_to).short()
        for g in apply_to or fp4:
            assert label(r.gemm(g).intervention()) == label(iv)
    assert Recipe.from_shorthand(GEMMS, "dht").short() == "mxfp4[fprop,dgrad,wgrad]+dht16/bf16"


def test_a_shorthand_refuses_the_quantizers_of_named_recipes():
    with pytest.raises(ValueError, match="'eden\\+rht128' is not a shorthand's"):
        Recipe.from_shorthand(GEMMS, parse("eden+rht128"))
