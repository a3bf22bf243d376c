"""`jaxdm screen --judge path/to/folder`: an exported HF folder or an adapter folder (base
model + LoRA adapter, ``jaxdm.models.lora.save_adapter``) is a local_readout judge; a folder
that is neither names what is missing."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.decision.types import YesNo
from jaxdm.screen.run import ScreenError, build_judges, normalize_judge_spec
from jaxdm.models import lora
from tests.train.train_fixtures import adapter_folder as make_adapter_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("judge_folders")
    pre, hf, folder, ad, cfg = make_adapter_folder(root, seed=4, key=0, base_name="exported",
                                              name="trained_judge")
    return root, pre, hf, folder, ad, cfg


def test_adapter_folder_round_trip(folders, tmp_path):
    root, pre, hf, folder, ad, cfg = folders
    got, got_cfg, info = lora.read_adapter(folder)
    assert got_cfg == cfg and info["base"] == str(hf) and info["command"] == "test"
    for x, y in zip(jax.tree.leaves(ad), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))       # float32: exact
    loaded = lora.load_adapted(folder)
    want = lora.merge(pre.params, ad, cfg)
    for x, y in zip(jax.tree.leaves(want), jax.tree.leaves(loaded.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
    assert loaded.path == folder
    # float16 storage: a few MB instead of twice that, values within fp16 rounding.
    half = lora.save_adapter(tmp_path / "half", ad, cfg, base=str(hf), dtype="float16")
    h, _, hinfo = lora.read_adapter(half)
    assert hinfo["dtype"] == "float16"
    assert (half / "adapter.safetensors").stat().st_size < \
        0.6 * (folder / "adapter.safetensors").stat().st_size
    for x, y in zip(jax.tree.leaves(ad), jax.tree.leaves(h)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-3, atol=1e-4)


def test_folder_judges_score_and_bad_folders_are_named(folders, tmp_path):
    root, pre, hf, folder, ad, cfg = folders
    spec = normalize_judge_spec(str(folder))
    assert spec == {"kind": "local_readout", "path": str(folder), "name": "trained_judge"}
    assert normalize_judge_spec(str(hf))["name"] == "exported"
    judges = dict(build_judges([str(hf), str(folder)]))
    q = YesNo(context="The agent opened the fridge.", question="Did it make progress?")
    [base_r], [trained_r] = judges["exported"].score([q]), judges["trained_judge"].score([q])
    assert base_r.ok and trained_r.ok and 0 < base_r.score < 1 and 0 < trained_r.score < 1
    assert abs(base_r.score - trained_r.score) > 1e-4           # the adapter is applied
    # Not loadable: each missing file named.
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ScreenError, match=r"not a loadable model folder: missing "
                                          r"\['config.json', '\*.safetensors', 'tokenizer.json'\]"):
        normalize_judge_spec(str(empty))
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ScreenError, match=r"missing \['\*.safetensors', 'tokenizer.json'\]"):
        normalize_judge_spec(str(partial))
    broken = tmp_path / "broken_adapter"
    broken.mkdir()
    (broken / "adapter.json").write_text("{}")
    with pytest.raises(ScreenError, match=r"missing \['adapter.safetensors'\]"):
        normalize_judge_spec(str(broken))
    with pytest.raises(ScreenError, match="does not exist"):
        normalize_judge_spec(str(tmp_path / "nowhere" / "judge"))
    with pytest.raises(ScreenError, match="unknown judge"):
        normalize_judge_spec("nosuchalias")


def test_packaged_trained_judge_alias():
    """The demo's trained judge: an adapter folder in the package, small enough for the repo."""
    from jaxdm.judges import SMOLLM2_PROGRESS
    spec = normalize_judge_spec("smollm2-judge")
    assert spec == {"kind": "local_readout", "path": str(SMOLLM2_PROGRESS),
                    "name": "smollm2-135m-judge"}
    ad, cfg, info = lora.read_adapter(SMOLLM2_PROGRESS)
    assert info["base"] == "smollm2" and "train_judge.py" in info["command"]
    assert (SMOLLM2_PROGRESS / "adapter.safetensors").stat().st_size < 5 * 2**20
    assert all(float(jnp.max(jnp.abs(a["b"]))) > 0 for a in ad.values())     # trained: B != 0


def test_kind_specs_with_slashes_are_not_folders():
    # a 'kind:key=value' spec whose values hold a URL or a path is a backend spec, not a folder
    from jaxdm.screen.run import normalize_judge_spec
    spec = normalize_judge_spec("remote:base_url=http://127.0.0.1:9/v1,model=m")
    assert spec["kind"] == "remote" and spec["base_url"] == "http://127.0.0.1:9/v1"
    spec = normalize_judge_spec("local_likelihood:path=some/folder")
    assert spec["kind"] == "local_likelihood" and spec["path"] == "some/folder"
