/* expand.c -- opening compound ops into primitives (see partition.h).
 *
 * In: a validated graph.  Out: a new graph with the same tensors at the
 * same indices, the same inputs and outputs, and every AP_CAT_COMPOUND node
 * replaced by primitives that compute the same thing; every other node is
 * copied with its attributes.  Nodes are emitted in the original order and
 * each expansion in dependency order, so the result stays topologically
 * sorted.  Each node made from an original node carries that node's name.
 * New intermediate tensors are named "<node>/<what><n>"; scalar constants
 * become rank-0 CONST tensors (kernels bake them in as literals).
 *
 * Rules (x: input, r: its rank, A: the reduced / normalised axes, n: the
 * number of elements they hold):
 *   ReduceMean      ReduceSum(x) / n
 *   ReduceSumSquare ReduceSum(x * x)
 *   ReduceL1        ReduceSum(Abs(x))
 *   ReduceL2        Sqrt(ReduceSum(x * x))
 *   ReduceLogSum    Log(ReduceSum(x))
 *   ReduceLogSumExp m = ReduceMax(x, keepdims=1);
 *                   Log(ReduceSum(Exp(x - m))) + m  (m reshaped without
 *                   keepdims): stable for large inputs
 *   Softmax         m = ReduceMax(x); e = Exp(x - m); e / ReduceSum(e)
 *   LogSoftmax      d = x - ReduceMax(x); d - Log(ReduceSum(Exp(d)))
 *   LayerNorm       mean = ReduceSum(x) / n; d = x - mean;
 *                   inv = Reciprocal(Sqrt(ReduceSum(d * d) / n + eps));
 *                   y = d * inv * scale (+ B); Mean and InvStdDev outputs
 *                   are the `mean` and `inv` tensors (keepdims shape)
 *   InstanceNorm    the same over the spatial axes 2..r-1, scale and B
 *                   reshaped to [C, 1, ...]
 *   BatchNorm       y = (x - mean) * (scale / Sqrt(var + eps)) + B, the
 *                   per-channel vectors reshaped to [C, 1, ...];
 *                   in training mode mean and var are the batch's,
 *                   computed as for LayerNorm over A = {0, 2, ..., r-1}
 *                   (keepdims, population variance):
 *                   y = d * inv * scale + B, and when asked
 *                   running_mean = input_mean * momentum +
 *                   Reshape(mean, [C]) * (1 - momentum), running_var the
 *                   same with var
 *   Gemm            y = MatMul(A', B') (* alpha) (+ C (* beta)), with
 *                   A' = Transpose(A) when transA, B' likewise
 *   Attention       S = MatMul(Q, Transpose(K)) * scale, masked (Where
 *                   -inf / Add; causal: Where(Cast(Trilu(Expand(1)))));
 *                   softmax as above; Y = MatMul(P, V); LogSumExp =
 *                   Cast(m) + Log(Cast(l)) reshaped (expand_attention)
 * and, when asked (open_all), the elementwise activations the lowering
 * otherwise computes natively:
 *   Gelu            0.5 * x * (1 + Erf(x * 1/sqrt(2))), or with
 *                   approximate=tanh 0.5 * x * (1 + Tanh(sqrt(2/pi) *
 *                   (x + 0.044715 * x * x * x)))
 *   Softplus        Relu(x) + Log(1 + Exp(-Abs(x)))  (never overflows)
 *   Mish            x * Tanh(Softplus(x))
 *   HardSigmoid     Clip(alpha * x + beta, 0, 1)
 *   HardSwish       x * Clip(x / 6 + 1/2, 0, 1)
 *   Elu             Relu(x) + alpha * (Exp(Min(x, 0)) - 1)
 *   Selu            gamma * (Relu(x) + alpha * (Exp(Min(x, 0)) - 1))
 *
 * The registry (`registry` below) says, per op, whether it is opened by
 * default; opt->keep_whole overrides it.  A compound op kept whole is
 * written as its primitives all the same -- the lowering has no other
 * form for it -- each marked with the attribute "_whole" (the original
 * node's index + 1) so the partitioner seals them into one group.
 * A graph output that is an INPUT, PARAM or CONST tensor gets an Identity
 * copy, so that every output is written by some kernel.
 */
#include "partition.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ex {
	const ap_graph *g;
	ap_graph *ng;
	const char *name;      /* the original node being expanded */
	int counter;
	int rc;
	ap_error *err;
} ex;

static int fail(ex *e, int code, const char *msg)
{
	if (e->rc == 0) {
		e->rc = code;
		ap_error_set(e->err, code, e->name, NULL, "%s", msg);
	}
	return -1;
}

static int new_tensor(ex *e, const char *what, ap_dtype dt, int rank, const int64_t *dims)
{
	char name[300];
	int64_t d[AP_MAX_RANK];
	int t;

	if (e->rc)
		return -1;
	/* `dims` may point into the tensor array, which adding a tensor moves */
	for (int i = 0; i < rank && i < AP_MAX_RANK; i++)
		d[i] = dims[i];
	snprintf(name, sizeof(name), "%s/%s%d", e->name, what, e->counter++);
	t = ap_graph_add_tensor(e->ng, name, dt, rank, d, AP_TENSOR_VALUE, NULL, 0);
	if (t < 0)
		return fail(e, t, "out of memory adding a tensor");
	return t;
}

static int scalar_const(ex *e, ap_dtype dt, double v)
{
	unsigned char buf[8];
	char name[300];
	int t;

	if (e->rc)
		return -1;
	switch (dt) {
	case AP_DT_F32: { float f = (float)v; memcpy(buf, &f, 4); break; }
	case AP_DT_F64: memcpy(buf, &v, 8); break;
	case AP_DT_F16: case AP_DT_BF16: ap_elem_set(buf, dt, 0, v); break;
	case AP_DT_I64: { int64_t i = (int64_t)v; memcpy(buf, &i, 8); break; }
	case AP_DT_I32: { int32_t i = (int32_t)v; memcpy(buf, &i, 4); break; }
	default: buf[0] = (unsigned char)(int)v; break;
	}
	snprintf(name, sizeof(name), "%s/const%d", e->name, e->counter++);
	t = ap_graph_add_tensor(e->ng, name, dt, 0, NULL, AP_TENSOR_CONST, buf, ap_dtype_size(dt));
	if (t < 0)
		return fail(e, t, "out of memory adding a constant");
	return t;
}

static const ap_tensor *T(ex *e, int t)
{
	return &e->ng->tensors[t];
}

static int add_node(ex *e, ap_op op, int n_in, const int *in, int out)
{
	int n;

	if (e->rc || out < 0)
		return -1;
	for (int i = 0; i < n_in; i++)
		if (in[i] < 0)
			return fail(e, AP_EINTERNAL, "expansion lost an operand");
	n = ap_graph_add_node(e->ng, e->name, op, n_in, in, 1, &out);
	if (n < 0)
		return fail(e, n, "out of memory adding a node");
	return n;
}

/* numpy broadcast of two shapes into (rank, dims). */
static void broadcast(const ap_tensor *a, const ap_tensor *b, int *rank, int64_t *dims)
{
	int r = a->rank > b->rank ? a->rank : b->rank;

	for (int i = 0; i < r; i++) {
		int ia = i - (r - a->rank), ib = i - (r - b->rank);
		int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;

		dims[i] = da == 1 ? db : da;
	}
	*rank = r;
}

static int unary(ex *e, ap_op op, int x, int out)
{
	if (e->rc || x < 0)
		return -1;
	if (out < 0)
		out = new_tensor(e, ap_op_name(op), T(e, x)->dtype, T(e, x)->rank, T(e, x)->dims);
	return add_node(e, op, 1, &x, out) < 0 ? -1 : out;
}

static int binary(ex *e, ap_op op, int a, int b, int out)
{
	int in[2] = {a, b};
	int rank;
	int64_t dims[AP_MAX_RANK];

	if (e->rc || a < 0 || b < 0)
		return -1;
	if (out < 0) {
		broadcast(T(e, a), T(e, b), &rank, dims);
		out = new_tensor(e, ap_op_name(op), T(e, a)->dtype, rank, dims);
	}
	return add_node(e, op, 2, in, out) < 0 ? -1 : out;
}

static int reduce(ex *e, ap_op op, int x, const int64_t *axes, int n_axes, int keepdims, int out)
{
	int n, rank = 0;
	int64_t dims[AP_MAX_RANK];
	bool red[AP_MAX_RANK] = {false};

	if (e->rc || x < 0)
		return -1;
	for (int i = 0; i < n_axes; i++)
		red[axes[i]] = true;
	if (out < 0) {
		for (int d = 0; d < T(e, x)->rank; d++) {
			if (!red[d])
				dims[rank++] = T(e, x)->dims[d];
			else if (keepdims)
				dims[rank++] = 1;
		}
		out = new_tensor(e, ap_op_name(op), T(e, x)->dtype, rank, dims);
	}
	n = add_node(e, op, 1, &x, out);
	if (n < 0)
		return -1;
	if (ap_node_set_ints(e->ng, n, "axes", axes, n_axes) < 0 ||
	    ap_node_set_int(e->ng, n, "keepdims", keepdims) < 0)
		return fail(e, AP_ENOMEM, "out of memory setting attributes");
	return out;
}

static int reshape(ex *e, int x, int rank, const int64_t *dims, int out)
{
	if (e->rc || x < 0)
		return -1;
	if (out < 0)
		out = new_tensor(e, "Reshape", T(e, x)->dtype, rank, dims);
	return add_node(e, AP_OP_RESHAPE, 1, &x, out) < 0 ? -1 : out;
}

/* x converted to dtype `to` (a Cast node; x itself when it has that dtype
 * and no `out` is given). */
static int cast(ex *e, int x, ap_dtype to, int out)
{
	int n;

	if (e->rc || x < 0)
		return -1;
	if (out < 0 && T(e, x)->dtype == to)
		return x;
	if (out < 0)
		out = new_tensor(e, "Cast", to, T(e, x)->rank, T(e, x)->dims);
	n = add_node(e, AP_OP_CAST, 1, &x, out);
	if (n < 0)
		return -1;
	if (ap_node_set_int(e->ng, n, "to", to) < 0)
		return fail(e, AP_ENOMEM, "out of memory setting attributes");
	return out;
}

static int transpose_last2(ex *e, int x)
{
	int64_t dims[AP_MAX_RANK], perm[AP_MAX_RANK];
	int out, n, r;

	if (e->rc || x < 0)
		return -1;
	r = T(e, x)->rank;
	for (int d = 0; d < r; d++) {
		perm[d] = d;
		dims[d] = T(e, x)->dims[d];
	}
	perm[r - 2] = r - 1;
	perm[r - 1] = r - 2;
	dims[r - 2] = T(e, x)->dims[r - 1];
	dims[r - 1] = T(e, x)->dims[r - 2];
	out = new_tensor(e, "Transpose", T(e, x)->dtype, r, dims);
	n = add_node(e, AP_OP_TRANSPOSE, 1, &x, out);
	if (n < 0)
		return -1;
	if (ap_node_set_ints(e->ng, n, "perm", perm, r) < 0)
		return fail(e, AP_ENOMEM, "out of memory setting attributes");
	return out;
}

/* Number of elements over `axes` of tensor x. */
static int64_t count_over(const ap_tensor *x, const int64_t *axes, int n_axes)
{
	int64_t n = 1;

	for (int i = 0; i < n_axes; i++)
		n *= x->dims[axes[i]];
	return n;
}

static const ap_attr *axes_attr(ex *e, const ap_node *node)
{
	const ap_attr *a = ap_node_attr(node, "axes");

	if (!a || a->type != AP_ATTR_INTS || a->n_ints <= 0 || a->n_ints > AP_MAX_RANK) {
		fail(e, AP_EUNSUPPORTED, "missing or bad normalised `axes`");
		return NULL;
	}
	return a;
}

static int in_at(const ap_node *node, int i)
{
	return i < node->n_inputs ? node->inputs[i] : -1;
}

static int out_at(const ap_node *node, int i)
{
	return i < node->n_outputs ? node->outputs[i] : -1;
}

static void expand_reduce(ex *e, const ap_node *node)
{
	const ap_attr *ax = axes_attr(e, node);
	int x = in_at(node, 0), y = out_at(node, 0);
	int keep = (int)ap_node_int(node, "keepdims", 1);
	ap_dtype dt;
	int s;

	if (!ax)
		return;
	dt = T(e, x)->dtype;
	switch (node->op) {
	case AP_OP_REDUCE_MEAN:
		s = reduce(e, AP_OP_REDUCE_SUM, x, ax->ints, ax->n_ints, keep, -1);
		binary(e, AP_OP_DIV, s,
		       scalar_const(e, dt, (double)count_over(T(e, x), ax->ints, ax->n_ints)), y);
		break;
	case AP_OP_REDUCE_SUM_SQUARE:
		reduce(e, AP_OP_REDUCE_SUM, binary(e, AP_OP_MUL, x, x, -1), ax->ints, ax->n_ints, keep, y);
		break;
	case AP_OP_REDUCE_L1:
		reduce(e, AP_OP_REDUCE_SUM, unary(e, AP_OP_ABS, x, -1), ax->ints, ax->n_ints, keep, y);
		break;
	case AP_OP_REDUCE_L2:
		s = reduce(e, AP_OP_REDUCE_SUM, binary(e, AP_OP_MUL, x, x, -1), ax->ints, ax->n_ints,
			   keep, -1);
		unary(e, AP_OP_SQRT, s, y);
		break;
	case AP_OP_REDUCE_LOG_SUM:
		unary(e, AP_OP_LOG, reduce(e, AP_OP_REDUCE_SUM, x, ax->ints, ax->n_ints, keep, -1), y);
		break;
	case AP_OP_REDUCE_LOG_SUM_EXP: {
		int m = reduce(e, AP_OP_REDUCE_MAX, x, ax->ints, ax->n_ints, 1, -1);
		int ex_ = unary(e, AP_OP_EXP, binary(e, AP_OP_SUB, x, m, -1), -1);
		int l = unary(e, AP_OP_LOG, reduce(e, AP_OP_REDUCE_SUM, ex_, ax->ints, ax->n_ints, keep, -1),
			      -1);
		int m2 = m;

		if (!keep && !e->rc)
			m2 = reshape(e, m, T(e, y)->rank, T(e, y)->dims, -1);
		binary(e, AP_OP_ADD, l, m2, y);
		break;
	}
	default:
		fail(e, AP_EINTERNAL, "not a compound reduction");
	}
}

static void expand_softmax(ex *e, const ap_node *node)
{
	const ap_attr *ax = axes_attr(e, node);
	int x = in_at(node, 0), y = out_at(node, 0);
	int m, d, s;

	if (!ax)
		return;
	m = reduce(e, AP_OP_REDUCE_MAX, x, ax->ints, ax->n_ints, 1, -1);
	d = binary(e, AP_OP_SUB, x, m, -1);
	if (node->op == AP_OP_SOFTMAX) {
		int ee = unary(e, AP_OP_EXP, d, -1);

		s = reduce(e, AP_OP_REDUCE_SUM, ee, ax->ints, ax->n_ints, 1, -1);
		binary(e, AP_OP_DIV, ee, s, y);
	} else {
		s = reduce(e, AP_OP_REDUCE_SUM, unary(e, AP_OP_EXP, d, -1), ax->ints, ax->n_ints, 1, -1);
		binary(e, AP_OP_SUB, d, unary(e, AP_OP_LOG, s, -1), y);
	}
}

/* Shape [C, 1, ..., 1] of rank r-1 for a per-channel vector of an input of
 * rank r (r >= 2); returns the vector itself when r == 2. */
static int per_channel(ex *e, int v, int r)
{
	int64_t dims[AP_MAX_RANK];

	if (e->rc || v < 0 || r <= 2)
		return v;
	dims[0] = T(e, v)->dims[0];
	for (int i = 1; i < r - 1; i++)
		dims[i] = 1;
	return reshape(e, v, r - 1, dims, -1);
}

/* mean, d = x - mean, var = mean of d * d, inv = 1/sqrt(var + eps) over
 * `axes` (keepdims); returns d and sets *inv_t, and *mean_t / *var_t when
 * not NULL (writing mean and inv into the given outputs when >= 0). */
static int normalise(ex *e, int x, const int64_t *axes, int n_axes, double eps, int mean_out,
		     int inv_out, int *inv_t, int *mean_t, int *var_t)
{
	ap_dtype dt = T(e, x)->dtype;
	double n = (double)count_over(T(e, x), axes, n_axes);
	int mean, d, var, inv;

	mean = binary(e, AP_OP_DIV, reduce(e, AP_OP_REDUCE_SUM, x, axes, n_axes, 1, -1),
		      scalar_const(e, dt, n), mean_out);
	d = binary(e, AP_OP_SUB, x, mean, -1);
	var = binary(e, AP_OP_DIV,
		     reduce(e, AP_OP_REDUCE_SUM, binary(e, AP_OP_MUL, d, d, -1), axes, n_axes, 1, -1),
		     scalar_const(e, dt, n), -1);
	inv = unary(e, AP_OP_RECIPROCAL,
		    unary(e, AP_OP_SQRT, binary(e, AP_OP_ADD, var, scalar_const(e, dt, eps), -1), -1),
		    inv_out);
	*inv_t = inv;
	if (mean_t)
		*mean_t = mean;
	if (var_t)
		*var_t = var;
	return d;
}

static void expand_layer_norm(ex *e, const ap_node *node)
{
	int x = in_at(node, 0), scale = in_at(node, 1), b = in_at(node, 2);
	int y = out_at(node, 0), mean_out = out_at(node, 1), inv_out = out_at(node, 2);
	int64_t axis = ap_node_int(node, "axis", -1);
	double eps = ap_node_float(node, "epsilon", 1e-5);
	int64_t axes[AP_MAX_RANK];
	int n_axes = 0, d, inv, sc;

	if (axis < 0 || axis >= T(e, x)->rank) {
		fail(e, AP_EUNSUPPORTED, "LayerNormalization: bad normalised axis");
		return;
	}
	for (int64_t a = axis; a < T(e, x)->rank; a++)
		axes[n_axes++] = a;
	{
		/* Mean and InvStdDev in float32 over 16-bit X (ONNX's stash_type
		 * 1, ATen's native_layer_norm): the whole normalisation runs in
		 * float32 and Y is rounded once, as PyTorch computes it. */
		ap_dtype xt = T(e, x)->dtype;
		ap_dtype st = mean_out >= 0 ? T(e, mean_out)->dtype : inv_out >= 0 ? T(e, inv_out)->dtype : xt;

		if ((mean_out >= 0 && T(e, mean_out)->dtype != st) ||
		    (inv_out >= 0 && T(e, inv_out)->dtype != st) ||
		    (st != xt && !(st == AP_DT_F32 && (xt == AP_DT_F16 || xt == AP_DT_BF16)))) {
			fail(e, AP_EUNSUPPORTED, "LayerNormalization: Mean/InvStdDev dtype neither X's "
			     "nor float32 over 16-bit X");
			return;
		}
		if (st != xt) {
			x = cast(e, x, st, -1);
			scale = cast(e, scale, st, -1);
			if (b >= 0)
				b = cast(e, b, st, -1);
		}
		d = normalise(e, x, axes, n_axes, eps, mean_out, inv_out, &inv, NULL, NULL);
		sc = binary(e, AP_OP_MUL, binary(e, AP_OP_MUL, d, inv, -1), scale,
			    b >= 0 || st != xt ? -1 : y);
		if (b >= 0)
			sc = binary(e, AP_OP_ADD, sc, b, st != xt ? -1 : y);
		if (st != xt)
			cast(e, sc, xt, y);
	}
}

static void expand_instance_norm(ex *e, const ap_node *node)
{
	int x = in_at(node, 0), scale = in_at(node, 1), b = in_at(node, 2);
	int y = out_at(node, 0);
	double eps = ap_node_float(node, "epsilon", 1e-5);
	int r = T(e, x)->rank;
	int64_t axes[AP_MAX_RANK];
	int n_axes = 0, d, inv;

	if (r < 3) {
		fail(e, AP_EUNSUPPORTED, "InstanceNormalization: input rank < 3");
		return;
	}
	for (int a = 2; a < r; a++)
		axes[n_axes++] = a;
	d = normalise(e, x, axes, n_axes, eps, -1, -1, &inv, NULL, NULL);
	binary(e, AP_OP_ADD,
	       binary(e, AP_OP_MUL, binary(e, AP_OP_MUL, d, inv, -1), per_channel(e, scale, r), -1),
	       per_channel(e, b, r), y);
}

/* running = input * momentum + Reshape(current, [C]) * (1 - momentum),
 * written into `out` (a [C] tensor). */
static void running_stat(ex *e, int input, int current, double momentum, int out)
{
	ap_dtype dt;
	int cur;

	if (e->rc || out < 0 || current < 0)
		return;
	dt = T(e, out)->dtype;
	cur = reshape(e, current, 1, T(e, out)->dims, -1);
	binary(e, AP_OP_ADD, binary(e, AP_OP_MUL, input, scalar_const(e, dt, momentum), -1),
	       binary(e, AP_OP_MUL, cur, scalar_const(e, dt, 1.0 - momentum), -1), out);
}

static void expand_batch_norm(ex *e, const ap_node *node)
{
	int x = in_at(node, 0), y = out_at(node, 0);
	int r = T(e, x)->rank;
	ap_dtype dt = T(e, x)->dtype;
	double eps = ap_node_float(node, "epsilon", 1e-5);
	int scale = per_channel(e, in_at(node, 1), r), b = per_channel(e, in_at(node, 2), r);
	int mean, var, a;

	if (ap_node_int(node, "training_mode", 0) == 1) {
		double momentum = ap_node_float(node, "momentum", 0.9);
		int64_t axes[AP_MAX_RANK];
		int n_axes = 0, d, inv;

		axes[n_axes++] = 0;
		for (int i = 2; i < r; i++)
			axes[n_axes++] = i;
		d = normalise(e, x, axes, n_axes, eps, -1, -1, &inv, &mean, &var);
		binary(e, AP_OP_ADD, binary(e, AP_OP_MUL, binary(e, AP_OP_MUL, d, inv, -1), scale, -1),
		       b, y);
		running_stat(e, in_at(node, 3), mean, momentum, out_at(node, 1));
		running_stat(e, in_at(node, 4), var, momentum, out_at(node, 2));
		return;
	}
	mean = per_channel(e, in_at(node, 3), r);
	var = per_channel(e, in_at(node, 4), r);
	a = binary(e, AP_OP_DIV, scale,
		   unary(e, AP_OP_SQRT, binary(e, AP_OP_ADD, var, scalar_const(e, dt, eps), -1), -1),
		   -1);
	binary(e, AP_OP_ADD, binary(e, AP_OP_MUL, binary(e, AP_OP_SUB, x, mean, -1), a, -1), b, y);
}

static void expand_gemm(ex *e, const ap_node *node)
{
	int a = in_at(node, 0), b = in_at(node, 1), c = in_at(node, 2), y = out_at(node, 0);
	double alpha = ap_node_float(node, "alpha", 1.0), beta = ap_node_float(node, "beta", 1.0);
	bool use_c = c >= 0 && beta != 0.0;
	bool scale = alpha != 1.0;
	ap_dtype dt = T(e, y)->dtype;
	int in[2], p;

	if (ap_node_int(node, "transA", 0))
		a = transpose_last2(e, a);
	if (ap_node_int(node, "transB", 0))
		b = transpose_last2(e, b);
	if (e->rc)
		return;
	p = (scale || use_c) ? new_tensor(e, "MatMul", dt, 2, T(e, y)->dims) : y;
	in[0] = a;
	in[1] = b;
	if (add_node(e, AP_OP_MATMUL, 2, in, p) < 0)
		return;
	if (scale)
		p = binary(e, AP_OP_MUL, p, scalar_const(e, dt, alpha), use_c ? -1 : y);
	if (use_c) {
		if (beta != 1.0)
			c = binary(e, AP_OP_MUL, c, scalar_const(e, dt, beta), -1);
		binary(e, AP_OP_ADD, p, c, y);
	}
}

/* ---- attention ------------------------------------------------------------------ */

/* Key or value x [b..., Hk, S, D] read by H query heads: itself when
 * Hk == H, else Reshape [b..., Hk, 1, S, D], Expand [b..., Hk, H/Hk, S, D],
 * Reshape [b..., H, S, D] (views the kernels read in place). */
static int kv_heads(ex *e, int x, int64_t H)
{
	int r = T(e, x)->rank, t;
	int64_t d5[AP_MAX_RANK], d4[AP_MAX_RANK], Hk = T(e, x)->dims[r - 3];

	if (e->rc || Hk == H)
		return x;
	if (r + 1 > AP_MAX_RANK)
		return fail(e, AP_EUNSUPPORTED, "Attention: grouped-query heads need one dim more than the rank limit");
	for (int d = 0; d < r; d++)
		d4[d] = T(e, x)->dims[d];
	for (int d = 0; d < r - 2; d++)
		d5[d] = d4[d];
	d5[r - 2] = 1;
	d5[r - 1] = d4[r - 2];
	d5[r] = d4[r - 1];
	t = reshape(e, x, r + 1, d5, -1);
	d5[r - 2] = H / Hk;
	if (e->rc)
		return -1;
	{
		int out = new_tensor(e, "Expand", T(e, x)->dtype, r + 1, d5);

		t = add_node(e, AP_OP_EXPAND, 1, &t, out) < 0 ? -1 : out;
	}
	d4[r - 3] = H;
	return reshape(e, t, r, d4, -1);
}

/* The causal condition [L, S] (BOOL): key j <= query i, as
 * Cast(Trilu(Expand(1), lower, k = 0)) -- index arithmetic the kernels
 * evaluate in place, no L x S constant. */
static int causal_cond(ex *e, int64_t L, int64_t S)
{
	int64_t dims[2] = {L, S};
	int one = scalar_const(e, AP_DT_F32, 1.0), ex1, tri, n;

	if (e->rc)
		return -1;
	ex1 = new_tensor(e, "Expand", AP_DT_F32, 2, dims);
	if (add_node(e, AP_OP_EXPAND, 1, &one, ex1) < 0)
		return -1;
	tri = new_tensor(e, "Trilu", AP_DT_F32, 2, dims);
	n = add_node(e, AP_OP_TRILU, 1, &ex1, tri);
	if (n < 0)
		return -1;
	if (ap_node_set_int(e->ng, n, "upper", 0) < 0 || ap_node_set_int(e->ng, n, "k", 0) < 0)
		return fail(e, AP_ENOMEM, "out of memory setting attributes");
	return cast(e, tri, AP_DT_BOOL, -1);
}

/* Where(cond, s, -inf): the scores s where cond holds (BOOL, broadcast
 * to s), -inf elsewhere. */
static int masked_out(ex *e, int cond, int s)
{
	int w[3] = {cond, s, scalar_const(e, T(e, s)->dtype, -INFINITY)}, o;

	if (e->rc || cond < 0 || s < 0)
		return -1;
	o = new_tensor(e, "Where", T(e, s)->dtype, T(e, s)->rank, T(e, s)->dims);
	return add_node(e, AP_OP_WHERE, 3, w, o) < 0 ? -1 : o;
}

/* The lowest finite value of float type dt. */

/* Attention (ops.def): KT = Transpose(K'); S = MatMul(Q, KT) * scale;
 * S = Where(mask, S, -inf) or S + mask; S = Where(causal, S, -inf);
 * softmax as expand_softmax (m, E, l, P); Y = MatMul(P, V');
 * LogSumExp = Reshape(Cast(m) + Log(Cast(l))).  With safe_softmax (the
 * default), a row whose scores are all -inf gives P = 0 (ONNX's
 * reference, PyTorch's _safe_softmax):
 * m = Max(ReduceMax(S), lowest finite) -- so E = Exp(-inf - lowest) = 0
 * -- and the sum divided by and logged is Max(l, 1), which is l on every
 * other row (its largest score adds exp(0) = 1); such a row's
 * LogSumExp is the lowest finite value, from which AttentionGrad
 * recomputes P = 0.  K' and V' are K and V
 * read by every query head of their group (kv_heads).  With fp32_scores
 * and 16-bit Q the first product is float32 over the 16-bit operands
 * (never rounded to Q's type), the scale, the mask (Cast to float32) and
 * the softmax are float32, and P is Cast to Q's type for the second
 * product: FlashAttention's numbers (Dao et al. 2022, algorithm 1 keeps
 * S and the statistics in float32), which AttentionGrad's recomputation
 * of P shares; otherwise every step is in Q's type (ONNX's reference).
 * Layer II stitches
 * the products and the softmax into one attention kernel
 * (server/lower/attention.c), which writes the LogSumExp from its row
 * statistics. */
static void expand_attention(ex *e, const ap_node *node)
{
	int q = in_at(node, 0), k = in_at(node, 1), v = in_at(node, 2), mask = in_at(node, 3);
	int y = out_at(node, 0), lse = out_at(node, 1), r = T(e, q)->rank;
	ap_dtype dt = T(e, q)->dtype, acc = dt == AP_DT_F16 || dt == AP_DT_BF16 ? AP_DT_F32 : dt;
	/* the scores' and the softmax's type */
	ap_dtype sdt = ap_node_int(node, "fp32_scores", 0) ? acc : dt;
	int64_t H = T(e, q)->dims[r - 3], L = T(e, q)->dims[r - 2], S = T(e, k)->dims[r - 2];
	int64_t sd[AP_MAX_RANK], axis = r - 1;
	bool safe = ap_node_int(node, "safe_softmax", 1) != 0;
	int kt, s, m, d, ee, l, p, in[2];

	k = kv_heads(e, k, H);
	v = kv_heads(e, v, H);
	kt = transpose_last2(e, k);
	if (e->rc)
		return;
	for (int i = 0; i < r; i++)
		sd[i] = T(e, q)->dims[i];
	sd[r - 1] = S;
	s = new_tensor(e, "MatMul", sdt, r, sd);
	in[0] = q;
	in[1] = kt;
	if (e->rc || add_node(e, AP_OP_MATMUL, 2, in, s) < 0)
		return;
	s = binary(e, AP_OP_MUL, s, scalar_const(e, sdt, ap_node_float(node, "scale", 1.0)), -1);
	if (mask >= 0 && T(e, mask)->dtype == AP_DT_BOOL)
		s = masked_out(e, mask, s);
	else if (mask >= 0)
		s = binary(e, AP_OP_ADD, s, cast(e, mask, sdt, -1), -1);
	if (ap_node_int(node, "is_causal", 0))
		s = masked_out(e, causal_cond(e, L, S), s);
	m = reduce(e, AP_OP_REDUCE_MAX, s, &axis, 1, 1, -1);
	if (safe)
		m = binary(e, AP_OP_MAX, m, scalar_const(e, sdt, ap_dtype_lowest_finite(sdt)), -1);
	d = binary(e, AP_OP_SUB, s, m, -1);
	ee = unary(e, AP_OP_EXP, d, -1);
	l = reduce(e, AP_OP_REDUCE_SUM, ee, &axis, 1, 1, -1);
	if (safe)
		l = binary(e, AP_OP_MAX, l, scalar_const(e, sdt, 1.0), -1);
	p = cast(e, binary(e, AP_OP_DIV, ee, l, -1), dt, -1);
	in[0] = p;
	in[1] = v;
	if (e->rc || add_node(e, AP_OP_MATMUL, 2, in, y) < 0)
		return;
	if (lse >= 0) {
		int a = binary(e, AP_OP_ADD, cast(e, m, acc, -1), unary(e, AP_OP_LOG, cast(e, l, acc, -1), -1), -1);

		reshape(e, a, r - 1, T(e, lse)->dims, lse);
	}
}

/* ---- elementwise activations ---------------------------------------------------- */

static int clip01(ex *e, int x, int out)
{
	int n;

	if (e->rc || x < 0)
		return -1;
	if (out < 0)
		out = new_tensor(e, "Clip", T(e, x)->dtype, T(e, x)->rank, T(e, x)->dims);
	n = add_node(e, AP_OP_CLIP, 1, &x, out);
	if (n < 0)
		return -1;
	if (ap_node_set_float(e->ng, n, "min", 0.0) < 0 || ap_node_set_float(e->ng, n, "max", 1.0) < 0)
		return fail(e, AP_ENOMEM, "out of memory setting attributes");
	return out;
}

/* Relu(x) + Log(1 + Exp(-Abs(x))) */
static int softplus(ex *e, int x, int out)
{
	ap_dtype dt = T(e, x)->dtype;
	int l = unary(e, AP_OP_LOG,
		      binary(e, AP_OP_ADD, scalar_const(e, dt, 1.0),
			     unary(e, AP_OP_EXP, unary(e, AP_OP_NEG, unary(e, AP_OP_ABS, x, -1), -1), -1),
			     -1),
		      -1);

	return binary(e, AP_OP_ADD, unary(e, AP_OP_RELU, x, -1), l, out);
}

/* Relu(x) + alpha * (Exp(Min(x, 0)) - 1) */
static int elu(ex *e, int x, double alpha, int out)
{
	ap_dtype dt = T(e, x)->dtype;
	int neg = binary(e, AP_OP_SUB,
			 unary(e, AP_OP_EXP, binary(e, AP_OP_MIN, x, scalar_const(e, dt, 0.0), -1), -1),
			 scalar_const(e, dt, 1.0), -1);

	return binary(e, AP_OP_ADD, unary(e, AP_OP_RELU, x, -1),
		      binary(e, AP_OP_MUL, scalar_const(e, dt, alpha), neg, -1), out);
}

static void expand_activation(ex *e, const ap_node *node)
{
	int x = in_at(node, 0), y = out_at(node, 0);
	ap_dtype dt;

	if (x < 0 || y < 0) {
		fail(e, AP_EINTERNAL, "activation without its operand");
		return;
	}
	dt = T(e, x)->dtype;
	switch (node->op) {
	case AP_OP_GELU: {
		const char *ap = ap_node_string(node, "approximate", "none");
		int inner;

		if (strcmp(ap, "tanh") == 0) {
			int x3 = binary(e, AP_OP_MUL, binary(e, AP_OP_MUL, x, x, -1), x, -1);
			int u = binary(e, AP_OP_ADD, x,
				       binary(e, AP_OP_MUL, scalar_const(e, dt, 0.044715), x3, -1), -1);

			inner = unary(e, AP_OP_TANH,
				      binary(e, AP_OP_MUL, scalar_const(e, dt, 0.7978845608028654), u, -1),
				      -1);
		} else {
			inner = unary(e, AP_OP_ERF,
				      binary(e, AP_OP_MUL, x, scalar_const(e, dt, 0.7071067811865476), -1),
				      -1);
		}
		binary(e, AP_OP_MUL, binary(e, AP_OP_MUL, scalar_const(e, dt, 0.5), x, -1),
		       binary(e, AP_OP_ADD, scalar_const(e, dt, 1.0), inner, -1), y);
		break;
	}
	case AP_OP_SOFTPLUS:
		softplus(e, x, y);
		break;
	case AP_OP_MISH:
		binary(e, AP_OP_MUL, x, unary(e, AP_OP_TANH, softplus(e, x, -1), -1), y);
		break;
	case AP_OP_HARD_SIGMOID: {
		double a = ap_node_float(node, "alpha", 0.2), b = ap_node_float(node, "beta", 0.5);

		clip01(e, binary(e, AP_OP_ADD, binary(e, AP_OP_MUL, scalar_const(e, dt, a), x, -1),
				 scalar_const(e, dt, b), -1),
		       y);
		break;
	}
	case AP_OP_HARD_SWISH:
		binary(e, AP_OP_MUL, x,
		       clip01(e, binary(e, AP_OP_ADD,
					binary(e, AP_OP_MUL, x, scalar_const(e, dt, 1.0 / 6.0), -1),
					scalar_const(e, dt, 0.5), -1),
			      -1),
		       y);
		break;
	case AP_OP_ELU:
		elu(e, x, ap_node_float(node, "alpha", 1.0), y);
		break;
	case AP_OP_SELU: {
		double a = ap_node_float(node, "alpha", 1.67326319217681884765625);
		double gm = ap_node_float(node, "gamma", 1.05070102214813232421875);

		binary(e, AP_OP_MUL, scalar_const(e, dt, gm), elu(e, x, a, -1), y);
		break;
	}
	default:
		fail(e, AP_EINTERNAL, "not an activation with an expansion");
	}
}

/* ---- the registry ---------------------------------------------------------------- */

typedef void (*expand_fn)(ex *e, const ap_node *node);

static const struct {
	ap_op op;
	expand_fn fn;
	bool open;          /* opened by default */
} registry[] = {
	{AP_OP_REDUCE_MEAN, expand_reduce, true},
	{AP_OP_REDUCE_SUM_SQUARE, expand_reduce, true},
	{AP_OP_REDUCE_L1, expand_reduce, true},
	{AP_OP_REDUCE_L2, expand_reduce, true},
	{AP_OP_REDUCE_LOG_SUM, expand_reduce, true},
	{AP_OP_REDUCE_LOG_SUM_EXP, expand_reduce, true},
	{AP_OP_SOFTMAX, expand_softmax, true},
	{AP_OP_LOG_SOFTMAX, expand_softmax, true},
	{AP_OP_LAYER_NORM, expand_layer_norm, true},
	{AP_OP_INSTANCE_NORM, expand_instance_norm, true},
	{AP_OP_BATCH_NORM, expand_batch_norm, true},
	{AP_OP_GEMM, expand_gemm, true},
	{AP_OP_ATTENTION, expand_attention, true},
	{AP_OP_GELU, expand_activation, false},
	{AP_OP_SOFTPLUS, expand_activation, false},
	{AP_OP_MISH, expand_activation, false},
	{AP_OP_HARD_SIGMOID, expand_activation, false},
	{AP_OP_HARD_SWISH, expand_activation, false},
	{AP_OP_ELU, expand_activation, false},
	{AP_OP_SELU, expand_activation, false},
};

static int registry_find(ap_op op)
{
	for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++)
		if (registry[i].op == op)
			return (int)i;
	return -1;
}

bool ap_partition_has_expansion(ap_op op)
{
	return registry_find(op) >= 0;
}

static bool listed(const ap_expand_options *opt, ap_op op)
{
	const char *name = ap_op_name(op);

	for (int i = 0; opt && name && i < opt->n_keep_whole; i++)
		if (opt->keep_whole[i] && strcmp(opt->keep_whole[i], name) == 0)
			return true;
	return false;
}

int ap__partition_copy_node(ap_graph *g, const ap_node *node, const int *inputs, const int *outputs)
{
	int n = ap_graph_add_node(g, node->name, node->op, node->n_inputs, inputs, node->n_outputs,
				  outputs);

	if (n < 0)
		return n;
	for (int i = 0; i < node->n_attrs; i++) {
		const ap_attr *a = &node->attrs[i];
		int rc = 0;

		switch (a->type) {
		case AP_ATTR_INT: rc = ap_node_set_int(g, n, a->name, a->i); break;
		case AP_ATTR_FLOAT: rc = ap_node_set_float(g, n, a->name, a->f); break;
		case AP_ATTR_STRING: rc = ap_node_set_string(g, n, a->name, a->s ? a->s : ""); break;
		case AP_ATTR_INTS: rc = ap_node_set_ints(g, n, a->name, a->ints, a->n_ints); break;
		case AP_ATTR_FLOATS: rc = ap_node_set_floats(g, n, a->name, a->floats, a->n_floats); break;
		}
		if (rc < 0)
			return rc;
	}
	return n;
}

static int copy_node(ex *e, const ap_node *node)
{
	int n = ap__partition_copy_node(e->ng, node, node->inputs, node->outputs);

	if (n < 0)
		return fail(e, n, "out of memory copying a node");
	return n;
}

void ap_expand_choices_clear(ap_expand_choices *c)
{
	if (!c)
		return;
	free(c->items);
	c->items = NULL;
	c->n = 0;
}

static int add_choice(ap_expand_choices *c, int node, ap_op op, bool opened, int n_prim)
{
	ap_expand_choice *p;

	if (!c)
		return 0;
	p = realloc(c->items, (size_t)(c->n + 1) * sizeof(*p));
	if (!p)
		return AP_ENOMEM;
	c->items = p;
	p[c->n].node = node;
	p[c->n].op = op;
	p[c->n].opened = opened;
	p[c->n].n_primitives = n_prim;
	c->n++;
	return 0;
}

static int *dup_ints(const int *v, int n)
{
	int *d = malloc(n > 0 ? (size_t)n * sizeof(int) : 1);

	if (d && n > 0)
		memcpy(d, v, (size_t)n * sizeof(int));
	return d;
}

__ap_give ap_graph *ap_partition_expand(__ap_keep const ap_graph *g, const ap_expand_options *opt,
					ap_expand_choices *choices, ap_error *err)
{
	ex e = {.g = g, .err = err, .name = "graph"};
	ap_graph *ng = ap_graph_new(g->name);

	if (choices) {
		choices->n = 0;
		choices->items = NULL;
	}

	if (!ng) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory expanding the graph");
		return NULL;
	}
	e.ng = ng;
	for (int i = 0; i < g->n_tensors; i++) {
		const ap_tensor *t = &g->tensors[i];
		int idx = ap_graph_add_tensor(ng, t->name, t->dtype, t->rank, t->dims, t->kind,
					      t->kind == AP_TENSOR_CONST ? t->data : NULL,
					      t->kind == AP_TENSOR_CONST ? t->nbytes : 0);
		if (idx < 0) {
			ap_error_set(err, AP_ENOMEM, NULL, t->name, "out of memory expanding the graph");
			return ap_graph_free(ng);
		}
		ng->tensors[idx].is_output = t->is_output;
	}
	ng->inputs = dup_ints(g->inputs, g->n_inputs);
	ng->outputs = dup_ints(g->outputs, g->n_outputs);
	if (!ng->inputs || !ng->outputs) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory expanding the graph");
		return ap_graph_free(ng);
	}
	ng->n_inputs = g->n_inputs;
	ng->n_outputs = g->n_outputs;
	ng->eager_kernels = g->eager_kernels;

	for (int n = 0; n < g->n_nodes && !e.rc; n++) {
		const ap_node *node = &g->nodes[n];
		int r = registry_find(node->op), first = ng->n_nodes;
		bool keep = r >= 0 && (listed(opt, node->op) || (!registry[r].open && !(opt && opt->open_all)));

		e.name = node->name;
		e.counter = 0;
		if (r < 0) {
			if (ap_op_category_of(node->op) == AP_CAT_COMPOUND)
				fail(&e, AP_EUNSUPPORTED, "compound op without an expansion");
			else
				copy_node(&e, node);
			continue;
		}
		if (keep && ap_op_category_of(node->op) != AP_CAT_COMPOUND) {
			/* a primitive the lowering computes natively */
			if (copy_node(&e, node) >= 0 && add_choice(choices, n, node->op, false, 1) < 0)
				fail(&e, AP_ENOMEM, "out of memory recording a choice");
			continue;
		}
		registry[r].fn(&e, node);
		if (keep) {
			for (int m = first; m < ng->n_nodes && !e.rc; m++)
				if (ap_node_set_int(ng, m, "_whole", (int64_t)n + 1) < 0)
					fail(&e, AP_ENOMEM, "out of memory marking a node kept whole");
		}
		if (!e.rc && add_choice(choices, n, node->op, !keep, ng->n_nodes - first) < 0)
			fail(&e, AP_ENOMEM, "out of memory recording a choice");
	}
	/* graph outputs nobody computes get an Identity copy */
	for (int i = 0; i < ng->n_outputs && !e.rc; i++) {
		int o = ng->outputs[i], c;

		if (o < 0 || o >= ng->n_tensors || ng->tensors[o].kind == AP_TENSOR_VALUE)
			continue;
		ap_tensor copy = ng->tensors[o];   /* the array moves as it grows */

		e.name = copy.name;
		c = ap_graph_add_tensor(ng, copy.name, copy.dtype, copy.rank, copy.dims,
					AP_TENSOR_VALUE, NULL, 0);
		if (c < 0) {
			fail(&e, c, "out of memory copying an output");
			break;
		}
		if (add_node(&e, AP_OP_IDENTITY, 1, &o, c) < 0)
			break;
		ng->tensors[c].is_output = true;
		ng->outputs[i] = c;
		bool still = false;
		for (int j = 0; j < ng->n_outputs; j++)
			if (ng->outputs[j] == o)
				still = true;
		ng->tensors[o].is_output = still;
	}
	if (e.rc) {
		ap_expand_choices_clear(choices);
		return ap_graph_free(ng);
	}
	return ng;
}
