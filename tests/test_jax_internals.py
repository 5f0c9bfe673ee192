"""The promises of `shapeml._jax_internals`, the one module touching JAX internals.

A JAX upgrade that breaks one of these breaks hoisting or dead-param analysis: port the adapter
until this file passes again.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from shapeml import _jax_internals as ji


def names(closed):
    return [ji.eqn_name(e) for e in closed.jaxpr.eqns]


def test_make_closed_jaxpr_and_as_fun_round_trip():
    def f(a, b):
        return jnp.sin(a) * b, a + 1.0

    a, b = jnp.arange(3.0), jnp.full(3, 2.0)
    closed = ji.make_closed_jaxpr(f, a, jax.ShapeDtypeStruct((3,), jnp.float32))
    assert len(closed.jaxpr.invars) == 2 and len(closed.jaxpr.outvars) == 2
    got = ji.as_fun(closed)(a, b)
    for g, w in zip(got, f(a, b)):
        np.testing.assert_allclose(g, w)


def test_vjp_reads_follows_nested_jaxprs():
    def f(p):
        a, b, c = p
        y = lax.cond(a.sum() > 0, lambda: a * 2.0, lambda: a)
        z = lax.scan(lambda h, x: (h + x, None), y, b)[0]
        return jnp.sum(z + lax.stop_gradient(c))

    primals = (jnp.ones(2), jnp.ones((3, 2)), jnp.ones(2))
    assert ji.vjp_reads(jax.vjp(f, primals)[1], 3) == [True, True, False]
    # a value that depends on no primal is known, not linear: nothing is read
    assert ji.vjp_reads(jax.vjp(lambda p: jnp.float32(1.0), primals)[1], 3) == [False] * 3


def test_split_known_separates_known_and_unknown():
    def f(w, x):
        return x @ (w * 2.0).T

    w, x = jnp.arange(6.0).reshape(2, 3), jnp.ones((4, 3))
    closed = ji.make_closed_jaxpr(f, w, x)
    known, unknown, out_unknowns, residuals = ji.split_known(closed, [False, True])
    assert out_unknowns == [True]
    assert "mul" in names(known) and "mul" not in names(unknown)
    res = ji.as_fun(known)(w)
    assert [r.shape for r in res] == [tuple(a.shape) for a in residuals]
    np.testing.assert_allclose(ji.as_fun(unknown)(*res, x)[0], f(w, x))


def test_is_key_dtype():
    assert ji.is_key_dtype(jax.random.key(0).dtype)
    assert not ji.is_key_dtype(jax.random.PRNGKey(0).dtype)  # raw uint32 data
    assert not ji.is_key_dtype(jnp.float32)


def test_eqn_queries():
    def f(k, x):
        jax.debug.print("x={x}", x=x)
        y = x + 1.0
        return y * jax.random.normal(k, x.shape), lax.cond(x[0] > 0, jnp.sin, jnp.cos, y)

    closed = ji.make_closed_jaxpr(f, jax.random.key(0), jnp.ones(3))
    eqns = closed.jaxpr.eqns
    by_name = {ji.eqn_name(e): e for e in eqns}
    assert ji.has_effects(by_name["debug_print"]) and not ji.has_effects(by_name["add"])
    add = by_name["add"]
    assert ji.is_literal(add.invars[1]) and not ji.is_literal(add.invars[0])
    assert ji.eqn_input_vars(add) == [add.invars[0]]
    assert not ji.is_random(add)
    assert ji.is_random(by_name["jit"])  # random bits drawn inside a nested jit
    assert len(ji.sub_jaxprs(by_name["cond"])) == 2


def test_inline_jit_removes_nested_jit_and_keeps_custom_rules():
    inner = jax.jit(lambda a: jnp.tanh(a) * 3.0)

    def f(x):
        return jax.jit(lambda a: inner(a) + jax.nn.relu(a))(x)

    x = jnp.linspace(-1.0, 1.0, 5)
    closed = ji.make_closed_jaxpr(f, x)
    assert "jit" in names(closed)
    flat = ji.inline_jit(closed)
    assert "jit" not in names(flat) and "tanh" in names(flat)
    assert "custom_jvp_call" in names(flat)
    np.testing.assert_allclose(ji.as_fun(flat)(x)[0], f(x), rtol=1e-6)


def test_inline_jit_splits_scans_over_known_operands():
    def f(stack_q, x):
        def body(h, q):
            return h @ (q.astype(jnp.float32) * 0.5), None

        return lax.scan(body, x, stack_q)[0]

    q = jax.random.randint(jax.random.key(0), (3, 4, 4), -5, 5).astype(jnp.int8)
    x = jnp.ones((2, 4))
    closed = ji.make_closed_jaxpr(f, q, x)
    split = ji.inline_jit(closed, [True, False])
    scans = [e for e in split.jaxpr.eqns if ji.eqn_name(e) == "scan"]
    assert len(scans) == 2
    # The first scan reads only the known operand and computes the dequantized stack.
    assert ji.eqn_input_vars(scans[0]) == [split.jaxpr.invars[0]]
    assert [v.aval.shape for v in scans[0].outvars] == [(3, 4, 4)]
    np.testing.assert_allclose(ji.as_fun(split)(q, x)[0], f(q, x), rtol=1e-6)
    assert names(ji.inline_jit(closed)).count("scan") == 1  # without known inputs: unchanged


def test_build_and_prune():
    def f(a, b):
        return a * 2.0, jnp.sin(b)

    closed = ji.make_closed_jaxpr(f, jnp.ones(2), jnp.ones(2))
    jx = closed.jaxpr
    first = ji.build_closed_jaxpr(jx.invars, jx.outvars[:1], jx.eqns, name="first")
    pruned, used = ji.prune(first)
    assert used == [True, False] and names(pruned) == ["mul"]
    kept, used = ji.prune(first, keep_inputs=True)
    assert len(kept.jaxpr.invars) == 2 and names(kept) == ["mul"]
    np.testing.assert_allclose(ji.as_fun(pruned)(jnp.full(2, 3.0))[0], [6.0, 6.0])


def test_sizes_and_symbolic_shapes():
    aval = jax.ShapeDtypeStruct((3, 4), jnp.float32)
    assert ji.nbytes(aval) == 48 and ji.size(aval) == 12
    (b,) = jax.export.symbolic_shape("b")
    sym = ji.make_closed_jaxpr(lambda x: x * 2.0, jax.ShapeDtypeStruct((b, 4), jnp.float32))
    v = sym.jaxpr.invars[0]
    assert not ji.is_concrete_aval(v.aval) and ji.nbytes(v.aval) == 0
    assert ji.is_concrete_aval(aval)


def test_is_tracer():
    seen = []
    jax.jit(lambda x: seen.append(ji.is_tracer(x)) or x)(jnp.ones(2))
    assert seen == [True] and not ji.is_tracer(jnp.ones(2))


def test_trace_of_tells_inner_from_outer_traces():
    seen = {}

    def f(x):
        seen["outer"] = ji.current_trace()
        seen["x"] = ji.trace_of(x)

        def body(carry, _):
            seen["inner"] = ji.current_trace()
            seen["carry"] = ji.trace_of(carry)
            seen["closed_over"] = ji.trace_of(x)
            return carry + x, None

        return lax.scan(body, x, None, length=2)[0]

    jax.make_jaxpr(f)(1.0)
    assert seen["x"] is seen["outer"]
    assert seen["closed_over"] is seen["outer"]  # an outer tracer keeps its trace inside scan
    assert seen["carry"] is seen["inner"] and seen["inner"] is not seen["outer"]
    assert ji.trace_of(jnp.ones(2)) is None


def test_dce_keeps_only_the_used_outputs_and_their_inputs():
    closed = jax.make_jaxpr(lambda a, b, c: (a * 2.0, b + c))(1.0, 2.0, 3.0)
    pruned, kept = ji.dce(closed, [False, True])
    assert kept == [False, True, True]
    assert len(pruned.jaxpr.outvars) == 1 and len(pruned.jaxpr.invars) == 2
    assert ji.as_fun(pruned)(2.0, 3.0) == [5.0]
    whole, kept_all = ji.dce(closed, [False, True], keep_inputs=True)
    assert kept_all == [True, True, True] and len(whole.jaxpr.invars) == 3


def test_trace_context_is_hashable_and_changes_with_the_settings_a_trace_reads():
    plain = ji.trace_context()
    assert hash(plain) == hash(ji.trace_context()) and plain == ji.trace_context()
    with jax.default_matmul_precision("float32"):
        assert ji.trace_context() != plain
    assert ji.trace_context() == plain
