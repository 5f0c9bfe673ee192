"""The one place shapeml touches JAX internals (jaxpr types, partial evaluation, DCE).

JAX changes these between minor versions (0.11 folds `ClosedJaxpr` into `Jaxpr`), so everything
else in shapeml calls the small functions here, and a JAX upgrade is ported in this file alone.
`tests/test_jax_internals.py` pins the behaviour each function promises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.extend.core as jex
from jax._src import config as _config
from jax._src import core as _core
from jax._src.array import ArrayImpl as ArrayImpl  # the concrete array type: a fast type check
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax import lax as _lax
from jax._src.pjit import jit_p as _jit_p

ClosedJaxpr = jex.ClosedJaxpr
Jaxpr = jex.Jaxpr
Literal = jex.Literal
Var = jex.Var


def make_closed_jaxpr(fn: Callable, *args) -> ClosedJaxpr:
    """Traces `fn(*args)` (args may be arrays or `jax.ShapeDtypeStruct`s) to a closed jaxpr."""
    return jax.make_jaxpr(fn)(*args)


def split_known(
    closed: ClosedJaxpr, unknowns: Sequence[bool]
) -> tuple[ClosedJaxpr, ClosedJaxpr, list[bool], list]:
    """Partial evaluation: splits `closed` into the part computable from the known inputs alone
    and the part that needs the unknown ones.

    Returns `(known, unknown, out_unknowns, residual_avals)`: `known` maps the known inputs to the
    known outputs followed by residuals; `unknown` maps residuals then unknown inputs to the
    unknown outputs (JAX's `partial_eval_jaxpr_nounits` convention).
    """
    return _pe.partial_eval_jaxpr_nounits(closed, list(unknowns), instantiate=True)


def vjp_reads(vjp_fn: Callable, n: int) -> list[bool]:
    """For each of the `n` primal leaves of `vjp_fn = jax.vjp(f, *primals)[1]`, whether its
    tangent reaches the output in `f`'s linearization (which `jax.vjp` keeps as `vjp_fn.jaxpr`).

    An output that does not depend on the primals at all is known, not linear: then nothing is
    read. If the linearization does not line up one input per leaf, every leaf counts as read.
    """
    jaxpr = vjp_fn.jaxpr
    if len(jaxpr.invars) != n:
        return [True] * n
    _, used = _pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
    return list(used)


def one_cotangent(value: jax.Array) -> jax.Array:
    """The cotangent `jax.value_and_grad` seeds a scalar's vjp with: a one, placed as it places it."""
    return _lax._one_vjp(value)


def as_fun(closed: ClosedJaxpr) -> Callable:
    """A Python callable that evaluates `closed` (flat arguments in, flat list of results out)."""
    return jex.jaxpr_as_fun(closed)


# --- walking and rebuilding jaxprs (used by shapeml.hoisting) ---------------------------------

JaxprEqn = jex.JaxprEqn

# Primitives whose results are random bits (or keys): never constant, whatever their inputs.
_RANDOM_PRIMITIVES = frozenset(
    {
        "random_seed",
        "random_bits",
        "random_split",
        "random_fold_in",
        "random_wrap",
        "random_unwrap",
        "random_clone",
        "threefry2x32",
        "rng_bit_generator",
        "rng_uniform",
    }
)


def is_key_dtype(dtype) -> bool:
    """Whether `dtype` is a typed PRNG key dtype (`key<fry>`), as made by `jax.random.key`."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def is_literal(atom) -> bool:
    """Whether a jaxpr operand is an inline literal (a constant with no producing equation)."""
    return isinstance(atom, Literal)


def eqn_name(eqn: JaxprEqn) -> str:
    """The primitive's name (`"dot_general"`, `"scan"`, ...)."""
    return eqn.primitive.name


def eqn_input_vars(eqn: JaxprEqn) -> list[Var]:
    """The equation's operands that are variables (literals dropped)."""
    return [v for v in eqn.invars if not isinstance(v, Literal)]


def sub_jaxprs(eqn: JaxprEqn) -> list[Jaxpr]:
    """The jaxprs nested in an equation's params (branches of cond, body of scan/while, ...)."""
    return list(_core.jaxprs_in_params(eqn.params))


def nbytes(aval) -> int:
    """Bytes an array of abstract value `aval` occupies (0 for tokens and other non-arrays)."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None or not _core.is_constant_shape(shape):
        return 0
    size = 1
    for d in shape:
        size *= int(d)
    return size * dtype.itemsize


def size(aval) -> int:
    """Element count of an array aval (0 when symbolic or not an array)."""
    shape = getattr(aval, "shape", None)
    if shape is None or not _core.is_constant_shape(shape):
        return 0
    n = 1
    for d in shape:
        n *= int(d)
    return n


def is_concrete_aval(aval) -> bool:
    """Whether `aval`'s shape has no symbolic dimension (as traced for `jax.export`)."""
    shape = getattr(aval, "shape", ())
    return _core.is_constant_shape(shape)


def is_random(eqn: JaxprEqn) -> bool:
    """Whether the equation draws random bits or touches a PRNG key, here or in a nested jaxpr.

    Such results must be recomputed on every call: caching them would freeze the noise.
    """
    if eqn.primitive.name in _RANDOM_PRIMITIVES:
        return True
    for v in [*eqn.invars, *eqn.outvars]:
        dtype = getattr(v.aval, "dtype", None)
        if dtype is not None and is_key_dtype(dtype):
            return True
    return any(_jaxpr_is_random(j) for j in sub_jaxprs(eqn))


def has_checks(jaxpr: Jaxpr) -> bool:
    """Whether `jaxpr` (or a jaxpr nested in it) holds a `checkify` check, debug checks included."""
    return any(
        eqn.primitive.name == "check" or any(has_checks(j) for j in sub_jaxprs(eqn))
        for eqn in jaxpr.eqns
    )


def _jaxpr_is_random(jaxpr: Jaxpr) -> bool:
    return any(is_random(e) for e in jaxpr.eqns)


def has_effects(eqn: JaxprEqn) -> bool:
    """Whether the equation has side effects (prints, callbacks, state): those run per call."""
    return bool(eqn.effects)


def inline_jit(closed: ClosedJaxpr, known_inputs: Sequence[bool] | None = None) -> ClosedJaxpr:
    """Re-traces `closed` with every nested `jax.jit` call inlined, recursively.

    Functions wrapped in `jit` (many `jax.numpy` ones, and the user's own) otherwise appear as one
    opaque equation, hiding the weight-only work inside them. Custom-derivative calls, control flow
    and remat stay single equations, so differentiating the result still uses their rules.

    With `known_inputs` (one bool per input), a `scan` whose operands are partly known, which
    draws no random bits and has no side effects, is also split by JAX's partial evaluation into
    a scan over the known operands (producing its residuals, e.g. per-layer dequantized weights)
    followed by a scan over the rest, so the known part can be computed outside the loop; and a
    `custom_jvp` call whose operands are partly known is inlined (its function is what runs when
    nothing differentiates it, and hoisting steps aside under differentiation), so the weight-only
    work inside it (a LoRA layer's merged weight, `dense`'s transposes) is found.
    """
    split_scans = known_inputs is not None
    known_inputs = list(known_inputs) if split_scans else [False] * len(closed.jaxpr.invars)

    def run(jaxpr: Jaxpr, consts, args, known_args):
        env: dict = {}
        known: dict = {}

        def read(a):
            return a.val if isinstance(a, Literal) else env[a]

        def is_known(a):
            return isinstance(a, Literal) or known[a]

        for v, x in zip(jaxpr.constvars, consts):
            env[v], known[v] = x, True
        for v, x, k in zip(jaxpr.invars, args, known_args):
            env[v], known[v] = x, k
        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            ins_known = [is_known(a) for a in eqn.invars]
            pure = not has_effects(eqn) and not is_random(eqn)
            if eqn.primitive is _jit_p:
                inner = eqn.params["jaxpr"]
                outs, outs_known = run(inner.jaxpr, inner.consts, ins, ins_known)
            elif (
                split_scans
                and pure
                and eqn.primitive.name == "custom_jvp_call"
                and any(ins_known)
                and not all(ins_known)
            ):
                # Its function is what runs undifferentiated (a LoRA layer's merged product):
                # inlined, its weight-only part is found like any other.
                inner = eqn.params["call_jaxpr"]
                outs, outs_known = run(inner.jaxpr, inner.consts, ins, ins_known)
            elif (
                split_scans
                and pure
                and eqn.primitive.name == "scan"
                and any(ins_known)
                and not all(ins_known)
            ):
                outs = _split_scan(eqn, ins, ins_known)
                outs_known = [False] * len(outs)
            else:
                params = eqn.primitive.get_bind_params(eqn.params)
                with eqn.ctx.manager:
                    outs = eqn.primitive.bind(*ins, **params)
                if not eqn.primitive.multiple_results:
                    outs = [outs]
                outs_known = [pure and all(ins_known)] * len(outs)
            for v, x, k in zip(eqn.outvars, outs, outs_known):
                env[v], known[v] = x, k
        return [read(a) for a in jaxpr.outvars], [is_known(a) for a in jaxpr.outvars]

    avals = [v.aval for v in closed.jaxpr.invars]
    return jax.make_jaxpr(lambda *args: run(closed.jaxpr, closed.consts, args, known_inputs)[0])(
        *avals
    )


def _split_scan(eqn: JaxprEqn, ins: list, ins_known: list[bool]) -> list:
    """Binds `eqn` (a scan) as a known scan producing residuals, then an unknown scan."""
    operands, flags, values, seen = [], [], [], set()
    for a, x, k in zip(eqn.invars, ins, ins_known):
        if isinstance(a, Literal) or a in seen:
            continue
        seen.add(a)
        operands.append(a)
        flags.append(k)
        values.append(x)
    one = build_closed_jaxpr(operands, eqn.outvars, [eqn], name="scan")
    known, unknown, _, _ = split_known(one, [not k for k in flags])
    residuals = as_fun(known)(*[x for x, k in zip(values, flags) if k])
    return as_fun(unknown)(*residuals, *[x for x, k in zip(values, flags) if not k])


def build_closed_jaxpr(
    invars: Sequence[Var],
    outvars: Sequence,
    eqns: Sequence[JaxprEqn],
    constvars: Sequence[Var] = (),
    consts: Sequence = (),
    name: str = "split",
) -> ClosedJaxpr:
    """A closed jaxpr from parts of other jaxprs (the same `Var` objects may appear in several);
    `name` is what JAX's messages call it."""
    effects = _core.join_effects(*(e.effects for e in eqns))
    info = _core.DebugInfo("hoist", name, ("",) * len(invars), ("",) * len(outvars))
    jaxpr = Jaxpr(list(constvars), list(invars), list(outvars), list(eqns), effects, info)
    return ClosedJaxpr(jaxpr, list(consts))


def prune(closed: ClosedJaxpr, keep_inputs: bool = False) -> tuple[ClosedJaxpr, list[bool]]:
    """Dead-code elimination keeping every output; returns the pruned jaxpr and, per input,
    whether it is still used. With `keep_inputs`, unused inputs stay in the signature."""
    jaxpr, used = _pe.dce_jaxpr(closed.jaxpr, True, instantiate=keep_inputs)
    return ClosedJaxpr(jaxpr, closed.consts), list(used)


def is_tracer(x) -> bool:
    """Whether `x` is an abstract value being traced (under an outer jit, grad, vmap, ...)."""
    return isinstance(x, _core.Tracer)


def backend_started() -> bool:
    """Whether JAX has created its backends (after which XLA_FLAGS no longer take effect)."""
    from jax._src import xla_bridge

    return bool(xla_bridge._backends)


def cluster_detected() -> bool:
    """Whether `jax.distributed.initialize()` would find a cluster's settings in the environment
    (SLURM, Open MPI, Kubernetes, Cloud TPU, ...), without starting anything."""
    import warnings

    from jax._src import clusters

    envs = clusters.ClusterEnv._cluster_types  # as JAX's own detection: opt-in methods skipped
    # A probe, not a join: in a Kubernetes pod without the `kubernetes` package JAX's check warns
    # (and finds no cluster); a lone script there is a single process, silently.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return any(not env.opt_in_only_method and env.is_env_present() for env in envs)


def distributed_client_started() -> bool:
    """Whether this process has joined a job through `jax.distributed.initialize`."""
    from jax._src import distributed

    return distributed.global_state.client is not None


def compiled_count(jitted: Callable) -> int:
    """How many programs a `jax.jit`-wrapped function has compiled so far."""
    return jitted._cache_size()


def trace_context() -> tuple:
    """The JAX settings a trace depends on (x64, matmul precision, ...), hashable: `jax.jit`'s
    own cache key part."""
    return _config.trace_context()


def current_trace():
    """What JAX records operations into now: an opaque object, compared with `is` to
    `trace_of(x)` (the eager evaluator outside every transformation)."""
    return _core.unsafe_get_current_trace()


def trace_of(x):
    """The trace a tracer belongs to (as `current_trace()` returns it); None for a concrete value.

    A tracer of an outer trace used inside `lax.scan`, `vmap` or a nested `jit` keeps its outer
    trace; the values computed inside have the inner one.
    """
    return x._trace if isinstance(x, _core.Tracer) else None


def dce(
    closed: ClosedJaxpr, used_outputs: Sequence[bool], *, keep_inputs: bool = False
) -> tuple[ClosedJaxpr, list[bool]]:
    """Dead-code elimination to the used outputs alone: the pruned jaxpr (only those outputs, and
    only the inputs they depend on unless `keep_inputs`) and, per input, whether it was kept."""
    jaxpr, used = _pe.dce_jaxpr(closed.jaxpr, list(used_outputs), instantiate=keep_inputs)
    return ClosedJaxpr(jaxpr, closed.consts), list(used)


def _client():
    from jax._src import distributed

    return distributed.global_state.client


def barrier(name: str, timeout_s: float) -> None:
    """Waits until every process of the job reaches the barrier `name` (JAX's coordination
    service); raises JAX's runtime error after `timeout_s` seconds."""
    _client().wait_at_barrier(name, int(timeout_s * 1000))


def kv_set(key: str, value: str) -> None:
    """Sets `key` in the job's key-value store (the coordination service)."""
    _client().key_value_set(key, value)


def kv_get(key: str, timeout_s: float) -> str:
    """The value of `key` in the job's key-value store, waiting for it up to `timeout_s`."""
    return _client().blocking_key_value_get(key, int(timeout_s * 1000))
