"""The redesigned trainer reproduces the pre-redesign runs exactly (see reproduce_cases.py)."""
import json

import pytest

from tests.rl.reproduce_cases import CASES, FIXTURE, run_case

FAST = ("toy_ordering_grpo", "toy_ordering_teacher", "toy_ordering_gigpo")


def _check(name, tmp_path):
    want = json.loads(FIXTURE.read_text())[name]
    got = run_case(name, tmp_path / name)
    assert len(got["records"]) == len(want["records"])
    for i, (g, w) in enumerate(zip(got["records"], want["records"])):
        assert g == w, f"{name}: record {i} differs"
    assert got["params"] == want["params"], f"{name}: final params differ"


@pytest.mark.parametrize("name", FAST)
def test_reproduces_pre_redesign_run(name, tmp_path):
    _check(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if n not in FAST])
def test_reproduces_pre_redesign_run_all(name, tmp_path):
    _check(name, tmp_path)
