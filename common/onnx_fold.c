/* onnx_fold.c -- a small reference evaluator for normalised nodes on host
 * data (ap__op_eval), used by the ONNX importer to fold constants: shape
 * arithmetic (Concat / Gather / Slice / Cast / Add / Mul / ... of shapes),
 * small Constant subgraphs, the condition of an If.
 *
 * Written for clarity, not speed: it only ever sees tensors of at most a
 * few kilobytes.  Every element is read through ld()/li() (as double or as
 * int64) and written through sd()/si(), so one loop serves every dtype.
 * Float results are computed in double precision and rounded once on
 * store; integer results in int64.  The meaning of each op is ONNX's
 * (https://onnx.ai/onnx/operators/) with ops.def's normalised attributes.
 * It implements every op of ops.def, so any node whose inputs are all
 * known can be folded (the importer bounds the sizes and the work); a dtype
 * it does not handle answers AP_EUNSUPPORTED and the node is kept.
 */
#include "onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool fdt(ap_dtype dt)
{
	return ap_dtype_is_floating(dt);
}

static int64_t numel(const ap_host_tensor *t)
{
	int64_t n = ap__shape_numel(t->rank, t->dims);

	return n < 0 ? 0 : n;
}

static double ld(const ap_host_tensor *t, int64_t i)
{
	switch (t->dtype) {
	case AP_DT_F32: return ((const float *)t->data)[i];
	case AP_DT_F64: return ((const double *)t->data)[i];
	case AP_DT_F16: case AP_DT_BF16: return ap_elem_get(t->data, t->dtype, i);
	case AP_DT_I32: return ((const int32_t *)t->data)[i];
	case AP_DT_I64: return (double)((const int64_t *)t->data)[i];
	case AP_DT_I8: return ((const int8_t *)t->data)[i];
	default: return ((const uint8_t *)t->data)[i];
	}
}

static int64_t f2i(double v)
{
	return ap_f64_to_i64(v);
}

static int64_t li(const ap_host_tensor *t, int64_t i)
{
	switch (t->dtype) {
	case AP_DT_F32: return f2i(((const float *)t->data)[i]);
	case AP_DT_F64: return f2i(((const double *)t->data)[i]);
	case AP_DT_F16: case AP_DT_BF16: return f2i(ap_elem_get(t->data, t->dtype, i));
	case AP_DT_I32: return ((const int32_t *)t->data)[i];
	case AP_DT_I64: return ((const int64_t *)t->data)[i];
	case AP_DT_I8: return ((const int8_t *)t->data)[i];
	default: return ((const uint8_t *)t->data)[i];
	}
}

static void si(ap_host_tensor *t, int64_t i, int64_t v)
{
	switch (t->dtype) {
	case AP_DT_F32: ((float *)t->data)[i] = (float)v; break;
	case AP_DT_F64: ((double *)t->data)[i] = (double)v; break;
	case AP_DT_F16: case AP_DT_BF16: ap_elem_set(t->data, t->dtype, i, (double)v); break;
	case AP_DT_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
	case AP_DT_I64: ((int64_t *)t->data)[i] = v; break;
	case AP_DT_I8: ((int8_t *)t->data)[i] = (int8_t)v; break;
	case AP_DT_BOOL: ((uint8_t *)t->data)[i] = v != 0; break;
	default: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
	}
}

static void sd(ap_host_tensor *t, int64_t i, double v)
{
	switch (t->dtype) {
	case AP_DT_F32: ((float *)t->data)[i] = (float)v; break;
	case AP_DT_F64: ((double *)t->data)[i] = v; break;
	case AP_DT_F16: case AP_DT_BF16: ap_elem_set(t->data, t->dtype, i, v); break;
	case AP_DT_BOOL: ((uint8_t *)t->data)[i] = v != 0; break;
	default: si(t, i, f2i(v)); break;
	}
}

/* Copies element j of `src` to element i of `dst` (same dtype). */
static void cp(ap_host_tensor *dst, int64_t i, const ap_host_tensor *src, int64_t j)
{
	size_t es = ap_dtype_size(dst->dtype);

	memcpy((char *)dst->data + (size_t)i * es, (const char *)src->data + (size_t)j * es, es);
}

/* Element i of INTS attribute `name`, else dflt. */
static int64_t ap_node_attr_i(const ap_node *n, const char *name, int i, int64_t dflt)
{
	const ap_attr *a = ap_node_attr(n, name);

	return a && a->type == AP_ATTR_INTS && i < a->n_ints ? a->ints[i] : dflt;
}

/* Row-major strides of t. */
static void strides_of(const ap_host_tensor *t, int64_t *st)
{
	int64_t s = 1;

	for (int d = t->rank - 1; d >= 0; d--) {
		st[d] = s;
		s *= t->dims[d];
	}
}

/* Coordinates of linear index i in shape (rank, dims). */
static void coords(int64_t i, int rank, const int64_t *dims, int64_t *c)
{
	for (int d = rank - 1; d >= 0; d--) {
		c[d] = dims[d] ? i % dims[d] : 0;
		i = dims[d] ? i / dims[d] : 0;
	}
}

/* Offset in `in` of the element that numpy broadcasting maps to output
 * coordinates c (output rank r). */
static int64_t bcast_off(const ap_host_tensor *in, int r, const int64_t *c)
{
	int64_t st[AP_MAX_RANK], off = 0;

	strides_of(in, st);
	for (int d = 0; d < in->rank; d++) {
		int od = d + r - in->rank;

		if (in->dims[d] != 1)
			off += c[od] * st[d];
	}
	return off;
}

/* ---- elementwise ------------------------------------------------------------ */

static double unary_f(const ap_node *n, double x)
{
	switch (n->op) {
	case AP_OP_IDENTITY: case AP_OP_CAST: return x;
	case AP_OP_NEG: return -x;
	case AP_OP_ABS: return fabs(x);
	case AP_OP_EXP: return exp(x);
	case AP_OP_LOG: return log(x);
	case AP_OP_SQRT: return sqrt(x);
	case AP_OP_RECIPROCAL: return 1.0 / x;
	case AP_OP_TANH: return tanh(x);
	case AP_OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
	case AP_OP_RELU: return x > 0 ? x : 0;
	case AP_OP_ERF: return erf(x);
	case AP_OP_SIGN: return x > 0 ? 1 : x < 0 ? -1 : 0;
	case AP_OP_FLOOR: return floor(x);
	case AP_OP_CEIL: return ceil(x);
	case AP_OP_NOT: return x == 0;
	case AP_OP_SOFTSIGN: return x / (1 + fabs(x));
	case AP_OP_HARD_SWISH: return x * fmax(0, fmin(1, x / 6 + 0.5));
	case AP_OP_SOFTPLUS: return log1p(exp(-fabs(x))) + fmax(x, 0);
	case AP_OP_MISH: return x * tanh(log1p(exp(-fabs(x))) + fmax(x, 0));
	case AP_OP_LEAKY_RELU: return x >= 0 ? x : x * ap_node_float(n, "alpha", 0.01);
	case AP_OP_ELU: return x >= 0 ? x : ap_node_float(n, "alpha", 1.0) * (exp(x) - 1);
	case AP_OP_SELU:
		return ap_node_float(n, "gamma", 1.0507009873554805) *
		       (x > 0 ? x : ap_node_float(n, "alpha", 1.6732632423543772) * (exp(x) - 1));
	case AP_OP_HARD_SIGMOID:
		return fmax(0, fmin(1, ap_node_float(n, "alpha", 0.2) * x + ap_node_float(n, "beta", 0.5)));
	case AP_OP_GELU:
		if (strcmp(ap_node_string(n, "approximate", "none"), "tanh") == 0)
			return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
		return 0.5 * x * (1 + erf(x / 1.4142135623730951));
	case AP_OP_CLIP:
		return fmin(fmax(x, ap_node_float(n, "min", -INFINITY)), ap_node_float(n, "max", INFINITY));
	case AP_OP_SIN: return sin(x);
	case AP_OP_COS: return cos(x);
	case AP_OP_IS_NAN: return isnan(x);
	case AP_OP_IS_INF:
		return (isinf(x) && x > 0 && ap_node_int(n, "detect_positive", 1)) ||
		       (isinf(x) && x < 0 && ap_node_int(n, "detect_negative", 1));
	case AP_OP_SHRINK: {
		double l = ap_node_float(n, "lambd", 0.5), b = ap_node_float(n, "bias", 0.0);

		return x < -l ? x + b : x > l ? x - b : 0;
	}
	default: return NAN;
	}
}

static int eval_unary(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	int64_t cnt = numel(x);

	if (n->op == AP_OP_IDENTITY || (n->op == AP_OP_CAST && x->dtype == y->dtype)) {
		if (y->nbytes)
			memcpy(y->data, x->data, y->nbytes);
		return 0;
	}
	if (n->op == AP_OP_CAST) {
		for (int64_t i = 0; i < cnt; i++) {
			if (fdt(x->dtype))
				sd(y, i, ld(x, i));
			else
				si(y, i, li(x, i));
		}
		return 0;
	}
	if (!fdt(x->dtype)) {
		for (int64_t i = 0; i < cnt; i++) {
			int64_t v = li(x, i);

			switch (n->op) {
			case AP_OP_NEG: v = -v; break;
			case AP_OP_ABS: v = v < 0 ? -v : v; break;
			case AP_OP_SIGN: v = v > 0 ? 1 : v < 0 ? -1 : 0; break;
			case AP_OP_RELU: v = v > 0 ? v : 0; break;
			case AP_OP_NOT: v = v == 0; break;
			case AP_OP_CLIP: {
				double lo = ap_node_float(n, "min", -INFINITY), hi = ap_node_float(n, "max", INFINITY);

				if ((double)v < lo)
					v = f2i(ceil(lo));
				if ((double)v > hi)
					v = f2i(floor(hi));
				break;
			}
			default: return AP_EUNSUPPORTED;
			}
			si(y, i, v);
		}
		return 0;
	}
	for (int64_t i = 0; i < cnt; i++)
		sd(y, i, unary_f(n, ld(x, i)));
	return 0;
}

static double binary_f(ap_op op, double a, double b, const ap_node *n)
{
	switch (op) {
	case AP_OP_ADD: return a + b;
	case AP_OP_SUB: return a - b;
	case AP_OP_MUL: return a * b;
	case AP_OP_DIV: return a / b;
	case AP_OP_POW: return pow(a, b);
	case AP_OP_MAX: return isnan(a) || isnan(b) ? NAN : fmax(a, b);
	case AP_OP_MIN: return isnan(a) || isnan(b) ? NAN : fmin(a, b);
	case AP_OP_PRELU: return a < 0 ? a * b : a;
	case AP_OP_MOD: {
		double r = fmod(a, b);

		if (!ap_node_int(n, "fmod", 0) && r != 0 && ((r < 0) != (b < 0)))
			r += b;
		return r;
	}
	case AP_OP_EQUAL: return a == b;
	case AP_OP_LESS: return a < b;
	case AP_OP_GREATER: return a > b;
	case AP_OP_LESS_OR_EQUAL: return a <= b;
	case AP_OP_GREATER_OR_EQUAL: return a >= b;
	case AP_OP_AND: return (a != 0) && (b != 0);
	case AP_OP_OR: return (a != 0) || (b != 0);
	case AP_OP_XOR: return (a != 0) != (b != 0);
	default: return NAN;
	}
}

static int64_t ipow(int64_t a, int64_t b)
{
	int64_t r = 1;

	if (b < 0)
		return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
	while (b-- > 0)
		r *= a;
	return r;
}

static int binary_i(ap_op op, int64_t a, int64_t b, int64_t *r, const ap_node *n)
{
	switch (op) {
	case AP_OP_ADD: *r = (int64_t)((uint64_t)a + (uint64_t)b); return 0;
	case AP_OP_SUB: *r = (int64_t)((uint64_t)a - (uint64_t)b); return 0;
	case AP_OP_MUL: *r = (int64_t)((uint64_t)a * (uint64_t)b); return 0;
	case AP_OP_DIV:
		if (b == 0)
			return AP_EINVAL;
		*r = (a == INT64_MIN && b == -1) ? a : a / b;
		return 0;
	case AP_OP_POW: *r = ipow(a, b); return 0;
	case AP_OP_MAX: *r = a > b ? a : b; return 0;
	case AP_OP_MIN: *r = a < b ? a : b; return 0;
	case AP_OP_PRELU: *r = a < 0 ? a * b : a; return 0;
	case AP_OP_MOD:
		if (b == 0)
			return AP_EINVAL;
		*r = (a == INT64_MIN && b == -1) ? 0 : a % b;
		if (!ap_node_int(n, "fmod", 0) && *r != 0 && ((*r < 0) != (b < 0)))
			*r += b;
		return 0;
	case AP_OP_EQUAL: *r = a == b; return 0;
	case AP_OP_LESS: *r = a < b; return 0;
	case AP_OP_GREATER: *r = a > b; return 0;
	case AP_OP_LESS_OR_EQUAL: *r = a <= b; return 0;
	case AP_OP_GREATER_OR_EQUAL: *r = a >= b; return 0;
	case AP_OP_AND: *r = a && b; return 0;
	case AP_OP_OR: *r = a || b; return 0;
	case AP_OP_XOR: *r = (a != 0) != (b != 0); return 0;
	default: return AP_EUNSUPPORTED;
	}
}

static int eval_binary(const ap_node *n, const ap_host_tensor *a, const ap_host_tensor *b,
		       ap_host_tensor *y)
{
	int64_t cnt = numel(y), c[AP_MAX_RANK];
	bool flt = fdt(a->dtype) || fdt(b->dtype);

	for (int64_t i = 0; i < cnt; i++) {
		int64_t ia, ib;

		coords(i, y->rank, y->dims, c);
		ia = bcast_off(a, y->rank, c);
		ib = bcast_off(b, y->rank, c);
		if (flt) {
			sd(y, i, binary_f(n->op, ld(a, ia), ld(b, ib), n));
		} else {
			int64_t r;
			int rc = binary_i(n->op, li(a, ia), li(b, ib), &r, n);

			if (rc < 0)
				return rc;
			si(y, i, r);
		}
	}
	return 0;
}

static int eval_where(const ap_host_tensor *cnd, const ap_host_tensor *x, const ap_host_tensor *z,
		      ap_host_tensor *y)
{
	int64_t cnt = numel(y), c[AP_MAX_RANK];

	for (int64_t i = 0; i < cnt; i++) {
		coords(i, y->rank, y->dims, c);
		if (li(cnd, bcast_off(cnd, y->rank, c)))
			cp(y, i, x, bcast_off(x, y->rank, c));
		else
			cp(y, i, z, bcast_off(z, y->rank, c));
	}
	return 0;
}

/* ---- reductions ----------------------------------------------------------- */

/* Output linear index of input coordinates c when `red` axes are reduced. */
static int64_t red_index(const ap_host_tensor *x, const bool *red, const int64_t *c)
{
	int64_t idx = 0;

	for (int d = 0; d < x->rank; d++)
		if (!red[d])
			idx = idx * x->dims[d] + c[d];
	return idx;
}

static int eval_reduce(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	const ap_attr *axes = ap_node_attr(n, "axes");
	bool red[AP_MAX_RANK] = { false };
	int64_t cnt_in = numel(x), cnt_out = numel(y), group = 1, c[AP_MAX_RANK];
	double *acc, *mx;
	bool flt = fdt(x->dtype);
	ap_op op = n->op;

	if (!axes)
		return AP_EINVAL;
	for (int i = 0; i < axes->n_ints; i++) {
		red[axes->ints[i]] = true;
		group *= x->dims[axes->ints[i]];
	}
	acc = calloc((size_t)cnt_out + 1, sizeof(double));
	mx = calloc((size_t)cnt_out + 1, sizeof(double));
	if (!acc || !mx) {
		free(acc);
		free(mx);
		return AP_ENOMEM;
	}
	for (int64_t o = 0; o < cnt_out; o++) {
		acc[o] = op == AP_OP_REDUCE_PROD ? 1 : op == AP_OP_REDUCE_MAX ? -INFINITY :
			 op == AP_OP_REDUCE_MIN ? INFINITY : 0;
		mx[o] = -INFINITY;
	}
	if (op == AP_OP_REDUCE_LOG_SUM_EXP)
		for (int64_t i = 0; i < cnt_in; i++) {
			coords(i, x->rank, x->dims, c);
			mx[red_index(x, red, c)] = fmax(mx[red_index(x, red, c)], ld(x, i));
		}
	for (int64_t i = 0; i < cnt_in; i++) {
		double v = ld(x, i);
		int64_t o;

		coords(i, x->rank, x->dims, c);
		o = red_index(x, red, c);
		switch (op) {
		case AP_OP_REDUCE_PROD: acc[o] *= v; break;
		case AP_OP_REDUCE_MAX: acc[o] = fmax(acc[o], v); break;
		case AP_OP_REDUCE_MIN: acc[o] = fmin(acc[o], v); break;
		case AP_OP_REDUCE_SUM_SQUARE: case AP_OP_REDUCE_L2: acc[o] += v * v; break;
		case AP_OP_REDUCE_L1: acc[o] += fabs(v); break;
		case AP_OP_REDUCE_LOG_SUM_EXP: acc[o] += exp(v - mx[o]); break;
		default: acc[o] += v; break;
		}
	}
	for (int64_t o = 0; o < cnt_out; o++) {
		double v = acc[o];

		switch (op) {
		case AP_OP_REDUCE_MEAN: v = v / (double)group; break;
		case AP_OP_REDUCE_L2: v = sqrt(v); break;
		case AP_OP_REDUCE_LOG_SUM: v = log(v); break;
		case AP_OP_REDUCE_LOG_SUM_EXP: v = isinf(mx[o]) ? mx[o] : log(v) + mx[o]; break;
		default: break;
		}
		if (flt)
			sd(y, o, v);
		else
			si(y, o, f2i(v));
	}
	free(acc);
	free(mx);
	return 0;
}

static int eval_softmax(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	ap_node r = *n;
	ap_attr keep[2];
	ap_host_tensor *mx, *sum;
	int64_t cnt = numel(x), c[AP_MAX_RANK];
	bool red[AP_MAX_RANK] = { false };
	const ap_attr *axes = ap_node_attr(n, "axes");
	int64_t rd[AP_MAX_RANK];
	int rr = 0;

	if (!axes)
		return AP_EINVAL;
	for (int i = 0; i < axes->n_ints; i++)
		red[axes->ints[i]] = true;
	for (int d = 0; d < x->rank; d++)
		if (!red[d])
			rd[rr++] = x->dims[d];
	mx = ap__host_tensor_new("", AP_DT_F64, rr, rd);
	sum = ap__host_tensor_new("", AP_DT_F64, rr, rd);
	if (!mx || !sum) {
		ap_host_tensor_free(mx);
		ap_host_tensor_free(sum);
		return AP_ENOMEM;
	}
	keep[0] = *axes;
	memset(&keep[1], 0, sizeof(keep[1]));
	keep[1].name = (char *)"keepdims";
	keep[1].type = AP_ATTR_INT;
	r.attrs = keep;
	r.n_attrs = 2;
	r.op = AP_OP_REDUCE_MAX;
	eval_reduce(&r, x, mx);
	for (int64_t i = 0; i < cnt; i++) {
		int64_t o;

		coords(i, x->rank, x->dims, c);
		o = red_index(x, red, c);
		((double *)sum->data)[o] += exp(ld(x, i) - ((double *)mx->data)[o]);
	}
	for (int64_t i = 0; i < cnt; i++) {
		int64_t o;
		double v;

		coords(i, x->rank, x->dims, c);
		o = red_index(x, red, c);
		v = ld(x, i) - ((double *)mx->data)[o];
		if (n->op == AP_OP_LOG_SOFTMAX)
			sd(y, i, v - log(((double *)sum->data)[o]));
		else
			sd(y, i, exp(v) / ((double *)sum->data)[o]);
	}
	ap_host_tensor_free(mx);
	ap_host_tensor_free(sum);
	return 0;
}

/* ---- data movement ---------------------------------------------------------- */

static int eval_transpose(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	const ap_attr *perm = ap_node_attr(n, "perm");
	int64_t st[AP_MAX_RANK], c[AP_MAX_RANK], cnt = numel(y);

	if (!perm)
		return AP_EINVAL;
	strides_of(x, st);
	for (int64_t i = 0; i < cnt; i++) {
		int64_t off = 0;

		coords(i, y->rank, y->dims, c);
		for (int d = 0; d < y->rank; d++)
			off += c[d] * st[perm->ints[d]];
		cp(y, i, x, off);
	}
	return 0;
}

static int eval_slice_tile_expand(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	const ap_attr *starts = ap_node_attr(n, "starts"), *steps = ap_node_attr(n, "steps");
	int64_t st[AP_MAX_RANK], c[AP_MAX_RANK], cnt = numel(y);

	if (n->op == AP_OP_SLICE && (!starts || !steps))
		return AP_EINVAL;
	strides_of(x, st);
	for (int64_t i = 0; i < cnt; i++) {
		int64_t off = 0;

		coords(i, y->rank, y->dims, c);
		if (n->op == AP_OP_EXPAND) {
			off = bcast_off(x, y->rank, c);
		} else {
			for (int d = 0; d < x->rank; d++) {
				int64_t k = n->op == AP_OP_SLICE ? starts->ints[d] + c[d] * steps->ints[d]
								 : c[d] % x->dims[d];
				off += k * st[d];
			}
		}
		cp(y, i, x, off);
	}
	return 0;
}

static int eval_concat_split(const ap_node *n, const ap_host_tensor *const *in, int n_in,
			     ap_host_tensor *const *out, int n_out)
{
	int64_t axis = ap_node_int(n, "axis", 0), c[AP_MAX_RANK];
	bool concat = n->op == AP_OP_CONCAT;
	const ap_host_tensor *big = concat ? out[0] : in[0];
	int parts = concat ? n_in : n_out;
	int64_t base = 0;

	for (int p = 0; p < parts; p++) {
		const ap_host_tensor *part = concat ? in[p] : out[p];
		int64_t cnt = numel(part), st[AP_MAX_RANK];

		if (!part)
			return AP_EINVAL;
		strides_of(big, st);
		for (int64_t i = 0; i < cnt; i++) {
			int64_t off = 0;

			coords(i, part->rank, part->dims, c);
			c[axis] += base;
			for (int d = 0; d < big->rank; d++)
				off += c[d] * st[d];
			if (concat)
				cp(out[0], off, in[p], i);
			else
				cp(out[p], i, in[0], off);
		}
		base += part->dims[axis];
	}
	return 0;
}

static int eval_gather(const ap_node *n, const ap_host_tensor *x, const ap_host_tensor *idx,
		       ap_host_tensor *y)
{
	int64_t axis = ap_node_int(n, "axis", 0), cnt = numel(y), st[AP_MAX_RANK], c[AP_MAX_RANK];

	strides_of(x, st);
	for (int64_t i = 0; i < cnt; i++) {
		int64_t off = 0, j = 0, k;
		int d;

		coords(i, y->rank, y->dims, c);
		for (d = 0; d < idx->rank; d++)
			j = j * idx->dims[d] + c[axis + d];
		k = li(idx, j);
		if (k < 0)
			k += x->dims[axis];
		if (k < 0 || k >= x->dims[axis])
			return AP_EINVAL;
		for (d = 0; d < axis; d++)
			off += c[d] * st[d];
		off += k * st[axis];
		for (d = (int)axis + 1; d < x->rank; d++)
			off += c[d + idx->rank - 1] * st[d];
		cp(y, i, x, off);
	}
	return 0;
}

static int eval_pad(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	const ap_attr *pads = ap_node_attr(n, "pads");
	const char *mode = ap_node_string(n, "mode", "constant");
	double value = ap_node_float(n, "value", 0);
	int64_t st[AP_MAX_RANK], c[AP_MAX_RANK], cnt = numel(y);

	if (!pads)
		return AP_EINVAL;
	strides_of(x, st);
	for (int64_t i = 0; i < cnt; i++) {
		int64_t off = 0;
		bool outside = false;

		coords(i, y->rank, y->dims, c);
		for (int d = 0; d < x->rank; d++) {
			int64_t k = c[d] - pads->ints[d], dim = x->dims[d];

			if (k < 0 || k >= dim) {
				if (strcmp(mode, "edge") == 0 && dim > 0) {
					k = k < 0 ? 0 : dim - 1;
				} else if (strcmp(mode, "reflect") == 0 && dim > 1) {
					int64_t period = 2 * (dim - 1);

					k = ((k % period) + period) % period;
					if (k >= dim)
						k = period - k;
				} else {
					outside = true;
					break;
				}
			}
			off += k * st[d];
		}
		if (outside)
			sd(y, i, value);
		else
			cp(y, i, x, off);
	}
	return 0;
}

static int eval_matmul(const ap_host_tensor *a, const ap_host_tensor *b, ap_host_tensor *y)
{
	int64_t ar = a->rank, br = b->rank;
	int64_t m = ar >= 2 ? a->dims[ar - 2] : 1, k = a->dims[ar - 1];
	int64_t nn = br >= 2 ? b->dims[br - 1] : 1;
	int64_t cnt = numel(y), c[AP_MAX_RANK + 2];
	int yr = y->rank;

	for (int64_t i = 0; i < cnt; i++) {
		int64_t row, col, batch_c[AP_MAX_RANK];
		int nb = yr - (ar >= 2) - (br >= 2);
		double s = 0;

		coords(i, yr, y->dims, c);
		row = ar >= 2 ? c[nb] : 0;
		col = br >= 2 ? c[yr - 1] : 0;
		for (int d = 0; d < nb; d++)
			batch_c[d] = c[d];
		for (int64_t kk = 0; kk < k; kk++) {
			int64_t oa = 0, ob = 0, sa = 1, sb = 1;

			/* a: [..batch.., m, k] */
			oa = row * k + kk;
			sa = m * k;
			for (int d = (int)ar - 3; d >= 0; d--) {
				int64_t cd = batch_c[d + nb - (ar - 2)];

				oa += (a->dims[d] == 1 ? 0 : cd) * sa;
				sa *= a->dims[d];
			}
			ob = br >= 2 ? kk * nn + col : kk;
			sb = k * nn;
			for (int d = (int)br - 3; d >= 0; d--) {
				int64_t cd = batch_c[d + nb - (br - 2)];

				ob += (b->dims[d] == 1 ? 0 : cd) * sb;
				sb *= b->dims[d];
			}
			s += ld(a, oa) * ld(b, ob);
		}
		if (fdt(y->dtype))
			sd(y, i, s);
		else
			si(y, i, f2i(s));
	}
	return 0;
}

/* ---- index maps with data: gather/scatter by elements, ScatterND, Trilu, scans ---- */

/* Index value k of an axis of size D, negative counting from the end;
 * AP_EINVAL when out of range. */
static int wrap(int64_t k, int64_t D, int64_t *out)
{
	if (k < 0)
		k += D;
	if (k < 0 || k >= D)
		return AP_EINVAL;
	*out = k;
	return 0;
}

static int64_t offset_of(const ap_host_tensor *t, const int64_t *c)
{
	int64_t off = 0;

	for (int d = 0; d < t->rank; d++)
		off = off * t->dims[d] + c[d];
	return off;
}

static double combine(const char *red, double acc, double u)
{
	if (!strcmp(red, "add"))
		return acc + u;
	if (!strcmp(red, "mul"))
		return acc * u;
	if (!strcmp(red, "max"))
		return isnan(acc) || isnan(u) ? NAN : fmax(acc, u);
	if (!strcmp(red, "min"))
		return isnan(acc) || isnan(u) ? NAN : fmin(acc, u);
	return u;
}

/* Writes element j of src, combined by `red` with what y holds at i. */
static void put(ap_host_tensor *y, int64_t i, const ap_host_tensor *src, int64_t j, const char *red)
{
	if (!strcmp(red, "none"))
		cp(y, i, src, j);
	else if (fdt(y->dtype))
		sd(y, i, combine(red, ld(y, i), ld(src, j)));
	else
		si(y, i, f2i(combine(red, (double)li(y, i), (double)li(src, j))));
}

static int eval_elements(const ap_node *n, const ap_host_tensor *x, const ap_host_tensor *idx,
			 const ap_host_tensor *upd, ap_host_tensor *y)
{
	int64_t axis = ap_node_int(n, "axis", 0), cnt = numel(idx), c[AP_MAX_RANK], k;
	const char *red = ap_node_string(n, "reduction", "none");
	bool gather = n->op == AP_OP_GATHER_ELEMENTS;

	if (!gather && y->nbytes)
		memcpy(y->data, x->data, y->nbytes);
	for (int64_t i = 0; i < cnt; i++) {
		coords(i, idx->rank, idx->dims, c);
		if (wrap(li(idx, i), x->dims[axis], &k) < 0)
			return AP_EINVAL;
		c[axis] = k;
		if (gather)
			cp(y, i, x, offset_of(x, c));
		else
			put(y, offset_of(y, c), upd, i, red);
	}
	return 0;
}

static int eval_scatter_nd(const ap_node *n, const ap_host_tensor *x, const ap_host_tensor *idx,
			   const ap_host_tensor *upd, ap_host_tensor *y)
{
	int64_t K = idx->dims[idx->rank - 1], N = K > 0 ? numel(idx) / K : 0, inner = 1;
	const char *red = ap_node_string(n, "reduction", "none");

	if (y->nbytes)
		memcpy(y->data, x->data, y->nbytes);
	for (int d = (int)K; d < x->rank; d++)
		inner *= x->dims[d];
	for (int64_t r = 0; r < N; r++) {
		int64_t base = 0, k;

		for (int j = 0; j < K; j++) {
			if (wrap(li(idx, r * K + j), x->dims[j], &k) < 0)
				return AP_EINVAL;
			base = base * x->dims[j] + k;
		}
		for (int64_t e = 0; e < inner; e++)
			put(y, base * inner + e, upd, r * inner + e, red);
	}
	return 0;
}

static int eval_trilu(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	int64_t cnt = numel(y), c[AP_MAX_RANK], k = ap_node_int(n, "k", 0);
	bool upper = ap_node_int(n, "upper", 1) != 0;
	int r = x->rank;

	for (int64_t i = 0; i < cnt; i++) {
		int64_t diff;

		coords(i, r, x->dims, c);
		diff = c[r - 1] - c[r - 2];
		if (upper ? diff >= k : diff <= k)
			cp(y, i, x, i);
	}
	return 0;
}

static int eval_cumsum(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	int64_t axis = ap_node_int(n, "axis", 0), cnt = numel(y), L = x->dims[axis], c[AP_MAX_RANK];
	bool excl = ap_node_int(n, "exclusive", 0) != 0, rev = ap_node_int(n, "reverse", 0) != 0;
	int64_t st[AP_MAX_RANK];

	strides_of(x, st);
	for (int64_t i = 0; i < cnt; i++) {
		double sf = 0;
		int64_t sn = 0, lo, hi;

		coords(i, x->rank, x->dims, c);
		lo = rev ? c[axis] + excl : 0;
		hi = rev ? L : c[axis] + !excl;
		for (int64_t j = lo; j < hi; j++) {
			int64_t o = i + (j - c[axis]) * st[axis];

			sf += ld(x, o);
			sn += li(x, o);
		}
		if (fdt(y->dtype))
			sd(y, i, sf);
		else
			si(y, i, sn);
	}
	return 0;
}

static int eval_argext(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	int64_t axis = ap_node_int(n, "axis", 0), L = x->dims[axis], cnt = numel(y), c[AP_MAX_RANK];
	bool keep = ap_node_int(n, "keepdims", 1) != 0, last = ap_node_int(n, "select_last_index", 0);
	bool amax = n->op == AP_OP_ARG_MAX;
	int64_t st[AP_MAX_RANK], xc[AP_MAX_RANK];

	strides_of(x, st);
	for (int64_t i = 0; i < cnt; i++) {
		int64_t best = 0, base;
		double bv;

		coords(i, y->rank, y->dims, c);
		for (int d = 0, od = 0; d < x->rank; d++) {
			if (d == axis) {
				xc[d] = 0;
				od += keep;
			} else {
				xc[d] = c[od++];
			}
		}
		base = offset_of(x, xc);
		bv = ld(x, base);
		for (int64_t j = 1; j < L; j++) {
			double v = ld(x, base + j * st[axis]);

			if (amax ? (last ? v >= bv : v > bv) : (last ? v <= bv : v < bv)) {
				bv = v;
				best = j;
			}
		}
		si(y, i, best);
	}
	return 0;
}

/* ---- normalisations, Gemm, convolutions, pools, LRN ------------------------------- */

/* LayerNormalization over axes axis..r-1: Y, and when asked Mean and
 * InvStdDev (shape [d0..d(axis-1), 1...]). */
static int eval_layer_norm(const ap_node *n, const ap_host_tensor *const *in, int n_in,
			   ap_host_tensor *const *out, int n_out)
{
	const ap_host_tensor *x = in[0], *sc = in[1], *b = n_in > 2 ? in[2] : NULL;
	int64_t axis = ap_node_int(n, "axis", -1), inner = 1, outer = 1, c[AP_MAX_RANK];
	double eps = ap_node_float(n, "epsilon", 1e-5);

	for (int d = 0; d < x->rank; d++) {
		if (d < axis)
			outer *= x->dims[d];
		else
			inner *= x->dims[d];
	}
	for (int64_t o = 0; o < outer; o++) {
		double mean = 0, var = 0, inv;

		for (int64_t i = 0; i < inner; i++)
			mean += ld(x, o * inner + i);
		mean /= inner ? (double)inner : 1;
		for (int64_t i = 0; i < inner; i++) {
			double dv = ld(x, o * inner + i) - mean;

			var += dv * dv;
		}
		var /= inner ? (double)inner : 1;
		inv = 1.0 / sqrt(var + eps);
		for (int64_t i = 0; i < inner; i++) {
			int64_t e = o * inner + i;
			double v;

			coords(e, x->rank, x->dims, c);
			v = (ld(x, e) - mean) * inv * ld(sc, bcast_off(sc, x->rank, c));
			if (b)
				v += ld(b, bcast_off(b, x->rank, c));
			sd(out[0], e, v);
		}
		if (n_out > 1)
			sd(out[1], o, mean);
		if (n_out > 2)
			sd(out[2], o, inv);
	}
	return 0;
}

/* Mean and biased variance of x over all axes but 1, channel ch. */
static void channel_stats(const ap_host_tensor *x, int64_t ch, double *mean, double *var)
{
	int64_t cnt = numel(x), C = x->dims[1], inner = x->dims[0] * C != 0 ? cnt / (x->dims[0] * C) : 0, k = 0;
	double s = 0, q = 0;

	for (int64_t nn = 0; nn < x->dims[0]; nn++)
		for (int64_t i = 0; i < inner; i++, k++)
			s += ld(x, (nn * C + ch) * inner + i);
	*mean = k ? s / (double)k : 0;
	for (int64_t nn = 0; nn < x->dims[0]; nn++)
		for (int64_t i = 0; i < inner; i++) {
			double dv = ld(x, (nn * C + ch) * inner + i) - *mean;

			q += dv * dv;
		}
	*var = k ? q / (double)k : 0;
}

/* BatchNormalization (inference: the given statistics; training: the
 * batch's, and the running statistics as outputs 1 and 2) and
 * InstanceNormalization (each sample's and channel's own statistics). */
static int eval_channel_norm(const ap_node *n, const ap_host_tensor *const *in,
			     ap_host_tensor *const *out, int n_out)
{
	const ap_host_tensor *x = in[0];
	int64_t cnt = numel(x), C = x->dims[1], N = x->dims[0];
	int64_t inner = N * C != 0 ? cnt / (N * C) : 0;
	double eps = ap_node_float(n, "epsilon", 1e-5), mom = ap_node_float(n, "momentum", 0.9);
	bool inst = n->op == AP_OP_INSTANCE_NORM, train = ap_node_int(n, "training_mode", 0) != 0;

	for (int64_t ch = 0; ch < C; ch++) {
		double scale = ld(in[1], ch), bias = ld(in[2], ch), mean = 0, var = 0;

		if (!inst && !train) {
			mean = ld(in[3], ch);
			var = ld(in[4], ch);
		} else if (train) {
			channel_stats(x, ch, &mean, &var);
			if (n_out > 1)
				sd(out[1], ch, ld(in[3], ch) * mom + mean * (1 - mom));
			if (n_out > 2)
				sd(out[2], ch, ld(in[4], ch) * mom + var * (1 - mom));
		}
		for (int64_t nn = 0; nn < N; nn++) {
			int64_t base = (nn * C + ch) * inner;

			if (inst) {
				double s = 0, q = 0;

				for (int64_t i = 0; i < inner; i++)
					s += ld(x, base + i);
				mean = inner ? s / (double)inner : 0;
				for (int64_t i = 0; i < inner; i++)
					q += (ld(x, base + i) - mean) * (ld(x, base + i) - mean);
				var = inner ? q / (double)inner : 0;
			}
			for (int64_t i = 0; i < inner; i++)
				sd(out[0], base + i, (ld(x, base + i) - mean) / sqrt(var + eps) * scale + bias);
		}
	}
	return 0;
}

static int eval_gemm(const ap_node *n, const ap_host_tensor *const *in, int n_in, ap_host_tensor *y)
{
	const ap_host_tensor *a = in[0], *b = in[1], *cc = n_in > 2 ? in[2] : NULL;
	bool ta = ap_node_int(n, "transA", 0) != 0, tb = ap_node_int(n, "transB", 0) != 0;
	double alpha = ap_node_float(n, "alpha", 1.0), beta = ap_node_float(n, "beta", 1.0);
	int64_t M = y->dims[0], N = y->dims[1], K = ta ? a->dims[0] : a->dims[1], c[2];

	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double s = 0;

			for (int64_t k = 0; k < K; k++)
				s += ld(a, ta ? k * M + i : i * K + k) * ld(b, tb ? j * K + k : k * N + j);
			s *= alpha;
			if (cc) {
				c[0] = i;
				c[1] = j;
				s += beta * ld(cc, bcast_off(cc, 2, c));
			}
			sd(y, i * N + j, s);
		}
	return 0;
}

/* Conv: y[n, m, o...] = B[m] + sum over c, k... of X[n, g*Cg + c, o*s - pb
 * + k*d] * W[m, c, k...].  ConvTranspose scatters each input element:
 * y[n, g*Mg + m, i*s - pb + k*d] += X[n, ci, i...] * W[ci, m, k...]. */
static int eval_conv(const ap_node *n, const ap_host_tensor *const *in, int n_in, ap_host_tensor *y)
{
	const ap_host_tensor *x = in[0], *w = in[1], *b = n_in > 2 ? in[2] : NULL;
	bool tr = n->op == AP_OP_CONV_TRANSPOSE;
	int ns = x->rank - 2;
	int64_t group = ap_node_int(n, "group", 1), cnt_w = numel(w), xc[AP_MAX_RANK], wc[AP_MAX_RANK];
	int64_t yc[AP_MAX_RANK], cnt_y = numel(y), cnt_x = numel(x);
	int64_t Cg = x->dims[1] / (group ? group : 1), Mg = y->dims[1] / (group ? group : 1);
	double *acc = calloc((size_t)cnt_y + 1, sizeof(double));

	if (!acc)
		return AP_ENOMEM;
	if (!tr) {
		for (int64_t e = 0; e < cnt_y; e++) {
			coords(e, y->rank, y->dims, yc);
			for (int64_t we = 0; we < cnt_w; we++) {
				bool inside = true;

				coords(we, w->rank, w->dims, wc);
				if (wc[0] != yc[1])
					continue;
				xc[0] = yc[0];
				xc[1] = (yc[1] / Mg) * Cg + wc[1];
				for (int d = 0; d < ns && inside; d++) {
					xc[2 + d] = yc[2 + d] * ap_node_attr_i(n, "strides", d, 1) -
						    ap_node_attr_i(n, "pads", d, 0) +
						    wc[2 + d] * ap_node_attr_i(n, "dilations", d, 1);
					inside = xc[2 + d] >= 0 && xc[2 + d] < x->dims[2 + d];
				}
				if (inside)
					acc[e] += ld(x, offset_of(x, xc)) * ld(w, we);
			}
		}
	} else {
		for (int64_t e = 0; e < cnt_x; e++) {
			coords(e, x->rank, x->dims, xc);
			for (int64_t we = 0; we < cnt_w; we++) {
				bool inside = true;

				coords(we, w->rank, w->dims, wc);
				if (wc[0] != xc[1])
					continue;
				yc[0] = xc[0];
				yc[1] = (xc[1] / Cg) * Mg + wc[1];
				for (int d = 0; d < ns && inside; d++) {
					yc[2 + d] = xc[2 + d] * ap_node_attr_i(n, "strides", d, 1) -
						    ap_node_attr_i(n, "pads", d, 0) +
						    wc[2 + d] * ap_node_attr_i(n, "dilations", d, 1);
					inside = yc[2 + d] >= 0 && yc[2 + d] < y->dims[2 + d];
				}
				if (inside)
					acc[offset_of(y, yc)] += ld(x, e) * ld(w, we);
			}
		}
	}
	for (int64_t e = 0; e < cnt_y; e++) {
		coords(e, y->rank, y->dims, yc);
		sd(y, e, acc[e] + (b ? ld(b, yc[1]) : 0));
	}
	free(acc);
	return 0;
}

/* MaxPool / AveragePool over the window o*s - pb + k*d (ONNX's
 * count_include_pad counts the padding inside pads, not beyond). */
static int eval_pool(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	int ns = x->rank - 2;
	bool avg = n->op == AP_OP_AVERAGE_POOL, incl = ap_node_int(n, "count_include_pad", 0) != 0;
	int64_t cnt = numel(y), yc[AP_MAX_RANK], xc[AP_MAX_RANK], kc[AP_MAX_RANK], win = 1;

	for (int d = 0; d < ns; d++)
		win *= ap_node_attr_i(n, "kernel_shape", d, 1);
	for (int64_t e = 0; e < cnt; e++) {
		double accv = avg ? 0 : -INFINITY;
		int64_t count = 0;

		coords(e, y->rank, y->dims, yc);
		xc[0] = yc[0];
		xc[1] = yc[1];
		for (int64_t k = 0; k < win; k++) {
			bool inside = true, inpad = true;
			int64_t kdims[AP_MAX_RANK];

			for (int d = 0; d < ns; d++)
				kdims[d] = ap_node_attr_i(n, "kernel_shape", d, 1);
			coords(k, ns, kdims, kc);
			for (int d = 0; d < ns; d++) {
				int64_t pb = ap_node_attr_i(n, "pads", d, 0), pe = ap_node_attr_i(n, "pads", ns + d, 0);
				int64_t pos = yc[2 + d] * ap_node_attr_i(n, "strides", d, 1) - pb +
					      kc[d] * ap_node_attr_i(n, "dilations", d, 1);

				xc[2 + d] = pos;
				inside &= pos >= 0 && pos < x->dims[2 + d];
				inpad &= pos >= -pb && pos < x->dims[2 + d] + pe;
			}
			if (avg && (incl ? inpad : inside))
				count++;
			if (!inside)
				continue;
			if (avg)
				accv += ld(x, offset_of(x, xc));
			else if (isnan(ld(x, offset_of(x, xc))) || ld(x, offset_of(x, xc)) > accv)
				accv = ld(x, offset_of(x, xc));
		}
		sd(y, e, avg ? (count ? accv / (double)count : NAN) : accv);
	}
	return 0;
}

static int eval_lrn(const ap_node *n, const ap_host_tensor *x, ap_host_tensor *y)
{
	double alpha = ap_node_float(n, "alpha", 1e-4), beta = ap_node_float(n, "beta", 0.75);
	double bias = ap_node_float(n, "bias", 1.0);
	int64_t size = ap_node_int(n, "size", 1), cnt = numel(x), c[AP_MAX_RANK], st[AP_MAX_RANK];
	int64_t lo_off = (size - 1) / 2, hi_off = size - 1 - lo_off;

	strides_of(x, st);
	for (int64_t e = 0; e < cnt; e++) {
		double sq = 0;

		coords(e, x->rank, x->dims, c);
		for (int64_t j = c[1] - lo_off; j <= c[1] + hi_off; j++)
			if (j >= 0 && j < x->dims[1])
				sq += ld(x, e + (j - c[1]) * st[1]) * ld(x, e + (j - c[1]) * st[1]);
		sd(y, e, ld(x, e) / pow(bias + alpha / (double)size * sq, beta));
	}
	return 0;
}

int ap__op_eval(const ap_node *node, const ap_host_tensor *const *in, int n_in,
		ap_host_tensor *const *out, int n_out, ap_error *err)
{
	int rc;

	for (int k = 0; k < n_out; k++)
		if (!out[k])
			return ap_error_set(err, AP_EUNSUPPORTED, node->name, NULL,
					    "evaluator needs every output");
	switch (node->op) {
	case AP_OP_RESHAPE:
		if (out[0]->nbytes)
			memcpy(out[0]->data, in[0]->data, out[0]->nbytes);
		return 0;
	case AP_OP_TRANSPOSE:
		return eval_transpose(node, in[0], out[0]);
	case AP_OP_SLICE: case AP_OP_TILE: case AP_OP_EXPAND:
		return eval_slice_tile_expand(node, in[0], out[0]);
	case AP_OP_CONCAT: case AP_OP_SPLIT:
		return eval_concat_split(node, in, n_in, out, n_out);
	case AP_OP_GATHER:
		rc = eval_gather(node, in[0], in[1], out[0]);
		if (rc < 0)
			return ap_error_set(err, rc, node->name, NULL, "Gather: index out of range");
		return 0;
	case AP_OP_PAD:
		return eval_pad(node, in[0], out[0]);
	case AP_OP_WHERE:
		return eval_where(in[0], in[1], in[2], out[0]);
	case AP_OP_GATHER_ELEMENTS: case AP_OP_SCATTER_ELEMENTS: case AP_OP_SCATTER_ND:
		rc = node->op == AP_OP_SCATTER_ND ? eval_scatter_nd(node, in[0], in[1], in[2], out[0])
			: eval_elements(node, in[0], in[1], n_in > 2 ? in[2] : NULL, out[0]);
		if (rc < 0)
			return ap_error_set(err, rc, node->name, NULL, "%s: index out of range",
					    ap_op_name(node->op));
		return 0;
	case AP_OP_TRILU:
		return eval_trilu(node, in[0], out[0]);
	case AP_OP_CUM_SUM:
		return eval_cumsum(node, in[0], out[0]);
	case AP_OP_ARG_MAX: case AP_OP_ARG_MIN:
		return eval_argext(node, in[0], out[0]);
	case AP_OP_MATMUL:
		return eval_matmul(in[0], in[1], out[0]);
	case AP_OP_SOFTMAX: case AP_OP_LOG_SOFTMAX:
		return eval_softmax(node, in[0], out[0]);
	case AP_OP_REDUCE_SUM: case AP_OP_REDUCE_MEAN: case AP_OP_REDUCE_MAX:
	case AP_OP_REDUCE_MIN: case AP_OP_REDUCE_PROD: case AP_OP_REDUCE_SUM_SQUARE:
	case AP_OP_REDUCE_L1: case AP_OP_REDUCE_L2: case AP_OP_REDUCE_LOG_SUM:
	case AP_OP_REDUCE_LOG_SUM_EXP:
		return eval_reduce(node, in[0], out[0]);
	case AP_OP_LAYER_NORM:
		return eval_layer_norm(node, in, n_in, out, n_out);
	case AP_OP_BATCH_NORM: case AP_OP_INSTANCE_NORM:
		return eval_channel_norm(node, in, out, n_out);
	case AP_OP_LRN:
		return eval_lrn(node, in[0], out[0]);
	case AP_OP_GEMM:
		return eval_gemm(node, in, n_in, out[0]);
	case AP_OP_CONV: case AP_OP_CONV_TRANSPOSE:
		return eval_conv(node, in, n_in, out[0]);
	case AP_OP_MAX_POOL: case AP_OP_AVERAGE_POOL:
		return eval_pool(node, in[0], out[0]);
	default:
		break;
	}
	if (ap_op_category_of(node->op) == AP_CAT_BROADCAST) {
		rc = eval_binary(node, in[0], in[1], out[0]);
		if (rc < 0)
			return ap_error_set(err, rc, node->name, NULL, "%s: division by zero",
					    ap_op_name(node->op));
		return 0;
	}
	if (ap_op_category_of(node->op) == AP_CAT_ELEMWISE)
		return eval_unary(node, in[0], out[0]);
	return AP_EUNSUPPORTED;
}
