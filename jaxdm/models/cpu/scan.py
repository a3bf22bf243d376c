"""The decoder's layer loop on XLA:CPU: weight stacks as bit views and whole stacks for the
matmul kernel (``decoder._run_layers`` runs its layers through ``scan_layers``).

- ``scan_layers(layer, x, xs)`` is ``lax.scan`` over stacked per-layer arrays, with bf16 leaves
  crossing the loop as their uint16 bits (XLA:CPU would convert a bf16 stack it slices to fp32
  and back in every call) and ``Whole`` leaves handed to each layer unsliced, as
  ``LayerOf(stack, i)``.
- ``bit_view_layers(params)`` / ``inference_layers(params)``: params for inference on one CPU
  device, made once per model (the bits; the projections' stacks marked ``Whole`` where the
  matmul kernel, ``jaxdm.models.cpu.matmul``, is on for their dtype).
- ``LayerOf`` is what a projection then gets in place of its weight (``jaxdm.models.cpu.
  dispatch.projection`` hands it to the kernel as the stack and the layer index).

Under differentiation the plain scan over sliced float arrays runs (a custom JVP), so
gradients are ``lax.scan``'s; bf16 leaves without a tangent (a LoRA step's frozen weights)
still cross a rematerialised loop as their bits.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from jaxdm.models.cpu import matmul as cpu_matmul

# Layer-loop unrolling passed to lax.scan (1 = rolled loop, True = fully unrolled). Read at
# trace time. Measured on this 2-core CPU (SmolLM2 shape, batch-16 decode step): full unroll
# compiled 6x slower (39 s vs 6.6 s) and ran no faster, so the loop stays rolled.
SCAN_UNROLL: int | bool = 1


# Float types scanned as their bit patterns (see scan_layers; XLA:CPU keeps float16 loop
# operands as they are).
_BIT_VIEWS = {jnp.dtype(jnp.bfloat16): jnp.uint16}


@jax.tree_util.register_pytree_node_class
class BitView:
    """A bf16 array held as its uint16 bit pattern, for ``scan_layers`` (``bit_view_layers``
    makes them). Inside jit a bit cast of a bf16 argument is a copy; a BitView arrives as the
    bits already (made once per model instead of once per call)."""

    def __init__(self, bits: Any, dtype: Any):
        self.bits, self.dtype = bits, jnp.dtype(dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        """The bf16 array's shape (that of its bits)."""
        return tuple(self.bits.shape)

    def tree_flatten(self):
        """Pytree children (the uint16 bits) and aux data (the float dtype)."""
        return (self.bits,), self.dtype

    @classmethod
    def tree_unflatten(cls, dtype, children):
        """The BitView of ``tree_flatten``'s (bits,) and dtype."""
        return cls(children[0], dtype)

    def __repr__(self) -> str:
        return f"BitView({self.dtype.name}{list(self.shape)})"


def _is_view(a: Any) -> bool:
    return isinstance(a, BitView)


@jax.tree_util.register_pytree_node_class
class Whole:
    """Marks a leaf of ``scan_layers``' xs (a weight stack [L, ...], array or ``BitView``) to
    be passed to the layer whole, as ``LayerOf(stack, i)``, instead of sliced: the matmul
    kernel reads layer i in place, where XLA would copy the slice for every layer (under
    differentiation the loop slices it as usual)."""

    def __init__(self, stack: Any):
        self.stack = stack

    def tree_flatten(self):
        """Pytree children (the stack [L, ...]); no aux data."""
        return (self.stack,), None

    @classmethod
    def tree_unflatten(cls, _, children):
        """The Whole of ``tree_flatten``'s (stack,)."""
        return cls(children[0])


@jax.tree_util.register_pytree_node_class
class LayerOf:
    """Layer ``layer`` of a weight stack [L, ...] (float, or a bf16 stack's uint16 bits) that
    the layer loop left unsliced: what a projection (``dispatch.projection``) takes in place of
    the weight."""

    def __init__(self, stack: jax.Array, layer: jax.Array, dtype: Any):
        self.stack, self.layer, self.dtype = stack, layer, jnp.dtype(dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        """One layer's weight shape: the stack's [L, ...] without L."""
        return tuple(self.stack.shape[1:])

    def value(self) -> jax.Array:
        """The layer's weight (a slice: what the loop would have given)."""
        return cpu_matmul.layer_of(self.stack, self.layer)

    def tree_flatten(self):
        """Pytree children (the stack [L, ...] and the layer index, a scalar) and aux data
        (the weight's float dtype)."""
        return (self.stack, self.layer), self.dtype

    @classmethod
    def tree_unflatten(cls, dtype, children):
        """The LayerOf of ``tree_flatten``'s (stack, layer) and dtype."""
        return cls(*children, dtype)


# The layer weights every projection multiplies by (passed whole where the matmul kernel is on).
_PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


def inference_layers(params: dict[str, Any]) -> dict[str, Any]:
    """params for inference on one CPU device: ``bit_view_layers``, and the projections'
    weight stacks marked ``Whole`` where the matmul kernel is on for their dtype: each layer's
    matmuls then read the stack in place (XLA copies each layer's slice for a custom call: ~1 %
    of the fp32 readout; issue 17). Stacks spread over several devices stay as they are (the
    custom call would gather a whole stack in every layer: a sharded 6-layer forward ran 1.0 ->
    1.24 s). Forward only, as ``bit_view_layers``: differentiate the params."""
    params = bit_view_layers(params)
    if not isinstance(params, dict) or not isinstance(params.get("layers"), dict):
        return params
    layers = dict(params["layers"])
    for name in _PROJECTIONS:
        a = layers.get(name)
        arr = a.bits if _is_view(a) else a
        if (isinstance(arr, jax.Array) and len(arr.devices()) == 1
                and next(iter(arr.devices())).platform == "cpu" and len(a.shape) >= 3
                and jnp.dtype(a.dtype) in cpu_matmul.KERNELS and cpu_matmul.enabled(a.dtype)):
            layers[name] = Whole(a)
    return {**params, "layers": layers}


def _is_marked(a: Any) -> bool:
    return isinstance(a, (BitView, Whole))


def unmark_whole(xs: Any) -> Any:
    """xs with its ``Whole`` marks removed (each leaf the stack it marks): what a plain
    ``lax.scan`` over the same layers takes."""
    return jax.tree.map(lambda a: a.stack if isinstance(a, Whole) else a, xs,
                        is_leaf=lambda a: isinstance(a, Whole))


def bit_view_layers(params: dict[str, Any]) -> dict[str, Any]:
    """params with each bf16 leaf of ``params["layers"]`` as a ``BitView`` of its uint16 bits,
    for inference on CPU: the layer scan then runs on them without copying the weight stack in
    every call (SmolLM2-135M bf16, a 1,024-token forward: 223 -> 20 MiB of temporary memory;
    the time is the same within noise on 2 cores, where XLA ran the copy beside other work;
    issue 17). The bits alias the weights (no copy) where the leaf sits on one CPU device;
    other leaves are kept as they are. Forward only: a derivative with respect to a view is
    refused (its leaves are integers; differentiate the params)."""
    if not isinstance(params, dict) or not isinstance(params.get("layers"), dict):
        return params

    def view(a):
        if (not isinstance(a, jax.Array) or a.dtype not in _BIT_VIEWS
                or len(a.devices()) != 1 or next(iter(a.devices())).platform != "cpu"):
            return a
        host = np.asarray(a)  # the buffer itself on CPU (read-only)
        bits = jax.device_put(host.view(np.dtype(_BIT_VIEWS[a.dtype])), a.sharding)
        return BitView(bits, a.dtype)

    return {**params, "layers": jax.tree.map(view, params["layers"])}


def _to_bits(tree: Any) -> tuple[Any, Any]:
    """(tree with its bf16 leaves bit-cast to uint16 and its BitViews as their bits, each
    leaf's float dtype)."""
    dtypes = jax.tree.map(lambda a: jnp.dtype(a.dtype), tree, is_leaf=_is_view)
    bits = jax.tree.map(lambda a: a.bits if _is_view(a) else
                        jax.lax.bitcast_convert_type(a, _BIT_VIEWS[a.dtype])
                        if a.dtype in _BIT_VIEWS else a, tree, is_leaf=_is_view)
    return bits, dtypes


def _from_bits(tree: Any, dtypes: Any) -> Any:
    return jax.tree.map(lambda a, dt: jax.lax.bitcast_convert_type(a, dt)
                        if dt in _BIT_VIEWS else a, tree, dtypes)


def _is_zero(t: Any) -> bool:
    return isinstance(t, SymbolicZero)


def _instantiate(t: Any, primal: Any) -> Any:
    """A tangent as ``jax.jvp`` takes it: a symbolic zero as zeros (float0 for integers)."""
    if not isinstance(t, SymbolicZero):
        return t
    if not jnp.issubdtype(jnp.result_type(primal), jnp.inexact):
        return np.zeros(t.aval.shape, jax.dtypes.float0)
    return jnp.zeros(t.aval.shape, t.aval.dtype)


def _unview(tree: Any) -> Any:
    """BitViews back to their float arrays (a copy: the differentiated path only)."""
    return jax.tree.map(lambda a: jax.lax.bitcast_convert_type(a.bits, a.dtype)
                        if _is_view(a) else a, tree, is_leaf=_is_view)


def scan_layers(layer: Any, x: jax.Array, xs: Any) -> tuple[jax.Array, Any]:
    """``lax.scan(layer, x, xs)`` over stacked per-layer arrays (weights, caches).

    XLA:CPU has no bf16 dynamic-slice: it converts a bf16 array a loop slices to fp32, hoists
    that convert out of the loop and converts each slice back to bf16 for the dot. For
    SmolLM2-135M in bf16 that is the whole weight stack converted on every call plus a
    convert per layer: a 1,024-token forward's temporary memory 443 -> 241 MiB without it,
    the packed readout batch 8.95 -> 8.30 s (issue 17). So bf16
    leaves (of xs and of the per-layer outputs) cross the loop as their uint16 bit
    patterns, reinterpreted inside the body: the same numbers, no converts. xs may hold
    ``BitView`` leaves (``bit_view_layers``), which are the bits already.

    Leaves marked ``Whole`` (``inference_layers``) are not sliced: layer i gets
    ``LayerOf(stack, i)``, which ``dispatch.projection`` hands to the matmul kernel as the
    stack and the index (XLA would copy each layer's slice for the kernel: ~1 % of the fp32
    readout).

    Bit casts have no derivative and a whole stack's derivative would be a full-stack update
    per layer, so under differentiation (forward or reverse) the plain scan over sliced
    arrays runs instead (a custom JVP); fp32 inputs without ``Whole`` leaves always take it.
    There, bf16 leaves whose tangent is a symbolic zero (frozen weights) stay bits when the
    layer is one rematerialised call: the casts back run inside the remat, so the backward
    pass keeps the loop's own bit slices (cast outside it, every layer's bf16 weights would
    be stacked again as saved values, ~1.5x slower).
    """
    leaves, treedef = jax.tree.flatten(xs, is_leaf=_is_marked)
    whole = [isinstance(a, Whole) for a in leaves]
    if not any(whole) and not any(_is_view(a) or a.dtype in _BIT_VIEWS for a in leaves):
        return jax.lax.scan(layer, x, xs, unroll=SCAN_UNROLL)

    stacks = [a.stack for a, w in zip(leaves, whole) if w]
    scanned = [a for a, w in zip(leaves, whole) if not w]
    one = lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype)  # noqa: E731  a layer's slice
    aval = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731

    def layer_inputs(stacks_of, sliced):
        """xs' structure for one layer: stacks_of's items at the Whole leaves, sliced's at
        the others (both in order)."""
        st, sl = iter(stacks_of), iter(sliced)
        return jax.tree.unflatten(treedef, [next(st) if w else next(sl) for w in whole])

    # A custom_jvp function must not close over tracers: the layer is traced to a jaxpr and
    # the values it closes over (RoPE tables, masks, ...) become explicit arguments; a second
    # trace over plain slices when some leaves are Whole (the differentiated path).
    index = jax.ShapeDtypeStruct((), jnp.int32)
    fast, out_shape = jax.make_jaxpr(layer, return_shape=True)(
        x, layer_inputs([LayerOf(aval(b), index, dt) for b, dt in zip(*_to_bits(stacks))],
                        [one(a) for a in scanned]))
    plain_jaxpr = fast if not any(whole) else jax.make_jaxpr(layer)(
        x, layer_inputs([one(s) for s in stacks], [one(a) for a in scanned]))
    out_tree = jax.tree.structure(out_shape)

    def run(closed, consts, x, layer_xs):
        out = jax.core.eval_jaxpr(closed.jaxpr, consts, *jax.tree.leaves((x, layer_xs)))
        return jax.tree.unflatten(out_tree, out)

    ys_dtypes = jax.tree.map(lambda a: jnp.dtype(a.dtype), out_shape[1])
    # the layer is one rematerialised call (``jax.checkpoint``, nothing saved but its inputs)
    rematerialised = (len(plain_jaxpr.jaxpr.eqns) == 1
                      and plain_jaxpr.jaxpr.eqns[0].primitive.name in ("remat2", "checkpoint")
                      and plain_jaxpr.jaxpr.eqns[0].params.get("policy") is None)
    n_layers = (stacks[0] if stacks else scanned[0]).shape[0]

    @jax.custom_jvp
    def as_bits(x, scanned, stacks_in, consts, plain_consts):
        del plain_consts  # (the differentiated path's)
        bits, dtypes = _to_bits(scanned)
        stack_bits, stack_dtypes = _to_bits(list(stacks_in))

        def body(x, inputs):
            b, i = inputs
            layer_xs = layer_inputs([LayerOf(s, i, dt) for s, dt in zip(stack_bits, stack_dtypes)],
                                    _from_bits(b, dtypes))
            x, ys = run(fast, consts, x, layer_xs)
            return x, _to_bits(ys)[0]

        x, ys = jax.lax.scan(body, x, (bits, jnp.arange(n_layers, dtype=jnp.int32)),
                             unroll=SCAN_UNROLL)
        return x, _from_bits(ys, ys_dtypes)

    def differentiated(primals, tangents):
        """The JVP of the plain scan over sliced arrays. bf16 scanned leaves without a
        tangent (a LoRA step's frozen weights) still cross a rematerialised loop as their
        bits: sliced as bf16 arrays, XLA:CPU converted each whole stack to fp32 on every step
        (see above; a 30-layer bf16 LoRA step wrote ~424 MB of fp32 weights and then rounded
        every layer's slice back)."""
        x, scanned_in, stacks_in, _, plain_consts = primals  # (consts: the fast path's)
        frozen = [rematerialised and isinstance(t, SymbolicZero)
                  and (_is_view(a) or a.dtype in _BIT_VIEWS)
                  for a, t in zip(scanned_in, tangents[1])]
        frozen_bits, frozen_dtypes = _to_bits([a for a, f in zip(scanned_in, frozen) if f])

        def merged(live):
            """The scanned leaves in order: the live ones as given, the frozen ones' bits."""
            live, bits = iter(live), iter(frozen_bits)
            return [next(bits) if f else next(live) for f in frozen]

        def body_inputs(sliced):
            """A layer's slices, the frozen ones bit-cast back to their floats."""
            dts = iter(frozen_dtypes)
            return [jax.lax.bitcast_convert_type(a, next(dts)) if f else a
                    for a, f in zip(sliced, frozen)]

        def plain(x, live, stacks_in, plain_consts):
            """The plain scan over the live leaves, the frozen ones' bits closed over. With
            frozen leaves the bit casts join the layer's remat, so the backward pass keeps
            the loop's own slices of the bits, not every layer's bf16 weights stacked again."""
            def step(c, sl):
                return run(plain_jaxpr, plain_consts, c, layer_inputs(sl[0], body_inputs(sl[1])))

            if any(frozen):
                step = jax.checkpoint(step, prevent_cse=False)
            return jax.lax.scan(step, x, (_unview(list(stacks_in)), merged(_unview(live))),
                                unroll=SCAN_UNROLL)

        live = [a for a, f in zip(scanned_in, frozen) if not f]
        t_live = [t for t, f in zip(tangents[1], frozen) if not f]
        args = (x, live, stacks_in, plain_consts)
        t_args = (tangents[0], t_live, tangents[2], tangents[4])
        return jax.jvp(plain, args, jax.tree.map(_instantiate, t_args, args, is_leaf=_is_zero))

    as_bits.defjvp(differentiated, symbolic_zeros=True)
    return as_bits(x, scanned, stacks, tuple(fast.consts), tuple(plain_jaxpr.consts))
