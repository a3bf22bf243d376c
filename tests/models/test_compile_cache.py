"""JAX's persistent compilation cache (jaxdm.models.compile_cache): where it goes, how it is
turned off, and that a second process scoring the same job loads its programs from it."""
from __future__ import annotations

import functools
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
events, compile_s, traced, compiled = {}, [], [], []
monitoring.register_event_listener(lambda name, **kw: events.__setitem__(name, events.get(name, 0) + 1))
def _duration(name, secs, fun_name=None, **kw):
    if name == "/jax/core/compile/backend_compile_duration":
        compile_s.append(secs)
        compiled.append(fun_name)
    if name == "/jax/core/compile/jaxpr_trace_duration":
        traced.append(fun_name)
monitoring.register_event_duration_secs_listener(_duration)
import jax
from jaxdm import roles
from jaxdm.decision.local import LocalReadout
from jaxdm.models import compile_cache, decoder
from jaxdm.models.config import ModelConfig
from jaxdm.models.loading import Pretrained, load_tokenizer
from jaxdm.models.smollm2 import smollm2_path
compile_cache.enable()
if sys.argv[2] == "plain":  # the scorer as a plain jax.jit (score_requests stores it by default)
    compile_cache.stored = lambda jitted, static_argnames: jitted
sys.path.insert(0, sys.argv[1])
from dm_fixtures import small_trajectory
path = smollm2_path()
config = ModelConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=100000.0,
                     rms_norm_eps=1e-5, tie_embeddings=True, max_position_embeddings=2048)
model = LocalReadout(Pretrained(params=decoder.init_params(config, jax.random.key(0)),
                                config=config, tokenizer=load_tokenizer(path),
                                chat_template=None, path=path),
                     prefix_cache_mb=0)  # the stored program is the uncached scorer's
qs = roles.judge_requests(small_trajectory(), question="progress", context="hindsight")
scores = [r.score for r in model.score(qs)]
print("RESULT " + json.dumps({
    "dir": str(compile_cache.enabled_dir()), "scores": scores,
    "hits": events.get("/jax/compilation_cache/cache_hits", 0),
    "misses": events.get("/jax/compilation_cache/cache_misses", 0),
    "compile_s": sum(compile_s), "compiles": sorted(compile_s)[-5:], "traced": traced,
    "compiled": compiled}))
"""


def _run_child(env_value: str, mode: str = "default") -> dict:
    env = {**os.environ, compile_cache.ENV_VAR: env_value}
    here = Path(__file__).resolve().parents[1] / "decision"
    out = subprocess.run([sys.executable, "-c", CHILD, str(here), mode], env=env,
                         capture_output=True, text=True, timeout=600)
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
    stored = list((folder / compile_cache.PROGRAMS_DIR).glob("*.jaxprog"))
    assert stored, "score_requests stores its scoring program"
    second = _run_child(str(folder))
    # Every program the first process wrote is loaded (the stored scorer from its own file,
    # not looked up in JAX's cache), none is written again, and the compile time left is what
    # JAX does not look up in it.
    assert second["hits"] >= len(written) - len(stored), (first, second, len(written))
    assert _entries(folder) == written
    assert second["compile_s"] < 0.5 * first["compile_s"], (first, second)
    assert second["scores"] == pytest.approx(first["scores"], abs=1e-6)


@pytest.mark.slow
def test_second_process_loads_the_stored_scoring_program_without_tracing(tmp_path):
    folder = tmp_path / "xla"
    # The plain jit fills JAX's cache first: a program JAX then loads from it must not be
    # stored (a deserialised XLA:CPU executable serialised again lost its kernels: "Function
    # wrapped_iota not found" in the next process).
    plain = _run_child(str(folder), "plain")
    first = _run_child(str(folder))
    assert "score_packed" in first["traced"]
    assert len(list((folder / compile_cache.PROGRAMS_DIR).glob("*.jaxprog"))) == 1
    second = _run_child(str(folder))
    # The scorer is neither traced nor compiled nor looked up in JAX's cache (only the random
    # init's small programs are); the scores are those of the plain jit, to the last bit.
    assert "score_packed" not in second["traced"], second["traced"]
    assert not [n for n in second["compiled"] if "score_packed" in str(n)], second["compiled"]
    assert any("score_packed" in str(n) for n in first["compiled"]), first["compiled"]
    assert second["misses"] == 0
    assert second["scores"] == first["scores"] == plain["scores"]
    # Stored program gone, JAX's cache still holding the fresh compile: it is used, not stored.
    for p in (folder / compile_cache.PROGRAMS_DIR).glob("*.jaxprog"):
        p.unlink()
    third = _run_child(str(folder))
    assert third["hits"] >= 1 and third["scores"] == plain["scores"]
    assert not list((folder / compile_cache.PROGRAMS_DIR).glob("*.jaxprog"))


def _fn_and_counter():
    import jax
    import jax.numpy as jnp

    traced = []

    @functools.partial(jax.jit, static_argnames=("power", "scale"))
    def fn(x, power, y, *, scale: float = 1.0):
        traced.append(x.shape)
        return (jnp.sin(x) ** power + y) * scale

    return fn, traced


@pytest.fixture
def without_jax_cache():
    """JAX's own persistent cache off for the test (earlier tests of the session turn it on):
    a compile it serves is used but not stored, which would change what these tests count."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    jax_cache.reset_cache()
    yield
    jax.config.update("jax_enable_compilation_cache", before)
    jax_cache.reset_cache()


def test_stored_programs_load_without_tracing(monkeypatch, tmp_path, without_jax_cache):
    import numpy as np

    monkeypatch.setattr(compile_cache, "_enabled", tmp_path)
    fn, traced = _fn_and_counter()
    x, y = np.linspace(0, 1, 7, dtype=np.float32), np.float32(0.5)
    want = np.asarray(fn(x, 3, y, scale=2.0))
    a = compile_cache.stored(fn, ("power", "scale"))
    np.testing.assert_array_equal(np.asarray(a(x, 3, y, scale=2.0)), want)
    files = list((tmp_path / compile_cache.PROGRAMS_DIR).glob("*.jaxprog"))
    assert len(files) == 1
    # The same function defined again (as in a new process) loads the program: it is never
    # traced, and gives the same bits.
    fn2, traced2 = _fn_and_counter()
    b = compile_cache.stored(fn2, ("power", "scale"))
    np.testing.assert_array_equal(np.asarray(b(x, 3, y, scale=2.0)), want)
    np.testing.assert_array_equal(np.asarray(b(x + 1, 3, y, scale=2.0)),
                                  np.asarray(fn(x + 1, 3, y, scale=2.0)))
    assert traced2 == [] and len(traced) == 1
    # Other static values or shapes are other programs.
    b(x, 2, y, scale=2.0)
    b(x, 3, y, scale=3.0)
    b(x[:5], 3, y, scale=2.0)
    b(x.astype(np.float64), 3, y, scale=2.0)
    assert len(list((tmp_path / compile_cache.PROGRAMS_DIR).glob("*.jaxprog"))) == 5


def test_stored_damaged_entry_recompiles_and_cache_off_stores_nothing(monkeypatch, tmp_path,
                                                                     without_jax_cache):
    import numpy as np

    fn, traced = _fn_and_counter()
    x, y = np.ones(4, np.float32), np.float32(1.0)
    monkeypatch.setattr(compile_cache, "_enabled", None)
    off = compile_cache.stored(fn, ("power", "scale"))
    np.testing.assert_array_equal(np.asarray(off(x, 2, y)), np.asarray(fn(x, 2, y)))
    assert not (tmp_path / compile_cache.PROGRAMS_DIR).exists()
    monkeypatch.setattr(compile_cache, "_enabled", tmp_path)
    compile_cache.stored(fn, ("power", "scale"))(x, 2, y)
    (path,) = (tmp_path / compile_cache.PROGRAMS_DIR).glob("*.jaxprog")
    path.write_bytes(b"not a program")
    fn2, _ = _fn_and_counter()  # the same function in a new process
    got = compile_cache.stored(fn2, ("power", "scale"))(x, 2, y)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(x, 2, y)))
    assert path.stat().st_size > 100  # rewritten
    with pytest.raises(ValueError, match="not parameters"):
        compile_cache.stored(fn, ("nope",))
    # One wrapper per function and static names; a plain function is returned as is.
    assert compile_cache.stored(fn, ("scale", "power")) is off
    plain = lambda x: x  # noqa: E731
    assert compile_cache.stored(plain, ()) is plain


def test_stored_programs_folder_is_bounded(tmp_path):
    for i, size in enumerate((300, 300, 300)):
        p = tmp_path / f"{i}.jaxprog"
        p.write_bytes(b"x" * size)
        os.utime(p, (1000 + i, 1000 + i))
    compile_cache._evict(tmp_path, 700)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.jaxprog", "2.jaxprog"]


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
