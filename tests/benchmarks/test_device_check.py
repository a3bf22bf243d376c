"""The device check's dry run (same code paths as on a GPU/TPU, tiny shapes on CPU, Pallas in
interpret mode), run as a real process through benchmarks/device_check.sh."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_driver():
    spec = importlib.util.spec_from_file_location(
        "device_check", os.path.join(ROOT, "benchmarks", "device_check.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_peak_table_matches_device_kinds():
    find_peak = _load_driver().find_peak
    assert find_peak("NVIDIA H200") == ("H200", 989.0, 4800.0)
    assert find_peak("NVIDIA H100 80GB HBM3")[0] == "H100 SXM"
    assert find_peak("NVIDIA H100 PCIe")[0] == "H100 PCIe"
    assert find_peak("NVIDIA A100-SXM4-40GB")[2] == 1555.0
    assert find_peak("NVIDIA A100-SXM4-80GB")[2] == 2039.0
    assert find_peak("TPU v5 lite")[0] == "TPU v5e"
    assert find_peak("TPU v5")[0] == "TPU v5p"
    assert find_peak("TPU v6 lite")[0] == "TPU v6e"
    assert find_peak("TPU v4")[1:] == (275.0, 1200.0)
    assert find_peak("cpu") is None


@pytest.mark.slow
def test_dry_run_runs_every_section(tmp_path):
    results_md = os.path.join(ROOT, "benchmarks", "RESULTS.md")
    before = open(results_md).read()
    # one CPU device; XLA's backend optimisations off: the dry run is compile-bound (58 tiny
    # programs) and checks code paths, not speed (CPU time 31 s -> 21 s, loaded)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "benchmarks", "device_check.sh"), "--dry-run",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = dict(re.findall(r"^RESULT (device_\w+): (.*)$", proc.stdout, re.M))
    for name in ("kernel_pallas_vs_reference", "kernel_pallas_vs_xla", "kernel_pallas_tflops",
                 "scoring_shared_vs_one_by_one", "scoring_mfu", "decode_tokens",
                 "decode_bandwidth", "train_tokens", "train_mfu"):
        line = results[f"device_{name}"]
        assert re.fullmatch(r"baseline [\d.]+ \S+, jaxdm [\d.]+ \S+, ratio [\d.]+x", line), line
    report = json.load(open(tmp_path / "device_check.json"))
    assert report["dry_run"] and report["failures"] == {}
    assert any("Pallas interpret mode vs reference" in n for n in report["notes"])
    block = open(tmp_path / "device_check.md").read()
    assert re.match(r"### Device check \d{4}-\d\d-\d\d \d\d:\d\d UTC: CPU dry run", block)
    assert block.count("\n| ") == 1 + len(results)  # the header, then one row per measure
    assert open(results_md).read() == before  # a dry run never writes RESULTS.md
