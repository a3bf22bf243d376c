"""Cold start (issue 17): the `jaxdm` command's start-up and a local scoring job import nothing
heavy that the first score does not need (each such import cost 0.1-3 s of a fresh process on
this project's loaded 2-core VMs; see benchmarks/cold_start.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Modules no step before the first score uses: plotting (the screen's figures are drawn after
# scoring), HTTP (remote backends only), torch / transformers (reference baselines and
# tokenizer settings FastTokenizer does not reproduce), the real ALFWorld package.
HEAVY = ("matplotlib", "PIL", "httpx", "torch", "transformers", "scipy", "pandas", "sklearn",
         "alfworld")

# A fresh process: the `jaxdm demo` parser and the screen runner (what the command imports
# before it scores), then LocalReadout judging a small trajectory on a 2-layer random model
# with SmolLM2's tokenizer; prints the heavy modules imported by then.
CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from jaxdm import cli
try:
    cli.main(["demo", "--help"])
except SystemExit:
    pass
import jaxdm.screen.run
from dm_fixtures import small_trajectory, tiny_pretrained
from jaxdm import roles
from jaxdm.decision.local import LocalReadout
qs = roles.judge_requests(small_trajectory(), question="progress", context="hindsight")
scores = [r.score for r in LocalReadout(tiny_pretrained()).score(qs)]
heavy = json.loads(sys.argv[2])
print("RESULT " + json.dumps({"scores": len(scores),
                              "heavy": sorted(m for m in heavy if m in sys.modules)}))
"""


def test_start_up_and_scoring_import_nothing_heavy():
    here = Path(__file__).resolve().parents[1] / "decision"
    env = {**os.environ, "JAXDM_COMPILATION_CACHE": "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(here), json.dumps(HEAVY)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    res = json.loads(line[len("RESULT "):])
    assert res["scores"] == 4
    assert res["heavy"] == [], res["heavy"]
