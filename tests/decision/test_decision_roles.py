"""Prompt golden tests, masking, expansion and Actor variants, and the token-prefix property."""
from __future__ import annotations

import json

import pytest
from dm_fixtures import small_trajectory

from jaxdm import roles
from jaxdm.decision.types import MultipleChoice, YesNo
from jaxdm.trajectory import Step, Trajectory

HEADER = ("Trajectory (a JSON object per line; each entry is its zero-based index, an observation "
          "and the action the agent took after seeing it; an entry with \"action\": null is an "
          "observation with no action after it):")
INSTR = ("Judge one executed action (the target action) of the agent trajectory below. The "
         "question gives the target's entry index and quotes its action.")
E0 = ('{"index": 0, "observation": "You are in the middle of a room. You see a cabinet 1, a '
      'countertop 1 and a microwave 1.", "action": "go to countertop 1"}')
E1 = ('{"index": 1, "observation": "You arrive at countertop 1. On the countertop 1, you see a '
      'mug 1.", "action": "take mug 1 from countertop 1"}')
E2 = '{"index": 2, "observation": "You pick up the mug 1 from the countertop 1.", "action": "look"}'
E3 = ('{"index": 3, "observation": "You are facing the countertop 1.", '
      '"action": "go to microwave 1"}')
EF = ('{"index": 4, "observation": "You arrive at microwave 1. The microwave 1 is closed.", '
      '"action": null}')
GOAL = f"{INSTR}\nGoal: put a hot mug in cabinet"
# The Actor's history entries carry no index (unchanged since v2: they are not referred to).
ACTOR_E0 = ('{"observation": "You are in the middle of a room. You see a cabinet 1, a countertop 1 '
            'and a microwave 1.", "action": "go to countertop 1"}')


def test_golden_prefix_progress():
    q = roles.judge_request(small_trajectory(), 1, question="progress", context="prefix")
    assert q.context == "\n".join([GOAL, HEADER, E0, E1])
    assert q.question == ("[progress] Did the target action help achieve the goal?"
                          "\nTarget action index: 1 (\"take mug 1 from countertop 1\").")


def test_golden_hindsight_progress():
    q = roles.judge_request(small_trajectory(), 1, question="progress", context="hindsight")
    assert q.context == "\n".join([GOAL, HEADER, E0, E1, E2, E3, EF])
    assert q.question == ("[progress] Did the target action help achieve the goal?"
                          "\nTarget action index: 1 (\"take mug 1 from countertop 1\").")


VALUE_Q = ("[value] Will the task be completed successfully within the remaining action "
           "budget?\nTarget action index: 2 (\"look\"). Remaining "
           "action budget, counting the target action: 28.")


def test_golden_prefix_value():
    q = roles.judge_request(small_trajectory(), 2, question="value", context="prefix")
    assert q.context == "\n".join([GOAL, HEADER, E0, E1, E2])
    # budget 30, target index 2: actions 2..29 remain, counting the target -> 28
    assert q.question == VALUE_Q


def test_golden_hindsight_value():
    q = roles.judge_request(small_trajectory(), 2, question="value", context="hindsight")
    assert q.context == "\n".join([GOAL, HEADER, E0, E1, E2, E3, EF])
    assert q.question == VALUE_Q


def test_golden_constrained_user_message():
    q = roles.judge_request(small_trajectory(), 0, question="progress", context="prefix")
    msgs = roles.render_messages(q, "constrained")
    assert msgs[0] == {"role": "system", "content": roles.SYSTEM_PROMPTS[("yesno", "constrained")]}
    assert msgs[1]["content"] == (f"Context:\n{GOAL}\n{HEADER}\n{E0}\n\nQuestion:\n[progress] "
                                  "Did the target action help achieve the goal?\n"
                                  "Target action index: 0 (\"go to countertop 1\").\n\nAnswer:")
    assert not roles.render_messages(q, "prompted")[1]["content"].endswith("Answer:")


def test_question_identical_across_contexts_and_entries_are_json():
    tr = small_trajectory()
    for question in roles.QUESTIONS:
        for t in range(len(tr)):
            texts = {roles.judge_request(tr, t, question=question, context=c).question
                     for c in roles.CONTEXTS}
            texts |= {roles.judge_request(tr, t, question=question, context="prefix",
                                          expansion=e).question for e in roles.EXPANSIONS}
            assert len(texts) == 1
    hind = roles.judge_request(tr, 0, context="hindsight").context.split("\n")[3:]
    entries = [json.loads(line) for line in hind]
    assert [e["action"] for e in entries] == [s.action for s in tr.steps] + [None]
    assert [e["index"] for e in entries] == list(range(len(tr) + 1))


def test_prefix_context_is_character_prefix_of_hindsight():
    tr = small_trajectory()
    hind = roles.judge_request(tr, 0, context="hindsight").context
    for t in range(len(tr)):
        pre = roles.judge_request(tr, t, context="prefix").context
        assert hind.startswith(pre)
        assert hind[len(pre)] == "\n"


def test_judge_requests_one_per_action_with_meta():
    tr = small_trajectory(success=False)
    qs = roles.judge_requests(tr, question="value", context="prefix")
    assert [q.meta["target"] for q in qs] == [0, 1, 2, 3]
    assert [q.meta["action_type"] for q in qs] == ["other", "milestone", "no_op", "other"]
    assert all(q.meta["success"] is False and q.meta["traj_id"] == "small-0" for q in qs)
    assert set(qs[0].meta) == set(roles.JUDGE_META_KEYS)
    assert all(isinstance(q, YesNo) for q in qs)


def test_masking_no_outcome_and_webshop_terminal():
    tr = Trajectory(goal="buy a red shirt under 20 dollars",
                    steps=(Step("WebShop [SEP] Search", "search[red shirt]"),
                           Step("[SEP] Results [SEP] B01 [SEP] Red shirt [SEP] $12", "click[b01]"),
                           Step("[SEP] Buy Now [SEP] size", "click[buy now]")),
                    final_observation="Thank you for shopping with us! [SEP] Your score "
                                      "(min 0.0, max 1.0) [SEP] 0.75 [SEP] reward",
                    reward=0.75, success=False, budget=15, env="webshop",
                    final_observation_terminal=True)
    for q in roles.judge_requests(tr, "value", "hindsight") + \
            roles.judge_requests(tr, "progress", "prefix", expansion="fb"):
        text = q.context + q.question
        assert "0.75" not in text and "score" not in text.lower() and "reward" not in text
        assert "Thank you" not in text
    last = roles.judge_requests(tr, "progress", "hindsight")[0].context.split("\n")[-1]
    assert json.loads(last) == {"index": 3, "observation": "Shopping process has ended.",
                                "action": None}
    fb = roles.judge_request(tr, 2, context="prefix", expansion="fb").context.split("\n")[-1]
    assert json.loads(fb)["observation"] == roles.WEBSHOP_TERMINAL_OBSERVATION


def test_context_expansion_variants():
    tr = small_trajectory()  # 4 actions; target 0 leaves 3 more actions
    n_entries = {}
    for e in roles.EXPANSIONS:
        q = roles.judge_request(tr, 0, context="prefix", expansion=e)
        lines = q.context.split("\n")[3:]
        n_entries[e] = len(lines)
        assert json.loads(lines[-1])["action"] is None
        assert q.meta["context"] == ("fb" if e == "fb" else f"expand_{float(e)}")
    # fb: target + next obs; 25%: ceil(0.75)=1 more; 50%: ceil(1.5)=2; 75%: ceil(2.25)=3; 100%: 3
    assert n_entries == {"fb": 2, 0.25: 3, 0.5: 4, 0.75: 5, 1.0: 5}
    fb = roles.judge_request(tr, 0, context="prefix", expansion="fb").context.split("\n")[-1]
    assert json.loads(fb)["observation"] == tr.steps[1].observation
    assert roles.judge_request(tr, 1, context="prefix", expansion=1.0).context == \
        roles.judge_request(tr, 1, context="hindsight").context
    with pytest.raises(ValueError, match="expansion"):
        roles.judge_request(tr, 0, context="prefix", expansion=0.3)
    with pytest.raises(ValueError, match="context='prefix'"):
        roles.judge_request(tr, 0, context="hindsight", expansion="fb")


def test_bad_judge_input():
    tr = small_trajectory()
    with pytest.raises(ValueError, match="out of range"):
        roles.judge_request(tr, 4)
    with pytest.raises(ValueError, match="question"):
        roles.judge_requests(tr, question="helpful")
    with pytest.raises(ValueError, match="context"):
        roles.judge_requests(tr, context="future")
    with pytest.raises(TypeError, match="Trajectory"):
        roles.judge_requests({"goal": "x"})
    with pytest.raises(ValueError, match="no executed actions"):
        roles.judge_requests(Trajectory(goal="g", steps=(), final_observation="o"))


def test_actor_request_and_variants():
    tr = small_trajectory()
    opts = ["take mug 1 from countertop 1", "go to microwave 1", "look"]
    base = roles.actor_request_at(tr, 1, opts, oracle_answer=opts[0])
    assert isinstance(base, MultipleChoice) and base.options == tuple(opts)
    assert base.context == "\n".join([
        "Goal: put a hot mug in cabinet", "History (a JSON object per line, oldest first; each entry is an observation and "
        "the action the agent took after seeing it):", ACTOR_E0,
        "Current observation: You arrive at countertop 1. On the countertop 1, you see a mug 1.",
        "Remaining action budget: 29"])
    assert base.question == ("[next_action] Which of the available actions should the agent "
                             "take next to achieve the goal?")
    assert base.meta["question"] == "next_action" and base.meta["oracle_answer"] == opts[0]
    masked = roles.actor_request_at(tr, 1, opts, variant="goal_masked")
    assert masked.context.startswith("Goal: heat a mug\n")
    assert masked.context.split("\n")[1:] == base.context.split("\n")[1:]
    hint = roles.actor_request_at(tr, 1, opts, variant="hint")
    assert hint.question == base.question + " " + roles.DEPENDENCY_HINT
    ex = roles.actor_request_at(tr, 1, opts, variant="hint_example")
    assert ex.question == hint.question + " " + roles.ORDERING_EXAMPLE
    assert hint.context == ex.context == base.context
    msg = roles.render_messages(base, "constrained")[1]["content"]
    assert msg.endswith("Available options:\nA. take mug 1 from countertop 1\n"
                        "B. go to microwave 1\nC. look\n\nAnswer:")
    first = roles.actor_request_at(tr, 0, opts)
    assert "(no actions taken yet)" in first.context
    with pytest.raises(ValueError, match="oracle_answer"):
        roles.actor_request_at(tr, 1, opts, oracle_answer="fly")


@pytest.mark.parametrize("goal,masked", [
    ("put a hot mug in cabinet", "heat a mug"),
    ("put a heated mug on the side table", "heat a mug"),
    ("put a clean cloth in drawer", "clean a cloth"),
    ("put a cool apple in fridge", "cool a apple"),
    ("heat some egg and put it in garbagecan", "heat some egg"),
    ("Your task is to: cool some potato and put it in diningtable.",
     "Your task is to: cool some potato"),
])
def test_goal_masking(goal, masked):
    assert roles.mask_placement_subgoal(goal) == masked


def test_goal_masking_rejects_goals_without_dependency():
    with pytest.raises(ValueError, match="no clean/heat/cool"):
        roles.mask_placement_subgoal("put two pencils in drawer")


def test_too_many_options_for_labels():
    q = MultipleChoice("c", "q", tuple(f"o{i}" for i in range(27)))
    with pytest.raises(ValueError, match="27 options"):
        roles.render_messages(q, "constrained")
    assert "o26" in roles.render_messages(q, "likelihood")[1]["content"]


def test_prefix_is_token_prefix_of_hindsight_stream():
    """After tokenisation (SmolLM2), Prefix(t)'s prompt shares all of its context tokens with
    the Hindsight prompt of the same trajectory except at most one boundary token."""
    from dm_fixtures import tiny_pretrained

    from jaxdm.decision.local import encode_messages
    tok = tiny_pretrained().tokenizer
    tr = small_trajectory()
    hind = encode_messages(tok, roles.render_messages(
        roles.judge_request(tr, 0, context="hindsight")))
    for t in range(len(tr)):
        q = roles.judge_request(tr, t, context="prefix")
        full = encode_messages(tok, roles.render_messages(q))
        ctx_text = tok.apply_chat_template(roles.render_messages(q), tokenize=False,
                                           add_generation_prompt=True)
        cut = ctx_text.index(q.context) + len(q.context)
        ctx_tokens = tok(ctx_text[:cut], add_special_tokens=False)["input_ids"]
        shared = next((i for i, (a, b) in enumerate(zip(full, hind)) if a != b),
                      min(len(full), len(hind)))
        assert full[:len(ctx_tokens)] == ctx_tokens
        assert shared >= len(ctx_tokens) - 1
        assert hind[:shared] == full[:shared]


# ---- import graph: roles, the decision backends and the envs form no cycle ----------------

def _module_graph():
    """Module-level (import-time) jaxdm imports of every module under jaxdm/ and envs/.

    Importing ``a.b.c`` first runs the packages ``a`` and ``a.b``, so an import adds edges to
    the target's parent packages too, except to the importer's own ancestors (those are
    already being initialised when it runs).
    """
    import ast
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    files = {}
    for pkg, folder in (("jaxdm", root / "jaxdm"), ("jaxdm.envs", root / "envs")):
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join([pkg, *parts])] = path
    graph = {}
    for name, path in files.items():
        ancestors = {name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)}
        deps = set()
        for node in ast.parse(path.read_text()).body:  # top level only: lazy imports excluded
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                while t:
                    if t != name and t not in ancestors:
                        deps.add(t)
                    t = t.rpartition(".")[0]
        graph[name] = deps
    return graph


def _cycle_through(graph, start):
    """A cycle through ``start`` as a list of modules, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for dep in graph.get(node, ()):
            if dep == start:
                return path + [start]
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, path + [dep]))
    return None


def test_roles_and_decision_have_no_import_cycle():
    graph = _module_graph()
    mods = [m for m in graph if m.startswith(("jaxdm.roles", "jaxdm.decision"))]
    assert "jaxdm.roles.actor" in mods and "jaxdm.decision.render" in mods
    for m in mods:
        cycle = _cycle_through(graph, m)
        assert cycle is None, f"import cycle: {' -> '.join(cycle)}"
    # the backends reach the prompt texts only through decision.render, never through roles
    for backend in ("jaxdm.decision.local", "jaxdm.decision.prompted", "jaxdm.decision.remote"):
        assert "jaxdm.decision.render" in graph[backend]
        assert not any(d.startswith("jaxdm.roles") for d in graph[backend])


def test_each_module_imports_fresh_in_a_subprocess():
    import subprocess
    import sys
    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]:\n"
            "    for k in [k for k in sys.modules if k.startswith('jaxdm')]: del sys.modules[k]\n"
            "    importlib.import_module(m)\n")
    mods = ["jaxdm.decision.remote", "jaxdm.decision.render", "jaxdm.roles.judge",
            "jaxdm.roles.actor", "jaxdm.roles.value", "jaxdm.roles", "jaxdm.decision.oracle"]
    out = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
