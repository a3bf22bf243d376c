"""The memory-mapped safetensors reader behind load_params: same arrays as safetensors' own
reader, header errors named."""
from __future__ import annotations

import json
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxdm.models.loading import safetensors_views


def test_views_equal_safetensors_reader(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"w": rng.standard_normal((3, 5)).astype(np.float32),
               "h": rng.standard_normal(7).astype(np.float16),
               "b": rng.standard_normal((2, 2)).astype(ml_dtypes.bfloat16),
               "i": np.arange(4, dtype=np.int64), "empty": np.zeros((0, 3), np.float32)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    views, ref = safetensors_views(path), load_file(str(path))
    assert set(views) == set(ref)
    for name, want in ref.items():
        assert views[name].dtype == want.dtype and views[name].shape == want.shape, name
        np.testing.assert_array_equal(views[name], want)
        assert not views[name].flags.writeable


def _write(path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def test_header_errors_name_file_and_tensor(tmp_path):
    path = tmp_path / "bad.safetensors"
    _write(path, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    with pytest.raises(ValueError, match=r"bad\.safetensors: tensor 'w' .* needs 16 bytes"):
        safetensors_views(path)
    _write(path, {"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(ValueError, match=r"tensor 'w' has dtype 'C64'"):
        safetensors_views(path)
    path.write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(ValueError, match=r"bad\.safetensors: not a safetensors file"):
        safetensors_views(path)


def test_converted_params_cache(tmp_path, monkeypatch):
    import jax
    import jax.numpy as jnp

    from jaxdm.models import loading
    from jaxdm.models.decoder import param_shapes
    from jaxdm.models.presets import TINY_LLAMA
    from tests.models.helpers_models import write_tiny_tokenizer

    src, folder, cache = tmp_path / "src", tmp_path / "ckpt", tmp_path / "cache"
    src.mkdir()
    write_tiny_tokenizer(src)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda shape: rng.standard_normal(shape).astype(np.float32),
                          param_shapes(TINY_LLAMA), is_leaf=lambda x: isinstance(x, tuple))
    loading.save_pretrained(folder, params, TINY_LLAMA, source=src)
    monkeypatch.setenv(loading.PARAMS_CACHE_ENV, str(cache))
    monkeypatch.setattr(loading, "PARAMS_CACHE_MIN_BYTES", 0)
    config = loading.read_config(folder)
    for dtype in (jnp.float32, jnp.bfloat16):
        plain = loading.load_params(folder, config, dtype)  # reads only: nothing written
        assert not cache.exists() or not any(cache.iterdir())
        entry = loading.ensure_params_cache(folder, dtype)
        assert (entry / "manifest.json").exists()
        with monkeypatch.context() as m:
            m.setattr(loading, "_convert", None)  # a cache hit converts nothing
            cached = loading.load_params(folder, config, dtype)
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(cached)):
            assert a.dtype == b.dtype == dtype and a.shape == b.shape
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        (entry / "manifest.json").write_text("{")  # a broken entry: converted again
        again = loading.load_params(folder, config, dtype)
        np.testing.assert_array_equal(np.asarray(again["embed"]), np.asarray(plain["embed"]))
        for p in cache.iterdir():
            shutil.rmtree(p)
    monkeypatch.setenv(loading.PARAMS_CACHE_ENV, "off")
    assert loading.params_cache_dir() is None
    assert loading.ensure_params_cache(folder) is None
