"""The trained judge as teacher-GRPO's teacher: ``teacher.kind=local_readout
teacher.path=<adapter folder>`` builds the ``teacher_scores`` backend on the adapter's base
model with the LoRA adapters merged (``jaxdm.decision.make_backend`` reads adapter folders),
the judge ``jaxdm screen --judge <folder>`` builds the same way
(tests/screen/test_screen_judge_folder.py)."""
import re

import numpy as np
import pytest

from jaxdm.decision import make_backend
from jaxdm.roles.jobs import score_trajectories
from jaxdm.decision.local import LocalReadout
from jaxdm.decision.synthetic import alfworld_like_trajectory
from jaxdm.rl.signals import SIGNALS
from jaxdm.rl.train_config import TeacherSection, TrainConfig
from jaxdm.models import lora
from tests.train.train_fixtures import adapter_folder as make_adapter_folder


@pytest.fixture(scope="module")
def adapter_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("teacher_judge")
    pre, hf, folder, ad, cfg = make_adapter_folder(root, seed=6, key=1, command="t")
    return pre, hf, folder, lora.merge(pre.params, ad, cfg)


def test_teacher_signal_builds_the_adapter_judge(adapter_folder):
    import dataclasses

    pre, hf, folder, merged = adapter_folder
    trajs = [alfworld_like_trajectory(seed=s, n_actions=4) for s in (1, 2)]
    cfg = TrainConfig(teacher=TeacherSection(kind="local_readout", path=str(folder)))
    teacher = SIGNALS.get("teacher_scores").build(cfg, None)     # what the trainer builds
    got = score_trajectories(teacher, trajs, question="progress", context="hindsight")
    want = score_trajectories(LocalReadout(dataclasses.replace(pre, params=merged)), trajs,
                              question="progress", context="hindsight")
    base = score_trajectories(make_backend({"kind": "local_readout", "path": str(hf)}), trajs,
                              question="progress", context="hindsight")
    assert got.ok.all() and got.scores.shape == (2, 4)
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-6)
    assert np.abs(got.scores - base.scores).max() > 1e-4          # the adapter is applied


def test_compare_names_teachers_as_the_screen_names_judges():
    """``teacher_grpo.py --compare grpo,teacher,teacher@smollm2-judge``: the judge after '@'
    is read by ``jaxdm screen``'s judge parser; keys a teacher has no field for are named."""
    import importlib.util
    from pathlib import Path

    from jaxdm.judges import SMOLLM2_PROGRESS
    path = Path(__file__).resolve().parents[2] / "experiments" / "teacher_grpo.py"
    spec = importlib.util.spec_from_file_location("teacher_grpo_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    base = TeacherSection(context="hindsight", max_failed_share=0.5)
    t = script.teacher_for("smollm2-judge", base)
    assert (t.kind, t.path, t.context, t.max_failed_share) == (
        "local_readout", str(SMOLLM2_PROGRESS), "hindsight", 0.5)
    assert script.teacher_for("smollm2", base).path == "smollm2"
    assert script.teacher_for("oracle:noise=0.2", base).noise == 0.2
    with pytest.raises(SystemExit, match=r"\['max_groups_per_call'\] are not teacher"):
        script.teacher_for("local_readout:path=x,max_groups_per_call=2", base)
    with pytest.raises(SystemExit, match="teacher@nosuch: unknown judge"):
        script.teacher_for("nosuch", base)
    # an estimator name is looked up in rl.estimators.ESTIMATORS, before any run starts
    with pytest.raises(SystemExit, match=re.escape(
            "--compare: unknown estimator 'nope'; known: ['gae', ")):
        script.compare(TrainConfig(), ["grpo", "nope"], [0], resume=False)


def test_compare_summarises_whole_runs_when_resumed(tmp_path, monkeypatch):
    """``--compare ... --resume`` over finished runs: the summary reads every run's whole
    metrics file (a resumed run returns only the iterations it added: none)."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "experiments" / "teacher_grpo.py"
    spec = importlib.util.spec_from_file_location("teacher_grpo_script2", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def finished_run(cfg, *, resume, overwrite=False):  # a finished run, resumed: re-read
        assert resume and not overwrite
        out = Path(cfg.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        succ = 0.25 * (cfg.seed + 1)
        recs = [{"step": 1, "train/success": succ, "teacher/score_std": 0.01},
                {"step": 1, "eval/All": 100 * succ}]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        return recs

    monkeypatch.setattr(script, "train_run", finished_run)
    summary = script.compare(TrainConfig(out_dir=str(tmp_path), iterations=1),
                             ["teacher@oracle"], [0, 1], resume=True)
    row = summary["teacher@oracle"]
    assert row["train_success_first5"] == 0.375 and row["eval/All"] == 37.5
    assert row["teacher_score_std"] == 0.01
    assert (tmp_path / "success_curves.png").is_file()
