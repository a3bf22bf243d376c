"""jaxdm.config: non-finite numbers, lists for tuple fields, secrets never echoed (issue 15)."""
import dataclasses

import pytest

from jaxdm import config as cfgmod
from tests.config_fixtures import Optim, assert_file_refused, assert_yaml_round_trip


@dataclasses.dataclass(frozen=True)
class Teacher:
    kind: str = "oracle"
    api_key_env: str | None = None


@dataclasses.dataclass(frozen=True)
class Cfg:
    optim: Optim = Optim()
    teacher: Teacher = Teacher()
    judges: tuple = ("oracle",)
    seeds: tuple[int, ...] = (0,)
    weights: tuple[float, ...] = (1.0,)
    kwargs: dict = dataclasses.field(default_factory=dict)
    extra: object = None


@pytest.mark.parametrize("override,key", [
    ("optim.lr=.nan", "optim.lr"),
    ("optim.lr=.inf", "optim.lr"),
    ("optim.lr=-.inf", "optim.lr"),
    ("optim.clip=.nan", "optim.clip"),          # inside an Optional
    ("weights=[1.0, .nan]", r"weights\[1\]"),   # inside a tuple
    ("kwargs.temperature=.inf", "kwargs.temperature"),  # free-form mapping
    ("judges=[.nan]", r"judges\[0\]"),          # bare tuple field
])
def test_non_finite_numbers_are_rejected_naming_the_key(override, key):
    with pytest.raises(cfgmod.ConfigError, match=rf"{key}: non-finite number"):
        cfgmod.load_config(Cfg, None, [override])


def test_non_finite_numbers_in_a_yaml_file(tmp_path):
    p = tmp_path / "c.yaml"
    assert_file_refused(Cfg, p, "optim:\n  lr: .NaN\n", r"c.yaml: optim.lr: non-finite number nan")
    assert_file_refused(Cfg, p, "kwargs: {a: {b: [1, .inf]}}\n", r"kwargs.a.b\[1\]: non-finite")


@pytest.mark.parametrize("text", ["nan", "inf", "'NaN'", "-inf"])
def test_nan_strings_are_not_numbers(text):
    with pytest.raises(cfgmod.ConfigError, match=r"optim.lr: expected a number, got str"):
        cfgmod.load_config(Cfg, None, [f"optim.lr={text}"])


def test_lists_are_accepted_for_tuple_fields(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("judges: [oracle, {kind: oracle, noise: 0.2, name: noisy}]\nseeds: [3, 4]\n")
    c = cfgmod.load_config(Cfg, p, ["weights=[0.5, 2]"])
    assert c.judges == ("oracle", {"kind": "oracle", "noise": 0.2, "name": "noisy"})
    assert c.seeds == (3, 4) and c.weights == (0.5, 2.0)
    assert isinstance(c.judges, tuple) and isinstance(c.weights, tuple)
    c = cfgmod.load_config(Cfg, None, ["judges=[smollm2]"])
    assert c.judges == ("smollm2",)
    with pytest.raises(cfgmod.ConfigError, match="judges: expected a list, got str 'oracle'"):
        cfgmod.load_config(Cfg, None, ["judges=oracle"])
    # Round trip through YAML keeps the tuple.
    assert_yaml_round_trip(c, tmp_path)


SECRET = "sk-live-0123456789abcdef"


@pytest.mark.parametrize("override", [
    f"teacher.api_key={SECRET}",          # unknown key (the reported case)
    f"teacher.token={SECRET}",
    f"teacher.password={SECRET}",
    f"kwargs.client_secret.x={SECRET}",
    f"optim.lr.api_key={SECRET}",         # 'a value, not a section'
    f"teacher.api_key=[{SECRET}",         # invalid YAML
])
def test_secret_values_are_never_echoed(override):
    with pytest.raises(cfgmod.ConfigError) as e:
        first = ["kwargs.client_secret=1"] if "client_secret" in override else []
        cfgmod.load_config(Cfg, None, first + [override])
    assert SECRET not in str(e.value)
    assert SECRET[:8] not in str(e.value)


def test_secret_hint_points_to_api_key_env(tmp_path):
    with pytest.raises(cfgmod.ConfigError, match="api_key_env") as e:
        cfgmod.load_config(Cfg, None, [f"teacher.api_key={SECRET}"])
    assert "<value hidden>" in str(e.value)
    p = tmp_path / "c.yaml"
    p.write_text(f"teacher:\n  api_key: {SECRET}\n")
    with pytest.raises(cfgmod.ConfigError, match="api_key_env") as e:
        cfgmod.load_config(Cfg, p)
    assert SECRET not in str(e.value)


@dataclasses.dataclass(frozen=True)
class WithSecretField:
    auth_token: int = 0


def test_type_errors_of_secret_fields_hide_the_value():
    with pytest.raises(cfgmod.ConfigError, match="auth_token: expected an int, got str <value hidden>"):
        cfgmod.load_config(WithSecretField, None, [f"auth_token={SECRET}"])


def test_secret_key_names():
    for key in ("api_key", "teacher.API_KEY", "apikey", "hf_token", "client_secret",
                "db.password", "passwd", "auth", "private_key"):
        assert cfgmod.is_secret_key(key), key
    for key in ("api_key_env", "teacher.api_key_env", "lr", "model", "max_tokens", "tokenizer",
                "max_new_tokens", "author", "base_url", "judges[0]"):
        assert not cfgmod.is_secret_key(key), key
    assert cfgmod.shown("x.api_key", SECRET) == "<value hidden>"
    assert cfgmod.shown("x.lr", 0.5) == "0.5"


def test_kind_and_options_names_the_kind_and_the_keys():
    from jaxdm.config import Kind, kind_and_options
    from jaxdm.registry import Registry, UnknownNameError
    allowed = Registry("thing kind")
    allowed.register("b", Kind(frozenset(), dict))
    allowed.register("a", Kind(frozenset({"x", "y"}), dict))
    assert kind_and_options({"kind": "a", "x": 1}, allowed, "thing") == ("a", {"x": 1})
    assert kind_and_options({"kind": "b"}, allowed, "thing") == ("b", {})
    with pytest.raises(TypeError, match="thing spec must be a mapping, got list"):
        kind_and_options(["a"], allowed, "thing")
    with pytest.raises(UnknownNameError, match=r"^unknown thing kind 'c'; known: \['a', 'b'\]$"):
        kind_and_options({"kind": "c"}, allowed, "thing")
    with pytest.raises(ValueError, match=r"unknown thing kind None"):  # no kind key
        kind_and_options({"x": 1}, allowed, "thing")
    with pytest.raises(ValueError, match=r"thing kind 'a': unknown key\(s\) \['z'\]; allowed: "
                                         r"\['x', 'y'\]"):
        kind_and_options({"kind": "a", "z": 0}, allowed, "thing")


def test_command_overrides_add_the_given_flags_and_no_progress():
    import argparse
    args = argparse.Namespace(overrides=["a.b=1"], out_dir="o", data=None, no_progress=True)
    assert cfgmod.command_overrides(args, ("data", "out_dir")) == [
        "a.b=1", "out_dir=o", "progress=false"]
    args.no_progress = False
    assert cfgmod.command_overrides(args, ()) == ["a.b=1"]
