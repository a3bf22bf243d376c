"""BabyAI text observations, the string-action text env, and solver reference trajectories."""
import numpy as np
import pytest

from jaxdm.envs.babyai import BabyAIParams
from jaxdm.envs.babyai import layout as L
from jaxdm.envs.babyai.solver import reference_trajectory
from jaxdm.envs.babyai.text import (
    ACTION_WORDS, BabyAITextEnv, describe_view, mission_text, parse_action, relative_position,
    render_text,
)
from jaxdm.envs.core import INFO_KEYS
from jaxdm.trajectory import read_jsonl, write_jsonl

ENV = BabyAITextEnv()


def _image(cells):
    """A 7 x 7 view: empty everywhere, plus {(i, j): (type, colour, state)}."""
    img = np.zeros((7, 7, 3), np.uint8)
    img[:, :, 0] = L.EMPTY
    for (i, j), enc in cells.items():
        img[i, j] = enc
    return img


def test_positions_and_phrases():
    assert relative_position(2, -1) == "2 steps forward and 1 step left"
    assert relative_position(1, 0) == "1 step forward"
    assert relative_position(0, 3) == "3 steps right"
    assert mission_text((L.BALL, L.COLOR_TO_IDX["red"])) == "pick up the red ball"
    assert mission_text((L.KEY, L.COLOR_TO_IDX["grey"])) == "pick up the grey key"


def test_render_text_from_a_hand_made_view():
    red, blue, yellow = (L.COLOR_TO_IDX[c] for c in ("red", "blue", "yellow"))
    # Agent at column 3, row 6. Row 6 - 2 = 4 is "2 steps forward"; column 2 is "1 step left".
    img = _image({
        (2, 4): (L.BALL, red, 0),
        (5, 5): (L.DOOR, blue, L.DOOR_CLOSED),
        (3, 1): (L.WALL, L.WALL_COLOR, 0),
        (0, 6): (L.WALL, L.WALL_COLOR, 0),
        (4, 3): (L.DOOR, yellow, L.DOOR_OPEN),
        (6, 0): (0, 0, 0),  # unseen
    })
    assert describe_view(img) == [
        "a wall 5 steps forward",
        "a wall 3 steps left",
        "a closed blue door 1 step forward and 2 steps right",
        "a red ball 2 steps forward and 1 step left",
        "an open yellow door 3 steps forward and 1 step right",
    ]
    img[3, 6] = (L.KEY, red, 0)  # what the agent carries shows on its own cell
    text = render_text(img, (L.KEY, red), "pick up the red ball")
    assert text == (
        "Mission: pick up the red ball\n"
        "You see a wall 5 steps forward, a wall 3 steps left, a closed blue door 1 step "
        "forward and 2 steps right, a red ball 2 steps forward and 1 step left, an open "
        "yellow door 3 steps forward and 1 step right.\n"
        "You are carrying a red key.\n"
        "Admissible actions: turn left, turn right, go forward, pick up, drop, toggle, done")
    # An object straight ahead hides the wall behind it from the "forward" line.
    blocked = _image({(3, 5): (L.BOX, red, 0), (3, 2): (L.WALL, L.WALL_COLOR, 0)})
    assert describe_view(blocked) == ["a red box 1 step forward"]
    with pytest.raises(ValueError, match="shape"):
        describe_view(np.zeros((5, 5, 3), np.uint8))


def test_parse_action():
    assert [parse_action(w) for w in ACTION_WORDS] == list(range(7))
    assert parse_action("  Go   Forward ") == 2
    assert parse_action("go north") is None
    with pytest.raises(TypeError, match="string"):
        parse_action(2)


def test_text_env_steps_and_info():
    obs, state = ENV.reset(5)
    assert obs.startswith("Mission: pick up the ")
    assert obs == ENV.reset(5)[0]  # deterministic from the seed
    _, other = ENV.reset(6)
    assert other.core.grid.tobytes() != state.core.grid.tobytes()
    obs1, s1, reward, done, info = ENV.step(5, state, "turn left")
    assert set(INFO_KEYS) <= set(info) and {"goal", "task_type"} <= set(info)
    assert info["valid"] and not info["no_op"] and not info["won"] and reward == 0.0
    assert info["admissible_actions"] == list(ACTION_WORDS)
    # at reset too: an option-scoring policy needs them for its first action
    assert ENV.reset_info(state)["admissible_actions"] == list(ACTION_WORDS)
    assert info["goal"] == obs.splitlines()[0][len("Mission: "):]
    assert info["task_type"] == "pickup" and info["split"] == "train"
    assert int(s1.core.agent_dir) == (int(state.core.agent_dir) + 3) % 4
    # An unknown command is invalid: nothing changes but the clock.
    obs2, s2, reward, done, info = ENV.step(5, s1, "fly away")
    assert not info["valid"] and info["no_op"] and reward == 0.0 and not done
    assert obs2.startswith("Nothing happens: 'fly away' is not an admissible action.")
    assert int(s2.core.step_count) == 2
    np.testing.assert_array_equal(np.asarray(s2.core.grid), np.asarray(s1.core.grid))
    with pytest.raises(TypeError, match="string"):
        ENV.step(5, s2, 3)


def test_budget_ends_episode_and_finished_episode_refuses_steps():
    env = BabyAITextEnv(params=BabyAIParams(max_steps=4))
    _, state = env.reset(1)
    for t in range(4):
        _, state, reward, done, info = env.step(1, state, "turn right")
    assert done and info["truncated"] and not info["terminated"] and not info["won"]
    with pytest.raises(ValueError, match="episode is over"):
        env.step(1, state, "turn right")


def test_replay_gives_the_same_state():
    words = ["turn left", "go forward", "go forward", "toggle", "turn right", "go forward"]
    _, state = ENV.reset(11)
    for w in words:
        obs, state, *_ = ENV.step(11, state, w)
    obs_r, state_r = ENV.replay(11, words)
    assert obs_r == obs
    np.testing.assert_array_equal(np.asarray(state_r.core.grid), np.asarray(state.core.grid))
    assert np.asarray(state_r.core.agent_pos).tolist() == np.asarray(state.core.agent_pos).tolist()


@pytest.mark.parametrize("split", ["train", "ood_test"])
def test_reference_trajectories(split, tmp_path):
    params = BabyAIParams.for_split(split)
    trajs = [reference_trajectory(ENV, seed, params) for seed in range(6)]
    for tr in trajs:
        assert tr.success and tr.reward == 1.0 and 0 < len(tr) <= 128
        assert tr.env == "babyai" and tr.task_type == "pickup" and tr.budget == 128
        assert tr.metadata["split"] == split
        lo, hi = L.SPLIT_DOOR_DISTANCES[split]
        assert lo <= tr.metadata["door_distance"] <= hi
        subgoals = [s.annotations["subgoal"] for s in tr.steps]
        # The optimal route crosses exactly door_distance doors, each into a nearer room.
        assert subgoals.count("enter a room on the route") == tr.metadata["door_distance"]
        assert subgoals.count("see the target") <= 1
        assert subgoals[-1] == "pick up the target" and tr.steps[-1].action == "pick up"
        assert tr.action_types[-1] == "milestone"
        assert all(s.valid for s in tr.steps)
        assert "You are carrying" in tr.final_observation
        assert tr.goal == tr.steps[0].observation.splitlines()[0][len("Mission: "):]
        # Turns and moves of a shortest plan are never no-ops.
        assert not any(s.annotations["no_op"] for s in tr.steps)
    path = tmp_path / "babyai.jsonl"
    assert write_jsonl(path, trajs) == len(trajs)
    assert read_jsonl(path) == trajs
    if split == "ood_test":
        assert np.mean([len(t) for t in trajs]) > np.mean(
            [len(reference_trajectory(ENV, s, BabyAIParams.for_split("train")))
             for s in range(6)])


def test_no_op_annotations():
    _, state = ENV.reset(2)
    # Face a wall or object by turning until the cell ahead is not free, then push into it.
    for _ in range(4):
        g = np.asarray(state.core.grid)
        fx, fy = np.asarray(state.core.agent_pos) + L.DIR_TO_VEC[int(state.core.agent_dir)]
        if g[fx, fy, 0] != L.EMPTY:
            break
        _, state, *_ = ENV.step(2, state, "turn left")
    else:
        while g[fx, fy, 0] == L.EMPTY:
            _, state, *_ = ENV.step(2, state, "go forward")
            g = np.asarray(state.core.grid)
            fx, fy = np.asarray(state.core.agent_pos) + L.DIR_TO_VEC[int(state.core.agent_dir)]
    blocked_by_closed = g[fx, fy, 0] in (L.WALL, L.DOOR) or g[fx, fy, 0] >= L.KEY
    assert blocked_by_closed
    _, _, _, _, info = ENV.step(2, state, "go forward")
    assert info["no_op"] and info["valid"]
    _, _, _, _, info = ENV.step(2, state, "drop")  # hands are empty
    assert info["no_op"]


def test_text_env_runs_in_vector_env_workers():
    from jaxdm.envs.vector import EnvFactory, VectorEnv

    factory = EnvFactory("jaxdm.envs.babyai.text:BabyAITextEnv",
                         {"params": BabyAIParams(max_steps=5)})
    with VectorEnv(factory, num_envs=2, num_workers=1, group_size=2, env_name="babyai") as venv:
        obs, infos = venv.reset(seed=3)
        assert obs[0] == obs[1] == BabyAITextEnv().reset(3)[0]  # one group, one task
        assert infos[0]["goal"] == obs[0].splitlines()[0][len("Mission: "):]
        assert infos[0]["door_distance"] in (1, 2, 3)
        for t in range(5):
            out = venv.step(["turn left", "go forward"])
        assert list(out.dones) == [True, True]
        trajs = venv.pop_trajectories()
    assert len(trajs) == 2
    for tr in trajs:
        assert len(tr) == 5 and tr.truncated and not tr.success and tr.budget == 5
        assert tr.task_type == "pickup" and tr.goal.startswith("pick up the ")
    assert [s.action for s in trajs[0].steps] == ["turn left"] * 5


def test_locked_door_milestones():
    env = BabyAITextEnv(params=BabyAIParams.for_split("train", lock_prob=1.0))
    found = 0
    for seed in range(8):
        tr = reference_trajectory(env, seed)
        assert tr.success and len(tr) <= 128
        subgoals = [s.annotations["subgoal"] for s in tr.steps]
        if "unlock a door" in subgoals:
            found += 1
            key_at = subgoals.index("pick up the key")
            unlock_at = subgoals.index("unlock a door")
            assert key_at < unlock_at and tr.steps[unlock_at].action == "toggle"
            assert "a locked " in tr.steps[0].observation or "a locked " in " ".join(
                s.observation for s in tr.steps[:key_at + 1])
            # One object at a time: the key is dropped before the target is picked up.
            assert "drop" in [s.action for s in tr.steps[unlock_at:]]
    assert found >= 3
