#!/usr/bin/env python3
"""onnx_node_gen.py -- ONNX backend-test folders for the ops of issue 12,
written from the onnx package's own node test cases (the operator
specification's examples, with the reference outputs onnx computes), plus
fresh random-input cases checked against onnxruntime.

    onnx_node_gen.py --out DIR [--seed S]

Writes DIR/{spec,random}/<test name>/model.onnx +
test_data_set_N/{input,output}_K.pb, the layout `apollo-client check`
reads, and DIR/fold/<name>/, models whose mask and table subgraphs are
computed from constants only, with the number of nodes that must remain
after import in expect_nodes.
Cases Apollo refuses by design (listed in REFUSED with the reason) are
written under DIR/refused/ so the caller can check that each is refused
with a clear error rather than a wrong answer; so are hostile models
(hostile_cases: huge Range/Tile/Resize, out-of-range constant indices,
malformed Einsum, CumSum and Trilu), each with the words its error must
carry in expect_error.
"""
import argparse
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

OPS = ["IsNaN", "IsInf", "Sin", "Cos", "GatherElements", "ScatterND", "ScatterElements", "Trilu",
       "CumSum", "Einsum", "Tile", "Range", "Where", "Shrink", "Resize", "Upsample", "DepthToSpace",
       "SpaceToDepth", "Softsign", "ArgMax", "ArgMin"]

# Official cases outside what Apollo supports, by name prefix: reason.
REFUSED = {
    "test_resize_downsample_scales_cubic": "cubic mode",
    "test_resize_upsample_scales_cubic": "cubic mode",
    "test_resize_downsample_sizes_cubic": "cubic mode",
    "test_resize_upsample_sizes_cubic": "cubic mode",
    "test_resize_tf_crop_and_resize": "tf_crop_and_resize",
    "test_resize_downsample_scales_linear_antialias": "antialias",
    "test_resize_downsample_sizes_linear_antialias": "antialias",
    "test_resize_downsample_scales_cubic_antialias": "antialias",
    "test_resize_downsample_sizes_cubic_antialias": "antialias",
    "test_resize_upsample_sizes_nearest_not_larger": "keep_aspect_ratio_policy",
    "test_resize_upsample_sizes_nearest_not_smaller": "keep_aspect_ratio_policy",
    "test_resize_downsample_sizes_nearest_not_larger": "keep_aspect_ratio_policy",
    "test_resize_downsample_sizes_nearest_not_smaller": "keep_aspect_ratio_policy",
    "test_einsum_batch_diagonal": "a diagonal (label repeated in one operand)",
    "test_range_float_type_positive_delta_expanded": "Loop (the expanded form)",
    "test_range_int32_type_negative_delta_expanded": "Loop (the expanded form)",
}


def write_case(root, name, model, data_sets):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    ins = [i.name for i in model.graph.input
           if i.name not in {t.name for t in model.graph.initializer}]
    outs = [o.name for o in model.graph.output]
    for k, (inputs, outputs) in enumerate(data_sets):
        ds = os.path.join(d, "test_data_set_%d" % k)
        os.makedirs(ds, exist_ok=True)
        for i, a in enumerate(inputs):
            with open(os.path.join(ds, "input_%d.pb" % i), "wb") as f:
                f.write(numpy_helper.from_array(np.asarray(a), ins[i] if i < len(ins) else "").SerializeToString())
        for i, a in enumerate(outputs):
            with open(os.path.join(ds, "output_%d.pb" % i), "wb") as f:
                f.write(numpy_helper.from_array(np.asarray(a), outs[i]).SerializeToString())


# Inputs the specification's cases feed at run time that Apollo needs as
# constants (exporters write them as initializers): made initializers.
CONST_INPUTS = {"Resize": (1, 2, 3), "Upsample": (1,), "Range": (0, 1, 2)}


def constant_inputs(model, data_sets):
    """Moves the CONST_INPUTS of the model's first node from graph inputs
    (fed by the data set) into initializers; clamps the default opset to 25,
    the newest the importer knows (none of these ops changed since)."""
    node = model.graph.node[0]
    pos = CONST_INPUTS.get(node.op_type, ())
    names = [node.input[k] for k in pos if k < len(node.input) and node.input[k]]
    inits = {t.name for t in model.graph.initializer}
    feed = [i.name for i in model.graph.input if i.name not in inits]
    keep_idx = [k for k, n in enumerate(feed) if n not in names]
    for k, n in enumerate(feed):
        if n in names:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(data_sets[0][0][k]), n))
    for i in reversed(range(len(model.graph.input))):
        if model.graph.input[i].name in names:
            del model.graph.input[i]
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > 25:
            o.version = 25
    return [([ins[k] for k in keep_idx], outs) for ins, outs in data_sets]


def official(out, refused_dir):
    from onnx.backend.test.case.node import collect_testcases
    n = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for c in collect_testcases(None):
            if not c.model.graph.node or c.model.graph.node[0].op_type not in OPS:
                continue
            why = next((r for p, r in REFUSED.items() if c.name.startswith(p)), None)
            data_sets = constant_inputs(c.model, c.data_sets)
            if why:
                write_case(refused_dir, c.name, c.model, data_sets)
                print("onnx_node_gen: %s: refused by design (%s)" % (c.name, why))
                continue
            write_case(out, c.name, c.model, data_sets)
            n += 1
    return n


# ---- random cases, references from onnxruntime ------------------------------------

def model_of(node, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph([node], node.op_type.lower(), inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def vi(name, dt, shape):
    return helper.make_tensor_value_info(name, dt, shape)


def random_cases(rng):
    F, I = TensorProto.FLOAT, TensorProto.INT64
    cases = []

    def add(name, node, ins, feeds, outs, inits=(), opset=17):
        cases.append((name, model_of(node, ins, outs, inits, opset), feeds))

    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    x[0, 0, 0] = np.nan
    x[1, 1, 1] = np.inf
    x[2, 2, 2] = -np.inf
    for op in ("IsNaN", "IsInf", "Sin", "Cos", "Softsign"):
        add("test_rand_%s" % op.lower(), helper.make_node(op, ["x"], ["y"]),
            [vi("x", F, x.shape)], [x], [vi("y", TensorProto.BOOL if op.startswith("Is") else F, x.shape)])
    add("test_rand_isinf_neg", helper.make_node("IsInf", ["x"], ["y"], detect_positive=0),
        [vi("x", F, x.shape)], [x], [vi("y", TensorProto.BOOL, x.shape)])
    add("test_rand_shrink", helper.make_node("Shrink", ["x"], ["y"], lambd=0.7, bias=0.2),
        [vi("x", F, x.shape)], [np.nan_to_num(x, posinf=2, neginf=-2)], [vi("y", F, x.shape)])
    d = rng.standard_normal((4, 6, 5)).astype(np.float32)
    for axis in (0, 1, 2):
        shp = list(d.shape)
        shp[axis] = 3
        idx = rng.integers(-d.shape[axis], d.shape[axis], size=shp).astype(np.int64)
        add("test_rand_gather_elements_axis%d" % axis,
            helper.make_node("GatherElements", ["d", "i"], ["y"], axis=axis),
            [vi("d", F, d.shape), vi("i", I, idx.shape)], [d, idx], [vi("y", F, idx.shape)])
        upd = rng.standard_normal(shp).astype(np.float32)
        # distinct indices along the axis: "none" is then well defined
        perm = np.argsort(rng.random(d.shape), axis=axis)
        sl = [slice(None)] * 3
        sl[axis] = slice(0, 3)
        uidx = perm[tuple(sl)].astype(np.int64)
        for red in ("none", "add", "mul", "max", "min"):
            add("test_rand_scatter_elements_axis%d_%s" % (axis, red),
                helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=axis, reduction=red),
                [vi("d", F, d.shape), vi("i", I, uidx.shape), vi("u", F, upd.shape)],
                [d, uidx if red == "none" else idx, upd], [vi("y", F, d.shape)], opset=18)
    # ScatterND: rows of an embedding-gradient-like table, with repeats for add
    tab = rng.standard_normal((10, 4)).astype(np.float32)
    rows = rng.integers(0, 10, size=(6, 1)).astype(np.int64)
    upd = rng.standard_normal((6, 4)).astype(np.float32)
    add("test_rand_scatternd_add_rows", helper.make_node("ScatterND", ["d", "i", "u"], ["y"], reduction="add"),
        [vi("d", F, tab.shape), vi("i", I, rows.shape), vi("u", F, upd.shape)], [tab, rows, upd],
        [vi("y", F, tab.shape)], opset=18)
    cube = rng.standard_normal((3, 4, 5)).astype(np.float32)
    pts = np.array([[[0, 1], [2, 3]], [[1, 0], [0, 2]]], dtype=np.int64)
    upd2 = rng.standard_normal((2, 2, 5)).astype(np.float32)
    add("test_rand_scatternd_pairs", helper.make_node("ScatterND", ["d", "i", "u"], ["y"]),
        [vi("d", F, cube.shape), vi("i", I, pts.shape), vi("u", F, upd2.shape)], [cube, pts, upd2],
        [vi("y", F, cube.shape)], opset=16)
    m = rng.standard_normal((2, 5, 6)).astype(np.float32)
    for upper in (0, 1):
        for k in (-2, 0, 3):
            kt = numpy_helper.from_array(np.array(k, dtype=np.int64), "k")
            add("test_rand_trilu_u%d_k%d" % (upper, k), helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper),
                [vi("x", F, m.shape)], [m], [vi("y", F, m.shape)], inits=[kt])
    for axis in (0, 2):
        for excl in (0, 1):
            for rev in (0, 1):
                at = numpy_helper.from_array(np.array(axis, dtype=np.int64), "a")
                add("test_rand_cumsum_a%d_e%d_r%d" % (axis, excl, rev),
                    helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=excl, reverse=rev),
                    [vi("x", F, m.shape)], [m], [vi("y", F, m.shape)], inits=[at])
    for op in ("ArgMax", "ArgMin"):
        for axis, keep, last in ((0, 1, 0), (1, 0, 0), (2, 1, 1)):
            q = np.round(m * 2) / 2   # ties, for select_last_index
            shp = list(m.shape)
            if keep:
                shp[axis] = 1
            else:
                shp.pop(axis)
            add("test_rand_%s_a%d_k%d_l%d" % (op.lower(), axis, keep, last),
                helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keep, select_last_index=last),
                [vi("x", F, m.shape)], [q], [vi("y", I, shp)])
    for eq, sa, sb in (("ij,jk->ik", (3, 4), (4, 5)), ("bhqd,bhkd->bhqk", (2, 3, 4, 8), (2, 3, 5, 8)),
                       ("i,j->ij", (6,), (4,)), ("...ij,...jk", (2, 3, 4), (2, 4, 5)),
                       ("bij,bjk->bki", (2, 3, 4), (2, 4, 5)), ("ij,ij->i", (3, 4), (3, 4)),
                       ("abc,cd->abd", (2, 3, 4), (4, 5))):
        a = rng.standard_normal(sa).astype(np.float32)
        b = rng.standard_normal(sb).astype(np.float32)
        name = "test_rand_einsum_" + eq.replace(",", "_").replace("->", "_to_").replace("...", "E")
        add(name, helper.make_node("Einsum", ["a", "b"], ["y"], equation=eq),
            [vi("a", F, sa), vi("b", F, sb)], [a, b], [vi("y", F, None)], opset=12)
    add("test_rand_einsum_transpose_sum", helper.make_node("Einsum", ["a"], ["y"], equation="ijk->kj"),
        [vi("a", F, (3, 4, 5))], [rng.standard_normal((3, 4, 5)).astype(np.float32)], [vi("y", F, None)], opset=12)
    img = rng.standard_normal((1, 8, 3, 4)).astype(np.float32)
    for mode in ("DCR", "CRD"):
        add("test_rand_depthtospace_%s" % mode.lower(),
            helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode),
            [vi("x", F, img.shape)], [img], [vi("y", F, (1, 2, 6, 8))])
    add("test_rand_spacetodepth", helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2),
        [vi("x", F, (1, 2, 4, 6))], [rng.standard_normal((1, 2, 4, 6)).astype(np.float32)],
        [vi("y", F, (1, 8, 2, 3))])
    small = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    for mode, ctm, nm, scales in (("nearest", "asymmetric", "floor", (1, 1, 2, 3)),
                                  ("nearest", "half_pixel", "round_prefer_floor", (1, 1, 1.6, 0.6)),
                                  ("nearest", "align_corners", "round_prefer_ceil", (1, 1, 2, 1.5)),
                                  ("linear", "half_pixel", "round_prefer_floor", (1, 1, 2, 2)),
                                  ("linear", "pytorch_half_pixel", "round_prefer_floor", (1, 1, 0.5, 1.7)),
                                  ("linear", "align_corners", "round_prefer_floor", (1, 1, 3, 0.5)),
                                  ("linear", "asymmetric", "round_prefer_floor", (1, 1, 1.5, 2))):
        st = numpy_helper.from_array(np.array(scales, dtype=np.float32), "s")
        add("test_rand_resize_%s_%s_%s" % (mode, ctm, "x".join(str(s) for s in scales[2:])),
            helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, coordinate_transformation_mode=ctm,
                             nearest_mode=nm),
            [vi("x", F, small.shape)], [small], [vi("y", F, None)], inits=[st], opset=13)
    cond = rng.random((3, 1, 5)) > 0.5
    add("test_rand_where_broadcast", helper.make_node("Where", ["c", "a", "b"], ["y"]),
        [vi("c", TensorProto.BOOL, cond.shape), vi("a", F, (4, 1)), vi("b", F, (1, 5))],
        [cond, rng.standard_normal((4, 1)).astype(np.float32), rng.standard_normal((1, 5)).astype(np.float32)],
        [vi("y", F, (3, 4, 5))])
    rep = numpy_helper.from_array(np.array([2, 1, 3], dtype=np.int64), "r")
    add("test_rand_tile", helper.make_node("Tile", ["x", "r"], ["y"]), [vi("x", F, (2, 3, 4))],
        [rng.standard_normal((2, 3, 4)).astype(np.float32)], [vi("y", F, (4, 3, 12))], inits=[rep])
    # A constant array holding -inf and NaN (an attention mask folded at
    # import): CUDA needs them spelled as constant initializers.
    mask = np.where(rng.random((4, 64)) > 0.5, 0.0, -np.inf).astype(np.float32)
    mask[0, 0] = np.nan
    add("test_rand_const_inf_mask", helper.make_node("Add", ["x", "m"], ["y"]), [vi("x", F, (4, 64))],
        [rng.standard_normal((4, 64)).astype(np.float32)], [vi("y", F, (4, 64))],
        inits=[numpy_helper.from_array(mask, "m")])
    return cases


def hostile_cases():
    """Models a client must not be able to hurt the importer or the daemon
    with: each must be refused with an error before anything large is
    allocated.  Yields (name, model, feeds, why, expected words of the
    error), the words written to expect_error for the caller to match."""
    F, I = TensorProto.FLOAT, TensorProto.INT64
    out = []

    def one(name, nodes, inputs, outputs, inits, why, feeds, expect):
        g = helper.make_graph(nodes, name, inputs, outputs, inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        m.ir_version = 8
        out.append((name, m, feeds, why, expect))

    i64 = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)
    f32 = lambda n, v: numpy_helper.from_array(np.array(v, np.float32), n)
    x = np.zeros((2, 3), np.float32)
    X = lambda: [vi("x", F, (2, 3))]
    one("test_hostile_range_2e12", [helper.make_node("Range", ["s", "l", "d"], ["y"])], [], [vi("y", I, None)],
        [i64("s", 0), i64("l", 2 * 10 ** 12), i64("d", 1)], "a Range of 2e12 elements", [],
        "Range of 2000000000000 elements")
    one("test_hostile_range_inf", [helper.make_node("Range", ["s", "l", "d"], ["y"])], [], [vi("y", F, None)],
        [f32("s", 0), f32("l", np.inf), f32("d", 1)], "a Range up to infinity", [], "Range from 0 to inf")
    one("test_hostile_tile_huge", [helper.make_node("Tile", ["x", "r"], ["y"])], X(),
        [vi("y", F, None)], [i64("r", [1 << 30, 1 << 30])], "a Tile of 2^61 elements", [x],
        "Tile: result of more than")
    one("test_hostile_resize_huge", [helper.make_node("Resize", ["x", "", "sc"], ["y"])], X(),
        [vi("y", F, None)], [f32("sc", [1e9, 1e9])], "a Resize to 2e9 x 3e9", [x], "Resize: output too large")
    one("test_hostile_resize_long_axis", [helper.make_node("Resize", ["x", "", "sc"], ["y"])], X(),
        [vi("y", F, None)], [f32("sc", [1e9, 1])], "a Resize to 2e9 x 3 (index tables of 2e9)", [x],
        "Resize: output axis 0 of 2000000000 elements")
    one("test_hostile_gather_elements_index", [helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
        X(), [vi("y", F, (2, 2))], [i64("i", [[0, 1], [2, 99]])], "an index of 99 for 3", [x],
        "GatherElements: index 99")
    one("test_hostile_scatternd_index", [helper.make_node("ScatterND", ["x", "i", "u"], ["y"])],
        X(), [vi("y", F, (2, 3))], [i64("i", [[5]]), f32("u", np.ones((1, 3)))], "row 5 of 2", [x],
        "ScatterND: index 5")
    one("test_hostile_einsum_labels", [helper.make_node("Einsum", ["x"], ["y"], equation="ab->abcdefghij")],
        X(), [vi("y", F, None)], [], "10 output labels, more than a term can hold", [x],
        "Einsum: 10 labels in one term")
    one("test_hostile_einsum_label_nowhere", [helper.make_node("Einsum", ["x"], ["y"], equation="ab->abc")],
        X(), [vi("y", F, None)], [], "an output label in no operand", [x],
        "Einsum: output label 'c' is in no operand")
    one("test_hostile_cumsum_axis", [helper.make_node("CumSum", ["x", "a"], ["y"])], X(),
        [vi("y", F, (2, 3))], [i64("a", 7)], "axis 7 of rank 2", [x], "axis 7 out of range for rank 2")
    one("test_hostile_trilu_rank1", [helper.make_node("Trilu", ["x"], ["y"])], [vi("x", F, (3,))],
        [vi("y", F, (3,))], [], "Trilu of a vector", [np.zeros(3, np.float32)], "Trilu: input needs rank >= 2")
    return out


def fold_cases(rng):
    """Models whose mask and table subgraphs are computed from constants
    only: after import only the data path must be left (expected node
    counts), and the results must still match onnxruntime."""
    F, I = TensorProto.FLOAT, TensorProto.INT64
    cases = []

    def c(name, vals):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(vals), name))

    # Rotary tables (LLaMA): positions x inverse frequencies, cos and sin.
    T, D = 64, 32
    inv = (1.0 / (10000 ** (np.arange(0, D, 2) / D))).astype(np.float32)
    nodes = [c("start", np.array(0, np.int64)), c("limit", np.array(T, np.int64)), c("delta", np.array(1, np.int64)),
             helper.make_node("Range", ["start", "limit", "delta"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             c("ax1", np.array([1], np.int64)),
             helper.make_node("Unsqueeze", ["posf", "ax1"], ["pos2"]),
             helper.make_node("Mul", ["pos2", "inv"], ["freqs"]),
             helper.make_node("Concat", ["freqs", "freqs"], ["emb"], axis=1),
             helper.make_node("Cos", ["emb"], ["cos"]), helper.make_node("Sin", ["emb"], ["sin"]),
             helper.make_node("Mul", ["x", "cos"], ["a"]), helper.make_node("Mul", ["x", "sin"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    g = helper.make_graph(nodes, "rotary", [vi("x", F, (1, T, D))], [vi("y", F, (1, T, D))],
                          [numpy_helper.from_array(inv, "inv")])
    cases.append(("test_fold_rotary_tables", g, [rng.standard_normal((1, T, D)).astype(np.float32)], 3))

    # A shifted-window mask (Swin): regions written by ScatterND into a
    # zero image, compared pairwise, turned into -100 / 0 by Where.
    H = 40   # the zero image (6400 bytes) is a fill, the mask 10 MB
    rows = np.array([[r, c_, 0] for r in range(H - 8, H) for c_ in range(H)], np.int64).reshape(8, H, 3)
    nodes = [c("shape", np.array([H, H, 1], np.int64)),
             helper.make_node("ConstantOfShape", ["shape"], ["img"], value=numpy_helper.from_array(np.array([0.0], np.float32))),
             c("idx", rows), c("upd", np.ones((8, H), np.float32)),
             helper.make_node("ScatterND", ["img", "idx", "upd"], ["regions"]),
             c("flat", np.array([1, H * H], np.int64)),
             helper.make_node("Reshape", ["regions", "flat"], ["r1"]),
             c("col", np.array([H * H, 1], np.int64)),
             helper.make_node("Reshape", ["regions", "col"], ["r2"]),
             helper.make_node("Sub", ["r2", "r1"], ["d"]),
             c("zero", np.array(0.0, np.float32)), c("neg", np.array(-100.0, np.float32)),
             helper.make_node("Equal", ["d", "zero"], ["same"]),
             helper.make_node("Where", ["same", "zero", "neg"], ["mask"]),
             helper.make_node("Add", ["x", "mask"], ["y"])]
    g = helper.make_graph(nodes, "swin_mask", [vi("x", F, (1, H * H, H * H))], [vi("y", F, (1, H * H, H * H))])
    cases.append(("test_fold_window_mask", g, [rng.standard_normal((1, H * H, H * H)).astype(np.float32)], 1))

    # GatherElements of constants beside IsNaN / Where on the data path.
    tab = rng.standard_normal((4, 8)).astype(np.float32)
    gi = rng.integers(0, 8, size=(4, 8)).astype(np.int64)
    nodes = [c("tab", tab), c("gi", gi), helper.make_node("GatherElements", ["tab", "gi"], ["bias"], axis=1),
             helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("IsNaN", ["p"], ["nan"]),
             c("z", np.array(0.0, np.float32)), helper.make_node("Where", ["nan", "z", "p"], ["q"]),
             helper.make_node("Add", ["q", "bias"], ["y"])]
    g = helper.make_graph(nodes, "gather_consts", [vi("x", F, (4, 8))], [vi("y", F, (4, 8))])
    cases.append(("test_fold_gather_elements_consts", g, [rng.standard_normal((4, 8)).astype(np.float32)], 4))
    out = []
    for name, graph, feeds, expect in cases:
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        out.append((name, m, feeds, expect))
    return out


# Node tests of ../shared/testdata whose every input, made an initializer,
# lets the importer fold the whole node: the reference evaluator's
# convolutions, pools, normalisations and Gemm against the official outputs.
CONST_FROM = ("test_conv", "test_convtranspose", "test_averagepool", "test_maxpool", "test_batchnorm",
              "test_instancenorm", "test_layer_normalization", "test_gemm", "test_lrn",
              "test_globalaveragepool", "test_globalmaxpool", "test_matmul", "test_softmax")


def constant_variants(testdata, root):
    """Writes DIR/consts/<test>: the test with its inputs made Constant
    nodes, so the whole test folds at import -- unless one of them is
    floating-point data over 4 KiB, a weight (bound at launch, never folded
    into), and the test is compiled instead.  expect_fold says which:
    "fold N" (N nodes left, one Identity per output) or "weights"."""
    src = os.path.join(testdata, "onnx-node")
    n = 0
    for name in sorted(os.listdir(src)) if os.path.isdir(src) else []:
        if not name.startswith(CONST_FROM) or "expanded" in name:
            continue
        d = os.path.join(src, name)
        m = onnx.load(os.path.join(d, "model.onnx"))
        inits = {t.name for t in m.graph.initializer}
        feed = [i.name for i in m.graph.input if i.name not in inits]
        ds = os.path.join(d, "test_data_set_0")
        ins, outs = [], []
        for k in range(len(feed)):
            t = onnx.TensorProto()
            with open(os.path.join(ds, "input_%d.pb" % k), "rb") as f:
                t.ParseFromString(f.read())
            ins.append(numpy_helper.to_array(t))
        k = 0
        while os.path.exists(os.path.join(ds, "output_%d.pb" % k)):
            t = onnx.TensorProto()
            with open(os.path.join(ds, "output_%d.pb" % k), "rb") as f:
                t.ParseFromString(f.read())
            outs.append(numpy_helper.to_array(t))
            k += 1
        consts = [helper.make_node("Constant", [], [nm], value=numpy_helper.from_array(a, nm))
                  for nm, a in zip(feed, ins)]
        nodes = consts + list(m.graph.node)
        del m.graph.node[:]
        m.graph.node.extend(nodes)
        for i in reversed(range(len(m.graph.input))):
            if m.graph.input[i].name in feed:
                del m.graph.input[i]
        write_case(root, name + "_consts", m, [([], outs)])
        weights = any(a.dtype.kind == "f" and a.nbytes > 4096 for a in ins)
        with open(os.path.join(root, name + "_consts", "expect_fold"), "w") as f:
            f.write("weights\n" if weights else "fold %d\n" % len(m.graph.output))
        n += 1
    return n


def with_ort(root, cases):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    for name, model, feeds in cases:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        outs = sess.run(None, dict(zip(names, feeds)))
        write_case(root, name, model, [(feeds, outs)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--testdata", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                        "..", "..", "shared", "testdata"))
    a = ap.parse_args()
    refused = os.path.join(a.out, "refused")
    n = official(os.path.join(a.out, "spec"), refused)
    cases = random_cases(np.random.default_rng(a.seed))
    with_ort(os.path.join(a.out, "random"), cases)
    folds = fold_cases(np.random.default_rng(a.seed))
    with_ort(os.path.join(a.out, "fold"), [(nm, m, f) for nm, m, f, _ in folds])
    for nm, _, _, expect in folds:
        with open(os.path.join(a.out, "fold", nm, "expect_nodes"), "w") as f:
            f.write("%d\n" % expect)
    for nm, m, feeds, why, expect in hostile_cases():
        write_case(refused, nm, m, [(feeds, [])])
        with open(os.path.join(refused, nm, "expect_error"), "w") as f:
            f.write(expect + "\n")
        print("onnx_node_gen: %s: refused by design (%s)" % (nm, why))
    nc = constant_variants(a.testdata, os.path.join(a.out, "consts"))
    print("onnx_node_gen: %d specification cases, %d random cases (seed %d) against onnxruntime, "
          "%d folding cases, %d node tests folded whole" % (n, len(cases), a.seed, len(folds), nc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
