"""score_trajectories: padded [B, T] scores, failures counted as missing, never raised."""
import numpy as np

from jaxdm import roles
from jaxdm.decision import Oracle, make_backend
from jaxdm.roles.jobs import score_trajectories
from jaxdm.decision.types import Cost, score_failed, score_ok
from jaxdm.trajectory import Trajectory

from tests.decision.dm_fixtures import RaisingBackend, small_trajectory


def _batch():
    a = small_trajectory(True)
    b = Trajectory(goal=a.goal, steps=a.steps[:2], final_observation="x", reward=0.0,
                   success=False, budget=30, task_type="heat", env="alfworld",
                   metadata={"id": "b"})
    empty = Trajectory(goal=a.goal, steps=(), final_observation="x", reward=0.0,
                       success=False, budget=30, metadata={"id": "e"})
    return [a, b, empty]


def test_scores_match_backend_per_action_and_pad():
    trajs = _batch()
    backend = make_backend({"kind": "oracle"})
    res = score_trajectories(backend, trajs, question="progress", context="hindsight",
                             max_actions=6)
    assert res.scores.shape == (3, 6) and res.scores.dtype == np.float32
    assert res.lengths.tolist() == [4, 2, 0]
    want = [r.score for r in Oracle().score(roles.judge_requests(trajs[0], "progress",
                                                                 "hindsight"))]
    np.testing.assert_allclose(res.scores[0, :4], want)
    assert res.ok.tolist() == [[True] * 4 + [False] * 2, [True] * 2 + [False] * 4,
                               [False] * 6]
    assert res.stats["requests"] == 6 and res.stats["missing"] == 0
    assert res.failure_frac == 0.0
    # T defaults to the longest trajectory; max_actions cuts
    assert score_trajectories(backend, trajs, question="value", context="prefix"
                              ).scores.shape == (3, 4)
    cut = score_trajectories(backend, trajs, question="value", context="prefix",
                             max_actions=1)
    assert cut.stats["requests"] == 2 and cut.lengths.tolist() == [1, 1, 0]


class _Flaky:
    name = "flaky"

    def score(self, qs):
        out = []
        for i, _ in enumerate(qs):
            c = Cost(tokens_in=10, tokens_out=1, usd=0.5, seconds=0.1)
            if i == 1:
                out.append(score_failed("HTTP 404 at /v1/v1/chat/completions", cost=c))
            elif i == 2:
                out.append(dataclass_replace_score(score_ok(0.5, cost=c), 1.5))
            else:
                out.append(score_ok(0.25, cost=c))
        return out


def dataclass_replace_score(r, s):
    import dataclasses
    return dataclasses.replace(r, score=s)


class _Short:
    name = "short"

    def score(self, qs):
        return [score_ok(0.1)]


def test_failures_are_missing_and_counted():
    trajs = _batch()
    res = score_trajectories(_Flaky(), trajs, question="progress", context="hindsight")
    assert res.stats["requests"] == 6 and res.stats["missing"] == 2
    assert res.stats["errors"] == 1 and "404" in res.stats["error_examples"][0]
    assert res.stats["tokens_in"] == 60 and res.stats["usd"] == 3.0 and res.stats["priced"] == 6
    assert not res.ok[0, 1] and not res.ok[0, 2] and res.ok[0, 0]
    per = res.per_trajectory()
    assert np.isnan(per[0][1]) and per[0][0] == 0.25 and per[2].size == 0
    refused = RaisingBackend("raises", ConnectionError("connection refused"))
    for backend, msg in ((refused, "ConnectionError"), (_Short(), "returned 1 results")):
        res = score_trajectories(backend, trajs, question="progress", context="hindsight")
        assert res.stats["missing"] == res.stats["errors"] == 6
        assert msg in res.stats["last_error"] and res.failure_frac == 1.0
        assert not res.ok.any()
    none = score_trajectories(None, trajs, question="progress", context="hindsight")
    assert none.stats["missing"] == 6 and none.stats["errors"] == 0
