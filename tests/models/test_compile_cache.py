"""JAX's persistent compilation cache (jaxdm.models.compile_cache): where it goes, how it is
turned off, and that a second process scoring the same job loads its programs from it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxdm.models import compile_cache

# A scoring job in a fresh process, as the `jaxdm` command runs it (cache turned on first):
# LocalReadout judging a small trajectory on a 2-layer random model with SmolLM2's tokenizer.
# It prints JAX's own counts: persistent-cache hits and misses, and the seconds spent in XLA
# compiles that did run.
CHILD = r"""
import json, sys
from jax import monitoring
events, compile_s = {}, []
monitoring.register_event_listener(lambda name, **kw: events.__setitem__(name, events.get(name, 0) + 1))
monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: compile_s.append(secs)
    if name == "/jax/core/compile/backend_compile_duration" else None)
import jax
from jaxdm import roles
from jaxdm.decision.local import LocalReadout
from jaxdm.models import compile_cache, decoder
from jaxdm.models.config import ModelConfig
from jaxdm.models.loading import Pretrained, load_tokenizer
from jaxdm.models.smollm2 import smollm2_path
compile_cache.enable()
sys.path.insert(0, sys.argv[1])
from dm_fixtures import small_trajectory
path = smollm2_path()
config = ModelConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=100000.0,
                     rms_norm_eps=1e-5, tie_embeddings=True, max_position_embeddings=2048)
model = LocalReadout(Pretrained(params=decoder.init_params(config, jax.random.key(0)),
                                config=config, tokenizer=load_tokenizer(path),
                                chat_template=None, path=path))
qs = roles.judge_requests(small_trajectory(), question="progress", context="hindsight")
scores = [r.score for r in model.score(qs)]
print("RESULT " + json.dumps({
    "dir": str(compile_cache.enabled_dir()), "scores": scores,
    "hits": events.get("/jax/compilation_cache/cache_hits", 0),
    "misses": events.get("/jax/compilation_cache/cache_misses", 0),
    "compile_s": sum(compile_s), "compiles": sorted(compile_s)[-5:]}))
"""


def _run_child(env_value: str) -> dict:
    env = {**os.environ, compile_cache.ENV_VAR: env_value}
    here = Path(__file__).resolve().parents[1] / "decision"
    out = subprocess.run([sys.executable, "-c", CHILD, str(here)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(line[-1][len("RESULT "):])


def _entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.endswith("-cache")}


@pytest.mark.slow
def test_second_process_loads_the_scoring_programs_from_the_cache(tmp_path):
    folder = tmp_path / "xla"
    first = _run_child(str(folder))
    assert first["dir"] == str(folder)
    written = _entries(folder)
    assert first["misses"] >= 1 and first["hits"] == 0 and written
    second = _run_child(str(folder))
    # Every program the first process wrote is loaded, none is written again, and the
    # compile time left is what JAX does not look up in it.
    assert second["hits"] >= len(written), (first, second, len(written))
    assert _entries(folder) == written
    assert second["compile_s"] < 0.5 * first["compile_s"], (first, second)
    assert second["scores"] == pytest.approx(first["scores"], abs=1e-6)


@pytest.mark.parametrize("value", ["0", "off", "OFF", "false", "no", " 0 "])
def test_resolve_off(monkeypatch, value):
    monkeypatch.setenv(compile_cache.ENV_VAR, value)
    assert compile_cache.resolve() is None


def test_resolve_default_and_explicit(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
    monkeypatch.setenv("JAXDM_CACHE", str(tmp_path / "root"))
    assert compile_cache.resolve() == tmp_path / "root" / "xla"
    monkeypatch.setenv(compile_cache.ENV_VAR, "~/somewhere")
    assert compile_cache.resolve() == Path.home() / "somewhere"
