"""Loading HF-layout checkpoint folders (config.json + safetensors + tokenizer.json).

The HF-name -> internal-path mapping is the table `HF_PARAM_TABLE` (data, not code); the
decoder never sees HF names. Safetensors only: pickle weights (.bin/.pt) are refused.
"""
from __future__ import annotations

import dataclasses
import json
import math
import mmap
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.models.config import ModelConfig
from jaxdm.models.decoder import Params, param_shapes

# (HF tensor name template, internal key, kind, split). "{i}" is the layer index; internal keys
# under "layers/" are stacked over layers. kind "linear": HF stores [out, in]; the internal
# array is hf.T reshaped so its first `split` axes are the input axes. kind "copy": the HF
# vector reshaped (biases [N*H] -> [N, H]). kind "same": identical layout.
HF_PARAM_TABLE: tuple[tuple[str, str, str, int], ...] = (
    ("model.embed_tokens.weight", "embed", "same", 0),
    ("model.norm.weight", "final_norm", "copy", 0),
    ("lm_head.weight", "lm_head", "linear", 1),
    ("model.layers.{i}.input_layernorm.weight", "layers/attn_norm", "copy", 0),
    ("model.layers.{i}.self_attn.q_proj.weight", "layers/q", "linear", 1),
    ("model.layers.{i}.self_attn.k_proj.weight", "layers/k", "linear", 1),
    ("model.layers.{i}.self_attn.v_proj.weight", "layers/v", "linear", 1),
    ("model.layers.{i}.self_attn.o_proj.weight", "layers/o", "linear", 2),
    ("model.layers.{i}.self_attn.q_proj.bias", "layers/q_bias", "copy", 0),
    ("model.layers.{i}.self_attn.k_proj.bias", "layers/k_bias", "copy", 0),
    ("model.layers.{i}.self_attn.v_proj.bias", "layers/v_bias", "copy", 0),
    ("model.layers.{i}.self_attn.o_proj.bias", "layers/o_bias", "copy", 0),
    ("model.layers.{i}.self_attn.q_norm.weight", "layers/q_norm", "copy", 0),
    ("model.layers.{i}.self_attn.k_norm.weight", "layers/k_norm", "copy", 0),
    ("model.layers.{i}.post_attention_layernorm.weight", "layers/mlp_norm", "copy", 0),
    ("model.layers.{i}.mlp.gate_proj.weight", "layers/gate", "linear", 1),
    ("model.layers.{i}.mlp.up_proj.weight", "layers/up", "linear", 1),
    ("model.layers.{i}.mlp.down_proj.weight", "layers/down", "linear", 1),
    ("model.layers.{i}.mlp.gate_proj.bias", "layers/gate_bias", "copy", 0),
    ("model.layers.{i}.mlp.up_proj.bias", "layers/up_bias", "copy", 0),
    ("model.layers.{i}.mlp.down_proj.bias", "layers/down_bias", "copy", 0),
)
# Tensors that carry no parameters (buffers some exporters save).
IGNORED_TENSORS = (re.compile(r".*rotary_emb\.inv_freq$"),)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

_COMPILED = [(re.compile("^" + re.escape(t).replace(r"\{i\}", r"(\d+)") + "$"), t, key, kind,
              split) for t, key, kind, split in HF_PARAM_TABLE]


@dataclasses.dataclass
class Pretrained:
    """A loaded checkpoint: params pytree, config, tokenizer (or None) and chat template."""

    params: Params
    config: ModelConfig
    tokenizer: Any
    chat_template: str | None
    path: Path

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: config eos ids plus the tokenizer's eos token."""
        ids = list(self.config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        return tuple(dict.fromkeys(ids))


def hf_shape(internal_shape: tuple[int, ...], kind: str, split: int) -> tuple[int, ...]:
    """The HF tensor shape that maps to one layer's internal shape."""
    if kind == "same":
        return internal_shape
    if kind == "copy":
        return (math.prod(internal_shape),)
    return (math.prod(internal_shape[split:]), math.prod(internal_shape[:split]))


def to_internal(array: np.ndarray, internal_shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind in ("copy", "same"):
        return array.reshape(internal_shape)
    return array.T.reshape(internal_shape)


def to_hf(array: np.ndarray, kind: str, split: int) -> np.ndarray:
    """Inverse of to_internal: one layer's internal array -> the HF tensor."""
    if kind == "same":
        return array
    if kind == "copy":
        return array.reshape(-1)
    shape = array.shape
    return np.ascontiguousarray(
        array.reshape(math.prod(shape[:split]), math.prod(shape[split:])).T)


def params_to_hf(params: Params, config: ModelConfig) -> dict[str, np.ndarray]:
    """Internal params -> {HF tensor name: numpy array} (for writing safetensors)."""
    out: dict[str, np.ndarray] = {}
    for template, key, kind, split in HF_PARAM_TABLE:
        if key.startswith("layers/"):
            stacked = params["layers"].get(key.split("/", 1)[1])
            if stacked is None:
                continue
            stacked = np.asarray(stacked)
            for i in range(config.num_layers):
                out[template.format(i=i)] = to_hf(stacked[i], kind, split)
        elif key in params:
            out[template] = to_hf(np.asarray(params[key]), kind, split)
    return out


def _weight_files(folder: Path) -> tuple[list[Path], dict[str, str] | None]:
    """Safetensors files of a folder (and the index's weight map when sharded)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise ValueError(f"{index}: not a safetensors index (needs key 'weight_map'): "
                             f"{err}") from err
        files = sorted({folder / name for name in weight_map.values()})
        for f in files:
            if not f.exists():
                raise FileNotFoundError(f"{index} names shard {f.name}, which does not exist "
                                        f"in {folder}")
        return files, weight_map
    single = folder / "model.safetensors"
    if single.exists():
        return [single], None
    others = sorted(folder.glob("*.safetensors"))
    if others:
        return others, None
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{folder}: only pickle weights found ({', '.join(pickles)}); jaxdm loads "
            "safetensors only and never unpickles. Re-save the model with "
            "save_pretrained(safe_serialization=True).")
    raise FileNotFoundError(f"{folder}: no model.safetensors, model.safetensors.index.json or "
                            "*.safetensors file")


# safetensors dtype names -> numpy dtypes (bfloat16 through ml_dtypes, which jax ships).
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
                       "U8": "uint8", "BOOL": "bool"}


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def safetensors_views(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file as a read-only numpy view of a memory map of the file
    (no copy: pages are read when a view is first used). The header is checked: its size, each
    tensor's dtype, and that each tensor's byte range matches its shape and lies in the file."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > size - 8:
            raise ValueError(f"{path}: not a safetensors file (header length {n}, file size "
                             f"{size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: safetensors header is not valid JSON: {err}") from err
    if not isinstance(header, dict):
        raise ValueError(f"{path}: safetensors header is not a JSON object")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if size > 8 + n else \
        np.zeros(0, np.uint8)
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_name, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError) as err:
            raise ValueError(f"{path}: tensor {name!r}: header entry {info!r} lacks dtype, shape "
                             f"or data_offsets") from err
        if dtype_name not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype_name!r}; supported: "
                             f"{sorted(_SAFETENSORS_DTYPES)}")
        dtype = _np_dtype(_SAFETENSORS_DTYPES[dtype_name])
        shape = tuple(int(d) for d in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if not 0 <= begin <= end <= data.size or end - begin != nbytes:
            raise ValueError(f"{path}: tensor {name!r} (shape {shape}, {dtype_name}) has byte "
                             f"range [{begin}, {end}) but needs {nbytes} bytes within the "
                             f"{data.size}-byte data section")
        out[name] = np.frombuffer(data, dtype, math.prod(shape), begin).reshape(shape)
    return out


def _read_tensors(files: list[Path], weight_map: dict[str, str] | None):
    """Yields (name, numpy view, file) for every tensor of every file (memory-mapped, no copy)."""
    for path in files:
        views = safetensors_views(path)
        for name, array in views.items():
            if weight_map is not None and weight_map.get(name) != path.name:
                continue
            yield name, array, path
        if weight_map is not None:
            for name, fname in weight_map.items():
                if fname == path.name and name not in views:
                    raise ValueError(f"tensor {name!r} is listed in model.safetensors.index.json "
                                     f"under {fname} but is not in that file")


def _copy_internal(dest: np.ndarray, array: np.ndarray, kind: str, split: int) -> None:
    """Writes one HF tensor into its internal slot ``dest`` (transpose and dtype cast in one
    strided copy)."""
    if kind == "linear":
        rows = math.prod(dest.shape[:split])
        np.copyto(dest.reshape(rows, -1), array.T, casting="unsafe")
    else:
        np.copyto(dest.reshape(array.shape), array, casting="unsafe")


class _HostArena:
    """Host arrays for the loaded params, carved from one anonymous memory map: page-aligned
    (so a CPU ``device_put`` aliases them instead of copying: XLA:CPU needs 64-byte alignment)
    and without numpy's transparent-huge-page advice for large arrays (on this project's VMs a
    hugepage-advised first touch cost ~4x the plain one)."""

    ALIGN = 64

    def __init__(self, shapes: list[tuple[int, ...]], dtype: np.dtype):
        self._dtype = dtype
        sizes = [-(-math.prod(s) * dtype.itemsize // self.ALIGN) * self.ALIGN for s in shapes]
        self._buffer = mmap.mmap(-1, max(sum(sizes), 1))
        self._offset = 0

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        n = math.prod(shape)
        out = np.frombuffer(self._buffer, self._dtype, n, self._offset).reshape(shape)
        self._offset += -(-n * self._dtype.itemsize // self.ALIGN) * self.ALIGN
        return out


def load_params(folder: str | Path, config: ModelConfig, dtype: Any = jnp.float32) -> Params:
    """Reads the safetensors weights of an HF folder into the internal params pytree.

    The files are memory-mapped; each tensor is copied once, transposed and cast, into its
    slot of the internal arrays (layers stacked, aligned host memory), and the tree goes to
    the device in one ``device_put`` (no further copy on CPU)."""
    folder = Path(folder)
    files, weight_map = _weight_files(folder)
    expected = param_shapes(config)
    np_dtype = np.dtype(jnp.dtype(dtype))
    arena = _HostArena([tuple(s) for k, s in expected.items() if k != "layers"]
                       + [tuple(s) for s in expected["layers"].values()], np_dtype)
    layers_expected = expected["layers"]
    out: Params = {"layers": {}}
    filled: dict[str, np.ndarray] = {}
    seen: dict[str, np.ndarray] = {}
    for name, array, path in _read_tensors(files, weight_map):
        match = None
        for regex, template, key, kind, split in _COMPILED:
            m = regex.match(name)
            if m:
                match = (m, template, key, kind, split)
                break
        if match is None:
            if any(p.match(name) for p in IGNORED_TENSORS):
                continue
            raise ValueError(f"{path.name}: unexpected tensor {name!r} (not in the "
                             f"{config.architecture} parameter table)")
        m, template, key, kind, split = match
        if key == "lm_head" and config.tie_embeddings:
            continue  # tied: the embedding table is the head
        if key.startswith("layers/"):
            leaf = key.split("/", 1)[1]
            if leaf not in layers_expected:
                raise ValueError(f"{path.name}: tensor {name!r} is not used by this config "
                                 f"({config.architecture}: qkv_bias={config.qkv_bias}, "
                                 f"o_bias={config.o_bias}, mlp_bias={config.mlp_bias}, "
                                 f"qk_norm={config.qk_norm})")
            layer = int(m.group(1))
            if layer >= config.num_layers:
                raise ValueError(f"{path.name}: tensor {name!r} has layer index {layer} but "
                                 f"config.json says num_hidden_layers={config.num_layers}")
            internal = tuple(layers_expected[leaf][1:])
        else:
            if key not in expected:
                raise ValueError(f"{path.name}: tensor {name!r} is not used by this config")
            internal = tuple(expected[key])
        want = hf_shape(internal, kind, split)
        if tuple(array.shape) != want:
            raise ValueError(f"{path.name}: tensor {name!r} has shape {tuple(array.shape)}, "
                             f"expected {want} from config.json")
        if key.startswith("layers/"):
            if leaf not in filled:
                filled[leaf] = arena.empty((config.num_layers,) + internal)
                seen[leaf] = np.zeros(config.num_layers, bool)
            _copy_internal(filled[leaf][layer], array, kind, split)
            seen[leaf][layer] = True
        else:
            out[key] = arena.empty(internal)
            _copy_internal(out[key], array, kind, split)
    templates = {key: template for template, key, _, _ in HF_PARAM_TABLE}
    for key in expected:
        if key != "layers" and key not in out:
            raise ValueError(f"{folder}: missing tensor {templates[key]!r} in the safetensors "
                             "weights")
    for leaf in layers_expected:
        done = seen.get(leaf)
        if done is None or not done.all():
            layer = 0 if done is None else int(np.argmin(done))
            name = templates["layers/" + leaf].format(i=layer)
            raise ValueError(f"{folder}: missing tensor {name!r} in the safetensors weights")
        out["layers"][leaf] = filled[leaf]
    return jax.device_put(out)


def load_tokenizer(folder: str | Path):
    """transformers fast tokenizer from tokenizer.json (+ tokenizer_config.json, chat template)."""
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    if not (folder / "tokenizer.json").exists():
        raise FileNotFoundError(f"{folder}: missing tokenizer.json (pass tokenizer=False to "
                                "load weights without a tokenizer)")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    template = read_chat_template(folder)
    if template is not None and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = template
    return tokenizer


def read_chat_template(folder: Path) -> str | None:
    """The chat template from chat_template.jinja or tokenizer_config.json, if any."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    config_path = folder / "tokenizer_config.json"
    if config_path.exists():
        template = json.loads(config_path.read_text()).get("chat_template")
        if isinstance(template, str):
            return template
    return None


def read_config(folder: str | Path, dtype: Any = jnp.float32) -> ModelConfig:
    folder = Path(folder)
    path = folder / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{folder}: missing config.json")
    try:
        hf = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON: {err}") from err
    return ModelConfig.from_hf_dict(hf, path=str(path), dtype=jnp.dtype(dtype).name)


def load_pretrained(path: str | Path, dtype: Any = jnp.float32, *,
                    tokenizer: bool = True) -> Pretrained:
    """Loads an HF folder: config.json, safetensors weights, tokenizer.json and chat template."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"load_pretrained: {folder} is not a directory")
    config = read_config(folder, dtype)
    tok = load_tokenizer(folder) if tokenizer else None
    params = load_params(folder, config, dtype)
    return Pretrained(params=params, config=config, tokenizer=tok,
                      chat_template=read_chat_template(folder), path=folder)


# Tokenizer / chat files an exported folder carries over from the source checkpoint.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json", "tokenizer.model")


def save_pretrained(folder: str | Path, params: Params, config: ModelConfig, *,
                    tokenizer: Any = None, source: str | Path | None = None) -> Path:
    """Writes an HF folder (config.json, model.safetensors, tokenizer files) that
    ``load_pretrained`` and transformers both load. Tokenizer files are copied from ``source``
    (an HF folder) when it has them, else written by ``tokenizer.save_pretrained``. The
    folder is built under a temporary name and renamed when complete."""
    import shutil

    from safetensors.numpy import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    hf = config.to_hf_dict()
    (tmp / "config.json").write_text(json.dumps(hf, indent=2), encoding="utf-8")
    tensors = {k: np.ascontiguousarray(np.asarray(v, dtype=np.float32))
               for k, v in params_to_hf(params, config).items()}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    copied = []
    if source is not None:
        for name in TOKENIZER_FILES:
            if (Path(source) / name).is_file():
                shutil.copy2(Path(source) / name, tmp / name)
                copied.append(name)
    if "tokenizer.json" not in copied:
        if tokenizer is None:
            raise ValueError(f"save_pretrained: no tokenizer files in {source} and no "
                             "tokenizer given")
        tokenizer.save_pretrained(str(tmp))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder
