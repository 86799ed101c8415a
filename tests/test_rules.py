"""Golden tests: each rule printed in factor notation, as Shardy's registry tests do."""

import ast
import pathlib
import warnings

import jax
import jax.numpy as jnp
import pytest
from rule_examples import example

from partir.ir import rules
from partir.ir.program import trace
from partir.ir.propagate import attach_rules
from partir.ir.rules import RULES, UnknownPrimitiveWarning, rule_for

S = jax.ShapeDtypeStruct
f32 = jnp.float32


def rules_of(fn, *args) -> list[str]:
    prog = trace(fn, args)
    attach_rules(prog)
    return [f"{op.primitive} {op.rule}" for op in prog.ops]


def _literal(name: str) -> list[str]:
    """The string keys (dict) or items (list, tuple) of the module-level literal `name` in
    partir/ir/rules.py, in the order they are written."""
    tree = ast.parse(pathlib.Path(rules.__file__).read_text())
    for node in tree.body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if isinstance(target, ast.Name) and target.id == name:
            value = node.value
            items = value.keys if isinstance(value, ast.Dict) else value.elts
            return [ast.literal_eval(k) for k in items]
    raise AssertionError(f"no literal {name} in {rules.__file__}")


@pytest.mark.parametrize("name", ["RULES", "POINTWISE"])
def test_table_is_written_in_alphabetical_order(name):
    written = _literal(name)
    assert len(written) > 10
    out_of_order = [(a, b) for a, b in zip(written, written[1:]) if a >= b]
    assert not out_of_order, f"{name} out of order at {out_of_order}"


def test_the_table_is_the_written_rules_and_the_pointwise_primitives():
    assert set(RULES) == set(_literal("RULES")) | set(_literal("POINTWISE"))


GOLDEN = pathlib.Path(__file__).parent / "data" / "rules.txt"


def _golden() -> dict[str, str]:
    lines = GOLDEN.read_text().splitlines()
    out = dict(line.split(" ", 1) for line in lines)
    assert len(out) == len(lines), "a primitive has two golden lines"
    return out


def test_every_primitive_of_the_table_has_one_golden_text():
    golden = _golden()
    assert sorted(set(RULES) - set(golden)) == [], "add a line to tests/data/rules.txt"
    assert sorted(set(golden) - set(RULES)) == [], "a golden line for no rule of the table"


@pytest.mark.parametrize("primitive", sorted(RULES))
def test_golden_text(primitive):
    ins, outs, params = example(primitive)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a rule that fails on its example is not pinned
        rule = rule_for(primitive, ins, outs, params)
    assert str(rule) == _golden()[primitive]


@pytest.mark.parametrize(
    "fn, args, expected",
    [
        (
            lambda x, w: jnp.einsum("bsd,dhk->bshk", x, w),
            (S((2, 4, 8), f32), S((8, 3, 5), f32)),
            "dot_general ([i, j, m], [m, k, l])->([i, j, k, l]) {i=2, j=4, k=3, l=5, m=8} "
            "reduction={m}",
        ),
        (
            lambda x: jnp.transpose(x, (1, 0, 2)),
            (S((4, 8, 2), f32),),
            "transpose ([j, i, k])->([i, j, k]) {i=8, j=4, k=2}",
        ),
        (
            lambda x: x.reshape(4, 2, 4),
            (S((4, 8), f32),),
            "reshape ([i, jk])->([i, j, k]) {i=4, j=2, k=4}",
        ),
        (
            lambda x: x.reshape(8, 4),
            (S((4, 2, 4), f32),),
            "reshape ([i, j, k])->([ij, k]) {i=4, j=2, k=4}",
        ),
        (
            lambda x: jnp.cumsum(x, 1),
            (S((2, 8), f32),),
            "cumsum ([i, j])->([i, j]) {i=2, j=8} need-replication={j}",
        ),
        (
            lambda x: jnp.argmax(x, 1),
            (S((4, 8), f32),),
            "argmax ([i, j])->([i]) {i=4, j=8} need-replication={j}",
        ),
        (
            lambda x: jnp.concatenate([x, x], 1),
            (S((4, 8), f32),),
            "concatenate ([i, j], [i, k])->([i, l]) {i=4, j=8, k=8, l=16} permutation={j, k, l}",
        ),
        (
            lambda x: jax.lax.top_k(x, 2),
            (S((4, 8), f32),),
            "top_k ([i, j])->([i, k], [i, l]) {i=4, j=8, k=2, l=2} need-replication={j, k, l}",
        ),
        (
            lambda x, k: jax.lax.conv_general_dilated(
                x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            ),
            (S((2, 8, 8, 3), f32), S((3, 3, 3, 4), f32)),
            "conv_general_dilated ([i, l, m, k], [n, o, k, j])->([i, p, q, j]) "
            "{i=2, j=4, k=3, l=8, m=8, n=3, o=3, p=8, q=8} reduction={k} "
            "need-replication={l, m, n, o, p, q}",
        ),
    ],
)
def test_golden_rule(fn, args, expected):
    assert expected in rules_of(fn, *args)


def test_embedding_lookup_is_a_reduction_over_the_vocabulary():
    rules = rules_of(lambda e, i: e[i], S((16, 8), f32), S((2, 3), jnp.int32))
    assert (
        "gather ([l, k], [i, j, m])->([i, j, k]) {i=2, j=3, k=8, l=16, m=1} reduction={l} "
        "need-replication={m}" in rules
    )


def test_an_offset_dim_of_slice_size_one_is_a_reduction_like_a_collapsed_dim():
    """`x[i]` under vmap (penzai's `lp[t]` under nmap) keeps the indexed dim as an offset
    dim of size 1; a whole window is kept whole even when it is indexed (clamped to 0)."""
    picked = rules_of(
        jax.vmap(jax.vmap(lambda v, i: v[i])), S((4, 16, 64), f32), S((4, 16), jnp.int32)
    )
    assert (
        "gather ([i, j, k], [i, j, l])->([i, j, m]) {i=4, j=16, k=64, l=1, m=1} "
        "reduction={k} need-replication={l, m}" in picked
    )
    looked_up = rules_of(
        jax.vmap(lambda e, i: e[i], in_axes=(None, 0)), S((64, 8), f32), S((4,), jnp.int32)
    )
    assert (
        "gather ([k, j], [i, l])->([i, m, j]) {i=4, j=8, k=64, l=2, m=1} reduction={k} "
        "need-replication={l, m}" in looked_up
    )


def test_embedding_gradient_scatter_add():
    rules = rules_of(
        lambda z, i, u: z.at[i].add(u), S((16, 8), f32), S((5,), jnp.int32), S((5, 8), f32)
    )
    assert (
        "scatter-add ([k, i], [j, l], [j, i])->([k, i]) {i=8, j=5, k=16, l=1} reduction={j} "
        "need-replication={l}" in rules
    )


def test_pointwise_broadcast_of_size_one_dims():
    rules = rules_of(lambda x, b: x + b[None, :], S((4, 8), f32), S((8,), f32))
    assert "add ([i, j], [k, j])->([i, j]) {i=4, j=8, k=1} need-replication={k}" in rules


def test_unknown_primitive_is_conservative_and_warns_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r1 = rule_for("made_up_primitive", [(4, 8)], [(4, 8)], {})
        r2 = rule_for("made_up_primitive", [(4, 8)], [(4, 8)], {})
    assert (
        str(r1)
        == str(r2)
        == ("([i, j])->([k, l]) {i=4, j=8, k=4, l=8} need-replication={i, j, k, l}")
    )
    msgs = [str(w.message) for w in caught if issubclass(w.category, UnknownPrimitiveWarning)]
    assert msgs == ["primitive 'made_up_primitive' has no sharding rule; it is kept replicated"]


def test_every_zoo_primitive_has_a_rule():
    listed = """abs add add_any and argmax broadcast_in_dim concatenate convert_element_type copy
    cumsum div dot_general eq erfc exp gather ge gt integer_pow iota is_finite log lt max mul
    neg pow reduce_max reduce_sum reshape rsqrt scatter-add select_n sign split sqrt square
    stop_gradient sub tanh transpose conv_general_dilated reduce_min reduce_prod reduce_and
    reduce_or argmin cumprod cummax dynamic_slice dynamic_update_slice pad slice rev squeeze
    expand_dims select_and_scatter_add reduce_window_sum reduce_window_max sort top_k clamp rem
    floor ceil round logistic erf erf_inv expm1 log1p random_bits random_wrap random_unwrap
    random_fold_in threefry2x32 scatter bitcast_convert_type shift_right_logical""".split()
    assert [p for p in listed if p not in RULES] == []


@pytest.mark.parametrize(
    "fn",
    [
        jax.grad(lambda x: jax.nn.gelu(x, approximate=False).sum()),
        jnp.log2,
        lambda x: jnp.polyval(jnp.array([1.0, 2.0, 3.0]), x),
        jnp.empty_like,
        lambda x: jnp.ldexp(*jnp.frexp(x)),
    ],
    ids=["exact-gelu-grad", "log2", "polyval", "empty_like", "frexp-ldexp"],
)
def test_primitives_of_newer_jax_have_rules(fn):
    """jax 0.12 emits log2, polynomial (erf's derivative, polyval), empty (empty_like) and
    call_hi_primitive (frexp, ldexp: the tracer expands it); on older jax the same functions
    trace to primitives the table had already."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rules = rules_of(fn, S((4, 8), f32))
    assert rules
    assert [w for w in caught if issubclass(w.category, UnknownPrimitiveWarning)] == []
    assert all(r.endswith("{i=4, j=8}") for r in rules if r.split()[0] in ("log2", "polynomial"))


def test_unstack_is_stack_reversed():
    """jax >= 0.11 emits unstack (iterating an array, random.split): built directly here
    so the rule is checked on every supported jax."""
    stacked = [(3, 4, 5)]
    slices = [(3, 5)] * 4
    assert str(RULES["unstack"](stacked, slices, {"axis": 1})) == (
        "([i, k, j])->([i, j], [i, j], [i, j], [i, j]) {i=3, j=5, k=4} permutation={k}"
    )
    assert str(RULES["stack"](slices, stacked, {"axis": 1})).startswith(
        "([i, j], [i, j], [i, j], [i, j])->([i, k, j])"
    )
