"""The one backend-spec parser: aliases, 'kind:key=value,...', mappings; errors name the item
and never show a secret; the harness's make_dm reads spec strings through it."""
import pytest

from jaxdm.decision import BackendSpecError, parse_backend_spec
from jaxdm.harness.dm import NoisyOracle, make_dm


def test_parse_forms():
    assert parse_backend_spec("oracle") == {"kind": "oracle", "name": "oracle"}
    assert parse_backend_spec("local_likelihood:path=/m/sft,dtype=bfloat16,progress=false") == {
        "kind": "local_likelihood", "path": "/m/sft", "dtype": "bfloat16", "progress": False,
        "name": "sft"}
    assert parse_backend_spec("oracle:noise=0.2,seed=3,name=noisy") == {
        "kind": "oracle", "noise": 0.2, "seed": 3, "name": "noisy"}
    assert parse_backend_spec({"kind": "remote", "model": "m"})["name"] == "m"
    assert parse_backend_spec("oracle:noise=0.1", with_name=False) == {"kind": "oracle",
                                                                       "noise": 0.1}


@pytest.mark.parametrize("spec,match", [
    ("oracle:noise", "item 1 is not key=value"),
    ("gpt-17", "unknown backend 'gpt-17'"),
    ("oracle:noise=nan", "non-finite"),
    ({"path": "x"}, "has no 'kind'"),
    (3, "string or a mapping"),
])
def test_parse_errors(spec, match):
    with pytest.raises(BackendSpecError, match=match):
        parse_backend_spec(spec)


def test_secret_values_never_shown():
    with pytest.raises(BackendSpecError, match="look like secrets") as e:
        parse_backend_spec("remote:base_url=http://h,api_key=sk-123")
    assert "sk-123" not in str(e.value)
    with pytest.raises(BackendSpecError) as e:
        parse_backend_spec("remote:sk-456")
    assert "sk-456" not in str(e.value)


def test_harness_make_dm_reads_spec_strings():
    dm = make_dm("oracle_noisy:default_accuracy=0.8,seed=3")
    assert isinstance(dm, NoisyOracle) and dm.default_accuracy == 0.8 and dm.seed == 3
    assert make_dm("oracle:noise=0.1").noise == 0.1
    with pytest.raises(ValueError, match="unknown decision model"):
        make_dm("bogus")


def test_points_only_wrapper():
    from jaxdm.decision.types import MultipleChoice
    dm = make_dm({"kind": "points_only", "points": ["stop"],
                  "dm": "oracle_noisy:default_accuracy=1.0"})
    q_stop = MultipleChoice("c", "stop?", ("stop", "continue"), meta={"point": "stop",
                                                                       "answer": (1,)})
    q_tool = MultipleChoice("c", "tool?", ("a", "b", "c"), meta={"point": "tool",
                                                                  "answer": (0,)})
    r_tool, r_stop = dm.choose([q_tool, q_stop])
    assert r_stop.ok and r_stop.choice == 1
    assert not r_tool.ok and "not delegated" in r_tool.error
    with pytest.raises(ValueError, match="unknown decision point"):
        make_dm({"kind": "points_only", "points": ["tooling"], "dm": "oracle"})
