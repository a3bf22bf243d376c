"""train-dm: exact resume after a stop mid-epoch, NaN stop keeps the last good checkpoint,
malformed data named by file and line, LoRA merge, HF export loaded by jaxdm and transformers."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder
from jaxdm.models.loading import load_pretrained, save_pretrained
from jaxdm.models import lora
from jaxdm.train import packing, sft
from jaxdm.train.data import read_states
from jaxdm.rundir import ResumeMismatchError
from tests.train.train_fixtures import tiny


def _state(i: int) -> dict:
    ctx = (f"Customer {i} writes: please cancel order O-1{i:04d}; it is still pending. "
           f"The agent found customer C-10{i:02d} and the order.")
    return {"context": ctx, "split": "train", "questions": [
        {"question": "Which tool should the agent call next?", "kind": "tool",
         "options": ["cancel_order: cancel an order", "get_weather: the weather",
                     "finish: end the conversation"], "answer": [0]},
        {"question": "Did the last action help?", "answer": "yes" if i % 2 else "no"}]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_dm")
    pre = tiny(seed=1)
    model = save_pretrained(root / "base", pre.params, pre.config, tokenizer=pre.tokenizer,
                            source=pre.path)
    data = root / "states.jsonl"
    data.write_text("".join(json.dumps(_state(i)) + "\n" for i in range(5)))
    return root, model, data


def _cfg(root, model, data, out, **kw):
    base = dict(data=str(data), model=str(model), out_dir=str(root / out), mode="readout",
                epochs=2, lr=1e-2, lora_rank=4, lora_alpha=8.0, save_every=1, progress=False,
                export=False)
    return sft.TrainDMConfig(**(base | kw))


def _restore(out, model):
    """(adapters, step) of the latest checkpoint, restored onto a freshly built target."""
    import optax

    from jaxdm.rl.checkpoint import Checkpointer
    tr = lora.init_adapters(load_pretrained(model).params, lora.LoraConfig(4, 8.0),
                            jax.random.key(0))
    ck = Checkpointer(out / "checkpoints")
    state, host, step = ck.restore({"trainable": tr, "opt": optax.adamw(1e-2).init(tr)})
    ck.close()
    assert host["step"] == step
    return state["trainable"], step


def test_resume_mid_epoch_is_exact(setup):
    root, model, data = setup
    # 5 states per epoch: stop after step 2 (mid-epoch 1), restart, take step 3. A run saves
    # at its stop (max_steps) whatever save_every says, so only the stops write checkpoints.
    kw = dict(save_every=100)
    s1 = sft.train(_cfg(root, model, data, "killed", max_steps=2, **kw))
    assert s1["steps_done"] == 2
    # a resume with a setting that changes the steps is refused, naming it; max_steps is free
    with pytest.raises(ResumeMismatchError, match=r"holds a run with different settings or "
                                                  r"data: lr: 0.01 -> 0.02, seed: 0 -> 1; use "
                                                  r"a new out_dir"):
        sft.train(_cfg(root, model, data, "killed", max_steps=3, lr=2e-2, seed=1, **kw))
    s2 = sft.train(_cfg(root, model, data, "killed", max_steps=3, **kw))
    assert s2["resumed_from"] == 2
    sft.train(_cfg(root, model, data, "straight", max_steps=3, **kw))
    a, sa = _restore(root / "killed", model)
    b, sb = _restore(root / "straight", model)
    assert sa == sb == 3
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    recs = [json.loads(l) for l in (root / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(np.isfinite(r["sft/loss"]) for r in recs)


def test_full_run_exports_a_folder_jaxdm_and_transformers_load(setup):
    root, model, data = setup
    summary = sft.train(_cfg(root, model, data, "full", export=True))
    assert summary["steps_done"] == 10                      # 2 epochs x 5 states
    recs = [json.loads(l) for l in (root / "full" / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["sft/loss"] < recs[0]["sft/loss"]       # lr 1e-2 on 5 states: it learns
    assert (root / "full" / "curves.png").stat().st_size > 1000
    folder = root / "full" / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (folder / name).is_file()
    # The exported folder equals base + merged adapters, through jaxdm's own loader ...
    trainable, _ = _restore(root / "full", model)
    base = load_pretrained(model)
    merged = lora.merge(base.params, trainable, lora.LoraConfig(4, 8.0))
    loaded = load_pretrained(folder)
    tokens = jnp.asarray(np.arange(3, 40, dtype=np.int32))[None]
    want = np.asarray(decoder.logits(merged, loaded.config, tokens))
    got = np.asarray(decoder.logits(loaded.params, loaded.config, tokens))
    np.testing.assert_allclose(got, want, atol=1e-5)
    # The adapter alone (out/adapter) rebuilds the same model from the base.
    assert summary["adapter_bytes"] == (root / "full" / "adapter" / "adapter.safetensors"
                                        ).stat().st_size
    adapted = lora.load_adapted(root / "full" / "adapter")
    np.testing.assert_allclose(np.asarray(decoder.logits(adapted.params, loaded.config, tokens)),
                               want, atol=1e-5)
    # ... and through a backend given the path.
    from jaxdm.decision import make_backend
    from jaxdm.decision.types import YesNo
    dm = make_backend({"kind": "local_readout", "path": str(folder)})
    [r] = dm.score([YesNo(context="c", question="q?")])
    assert r.ok and 0.0 < r.score < 1.0


@pytest.mark.torch
def test_exported_folder_matches_transformers(setup):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM
    root, model, data = setup
    pre = load_pretrained(model)
    adapters = lora.init_adapters(pre.params, lora.LoraConfig(4, 8.0), jax.random.key(3))
    adapters = jax.tree.map(lambda x: x + 0.05, adapters)    # non-zero B: a real delta
    merged = lora.merge(pre.params, adapters, lora.LoraConfig(4, 8.0))
    folder = save_pretrained(root / "export_hf", merged, pre.config, source=model)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokens = np.arange(5, 69, dtype=np.int64)[None]
    with torch.no_grad():
        want = hf(torch.tensor(tokens)).logits.numpy()
    got = np.asarray(decoder.logits(merged, pre.config, jnp.asarray(tokens, jnp.int32)))
    assert np.max(np.abs(got - want)) < 1e-4


def test_lora_merge_equals_unmerged_projection():
    """The decoder through ``lora.adapt`` (every projection x·W + s·(x·A)·B, unmerged) gives
    the logits of the merged weights, on every target, with a non-zero B."""
    pre = tiny()
    cfg = lora.LoraConfig(rank=3, alpha=6.0)
    ad = lora.init_adapters(pre.params, cfg, jax.random.key(0))
    ad = jax.tree.map(lambda x: x + 0.1 * jnp.ones_like(x), ad)
    assert set(ad) == set(lora.TARGETS)
    tokens = jnp.asarray([[5, 17, 301, 4000, 12, 9]], jnp.int32)
    merged = decoder.logits(lora.merge(pre.params, ad, cfg), pre.config, tokens)
    unmerged = decoder.logits(lora.adapt(pre.params, ad, cfg), pre.config, tokens)
    plain = decoder.logits(pre.params, pre.config, tokens)
    assert float(jnp.max(jnp.abs(merged - plain))) > 1e-2    # the adapters change the model
    np.testing.assert_allclose(np.asarray(unmerged), np.asarray(merged), atol=1e-4)
    with pytest.raises(ValueError, match="unknown LoRA target"):
        lora.LoraConfig(targets=("q", "lm_head"))


def test_unmerged_training_step_equals_the_merged_one(setup):
    """The default step applies LoRA unmerged (decoder.Adapted: x·W + s·(x·A)·B, no dense
    weight gradient); it gives the merged step's loss and gradient norm, and the same update,
    with remat on and off."""
    root, model, data = setup
    pre = load_pretrained(model)
    states = read_states(str(data))
    enc = packing.Encoder(pre, mode="readout")
    batch, window, full_vocab, _ = packing.pack_items(enc, [it for s in states[:2] for it in s])
    batch = jax.tree.map(jnp.asarray, batch)
    lcfg = lora.LoraConfig(4, 8.0)
    tr = jax.tree.map(lambda a: a + 0.02, lora.init_adapters(pre.params, lcfg, jax.random.key(0)))
    for remat in (False, True):
        got = {}
        for how in ("merged", "unmerged"):
            fn, opt = sft.train_step_fn(pre.config.replace(remat=remat), lcfg, 0.2, 1e-3, 0.0,
                                        how)
            got[how] = fn(tr, opt.init(tr), pre.params, batch, window, full_vocab)
        (m_tr, _, m_loss, m_norm, _), (u_tr, _, u_loss, u_norm, _) = got["merged"], got["unmerged"]
        np.testing.assert_allclose(float(u_loss), float(m_loss), rtol=1e-5)
        np.testing.assert_allclose(float(u_norm), float(m_norm), rtol=1e-4)
        for a, b in zip(jax.tree.leaves(u_tr), jax.tree.leaves(m_tr)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    with pytest.raises(ValueError, match="lora_apply"):
        sft.train_step_fn(pre.config, lcfg, 0.2, 1e-3, 0.0, "fused")
    with pytest.raises(ValueError, match="do not fit"):
        lora.adapt(pre.params, {"q": {"a": jnp.zeros((2, 3, 4)), "b": jnp.zeros((2, 4, 3))}},
                   lcfg)


def test_packed_and_rows_layouts_train_the_same_curve(setup):
    """train-dm's default packed layout (attention through decoder.segment_attention_vjp)
    and the rows layout (XLA's autodiff of a KV cache and padded rows): the same losses,
    gradient norms and adapters over 4 steps, in fp32."""
    root, model, data = setup
    runs = {lay: sft.train(_cfg(root, model, data, f"layout_{lay}", layout=lay, max_steps=4,
                                save_every=100)) for lay in ("packed", "rows")}
    assert all(r["steps_done"] == 4 for r in runs.values())
    curves = {lay: [json.loads(x) for x in (root / f"layout_{lay}" / "metrics.jsonl")
                    .read_text().splitlines()] for lay in runs}
    for a, b in zip(curves["packed"], curves["rows"]):
        np.testing.assert_allclose(a["sft/loss"], b["sft/loss"], rtol=2e-5)
        np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=2e-4)
    assert curves["packed"][-1]["sft/loss"] < curves["packed"][0]["sft/loss"]
    assert sft.TrainDMConfig().layout == "packed"
    (pa, _), (ra, _) = (_restore(root / f"layout_{lay}", model) for lay in ("packed", "rows"))
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(ra)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


def test_nan_loss_stops_with_step_and_keeps_last_checkpoint(setup, monkeypatch):
    root, model, data = setup
    real = packing.batch_loss

    def poisoned(params, config, batch, **kw):
        loss, m = real(params, config, batch, **kw)
        return loss * jnp.nan, m

    sft.train(_cfg(root, model, data, "nan", max_steps=2))
    sft.train_step_fn.cache_clear()
    monkeypatch.setattr(packing, "batch_loss", poisoned)
    with pytest.raises(sft.TrainingError, match=r"non-finite loss at step 3 \(epoch 1, batch "
                                                r"of states \['.*states.jsonl:\d: questions"):
        sft.train(_cfg(root, model, data, "nan", max_steps=4))
    sft.train_step_fn.cache_clear()
    _, step = _restore(root / "nan", model)
    assert step == 2


def test_malformed_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(_state(0)) + "\n" + '{"context": "x", "questions": [\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: invalid JSON"):
        read_states(p)
    bad = _state(1)
    bad["questions"][0]["answer"] = [7]
    p.write_text(json.dumps(_state(0)) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:3: questions\[0\]: answer indices \[7\]"):
        read_states(p)
    test_row = _state(2) | {"split": "test"}
    p.write_text(json.dumps(test_row) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: split 'test'"):
        read_states(p, require_split="train")


def _restore_full(out, model, dtype):
    """(trained weights, step) of a full fine-tune's latest checkpoint."""
    import optax

    from jaxdm.rl.checkpoint import Checkpointer
    tr = sft.master_weights(lora.load_model(str(model), dtype).params)
    ck = Checkpointer(out / "checkpoints")
    state, _, step = ck.restore({"trainable": tr, "opt": optax.adamw(1e-5).init(tr)})
    ck.close()
    return state["trainable"], step


def test_a_bf16_full_fine_tune_keeps_fp32_master_weights(setup):
    """lora_rank 0 with dtype bfloat16: the step runs in bf16 but AdamW updates an fp32 copy.
    One step at lr 1e-5 moves nearly every weight by about lr (Adam's first step is lr times
    the gradient's sign) in the same direction as the fp32 run; updating the bf16 weights
    themselves would have kept nearly all of them (1e-5 is below half a bf16 ulp from a
    magnitude of about 0.0026 up). The checkpoint holds the fp32 copy; the settings name it."""
    root, model, data = setup
    moved = {}
    for dtype in ("float32", "bfloat16"):
        base = lora.load_model(str(model), dtype).params
        out = f"full_{dtype}"
        sft.train(_cfg(root, model, data, out, lora_rank=0, lr=1e-5, max_steps=1,
                       dtype=dtype))
        trained, step = _restore_full(root / out, model, dtype)
        assert step == 1
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(trained))
        moved[dtype] = np.concatenate([
            (np.asarray(t) - np.asarray(b, np.float32)).ravel()
            for t, b in zip(jax.tree.leaves(trained["layers"]), jax.tree.leaves(base["layers"]))])
    changed = {d: np.abs(m) > 0.5e-5 for d, m in moved.items()}
    assert changed["float32"].mean() > 0.8  # (weights with a zero gradient stay)
    assert changed["bfloat16"].mean() > 0.95 * changed["float32"].mean()
    assert np.abs(moved["bfloat16"]).max() < 2e-5
    assert np.mean(np.sign(moved["bfloat16"]) == np.sign(moved["float32"])) > 0.8
    keys = sft._settings(_cfg(root, model, data, "x", lora_rank=0, dtype="bfloat16"), 5)
    assert keys["master_weights"] == "float32"
    assert "master_weights" not in sft._settings(_cfg(root, model, data, "x", lora_rank=0), 5)
    assert "master_weights" not in sft._settings(_cfg(root, model, data, "x",
                                                      dtype="bfloat16"), 5)


def test_a_donating_step_writes_over_its_state_and_gives_the_same_update(setup):
    """train-dm's step donates its trainable and optimiser-state buffers (no fresh pages per
    step); the update is the non-donating step's, and the donated inputs are gone."""
    root, model, data = setup
    pre = load_pretrained(model)
    states = read_states(str(data))
    batch, window, full_vocab, _ = packing.pack_items(packing.Encoder(pre, mode="readout"),
                                                      [it for s in states[:2] for it in s])
    batch = jax.tree.map(jnp.asarray, batch)
    got = {}
    for donate in (False, True):
        fn, opt = sft.train_step_fn(pre.config, None, 0.2, 1e-3, 0.0, donate=donate)
        tr = sft.master_weights(pre.params)
        ost = opt.init(tr)
        got[donate] = fn(tr, ost, pre.params, batch, window, full_vocab)
        assert all(x.is_deleted() for x in jax.tree.leaves(tr)) == donate
    for a, b in zip(jax.tree.leaves(got[False][:3]), jax.tree.leaves(got[True][:3])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not any(x.is_deleted() for x in jax.tree.leaves(pre.params))


def test_each_batch_shape_compiles_once_and_frees_the_compilers_heap(setup, monkeypatch):
    """train-dm compiles one step program per batch shape (the summary counts them) and hands
    the compiler's freed heap back to the OS before each program's first run; a second run in
    the same process reuses the programs."""
    from jaxdm.models import compile_cache
    assert compile_cache.release_freed_memory() is True  # glibc (this project's Linux)
    root, model, data = setup
    sft.train_step_fn.cache_clear()  # programs compiled by the tests above are not reused
    calls = []
    monkeypatch.setattr(compile_cache, "release_freed_memory", lambda: calls.append(1) or True)
    summary = sft.train(_cfg(root, model, data, "programs", max_steps=3, save_every=100))
    states = read_states(str(data))
    enc = packing.Encoder(load_pretrained(model), mode="readout")
    shapes = set()
    for s in range(3):
        its = [it for i in sft.batch_order(len(states), 1, 0, s) for it in states[i]]
        b, w, fv, _ = packing.pack_items(enc, its)
        shapes.add((w, fv, tuple(np.shape(x) for x in jax.tree.leaves(b))))
    assert summary["compiled_steps"] == len(shapes) == len(calls) >= 1
    calls.clear()
    again = sft.train(_cfg(root, model, data, "programs_again", max_steps=3, save_every=100))
    assert again["compiled_steps"] == len(shapes) and not calls
