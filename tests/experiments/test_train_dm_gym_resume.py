"""``experiments/train_dm_gym.py`` killed (a real SIGKILL, ``kill_after.py``) inside each stage
and at stage boundaries, then ``--resume``d: the same data, training curve, bench records and
CASCADE results as an uninterrupted run (issue 43: every stage records its start before it
writes and its end after; output without an end record is redone). Tiny sizes: a one-layer
random decoder with SmolLM2's tokenizer as the base model, two SFT steps on stop questions,
two bench levels of a few items, one shadow and one test task per CASCADE."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.experiments.resume_fixtures import NO_KILL, REPO, assert_same_results, run_killed

SCRIPT = REPO / "experiments" / "train_dm_gym.py"
TINY = ["--quick", "--no-progress", "--levels", "l1,l2", "--train-kinds", "stop"]

# (file the kill follows, its n-th write). Each point costs ~17 s on 2 loaded cores; these four
# cover a kill inside a stage of each kind and at a boundary. Also run once (all passed):
# ("/train_states.jsonl", 1): data written, its end not recorded; ("harness_smollm2-base/
# summary.json", 1): a CASCADE's results written, not recorded.
KILL_POINTS = [
    ("run/metrics.jsonl", 1),                     # inside SFT: one of two steps done
    ("/results.json", 4),                         # SFT's end recorded, bench not started
    ("bench/l2/units.jsonl", 1),                  # inside the bench's second level
    ("harness_smollm2-sft/thresholds.json", 1),   # inside a CASCADE (fit written, not recorded)
]


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    """A one-layer random decoder with SmolLM2's tokenizer (its context fits DECISION GYM's
    questions) as an HF folder."""
    import jax

    from jaxdm.models import decoder
    from jaxdm.models.config import ModelConfig
    from jaxdm.models.loading import load_tokenizer, save_pretrained
    from jaxdm.models.smollm2 import smollm2_path

    path = smollm2_path()
    config = ModelConfig(vocab_size=49152, hidden_size=16, intermediate_size=32, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=8, rope_theta=100000.0,
                         rms_norm_eps=1e-5, tie_embeddings=True, max_position_embeddings=8192)
    params = decoder.init_params(config, jax.random.key(0))
    return save_pretrained(tmp_path_factory.mktemp("model") / "tiny", params, config,
                           tokenizer=load_tokenizer(path), source=path)


def _run(out: Path, model: Path, *extra: str, kill=NO_KILL) -> subprocess.CompletedProcess:
    return run_killed(SCRIPT, ["--out", str(out), "--model", str(model), *TINY, *extra], kill)


def _timeless(value, out: str):
    """``value`` without what differs between two equal runs: times, speeds, the folder's own
    path, the resume flags."""
    if isinstance(value, dict):
        return {k: _timeless(v, out) for k, v in value.items()
                if not (k in ("time", "timing", "started", "finished", "resume", "overwrite",
                              "resumed_from", "build_seconds") or "seconds" in k
                        or k.endswith("_s") or k.endswith("per_second") or k.endswith("_per_s"))}
    if isinstance(value, list):
        return [_timeless(v, out) for v in value]
    if isinstance(value, str):
        return value.replace(out, "OUT")
    return value


def _results(out: Path) -> dict:
    o = str(out)
    got = {"results.json": _timeless(json.loads((out / "results.json").read_text()), o),
           "before_after.md": (out / "before_after.md").read_text().replace(o, "OUT"),
           "train_states.jsonl": (out / "train_states.jsonl").read_text()}
    for f in [out / "run" / "metrics.jsonl", *sorted(out.glob("bench/*/records.jsonl")),
              *sorted(out.glob("harness_*/summary.json")),
              *sorted(out.glob("harness_*/runs/*/episodes.jsonl"))]:
        text = f.read_text()
        rows = [json.loads(x) for x in text.splitlines()] if f.suffix == ".jsonl" else [
            json.loads(text)]
        got[f.relative_to(out).as_posix()] = _timeless(rows, o)
    return got


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, base_model):
    out = tmp_path_factory.mktemp("whole") / "x"
    p = _run(out, base_model)
    assert p.returncode == 0, p.stderr[-3000:]
    return _results(out)


@pytest.mark.slow
@pytest.mark.parametrize("name,k", KILL_POINTS, ids=[f"{n}#{k}" for n, k in KILL_POINTS])
def test_a_kill_anywhere_resumes_to_the_uninterrupted_results(tmp_path, base_model,
                                                              uninterrupted, name, k):
    out = tmp_path / "x"
    p = _run(out, base_model, kill=(name, k))
    assert p.returncode == -9, (p.returncode, p.stderr[-3000:])   # killed at that write
    p = _run(out, base_model, "--resume")
    assert p.returncode == 0, p.stderr[-3000:]
    got = _results(out)
    assert_same_results(got, uninterrupted)
    assert not list(out.rglob("*.tmp"))




def _script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_dm_gym_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_folder_with_results_is_refused_without_resume_or_overwrite(tmp_path):
    script = _script()
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"already holds a train_dm_gym run \(results.json\); "
                                         r"pass --resume to continue it or --overwrite"):
        script.main(["--out", str(tmp_path), "--quick"])
    with pytest.raises(SystemExit, match="--resume and --overwrite exclude each other"):
        script.main(["--out", str(tmp_path), "--quick", "--resume", "--overwrite"])


def test_a_finished_stage_made_with_other_settings_is_not_built_on(tmp_path):
    script = _script()
    settings = {"train_tasks": 3, "train_states": 2, "train_kinds": "tool,param,stop",
                "whole_states": False, "error_rate": 0.25}   # --quick's but 3 tasks
    assert sorted(settings) == sorted(script.STAGE_ARGS["data"])
    (tmp_path / "results.json").write_text(json.dumps(
        {"stages": {"data": {"settings": settings, "started": 1.0, "finished": 2.0}}}))
    with pytest.raises(SystemExit, match=r"stage data finished with other settings "
                                         r"\(\{'train_tasks': 3\}\)"):
        script.main(["--out", str(tmp_path), "--quick", "--resume"])
    assert not (tmp_path / "train_states.jsonl").exists()
