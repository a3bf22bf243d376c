"""Per-device training memory of a model preset on a mesh preset (FSDP x TP), before a run.

    python experiments/mesh_memory.py --model qwen2.5-7b --mesh fsdp-tp4 --devices 16

Counts parameters, gradients and AdamW state as placed by ``jaxdm.models.sharding``'s rules
(exact shard shapes; no devices needed); activations are not included.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from jaxdm.models.presets import PRESETS, preset
from jaxdm.models.sharding import MESH_PRESETS, mesh_shape, train_memory_per_device


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, choices=sorted(PRESETS))
    ap.add_argument("--mesh", default="fsdp", choices=sorted(MESH_PRESETS))
    ap.add_argument("--devices", type=int, required=True, help="devices in the whole job")
    ap.add_argument("--dtype", default="bfloat16", help="parameter dtype")
    args = ap.parse_args(argv)
    try:
        data, model = mesh_shape(args.mesh, args.devices)
    except ValueError as e:
        ap.error(str(e))
    est = train_memory_per_device(preset(args.model).replace(dtype=args.dtype), data, model)
    gib = {k: v / 2 ** 30 for k, v in est.items()}
    print(f"{args.model} ({args.dtype}) on mesh {args.mesh} = data {data} x model {model}: per "
          f"device params {gib['params']:.2f} GiB + grads {gib['grads']:.2f} GiB + AdamW "
          f"{gib['optimizer']:.2f} GiB = {gib['total']:.2f} GiB (activations not included)")


if __name__ == "__main__":
    main()
