"""``env.backend`` (inline | process | ray) in the harness's and the bench's configs: the same
episodes on a fixed seed whichever backend steps the env (the LLM and the decision model stay
in the test's process); an episode lost to a killed env worker is counted and run again (the
same results), more lost than ``max_failed_share`` fails the job; bad keys are named errors.
The Ray half runs on a local Ray instance started here and skips without the [ray] extra."""
from __future__ import annotations

import dataclasses
import functools
import json
import os

import pytest

from dying_gym import DyingGym
from jaxdm import config as cfgmod
from jaxdm.bench import l3
from jaxdm.bench.run import BenchConfig
from jaxdm.cli import main
from jaxdm.decision import Oracle
from jaxdm.envs.decision_gym import GymParams
from jaxdm.harness import passes
from jaxdm.harness.config import load
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.passes import build_harness, run_episodes
from jaxdm.harness.pool import (EnvWorkersConfig, EnvWorkersFailed, EpisodeRunner,
                               close_kept_pools)
from jaxdm.jsonl import without_keys
from tests.ray_fixtures import local_ray_with

HERE = os.path.dirname(os.path.abspath(__file__))
# measured, not results
TIMING = {"seconds", "overhead_s", "dm_seconds", "seconds_per_task", "seconds_per_call"}
# ray.init starts Ray's processes with subprocess (fork + exec at once), which JAX's at-fork
# hook warns about in a process that has imported JAX; nothing runs between fork and exec.
pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")
PROCESS = ["env.backend=process", "env.num_workers=2"]
_timeless = functools.partial(without_keys, keys=TIMING)


def _pass(overrides, tasks=6, dm=None, delegations=()):
    """The shadow pass (or an arm with ``delegations``) of the smoke preset on ``tasks`` tasks
    with ``overrides``: its episodes without timings."""
    cfg = load("smoke", ["progress=false", *overrides])
    harness = build_harness(cfg, delegations, dm, shadow=not delegations)
    eps = run_episodes(cfg, harness, "fit", range(tasks), "shadow")
    return [_timeless(e.to_dict()) for e in eps]


@pytest.fixture(autouse=True)
def _no_kept_workers():
    yield
    close_kept_pools()   # a pass keeps its workers for the next one like it: none after a test


@pytest.fixture(scope="module")
def inline_episodes():
    return _pass([])


def test_env_worker_keys_are_checked_on_load():
    for over, match in [
            (["env.backend=dask"],
             r"env.backend: unknown env backend 'dask'; known: \['inline', 'process', 'ray'\]"),
            (["env.num_workers=2"], r"env.num_workers=2 needs env.backend process or ray"),
            (["env.backend=process"], r"env.backend=process needs env.num_workers >= 1"),
            (["env.backend=ray", "env.num_workers=0"], r"env.backend=ray needs env.num_workers"),
            (["env.ray={num_cpus: 1}"], r"env.ray is set but env.backend is 'inline'"),
            ([*PROCESS, "env.ray={num_cpus: 1}"], r"env.ray is set but env.backend is 'process'"),
            (["env.backend=ray", "env.num_workers=1", "env.ray.gpus=1"],
             r"unknown config key\(s\) \['env.ray.gpus'\]"),
            ([*PROCESS, "env.step_timeout=0"], r"env.step_timeout must be a finite number"),
            (["env.in_flight=-2"], r"env.in_flight must be an int >= 0")]:
        with pytest.raises(HarnessError, match=match):
            load("smoke", over)
        with pytest.raises(cfgmod.ConfigError, match=match):
            cfgmod.load_config(BenchConfig, None, over)
    cfg = load("smoke", ["env.backend=ray", "env.num_workers=3", "env.ray.address=10.0.0.5:6379",
                         "env.ray.resources={env_node: 1}"])
    assert (cfg.env.backend, cfg.env.num_workers, cfg.env.slots) == ("ray", 3, 6)
    assert cfg.env.ray == {"address": "10.0.0.5:6379", "resources": {"env_node": 1}}
    assert cfg.env.variant == "base"   # the env section's other keys are unchanged
    bench = cfgmod.load_config(BenchConfig, None, [*PROCESS, "env.in_flight=3"])
    assert (bench.env.backend, bench.env.slots) == ("process", 3)


def test_interleaved_and_process_episodes_equal_inline(inline_episodes):
    assert len(inline_episodes) == 6 and sum(len(e["decisions"]) for e in inline_episodes) > 30
    # episodes interleaved on an in-process pool, then stepped by two worker processes
    assert _pass(["env.in_flight=4"]) == inline_episodes
    assert _pass(PROCESS) == inline_episodes
    # an arm whose decision model takes the tool choice (a delegation acting on the env)
    from jaxdm.harness.modes import Delegation
    arm = [Delegation("tool", "replace")]
    assert _pass(PROCESS, 4, delegations=arm) == _pass([], 4, delegations=arm)


def test_the_next_pass_like_it_reuses_the_workers(inline_episodes):
    cfg = load("smoke", [*PROCESS])
    harness = build_harness(cfg, (), None, shadow=True)
    params = GymParams(variant=cfg.env.variant, max_steps=cfg.env.max_steps, split="fit")
    runs = []
    for tasks in (range(6), range(3), range(6)):
        runner = EpisodeRunner(cfg.env, passes.DecisionGym, params, max_failed_share=0.05)
        eps = [_timeless(ep.to_dict()) for _, _, ep in
               runner.play(tasks, lambda i: harness.for_episode())]
        runs.append((runner.reused, eps))
    assert [reused for reused, _ in runs] == [False, True, True]
    assert runs[0][1] == runs[2][1] == inline_episodes and runs[1][1] == inline_episodes[:3]
    # another split is another pool: the kept one closes
    other = EpisodeRunner(cfg.env, passes.DecisionGym, dataclasses.replace(params, split="test"),
                          max_failed_share=0.05)
    assert len(list(other.play([0], lambda i: harness.for_episode()))) == 1
    assert not other.reused


def _dying(tmp_path, monkeypatch, tasks, always=False):
    factory = functools.partial(DyingGym, str(tmp_path), tuple(tasks), os.getpid(),
                                always=always)
    monkeypatch.setattr(passes, "DecisionGym", factory)


def test_a_killed_process_worker_loses_one_episode_run_again(tmp_path, monkeypatch, capsys,
                                                             inline_episodes):
    _dying(tmp_path, monkeypatch, [2])
    got = _pass([*PROCESS, "max_failed_share=0.2"])
    assert (tmp_path / "killed-2").exists()           # the worker did die on task 2
    assert got == inline_episodes                     # ... and task 2 ran again
    assert "1 episode(s) lost to env workers and run again" in capsys.readouterr().out


def test_losses_past_the_failure_share_fail_the_job(tmp_path, monkeypatch, capsys):
    _dying(tmp_path, monkeypatch, [0, 1])
    out = tmp_path / "run"
    # 2 of 8 episodes started lost (25 % > the default 5 %): the command fails, named
    assert main(["harness", "shadow", "--config", "smoke", "--out", str(out), "--no-progress",
                 "shadow_tasks=6", *PROCESS]) == 2
    err = capsys.readouterr().err
    assert "2 of 8 episodes were lost to env workers" in err and "max_failed_share 0.05" in err
    # the episodes that finished are journaled: --resume runs none of them again
    rows = (out / "journal/shadow/shadow.jsonl").read_text().splitlines()
    assert sorted(json.loads(r)["index"] for r in rows) == list(range(6))


def test_a_task_lost_every_time_stops_the_runner(tmp_path):
    factory = functools.partial(DyingGym, str(tmp_path), (1,), os.getpid(), always=True)
    cfg = load("smoke", [])
    params = GymParams(variant=cfg.env.variant, max_steps=cfg.env.max_steps, split="fit")
    runner = EpisodeRunner(EnvWorkersConfig("process", 1), factory, params,
                           max_failed_share=1.0)
    harness = build_harness(cfg, (), None, shadow=True)
    played = runner.play([0, 1, 2], lambda i: harness.for_episode())
    assert next(played)[0] == 0
    with pytest.raises(EnvWorkersFailed, match="task 1: lost to an env worker 3 times"):
        next(played)
    assert runner.env_failures == 3


def test_bench_l3_rows_equal_on_worker_processes():
    cfg = l3.L3Config(envs=("base", "alfworld"), tasks=3)
    recs, rows = l3.run_l3(Oracle(), cfg)
    recs_p, rows_p = l3.run_l3(Oracle(), cfg, workers=EnvWorkersConfig("process", 2))
    assert [r["env"] for r in rows] == ["base"] * 3 + ["alfworld"] * 3
    assert sum(r["dm_decisions"] for r in rows) > 6
    assert _timeless(rows_p) == _timeless(rows) and recs_p == recs


# ---- Ray --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance (the VectorEnv tests' fixture, with this folder on the actors'
    path so they can build the DyingGym)."""
    with local_ray_with(HERE) as ray:
        yield ray


def test_ray_episodes_equal_inline_and_survive_a_killed_actor(local_ray, tmp_path, monkeypatch,
                                                              capsys, inline_episodes):
    address = local_ray.get_runtime_context().gcs_address
    ray_keys = ["env.backend=ray", "env.num_workers=2",
                f"env.ray={{address: '{address}', num_cpus: 0.5}}"]
    assert _pass(ray_keys) == inline_episodes
    _dying(tmp_path, monkeypatch, [3])
    assert _pass([*ray_keys, "max_failed_share=0.2"]) == inline_episodes
    assert (tmp_path / "killed-3").exists()
    assert "1 episode(s) lost to env workers and run again" in capsys.readouterr().out
    rows = l3.run_l3(Oracle(), l3.L3Config(envs=("hard",), tasks=2),
                     workers=EnvWorkersConfig("ray", 1, ray={"num_cpus": 0.5}))[1]
    assert _timeless(rows) == _timeless(l3.run_l3(Oracle(), l3.L3Config(envs=("hard",),
                                                                       tasks=2))[1])


def test_bench_job_on_env_workers_and_a_lost_task(tmp_path, monkeypatch):
    from jaxdm.bench.run import BenchError, run
    base = dict(levels=("l3",), judges=("oracle",), l3_tasks=2, l3_envs=("shift",),
                progress=False)
    inline = run(BenchConfig(**base, out_dir=str(tmp_path / "inline")))
    on_workers = run(BenchConfig(**base, out_dir=str(tmp_path / "process"),
                                 env=EnvWorkersConfig("process", 2)))
    assert _timeless(on_workers["backends"]) == _timeless(inline["backends"])
    # where the env steps ran is not a setting of the results: a resume may change it
    assert run(BenchConfig(**base, out_dir=str(tmp_path / "process")), resume=True)
    monkeypatch.setattr(l3, "DecisionGym", functools.partial(
        DyingGym, str(tmp_path), (1,), os.getpid(), always=True))
    with pytest.raises(BenchError, match="L3 oracle on shift: task 1: lost to an env worker 3 "
                                         "times"):
        run(BenchConfig(**base, out_dir=str(tmp_path / "dying"),
                        env=EnvWorkersConfig("process", 1)))
