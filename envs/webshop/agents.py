"""Scripted WebShop agents for tests, demos, benchmarks and judge data.

``expert_actions`` plans a purchase of the goal's own product with its goal options by
simulating the environment (search with the instruction, page to the target, open it,
choose the options, buy). ``random_action`` samples an admissible action, filling the search
template with words of the goal.
"""
from __future__ import annotations

import random
import re

from thefuzz import fuzz

from jaxdm.envs.recorder import play_episode, to_trajectory
from jaxdm.envs.webshop.env import SEARCH_PLACEHOLDER, WebShopEnv, WebShopParams, WebShopState
from jaxdm.envs.webshop.reward import normalize_color

_PRICE_TEXT = re.compile(r", and price lower than [\d.]+ dollars$")


def goal_query(instruction: str) -> str:
    """The instruction without its price clause, used as the expert's search query."""
    return _PRICE_TEXT.sub("", instruction)


def expert_actions(env: WebShopEnv, state: WebShopState, params: WebShopParams | None = None,
                   max_pages: int = 5) -> list[str]:
    """Actions that buy the goal's product with the best-matching value for each goal option.

    Raises ``ValueError`` if the target is not within the first ``max_pages`` result pages.
    """
    params = params or env.default_params
    goal = env.goal(state)
    target = goal["asin"].upper()
    query = goal_query(goal["instruction_text"])
    actions = [f"search[{query}]"]
    hits = [p["asin"].upper() for p in env.search(tuple(query.lower().split(" ")))]
    if target not in hits or hits.index(target) >= 10 * max_pages:
        raise ValueError(f"goal {state.goal_index}: target {target} not in the first "
                         f"{max_pages} result pages of {query!r}")
    actions += ["click[next >]"] * (hits.index(target) // 10)
    actions.append(f"click[{target.lower()}]")
    product = env.catalog.product(target)
    goal_options = goal["goal_options"]
    wanted = list(goal_options.values()) if isinstance(goal_options, dict) else list(goal_options)
    for g_opt in wanted:
        best, best_score = None, 85
        for values in product["options"].values():
            for value in values:
                score = fuzz.token_set_ratio(normalize_color(value), normalize_color(g_opt))
                if score > best_score:
                    best, best_score = value, score
        if best is not None:
            actions.append(f"click[{best}]")
    actions.append("click[buy now]")
    return actions


def random_action(env: WebShopEnv, state: WebShopState, rng: random.Random,
                  params: WebShopParams | None = None) -> str:
    """A uniformly random admissible action (a search uses 1-4 words of the goal)."""
    actions = env.admissible_actions(state, params)
    if not actions:
        return "click[buy now]"
    action = rng.choice(actions)
    if action == SEARCH_PLACEHOLDER:
        words = goal_query(env.goal(state)["instruction_text"]).split()
        action = f"search[{' '.join(rng.sample(words, k=min(len(words), rng.randint(1, 4))))}]"
    return action


def noisy_expert_policy(env: WebShopEnv, rng: random.Random, *, detour_prob: float = 0.2,
                        skip_options_prob: float = 0.2, wrong_item_prob: float = 0.1):
    """A policy factory: the expert plan with random detours (sub pages, extra paging,
    re-searching, repeated clicks), sometimes buying before choosing the options (the
    characteristic ordering error) or buying a distractor. Returns ``policy(state) -> str``
    for one episode; call again per episode."""
    plan: list[str] = []
    started = [False]

    def policy(state: WebShopState) -> str:
        if not started[0]:
            started[0] = True
            plan.extend(expert_actions(env, state))
            if rng.random() < skip_options_prob:
                plan[:] = [a for a in plan if a.startswith(("search[", "click[b0"))
                           or a in ("click[next >]", "click[buy now]")]
            if rng.random() < wrong_item_prob:
                keywords = tuple(plan[0][len("search["):-1].lower().split(" "))
                hits = [p["asin"].lower() for p in env.search(keywords)]
                target = env.goal(state)["asin"].lower()
                others = [a for a in hits[:10] if a != target]
                if others:
                    plan[:] = [plan[0], f"click[{rng.choice(others)}]", "click[buy now]"]
        if plan and state.page in ("item_page", "search_results") and rng.random() < detour_prob:
            detours = {"item_page": ["click[description]", "click[features]", "click[reviews]"],
                       "search_results": ["click[next >]"]}[state.page]
            detour = rng.choice(detours)
            # A detour must be undone, so the plan resumes on the same page.
            plan[:0] = ["click[< prev]"]
            return detour
        if plan:
            return plan.pop(0)
        return random_action(env, state, rng)

    return policy


def rollout(env: WebShopEnv, seed: int, policy, params: WebShopParams | None = None):
    """Play one episode in-process and record it as a ``Trajectory`` (the outcome reward is
    the purchase score)."""
    params = params or env.default_params
    ep = play_episode(env, seed, lambda state, obs: policy(state), params=params)
    return to_trajectory(ep, env=env.name, budget=params.budget, metadata={"task_seed": seed})


def main(argv=None) -> int:
    """Write noisy-expert WebShop trajectories to JSONL (generated or original data)."""
    import argparse

    from jaxdm.envs.webshop.env import make_webshop_env
    from jaxdm.trajectory import write_jsonl

    ap = argparse.ArgumentParser(prog="python -m jaxdm.envs.webshop.agents",
                                 description=main.__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("-n", "--num", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--products"), ap.add_argument("--attributes"), ap.add_argument("--human")
    ap.add_argument("--num-products", type=int, default=60, help="generated catalogue size")
    ap.add_argument("--detour-prob", type=float, default=0.2)
    ap.add_argument("--skip-options-prob", type=float, default=0.2)
    ap.add_argument("--wrong-item-prob", type=float, default=0.1)
    args = ap.parse_args(argv)
    if args.products:
        env = make_webshop_env(args.products, args.attributes, args.human)
    else:
        env = make_webshop_env(generate={"seed": args.seed, "num_products": args.num_products})
    rng = random.Random(args.seed)
    trajs = []
    for k in range(args.num):
        policy = noisy_expert_policy(env, rng, detour_prob=args.detour_prob,
                                     skip_options_prob=args.skip_options_prob,
                                     wrong_item_prob=args.wrong_item_prob)
        trajs.append(rollout(env, args.seed + k, policy))
    n = write_jsonl(args.out, trajs)
    wins = sum(t.success for t in trajs)
    print(f"wrote {n} trajectories to {args.out} ({wins} successful)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
