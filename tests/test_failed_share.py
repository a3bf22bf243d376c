"""One failure bound for every job that calls a model or an agent (issue 43): screen, bench,
the harness and the trainer's teacher share the key ``max_failed_share``, its default
(``jaxdm.runlog.MAX_FAILED_SHARE``, 5 % of calls) and its check."""
from __future__ import annotations

import math

import pytest

from jaxdm.bench.run import BenchConfig, BenchError
from jaxdm.harness.config import HarnessConfig
from jaxdm.rl.train_config import TeacherSection
from jaxdm.runlog import MAX_FAILED_SHARE, check_failed_share
from jaxdm.screen.run import ScreenConfig
from jaxdm.screen.store import ScreenError


def test_every_job_defaults_to_the_one_bound():
    assert MAX_FAILED_SHARE == 0.05
    got = {"screen": ScreenConfig().max_failed_share, "bench": BenchConfig().max_failed_share,
           "harness": HarnessConfig().max_failed_share,
           "teacher": TeacherSection().max_failed_share}
    assert got == dict.fromkeys(got, MAX_FAILED_SHARE)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, math.inf, True, "0.1", None])
def test_a_bad_bound_is_a_named_error_in_every_job(bad):
    with pytest.raises(ValueError, match=r"^max_failed_share must be in \[0, 1\], got "):
        check_failed_share(bad)
    with pytest.raises(ScreenError, match="max_failed_share must be in"):
        check_failed_share(bad, error=ScreenError)
    with pytest.raises(BenchError, match="max_failed_share must be in"):
        BenchConfig(max_failed_share=bad)
    with pytest.raises(ValueError, match="max_failed_share must be in"):
        ScreenConfig(max_failed_share=bad)
    with pytest.raises(ValueError, match="max_failed_share must be in"):
        HarnessConfig(max_failed_share=bad)
    if bad is not None:   # the teacher's None means "never stop"
        with pytest.raises(ValueError, match=r"^teacher\.max_failed_share must be in"):
            TeacherSection(max_failed_share=bad)


def test_the_bounds_edges_are_settings():
    assert check_failed_share(0) == 0.0 and check_failed_share(1) == 1.0
    assert TeacherSection(max_failed_share=None).max_failed_share is None
