/* ops.c -- the op registry: names, pattern kinds and view flags from
 * ops.def, and shape/dtype inference for every op with the normalised
 * attributes that ops.def documents.
 *
 * Inference is written once, for a node that need not belong to a graph
 * (ap__op_infer): the importer uses it to give every node it creates its
 * output shapes, and ap_op_check uses it to check a node of a graph against
 * the shapes its output tensors already carry.  Output shapes follow the
 * ONNX operator specification (https://onnx.ai/onnx/operators/) for the
 * normalised form: numpy broadcasting for binary ops, numpy matmul, the
 * convolution / pooling size formulas with explicit pads, and ONNX's
 * ceil_mode rule that a last window starting in the end padding is dropped.
 */
#include "ops_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct op_info {
	const char *name;
	ap_op_category cat;
	bool view;
};

static const struct op_info op_table[AP_OP_COUNT] = {
#define X(e, name, cat, view) { name, cat, view },
#include "ops.def"
#undef X
};

const char *ap_op_name(ap_op op)
{
	if ((int)op < 0 || op >= AP_OP_COUNT)
		return NULL;
	return op_table[op].name;
}

int ap_op_lookup(const char *name)
{
	if (!name)
		return -1;
	for (int i = 0; i < AP_OP_COUNT; i++)
		if (strcmp(op_table[i].name, name) == 0)
			return i;
	return -1;
}

ap_op_category ap_op_category_of(ap_op op)
{
	if ((int)op < 0 || op >= AP_OP_COUNT)
		return AP_CAT_OPAQUE;
	return op_table[op].cat;
}

bool ap_op_is_view(ap_op op)
{
	if ((int)op < 0 || op >= AP_OP_COUNT)
		return false;
	return op_table[op].view;
}

bool ap__op_shape_given(ap_op op)
{
	return op == AP_OP_RESHAPE || op == AP_OP_EXPAND || op == AP_OP_TILE ||
	       op == AP_OP_SLICE || op == AP_OP_SPLIT;
}

/* ---- helpers ------------------------------------------------------------- */

static void shape_str(const ap_shape *s, char *buf, size_t cap)
{
	size_t n = 0;

	n += (size_t)snprintf(buf + n, cap - n, "[");
	for (int i = 0; i < s->rank && n < cap; i++)
		n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)s->dims[i]);
	if (n < cap)
		snprintf(buf + n, cap - n, "]");
}

static const char *nm(const char *const *names, int i)
{
	return names && names[i] ? names[i] : NULL;
}

int ap__broadcast(const ap_shape *a, const ap_shape *b, ap_shape *r)
{
	int rank = a->rank > b->rank ? a->rank : b->rank;
	ap_shape t;

	t.dtype = a->dtype;
	t.rank = rank;
	for (int i = 0; i < rank; i++) {
		int ia = i - (rank - a->rank), ib = i - (rank - b->rank);
		int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;

		if (da == db || db == 1)
			t.dims[i] = da;
		else if (da == 1)
			t.dims[i] = db;
		else
			return AP_ESHAPE;
	}
	*r = t;
	return 0;
}

/* b broadcasts into a without changing a (ONNX "unidirectional"). */
static bool unidir(const ap_shape *a, const ap_shape *b)
{
	ap_shape r;

	return ap__broadcast(a, b, &r) == 0 && ap_dims_equal(r.rank, r.dims, a->rank, a->dims);
}

static bool is_float(ap_dtype dt)
{
	return ap_dtype_is_floating(dt);
}

static bool is_int(ap_dtype dt)
{
	return dt == AP_DT_I32 || dt == AP_DT_I64 || dt == AP_DT_I8 || dt == AP_DT_U8;
}

static bool is_numeric(ap_dtype dt)
{
	return is_float(dt) || is_int(dt);
}

/* Fetches an INTS attribute of exactly `count` values (count < 0: any
 * count); NULL with err set when absent or of the wrong length. */
static const ap_attr *need_ints(const ap_node *node, const char *attr, int count, ap_error *err)
{
	const ap_attr *a = ap_node_attr(node, attr);

	if (!a || a->type != AP_ATTR_INTS) {
		ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: attribute '%s' (ints) missing",
			     ap_op_name(node->op), attr);
		return NULL;
	}
	if (count >= 0 && a->n_ints != count) {
		ap_error_set(err, AP_EINVAL, node->name, NULL,
			     "%s: attribute '%s' has %d values, %d expected",
			     ap_op_name(node->op), attr, a->n_ints, count);
		return NULL;
	}
	return a;
}

static int need_int(const ap_node *node, const char *attr, int64_t *v, ap_error *err)
{
	const ap_attr *a = ap_node_attr(node, attr);

	if (!a || a->type != AP_ATTR_INT)
		return ap_error_set(err, AP_EINVAL, node->name, NULL,
				    "%s: attribute '%s' (int) missing", ap_op_name(node->op), attr);
	*v = a->i;
	return 0;
}

static int bad_shape(const ap_node *node, const char *tensor, ap_error *err, const char *what,
		     const ap_shape *a, const ap_shape *b)
{
	char sa[160], sb[160];

	shape_str(a, sa, sizeof(sa));
	if (b) {
		shape_str(b, sb, sizeof(sb));
		return ap_error_set(err, AP_ESHAPE, node->name, tensor, "%s: %s: %s vs %s",
				    ap_op_name(node->op), what, sa, sb);
	}
	return ap_error_set(err, AP_ESHAPE, node->name, tensor, "%s: %s: %s",
			    ap_op_name(node->op), what, sa);
}

static int bad_dtype(const ap_node *node, const char *tensor, ap_error *err, ap_dtype dt)
{
	return ap_error_set(err, AP_EUNSUPPORTED, node->name, tensor,
			    "%s: input of dtype %s not supported", ap_op_name(node->op),
			    ap_dtype_name(dt));
}

/* Number of inputs / outputs each op takes. */
static void arity(ap_op op, int *min_in, int *max_in, int *min_out, int *max_out)
{
	*min_in = *max_in = 1;
	*min_out = *max_out = 1;
	switch (ap_op_category_of(op)) {
	case AP_CAT_BROADCAST:
		*min_in = *max_in = 2;
		break;
	default:
		break;
	}
	switch (op) {
	case AP_OP_WHERE: *min_in = *max_in = 3; break;
	case AP_OP_EXPAND: *min_in = *max_in = 1; break;
	case AP_OP_LAYER_NORM: *min_in = 2; *max_in = 3; *max_out = 3; break;
	case AP_OP_BATCH_NORM: *min_in = *max_in = 5; *max_out = 3; break;
	case AP_OP_INSTANCE_NORM: *min_in = *max_in = 3; break;
	case AP_OP_MATMUL: *min_in = *max_in = 2; break;
	case AP_OP_GEMM: *min_in = 2; *max_in = 3; break;
	case AP_OP_CONV: case AP_OP_CONV_TRANSPOSE: *min_in = 2; *max_in = 3; break;
	case AP_OP_CONCAT: *max_in = 1 << 20; break;
	case AP_OP_SPLIT: *max_out = 1 << 20; break;
	case AP_OP_GATHER: case AP_OP_GATHER_ELEMENTS: *min_in = *max_in = 2; break;
	case AP_OP_SCATTER_ELEMENTS: case AP_OP_SCATTER_ND: *min_in = *max_in = 3; break;
	case AP_OP_ATTENTION: *min_in = 3; *max_in = 4; *max_out = 2; break;
	case AP_OP_ATTENTION_GRAD: *min_in = 6; *max_in = 7; *min_out = *max_out = 3; break;
	default: break;
	}
}

/* ---- per-family inference -------------------------------------------------- */

static int infer_unary(const ap_node *node, const ap_shape *x, ap_shape *y,
		       const char *const *names, ap_error *err)
{
	*y = *x;
	switch (node->op) {
	case AP_OP_IDENTITY:
		return 0;
	case AP_OP_CAST: {
		int64_t to;

		if (need_int(node, "to", &to, err) < 0)
			return err ? err->code : AP_EINVAL;
		if (!ap_dtype_in_graphs((ap_dtype)to))
			return ap_error_set(err, AP_EUNSUPPORTED, node->name, NULL,
					    "Cast: unsupported target dtype %lld", (long long)to);
		y->dtype = (ap_dtype)to;
		return 0;
	}
	case AP_OP_NOT:
		if (x->dtype != AP_DT_BOOL)
			return bad_dtype(node, nm(names, 0), err, x->dtype);
		return 0;
	case AP_OP_NEG: case AP_OP_ABS: case AP_OP_SIGN: case AP_OP_RELU: case AP_OP_CLIP:
		if (!is_numeric(x->dtype))
			return bad_dtype(node, nm(names, 0), err, x->dtype);
		return 0;
	case AP_OP_IS_NAN: case AP_OP_IS_INF:
		if (!is_float(x->dtype))
			return bad_dtype(node, nm(names, 0), err, x->dtype);
		y->dtype = AP_DT_BOOL;
		return 0;
	default:
		if (!is_float(x->dtype))
			return bad_dtype(node, nm(names, 0), err, x->dtype);
		return 0;
	}
}

static int infer_binary(const ap_node *node, const ap_shape *a, const ap_shape *b, ap_shape *y,
			const char *const *names, ap_error *err)
{
	bool logic = node->op == AP_OP_AND || node->op == AP_OP_OR || node->op == AP_OP_XOR;
	bool cmp = node->op == AP_OP_EQUAL || node->op == AP_OP_LESS || node->op == AP_OP_GREATER ||
		   node->op == AP_OP_LESS_OR_EQUAL || node->op == AP_OP_GREATER_OR_EQUAL;

	if (logic) {
		if (a->dtype != AP_DT_BOOL)
			return bad_dtype(node, nm(names, 0), err, a->dtype);
		if (b->dtype != AP_DT_BOOL)
			return bad_dtype(node, nm(names, 1), err, b->dtype);
	} else if (node->op == AP_OP_POW) {
		if (!is_numeric(a->dtype))
			return bad_dtype(node, nm(names, 0), err, a->dtype);
		if (!is_numeric(b->dtype))
			return bad_dtype(node, nm(names, 1), err, b->dtype);
	} else {
		if (a->dtype != b->dtype)
			return ap_error_set(err, AP_ESHAPE, node->name, nm(names, 1),
					    "%s: operand dtypes differ: %s vs %s", ap_op_name(node->op),
					    ap_dtype_name(a->dtype), ap_dtype_name(b->dtype));
		if (node->op != AP_OP_EQUAL && !is_numeric(a->dtype))
			return bad_dtype(node, nm(names, 0), err, a->dtype);
	}
	if (ap__broadcast(a, b, y) < 0)
		return bad_shape(node, nm(names, 1), err, "shapes do not broadcast", a, b);
	if (node->op == AP_OP_PRELU && !ap_dims_equal(y->rank, y->dims, a->rank, a->dims))
		return bad_shape(node, nm(names, 1), err, "slope does not broadcast to the input", a, b);
	y->dtype = (cmp || logic) ? AP_DT_BOOL : a->dtype;
	return 0;
}

static int infer_reduce(const ap_node *node, const ap_shape *x, ap_shape *y, ap_error *err)
{
	const ap_attr *axes = need_ints(node, "axes", -1, err);
	int64_t keep = ap_node_int(node, "keepdims", 1);
	bool red[AP_MAX_RANK] = { false };

	if (!axes)
		return AP_EINVAL;
	if (axes->n_ints == 0)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: empty axes",
				    ap_op_name(node->op));
	for (int i = 0; i < axes->n_ints; i++) {
		int64_t a = axes->ints[i];

		if (a < 0 || a >= x->rank || (i > 0 && a <= axes->ints[i - 1]))
			return ap_error_set(err, AP_EINVAL, node->name, NULL,
					    "%s: axes must be sorted, distinct and in [0,%d): %lld",
					    ap_op_name(node->op), x->rank, (long long)a);
		red[a] = true;
	}
	if (keep != 0 && keep != 1)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: keepdims %lld",
				    ap_op_name(node->op), (long long)keep);
	if (!is_numeric(x->dtype))
		return bad_dtype(node, NULL, err, x->dtype);
	y->dtype = x->dtype;
	y->rank = 0;
	for (int d = 0; d < x->rank; d++) {
		if (!red[d])
			y->dims[y->rank++] = x->dims[d];
		else if (keep)
			y->dims[y->rank++] = 1;
	}
	return 0;
}

static int infer_softmax(const ap_node *node, const ap_shape *x, ap_shape *y, ap_error *err)
{
	const ap_attr *axes = need_ints(node, "axes", -1, err);

	if (!axes)
		return AP_EINVAL;
	if (axes->n_ints == 0)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: empty axes",
				    ap_op_name(node->op));
	for (int i = 0; i < axes->n_ints; i++)
		if (axes->ints[i] < 0 || axes->ints[i] >= x->rank ||
		    (i > 0 && axes->ints[i] <= axes->ints[i - 1]))
			return ap_error_set(err, AP_EINVAL, node->name, NULL,
					    "%s: axes must be sorted, distinct and in [0,%d)",
					    ap_op_name(node->op), x->rank);
	if (!is_float(x->dtype))
		return bad_dtype(node, NULL, err, x->dtype);
	*y = *x;
	return 0;
}

static int infer_layer_norm(const ap_node *node, const ap_shape *const *in, int n_in,
			    ap_shape *out, int n_out, const char *const *names, ap_error *err)
{
	const ap_shape *x = in[0];
	int64_t axis;
	ap_shape norm;

	if (need_int(node, "axis", &axis, err) < 0)
		return AP_EINVAL;
	if (axis < 0 || axis >= x->rank)
		return ap_error_set(err, AP_EINVAL, node->name, NULL,
				    "LayerNormalization: axis %lld out of [0,%d)", (long long)axis, x->rank);
	if (!is_float(x->dtype))
		return bad_dtype(node, nm(names, 0), err, x->dtype);
	norm.dtype = x->dtype;
	norm.rank = x->rank - (int)axis;
	for (int i = 0; i < norm.rank; i++)
		norm.dims[i] = x->dims[axis + i];
	for (int i = 1; i < n_in; i++) {
		if (!in[i])
			continue;
		if (in[i]->dtype != x->dtype)
			return bad_dtype(node, nm(names, i), err, in[i]->dtype);
		if (!unidir(&norm, in[i]))
			return bad_shape(node, nm(names, i), err,
					 "scale/bias does not broadcast to the normalised shape",
					 in[i], &norm);
	}
	out[0] = *x;
	for (int k = 1; k < n_out; k++) {
		/* Mean and InvStdDev: float32 over float32 and 16-bit X (ONNX's
		 * stash_type 1, ATen's native_layer_norm), X's own dtype over
		 * float64 (ATen's; the expander computes no float64
		 * normalisation in float32) */
		out[k] = *x;
		out[k].dtype = x->dtype == AP_DT_F64 ? AP_DT_F64 : AP_DT_F32;
		for (int d = (int)axis; d < x->rank; d++)
			out[k].dims[d] = 1;
	}
	return 0;
}

/* BatchNormalization (5 inputs) and InstanceNormalization (3): per-channel
 * vectors of length C = X.dims[1]. */
static int infer_channel_norm(const ap_node *node, const ap_shape *const *in, int n_in,
			      ap_shape *y, const char *const *names, ap_error *err)
{
	const ap_shape *x = in[0];

	if (x->rank < 2)
		return bad_shape(node, nm(names, 0), err, "input needs rank >= 2", x, NULL);
	if (!is_float(x->dtype))
		return bad_dtype(node, nm(names, 0), err, x->dtype);
	for (int i = 1; i < n_in; i++) {
		if (in[i]->rank != 1 || in[i]->dims[0] != x->dims[1])
			return bad_shape(node, nm(names, i), err,
					 "per-channel operand must be [C] for input", in[i], x);
		if (in[i]->dtype != x->dtype)
			return bad_dtype(node, nm(names, i), err, in[i]->dtype);
	}
	*y = *x;
	return 0;
}

/* BatchNormalization: Y as X; in training mode (training_mode=1) the
 * optional running_mean and running_var outputs, [C] of X's dtype. */
static int infer_batch_norm(const ap_node *node, const ap_shape *const *in, int n_in,
			    ap_shape *out, int n_out, const char *const *names, ap_error *err)
{
	int64_t tm = ap_node_int(node, "training_mode", 0);
	int rc;

	if (tm != 0 && tm != 1)
		return ap_error_set(err, AP_EINVAL, node->name, NULL,
				    "BatchNormalization: training_mode %lld is not 0 or 1",
				    (long long)tm);
	if (n_out > 1 && tm == 0)
		return ap_error_set(err, AP_EINVAL, node->name, NULL,
				    "BatchNormalization: running_mean/running_var outputs need "
				    "training_mode=1");
	rc = infer_channel_norm(node, in, n_in, &out[0], names, err);
	if (rc < 0)
		return rc;
	for (int k = 1; k < n_out; k++) {
		out[k].dtype = in[0]->dtype;
		out[k].rank = 1;
		out[k].dims[0] = in[0]->dims[1];
	}
	return 0;
}

static int infer_matmul(const ap_node *node, const ap_shape *a0, const ap_shape *b0, ap_shape *y,
			const char *const *names, ap_error *err)
{
	ap_shape a = *a0, b = *b0, ba, bb, bat;
	bool drop_m = false, drop_n = false;
	int64_t m, k, k2, n;
	/* Y declared float32 over 16-bit operands: the float32 accumulation,
	 * unrounded (ops.def) */
	bool wide = y->dtype == AP_DT_F32 && (a0->dtype == AP_DT_F16 || a0->dtype == AP_DT_BF16);

	if (a.rank < 1 || b.rank < 1)
		return bad_shape(node, nm(names, 0), err, "operands need rank >= 1", a0, b0);
	if (a.dtype != b.dtype)
		return bad_dtype(node, nm(names, 1), err, b.dtype);
	if (!is_numeric(a.dtype))
		return bad_dtype(node, nm(names, 0), err, a.dtype);
	if (a.rank == 1) {
		a.rank = 2;
		a.dims[1] = a.dims[0];
		a.dims[0] = 1;
		drop_m = true;
	}
	if (b.rank == 1) {
		b.rank = 2;
		b.dims[1] = 1;
		drop_n = true;
	}
	m = a.dims[a.rank - 2];
	k = a.dims[a.rank - 1];
	k2 = b.dims[b.rank - 2];
	n = b.dims[b.rank - 1];
	if (k != k2)
		return bad_shape(node, nm(names, 1), err, "inner dimensions differ", a0, b0);
	ba = a;
	ba.rank -= 2;
	bb = b;
	bb.rank -= 2;
	if (ap__broadcast(&ba, &bb, &bat) < 0)
		return bad_shape(node, nm(names, 1), err, "batch dimensions do not broadcast", a0, b0);
	*y = bat;
	y->dtype = wide ? AP_DT_F32 : a.dtype;
	if (!drop_m)
		y->dims[y->rank++] = m;
	if (!drop_n)
		y->dims[y->rank++] = n;
	if (y->rank > AP_MAX_RANK)
		return bad_shape(node, NULL, err, "result rank too large", a0, b0);
	return 0;
}

static int infer_gemm(const ap_node *node, const ap_shape *const *in, int n_in, ap_shape *y,
		      const char *const *names, ap_error *err)
{
	const ap_shape *a = in[0], *b = in[1];
	int64_t ta = ap_node_int(node, "transA", 0), tb = ap_node_int(node, "transB", 0);
	int64_t m, k, k2, n;

	if (a->rank != 2 || b->rank != 2)
		return bad_shape(node, nm(names, 0), err, "A and B must be 2-D", a, b);
	if (a->dtype != b->dtype || !is_numeric(a->dtype))
		return bad_dtype(node, nm(names, 1), err, b->dtype);
	m = ta ? a->dims[1] : a->dims[0];
	k = ta ? a->dims[0] : a->dims[1];
	k2 = tb ? b->dims[1] : b->dims[0];
	n = tb ? b->dims[0] : b->dims[1];
	if (k != k2)
		return bad_shape(node, nm(names, 1), err, "inner dimensions differ", a, b);
	y->dtype = a->dtype;
	y->rank = 2;
	y->dims[0] = m;
	y->dims[1] = n;
	if (n_in > 2 && in[2]) {
		if (in[2]->dtype != a->dtype)
			return bad_dtype(node, nm(names, 2), err, in[2]->dtype);
		if (!unidir(y, in[2]))
			return bad_shape(node, nm(names, 2), err, "C does not broadcast to [M,N]",
					 in[2], y);
	}
	return 0;
}

/* Reads k-long strides/dilations and 2k-long pads for a window op. */
static int window_attrs(const ap_node *node, int k, const int64_t **strides,
			const int64_t **pads, const int64_t **dil, ap_error *err)
{
	const ap_attr *s = need_ints(node, "strides", k, err), *p, *d;

	if (!s)
		return AP_EINVAL;
	p = need_ints(node, "pads", 2 * k, err);
	if (!p)
		return AP_EINVAL;
	d = need_ints(node, "dilations", k, err);
	if (!d)
		return AP_EINVAL;
	for (int i = 0; i < k; i++)
		if (s->ints[i] <= 0 || d->ints[i] <= 0)
			return ap_error_set(err, AP_EINVAL, node->name, NULL,
					    "%s: strides and dilations must be positive",
					    ap_op_name(node->op));
	*strides = s->ints;
	*pads = p->ints;
	*dil = d->ints;
	return 0;
}

static int infer_conv(const ap_node *node, const ap_shape *const *in, int n_in, ap_shape *y,
		      const char *const *names, ap_error *err)
{
	const ap_shape *x = in[0], *w = in[1];
	int64_t group = ap_node_int(node, "group", 1);
	int k = x->rank - 2;
	const int64_t *s, *p, *d;
	int64_t m;

	if (x->rank < 3 || w->rank != x->rank)
		return bad_shape(node, nm(names, 1), err, "X [N,C,...] and W need equal rank >= 3", x, w);
	if (!is_float(x->dtype) || w->dtype != x->dtype)
		return bad_dtype(node, nm(names, 1), err, w->dtype);
	if (window_attrs(node, k, &s, &p, &d, err) < 0)
		return AP_EINVAL;
	if (group <= 0)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "group %lld", (long long)group);
	if (node->op == AP_OP_CONV) {
		if (x->dims[1] != w->dims[1] * group || w->dims[0] % group != 0)
			return bad_shape(node, nm(names, 1), err, "channels do not match the weight",
					 x, w);
		m = w->dims[0];
	} else {
		const ap_attr *op = need_ints(node, "output_padding", k, err);

		if (!op)
			return AP_EINVAL;
		if (x->dims[1] != w->dims[0] || w->dims[0] % group != 0)
			return bad_shape(node, nm(names, 1), err, "channels do not match the weight",
					 x, w);
		m = w->dims[1] * group;
		y->dtype = x->dtype;
		y->rank = x->rank;
		y->dims[0] = x->dims[0];
		y->dims[1] = m;
		for (int i = 0; i < k; i++) {
			int64_t o = s[i] * (x->dims[2 + i] - 1) + op->ints[i] +
				    (w->dims[2 + i] - 1) * d[i] + 1 - p[i] - p[k + i];
			if (o <= 0)
				return bad_shape(node, nm(names, 0), err,
						 "non-positive output size for input", x, NULL);
			y->dims[2 + i] = o;
		}
		goto bias;
	}
	y->dtype = x->dtype;
	y->rank = x->rank;
	y->dims[0] = x->dims[0];
	y->dims[1] = m;
	for (int i = 0; i < k; i++) {
		int64_t span = x->dims[2 + i] + p[i] + p[k + i] - ((w->dims[2 + i] - 1) * d[i] + 1);

		if (span < 0)
			return bad_shape(node, nm(names, 0), err,
					 "kernel larger than the padded input", x, w);
		y->dims[2 + i] = span / s[i] + 1;
	}
bias:
	if (n_in > 2 && in[2] && (in[2]->rank != 1 || in[2]->dims[0] != m))
		return bad_shape(node, nm(names, 2), err, "bias must be [M]", in[2], y);
	return 0;
}

static int infer_pool(const ap_node *node, const ap_shape *x, ap_shape *y,
		      const char *const *names, ap_error *err)
{
	int k = x->rank - 2;
	const ap_attr *ks;
	const int64_t *s, *p, *d;
	int64_t ceil_mode = ap_node_int(node, "ceil_mode", 0);

	if (x->rank < 3)
		return bad_shape(node, nm(names, 0), err, "input needs rank >= 3", x, NULL);
	if (!is_float(x->dtype))
		return bad_dtype(node, nm(names, 0), err, x->dtype);
	ks = need_ints(node, "kernel_shape", k, err);
	if (!ks || window_attrs(node, k, &s, &p, &d, err) < 0)
		return AP_EINVAL;
	*y = *x;
	for (int i = 0; i < k; i++) {
		int64_t in = x->dims[2 + i];
		int64_t span = in + p[i] + p[k + i] - ((ks->ints[i] - 1) * d[i] + 1);
		int64_t o;

		if (ks->ints[i] <= 0 || span < 0)
			return bad_shape(node, nm(names, 0), err,
					 "kernel larger than the padded input", x, NULL);
		if (ceil_mode) {
			o = (span + s[i] - 1) / s[i] + 1;
			/* the last window must start inside the input or the
			 * begin padding */
			if ((o - 1) * s[i] >= in + p[i])
				o--;
		} else {
			o = span / s[i] + 1;
		}
		y->dims[2 + i] = o;
	}
	return 0;
}

static int infer_transpose(const ap_node *node, const ap_shape *x, ap_shape *y, ap_error *err)
{
	const ap_attr *perm = need_ints(node, "perm", x->rank, err);
	bool seen[AP_MAX_RANK] = { false };

	if (!perm)
		return AP_EINVAL;
	*y = *x;
	for (int i = 0; i < x->rank; i++) {
		int64_t p = perm->ints[i];

		if (p < 0 || p >= x->rank || seen[p])
			return ap_error_set(err, AP_EINVAL, node->name, NULL,
					    "Transpose: perm is not a permutation of [0,%d)", x->rank);
		seen[p] = true;
		y->dims[i] = x->dims[p];
	}
	return 0;
}

static int infer_concat(const ap_node *node, const ap_shape *const *in, int n_in, ap_shape *y,
			const char *const *names, ap_error *err)
{
	int64_t axis;

	if (need_int(node, "axis", &axis, err) < 0)
		return AP_EINVAL;
	if (axis < 0 || axis >= in[0]->rank)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "Concat: axis %lld out of [0,%d)",
				    (long long)axis, in[0]->rank);
	*y = *in[0];
	for (int i = 1; i < n_in; i++) {
		const ap_shape *s = in[i];

		if (!s)
			return ap_error_set(err, AP_EINVAL, node->name, NULL, "Concat: input %d missing", i);
		if (s->dtype != y->dtype)
			return bad_dtype(node, nm(names, i), err, s->dtype);
		if (s->rank != y->rank)
			return bad_shape(node, nm(names, i), err, "ranks differ", in[0], s);
		for (int d = 0; d < s->rank; d++)
			if (d != axis && s->dims[d] != in[0]->dims[d])
				return bad_shape(node, nm(names, i), err,
						 "dimensions off the axis differ", in[0], s);
		y->dims[axis] += s->dims[axis];
	}
	return 0;
}

static int infer_gather(const ap_node *node, const ap_shape *x, const ap_shape *idx, ap_shape *y,
			const char *const *names, ap_error *err)
{
	int64_t axis;

	if (need_int(node, "axis", &axis, err) < 0)
		return AP_EINVAL;
	if (axis < 0 || axis >= x->rank)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "Gather: axis %lld out of [0,%d)",
				    (long long)axis, x->rank);
	if (idx->dtype != AP_DT_I32 && idx->dtype != AP_DT_I64)
		return bad_dtype(node, nm(names, 1), err, idx->dtype);
	if (x->rank - 1 + idx->rank > AP_MAX_RANK)
		return bad_shape(node, nm(names, 1), err, "result rank too large", x, idx);
	y->dtype = x->dtype;
	y->rank = 0;
	for (int d = 0; d < axis; d++)
		y->dims[y->rank++] = x->dims[d];
	for (int d = 0; d < idx->rank; d++)
		y->dims[y->rank++] = idx->dims[d];
	for (int d = (int)axis + 1; d < x->rank; d++)
		y->dims[y->rank++] = x->dims[d];
	return 0;
}

static int infer_pad(const ap_node *node, const ap_shape *x, ap_shape *y, ap_error *err)
{
	const ap_attr *pads = need_ints(node, "pads", 2 * x->rank, err);
	const char *mode = ap_node_string(node, "mode", "constant");

	if (!pads)
		return AP_EINVAL;
	if (strcmp(mode, "constant") && strcmp(mode, "reflect") && strcmp(mode, "edge"))
		return ap_error_set(err, AP_EUNSUPPORTED, node->name, NULL, "Pad: mode '%s'", mode);
	*y = *x;
	for (int d = 0; d < x->rank; d++) {
		y->dims[d] = x->dims[d] + pads->ints[d] + pads->ints[x->rank + d];
		if (y->dims[d] < 0)
			return bad_shape(node, NULL, err, "pads make a negative dimension of", x, NULL);
		if (strcmp(mode, "reflect") == 0 &&
		    (pads->ints[d] >= x->dims[d] || pads->ints[x->rank + d] >= x->dims[d]) &&
		    (pads->ints[d] > 0 || pads->ints[x->rank + d] > 0))
			return bad_shape(node, NULL, err, "reflect pads must be smaller than the input",
					 x, NULL);
	}
	return 0;
}

/* An int attribute that must be one of `lo`..`hi` (absent: dflt). */
static int int_in(const ap_node *node, const char *attr, int64_t dflt, int64_t lo, int64_t hi,
		  int64_t *v, ap_error *err)
{
	*v = ap_node_int(node, attr, dflt);
	if (*v < lo || *v > hi)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: %s %lld out of [%lld,%lld]",
				    ap_op_name(node->op), attr, (long long)*v, (long long)lo,
				    (long long)hi);
	return 0;
}

static bool index_dtype(ap_dtype dt)
{
	return dt == AP_DT_I32 || dt == AP_DT_I64;
}

/* GatherElements (2 inputs) and ScatterElements (3): indices of data's
 * rank, no larger than data off the axis; updates shaped as indices. */
static int infer_elements(const ap_node *node, const ap_shape *const *in, int n_in, ap_shape *y,
			  const char *const *names, ap_error *err)
{
	const ap_shape *x = in[0], *idx = in[1];
	int64_t axis;
	const char *red = ap_node_string(node, "reduction", "none");

	if (x->rank < 1 || idx->rank != x->rank)
		return bad_shape(node, nm(names, 1), err, "indices need the rank of data", idx, x);
	if (int_in(node, "axis", 0, 0, x->rank - 1, &axis, err) < 0)
		return AP_EINVAL;
	if (!index_dtype(idx->dtype))
		return bad_dtype(node, nm(names, 1), err, idx->dtype);
	for (int d = 0; d < x->rank; d++)
		if (d != axis && idx->dims[d] > x->dims[d])
			return bad_shape(node, nm(names, 1), err,
					 "indices are larger than data off the axis", idx, x);
	if (node->op == AP_OP_GATHER_ELEMENTS) {
		*y = *idx;
		y->dtype = x->dtype;
		return 0;
	}
	if (strcmp(red, "none") && strcmp(red, "add") && strcmp(red, "mul") && strcmp(red, "max") &&
	    strcmp(red, "min"))
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: reduction '%s'",
				    ap_op_name(node->op), red);
	if (n_in < 3 || in[2]->dtype != x->dtype)
		return bad_dtype(node, nm(names, 2), err, in[2]->dtype);
	if (!ap_dims_equal(in[2]->rank, in[2]->dims, idx->rank, idx->dims))
		return bad_shape(node, nm(names, 2), err, "updates must have the shape of indices",
				 in[2], idx);
	*y = *x;
	return 0;
}

/* ScatterND: indices [..., k] address data's first k dims; updates are
 * indices' leading dims then data's dims from k on. */
static int infer_scatter_nd(const ap_node *node, const ap_shape *const *in, ap_shape *y,
			    const char *const *names, ap_error *err)
{
	const ap_shape *x = in[0], *idx = in[1], *up = in[2];
	const char *red = ap_node_string(node, "reduction", "none");
	ap_shape want;
	int64_t k;

	if (idx->rank < 1 || !index_dtype(idx->dtype))
		return bad_shape(node, nm(names, 1), err, "indices must be int32/int64 of rank >= 1",
				 idx, NULL);
	k = idx->dims[idx->rank - 1];
	if (k < 1 || k > x->rank)
		return bad_shape(node, nm(names, 1), err, "the last dim of indices must be in [1, rank of data]",
				 idx, x);
	if (strcmp(red, "none") && strcmp(red, "add") && strcmp(red, "mul") && strcmp(red, "max") &&
	    strcmp(red, "min"))
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "ScatterND: reduction '%s'", red);
	if (idx->rank - 1 + x->rank - k > AP_MAX_RANK)
		return bad_shape(node, nm(names, 2), err, "updates rank too large", idx, x);
	want.dtype = x->dtype;
	want.rank = 0;
	for (int d = 0; d < idx->rank - 1; d++)
		want.dims[want.rank++] = idx->dims[d];
	for (int d = (int)k; d < x->rank; d++)
		want.dims[want.rank++] = x->dims[d];
	if (up->dtype != x->dtype)
		return bad_dtype(node, nm(names, 2), err, up->dtype);
	if (!ap_dims_equal(up->rank, up->dims, want.rank, want.dims))
		return bad_shape(node, nm(names, 2), err, "updates must be indices[:-1] + data[k:]", up,
				 &want);
	*y = *x;
	return 0;
}

/* CumSum, ArgMax, ArgMin, Trilu: one input, attributes checked. */
static int infer_axis_op(const ap_node *node, const ap_shape *x, ap_shape *y,
			 const char *const *names, ap_error *err)
{
	int64_t axis, flag;

	*y = *x;
	if (node->op == AP_OP_TRILU) {
		if (x->rank < 2)
			return bad_shape(node, nm(names, 0), err, "input needs rank >= 2", x, NULL);
		if (int_in(node, "upper", 1, 0, 1, &flag, err) < 0)
			return AP_EINVAL;
		return 0;
	}
	if (!is_numeric(x->dtype))
		return bad_dtype(node, nm(names, 0), err, x->dtype);
	if (x->rank < 1 || int_in(node, "axis", 0, 0, x->rank - 1, &axis, err) < 0)
		return x->rank < 1 ? bad_shape(node, nm(names, 0), err, "input needs rank >= 1", x, NULL)
				   : AP_EINVAL;
	if (node->op == AP_OP_CUM_SUM)
		return int_in(node, "exclusive", 0, 0, 1, &flag, err) < 0 ||
		       int_in(node, "reverse", 0, 0, 1, &flag, err) < 0 ? AP_EINVAL : 0;
	if (int_in(node, "keepdims", 1, 0, 1, &flag, err) < 0 ||
	    int_in(node, "select_last_index", 0, 0, 1, &flag, err) < 0)
		return AP_EINVAL;
	y->dtype = AP_DT_I64;
	if (ap_node_int(node, "keepdims", 1)) {
		y->dims[axis] = 1;
	} else {
		for (int d = (int)axis; d + 1 < x->rank; d++)
			y->dims[d] = x->dims[d + 1];
		y->rank--;
	}
	if (x->dims[axis] == 0)
		return bad_shape(node, nm(names, 0), err, "cannot take the arg of an empty axis", x, NULL);
	return 0;
}

/* Checks the outputs of the shape-given ops against their inputs. */
static int check_given(const ap_node *node, const ap_shape *x, ap_shape *out, int n_out,
		       const char *const *names, ap_error *err)
{
	switch (node->op) {
	case AP_OP_RESHAPE: {
		int64_t a = ap__shape_numel(x->rank, x->dims), b = ap__shape_numel(out[0].rank, out[0].dims);

		if (a != b || a < 0)
			return bad_shape(node, NULL, err, "element counts differ", x, &out[0]);
		break;
	}
	case AP_OP_EXPAND: {
		ap_shape r;

		if (ap__broadcast(x, &out[0], &r) < 0 ||
		    !ap_dims_equal(r.rank, r.dims, out[0].rank, out[0].dims))
			return bad_shape(node, NULL, err, "input does not expand to", x, &out[0]);
		break;
	}
	case AP_OP_TILE:
		if (out[0].rank != x->rank)
			return bad_shape(node, NULL, err, "ranks differ", x, &out[0]);
		for (int d = 0; d < x->rank; d++)
			if (x->dims[d] == 0 ? out[0].dims[d] != 0 : out[0].dims[d] % x->dims[d] != 0)
				return bad_shape(node, NULL, err, "output is no multiple of", x, &out[0]);
		break;
	case AP_OP_SLICE: {
		const ap_attr *st = need_ints(node, "starts", x->rank, err);
		const ap_attr *sp = need_ints(node, "steps", x->rank, err);

		if (!st || !sp)
			return AP_EINVAL;
		if (out[0].rank != x->rank)
			return bad_shape(node, NULL, err, "ranks differ", x, &out[0]);
		for (int d = 0; d < x->rank; d++) {
			int64_t s = st->ints[d], step = sp->ints[d], n = out[0].dims[d], last;

			if (step == 0)
				return ap_error_set(err, AP_EINVAL, node->name, NULL, "Slice: zero step");
			if (n == 0)
				continue;
			last = s + (n - 1) * step;
			if (s < 0 || s >= x->dims[d] || last < 0 || last >= x->dims[d])
				return ap_error_set(err, AP_ESHAPE, node->name, NULL,
						    "Slice: dim %d: start %lld step %lld for %lld elements leaves [0,%lld)",
						    d, (long long)s, (long long)step, (long long)n,
						    (long long)x->dims[d]);
		}
		break;
	}
	case AP_OP_SPLIT: {
		int64_t axis, sum = 0;

		if (need_int(node, "axis", &axis, err) < 0)
			return AP_EINVAL;
		if (axis < 0 || axis >= x->rank)
			return ap_error_set(err, AP_EINVAL, node->name, NULL,
					    "Split: axis %lld out of [0,%d)", (long long)axis, x->rank);
		for (int k = 0; k < n_out; k++) {
			if (out[k].rank != x->rank)
				return bad_shape(node, NULL, err, "ranks differ", x, &out[k]);
			for (int d = 0; d < x->rank; d++)
				if (d != axis && out[k].dims[d] != x->dims[d])
					return bad_shape(node, NULL, err, "dimensions off the axis differ",
							 x, &out[k]);
			sum += out[k].dims[axis];
		}
		if (sum != x->dims[axis])
			return ap_error_set(err, AP_ESHAPE, node->name, NULL,
					    "Split: parts add up to %lld, axis has %lld", (long long)sum,
					    (long long)x->dims[axis]);
		break;
	}
	default:
		break;
	}
	(void)names;
	for (int k = 0; k < n_out; k++)
		out[k].dtype = x->dtype;
	return 0;
}

/* Attention and AttentionGrad (ops.def): Q, K, V of one float type and
 * rank >= 3, the same leading batch dims, K's heads dividing Q's, K and V
 * of one key count, the optional mask (input `mi`) BOOL or of Q's type and
 * broadcasting to the scores [b..., H, L, S]; scale finite, is_causal and
 * safe_softmax and fp32_scores 0 or 1.  Fills y (Y's shape) and lse
 * (LogSumExp's). */
static int check_attention(const ap_node *node, const ap_shape *q, const ap_shape *k, const ap_shape *v,
			   const ap_shape *mask, ap_shape *y, ap_shape *lse, const char *const *names,
			   int qi, int mi, ap_error *err)
{
	const char *op = ap_op_name(node->op);
	int r = q->rank;
	int64_t causal = ap_node_int(node, "is_causal", 0), safe = ap_node_int(node, "safe_softmax", 1);
	int64_t fp32 = ap_node_int(node, "fp32_scores", 0);
	double scale = ap_node_float(node, "scale", NAN);
	ap_shape s, b;

	if (!is_float(q->dtype))
		return bad_dtype(node, nm(names, qi), err, q->dtype);
	if (k->dtype != q->dtype || v->dtype != q->dtype)
		return ap_error_set(err, AP_ESHAPE, node->name, nm(names, qi + 1), "%s: Q, K and V dtypes differ", op);
	if (r < 3 || k->rank != r || v->rank != r)
		return bad_shape(node, nm(names, qi + 1), err, "Q, K and V need one rank >= 3", q, k);
	for (int d = 0; d < r - 3; d++)
		if (k->dims[d] != q->dims[d] || v->dims[d] != q->dims[d])
			return bad_shape(node, nm(names, qi + 1), err, "batch dims differ", q, k);
	if (k->dims[r - 3] < 1 || k->dims[r - 3] != v->dims[r - 3] || q->dims[r - 3] % k->dims[r - 3] != 0)
		return bad_shape(node, nm(names, qi + 1), err, "K's heads must divide Q's (and equal V's)", q, k);
	if (k->dims[r - 1] != q->dims[r - 1] || v->dims[r - 2] != k->dims[r - 2])
		return bad_shape(node, nm(names, qi + 2), err, "head dims or key counts differ", k, v);
	if (!(scale == scale) || scale == INFINITY || scale == -INFINITY)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: scale must be a finite number", op);
	if (causal != 0 && causal != 1)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: is_causal must be 0 or 1", op);
	if (safe != 0 && safe != 1)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: safe_softmax must be 0 or 1", op);
	if (fp32 != 0 && fp32 != 1)
		return ap_error_set(err, AP_EINVAL, node->name, NULL, "%s: fp32_scores must be 0 or 1", op);
	s = *q;
	s.dims[r - 1] = k->dims[r - 2];
	if (mask) {
		if (mask->dtype != AP_DT_BOOL && mask->dtype != q->dtype)
			return bad_dtype(node, nm(names, mi), err, mask->dtype);
		if (ap__broadcast(&s, mask, &b) < 0 || !ap_dims_equal(b.rank, b.dims, s.rank, s.dims))
			return bad_shape(node, nm(names, mi), err, "the mask does not broadcast to the scores", mask, &s);
	}
	*y = *q;
	y->dims[r - 1] = v->dims[r - 1];
	*lse = *q;
	lse->rank = r - 1;
	lse->dtype = q->dtype == AP_DT_F16 || q->dtype == AP_DT_BF16 ? AP_DT_F32 : q->dtype;
	return 0;
}

static int infer_attention(const ap_node *node, const ap_shape *const *in, int n_in, ap_shape *out,
			   int n_out, const char *const *names, ap_error *err)
{
	ap_shape y, lse;
	bool grad = node->op == AP_OP_ATTENTION_GRAD;
	int qi = grad ? 1 : 0, mi = grad ? 6 : 3;
	int rc = check_attention(node, in[qi], in[qi + 1], in[qi + 2], n_in > mi ? in[mi] : NULL, &y, &lse,
				 names, qi, mi, err);

	if (rc)
		return rc;
	if (!grad) {
		out[0] = y;
		if (n_out > 1)
			out[1] = lse;
		return 0;
	}
	for (int i = 0; i < 2; i++) {
		const ap_shape *want = i ? &lse : &y, *got = in[i ? 5 : 4];

		if (!ap_dims_equal(got->rank, got->dims, want->rank, want->dims) || got->dtype != want->dtype)
			return bad_shape(node, nm(names, i ? 5 : 4), err, i ? "LogSumExp is not Attention's"
								      : "Y is not Attention's", got, want);
	}
	if (!ap_dims_equal(in[0]->rank, in[0]->dims, y.rank, y.dims) || in[0]->dtype != y.dtype)
		return bad_shape(node, nm(names, 0), err, "dY is not Y's shape", in[0], &y);
	out[0] = *in[1];
	out[1] = *in[2];
	out[2] = *in[3];
	return 0;
}

int ap__op_infer(const ap_node *node, const ap_shape *const *in, int n_in,
		 ap_shape *out, int n_out, const char *const *in_names, ap_error *err)
{
	int min_in, max_in, min_out, max_out;
	ap_op op = node->op;

	if ((int)op < 0 || op >= AP_OP_COUNT)
		return ap_error_set(err, AP_EUNSUPPORTED, node->name, NULL, "unknown op %d", (int)op);
	arity(op, &min_in, &max_in, &min_out, &max_out);
	if (n_in < min_in || n_in > max_in || n_out < min_out || n_out > max_out)
		return ap_error_set(err, AP_EINVAL, node->name, NULL,
				    "%s takes %d..%d inputs and %d..%d outputs, not %d and %d",
				    ap_op_name(op), min_in, max_in, min_out, max_out, n_in, n_out);
	for (int i = 0; i < min_in; i++)
		if (!in[i])
			return ap_error_set(err, AP_EINVAL, node->name, NULL,
					    "%s: required input %d missing", ap_op_name(op), i);
	if (op == AP_OP_CONCAT)
		for (int i = 0; i < n_in; i++)
			if (!in[i])
				return ap_error_set(err, AP_EINVAL, node->name, NULL,
						    "Concat: input %d missing", i);
	if (ap__op_shape_given(op))
		return check_given(node, in[0], out, n_out, in_names, err);

	switch (op) {
	case AP_OP_WHERE: {
		ap_shape t;

		if (in[0]->dtype != AP_DT_BOOL)
			return bad_dtype(node, nm(in_names, 0), err, in[0]->dtype);
		if (in[1]->dtype != in[2]->dtype)
			return ap_error_set(err, AP_ESHAPE, node->name, nm(in_names, 2),
					    "Where: x and y dtypes differ");
		if (ap__broadcast(in[0], in[1], &t) < 0 || ap__broadcast(&t, in[2], &out[0]) < 0)
			return bad_shape(node, nm(in_names, 2), err, "shapes do not broadcast", in[1], in[2]);
		out[0].dtype = in[1]->dtype;
		return 0;
	}
	case AP_OP_REDUCE_SUM: case AP_OP_REDUCE_MEAN: case AP_OP_REDUCE_MAX:
	case AP_OP_REDUCE_MIN: case AP_OP_REDUCE_PROD: case AP_OP_REDUCE_SUM_SQUARE:
	case AP_OP_REDUCE_L1: case AP_OP_REDUCE_L2: case AP_OP_REDUCE_LOG_SUM:
	case AP_OP_REDUCE_LOG_SUM_EXP:
		return infer_reduce(node, in[0], &out[0], err);
	case AP_OP_SOFTMAX: case AP_OP_LOG_SOFTMAX:
		return infer_softmax(node, in[0], &out[0], err);
	case AP_OP_LAYER_NORM:
		return infer_layer_norm(node, in, n_in, out, n_out, in_names, err);
	case AP_OP_BATCH_NORM:
		return infer_batch_norm(node, in, n_in, out, n_out, in_names, err);
	case AP_OP_INSTANCE_NORM:
		return infer_channel_norm(node, in, n_in, &out[0], in_names, err);
	case AP_OP_LRN:
		if (ap_node_int(node, "size", 0) <= 0)
			return ap_error_set(err, AP_EINVAL, node->name, NULL, "LRN: size must be positive");
		if (in[0]->rank < 2 || !is_float(in[0]->dtype))
			return bad_shape(node, nm(in_names, 0), err, "input needs rank >= 2", in[0], NULL);
		out[0] = *in[0];
		return 0;
	case AP_OP_MATMUL:
		return infer_matmul(node, in[0], in[1], &out[0], in_names, err);
	case AP_OP_GEMM:
		return infer_gemm(node, in, n_in, &out[0], in_names, err);
	case AP_OP_CONV: case AP_OP_CONV_TRANSPOSE:
		return infer_conv(node, in, n_in, &out[0], in_names, err);
	case AP_OP_MAX_POOL: case AP_OP_AVERAGE_POOL:
		return infer_pool(node, in[0], &out[0], in_names, err);
	case AP_OP_TRANSPOSE:
		return infer_transpose(node, in[0], &out[0], err);
	case AP_OP_CONCAT:
		return infer_concat(node, in, n_in, &out[0], in_names, err);
	case AP_OP_GATHER:
		return infer_gather(node, in[0], in[1], &out[0], in_names, err);
	case AP_OP_PAD:
		return infer_pad(node, in[0], &out[0], err);
	case AP_OP_GATHER_ELEMENTS: case AP_OP_SCATTER_ELEMENTS:
		return infer_elements(node, in, n_in, &out[0], in_names, err);
	case AP_OP_SCATTER_ND:
		return infer_scatter_nd(node, in, &out[0], in_names, err);
	case AP_OP_TRILU: case AP_OP_CUM_SUM: case AP_OP_ARG_MAX: case AP_OP_ARG_MIN:
		return infer_axis_op(node, in[0], &out[0], in_names, err);
	case AP_OP_ATTENTION: case AP_OP_ATTENTION_GRAD:
		return infer_attention(node, in, n_in, out, n_out, in_names, err);
	default:
		break;
	}
	if (ap_op_category_of(op) == AP_CAT_BROADCAST)
		return infer_binary(node, in[0], in[1], &out[0], in_names, err);
	return infer_unary(node, in[0], &out[0], in_names, err);
}

/* Index values of a CONST indices tensor must lie in range: a client's
 * graph is untrusted, and a kernel clamps (Gather*) or skips (Scatter*)
 * what it cannot refuse at run time.  Gather, GatherElements and
 * ScatterElements: [-D, D) with D data's size on the axis; ScatterND:
 * component j of each tuple in [-dims[j], dims[j]). */
static int check_const_indices(const ap_graph *g, const ap_node *node, ap_error *err)
{
	const ap_tensor *x, *idx;
	int64_t n, k = 1;

	if (node->op != AP_OP_GATHER && node->op != AP_OP_GATHER_ELEMENTS &&
	    node->op != AP_OP_SCATTER_ELEMENTS && node->op != AP_OP_SCATTER_ND)
		return 0;
	if (node->n_inputs < 2 || node->inputs[0] < 0 || node->inputs[1] < 0)
		return 0;
	x = &g->tensors[node->inputs[0]];
	idx = &g->tensors[node->inputs[1]];
	if (idx->kind != AP_TENSOR_CONST || !idx->data)
		return 0;
	n = ap_tensor_numel(idx);
	if (n < 0 || (size_t)n * ap_dtype_size(idx->dtype) > idx->nbytes)
		return 0;   /* check_tensors reports a short CONST */
	if (node->op == AP_OP_SCATTER_ND)
		k = idx->rank > 0 ? idx->dims[idx->rank - 1] : 1;
	for (int64_t i = 0; i < n; i++) {
		int64_t v = idx->dtype == AP_DT_I64 ? ((const int64_t *)idx->data)[i]
						    : ((const int32_t *)idx->data)[i];
		int64_t axis = node->op == AP_OP_SCATTER_ND ? i % k : ap_node_int(node, "axis", 0);
		int64_t D = axis >= 0 && axis < x->rank ? x->dims[axis] : 0;

		if (v < -D || v >= D)
			return ap_error_set(err, AP_EINVAL, node->name, idx->name,
					    "%s: index %lld (element %lld of '%s') out of range [%lld,%lld) "
					    "for dim %lld of '%s'", ap_op_name(node->op), (long long)v,
					    (long long)i, idx->name, (long long)-D, (long long)D,
					    (long long)axis, x->name);
	}
	return 0;
}

/* Infers node n of g from its input tensors and either compares the result
 * with its output tensors (ap_op_check: `write` false, g untouched) or
 * writes it into them (ap_graph_infer_node).  Indices must already be in
 * range (ap_graph_validate checks them first). */
static int infer_node(ap_graph *g, int n, bool write, ap_error *err)
{
	const ap_node *node = &g->nodes[n];
	ap_shape ins_buf[8], outs_buf[8];
	ap_shape *ins = ins_buf, *outs = outs_buf;
	const ap_shape **inp = NULL;
	const char **names = NULL;
	int rc = AP_ENOMEM;

	if (node->n_inputs > 8)
		ins = malloc((size_t)node->n_inputs * sizeof(*ins));
	if (node->n_outputs > 8)
		outs = malloc((size_t)node->n_outputs * sizeof(*outs));
	inp = malloc((size_t)(node->n_inputs + 1) * sizeof(*inp));
	names = malloc((size_t)(node->n_inputs + 1) * sizeof(*names));
	if (!ins || !outs || !inp || !names) {
		ap_error_set(err, AP_ENOMEM, node->name, NULL, "out of memory");
		goto done;
	}
	for (int i = 0; i < node->n_inputs; i++) {
		int t = node->inputs[i];

		inp[i] = NULL;
		names[i] = NULL;
		if (t < 0)
			continue;
		ins[i].dtype = g->tensors[t].dtype;
		ins[i].rank = g->tensors[t].rank;
		memcpy(ins[i].dims, g->tensors[t].dims, sizeof(ins[i].dims));
		inp[i] = &ins[i];
		names[i] = g->tensors[t].name;
	}
	for (int k = 0; k < node->n_outputs; k++) {
		int t = node->outputs[k];

		memset(&outs[k], 0, sizeof(outs[k]));
		if (t < 0) {
			if (ap__op_shape_given(node->op)) {
				rc = ap_error_set(err, AP_EINVAL, node->name, NULL,
						  "%s: output %d must be produced", ap_op_name(node->op), k);
				goto done;
			}
			continue;
		}
		outs[k].dtype = g->tensors[t].dtype;
		outs[k].rank = g->tensors[t].rank;
		memcpy(outs[k].dims, g->tensors[t].dims, sizeof(outs[k].dims));
	}
	rc = ap__op_infer(node, inp, node->n_inputs, outs, node->n_outputs, names, err);
	if (rc == 0)
		rc = check_const_indices(g, node, err);
	if (rc < 0)
		goto done;
	for (int k = 0; k < node->n_outputs; k++) {
		int t = node->outputs[k];
		const ap_tensor *ten;

		if (t < 0)
			continue;
		ten = &g->tensors[t];
		if (write)
			continue;
		if (ten->dtype != outs[k].dtype) {
			rc = ap_error_set(err, AP_ESHAPE, node->name, ten->name,
					  "%s: output '%s' has dtype %s, the op gives %s",
					  ap_op_name(node->op), ten->name, ap_dtype_name(ten->dtype),
					  ap_dtype_name(outs[k].dtype));
			goto done;
		}
		if (ten->rank != outs[k].rank || memcmp(ten->dims, outs[k].dims,
							(size_t)ten->rank * sizeof(int64_t))) {
			ap_shape ts;
			char sa[160], sb[160];

			ts.rank = ten->rank;
			memcpy(ts.dims, ten->dims, sizeof(ts.dims));
			shape_str(&ts, sa, sizeof(sa));
			shape_str(&outs[k], sb, sizeof(sb));
			rc = ap_error_set(err, AP_ESHAPE, node->name, ten->name,
					  "%s: output '%s' has shape %s, the op gives %s",
					  ap_op_name(node->op), ten->name, sa, sb);
			goto done;
		}
	}
	for (int k = 0; write && k < node->n_outputs; k++) {
		ap_tensor *ten = node->outputs[k] >= 0 ? &g->tensors[node->outputs[k]] : NULL;

		if (!ten)
			continue;
		ten->dtype = outs[k].dtype;
		ten->rank = outs[k].rank;
		memcpy(ten->dims, outs[k].dims, sizeof(ten->dims));
	}
	rc = 0;
done:
	if (ins != ins_buf)
		free(ins);
	if (outs != outs_buf)
		free(outs);
	free(inp);
	free(names);
	return rc;
}

int ap_op_check(const ap_graph *g, int n, ap_error *err)
{
	return infer_node((ap_graph *)g, n, false, err);
}

int ap_graph_infer_node(ap_graph *g, int n, ap_error *err)
{
	const ap_node *node;

	if (n < 0 || n >= g->n_nodes)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "node %d out of range", n);
	node = &g->nodes[n];
	for (int i = 0; i < node->n_inputs; i++)
		if (node->inputs[i] >= g->n_tensors || node->inputs[i] < -1)
			return ap_error_set(err, AP_EINVAL, node->name, NULL, "input %d out of range", i);
	for (int k = 0; k < node->n_outputs; k++)
		if (node->outputs[k] >= g->n_tensors || node->outputs[k] < -1)
			return ap_error_set(err, AP_EINVAL, node->name, NULL, "output %d out of range", k);
	return infer_node(g, n, true, err);
}
