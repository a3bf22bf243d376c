"""Monte-Carlo validation of predicted value changes (seed 001, section 4.4, appendix F).

For recorded episodes of a noisy policy, every state's MC value is the success fraction of
32 continuations of that policy (``jaxdm.rl.mc_validation``); transitions with
|ΔV_MC| >= 3σ = 0.375 are events (pitfalls / recoveries), and each value model is scored by
whether its predicted change has the same sign, by trajectory third.

- BabyAI (JAX env): the noisy shortest-path agent; continuations from the stored states,
  all (state, continuation) pairs vmapped in one jitted batch.
- ALFWorld (native engine): the noisy planner (random admissible command with probability
  eps, else the expert's next command); states rebuilt by re-executing the recorded
  commands (diverging replays dropped and counted), continuations on the host.

Events exclude each trajectory's final transition (into the terminal state, whose value is
the known outcome for the MC estimate and for the anchored Oracle alike; the seed's events
contain none); the summary also gives the counts with them.

Value models: the env Oracle (BabyAI: q ** plan length, the LVRL BabyAI form; ALFWorld:
1 − plan length / steps left), noisy Oracles (Gaussian noise, clipped to [0, 1]) and, on the
first ``--smollm2-episodes`` episodes of each env (default 8; 0 = off), SmolLM2-135M
(packaged, local) as the LVRL readout value model (``mc.readout_state_values``: P(Yes) of
the LVRL value question at every state, one packed pass per trajectory, no group context:
the recorded episodes are different tasks), scored on that subset next to the Oracle on
the same subset. BabyAI episodes are replayed as text by ``play_trajectory`` from their
recorded task keys (checked: same length and outcome).

    python experiments/mc_validation.py --quick          # < 60 s on 2 loaded cores
    python experiments/mc_validation.py                  # the full run (a few minutes)
"""
from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

from jaxdm.rl import mc_validation as mc
from jaxdm.jsonl import write_atomic, write_json

NOISES = (0.0, 0.1, 0.3)


def _noisy(values: np.ndarray, noise: float, seed: int) -> np.ndarray:
    if noise == 0:
        return values
    rng = np.random.default_rng(seed)
    return np.where(np.isnan(values), np.nan,
                    np.clip(values + rng.normal(0, noise, values.shape), 0, 1))


def run_babyai(args) -> dict:
    from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams
    from jaxdm.envs.babyai.value import plan_length_jax, value_from_length

    env = BabyAIEnv()
    params = BabyAIParams.for_split("train", max_steps=args.babyai_max_steps)
    t0 = time.perf_counter()
    ep = mc.babyai_record_episodes(env, params, jax.random.key(args.seed), args.episodes,
                                   args.babyai_eps)
    v_mc = mc.babyai_mc_values(env, params, ep, jax.random.key(args.seed + 1),
                               eps=args.babyai_eps, n=args.n)
    mc_s = time.perf_counter() - t0
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), ep.states)
    n_plan = jax.jit(jax.vmap(plan_length_jax))(flat)
    oracle = np.asarray(value_from_length(n_plan, flat.step_count, params.max_steps,
                                          q=args.babyai_q)).reshape(ep.actions.shape[0], -1)
    h = np.arange(oracle.shape[1])
    oracle = np.where(h[None] <= ep.lengths[:, None], oracle, np.nan)
    oracle[np.arange(len(ep.lengths)), ep.lengths] = ep.success  # anchored terminal value
    extra = {}
    if args.smollm2_episodes:
        from jaxdm.envs.babyai import make_text_env, play_trajectory

        text_env = make_text_env("train", room_size=env.room_size,
                                 max_steps=args.babyai_max_steps)
        trajs = []
        for i in range(min(args.smollm2_episodes, len(ep.lengths))):
            n_i = int(ep.lengths[i])
            tr = play_trajectory(text_env, ep.task_keys[i], ep.actions[i, :n_i], params)
            if len(tr.steps) != n_i or bool(tr.success) != bool(ep.success[i]):
                raise RuntimeError(f"babyai episode {i}: the text replay has {len(tr.steps)} "
                                   f"steps, success {tr.success}; recorded {n_i}, "
                                   f"{bool(ep.success[i])}")
            trajs.append(tr)
        extra = _smollm2_models("babyai", trajs, v_mc, oracle, ep.lengths, None, args)
    return _score("babyai", v_mc, oracle, ep.lengths, None, args, {
        "episodes": int(args.episodes), "success": float(ep.success.mean()),
        "mean_length": float(ep.lengths.mean()), "policy_eps": args.babyai_eps,
        "max_steps": args.babyai_max_steps, "oracle_q": args.babyai_q,
        "continuations": int(ep.lengths.sum()) * args.n, "mc_seconds": mc_s}, extra)


def run_alfworld(args) -> dict:
    from jaxdm.envs.alfworld import AlfWorldEnv, AlfWorldParams
    from jaxdm.envs.alfworld.value import oracle_values

    params = AlfWorldParams(split="valid_unseen", max_steps=args.alfworld_budget)
    env = AlfWorldEnv(params)
    rng = random.Random(args.seed)
    stats = mc.ReplayStats()
    rows, preds, lengths, keeps, trajs = [], [], [], [], []
    t0 = time.perf_counter()
    n_cont = 0
    for seed in range(args.episodes):
        cmds, obs, won = mc.alfworld_episode(env, seed, params, rng, args.alfworld_eps)
        v, kept = mc.alfworld_mc_values(env, seed, params, cmds, obs, rng,
                                        eps=args.alfworld_eps, n=args.n, stats=stats)
        n_cont += (kept + 1) * args.n
        v[len(cmds)] = float(won) if kept == len(cmds) else v[len(cmds)]
        _, st = env.reset(seed, params)
        rows.append(v)
        preds.append(oracle_values(st.game, cmds, args.alfworld_budget))
        lengths.append(len(cmds))
        keeps.append(np.arange(len(cmds)) < kept)
        if seed < args.smollm2_episodes:
            trajs.append(_alfworld_trajectory(env, seed, params, cmds, obs, won))
    mc_s = time.perf_counter() - t0
    h = max(lengths) + 1
    pad = lambda xs: np.stack([np.pad(np.asarray(x, float), (0, h - len(x)),  # noqa: E731
                                      constant_values=np.nan) for x in xs])
    keep = np.stack([np.pad(k, (0, h - 1 - len(k))) for k in keeps])
    extra = (_smollm2_models("alfworld", trajs, pad(rows), pad(preds), np.array(lengths), keep,
                             args) if trajs else {})
    return _score("alfworld", pad(rows), pad(preds), np.array(lengths), keep, args, {
        "episodes": int(args.episodes),
        "success": float(np.mean([r[l] for r, l in zip(rows, lengths)])),
        "mean_length": float(np.mean(lengths)), "policy_eps": args.alfworld_eps,
        "budget": args.alfworld_budget, "replays": stats.replayed,
        "replays_diverged": stats.diverged, "dropped_transitions": stats.dropped_transitions,
        "continuations": n_cont, "mc_seconds": mc_s}, extra)


def _alfworld_trajectory(env, seed, params, cmds, obs, won):
    from jaxdm.trajectory import Step, Trajectory

    _, st = env.reset(seed, params)
    return Trajectory(goal=env.reset_info(st, params)["goal"],
                      steps=tuple(Step(o, a) for o, a in zip(obs[:-1], cmds)),
                      final_observation=obs[-1], reward=float(won), success=bool(won),
                      budget=int(params.max_steps), env="alfworld")


_SMOLLM2 = []


def _smollm2_models(env_name, trajs, v_mc, oracle, lengths, keep, args) -> dict:
    """Events of SmolLM2's values and of the Oracle's on the first len(trajs) episodes."""
    if not _SMOLLM2:
        from jaxdm.decision import LocalReadout
        from jaxdm.models.smollm2 import smollm2

        _SMOLLM2.append(LocalReadout(smollm2()))
    dm = _SMOLLM2[0]
    m = len(trajs)
    pred = np.full(v_mc[:m].shape, np.nan)
    t0 = time.perf_counter()
    for i, tr in enumerate(trajs):
        v = mc.readout_state_values(dm, tr)
        pred[i, :len(v)] = v
        print(f"  smollm2 {env_name} episode {i}: {len(tr.steps)} steps "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    seconds = time.perf_counter() - t0
    k = None if keep is None else keep[:m]
    out = {}
    for name, p in ((f"oracle [first {m} ep.]", oracle[:m]), (f"smollm2 [first {m} ep.]", pred)):
        ev = mc.label_events(np.nan_to_num(v_mc[:m]), np.nan_to_num(p), lengths[:m], k,
                             n=args.n, exclude_final=True)
        out[name] = (mc.summarize_events(ev), ev)
    lens = np.asarray(lengths[:m])
    sel = np.arange(pred.shape[1])[None] < lens[:, None]
    corr = float(np.corrcoef(pred[sel], np.nan_to_num(v_mc[:m])[sel])[0, 1])
    out[f"smollm2 [first {m} ep.]"][0].update({"seconds": seconds, "episodes": m,
                                               "pearson_r_vs_mc": corr})
    np.savez_compressed(Path(args.out) / f"smollm2_values_{env_name}.npz", values=pred,
                        lengths=lens)
    return out


def _score(env_name, v_mc, oracle, lengths, keep, args, info, extra=None) -> dict:
    summaries, events = {}, {}
    for noise in NOISES:
        name = "oracle" if noise == 0 else f"oracle+noise{noise:g}"
        pred = _noisy(oracle, noise, args.seed + int(noise * 1000))
        ev = mc.label_events(np.nan_to_num(v_mc), np.nan_to_num(pred), lengths, keep, n=args.n,
                             exclude_final=True)
        summaries[name], events[name] = mc.summarize_events(ev), ev
        with_final = mc.summarize_events(mc.label_events(
            np.nan_to_num(v_mc), np.nan_to_num(pred), lengths, keep, n=args.n))
        summaries[name]["events_incl_final_transitions"] = with_final["events"]
        summaries[name]["agree_incl_final_transitions"] = with_final["agree_all"]
        np.savez_compressed(Path(args.out) / f"values_{env_name}.npz", v_mc=v_mc,
                            oracle=oracle, lengths=lengths,
                            keep=keep if keep is not None else np.ones(0, bool))
    for name, (summary, ev) in (extra or {}).items():
        summaries[name], events[name] = summary, ev
    fig = Path(args.out) / f"mc_{env_name}.png"
    mc.plot_events(summaries, events, fig)
    return {"env": env_name, **info, "models": summaries, "figure": fig.name}


def _fmt(x):
    return "–" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))


def report(results: list[dict]) -> str:
    lines = ["| env | value model | transitions | events (pit/rec) | expected spurious | "
             "agree pitfalls | agree recoveries | agree 1st / 2nd / 3rd third | "
             "median pred abs dV 1st / 2nd / 3rd |", "|" + "---|" * 9]
    for r in results:
        for name, s in r["models"].items():
            thirds = " / ".join(_fmt(s[f"{p}/agree"]) for p in ("first", "middle", "last"))
            med = " / ".join(_fmt(s[f"{p}/median_abs_pred"]) for p in ("first", "middle",
                                                                        "last"))
            lines.append(f"| {r['env']} | {name} | {s['transitions']} | {s['events']} "
                         f"({s['pitfalls']}/{s['recoveries']}) | "
                         f"{s['expected_spurious_events']:.2f} | {_fmt(s['agree_pitfalls'])} | "
                         f"{_fmt(s['agree_recoveries'])} | {thirds} | {med} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few episodes (< 60 s)")
    p.add_argument("--episodes", type=int, default=None)
    p.add_argument("--n", type=int, default=mc.N_CONTINUATIONS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--envs", default="babyai,alfworld")
    p.add_argument("--babyai-eps", type=float, default=0.5)
    p.add_argument("--babyai-max-steps", type=int, default=48)
    p.add_argument("--babyai-q", type=float, default=0.95)
    p.add_argument("--alfworld-eps", type=float, default=0.5)
    p.add_argument("--alfworld-budget", type=int, default=20)
    p.add_argument("--smollm2-episodes", type=int, default=None,
                   help="episodes valued by SmolLM2 per env (default 8, --quick 1; 0 = off)")
    p.add_argument("--out", default=None)
    p.add_argument("--overwrite", action="store_true", help="replace the results in --out")
    args = p.parse_args(argv)
    args.episodes = args.episodes or (6 if args.quick else 64)
    if args.smollm2_episodes is None:
        args.smollm2_episodes = 1 if args.quick else 8
    args.out = args.out or ("experiments/results/mc_validation" + ("_quick" if args.quick
                                                                   else ""))
    out = Path(args.out)
    from jaxdm.rundir import refuse_overwrite
    try:
        refuse_overwrite([out / "summary.json", out / "report.md"], overwrite=args.overwrite)
    except FileExistsError as e:
        print(f"mc_validation: error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    runners = {"babyai": run_babyai, "alfworld": run_alfworld}
    results = []
    for name in args.envs.split(","):
        if name not in runners:
            print(f"--envs: unknown env {name!r}; choose from {sorted(runners)}", file=sys.stderr)
            return 2
        results.append(runners[name](args))
        print(f"{name}: {results[-1]['continuations']} continuations in "
              f"{results[-1]['mc_seconds']:.1f} s", flush=True)
    table = report(results)
    print(table)
    write_json(out / "summary.json", results, indent=1)
    write_atomic(out / "report.md", f"# Monte-Carlo validation ({'quick' if args.quick else 'full'}"
                                   f", n = {args.n}, 3σ = {mc.event_threshold(args.n):.3f})\n\n"
                                   f"{table}\n")
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    write_atomic(out / "PRODUCED_BY.txt", f"python experiments/mc_validation.py "
                                         f"{' '.join(argv or sys.argv[1:])} at {rev}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
