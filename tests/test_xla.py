"""partir.ir.xla: reading collectives and memory back from what XLA:CPU compiled."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from partir.ir import xla
from partir.ir.xla import (
    CPU_LOWERING,
    KINDS,
    CompiledStats,
    HloCollective,
    as_cpu_kinds,
    collectives_from_hlo,
    compile_stats,
    optimized_hlo_text,
    stats_of_compiled,
)

F32 = jnp.float32


@pytest.fixture(scope="module")
def mesh2x4():
    return jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)


@pytest.fixture(scope="module")
def mesh8():
    return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))


def sds(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def shard_map_stats(mesh, f, in_specs, out_specs, *args):
    g = jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    return compile_stats(g, args, None, None)


def only(stats: CompiledStats) -> HloCollective:
    assert len(stats.collectives) == 1, stats.collectives
    return stats.collectives[0]


def roundtrip(text: str) -> str:
    """Parse hand-written HLO with XLA's own parser and print it as optimized_hlo_text does."""
    from jaxlib import _hlo

    opts = _hlo.HloPrintOptions()
    opts.print_operand_shape = True
    opts.print_metadata = False
    return _hlo.hlo_module_from_text(text).to_string(opts)


ADD = """
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}
"""

# --------------------------------------------------------------------------------------------
# Hand-written HLO
# --------------------------------------------------------------------------------------------

REPLICA_GROUPS = (
    "HloModule m, num_partitions=8\n"
    + ADD
    + """
ENTRY %e (p: f32[4,4]) -> f32[4,4] {
  %p = f32[4,4]{1,0} parameter(0)
  %explicit = f32[4,4]{1,0} all-reduce(%p), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %iota = f32[4,4]{1,0} all-reduce(%explicit), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true, to_apply=%add
  %mesh = f32[4,4]{1,0} all-reduce(%iota), channel_id=3, replica_groups=mesh['a'=2,'b'=4] {'b'}, use_global_device_ids=true, to_apply=%add
  %mesh_ids = f32[4,4]{1,0} all-reduce(%mesh), channel_id=4, replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_1'}, use_global_device_ids=true, to_apply=%add
  %mesh_sub = f32[4,4]{1,0} all-reduce(%mesh_ids), channel_id=5, replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0':(2)2}, use_global_device_ids=true, to_apply=%add
  %mesh_two = f32[4,4]{1,0} all-reduce(%mesh_sub), channel_id=6, replica_groups=mesh['a'=2,'b'=4] {'a','b'}, use_global_device_ids=true, to_apply=%add
  ROOT %empty = f32[4,4]{1,0} all-reduce(%mesh_two), channel_id=7, replica_groups={}, use_global_device_ids=true, to_apply=%add
}
"""  # noqa: E501
)


@pytest.mark.parametrize("printed", [False, True], ids=["raw", "xla-printed"])
def test_replica_group_spellings(printed):
    text = roundtrip(REPLICA_GROUPS) if printed else REPLICA_GROUPS
    got = {c.name: c.group_size for c in collectives_from_hlo(text)}
    assert got == {
        "explicit": 4,
        "iota": 2,
        "mesh": 4,
        "mesh_ids": 4,
        "mesh_sub": 2,
        "mesh_two": 8,
        "empty": 8,
    }
    for c in collectives_from_hlo(text):
        assert (c.kind, c.bytes, c.multiplicity, c.computation) == ("all-reduce", 64, 1, "e")


TUPLE_AND_ASYNC = (
    "HloModule m, num_partitions=8\n"
    + ADD
    + """
ENTRY %e (p: f32[4,4], q: bf16[2], r: f32[8,4], p2: f32[2]) -> (f32[16,4], f32[2,4]) {
  %p = f32[4,4]{1,0} parameter(0)
  %q = bf16[2]{0} parameter(1)
  %r = f32[8,4]{1,0} parameter(2)
  %p2 = f32[2]{0} parameter(3)
  %sl0 = f32[1,4]{1,0} slice(%p), slice={[0:1], [0:4]}
  %sl1 = f32[1,4]{1,0} slice(%p), slice={[1:2], [0:4]}
  %tar = (f32[4,4]{1,0}, /*index=1*/bf16[2]{0}) all-reduce(%p, %q), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %g0 = f32[4,4]{1,0} get-tuple-element(%tar), index=0
  %ags = (f32[4,4]{1,0}, f32[16,4]{1,0}) all-gather-start(%g0), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true
  %agd = f32[16,4]{1,0} all-gather-done(%ags)
  %ags2 = ((f32[4,4]{1,0}, f32[2]{0}), (f32[16,4]{1,0}, f32[8]{0})) all-gather-start(%p, f32[2]{0} %p2), channel_id=3, replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true
  %agd2 = (f32[16,4]{1,0}, f32[8]{0}) all-gather-done(%ags2)
  %ars = f32[4,4]{1,0} all-reduce-start(%p), channel_id=4, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%add
  %ard = f32[4,4]{1,0} all-reduce-done(%ars)
  %cps = (f32[4,4]{1,0}, f32[4,4]{1,0}, u32[], u32[]) collective-permute-start(%ard), channel_id=5, source_target_pairs={{0,1},{1,0},{2,3}}
  %cpd = f32[4,4]{1,0} collective-permute-done(%cps)
  %rss = ((f32[8,4]{1,0}), f32[2,4]{1,0}) reduce-scatter-start(%r), channel_id=6, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, dimensions={0}, to_apply=%add
  %rsd = f32[2,4]{1,0} reduce-scatter-done(%rss)
  %a2a = (f32[1,4]{1,0}, f32[1,4]{1,0}) all-to-all(f32[1,4]{1,0} %sl0, f32[1,4]{1,0} %sl1), channel_id=7, replica_groups={{0,1},{2,3},{4,5},{6,7}}
  ROOT %out = (f32[16,4]{1,0}, f32[2,4]{1,0}) tuple(%agd, %rsd)
}
"""  # noqa: E501
)


@pytest.mark.parametrize("printed", [False, True], ids=["raw", "xla-printed"])
def test_tuple_all_reduce_and_async_pairs(printed):
    text = roundtrip(TUPLE_AND_ASYNC) if printed else TUPLE_AND_ASYNC
    got = sorted((c.name, c.kind, c.bytes, c.group_size) for c in collectives_from_hlo(text))
    assert got == sorted(
        [
            ("tar", "all-reduce", 64 + 4, 8),  # tuple: f32[4,4] + bf16[2]
            ("ags", "all-gather", 256, 4),  # result, element 1 of (operand, result)
            ("ags2", "all-gather", 256 + 32, 4),  # ((operands), (results))
            ("ars", "all-reduce", 64, 2),  # -start counted once, -done skipped
            ("cps", "collective-permute", 64, 3),  # operand, pairs counted
            ("rss", "reduce-scatter", 128, 4),  # operand of the generic async form
            ("a2a", "all-to-all", 32, 2),  # tuple all-to-all: sum of operands
        ]
    )


def test_async_forms_as_this_xla_prints_them():
    """The same async ops, parsed and re-printed by this jaxlib's own HLO parser."""
    text = (
        "HloModule m, num_partitions=8\n"
        + ADD
        + """
%wrapped (w: f32[8,4]) -> f32[2,4] {
  %w = f32[8,4]{1,0} parameter(0)
  ROOT %rs = f32[2,4]{1,0} reduce-scatter(%w), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, dimensions={0}, to_apply=%add
}
ENTRY %e (p: f32[4,4], r: f32[8,4]) -> (f32[16,4], f32[2,4], f32[4,4]) {
  %p = f32[4,4]{1,0} parameter(0)
  %r = f32[8,4]{1,0} parameter(1)
  %ags = (f32[4,4]{1,0}, f32[16,4]{1,0}) all-gather-start(%p), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true
  %agd = f32[16,4]{1,0} all-gather-done(%ags)
  %st = ((f32[8,4]{1,0}), f32[2,4]{1,0}) async-start(%r), calls=%wrapped
  %dn = f32[2,4]{1,0} async-done(%st)
  %cps = (f32[4,4]{1,0}, f32[4,4]{1,0}, u32[], u32[]) collective-permute-start(%p), channel_id=3, source_target_pairs={{0,1},{1,0}}
  %cpd = f32[4,4]{1,0} collective-permute-done(%cps)
  ROOT %t = (f32[16,4]{1,0}, f32[2,4]{1,0}, f32[4,4]{1,0}) tuple(%agd, %dn, %cpd)
}
"""  # noqa: E501
    )
    printed = roundtrip(text)
    assert "reduce-scatter-start(" in printed  # the async wrapper comes back sugared
    got = sorted((c.kind, c.bytes, c.group_size) for c in collectives_from_hlo(printed))
    assert got == [
        ("all-gather", 256, 4),
        ("collective-permute", 64, 2),
        ("reduce-scatter", 128, 4),
    ]
    # Unsugared text (wrapper computation visible) gives the same, counted once.
    got_raw = sorted((c.kind, c.bytes, c.group_size) for c in collectives_from_hlo(text))
    assert got_raw == got


def test_shape_bytes():
    sb = xla.shape_bytes
    assert sb("f32[]") == 4
    assert sb("pred[3]") == 3
    assert sb("bf16[2,3]{1,0}") == 12
    assert sb("f16[8]") == 16
    assert sb("s32[2]") == sb("u32[2]") == 8
    assert sb("f64[2]") == sb("s64[2]") == 16
    assert sb("s8[5]") == 5
    assert sb("s4[3]") == 2
    assert sb("c64[1]") == 8
    assert sb("f8e4m3fn[4]") == 4
    assert sb("f32[8,128]{1,0:T(8,128)S(1)}") == 8 * 128 * 4
    assert sb("(f32[2]{0}, /*index=1*/(s32[], pred[4]))") == 8 + 4 + 4
    assert sb("f32[<=8,2]") == 64
    assert sb("token[]") == 0


LOOPS = (
    "HloModule m, num_partitions=8\n"
    + ADD
    + """
%inner_body (ib: (s32[], f32[4])) -> (s32[], f32[4]) {
  %ib = (s32[], f32[4]{0}) parameter(0)
  %iv = f32[4]{0} get-tuple-element(%ib), index=1
  %ar_inner = f32[4]{0} all-reduce(%iv), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %ii = s32[] get-tuple-element(%ib), index=0
  ROOT %it = (s32[], f32[4]{0}) tuple(%ii, %ar_inner)
}
%inner_cond (ic: (s32[], f32[4])) -> pred[] {
  %ic = (s32[], f32[4]{0}) parameter(0)
  ROOT %ip = pred[] constant(true)
}
%outer_body (ob: (s32[], f32[4])) -> (s32[], f32[4]) {
  %ob = (s32[], f32[4]{0}) parameter(0)
  %ow = (s32[], f32[4]{0}) while(%ob), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  %ov = f32[4]{0} get-tuple-element(%ow), index=1
  %ag_outer = f32[16]{0} all-gather(%ov), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  ROOT %ot = (s32[], f32[4]{0}) tuple(s32[] %oi, f32[4]{0} %ov)
}
%outer_cond (oc: (s32[], f32[4])) -> pred[] {
  %oc = (s32[], f32[4]{0}) parameter(0)
  ROOT %op = pred[] constant(true)
}
%branch_a (ba: f32[4]) -> f32[4] {
  %ba = f32[4]{0} parameter(0)
  ROOT %ar_branch = f32[4]{0} all-reduce(%ba), channel_id=3, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%add
}
%branch_b (bb: f32[4]) -> f32[4] {
  ROOT %bb = f32[4]{0} parameter(0)
}
%called (cp: f32[4]) -> f32[4] {
  %cp = f32[4]{0} parameter(0)
  ROOT %cp_called = f32[4]{0} collective-permute(%cp), channel_id=4, source_target_pairs={{0,1},{1,0}}
}
%unknown_body (ub: (s32[], f32[4])) -> (s32[], f32[4]) {
  %ub = (s32[], f32[4]{0}) parameter(0)
  %uv = f32[4]{0} get-tuple-element(%ub), index=1
  %ar_unknown = f32[4]{0} all-reduce(%uv), channel_id=5, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  ROOT %ut = (s32[], f32[4]{0}) tuple(s32[] %ui, %ar_unknown)
}
ENTRY %main (p: (s32[], f32[4]), b: s32[]) -> f32[4] {
  %p = (s32[], f32[4]{0}) parameter(0)
  %b = s32[] parameter(1)
  %w = (s32[], f32[4]{0}) while(%p), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"4"},"known_init_step":{"init":"0","step":"1"}}
  %v = f32[4]{0} get-tuple-element(%w), index=1
  %c = f32[4]{0} conditional(%b, %v, %v), branch_computations={%branch_a, %branch_b}
  %k = f32[4]{0} call(%c), to_apply=%called
  %u = (s32[], f32[4]{0}) while(%p), condition=%outer_cond, body=%unknown_body
  ROOT %ar_entry = f32[4]{0} all-reduce(%k), channel_id=6, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
}
"""  # noqa: E501
)


def test_multiplicity_through_while_conditional_call():
    got = {c.name: (c.multiplicity, c.computation) for c in collectives_from_hlo(LOOPS)}
    assert got == {
        "ar_inner": (12, "inner_body"),  # 4 outer x 3 inner
        "ag_outer": (4, "outer_body"),
        "ar_branch": (1, "branch_a"),
        "cp_called": (1, "called"),
        "ar_unknown": (1, "unknown_body"),  # unknown trip count: counted as 1
        "ar_entry": (1, "main"),
    }
    mult = xla.computation_multiplicities(LOOPS)
    assert mult["main"] == 1 and mult["inner_body"] == 12 and mult["inner_cond"] == 4 * 4
    assert mult["outer_cond"] == 5 + 1  # runs n+1 times for the known loop, once for the other


def test_operands_without_printed_shapes_are_looked_up():
    text = (
        "HloModule m, num_partitions=8\n"
        + ADD
        + """
ENTRY %e (p: bf16[6,4]) -> bf16[6,4] {
  %p = bf16[6,4]{1,0} parameter(0)
  ROOT %r = bf16[6,4]{1,0} all-reduce(%p), channel_id=1, replica_groups=[1,8]<=[8], to_apply=%add
}
"""
    )
    (c,) = collectives_from_hlo(text)
    assert (c.kind, c.bytes, c.group_size) == ("all-reduce", 48, 8)


def test_as_cpu_kinds_and_by_kind():
    assert CPU_LOWERING == {"reduce-scatter": "all-reduce"}
    folded = as_cpu_kinds({"reduce-scatter": 100, "all-reduce": 5, "all-gather": 7})
    assert folded == {
        "all-reduce": 105,
        "all-gather": 7,
        "reduce-scatter": 0,
        "all-to-all": 0,
        "collective-permute": 0,
    }
    assert as_cpu_kinds(folded) == folded
    stats = CompiledStats(
        collectives=[
            HloCollective("all-reduce", 10, 4, 3, "a", "c"),
            HloCollective("all-reduce", 1, 4, 1, "b", "c"),
            HloCollective("all-gather", 8, 2, 2, "g", "c"),
        ],
        argument_bytes=0,
        output_bytes=0,
        temp_bytes=0,
        alias_bytes=0,
        peak_bytes=0,
        flops=None,
    )
    assert stats.bytes_by_kind() == dict.fromkeys(KINDS, 0) | {"all-reduce": 31, "all-gather": 16}
    assert stats.count_by_kind() == dict.fromkeys(KINDS, 0) | {"all-reduce": 4, "all-gather": 2}


# --------------------------------------------------------------------------------------------
# Compiled on 8 fake CPU devices
# --------------------------------------------------------------------------------------------


def test_psum_2x4(mesh2x4):
    # [8,16] sharded (a, b) -> per device f32[4,4]; psum over b (4 devices).
    st = shard_map_stats(mesh2x4, lambda x: lax.psum(x, "b"), P("a", "b"), P("a"), sds(8, 16))
    c = only(st)
    assert (c.kind, c.bytes, c.group_size, c.multiplicity) == ("all-reduce", 64, 4, 1)
    st = shard_map_stats(mesh2x4, lambda x: lax.psum(x, "a"), P("a", "b"), P(None, "b"), sds(8, 16))
    assert (only(st).bytes, only(st).group_size) == (64, 2)


def test_tuple_psum_2x4(mesh2x4):
    st = shard_map_stats(
        mesh2x4, lambda x, y: lax.psum((x, y), ("a", "b")), P("a", "b"), P(), sds(8, 16), sds(8, 8)
    )
    c = only(st)
    assert (c.kind, c.bytes, c.group_size) == ("all-reduce", 64 + 32, 8)


def test_all_gather_2x4(mesh2x4):
    st = shard_map_stats(
        mesh2x4, lambda x: lax.all_gather(x, "b", tiled=True), P("a", "b"), P("a"), sds(8, 16)
    )
    c = only(st)
    assert (c.kind, c.bytes, c.group_size) == ("all-gather", 16 * 4 * 4, 4)  # result f32[16,4]


def test_psum_scatter_2x4(mesh2x4):
    st = shard_map_stats(
        mesh2x4,
        lambda x: lax.psum_scatter(x, "b", tiled=True),
        P("a", None),
        P("a", "b"),
        sds(8, 16),
    )
    c = only(st)
    assert (c.kind, c.bytes, c.group_size) == ("reduce-scatter", 4 * 16 * 4, 4)  # operand


def test_all_to_all_2x4(mesh2x4):
    st = shard_map_stats(
        mesh2x4,
        lambda x: lax.all_to_all(x, "b", 0, 1, tiled=True),
        P("a", "b"),
        P("a", "b"),
        sds(8, 16),
    )
    c = only(st)
    assert (c.kind, c.bytes, c.group_size) == ("all-to-all", 4 * 4 * 4, 4)


def test_ppermute_2x4(mesh2x4):
    perm = [(i, (i + 1) % 4) for i in range(4)]
    st = shard_map_stats(
        mesh2x4, lambda x: lax.ppermute(x, "b", perm), P("a", "b"), P("a", "b"), sds(8, 16)
    )
    c = only(st)
    # 4 pairs per group of "b", 2 groups of "a": 8 source/target pairs in the HLO
    assert (c.kind, c.bytes, c.group_size) == ("collective-permute", 64, 8)


# kind -> (program on the 1-D mesh "x", out_spec, bytes per per-device element of the input)
# The input [64, 8] is sharded 8 ways on dim 0: [8, 8] per device; only all-gather's result is 8x.
ONE_D = {
    "all-reduce": (lambda x: lax.psum(x, "x"), P(), 1),
    "all-gather": (lambda x: lax.all_gather(x, "x", tiled=True), P(), 8),
    "reduce-scatter": (lambda x: lax.psum_scatter(x, "x", tiled=True), P("x"), 1),
    "all-to-all": (lambda x: lax.all_to_all(x, "x", 0, 0, tiled=True), P("x"), 1),
    "collective-permute": (
        lambda x: lax.ppermute(x, "x", [(i, (i + 1) % 8) for i in range(8)]),
        P("x"),
        1,
    ),
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_on_1d_mesh(mesh8, kind):
    f, out_spec, factor = ONE_D[kind]
    st = shard_map_stats(mesh8, f, P("x"), out_spec, sds(64, 8))
    c = only(st)
    assert (c.kind, c.bytes, c.group_size, c.multiplicity) == (kind, 8 * 8 * 4 * factor, 8, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_collectives_are_promoted_on_cpu(mesh8, kind):
    """XLA:CPU converts bf16 to f32 around every collective: the HLO moves twice the bytes.

    The parser reports what the HLO says (f32), not the program's dtype; see
    xla.CPU_PROMOTED_TYPES. f16 is not promoted.
    """
    f, out_spec, factor = ONE_D[kind]
    st = shard_map_stats(mesh8, f, P("x"), out_spec, sds(64, 8, dtype=jnp.bfloat16))
    assert only(st).bytes == 8 * 8 * 4 * factor
    st = shard_map_stats(mesh8, f, P("x"), out_spec, sds(64, 8, dtype=jnp.float16))
    assert only(st).bytes == 8 * 8 * 2 * factor


def test_scan_multiplicity(mesh2x4):
    def f(x):
        def body(c, _):
            return lax.psum(c, "b") * 0.5, None

        return lax.scan(body, x, None, length=5)[0]

    st = shard_map_stats(mesh2x4, f, P("a", "b"), P("a", "b"), sds(8, 16))
    c = only(st)
    assert (c.kind, c.bytes, c.multiplicity) == ("all-reduce", 64, 5)
    assert st.bytes_by_kind()["all-reduce"] == 5 * 64
    assert st.count_by_kind()["all-reduce"] == 5
    assert st.notes == ()


def test_nested_scan_multiplies(mesh2x4):
    def f(x):
        def inner(c, _):
            return lax.psum(c, "b") * 0.5, None

        def outer(c, _):
            c = lax.scan(inner, c, None, length=3)[0]
            return lax.all_gather(c, "a", tiled=True)[:4] * 2.0, None

        return lax.scan(outer, x, None, length=4)[0]

    st = shard_map_stats(mesh2x4, f, P("a", "b"), P("a", "b"), sds(8, 16))
    got = sorted((c.kind, c.multiplicity) for c in st.collectives)
    assert got == [("all-gather", 4), ("all-reduce", 12)]
    assert st.count_by_kind()["all-reduce"] == 12


def test_while_loop_without_trip_count_is_noted(mesh2x4):
    def f(x):
        return lax.while_loop(lambda c: c.sum() < 100.0, lambda c: lax.psum(c, "b"), x)

    st = shard_map_stats(mesh2x4, f, P("a", "b"), P("a", "b"), sds(8, 16))
    assert only(st).multiplicity == 1
    assert len(st.notes) == 1 and "unknown trip count" in st.notes[0]


def test_matmul_contraction_sharded_gives_one_all_reduce(mesh2x4):
    x = jax.ShapeDtypeStruct((32, 64), F32)
    w = jax.ShapeDtypeStruct((64, 16), F32)
    st = compile_stats(
        lambda x, w: x @ w,
        (x, w),
        (NamedSharding(mesh2x4, P(None, "b")), NamedSharding(mesh2x4, P("b", None))),
        NamedSharding(mesh2x4, P()),
    )
    c = only(st)
    assert (c.kind, c.bytes, c.group_size) == ("all-reduce", 32 * 16 * 4, 4)
    assert st.flops is not None and st.flops > 0


def test_memory_from_shape_dtype_structs(mesh8):
    sh = NamedSharding(mesh8, P("x", None))
    st = compile_stats(
        lambda a: jnp.tanh(a) * 2.0, (jax.ShapeDtypeStruct((1024, 1024), F32),), (sh,), sh
    )
    assert st.argument_bytes == 1024 * 1024 * 4 // 8
    assert st.output_bytes == 1024 * 1024 * 4 // 8
    assert st.collectives == []
    assert st.peak_bytes >= st.argument_bytes
    assert st.bytes_by_kind() == dict.fromkeys(KINDS, 0)


def test_donation_and_array_args(mesh8):
    sh = NamedSharding(mesh8, P("x"))
    # A concrete (small) array is turned into a ShapeDtypeStruct: only its shape matters.
    st = compile_stats(
        lambda a: a + 1.0, (np.zeros((64,), np.float32),), (sh,), sh, donate_argnums=0
    )
    assert st.argument_bytes == 64 * 4 // 8
    assert st.alias_bytes == 64 * 4 // 8


def test_mesh_argument_allows_bare_partition_specs(mesh8):
    st = compile_stats(
        lambda a: a.sum(0), (jax.ShapeDtypeStruct((64, 8), F32),), (P("x", None),), P(), mesh=mesh8
    )
    assert [c.kind for c in st.collectives] == ["all-reduce"]
    assert st.collectives[0].bytes == 8 * 4


def test_optimized_text_has_operand_shapes(mesh2x4):
    x = jax.ShapeDtypeStruct((8, 16), F32)
    compiled = (
        jax.jit(
            jax.shard_map(
                lambda x: lax.psum(x, "b"), mesh=mesh2x4, in_specs=P("a", "b"), out_specs=P("a")
            )
        )
        .lower(x)
        .compile()
    )
    text = optimized_hlo_text(compiled)
    assert "all-reduce(f32[4,4]{1,0} %" in text
    # as_text() prints operands without shapes; the parser resolves them by name.
    assert collectives_from_hlo(compiled.as_text()) == collectives_from_hlo(text)
    assert stats_of_compiled(compiled).collectives == collectives_from_hlo(text)


# --------------------------------------------------------------------------------------------
# The true peak, from XLA's buffer assignment
# --------------------------------------------------------------------------------------------

MIB = 1 << 20

_ASSIGNMENT = """BufferAssignment:
allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:
 value: <1 p @0> (size=64,offset=0): f32[16]{0}
allocation 1: size 4, thread-local:
 value: <9 add.1 @0> (size=4,offset=0): f32[]
allocation 2: size 200, preallocated-temp:
 value: <2 a @0> (size=100,offset=0): f32[25]{0}
 value: <3 b @0> (size=100,offset=0): f32[25]{0}
 value: <4 t{} @0> (size=16,offset=100): (f32[25]{0}, f32[10]{0})
 value: <5 t{0} (phi) @0> (size=100,offset=0): f32[25]{0}
 value: <6 t{1} @0> (size=40,offset=116): f32[10]{0}
 value: <7 c @0> (size=40,offset=156): f32[10]{0}
"""
_LIVE = """HloLiveRange (max 6):
  InstructionSequence:
    0:p
  BufferLiveRange:
    p{}:0-6
    a{}:1-2
    b{}:2-3
    t{}:3-4
    t{0}:3-4
    t{1}:3-4
    c{}:5-6
    add.1{}:1-1
  Live ranges at 3 (peak):
    p{}: 64 bytes (cumulative: 64 bytes)
"""


def test_peak_counts_a_shared_slot_once_and_tuple_elements_at_their_size():
    peak = xla.peak_from_buffer_assignment(_ASSIGNMENT, _LIVE)
    # At 3: p (64) + the slot at offset 0 that a, b and t{0} share (100, counted once)
    # + the tuple table t{} (16) + t{1} (40).
    assert (peak.bytes, peak.position, peak.schedule_length) == (64 + 100 + 16 + 40, 3, 6)
    assert [b.name for b in peak.largest] == ["t{0}", "p{}", "t{1}", "t{}"]


def test_peak_of_live_ranges_includes_both_ends():
    # c starts at 5 where t{0} and t{1} end: all three live at 5.
    live = _LIVE.replace("t{0}:3-4", "t{0}:3-5").replace("t{1}:3-4", "t{1}:3-5")
    text = _ASSIGNMENT.replace("(size=40,offset=156)", "(size=400,offset=156)")
    peak = xla.peak_from_buffer_assignment(text, live)
    assert (peak.bytes, peak.position) == (64 + 100 + 40 + 400, 5)


def _lowered(f, *args, donate=()):
    return jax.jit(f, donate_argnums=donate).lower(*args)


def test_true_peak_of_a_matmul_chain():
    # Each product is read only by the next: at any point the two arguments, one input and
    # one output are live (4 x 4 MiB), whatever the chain's length. (sin, unlike tanh, is not
    # fused into XLA:CPU's matmul fusions, so each product is a buffer of its own.)
    def chain(x, w):
        for _ in range(6):
            x = jnp.sin(x @ w)
        return x.sum()

    a = sds(1024, 1024)
    compiled, peak = xla.compile_with_buffer_peak(_lowered(chain, a, a))
    assert peak is not None
    if jax.__version_info__ < (0, 11):
        assert peak.bytes == 16 * MIB
    else:  # XLA 0.11 fuses the whole chain into one library call: its products are scratch
        assert 8 * MIB <= peak.bytes < 9 * MIB
    assert compiled.memory_analysis().peak_memory_in_bytes < 9 * MIB  # arguments + output


def test_true_peak_counts_48_mib_of_simultaneous_temporaries():
    # Twelve 4 MiB products all read by the final sum: 48 MiB live beside 8 MiB of arguments
    # and the 4 MiB result, which XLA:CPU's peak_memory_in_bytes (12 MiB) does not see.
    def fan(x, w):
        return sum(((i + 1.0) * x) @ w for i in range(12))

    a = sds(1024, 1024)
    compiled, peak = xla.compile_with_buffer_peak(_lowered(fan, a, a))
    assert peak is not None and peak.bytes == 60 * MIB
    assert compiled.memory_analysis().peak_memory_in_bytes == 12 * MIB


def test_true_peak_keeps_arguments_live_unless_donated():
    a = sds(1024, 1024)
    assert xla.true_peak_bytes(_lowered(lambda x: x * 2.0, a)) == 8 * MIB
    assert xla.true_peak_bytes(_lowered(lambda x: x * 2.0, a, donate=0)) == 4 * MIB


def test_true_peak_is_per_device_and_in_compile_stats(mesh8):
    sh = NamedSharding(mesh8, P("x", None))
    st = compile_stats(lambda a: jnp.tanh(a) * 2.0, (sds(1024, 1024),), (sh,), sh)
    assert st.true_peak_bytes == 2 * 4 * MIB // 8
    assert st.true_peak_bytes <= st.allocated_bytes


def test_true_peak_sees_a_scan_carry_that_xla_prints_as_a_pointer(mesh8):
    # Gradient of a scanned, rematerialised stack, data-parallel: the gradient accumulator
    # (4 MiB) lives in the loop carry through the backward loop; XLA's own printed peak drops
    # it. The true peak is at most everything allocated and at least arguments + accumulator.
    def loss(ws, x):
        h, _ = lax.scan(jax.checkpoint(lambda h, w: (jnp.tanh(h @ w), None)), x, ws)
        return (h**2).sum()

    ws = jax.ShapeDtypeStruct((4, 512, 512), F32, sharding=NamedSharding(mesh8, P()))
    x = jax.ShapeDtypeStruct((1024, 512), F32, sharding=NamedSharding(mesh8, P("x")))
    compiled, peak = xla.compile_with_buffer_peak(jax.jit(jax.grad(loss)).lower(ws, x))
    st = stats_of_compiled(compiled, peak)
    assert st.true_peak_bytes == peak.bytes
    assert st.argument_bytes + 4 * MIB <= peak.bytes <= st.allocated_bytes
    assert any(b.op_name == "ws" for b in peak.largest)


def test_verify_reports_the_buffer_assignment_peak_beside_the_estimate():
    import partir
    from partir.models import mlp
    from partir.solver.verify import PEAK_ROW

    goal = partir.Goal(mlp.train_step, mlp.example_args(preset="tiny"), {"batch": 8})
    plan = partir.baselines(goal)["BP"]
    report = partir.verify(goal, plan)
    row = report.row(PEAK_ROW)
    assert row is not None and row.compiled == report.stats.true_peak_bytes
    assert report.stats.argument_bytes <= row.compiled <= report.stats.allocated_bytes
    assert row.predicted == plan.cost.peak_memory_bytes
    assert report.row("memory (est.)") is not None  # the existing row stays
    assert PEAK_ROW in str(report)
    largest = report.buffer_peak.largest
    assert largest and largest[0].bytes == max(b.bytes for b in largest)


def _chain(ws, x):
    for i in range(ws.shape[0]):
        x = jnp.sin(x @ ws[i]) + x
    return x


def _scanned(ws, x):
    return lax.scan(lambda h, w: (jnp.sin(h @ w) + h, None), x, ws)[0]


def test_step_flops_count_every_iteration_of_a_scan():
    # XLA's cost analysis counts a while body once; step_flops counts each iteration.
    ws, x = sds(8, 128, 128), sds(64, 128)
    matmuls = 8 * 2 * 64 * 128 * 128
    unrolled = compile_stats(_chain, (ws, x), None, None)
    scanned = compile_stats(_scanned, (ws, x), None, None)
    assert unrolled.step_flops == unrolled.flops >= matmuls
    assert scanned.flops < matmuls / 4  # one iteration's worth
    assert scanned.step_flops == pytest.approx(unrolled.flops, rel=1e-3)


def test_hlo_flops_agree_with_xla_cost_analysis():
    compiled = jax.jit(_chain).lower(sds(4, 64, 64), sds(32, 64)).compile()
    once, per_step = xla.hlo_flops(optimized_hlo_text(compiled))
    assert once == per_step == pytest.approx(compiled.cost_analysis()["flops"], rel=1e-3)


def test_step_bytes_accessed_count_every_iteration_of_a_scan():
    # The scanned chain reads each layer's slice of the stack per iteration (a dynamic-slice
    # fusion reads its slice, not the stack): per step, what the unrolled chain reads.
    ws, x = sds(8, 128, 128), sds(64, 128)
    unrolled = compile_stats(_chain, (ws, x), None, None)
    scanned = compile_stats(_scanned, (ws, x), None, None)
    assert unrolled.step_bytes_accessed == unrolled.bytes_accessed >= 8 * 128 * 128 * 4
    assert scanned.bytes_accessed < unrolled.bytes_accessed / 4  # one iteration's worth
    assert scanned.step_bytes_accessed == pytest.approx(unrolled.bytes_accessed, rel=0.05)


@pytest.mark.parametrize("fn", [_chain, _scanned])
def test_hlo_bytes_accessed_agree_with_xla_cost_analysis(fn):
    compiled = jax.jit(fn).lower(sds(4, 64, 64), sds(32, 64)).compile()
    once, _ = xla.hlo_bytes_accessed(optimized_hlo_text(compiled))
    assert once == pytest.approx(compiled.cost_analysis()["bytes accessed"], rel=1e-3)


def test_no_buffer_assignment_dumped_reads_as_none(tmp_path):
    assert xla.read_buffer_peak(tmp_path) is None
    (tmp_path / "m.cpu_after_optimizations-buffer-assignment.txt").write_text(_ASSIGNMENT)
    assert xla.read_buffer_peak(tmp_path) is None  # no live ranges beside it
    (tmp_path / "m.cpu_after_optimizations-live-range.txt").write_text(_LIVE)
    assert xla.read_buffer_peak(tmp_path).bytes == 64 + 100 + 16 + 40


def _conv_loss(x, k):
    y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.sum(y * y)


def test_conv_flops_are_the_kernel_window_per_output_element():
    # A 3x3 conv over 32x32: 2 * out * (3 * 3 * c_in) multiply-adds, not a product over the
    # input, kernel and output windows together (which read 1000x over XLA's count).
    import partir

    args = (sds(8, 32, 32, 16), sds(3, 3, 16, 32))
    compiled = jax.jit(_conv_loss).lower(*args).compile()
    expected = compiled.cost_analysis()["flops"]
    goal = partir.Goal(_conv_loss, args, {"b": 2})
    whole = partir.plan(goal, {}).cost.flops
    split = partir.plan(goal, (P("b"), None)).cost.flops
    assert whole == pytest.approx(expected, rel=0.06)  # XLA adds the square and the sum
    assert split == pytest.approx(whole / 2)
