"""Cold start and precision of local scoring: how many distinct programs the demo's scoring job
compiles (a regression bound), and bf16 readout against fp32."""
from __future__ import annotations

import dataclasses

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from dm_fixtures import small_trajectory, tiny_pretrained, with_params

from jaxdm import roles
from jaxdm.decision import shared_prefix as sp
from jaxdm.roles.jobs import judge_request_batch
from jaxdm.decision.local import LocalReadout
from jaxdm.envs.alfworld import noisy_expert_trajectories
from jaxdm.screen.run import COMBOS, EXPANSIONS

# bf16 weights and matmul inputs (fp32 accumulation, fp32 residual stream) vs fp32, on P(Yes) of
# the tiny model: measured 1.8e-4 (Hindsight+Progress) / 2.4e-4 (Prefix+Value) on
# small_trajectory. The real SmolLM2-135M differs more (8-action trajectory, 2026-12-02):
# 2.9e-3 / 6.2e-3 with the fp32 residual stream (1.6e-2 / 2.3e-2 with a bf16 one); rounding the
# weights alone (fp32 compute) costs 0.4e-3 / 1.1e-3, so the 1e-3 goal is NOT met on
# SmolLM2 in bf16 (not tested here: SmolLM2 compiles too slowly for a unit test; the
# `scoring_throughput.py --vllm` run prints the difference).
BF16_TOL = 1e-3


def _demo_keys(n_traj: int) -> tuple[int, list[tuple]]:
    """Program keys of `jaxdm demo`'s SmolLM2 passes (4 question x context combinations, then
    Progress under the FB and 50 % expansions) on ``n_traj`` of its trajectories. The tiny
    model has SmolLM2's tokenizer, so the token streams and shapes are the demo's."""
    trajs = noisy_expert_trajectories(n_traj, seed=0, budget=20)
    model = LocalReadout(tiny_pretrained())
    passes = [(q, c, None) for q, c in COMBOS]
    passes += [("progress", "prefix", EXPANSIONS.get(lab)) for lab in ("FB", "50%")]
    keys, n_req = [], 0
    for q, c, exp in passes:
        qs, _, _ = judge_request_batch(trajs, question=q, context=c, expansion=exp)
        reqs = model.yesno_requests(qs)
        n_req += len(reqs)
        keys += sp.program_keys(reqs, max_groups_per_call=model.max_groups_per_call,
                                min_shared_frac=model.min_shared_frac)
    return n_req, keys


def test_demo_job_compiles_few_programs():
    # Measured: 2 trajectories 6 calls / 2 programs; the demo's 6 trajectories (52 actions,
    # 312 questions) 28 calls / 15 programs (19 before the window bucket became >= 64).
    # Prompts v3 (indexed entries, quoted target action: longer contexts and questions) on
    # 2 trajectories: 7 calls / 4 programs (one context crosses 512 -> 640 tokens, one call's
    # question windows 128 -> 256). Session 14, the packed row holding the trunk then the
    # suffixes with one tail of padding (its length bucketed, the trunk's bound coarse): 9 calls
    # / 5 programs on 2 trajectories, 32 / 17 on the demo's 6 (was 29 / 16), 3.1 % fewer rows.
    n_req, keys = _demo_keys(2)
    assert n_req == 6 * 8 and len(keys) <= 9
    assert len(set(keys)) <= 5, sorted(set(keys))


def test_program_keys_are_what_score_requests_compiles():
    model = LocalReadout(tiny_pretrained())
    qs = roles.judge_requests(small_trajectory(), question="progress", context="hindsight")
    reqs = model.yesno_requests(qs)
    keys = sp.program_keys(reqs)
    seen = []
    real = sp.score_packed

    def spy(params, config, batch, **kw):
        seen.append(("packed", kw["full_vocab"], kw["window"],
                     tuple(np.shape(a) for a in batch)))
        return real(params, config, batch, **kw)

    sp.score_packed = spy
    try:
        sp.score_requests(model.params, model.config, reqs)
    finally:
        sp.score_packed = real
    assert seen == keys


_COUNT_COMPILES = """
import jax
from jax import monitoring
from dm_fixtures import small_trajectory, tiny_pretrained
from jaxdm import roles
from jaxdm.decision import shared_prefix as sp
from jaxdm.decision.local import LocalReadout
model = LocalReadout(tiny_pretrained())
qs = roles.judge_requests(small_trajectory(), question="progress", context="hindsight")
reqs = model.yesno_requests(qs)
compiled = []
def listen(name, secs, **kw):
    if name == "/jax/core/compile/backend_compile_duration":
        compiled.append(secs)
monitoring.register_event_duration_secs_listener(listen)
sp.score_requests(model.params, model.config, reqs)
print("RESULT", len(compiled), len(set(sp.program_keys(reqs))))
"""


def test_scoring_compiles_only_its_programs(tmp_path):
    # Cold start: the packed batch reaches the jitted scorer as numpy; jnp.asarray on it
    # compiled one staging program per array shape (7 of a cold SmolLM2 job's 8 programs).
    # A fresh process with an empty compilation cache (clearing this process's jit caches
    # would make every later test recompile).
    import os
    import subprocess
    import sys
    from pathlib import Path
    here = Path(__file__).resolve().parent
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXDM_COMPILATION_CACHE=str(tmp_path / "cc"),
               PYTHONPATH=os.pathsep.join([str(here), str(here.parents[1]),
                                           os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _COUNT_COMPILES], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")][-1]
    compiled, distinct = map(int, line.split()[1:])
    assert compiled == distinct, (compiled, distinct)


def test_bf16_readout_agrees_with_fp32():
    fp32 = tiny_pretrained()
    cfg16 = dataclasses.replace(fp32.config, dtype="bfloat16")
    params16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16)
                            if jnp.issubdtype(x.dtype, jnp.floating) else x, fp32.params)
    bf16 = dataclasses.replace(with_params(fp32, params16), config=cfg16)
    qs = roles.judge_requests(small_trajectory(), question="progress", context="hindsight")
    a = np.array([r.score for r in LocalReadout(fp32).score(qs)])
    b = np.array([r.score for r in LocalReadout(bf16).score(qs)])
    assert np.all(np.isfinite(b))
    assert np.max(np.abs(a - b)) <= BF16_TOL, (a, b)


def test_bf16_weights_keep_an_fp32_residual_stream():
    # The precision lever of issue 17: with bf16 weights the layer scan carries the residual
    # stream in fp32 (a bf16 one put SmolLM2's P(Yes) 2e-2 away from fp32), while the hidden
    # states returned keep the parameters' dtype.
    from jaxdm.models import decoder
    pre = tiny_pretrained()
    params16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), pre.params)
    tokens = jnp.zeros((1, 8), jnp.int32)
    positions = jnp.arange(8)[None]
    jaxpr = jax.make_jaxpr(lambda p: decoder.forward(p, pre.config, tokens, positions))(params16)
    scans = []

    def walk(jp):
        for eqn in jp.eqns:
            if eqn.primitive.name == "scan":
                scans.append(eqn)
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    assert scans, "no layer scan found"
    carry = scans[0].outvars[:scans[0].params["num_carry"]]
    assert [v.aval.dtype for v in carry] == [jnp.float32], carry
    assert jaxpr.out_avals[0].dtype == jnp.bfloat16
