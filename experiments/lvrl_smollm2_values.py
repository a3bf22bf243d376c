"""SmolLM2-135M as a real (weak) LVRL value model on BabyAI text, against the env Oracle.

Seed 001 (§3.2) values every interior state of a rollout with an LLM conditioned on the
other rollouts of the same task. This script asks how far a 135M model gets on a subset:

1. **Rollouts**: ``--groups`` BabyAI text tasks (train split, six rooms of size
   ``--room-size``, budget ``--budget`` actions, a solver plan of at most ``--max-plan`` x
   the budget), ``--rollouts`` rollouts each from a noisy
   solver policy (rollout k follows the BFS solver's plan with probability q_k, spread over
   ``--q``, and otherwise takes a uniformly random action), so a group mixes successes and
   failures as LVRL's groups do.
2. **Values**: the trainer's own path (``jaxdm.rl.values.values_signal``: deterministic group
   summaries, the target left out of its context, at most ``--summary-steps`` steps per other
   rollout) with two value models: ``readout`` on SmolLM2-135M-Instruct (``LocalReadout``,
   one packed pass per trajectory: "will the task be completed from state t?" → P(Yes)) and
   the env ``oracle`` (V = clip(1 − n/L, 0, 1), n the solver's plan length, L the steps
   left).
3. **Agreement**: Pearson and Spearman r of the interior values (pooled, and per trajectory),
   and what LVRL trains on: the sign agreement of the anchored step advantages
   A_t = V(s_{t+1}) − V(s_t) (``lvrl_advantages``, no normalisation) between the two value
   models, over all actions and over the interior differences only (t = 1..T−2, where the
   anchors play no part; a constant value model scores 0 % there as its differences are 0).
4. **Cost**: tokens run per state, seconds per state and per trajectory, value failures.

Writes ``--out`` (default ``experiments/results/lvrl_smollm2_values``): ``summary.json``,
``trajectories.jsonl`` (per trajectory: outcome, both value curves), ``value_curves.png``
(SmolLM2 vs Oracle on a few trajectories) and ``PRODUCED_BY.txt``.

    python experiments/lvrl_smollm2_values.py            # 3 groups x 4 rollouts, budget 16
    python experiments/lvrl_smollm2_values.py --quick    # 1 group x 3 rollouts, budget 10
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))
from jaxdm.jsonl import write_atomic  # noqa: E402


def noisy_solver_rollout(env, params, seed: int, q: float, rng) -> list[int]:
    """Action ids of one episode: the solver's next action with probability q, else random
    (MiniGrid ids 0-5; "done" is left out)."""
    from jaxdm.envs.babyai import solve
    from jaxdm.envs.babyai.text import ACTION_WORDS

    _, state = env.reset(seed, params)
    acts: list[int] = []
    for _ in range(int(params.max_steps)):
        plan = solve(state.core) if rng.random() < q else None
        a = int(plan[0]) if plan else int(rng.integers(0, 6))
        acts.append(a)
        _, state, _, done, _ = env.step(seed, state, ACTION_WORDS[a], params)
        if done:
            break
    return acts


def record_groups(groups: int, rollouts: int, budget: int, room_size: int, qs, seed: int,
                  max_plan: float = 0.6, split: str = "train"):
    """``groups`` tasks of ``split`` whose shortest plan fits in ``max_plan`` x budget (so the
    Oracle's values are not all 0 and a noisy rollout can succeed), ``rollouts`` rollouts
    each."""
    from jaxdm.envs.babyai import BabyAIParams, make_text_env, play_trajectory, solve

    env = make_text_env(split, room_size=room_size, max_steps=budget)
    params = BabyAIParams.for_split(split, max_steps=budget)
    rng = np.random.default_rng(seed)
    trajs, gids = [], []
    task = 1000 * seed
    while len(set(gids)) < groups:
        task += 1
        _, st = env.reset(task, params)
        plan = solve(st.core)
        if plan is None or len(plan) > max_plan * budget:
            continue
        group = []
        for k in range(rollouts):
            acts = noisy_solver_rollout(env, params, task, qs[k % len(qs)], rng)
            group.append(play_trajectory(env, task, acts, params, id=f"task{task}-r{k}",
                                         room_size=room_size, q=qs[k % len(qs)]))
        if all(len(t.steps) < 2 for t in group):
            continue  # nothing to value
        trajs += group
        gids += [len(set(gids))] * rollouts
    return trajs, np.asarray(gids, np.int32)


def rankdata(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), as Spearman's r needs."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), float)
    xs = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def corr(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def plot(trajs, v_llm, v_orc, rows, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(rows))
    nrow = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrow, cols, figsize=(3.3 * cols, 2.5 * nrow), squeeze=False)
    for ax, i in zip(axes.ravel(), rows):
        n = len(trajs[i].steps)
        ax.plot(range(n + 1), v_orc[i, :n + 1], "-", color="C1", label="Oracle")
        ax.plot(range(n + 1), v_llm[i, :n + 1], "-", color="C0", label="SmolLM2 P(Yes)")
        miles = [t + 1 for t, s in enumerate(trajs[i].steps) if s.annotations.get("milestone")]
        if miles:
            ax.plot(miles, v_orc[i, miles], "*", color="C2", ms=8, label="milestone")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{trajs[i].metadata['id']}: {'success' if trajs[i].success else 'failure'}"
                     f" ({n})", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(rows):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--room-size", type=int, default=7)
    ap.add_argument("--max-plan", type=float, default=0.6,
                    help="tasks whose solver plan is at most this share of the budget")
    ap.add_argument("--q", default="0.9,0.7,0.5,0.3", help="solver-following probabilities")
    ap.add_argument("--summary-steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "experiments/results/lvrl_smollm2_values"))
    ap.add_argument("--overwrite", action="store_true", help="replace the results in --out")
    args = ap.parse_args()
    if args.quick:
        args.groups, args.rollouts, args.budget = 1, 3, 10
    qs = [float(x) for x in args.q.split(",")]
    out = Path(args.out)
    from jaxdm.rundir import refuse_overwrite
    try:
        refuse_overwrite([out / "summary.json", out / "trajectories.jsonl"],
                         overwrite=args.overwrite)
    except FileExistsError as e:
        raise SystemExit(f"lvrl_smollm2_values: error: {e}") from None
    out.mkdir(parents=True, exist_ok=True)

    from jaxdm.decision import LocalReadout
    from jaxdm.models.smollm2 import smollm2
    from jaxdm.rl.advantages import lvrl_advantages
    from jaxdm.rl.values import OracleValueModel, ReadoutValueModel, values_signal

    t0 = time.perf_counter()
    trajs, gids = record_groups(args.groups, args.rollouts, args.budget, args.room_size, qs,
                                args.seed, args.max_plan)
    record_s = time.perf_counter() - t0
    lengths = np.array([len(t.steps) for t in trajs])
    rewards = np.array([t.reward for t in trajs], np.float32)
    print(f"recorded {len(trajs)} rollouts in {record_s:.1f} s: lengths {lengths.tolist()}, "
          f"successes {int(sum(t.success for t in trajs))}", flush=True)
    opts = dict(num_steps=args.budget, max_steps_per_rollout=args.summary_steps)

    sig_orc = values_signal(trajs, gids, OracleValueModel(), **opts)
    dm = LocalReadout(smollm2())
    t0 = time.perf_counter()
    sig_llm = values_signal(trajs, gids, ReadoutValueModel(dm), **opts)
    llm_s = time.perf_counter() - t0
    print(f"SmolLM2 values in {llm_s:.1f} s: {sig_llm.metrics['value/failures']} failures",
          flush=True)

    ok = sig_llm.value_rows & sig_orc.value_rows
    inner = [(i, np.arange(1, n)) for i, n in enumerate(lengths) if ok[i] and n > 1]
    a = np.concatenate([sig_llm.values[i, t] for i, t in inner])
    b = np.concatenate([sig_orc.values[i, t] for i, t in inner])
    per_traj = [corr(sig_llm.values[i, t], sig_orc.values[i, t]) for i, t in inner]
    per_traj = [r for r in per_traj if r is not None]
    mask = np.arange(args.budget)[None] < lengths[:, None]
    groups = int(gids.max()) + 1
    adv = {k: np.asarray(lvrl_advantages(s.values, rewards, gids, mask, num_groups=groups,
                                         value_rows=ok))
           for k, s in (("llm", sig_llm), ("oracle", sig_orc))}
    sel = mask & ok[:, None]
    interior = sel & (np.arange(args.budget)[None] >= 1) & \
        (np.arange(args.budget)[None] < (lengths - 1)[:, None])

    def agree(m):
        return float(np.mean(np.sign(adv["llm"][m]) == np.sign(adv["oracle"][m])))

    n_states = int(sum(len(t) for _, t in inner))
    summary = {
        "setup": {"groups": args.groups, "rollouts_per_group": args.rollouts,
                  "budget": args.budget, "room_size": args.room_size, "q": qs,
                  "summary_steps": args.summary_steps, "seed": args.seed,
                  "value_model": "readout(LocalReadout SmolLM2-135M-Instruct fp32)"},
        "rollouts": len(trajs), "successes": int(sum(t.success for t in trajs)),
        "mean_length": float(lengths.mean()), "interior_states": n_states,
        "failures": int(sig_llm.metrics["value/failures"]),
        "llm_value_mean": float(a.mean()), "llm_value_std": float(a.std()),
        "llm_value_min": float(a.min()), "llm_value_max": float(a.max()),
        "oracle_value_mean": float(b.mean()), "oracle_value_std": float(b.std()),
        "pearson_r": corr(a, b), "spearman_r": corr(rankdata(a), rankdata(b)),
        "per_trajectory_pearson_mean": float(np.mean(per_traj)) if per_traj else None,
        "per_trajectory_pearson_n": len(per_traj),
        "adv_sign_agreement_all_actions": agree(sel),
        "adv_sign_agreement_interior": agree(interior) if interior.any() else None,
        "interior_diffs": int(interior.sum()),
        "oracle_interior_diff_zero_frac": float(np.mean(adv["oracle"][interior] == 0))
        if interior.any() else None,
        "unique_tokens": int(dm.stats.get("unique_tokens", 0)),
        "request_tokens": int(dm.stats.get("request_tokens", 0)),
        "packed_calls": int(dm.stats.get("calls", 0)),
        "tokens_per_state": dm.stats.get("unique_tokens", 0) / max(n_states, 1),
        "seconds_total": llm_s, "seconds_per_state": llm_s / max(n_states, 1),
        "seconds_per_trajectory": sig_llm.metrics["value/latency_per_traj_s"],
    }
    write_atomic(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    with open(out / "trajectories.jsonl", "w") as f:
        for i, t in enumerate(trajs):
            n = len(t.steps)
            f.write(json.dumps({"id": t.metadata["id"], "group": int(gids[i]),
                                "q": t.metadata["q"], "success": t.success,
                                "reward": float(t.reward), "actions": n,
                                "value_ok": bool(ok[i]),
                                "smollm2": [round(float(x), 4) for x in
                                            sig_llm.values[i, :n + 1]],
                                "oracle": [round(float(x), 4) for x in
                                           sig_orc.values[i, :n + 1]]}) + "\n")
    rows = [i for i, _ in inner][:8]
    if rows:
        r = summary["pearson_r"]
        plot(trajs, sig_llm.values, sig_orc.values, rows, out / "value_curves.png",
             "BabyAI text: SmolLM2-135M P(Yes) vs Oracle (anchored ends), Pearson r = "
             + ("n/a" if r is None else f"{r:.2f}"))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    write_atomic(out / "PRODUCED_BY.txt", f"python experiments/lvrl_smollm2_values.py {' '.join(sys.argv[1:])}\n"
        f"commit {commit}\nhost {platform.node()} ({platform.processor() or 'cpu'}), "
        f"2 CPU cores shared with other jobs (loaded)\n"
        f"finished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n")
    for k, v in summary.items():
        if k != "setup":
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
