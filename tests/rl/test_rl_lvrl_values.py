"""LVRL value signals: oracle values (BabyAI, ALFWorld), the packed LocalReadout value pass,
the JSON-list value model and LLM summariser against a real HTTP server, group context."""
from __future__ import annotations

import functools
import json
import threading

import jax
import numpy as np
import pytest

from jaxdm.decision.types import Cost
from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams, make_text_env, play_trajectory, solve
from jaxdm.envs.babyai.value import plan_length, plan_length_jax
from jaxdm.rl import advantages as adv
from jaxdm.rl.values import (HttpChatGenerator, ListValueModel, OracleValueModel,
                             ReadoutValueModel, ValueQuery, lvrl_step_advantages,
                             parse_value_list, plot_value_curves, render_group_context,
                             summarize_deterministic, summarize_group, values_signal)
from jaxdm.trajectory import Step, Trajectory
from tests.http_fixtures import JSONHandler, serve


# ---- Oracle values ------------------------------------------------------------------------
def test_oracle_lvrl_tiny_deterministic_case_by_hand():
    # BabyAI seed 60: the solver's plan has 9 actions. Budget M = 12 steps.
    # A follows the plan (success); B does 3 plan actions, then "done" until truncated.
    params = BabyAIParams.for_split("train", max_steps=12)
    env = make_text_env("train", max_steps=12)
    _, st = env.reset(60, params)
    plan = solve(st.core)
    assert len(plan) == 9
    traj_a = play_trajectory(env, 60, plan, params)
    traj_b = play_trajectory(env, 60, plan[:3] + [6] * 9, params)
    assert traj_a.success and not traj_b.success and len(traj_b) == 12 and traj_b.truncated
    sig = values_signal([traj_a, traj_b], [0, 0], OracleValueModel(), num_steps=12)
    assert sig.value_rows.all() and sig.metrics["value/failures"] == 0
    # Along the plan n_t = 9 - t, steps left L_t = 12 - t, V = 1 - n/L:
    # A: V0 = p_hat = 1/2, 3/11, 3/10, 1/3, 3/8, 3/7, 1/2, 3/5, 3/4, V9 = R = 1.
    # B: V0 = 1/2, 3/11, 3/10, 1/3, then n stays 6: 1 - 6/8, 1 - 6/7, 0 (n >= L), ..., V12 = 0.
    va = [1 / 2, 3 / 11, 3 / 10, 1 / 3, 3 / 8, 3 / 7, 1 / 2, 3 / 5, 3 / 4, 1]
    vb = [1 / 2, 3 / 11, 3 / 10, 1 / 3, 1 / 4, 1 / 7] + [0] * 7
    np.testing.assert_allclose(sig.values[0, :10], va, atol=1e-6)
    np.testing.assert_allclose(sig.values[1], vb, atol=1e-6)
    mask = np.arange(12)[None] < np.array([[9], [12]])
    got = np.asarray(adv.lvrl_advantages(sig.values, np.array([1.0, 0.0]), np.array([0, 0]),
                                         mask, num_groups=1))
    want_a = np.diff(va)   # e.g. A_0 = 3/11 - 1/2 = -0.227, A_8 = 1 - 3/4 = 0.25
    want_b = np.diff(vb)   # the "done" steps: 1/4 - 1/3, 1/7 - 1/4, 0 - 1/7, then 0
    np.testing.assert_allclose(got[0, :9], want_a, atol=1e-6)
    np.testing.assert_allclose(got[1], want_b, atol=1e-6)
    np.testing.assert_allclose(got.sum(1), [0.5, -0.5], atol=1e-6)


def test_babyai_jax_plan_length_equals_solver_on_rollout_states():
    env = BabyAIEnv()
    params = BabyAIParams.for_split("train")
    plan_jax = jax.jit(jax.vmap(plan_length_jax))
    step = jax.jit(jax.vmap(env.step_env, in_axes=(0, 0, 0, None)))
    keys = jax.random.split(jax.random.key(0), 8)
    _, st = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(keys, params)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(6):
        n = np.asarray(plan_jax(st))
        host = jax.device_get(st)
        for i in range(8):
            s = jax.tree.map(lambda a, i=i: a[i], host)
            if int(s.carrying[0]) == 0:  # hands free: the fixed point is the exact plan
                assert plan_length(s) == n[i]
                checked += 1
        acts = np.asarray(rng.integers(0, 6, 8), np.int32)
        _, st, *_ = step(keys, st, acts, params)
    assert checked > 30


def test_alfworld_oracle_rises_along_the_expert_plan():
    from jaxdm.envs.alfworld import noisy_expert_trajectories
    from jaxdm.envs.alfworld.experts import NoisyExpertConfig
    from jaxdm.envs.alfworld.value import trajectory_oracle_values
    zero = NoisyExpertConfig(detour_prob=0, look_prob=0, invalid_prob=0, dependency_error_prob=0,
                             recover_prob=0, give_up_prob=0, search_prob=0)
    traj = noisy_expert_trajectories(1, seed=3, task_types=["pick_heat_then_place_in_recep"],
                                     config=zero)[0]
    v = trajectory_oracle_values(traj)
    n = len(traj)
    # n_t = n - t, L_t = 30 - t: V_t = 1 - (n - t) / (30 - t), the last state won (1).
    want = [1 - (n - t) / (30 - t) for t in range(n)] + [1.0]
    np.testing.assert_allclose(v, want, atol=1e-6)
    with pytest.raises(ValueError, match="seed"):
        trajectory_oracle_values(Trajectory("g", traj.steps, "x", budget=30))


def test_oracle_noise_is_seeded_per_query_and_clipped():
    traj = Trajectory("g", tuple(Step(f"o{t}", "a") for t in range(5)), "end",
                      metadata={"oracle_values": [0.5, 0.0, 0.5, 1.0, 0.9, 1.0]})
    m = OracleValueModel(noise=0.3, seed=1)
    a, b = m.values([ValueQuery(traj, "", ident=(0, 1)), ValueQuery(traj, "", ident=(0, 2))])
    (a2,) = m.values([ValueQuery(traj, "", ident=(0, 1))])
    np.testing.assert_array_equal(a.values, a2.values)
    assert not np.array_equal(a.values, b.values)
    assert a.values.shape == (4,) and (a.values >= 0).all() and (a.values <= 1).all()
    with pytest.raises(ValueError, match="noise"):
        OracleValueModel(noise=-1.0)
    # No seed to replay: a counted failure (the row falls back to GRPO), never an exception.
    lost = Trajectory("g", traj.steps, "end", env="babyai")
    (res,) = m.values([ValueQuery(lost, "")])
    assert not res.ok and "task_seed" in res.error


def test_oracle_drift_lowers_each_state_by_its_index():
    """value.drift: state t's value lowered by drift * t (the downward drift SmolLM2's values
    showed), clipped to [0, 1], before the noise; checked by name in the config."""
    from jaxdm.rl.values.trainer_signal import check_value_spec, value_model_from_spec
    traj = Trajectory("g", tuple(Step(f"o{t}", "a") for t in range(5)), "end",
                      metadata={"oracle_values": [0.5, 0.0, 0.5, 1.0, 0.9, 1.0]})
    (r,) = OracleValueModel(drift=0.1).values([ValueQuery(traj, "", ident=(0, 1))])
    np.testing.assert_allclose(r.values, [0.0, 0.3, 0.7, 0.5], atol=1e-6)  # 0 - 0.1 clipped
    model, _ = value_model_from_spec({"kind": "oracle", "drift": 0.05})
    assert model.drift == 0.05 and "drift=0.05" in model.name
    for bad in (-0.1, float("nan"), True, "x"):
        with pytest.raises(ValueError, match="value.drift: must be a finite number >= 0"):
            check_value_spec({"kind": "oracle", "drift": bad})
    with pytest.raises(ValueError, match="drift must be a finite number >= 0"):
        OracleValueModel(drift=-1.0)


# ---- group context ------------------------------------------------------------------------
def _traj(i: int, n: int, success: bool) -> Trajectory:
    steps = tuple(Step(f"Room {i}.{t}. You see a box.", f"act {t}", valid=t != 1,
                       annotations={"milestone": t == 2, "no_op": t == 3}) for t in range(n))
    return Trajectory("pick up the box", steps, f"Final {i}.", reward=float(success),
                      success=success, budget=40, metadata={"id": f"t{i}"})


def test_deterministic_summary_and_group_context_leave_the_target_out():
    trajs = [_traj(0, 5, True), _traj(1, 4, False), _traj(2, 6, False)]
    s = summarize_deterministic(trajs[0])
    assert [x.result for x in s.steps[:4]] == [
        "Room 0.1.", "[invalid] Room 0.2.", "[progress] Room 0.3.", "[no effect] Room 0.4."]
    summaries, cost = summarize_group(trajs)
    ctx = render_group_context(summaries, 1)
    assert "Attempt A (succeeded after 5 actions)" in ctx
    assert "Attempt B" not in ctx and "Attempt C (failed after 6 actions)" in ctx
    assert "Attempt B" in render_group_context(summaries, 1, include_target=True)
    short = render_group_context(summaries, 0, max_steps_per_rollout=2)
    assert "(4 steps omitted)" in short and cost == Cost()
    with pytest.raises(ValueError, match="summariser"):
        summarize_group(trajs, "magic")


# ---- packed local value pass --------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _tiny():
    from jaxdm.models import decoder
    from jaxdm.models.config import ModelConfig
    from jaxdm.models.loading import Pretrained, load_tokenizer
    from jaxdm.models.smollm2 import smollm2_path
    path = smollm2_path()
    config = ModelConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=100000.0,
                         rms_norm_eps=1e-5, tie_embeddings=True, max_position_embeddings=4096)
    params = decoder.init_params(config, jax.random.key(0))
    return Pretrained(params=params, config=config, tokenizer=load_tokenizer(path),
                      chat_template=None, path=path)


def test_packed_value_pass_equals_one_request_per_state():
    from jaxdm.decision import LocalReadout
    from jaxdm.decision.shared_prefix import score_requests_one_by_one
    pre = _tiny()
    dm = LocalReadout(pre)
    model = ReadoutValueModel(dm)
    trajs = [_traj(0, 6, True), _traj(1, 5, False), _traj(2, 3, False)]
    summaries, _ = summarize_group(trajs)
    q = ValueQuery(trajs[1], render_group_context(summaries, 1))
    (res,) = model.values([q])
    assert res.ok and res.values.shape == (4,)
    assert dm.stats["calls"] == 1  # all four interior states in one packed pass
    reqs = dm._yesno_requests(model.requests(q))  # noqa: SLF001 (test: the same token ids)
    ref = score_requests_one_by_one(pre.params, pre.config, reqs)
    want = np.array([np.exp(r[0, 0]) for r in ref])
    np.testing.assert_allclose(res.values, want, atol=1e-5)
    # The shared trunk is reused: far fewer tokens run than one request per state.
    assert dm.stats["unique_tokens"] < 0.4 * dm.stats["request_tokens"]


# ---- JSON-list value model and LLM summaries over HTTP -------------------------------------
class _Handler(JSONHandler):
    def do_POST(self):
        body = self.request_json()
        user = body["messages"][-1]["content"]
        model = body["model"]
        if model == "err500":
            self.send_response(500)
            self.end_headers()
            return
        if "JSON list of exactly" in user and "numbers" in user:
            n = int(user.split("JSON list of exactly ")[1].split()[0])
            target = user.split("Goal: ")[1].split("\n")[0]
            kind = {"g-short": "short", "g-bad": "bad", "g-range": "range"}.get(target, "ok")
            vals = [round(0.1 + 0.8 * k / max(n, 1), 3) for k in range(n)]
            text = {"ok": "```json\n" + json.dumps(vals) + "\n```",
                    "short": json.dumps(vals[:-1]), "bad": "values: high, then low",
                    "range": json.dumps([1.5] * n)}[kind]
        else:  # summarisation
            n = int(user.split("JSON list of exactly ")[1].split()[0])
            text = json.dumps([f"did step {k}" for k in range(n)]) if model == "good" \
                else "Sure! Here is a summary."
        self.reply_chat(text, 1000, 20)


@pytest.fixture(scope="module")
def server():
    with serve(_Handler) as srv:
        yield srv.url


def test_list_value_model_failures_fall_back_to_grpo(server):
    trajs = [_traj(0, 5, True), _traj(1, 6, False), _traj(2, 4, False), _traj(3, 5, False),
             _traj(4, 1, True)]
    goals = ["ok", "g-short", "g-bad", "g-range", "ok"]
    trajs = [Trajectory(g, t.steps, t.final_observation, t.reward, t.success, t.budget,
                        metadata=t.metadata) for g, t in zip(goals, trajs)]
    gen = HttpChatGenerator(server, "m", price_per_1k_in=0.5, price_per_1k_out=2.0)
    sig = values_signal(trajs, [0, 0, 1, 1, 1], ListValueModel(gen), num_steps=6)
    np.testing.assert_array_equal(sig.value_rows, [True, False, False, False, True])
    reasons = dict(sig.fallbacks)
    assert "expected 5 values, got 4" in reasons[1] and "not JSON" in reasons[2]
    assert "[0, 1]" in reasons[3]
    assert sig.metrics["value/queries"] == 4 and sig.metrics["value/failures"] == 3
    assert sig.metrics["value/tokens_in"] == 4000
    assert sig.metrics["value/usd"] == pytest.approx(4 * (0.5 + 0.04))
    np.testing.assert_allclose(sig.values[0, 1:5], [0.1, 0.3, 0.5, 0.7], atol=1e-6)
    # The estimator: failed rows get their GRPO outcome advantage, the rest LVRL.
    lengths = np.array([len(t) for t in trajs])
    mask = np.arange(6)[None] < lengths[:, None]
    rewards = np.array([t.reward for t in trajs], np.float32)
    returns = np.where(mask, rewards[:, None], 0.0).astype(np.float32)
    gids = np.array([0, 0, 1, 1, 1])
    got = np.asarray(lvrl_step_advantages(sig.values, sig.value_rows, rewards, returns, gids,
                                          mask, num_groups=2, normalize="none"))
    grpo = np.asarray(adv.grpo_outcome_advantages(returns, gids, mask, num_groups=2))
    np.testing.assert_allclose(got[1:4], grpo[1:4], atol=1e-6)
    np.testing.assert_allclose(got[0, :5], np.diff([0.5, 0.1, 0.3, 0.5, 0.7, 1.0]), atol=1e-6)
    # A dead endpoint: every trajectory fails, nothing raises.
    dead = values_signal(trajs, [0, 0, 1, 1, 1],
                         ListValueModel(HttpChatGenerator(server, "err500", max_retries=1,
                                                          backoff=0.01)), num_steps=6)
    assert dead.metrics["value/failures"] == 4 and "HTTP 500" in dead.fallbacks[0][1]


def test_parse_value_list_is_strict():
    np.testing.assert_allclose(parse_value_list("[0, 0.5, 1]", 3), [0, 0.5, 1])
    for text, msg in [("[0.1, true]", "not a number"), ('{"values": [0.1]}', "JSON list"),
                      ("[0.1, NaN]", "finite"), ("0.3", "JSON list"), ("[0.1]", "expected 2")]:
        with pytest.raises(ValueError, match=msg):
            parse_value_list(text, 2)


def test_llm_summariser_counts_cost_and_falls_back(server):
    trajs = [_traj(0, 3, True), _traj(1, 2, False)]
    stats: dict = {}
    good, cost = summarize_group(trajs, "llm", HttpChatGenerator(server, "good"), stats=stats)
    assert [s.source for s in good] == ["llm", "llm"] and good[0].steps[1].result == "did step 1"
    assert cost.tokens_in == 2000 and stats["summary_calls"] == 2
    bad, _ = summarize_group(trajs, "llm", HttpChatGenerator(server, "chatty"), stats=stats)
    assert [s.source for s in bad] == ["deterministic"] * 2 and stats["summary_failures"] == 2
    with pytest.raises(ValueError, match="generator"):
        summarize_group(trajs, "llm")


def test_value_curve_png(tmp_path):
    trajs = [_traj(0, 5, True), _traj(1, 4, False)]
    trajs = [Trajectory(t.goal, t.steps, t.final_observation, t.reward, t.success, t.budget,
                        metadata={"oracle_values": list(np.linspace(0.2, 0.9, len(t) + 1))})
             for t in trajs]
    sig = values_signal(trajs, [0, 0], OracleValueModel(), num_steps=5)
    out = plot_value_curves(trajs, sig.values, tmp_path / "curves.png", title="t")
    assert out.stat().st_size > 2000


# ---- the trainer's registered "values" signal and "lvrl" estimator --------------------------
def test_registry_values_signal_and_lvrl_estimator():
    import types

    from jaxdm.config import from_dict
    from jaxdm.rl.estimators import ESTIMATORS
    from jaxdm.rl.signals import SIGNALS
    from jaxdm.rl.train_config import TrainConfig

    with pytest.raises(ValueError, match=r"value\.kind"):
        from_dict(TrainConfig, {"algo": {"advantage": "lvrl"}})
    with pytest.raises(ValueError, match=r"value\.kind"):
        from_dict(TrainConfig, {"algo": {"advantage": "lvrl"}, "value": {"kind": "magic"}})
    with pytest.raises(ValueError, match=r"value\.temperature"):
        from_dict(TrainConfig, {"algo": {"advantage": "lvrl"},
                                "value": {"kind": "oracle", "temperature": 1}})
    with pytest.raises(ValueError, match=r"value\.backend"):
        from_dict(TrainConfig, {"algo": {"advantage": "lvrl"}, "value": {"kind": "readout"}})
    cfg = from_dict(TrainConfig, {"algo": {"advantage": "lvrl", "lvrl_normalize": "none"},
                                  "value": {"kind": "oracle", "noise": 0.0}, "max_actions": 5})
    assert ESTIMATORS["lvrl"].needs == ("values",)
    spec = SIGNALS.get("values")
    backend = spec.build(cfg, None)
    trajs = [Trajectory(t.goal, t.steps, t.final_observation, t.reward, t.success, t.budget,
                        metadata={"oracle_values": vals})
             for t, vals in ((_traj(0, 4, True), [0.3, 0.4, 0.6, 0.8, 1.0]),
                             (_traj(1, 3, False), [0.3, 0.2, 0.1, 0.0]),
                             (_traj(2, 2, False), [0.3, 0.2, 0.0]))]
    lengths = np.array([4, 3, 2])
    mask = np.arange(5)[None] < lengths[:, None]
    eb = types.SimpleNamespace(trajectories=trajs, groups=np.array([0, 0, 0], np.int32),
                               mask=mask, errored=np.array([False, False, True]))
    sig = spec.produce(eb, backend, cfg)
    np.testing.assert_array_equal(sig.mask, [True, True, False])  # errored row: no values
    assert sig.arrays["values"].shape == (3, 6) and sig.stats["value/failures"] == 0
    # V(s_0) = p_hat over the kept rows only (1 success, 1 failure): 1/2, not 1/3.
    np.testing.assert_allclose(sig.arrays["values"][0, :5], [0.5, 0.4, 0.6, 0.8, 1.0],
                               atol=1e-6)
    np.testing.assert_allclose(sig.arrays["values"][1, 0], 0.5, atol=1e-6)
    assert sig.stats["value/fallback_rows"] == 0 and sig.stats["value/queries"] == 2


# ---- inside the trainer: value failures fall back, value curves at every evaluation ---------
class _FlakyValueHandler(JSONHandler):
    """A JSON-list value endpoint whose requests 2, 5, 8, ... get a malformed reply."""
    lock = threading.Lock()
    count = 0

    def do_POST(self):
        body = self.request_json()
        user = body["messages"][-1]["content"]
        n = int(user.split("JSON list of exactly ")[1].split()[0])
        with self.lock:
            type(self).count += 1
            k = type(self).count
        text = "no idea" if k % 3 == 2 else json.dumps([round(0.2 + 0.6 * j / n, 3)
                                                         for j in range(n)])
        self.reply_chat(text, 100, 10)


def test_trainer_value_failures_fall_back_and_eval_writes_value_curves(tmp_path):
    """A tiny lvrl run against a real HTTP value model that fails on every third request:
    failures are counted, their rows fall back to GRPO (lvrl/fallback_rows), examples are
    logged in the JSONL, and each evaluation writes value_curves/iter_XXXX.png with its
    value-query metrics in the eval record."""
    from jaxdm.rl.trainer import Trainer
    from jaxdm.runlog import read_metrics
    from tests.rl.test_rl_trainer import ordering_cfg

    with serve(_FlakyValueHandler) as srv:
        cfg = ordering_cfg(tmp_path, "algo.advantage=lvrl", "teacher.kind=none", "iterations=1",
                           "eval_tasks=3", "eval_seeds=[0, 1]", "checkpoint_every=0",
                           "value={kind: list, eval_trajectories: 4, generator: "
                           f"{{base_url: '{srv.url}', model: m, concurrency: 1}}}}")
        tr = Trainer(cfg, log=False)
        recs = tr.run()
        tr.close()
    (train,) = [r for r in recs if "train/success" in r]
    # 8 rollouts, every one of >= 2 actions is one request: requests 2, 5, 8 fail
    assert train["value/queries"] >= 2 and train["value/failures"] >= 1
    assert train["lvrl/fallback_rows"] == train["value/failures"]
    logged = [e for r in read_metrics(tmp_path / "metrics.jsonl")
              for e in r.get("value/fallback_examples", [])]
    assert logged and "unparsable value list" in logged[0]
    (ev,) = [r for r in recs if "eval/All" in r]   # the final evaluation
    assert ev["eval/value/curves"] == "value_curves/iter_0001.png"
    assert ev["eval/value/trajectories"] == 4 and ev["eval/value/queries"] >= 1
    assert "eval/value/latency_per_traj_s" in ev and ev["eval/value/tokens_in"] > 0
    png = (tmp_path / ev["eval/value/curves"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    with pytest.raises(ValueError, match=r"value\.eval_trajectories"):
        from jaxdm.rl.values import check_value_spec
        check_value_spec({"kind": "oracle", "eval_trajectories": -1})
