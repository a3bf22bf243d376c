"""LVOPD in the stage trainer: ``algo.terms: {lvopd: c}`` needs the ``teacher_topk`` signal,
the gate kind is validated, and a tiny generative run with a local teacher trains."""
import json

import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm.rl.terms import signals_needed
from jaxdm.rl.train_config import TrainConfig
from jaxdm.rl.trainer import Trainer

TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
        "model.num_kv_heads=1", "model.head_dim=16", "policy.form=generative",
        "policy.max_prompt_tokens=160", "policy.max_response_tokens=6", "progress=false",
        "algo.kl_coef=0.0", "mesh_data=1", "env.name=toy_ordering", "env.kwargs={budget: 2}",
        "max_actions=2", "tasks_per_iter=2", "group_size=2", "algo.mini_batch=8",
        "algo.advantage=grpo", "optim.lr=3e-3", "iterations=1", "checkpoint_every=0"]


def _save_teacher(folder, params, config):
    """The policy's own initial weights as an HF folder (config + safetensors): the teacher."""
    from safetensors.numpy import save_file

    from jaxdm.models.loading import params_to_hf

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config.to_hf_dict()), encoding="utf-8")
    save_file({k: np.ascontiguousarray(np.asarray(v, np.float32))
               for k, v in params_to_hf(params, config).items()},
              str(folder / "model.safetensors"))


def test_lvopd_term_config_needs_teacher_topk_and_a_registered_gate(tmp_path):
    base = [*TINY, f"out_dir={tmp_path}", "teacher.kind=local_readout",
            f"teacher.path={tmp_path}", "algo.terms={lvopd: 1.0}"]
    cfg = cfgmod.load_config(TrainConfig, None, base)
    assert "teacher_topk" in signals_needed(cfg)
    assert "teacher_topk" not in signals_needed(
        cfgmod.load_config(TrainConfig, None, [*TINY, f"out_dir={tmp_path}"]))
    with pytest.raises(cfgmod.ConfigError, match="algo.lvopd_gate: unknown gate 'nope'"):
        cfgmod.load_config(TrainConfig, None, [*base, "algo.lvopd_gate=nope"])
    # the teacher_topk signal's own check: a teacher policy is needed
    with pytest.raises(cfgmod.ConfigError, match="teacher.kind"):
        cfgmod.load_config(TrainConfig, None, [*base, "teacher.kind=oracle"])


def test_lvopd_run_with_local_teacher(tmp_path):
    from jaxdm.rl import build

    plain = cfgmod.load_config(TrainConfig, None, [*TINY, f"out_dir={tmp_path / 'x'}"])
    _, params, mcfg, _ = build.build_policy(plain, build.env_factory(plain.env, {}),
                                            build.env_factory(plain.env, plain.env.eval_kwargs))
    _save_teacher(tmp_path / "teacher", params, mcfg)
    cfg = cfgmod.load_config(TrainConfig, None, [
        *TINY, f"out_dir={tmp_path / 'run'}", "teacher.kind=local_readout",
        f"teacher.path={tmp_path / 'teacher'}", "algo.terms={lvopd: 1.0}",
        "algo.lvopd_gate=pure"])
    tr = Trainer(cfg, log=False)
    rec = tr.run()[-1]
    tr.close()
    assert rec["iteration"] == 1 and rec["ppo/updates"] >= 1
    assert rec["teacher_topk/failures"] == 0.0 and rec["teacher_topk/tokens"] > 0
    # pure gate: every action distilled, so the KL term is present, finite and non-negative;
    # the teacher is the student's own initial weights, so it is ~0 and may round to -4e-9
    assert np.isfinite(rec["loss/lvopd"]) and rec["loss/lvopd"] >= -1e-6
    assert rec["lvopd/gate_mean"] == pytest.approx(1.0)
    assert np.isfinite(rec["loss/total"])
