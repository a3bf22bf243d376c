"""The screen's output folder (jaxdm.screen.store): what a resume keeps and drops."""
import json

import numpy as np
import pytest

from jaxdm.rundir import ResumeMismatchError, RunExistsError, RunFolderError
from jaxdm.screen.store import PassResult, ScreenError, ScreenStore
from jaxdm.trajectory import Step, Trajectory

TRAJS = [Trajectory(goal="g", steps=(Step("o1", "a1"), Step("o2", "a2")), final_observation="f"),
         Trajectory(goal="h", steps=(Step("o1", "b1"),), final_observation="f")]
IDENTITY = {"judges": ["j"], "levels": [], "settings": {"seed": 0}}
STATS = {"requests": 3.0, "missing": 1.0, "errors": 1.0, "tokens_in": 0.0, "tokens_out": 0.0,
         "usd": 0.0, "priced": 0.0, "seconds": 0.1, "last_error": "x", "error_examples": ("x",)}


def _pass(context, scores=((0.25, np.nan), (0.5,)), status="ok"):
    return PassResult("j", "progress", context, [np.array(s) for s in scores], dict(STATS),
                      status=status, reason=None if status == "ok" else "boom")


def _fresh(tmp_path):
    store = ScreenStore(tmp_path / "out")
    assert store.open(IDENTITY, TRAJS, resume=False, overwrite=False) == {}
    return store


def test_resume_restores_saved_passes_exactly(tmp_path):
    store = _fresh(tmp_path)
    store.append(_pass("prefix"), TRAJS)
    store.append(_pass("hindsight", status="failed"), TRAJS)   # kept: its good scores stay
    store.append(_pass("fb", scores=((0.25, 0.75), (0.5,))), TRAJS)
    with open(store.scores, "a") as f:   # rows of a pass that never got its record
        f.write(json.dumps({"judge": "j", "question": "value", "context": "prefix", "traj": 0,
                            "t": 0, "score": 0.1}) + "\n")
    done = ScreenStore(tmp_path / "out").open(IDENTITY, TRAJS, resume=True, overwrite=False)
    assert list(done) == [("j", "progress/prefix"), ("j", "progress/hindsight"),
                          ("j", "progress/fb")]
    p = done[("j", "progress/prefix")]
    np.testing.assert_array_equal(p.per_traj[0], [0.25, np.nan])
    np.testing.assert_array_equal(p.per_traj[1], [0.5])
    # a failed score makes a pass incomplete (resume asks it again), whatever its record said
    assert p.stats == STATS and p.status == "incomplete" and not p.complete
    assert done[("j", "progress/hindsight")].status == "failed"
    assert done[("j", "progress/fb")].complete and done[("j", "progress/fb")].status == "ok"
    assert done[("j", "progress/fb")].stats["missing"] == 0.0
    # Both files now hold exactly the saved passes (not the rows without a record).
    assert len(store.passes.read_text().splitlines()) == 3
    assert len(store.scores.read_text().splitlines()) == 9


def test_replace_puts_a_merged_pass_in_place_of_the_saved_one(tmp_path):
    store = _fresh(tmp_path)
    store.append(_pass("prefix"), TRAJS)
    store.append(_pass("fb"), TRAJS)
    store.replace(_pass("prefix", scores=((0.25, 0.125), (0.5,))), TRAJS)
    rows = [json.loads(x) for x in store.scores.read_text().splitlines()]
    assert len(rows) == 6
    assert sorted((r["context"], r["traj"], r["t"]) for r in rows) == sorted(
        (c, i, t) for c in ("prefix", "fb") for i, t in ((0, 0), (0, 1), (1, 0)))
    assert [r["score"] for r in rows if r["context"] == "prefix"] == [0.25, 0.125, 0.5]
    assert len(store.passes.read_text().splitlines()) == 2
    done = ScreenStore(tmp_path / "out").open(IDENTITY, TRAJS, resume=True, overwrite=False)
    assert done[("j", "progress/prefix")].complete


def test_torn_last_line_is_dropped_but_a_corrupt_middle_line_is_an_error(tmp_path, capsys):
    store = _fresh(tmp_path)
    store.append(_pass("prefix"), TRAJS)
    with open(store.passes, "a") as f:
        f.write('{"judge": "j", "quest')
    done = ScreenStore(tmp_path / "out").open(IDENTITY, TRAJS, resume=True, overwrite=False)
    assert list(done) == [("j", "progress/prefix")]
    assert "torn last line" in capsys.readouterr().err
    text = store.passes.read_text()
    store.passes.write_text("{not json\n" + text)
    with pytest.raises(RunFolderError, match=r"passes.jsonl:1: invalid JSON .*; use --overwrite"):
        ScreenStore(tmp_path / "out").open(IDENTITY, TRAJS, resume=True, overwrite=False)


def test_a_pass_with_missing_rows_runs_again(tmp_path):
    store = _fresh(tmp_path)
    store.append(_pass("prefix"), TRAJS)
    lines = store.scores.read_text().splitlines()
    store.scores.write_text("\n".join(lines[:-1]) + "\n")
    assert ScreenStore(tmp_path / "out").open(IDENTITY, TRAJS, resume=True, overwrite=False) == {}


def test_opening_rules(tmp_path):
    _fresh(tmp_path)
    with pytest.raises(RunExistsError, match="already holds a screening run"):
        ScreenStore(tmp_path / "out").open(IDENTITY, TRAJS, resume=False, overwrite=False)
    with pytest.raises(ResumeMismatchError, match=r"different settings: seed: 0 -> 1; "):
        ScreenStore(tmp_path / "out").open({**IDENTITY, "settings": {"seed": 1}}, TRAJS,
                                           resume=True, overwrite=False)
    with pytest.raises(ScreenError, match="trajectories differ"):
        ScreenStore(tmp_path / "out").open(IDENTITY, TRAJS[:1], resume=True, overwrite=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    with pytest.raises(RunExistsError, match="holds no screening run"):
        ScreenStore(tmp_path / "other").open(IDENTITY, TRAJS, resume=True, overwrite=False)
    # --resume into a folder that does not exist yet starts a fresh run.
    assert ScreenStore(tmp_path / "new").open(IDENTITY, TRAJS, resume=True, overwrite=False) == {}
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="is a file"):
        ScreenStore(tmp_path / "file").open(IDENTITY, TRAJS, resume=False, overwrite=True)
