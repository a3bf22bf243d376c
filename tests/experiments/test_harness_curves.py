"""experiments/harness_curves.py: cost-quality curves per decision point and their APGR."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import harness_curves  # noqa: E402


def test_apgr_of_known_curves():
    # a straight line between the ends (a random router) recovers half the gap on average
    assert harness_curves.apgr([(0.0, 0.4), (0.5, 0.6), (1.0, 0.8)]) == pytest.approx(0.5)
    # the gap recovered at once: area 1 - 0.25 / 2
    assert harness_curves.apgr([(0.0, 0.4), (0.25, 0.8), (1.0, 0.8)]) == pytest.approx(0.875)
    assert harness_curves.apgr([(0.0, 0.5), (1.0, 0.5)]) is None   # no gap to recover
    assert harness_curves.apgr([(0.3, 0.5), (1.0, 0.7)]) is None   # no x = 0 end


def test_quick_sweep_with_simulated_models(tmp_path):
    model = json.dumps({"kind": "oracle_noisy", "default_accuracy": 0.7, "seed": 3})
    data = harness_curves.main(["--quick", "--model", model, "--out", str(tmp_path),
                                "--set", "dm={kind: oracle_noisy}"])
    stop = data["stop"]
    for name in ("trained", "noisy_oracle", "random"):
        th0 = next(q for q in stop[name]["points"] if q["threshold"] == 0.0)
        assert th0["delegated"] == 1.0 and th0["decisions"] > 0   # τ = 0: every decision
    # the random router keeps the trained model's answers: at τ = 0 the same run
    assert stop["random"]["points"][0]["success"] == stop["trained"]["points"][0]["success"]
    on_disk = json.loads((tmp_path / "curves.json").read_text())
    assert on_disk["stop"]["llm_alone"]["success"] == stop["llm_alone"]["success"]
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert "| stop | trained |" in (tmp_path / "curves.md").read_text()


def test_thresholds_must_include_zero(tmp_path):
    with pytest.raises(SystemExit, match="must include 0"):
        harness_curves.main(["--model", "x", "--out", str(tmp_path), "--thresholds", "0.5,0.9"])
