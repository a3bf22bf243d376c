"""Loading HF-layout checkpoint folders (config.json + safetensors + tokenizer.json).

The HF-name -> internal-path mapping is the table `HF_PARAM_TABLE` (data, not code); the
decoder never sees HF names. Safetensors only: pickle weights (.bin/.pt) are refused.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import mmap
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from jaxdm.models.compile_cache import OFF_VALUES
from jaxdm.models.config import ModelConfig
from jaxdm.models.decoder import Params, param_shapes
from jaxdm.models.paths import cache_root
from jaxdm.models.tokenizer import FastTokenizer

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
    """One HF tensor in the internal layout: "copy" and "same" reshape it to ``internal_shape``,
    "linear" ([out, in]) is transposed first so the input axes lead."""
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


def load_params(folder: str | Path, config: ModelConfig, dtype: Any = jnp.float32, *,
                write_cache: bool = False) -> Params:
    """Reads the safetensors weights of an HF folder into the internal params pytree.

    From the converted-params cache when it holds this checkpoint (see ``params_cache_dir``;
    ``write_cache=True`` or ``ensure_params_cache`` fills it). Otherwise the files are
    memory-mapped; each tensor is copied once, transposed and cast, into its slot of the
    internal arrays (layers stacked, aligned host memory). The tree goes to the device in one
    ``device_put`` (no further copy on CPU)."""
    folder = Path(folder)
    files, weight_map = _weight_files(folder)
    expected = param_shapes(config)
    np_dtype = np.dtype(jnp.dtype(dtype))
    entry = _params_cache_entry(files, config, expected, np_dtype)
    if entry is not None:
        cached = _read_cached(entry, expected, np_dtype)
        if cached is not None:
            return jax.device_put(cached)
    out = _convert(folder, files, weight_map, config, expected, np_dtype)
    if entry is not None and write_cache:
        _write_cached(entry, out)
    return jax.device_put(out)


def ensure_params_cache(folder: str | Path, dtype: Any = jnp.float32) -> Path | None:
    """Fills the converted-params cache for an HF folder (a setup step: writing ~0.5 GB of
    fresh files took 1-10 s on this project's loaded VMs, more than a conversion, so ordinary
    loads only read the cache). Returns the entry, or None when the cache is disabled or the
    checkpoint is too small to be cached."""
    folder = Path(folder)
    config = read_config(folder, dtype)
    files, _ = _weight_files(folder)
    np_dtype = np.dtype(jnp.dtype(dtype))
    expected = param_shapes(config)
    entry = _params_cache_entry(files, config, expected, np_dtype)
    if entry is not None and _read_cached(entry, expected, np_dtype) is None:
        load_params(folder, config, dtype, write_cache=True)
    return entry


def _convert(folder: Path, files: list[Path], weight_map: dict[str, str] | None,
             config: ModelConfig, expected: dict, np_dtype: np.dtype) -> Params:
    """The safetensors tensors in the internal layout (host numpy arrays)."""
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
    return out


# The converted-params cache: the internal arrays of a large checkpoint (transposed, stacked,
# cast) as .npy files, memory-mapped copy-on-write on the next load (page-aligned, so the CPU
# device_put aliases them: no conversion and no copy). Keyed by the source files' paths, sizes
# and modification times, the config and the dtype.
PARAMS_CACHE_ENV = "JAXDM_PARAMS_CACHE"
PARAMS_CACHE_MIN_BYTES = 64 << 20  # small checkpoints convert in well under a second
PARAMS_CACHE_KEEP = 4  # entries kept (least recently used removed)
_PARAMS_CACHE_VERSION = 1


def params_cache_dir() -> Path | None:
    """Where converted params are cached: ``$JAXDM_PARAMS_CACHE`` (``0``/``off``/``false``/
    ``no``: disabled), else ``<jaxdm cache>/params`` (see ``jaxdm.models.paths.cache_root``)."""
    value = os.environ.get(PARAMS_CACHE_ENV, "").strip()
    if value.lower() in OFF_VALUES:
        return None
    if value:
        return Path(value).expanduser()

    return cache_root() / "params"


def _params_cache_entry(files: list[Path], config: ModelConfig, expected: dict,
                        np_dtype: np.dtype) -> Path | None:
    root = params_cache_dir()
    if root is None:
        return None
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    if sum(st[1] for st in stats) < PARAMS_CACHE_MIN_BYTES:
        return None
    # What the conversion depends on: the files, the internal shapes (which tensors exist),
    # tied embeddings and the dtype (not the config's compute settings).
    key = json.dumps([_PARAMS_CACHE_VERSION, stats, sorted(_leaves(expected)),
                      config.tie_embeddings, np_dtype.name])
    return root / hashlib.sha256(key.encode()).hexdigest()[:32]


def _leaves(params: Params):
    for key, value in params.items():
        if key == "layers":
            for leaf, arr in value.items():
                yield f"layers/{leaf}", arr
        else:
            yield key, value


def _read_cached(entry: Path, expected: dict, np_dtype: np.dtype) -> Params | None:
    """The cached arrays (memory-mapped copy-on-write), or None when the entry is missing or
    does not match ``expected`` (then the checkpoint is converted again)."""
    manifest = entry / "manifest.json"
    if not manifest.exists():
        return None
    try:
        names = json.loads(manifest.read_text())["leaves"]
        out: Params = {"layers": {}}
        for i, name in enumerate(names):
            arr = np.load(entry / f"{i}.npy", mmap_mode="c")
            if np_dtype.name == "bfloat16" and arr.dtype == np.uint16:
                arr = arr.view(np_dtype)
            group, _, leaf = name.rpartition("/")
            want = expected[group][leaf] if group else expected[leaf]
            if arr.dtype != np_dtype or tuple(arr.shape) != tuple(want):
                return None
            (out["layers"] if group else out)[leaf] = arr
        if {k for k, _ in _leaves(out)} != {k for k, _ in _leaves(expected)}:
            return None
        os.utime(manifest)  # recency for the eviction
        return out
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None


def _write_cached(entry: Path, params: Params) -> None:
    """Writes the entry under a temporary name and renames it (safe across processes); a
    failure to write only costs the next load a conversion. Keeps the newest entries."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
        try:
            names = []
            for i, (name, arr) in enumerate(_leaves(params)):
                if arr.dtype.name == "bfloat16":
                    arr = arr.view(np.uint16)  # .npy has no bfloat16; the manifest's dtype does
                np.save(tmp / f"{i}.npy", arr)
                names.append(name)
            (tmp / "manifest.json").write_text(json.dumps({"leaves": names}))
            os.chmod(tmp, 0o755)
            try:
                os.rename(tmp, entry)
            except OSError:
                if not (entry / "manifest.json").exists():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        entries = sorted((p for p in entry.parent.iterdir() if (p / "manifest.json").exists()),
                         key=lambda p: (p / "manifest.json").stat().st_mtime, reverse=True)
        for old in entries[PARAMS_CACHE_KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as err:
        warnings.warn(f"could not write the converted-params cache {entry} ({err}); set "
                      f"{PARAMS_CACHE_ENV} to another folder or to 0 to disable it",
                      stacklevel=3)


def load_tokenizer(folder: str | Path):
    """The tokenizer of tokenizer.json (+ tokenizer_config.json, chat template).

    ``jaxdm.models.tokenizer.FastTokenizer`` (the `tokenizers` library, no transformers
    import; transformers' ids and text) when the folder's tokenizer_config.json only uses
    settings it reproduces, else transformers' ``PreTrainedTokenizerFast``."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").exists():
        raise FileNotFoundError(f"{folder}: missing tokenizer.json (pass tokenizer=False to "
                                "load weights without a tokenizer)")
    template = read_chat_template(folder)
    if FastTokenizer.supports(folder):
        return FastTokenizer(folder, chat_template=template)
    from transformers import PreTrainedTokenizerFast  # why: ~0.5 s, the fallback only

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
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
    """The ModelConfig of an HF folder's config.json, with parameters of ``dtype``; a missing file
    is a FileNotFoundError, bad JSON a ValueError naming the path."""
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
