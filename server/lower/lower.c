/* lower.c -- one fusion group to one kernel (see lower.h).
 *
 * The group's written tensors are split into classes of equal shape; each
 * class is one grid-stride loop over its linear index i, whose coordinates
 * are derived from i.  For every written tensor, val(t, idx) builds the
 * value of tensor t at index idx:
 *   - CONST tensors are literals (one element, or all elements equal) or
 *     loads from a constant array baked into the source;
 *   - views (Reshape, Identity) relinearise idx onto their input;
 *   - a node of the group computes its op from its inputs' values at the
 *     indices its op maps idx to (op_value);
 *   - anything else is a load from a kernel parameter (a buffer).
 * An index is a set of coordinates and/or a linear index, each derived
 * from the other on demand as pure expressions (no registers), so an index
 * made in one scope is valid in every scope nested in it.  Values are bound
 * to registers and remembered per (tensor, index) in a memo with scopes: a
 * value computed inside a loop body or a branch is forgotten when that
 * scope closes, so it is never used outside it.
 *
 * A reduction group whose reduction covers at least REDUCE_BLOCK_MIN
 * elements is lowered with one block per output element (a grid-stride
 * loop over blocks): each thread folds a strided part of the reduced
 * elements, then a tree in shared memory with barriers combines them.
 * Shorter reductions are computed serially by each thread inside val().
 *
 * Numerics follow the ONNX reference semantics: Max/Min/Relu/ReduceMax
 * propagate NaN, Softplus and Mish are evaluated without overflow, integer
 * division and modulo never trap (a zero divisor gives 0), Mod with
 * fmod=0 takes the divisor's sign, Pow uses powf (negative bases with
 * integral exponents are exact), Gather wraps negative indices and clamps
 * out-of-range ones.
 */
#include "lower.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REDUCE_BLOCK_MIN 32
#define MAX_GRID 65535u

typedef struct lidx {
	int rank;
	int64_t dims[AP_MAX_RANK];
	ap_kir_expr *c[AP_MAX_RANK];   /* coordinates, NULL = derive from lin */
	ap_kir_expr *lin;              /* linear row-major index, NULL = derive */
} lidx;

typedef struct memo_ent {
	int tensor;
	lidx ix;
	ap_kir_expr *val;
	int depth;
} memo_ent;

typedef struct arr_ent {
	int key;                       /* tensor + 1; 0: a free slot */
	ap_kir_array *arr;
} arr_ent;

typedef struct lctx {
	const ap_graph *g;
	const ap_partition *p;
	int gi;
	ap_kir_kernel *k;
	ap_kir_block *cur;
	int depth;
	memo_ent *memo;
	int n_memo, cap_memo;
	arr_ent *arrs;                 /* tensor -> its parameter or constant array (arr_of) */
	int cap_arrs, n_arrs;
	ap_kir_array *no_arr;          /* arr_of's answer when out of memory */
	int n_consts;
	unsigned max_threads;
	int rc;
	ap_error *err;
} lctx;

/* ---- errors ------------------------------------------------------------------ */

static ap_kir_expr *unsupported(lctx *L, const ap_node *n, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static ap_kir_expr *unsupported(lctx *L, const ap_node *n, const char *fmt, ...)
{
	char buf[400];
	va_list ap;

	if (L->rc)
		return NULL;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	L->rc = AP_EUNSUPPORTED;
	ap_error_set(L->err, AP_EUNSUPPORTED, n ? n->name : NULL, NULL, "%s%s%s",
		     n ? ap_op_name(n->op) : "", n ? ": " : "", buf);
	return NULL;
}

/* ---- arrays ------------------------------------------------------------------- */

/* The slot of tensor t's parameter or constant array, NULL in it until one
 * is made.  An open-addressing table on the tensor index: a kernel uses a
 * few of the graph's tensors, and an array over all of them for every
 * kernel would make lowering a graph quadratic in its size. */
static ap_kir_array **arr_of(lctx *L, int t)
{
	unsigned i;

	if (2 * (L->n_arrs + 1) > L->cap_arrs) {
		int ncap = L->cap_arrs ? 2 * L->cap_arrs : 64;
		arr_ent *na = calloc((size_t)ncap, sizeof(*na));

		if (!na) {
			if (!L->rc)
				ap_error_set(L->err, AP_ENOMEM, NULL, NULL, "out of memory lowering a group");
			L->rc = AP_ENOMEM;
			L->no_arr = NULL;
			return &L->no_arr;
		}
		for (int j = 0; j < L->cap_arrs; j++) {
			if (!L->arrs[j].key)
				continue;
			for (i = (unsigned)(L->arrs[j].key - 1) * 2654435761u & (unsigned)(ncap - 1);
			     na[i].key; i = (i + 1) & (unsigned)(ncap - 1))
				;
			na[i] = L->arrs[j];
		}
		free(L->arrs);
		L->arrs = na;
		L->cap_arrs = ncap;
	}
	for (i = (unsigned)t * 2654435761u & (unsigned)(L->cap_arrs - 1); L->arrs[i].key;
	     i = (i + 1) & (unsigned)(L->cap_arrs - 1))
		if (L->arrs[i].key == t + 1)
			return &L->arrs[i].arr;
	L->arrs[i].key = t + 1;
	L->n_arrs++;
	return &L->arrs[i].arr;
}

/* ---- indices ------------------------------------------------------------------ */

static lidx shape_idx(const ap_tensor *t)
{
	lidx r;

	memset(&r, 0, sizeof(r));
	r.rank = t->rank;
	for (int i = 0; i < t->rank; i++)
		r.dims[i] = t->dims[i];
	return r;
}

static bool same_dims(const lidx *a, const ap_tensor *t)
{
	if (a->rank != t->rank)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (a->dims[i] != t->dims[i])
			return false;
	return true;
}

static int64_t stride_of(const lidx *ix, int d)
{
	int64_t s = 1;

	for (int i = d + 1; i < ix->rank; i++)
		s *= ix->dims[i];
	return s;
}

static ap_kir_expr *linear(lctx *L, lidx *ix);

static ap_kir_expr *coord(lctx *L, lidx *ix, int d)
{
	ap_kir_kernel *k = L->k;
	ap_kir_expr *e;
	int64_t s;

	if (ix->dims[d] == 1)
		return ap_kir_idx(k, 0);
	if (ix->c[d])
		return ix->c[d];
	if (!ix->lin)
		return NULL;
	s = stride_of(ix, d);
	e = ix->lin;
	if (s != 1)
		e = ap_kir_binary(k, AP_KIR_DIV, e, ap_kir_idx(k, s));
	if (d > 0)
		e = ap_kir_binary(k, AP_KIR_REM, e, ap_kir_idx(k, ix->dims[d]));
	ix->c[d] = e;
	return e;
}

static ap_kir_expr *linear(lctx *L, lidx *ix)
{
	ap_kir_kernel *k = L->k;
	ap_kir_expr *e;

	if (ix->lin)
		return ix->lin;
	e = ap_kir_idx(k, 0);
	for (int d = 0; d < ix->rank; d++) {
		if (ix->dims[d] == 1)
			continue;
		e = ap_kir_add(k, e, ap_kir_muli(k, coord(L, ix, d), stride_of(ix, d)));
	}
	ix->lin = e;
	return e;
}

/* Index into tensor t (numpy-broadcast to ix's shape) for element ix. */
static lidx bcast(lctx *L, lidx *ix, int t)
{
	const ap_tensor *x = &L->g->tensors[t];
	lidx r;

	if (same_dims(ix, x))
		return *ix;
	r = shape_idx(x);
	for (int d = 0; d < x->rank; d++) {
		int od = d + ix->rank - x->rank;

		r.c[d] = (x->dims[d] == 1 || od < 0) ? ap_kir_idx(L->k, 0) : coord(L, ix, od);
	}
	return r;
}

/* The same element seen with tensor t's shape (same element count). */
static lidx relin(lctx *L, lidx *ix, int t)
{
	const ap_tensor *x = &L->g->tensors[t];
	lidx r;

	if (same_dims(ix, x))
		return *ix;
	r = shape_idx(x);
	r.lin = linear(L, ix);
	return r;
}

static bool idx_equal(const lidx *a, const lidx *b)
{
	bool all = true;

	if (a->rank != b->rank)
		return false;
	for (int d = 0; d < a->rank; d++)
		if (a->dims[d] != b->dims[d])
			return false;
	if (a->lin && b->lin && ap_kir_expr_equal(a->lin, b->lin))
		return true;
	for (int d = 0; d < a->rank && all; d++) {
		if (a->dims[d] == 1)
			continue;
		if (!a->c[d] || !b->c[d] || !ap_kir_expr_equal(a->c[d], b->c[d]))
			all = false;
	}
	return all;
}

/* ---- scopes and memo ----------------------------------------------------------- */

static ap_kir_expr *memo_find(lctx *L, int t, const lidx *ix)
{
	for (int i = L->n_memo - 1; i >= 0; i--)
		if (L->memo[i].tensor == t && idx_equal(&L->memo[i].ix, ix))
			return L->memo[i].val;
	return NULL;
}

static void memo_add(lctx *L, int t, const lidx *ix, ap_kir_expr *v)
{
	if (!v)
		return;
	if (L->n_memo == L->cap_memo) {
		int ncap = L->cap_memo ? 2 * L->cap_memo : 64;
		memo_ent *p = realloc(L->memo, (size_t)ncap * sizeof(*p));

		if (!p)
			return;   /* only a lost optimisation */
		L->memo = p;
		L->cap_memo = ncap;
	}
	L->memo[L->n_memo].tensor = t;
	L->memo[L->n_memo].ix = *ix;
	L->memo[L->n_memo].val = v;
	L->memo[L->n_memo].depth = L->depth;
	L->n_memo++;
}

/* Enters the body of a new `for` in the current block; returns its
 * variable.  *saved receives the block to return to (scope_close). */
static ap_kir_var *loop_open(lctx *L, const char *prefix, ap_kir_expr *lo, ap_kir_expr *hi,
			     int64_t step, ap_kir_block **saved)
{
	ap_kir_var *v = ap_kir_var_new(L->k, L->k->index_type, prefix);
	ap_kir_stmt *s = ap_kir_for(L->k, L->cur, v, lo, hi, step);

	*saved = L->cur;
	L->cur = s ? &s->body : NULL;
	L->depth++;
	return v;
}

/* Enters the then-branch of a new `if`; *stmt gets the statement. */
static void if_open(lctx *L, ap_kir_expr *cond, ap_kir_block **saved, ap_kir_stmt **stmt)
{
	ap_kir_stmt *s = ap_kir_if(L->k, L->cur, cond);

	*saved = L->cur;
	*stmt = s;
	L->cur = s ? &s->body : NULL;
	L->depth++;
}

static void scope_close(lctx *L, ap_kir_block *saved)
{
	while (L->n_memo > 0 && L->memo[L->n_memo - 1].depth >= L->depth)
		L->n_memo--;
	L->depth--;
	L->cur = saved;
}

/* ---- leaves: constants and buffers ----------------------------------------------- */

static bool is_float(ap_dtype t)
{
	return t == AP_DT_F32 || t == AP_DT_F64;
}

static ap_kir_expr *const_elem(lctx *L, const ap_tensor *x, int64_t i)
{
	ap_kir_kernel *k = L->k;
	size_t es = ap_dtype_size(x->dtype);
	const unsigned char *src;

	if (!x->data || (uint64_t)(i + 1) * es > x->nbytes)
		return unsupported(L, NULL, "constant %s is missing its data", x->name);
	src = (const unsigned char *)x->data + (size_t)i * es;
	switch (x->dtype) {
	case AP_DT_F32: { float f; memcpy(&f, src, 4); return ap_kir_float(k, AP_DT_F32, f); }
	case AP_DT_F64: { double d; memcpy(&d, src, 8); return ap_kir_float(k, AP_DT_F64, d); }
	case AP_DT_I64: { int64_t v; memcpy(&v, src, 8); return ap_kir_int(k, AP_DT_I64, v); }
	case AP_DT_I32: { int32_t v; memcpy(&v, src, 4); return ap_kir_int(k, AP_DT_I32, v); }
	case AP_DT_I8: return ap_kir_int(k, AP_DT_I8, (int8_t)src[0]);
	case AP_DT_U8: return ap_kir_int(k, AP_DT_U8, src[0]);
	case AP_DT_BOOL: return ap_kir_int(k, AP_DT_BOOL, src[0] != 0);
	default: return unsupported(L, NULL, "constant %s has dtype %s", x->name,
				    ap_dtype_name(x->dtype));
	}
}

/* True when every element of CONST x equals the first (bitwise). */
static bool const_uniform(const ap_tensor *x, int64_t n)
{
	size_t es = ap_dtype_size(x->dtype);

	if (!x->data || es == 0 || x->nbytes < (size_t)n * es)
		return false;
	for (int64_t i = 1; i < n; i++)
		if (memcmp((const char *)x->data + (size_t)i * es, x->data, es) != 0)
			return false;
	return true;
}

static ap_kir_expr *const_value(lctx *L, int t, lidx *ix)
{
	const ap_tensor *x = &L->g->tensors[t];
	int64_t n = ap_tensor_numel(x), i;
	ap_kir_expr *lin;
	ap_kir_array **a;

	if (n == 1 || const_uniform(x, n))
		return const_elem(L, x, 0);
	if (n <= 0)
		return ap_kir_const(L->k, x->dtype, 0);   /* never read */
	lin = linear(L, ix);
	if (ap_kir_is_int(lin, &i) && i >= 0 && i < n)
		return const_elem(L, x, i);
	a = arr_of(L, t);
	if (!*a) {
		char name[96];

		if (!x->data || x->nbytes < (size_t)n * ap_dtype_size(x->dtype))
			return unsupported(L, NULL, "constant %s is missing its data", x->name);
		snprintf(name, sizeof(name), "c%d", L->n_consts++);
		*a = ap_kir_const_array(L->k, name, x->dtype, n, x->data);
	}
	return ap_kir_load(L->k, *a, lin);
}

static ap_kir_array *buffer_of(lctx *L, int t)
{
	ap_kir_array **a = arr_of(L, t);

	if (!*a) {
		char name[32];

		snprintf(name, sizeof(name), "p%d", L->k->n_params);
		*a = ap_kir_param(L->k, name, L->g->tensors[t].dtype, false, t);
	}
	return *a;
}

/* ---- values -------------------------------------------------------------------- */

static ap_kir_expr *op_value(lctx *L, int n, int t, lidx *ix);

static ap_kir_expr *val(lctx *L, int t, lidx *ix)
{
	const ap_graph *g = L->g;
	const ap_tensor *x;
	ap_kir_expr *v;
	int p;

	if (L->rc || t < 0)
		return NULL;
	v = memo_find(L, t, ix);
	if (v)
		return v;
	x = &g->tensors[t];
	p = x->producer;
	if (x->kind == AP_TENSOR_CONST) {
		v = const_value(L, t, ix);
	} else if (p >= 0 && ap_op_is_view(g->nodes[p].op)) {
		int in = g->nodes[p].inputs[0];
		lidx r = relin(L, ix, in);

		v = val(L, in, &r);
	} else if (p >= 0 && (L->p->group_of[p] == L->gi || L->p->group_of[p] < 0)) {
		/* a member, or a node every reader recomputes (partition.h) */
		v = op_value(L, p, t, ix);
	} else {
		v = ap_kir_load(L->k, buffer_of(L, t), linear(L, ix));
	}
	v = ap_kir_bind(L->k, L->cur, x->dtype, "v", ap_kir_cast(L->k, x->dtype, v));
	memo_add(L, t, ix, v);
	return v;
}

/* ---- scalar helpers --------------------------------------------------------------- */

static ap_kir_expr *C(lctx *L, ap_dtype t, double v)
{
	return ap_kir_const(L->k, t, v);
}

static ap_kir_expr *bin(lctx *L, ap_kir_binop op, ap_kir_expr *a, ap_kir_expr *b)
{
	return ap_kir_binary(L->k, op, a, b);
}

static ap_kir_expr *sel(lctx *L, ap_kir_expr *c, ap_kir_expr *a, ap_kir_expr *b)
{
	return ap_kir_select(L->k, c, a, b);
}

static ap_kir_expr *fn1(lctx *L, ap_kir_fn f, ap_kir_expr *a)
{
	return ap_kir_call(L->k, f, a, NULL);
}

/* Binds an intermediate so it is evaluated once. */
static ap_kir_expr *once(lctx *L, ap_kir_expr *e)
{
	return e ? ap_kir_bind(L->k, L->cur, e->type, "s", e) : NULL;
}

/* NaN-propagating maximum / minimum for floats, plain for integers. */
static ap_kir_expr *vmax(lctx *L, ap_kir_expr *a, ap_kir_expr *b)
{
	if (!a || !b)
		return NULL;
	if (!is_float(a->type))
		return bin(L, AP_KIR_MAX, a, b);
	return sel(L, bin(L, AP_KIR_LOR, bin(L, AP_KIR_GT, a, b), bin(L, AP_KIR_NE, a, a)), a, b);
}

static ap_kir_expr *vmin(lctx *L, ap_kir_expr *a, ap_kir_expr *b)
{
	if (!a || !b)
		return NULL;
	if (!is_float(a->type))
		return bin(L, AP_KIR_MIN, a, b);
	return sel(L, bin(L, AP_KIR_LOR, bin(L, AP_KIR_LT, a, b), bin(L, AP_KIR_NE, a, a)), a, b);
}

static double type_lowest(ap_dtype t)
{
	switch (t) {
	case AP_DT_F32: case AP_DT_F64: return -INFINITY;
	case AP_DT_I64: return -9.2233720368547758e18;
	case AP_DT_I32: return -2147483648.0;
	case AP_DT_I8: return -128;
	default: return 0;
	}
}

static double type_highest(ap_dtype t)
{
	switch (t) {
	case AP_DT_F32: case AP_DT_F64: return INFINITY;
	case AP_DT_I64: return 9.2233720368547758e18;
	case AP_DT_I32: return 2147483647.0;
	case AP_DT_I8: return 127;
	case AP_DT_U8: return 255;
	default: return 1;
	}
}

static ap_kir_expr *reduce_identity(lctx *L, ap_op op, ap_dtype t)
{
	switch (op) {
	case AP_OP_REDUCE_MAX: return C(L, t, type_lowest(t));
	case AP_OP_REDUCE_MIN: return C(L, t, type_highest(t));
	case AP_OP_REDUCE_PROD: return C(L, t, 1);
	default: return C(L, t, 0);
	}
}

static ap_kir_expr *reduce_combine(lctx *L, ap_op op, ap_kir_expr *acc, ap_kir_expr *x)
{
	switch (op) {
	case AP_OP_REDUCE_MAX: return vmax(L, x, acc);
	case AP_OP_REDUCE_MIN: return vmin(L, x, acc);
	case AP_OP_REDUCE_PROD: return bin(L, AP_KIR_MUL, acc, x);
	default: return bin(L, AP_KIR_ADD, acc, x);
	}
}

static ap_kir_expr *softplus(lctx *L, ap_kir_expr *x)
{
	ap_dtype t = x->type;

	/* max(x, 0) + log1p(exp(-|x|)): never overflows */
	return bin(L, AP_KIR_ADD, sel(L, bin(L, AP_KIR_GT, x, C(L, t, 0)), x, C(L, t, 0)),
		   fn1(L, AP_KIR_LOG1P, fn1(L, AP_KIR_EXP, ap_kir_unary(L->k, AP_KIR_NEG,
									fn1(L, AP_KIR_FABS, x)))));
}

/* Integer divisor that is never 0 (0 -> 1; the result is then masked). */
static ap_kir_expr *safe_div(lctx *L, ap_kir_binop op, ap_kir_expr *a, ap_kir_expr *b)
{
	ap_dtype t = a->type;
	ap_kir_expr *zero = bin(L, AP_KIR_EQ, b, C(L, t, 0));
	ap_kir_expr *d = sel(L, zero, C(L, t, 1), b);

	if (t == AP_DT_I64 || t == AP_DT_I32)   /* INT_MIN / -1 traps too */
		d = sel(L, bin(L, AP_KIR_EQ, d, C(L, t, -1)), C(L, t, 1), d);
	ap_kir_expr *q = bin(L, op, a, d);

	if (t == AP_DT_I64 || t == AP_DT_I32)
		q = sel(L, bin(L, AP_KIR_EQ, b, C(L, t, -1)),
			op == AP_KIR_DIV ? ap_kir_unary(L->k, AP_KIR_NEG, a) : C(L, t, 0), q);
	return sel(L, zero, C(L, t, 0), q);
}

/* ---- elementwise and broadcast ops ---------------------------------------------------- */

static ap_kir_expr *unary_value(lctx *L, const ap_node *node, ap_kir_expr *x, ap_dtype out)
{
	ap_kir_kernel *k = L->k;
	ap_dtype t;

	if (!x)
		return NULL;
	t = x->type;
	if (!is_float(t)) {
		switch (node->op) {
		case AP_OP_IDENTITY: case AP_OP_NEG: case AP_OP_ABS: case AP_OP_SIGN:
		case AP_OP_RELU: case AP_OP_NOT: case AP_OP_CAST: case AP_OP_CLIP:
			break;
		default:
			return unsupported(L, node, "dtype %s", ap_dtype_name(t));
		}
	}
	switch (node->op) {
	case AP_OP_IDENTITY: return x;
	case AP_OP_NEG: return ap_kir_unary(k, AP_KIR_NEG, x);
	case AP_OP_ABS:
		return is_float(t) ? fn1(L, AP_KIR_FABS, x)
				   : sel(L, bin(L, AP_KIR_LT, x, C(L, t, 0)), ap_kir_unary(k, AP_KIR_NEG, x), x);
	case AP_OP_EXP: return fn1(L, AP_KIR_EXP, x);
	case AP_OP_LOG: return fn1(L, AP_KIR_LOG, x);
	case AP_OP_SQRT: return fn1(L, AP_KIR_SQRT, x);
	case AP_OP_RECIPROCAL: return bin(L, AP_KIR_DIV, C(L, t, 1), x);
	case AP_OP_TANH: return fn1(L, AP_KIR_TANH, x);
	case AP_OP_SIGMOID:
		return bin(L, AP_KIR_DIV, C(L, t, 1),
			   bin(L, AP_KIR_ADD, C(L, t, 1),
			       fn1(L, AP_KIR_EXP, ap_kir_unary(k, AP_KIR_NEG, x))));
	case AP_OP_RELU: return sel(L, bin(L, AP_KIR_LT, x, C(L, t, 0)), C(L, t, 0), x);
	case AP_OP_ERF: return fn1(L, AP_KIR_ERF, x);
	case AP_OP_SIGN:
		return sel(L, bin(L, AP_KIR_GT, x, C(L, t, 0)), C(L, t, 1),
			   sel(L, bin(L, AP_KIR_LT, x, C(L, t, 0)), C(L, t, -1),
			       is_float(t) ? bin(L, AP_KIR_MUL, x, C(L, t, 0)) : C(L, t, 0)));
	case AP_OP_FLOOR: return fn1(L, AP_KIR_FLOOR, x);
	case AP_OP_CEIL: return fn1(L, AP_KIR_CEIL, x);
	case AP_OP_NOT: return ap_kir_unary(k, AP_KIR_LNOT, x);
	case AP_OP_SOFTSIGN:
		return bin(L, AP_KIR_DIV, x, bin(L, AP_KIR_ADD, C(L, t, 1), fn1(L, AP_KIR_FABS, x)));
	case AP_OP_CAST:
		return ap_kir_cast(k, out, x);
	case AP_OP_LEAKY_RELU: {
		double a = ap_node_float(node, "alpha", 0.01);

		return sel(L, bin(L, AP_KIR_LT, x, C(L, t, 0)), bin(L, AP_KIR_MUL, C(L, t, a), x), x);
	}
	case AP_OP_ELU: {
		double a = ap_node_float(node, "alpha", 1.0);

		return sel(L, bin(L, AP_KIR_LT, x, C(L, t, 0)),
			   bin(L, AP_KIR_MUL, C(L, t, a),
			       bin(L, AP_KIR_SUB, fn1(L, AP_KIR_EXP, x), C(L, t, 1))), x);
	}
	case AP_OP_SELU: {
		double a = ap_node_float(node, "alpha", 1.67326319217681884765625);
		double gm = ap_node_float(node, "gamma", 1.05070102214813232421875);

		return sel(L, bin(L, AP_KIR_LE, x, C(L, t, 0)),
			   bin(L, AP_KIR_MUL, C(L, t, gm),
			       bin(L, AP_KIR_SUB, bin(L, AP_KIR_MUL, C(L, t, a), fn1(L, AP_KIR_EXP, x)),
				   C(L, t, a))),
			   bin(L, AP_KIR_MUL, C(L, t, gm), x));
	}
	case AP_OP_HARD_SIGMOID:
	case AP_OP_HARD_SWISH: {
		bool swish = node->op == AP_OP_HARD_SWISH;
		double a = swish ? 1.0 / 6.0 : ap_node_float(node, "alpha", 0.2);
		double b = swish ? 0.5 : ap_node_float(node, "beta", 0.5);
		ap_kir_expr *v = once(L, bin(L, AP_KIR_ADD, bin(L, AP_KIR_MUL, C(L, t, a), x), C(L, t, b)));

		v = sel(L, bin(L, AP_KIR_LT, v, C(L, t, 0)), C(L, t, 0),
			sel(L, bin(L, AP_KIR_GT, v, C(L, t, 1)), C(L, t, 1), v));
		return swish ? bin(L, AP_KIR_MUL, x, v) : v;
	}
	case AP_OP_SOFTPLUS:
		return softplus(L, x);
	case AP_OP_MISH:
		return bin(L, AP_KIR_MUL, x, fn1(L, AP_KIR_TANH, once(L, softplus(L, x))));
	case AP_OP_GELU: {
		const char *ap = ap_node_string(node, "approximate", "none");
		ap_kir_expr *inner;

		if (strcmp(ap, "tanh") == 0) {
			ap_kir_expr *x3 = bin(L, AP_KIR_MUL, bin(L, AP_KIR_MUL, x, x), x);

			inner = fn1(L, AP_KIR_TANH,
				    bin(L, AP_KIR_MUL, C(L, t, 0.7978845608028654),
					bin(L, AP_KIR_ADD, x, bin(L, AP_KIR_MUL, C(L, t, 0.044715), x3))));
		} else {
			inner = fn1(L, AP_KIR_ERF, bin(L, AP_KIR_MUL, x, C(L, t, 0.7071067811865476)));
		}
		return bin(L, AP_KIR_MUL, bin(L, AP_KIR_MUL, C(L, t, 0.5), x),
			   bin(L, AP_KIR_ADD, C(L, t, 1), inner));
	}
	case AP_OP_CLIP: {
		double lo = ap_node_float(node, "min", -INFINITY), hi = ap_node_float(node, "max", INFINITY);
		ap_kir_expr *v = x;

		if (lo > type_lowest(t))
			v = once(L, sel(L, bin(L, AP_KIR_LT, v, C(L, t, lo)), C(L, t, lo), v));
		if (hi < type_highest(t))
			v = sel(L, bin(L, AP_KIR_GT, v, C(L, t, hi)), C(L, t, hi), v);
		return v;
	}
	default:
		return unsupported(L, node, "not an elementwise op");
	}
}

static ap_kir_expr *binary_value(lctx *L, const ap_node *node, ap_kir_expr *a, ap_kir_expr *b)
{
	ap_dtype t;

	if (!a || !b)
		return NULL;
	t = a->type;
	switch (node->op) {
	case AP_OP_ADD: return bin(L, AP_KIR_ADD, a, b);
	case AP_OP_SUB: return bin(L, AP_KIR_SUB, a, b);
	case AP_OP_MUL: return bin(L, AP_KIR_MUL, a, b);
	case AP_OP_DIV:
		return is_float(t) ? bin(L, AP_KIR_DIV, a, b) : safe_div(L, AP_KIR_DIV, a, b);
	case AP_OP_POW:
		if (is_float(t))
			return ap_kir_call(L->k, AP_KIR_POW, a, ap_kir_cast(L->k, t, b));
		return ap_kir_cast(L->k, t, ap_kir_call(L->k, AP_KIR_POW, ap_kir_cast(L->k, AP_DT_F64, a),
							 ap_kir_cast(L->k, AP_DT_F64, b)));
	case AP_OP_MAX: return vmax(L, a, b);
	case AP_OP_MIN: return vmin(L, a, b);
	case AP_OP_PRELU:
		return sel(L, bin(L, AP_KIR_LT, a, C(L, t, 0)), bin(L, AP_KIR_MUL, b, a), a);
	case AP_OP_MOD: {
		bool fmod_ = ap_node_int(node, "fmod", 0) != 0;
		ap_kir_expr *r;

		if (is_float(t))
			r = ap_kir_call(L->k, AP_KIR_FMOD, a, b);
		else
			r = safe_div(L, AP_KIR_REM, a, b);
		if (fmod_)
			return r;
		r = once(L, r);
		/* Python's sign rule: a nonzero remainder takes the divisor's sign */
		return sel(L, bin(L, AP_KIR_LAND, bin(L, AP_KIR_NE, r, C(L, t, 0)),
				  bin(L, AP_KIR_NE, bin(L, AP_KIR_LT, r, C(L, t, 0)),
				      bin(L, AP_KIR_LT, b, C(L, t, 0)))),
			   bin(L, AP_KIR_ADD, r, b), r);
	}
	case AP_OP_EQUAL: return bin(L, AP_KIR_EQ, a, b);
	case AP_OP_LESS: return bin(L, AP_KIR_LT, a, b);
	case AP_OP_GREATER: return bin(L, AP_KIR_GT, a, b);
	case AP_OP_LESS_OR_EQUAL: return bin(L, AP_KIR_LE, a, b);
	case AP_OP_GREATER_OR_EQUAL: return bin(L, AP_KIR_GE, a, b);
	case AP_OP_AND: return bin(L, AP_KIR_LAND, a, b);
	case AP_OP_OR: return bin(L, AP_KIR_LOR, a, b);
	case AP_OP_XOR: return bin(L, AP_KIR_NE, ap_kir_cast(L->k, AP_DT_BOOL, a),
				   ap_kir_cast(L->k, AP_DT_BOOL, b));
	default:
		return unsupported(L, node, "not a binary op");
	}
}

/* ---- reductions (serial) ---------------------------------------------------------------- */

/* Index into the reduction input x for output element `out` and reduced
 * element `r` (linear over the reduced axes). */
static lidx reduce_in_idx(lctx *L, const ap_node *node, int x, lidx *out, ap_kir_expr *r)
{
	const ap_tensor *xt = &L->g->tensors[x];
	const ap_attr *ax = ap_node_attr(node, "axes");
	bool keep = ap_node_int(node, "keepdims", 1) != 0;
	bool red[AP_MAX_RANK] = {false};
	lidx in = shape_idx(xt);
	int od = 0;
	int64_t rstride = 1;

	for (int i = 0; ax && i < ax->n_ints; i++)
		if (ax->ints[i] >= 0 && ax->ints[i] < xt->rank)
			red[ax->ints[i]] = true;
	/* reduced coordinates, innermost reduced axis fastest */
	for (int d = xt->rank - 1; d >= 0; d--) {
		if (!red[d])
			continue;
		ap_kir_expr *e = r;

		if (rstride != 1)
			e = ap_kir_binary(L->k, AP_KIR_DIV, e, ap_kir_idx(L->k, rstride));
		e = ap_kir_binary(L->k, AP_KIR_REM, e, ap_kir_idx(L->k, xt->dims[d]));
		in.c[d] = xt->dims[d] == 1 ? ap_kir_idx(L->k, 0) : e;
		rstride *= xt->dims[d];
	}
	for (int d = 0; d < xt->rank; d++) {
		if (red[d]) {
			if (keep)
				od++;
			continue;
		}
		in.c[d] = coord(L, out, od++);
	}
	return in;
}

static int64_t reduced_count(const ap_graph *g, const ap_node *node)
{
	const ap_tensor *xt = &g->tensors[node->inputs[0]];
	const ap_attr *ax = ap_node_attr(node, "axes");
	int64_t n = 1;

	for (int i = 0; ax && i < ax->n_ints; i++)
		if (ax->ints[i] >= 0 && ax->ints[i] < xt->rank)
			n *= xt->dims[ax->ints[i]];
	return n;
}

static ap_kir_expr *reduce_serial(lctx *L, const ap_node *node, int t, lidx *ix)
{
	ap_kir_kernel *k = L->k;
	ap_dtype dt = L->g->tensors[t].dtype;
	int x = node->inputs[0];
	int64_t R = reduced_count(L->g, node);
	ap_kir_var *acc = ap_kir_var_new(k, dt, "acc"), *r;
	ap_kir_block *saved;
	lidx in;

	ap_kir_let(k, L->cur, acc, reduce_identity(L, node->op, dt));
	r = loop_open(L, "r", ap_kir_idx(k, 0), ap_kir_idx(k, R), 1, &saved);
	in = reduce_in_idx(L, node, x, ix, ap_kir_ref(k, r));
	ap_kir_assign(k, L->cur, acc, reduce_combine(L, node->op, ap_kir_ref(k, acc), val(L, x, &in)));
	scope_close(L, saved);
	return ap_kir_ref(k, acc);
}

/* ---- matmul, convolution, pooling ------------------------------------------------------- */

static ap_kir_expr *matmul_value(lctx *L, const ap_node *node, int t, lidx *ix)
{
	ap_kir_kernel *k = L->k;
	const ap_graph *g = L->g;
	int a = node->inputs[0], b = node->inputs[1];
	const ap_tensor *at = &g->tensors[a], *bt = &g->tensors[b];
	ap_dtype dt = g->tensors[t].dtype;
	int ra = at->rank, rb = bt->rank, ro = ix->rank;
	bool a1 = ra == 1, b1 = rb == 1;
	int nb = ro - (a1 ? 0 : 1) - (b1 ? 0 : 1);
	int64_t K = at->dims[ra - 1];
	ap_kir_expr *i = NULL, *j = NULL;
	ap_kir_var *acc = ap_kir_var_new(k, dt, "acc"), *kv;
	ap_kir_block *saved;
	lidx ai = shape_idx(at), bi = shape_idx(bt);

	if (!b1)
		j = coord(L, ix, ro - 1);
	if (!a1)
		i = coord(L, ix, ro - 1 - (b1 ? 0 : 1));
	/* batch coordinates, right-aligned, size-1 dims read at 0 */
	for (int d = 0; d < ra - 2; d++) {
		int od = d + nb - (ra - 2);

		ai.c[d] = (at->dims[d] == 1 || od < 0) ? ap_kir_idx(k, 0) : coord(L, ix, od);
	}
	for (int d = 0; d < rb - 2; d++) {
		int od = d + nb - (rb - 2);

		bi.c[d] = (bt->dims[d] == 1 || od < 0) ? ap_kir_idx(k, 0) : coord(L, ix, od);
	}
	ap_kir_let(k, L->cur, acc, C(L, dt, 0));
	kv = loop_open(L, "k", ap_kir_idx(k, 0), ap_kir_idx(k, K), 1, &saved);
	if (a1) {
		ai.c[0] = ap_kir_ref(k, kv);
	} else {
		ai.c[ra - 2] = i;
		ai.c[ra - 1] = ap_kir_ref(k, kv);
	}
	if (b1) {
		bi.c[0] = ap_kir_ref(k, kv);
	} else {
		bi.c[rb - 2] = ap_kir_ref(k, kv);
		bi.c[rb - 1] = j;
	}
	ap_kir_assign(k, L->cur, acc,
		      bin(L, AP_KIR_ADD, ap_kir_ref(k, acc),
			  bin(L, AP_KIR_MUL, val(L, a, &ai), val(L, b, &bi))));
	scope_close(L, saved);
	return ap_kir_ref(k, acc);
}

static int64_t attr_at(const ap_node *node, const char *name, int i, int64_t dflt)
{
	const ap_attr *a = ap_node_attr(node, name);

	if (!a || a->type != AP_ATTR_INTS || i >= a->n_ints)
		return dflt;
	return a->ints[i];
}

/* Conv: out[n, m, o...] = B[m] + sum_{c, k...} X[n, g*Cg + c, o*s - pb + k*d] * W[m, c, k...]
 * ConvTranspose: out[n, m, o...] = B[m] + sum_{c, k...} X[n, ci, (o + pb - k*d) / s]
 *   * W[ci, m % Mg, k...] over ci = g*Cg + c where o + pb - k*d is a multiple of s. */
static ap_kir_expr *conv_value(lctx *L, const ap_node *node, int t, lidx *ix)
{
	ap_kir_kernel *k = L->k;
	const ap_graph *g = L->g;
	bool tr = node->op == AP_OP_CONV_TRANSPOSE;
	int x = node->inputs[0], w = node->inputs[1];
	int bias = node->n_inputs > 2 ? node->inputs[2] : -1;
	const ap_tensor *xt = &g->tensors[x], *wt = &g->tensors[w], *yt = &g->tensors[t];
	ap_dtype dt = yt->dtype;
	int ns = xt->rank - 2;
	int64_t group = ap_node_int(node, "group", 1);
	int64_t C_ = xt->dims[1], M = yt->dims[1];
	int64_t Cg, Mg;
	ap_kir_expr *n_, *m, *gi, *ci, *mm;
	ap_kir_var *acc, *cv;
	ap_kir_block *saves[2 * AP_MAX_RANK + 2];
	int ns_saves = 0;
	lidx xi = shape_idx(xt), wi = shape_idx(wt), bi;
	ap_kir_block *saved;
	ap_kir_stmt *st;

	if (group < 1 || C_ % group || M % group || ns < 1)
		return unsupported(L, node, "bad group %lld for %lld -> %lld channels",
				   (long long)group, (long long)C_, (long long)M);
	Cg = C_ / group;
	Mg = M / group;
	n_ = coord(L, ix, 0);
	m = coord(L, ix, 1);
	gi = once(L, bin(L, AP_KIR_DIV, m, ap_kir_idx(k, Mg)));
	mm = tr ? once(L, bin(L, AP_KIR_REM, m, ap_kir_idx(k, Mg))) : NULL;
	acc = ap_kir_var_new(k, dt, "acc");
	if (bias >= 0) {
		bi = shape_idx(&g->tensors[bias]);
		bi.c[0] = m;
		ap_kir_let(k, L->cur, acc, val(L, bias, &bi));
	} else {
		ap_kir_let(k, L->cur, acc, C(L, dt, 0));
	}
	cv = loop_open(L, "c", ap_kir_idx(k, 0), ap_kir_idx(k, Cg), 1, &saved);
	saves[ns_saves++] = saved;
	ci = once(L, ap_kir_add(k, ap_kir_muli(k, gi, Cg), ap_kir_ref(k, cv)));
	xi.c[0] = n_;
	xi.c[1] = ci;
	if (tr) {
		wi.c[0] = ci;
		wi.c[1] = mm;
	} else {
		wi.c[0] = m;
		wi.c[1] = ap_kir_ref(k, cv);
	}
	for (int d = 0; d < ns; d++) {
		int64_t s = attr_at(node, "strides", d, 1), dil = attr_at(node, "dilations", d, 1);
		int64_t pb = attr_at(node, "pads", d, 0);
		int64_t K = wt->dims[2 + d], D = xt->dims[2 + d], O = yt->dims[2 + d];
		ap_kir_var *kv = loop_open(L, "k", ap_kir_idx(k, 0), ap_kir_idx(k, K), 1, &saved);
		ap_kir_expr *o = coord(L, ix, 2 + d), *pos, *cond;

		saves[ns_saves++] = saved;
		wi.c[2 + d] = ap_kir_ref(k, kv);
		if (!tr) {
			pos = once(L, ap_kir_add(k, ap_kir_addi(k, ap_kir_muli(k, o, s), -pb),
						 ap_kir_muli(k, ap_kir_ref(k, kv), dil)));
			xi.c[2 + d] = pos;
			if (pb == 0 && (O - 1) * s + (K - 1) * dil < D)
				continue;   /* always in range */
			cond = bin(L, AP_KIR_LAND, bin(L, AP_KIR_GE, pos, ap_kir_idx(k, 0)),
				   bin(L, AP_KIR_LT, pos, ap_kir_idx(k, D)));
		} else {
			pos = once(L, ap_kir_add(k, ap_kir_addi(k, o, pb),
						 ap_kir_muli(k, ap_kir_ref(k, kv), -dil)));
			xi.c[2 + d] = s == 1 ? pos : bin(L, AP_KIR_DIV, pos, ap_kir_idx(k, s));
			cond = bin(L, AP_KIR_GE, pos, ap_kir_idx(k, 0));
			if (s != 1)
				cond = bin(L, AP_KIR_LAND, cond,
					   bin(L, AP_KIR_EQ, bin(L, AP_KIR_REM, pos, ap_kir_idx(k, s)),
					       ap_kir_idx(k, 0)));
			cond = bin(L, AP_KIR_LAND, cond,
				   bin(L, AP_KIR_LT, pos, ap_kir_idx(k, D * s)));
		}
		if_open(L, cond, &saved, &st);
		saves[ns_saves++] = saved;
	}
	ap_kir_assign(k, L->cur, acc,
		      bin(L, AP_KIR_ADD, ap_kir_ref(k, acc),
			  bin(L, AP_KIR_MUL, val(L, x, &xi), val(L, w, &wi))));
	while (ns_saves > 0)
		scope_close(L, saves[--ns_saves]);
	return ap_kir_ref(k, acc);
}

/* MaxPool / AveragePool over the window o*s - pb + k*d, k < kernel_shape. */
static ap_kir_expr *pool_value(lctx *L, const ap_node *node, int t, lidx *ix)
{
	ap_kir_kernel *k = L->k;
	const ap_graph *g = L->g;
	bool avg = node->op == AP_OP_AVERAGE_POOL;
	bool incl = ap_node_int(node, "count_include_pad", 0) != 0;
	int x = node->inputs[0];
	const ap_tensor *xt = &g->tensors[x];
	ap_dtype dt = g->tensors[t].dtype;
	int ns = xt->rank - 2;
	ap_kir_var *acc = ap_kir_var_new(k, dt, "acc"), *cnt = NULL;
	ap_kir_block *saves[AP_MAX_RANK + 2];
	int n_saves = 0;
	ap_kir_expr *valid = NULL, *inpad = NULL;
	lidx xi = shape_idx(xt);
	ap_kir_block *saved;
	ap_kir_stmt *st;

	if (ns < 1)
		return unsupported(L, node, "input rank %d", xt->rank);
	if (avg && !is_float(dt))
		return unsupported(L, node, "dtype %s", ap_dtype_name(dt));
	ap_kir_let(k, L->cur, acc, avg ? C(L, dt, 0) : C(L, dt, type_lowest(dt)));
	if (avg) {
		cnt = ap_kir_var_new(k, AP_DT_I64, "cnt");
		ap_kir_let(k, L->cur, cnt, ap_kir_i64(k, 0));
	}
	xi.c[0] = coord(L, ix, 0);
	xi.c[1] = coord(L, ix, 1);
	for (int d = 0; d < ns; d++) {
		int64_t K = attr_at(node, "kernel_shape", d, 1);
		int64_t s = attr_at(node, "strides", d, 1), dil = attr_at(node, "dilations", d, 1);
		int64_t pb = attr_at(node, "pads", d, 0), pe = attr_at(node, "pads", ns + d, 0);
		int64_t D = xt->dims[2 + d];
		ap_kir_var *kv = loop_open(L, "k", ap_kir_idx(k, 0), ap_kir_idx(k, K), 1, &saved);
		ap_kir_expr *pos;

		saves[n_saves++] = saved;
		pos = once(L, ap_kir_add(k, ap_kir_addi(k, ap_kir_muli(k, coord(L, ix, 2 + d), s), -pb),
					 ap_kir_muli(k, ap_kir_ref(k, kv), dil)));
		xi.c[2 + d] = pos;
		ap_kir_expr *v = bin(L, AP_KIR_LAND, bin(L, AP_KIR_GE, pos, ap_kir_idx(k, 0)),
				     bin(L, AP_KIR_LT, pos, ap_kir_idx(k, D)));
		ap_kir_expr *p = bin(L, AP_KIR_LAND, bin(L, AP_KIR_GE, pos, ap_kir_idx(k, -pb)),
				     bin(L, AP_KIR_LT, pos, ap_kir_idx(k, D + pe)));

		valid = valid ? bin(L, AP_KIR_LAND, valid, v) : v;
		inpad = inpad ? bin(L, AP_KIR_LAND, inpad, p) : p;
	}
	if (avg) {
		ap_kir_expr *counted = once(L, incl ? inpad : valid);

		ap_kir_assign(k, L->cur, cnt,
			      ap_kir_add(k, ap_kir_ref(k, cnt), ap_kir_cast(k, AP_DT_I64, counted)));
	}
	if_open(L, valid, &saved, &st);
	saves[n_saves++] = saved;
	{
		ap_kir_expr *xv = val(L, x, &xi);

		ap_kir_assign(k, L->cur, acc,
			      avg ? bin(L, AP_KIR_ADD, ap_kir_ref(k, acc), xv) : vmax(L, xv, ap_kir_ref(k, acc)));
	}
	while (n_saves > 0)
		scope_close(L, saves[--n_saves]);
	if (avg)
		return bin(L, AP_KIR_DIV, ap_kir_ref(k, acc), ap_kir_cast(k, dt, ap_kir_ref(k, cnt)));
	return ap_kir_ref(k, acc);
}

/* LRN: x / (bias + alpha/size * sum of x^2 over the channel window)^beta. */
static ap_kir_expr *lrn_value(lctx *L, const ap_node *node, int t, lidx *ix)
{
	ap_kir_kernel *k = L->k;
	int x = node->inputs[0];
	const ap_tensor *xt = &L->g->tensors[x];
	ap_dtype dt = xt->dtype;
	double alpha = ap_node_float(node, "alpha", 1e-4), beta = ap_node_float(node, "beta", 0.75);
	double bias = ap_node_float(node, "bias", 1.0);
	int64_t size = ap_node_int(node, "size", 1);
	int64_t before = (size - 1) / 2, after = size - 1 - before;
	ap_kir_expr *c, *lo, *hi, *xv;
	ap_kir_var *acc = ap_kir_var_new(k, dt, "acc"), *j;
	ap_kir_block *saved;
	lidx xi;

	if (xt->rank < 2 || !is_float(dt) || size < 1)
		return unsupported(L, node, "input rank %d, dtype %s, size %lld", xt->rank,
				   ap_dtype_name(dt), (long long)size);
	c = coord(L, ix, 1);
	lo = bin(L, AP_KIR_MAX, ap_kir_addi(k, c, -before), ap_kir_idx(k, 0));
	hi = bin(L, AP_KIR_MIN, ap_kir_addi(k, c, after + 1), ap_kir_idx(k, xt->dims[1]));
	xv = val(L, x, ix);
	ap_kir_let(k, L->cur, acc, C(L, dt, 0));
	j = loop_open(L, "j", lo, hi, 1, &saved);
	xi = *ix;
	xi.lin = NULL;
	for (int d = 0; d < xi.rank; d++)
		xi.c[d] = d == 1 ? ap_kir_ref(k, j) : coord(L, ix, d);
	{
		ap_kir_expr *v = val(L, x, &xi);

		ap_kir_assign(k, L->cur, acc, bin(L, AP_KIR_ADD, ap_kir_ref(k, acc), bin(L, AP_KIR_MUL, v, v)));
	}
	scope_close(L, saved);
	return bin(L, AP_KIR_DIV, xv,
		   ap_kir_call(k, AP_KIR_POW,
			       bin(L, AP_KIR_ADD, C(L, dt, bias),
				   bin(L, AP_KIR_MUL, C(L, dt, alpha / (double)size), ap_kir_ref(k, acc))),
			       C(L, dt, beta)));
}

/* ---- data movement ------------------------------------------------------------------ */

/* Concat: one guarded assignment per input, `if (lo <= c < hi) v = in[...]`,
 * flat rather than nested so any number of inputs is fine. */
static ap_kir_expr *concat_value(lctx *L, const ap_node *node, int t, lidx *ix)
{
	ap_kir_kernel *k = L->k;
	int64_t axis = ap_node_int(node, "axis", 0), off = 0;
	ap_dtype dt = L->g->tensors[t].dtype;
	ap_kir_var *v;
	ap_kir_expr *ca;
	int n_live = 0;

	if (axis < 0 || axis >= ix->rank)
		return unsupported(L, node, "axis %lld", (long long)axis);
	v = ap_kir_var_new(k, dt, "cat");
	ca = coord(L, ix, (int)axis);
	for (int i = 0; i < node->n_inputs; i++)
		if (node->inputs[i] >= 0 && L->g->tensors[node->inputs[i]].dims[axis] > 0)
			n_live++;
	ap_kir_let(k, L->cur, v, C(L, dt, 0));
	for (int i = 0; i < node->n_inputs && !L->rc; i++) {
		int in = node->inputs[i];
		int64_t len;
		lidx r;

		if (in < 0)
			continue;
		len = L->g->tensors[in].dims[axis];
		if (len == 0)
			continue;
		r = *ix;
		r.lin = NULL;
		for (int d = 0; d < r.rank; d++)
			r.c[d] = coord(L, ix, d);
		r.dims[axis] = len;
		r.c[axis] = ap_kir_addi(k, ca, -off);
		if (n_live > 1) {
			ap_kir_block *saved;
			ap_kir_stmt *st;

			if_open(L, bin(L, AP_KIR_LAND, bin(L, AP_KIR_GE, ca, ap_kir_idx(k, off)),
				       bin(L, AP_KIR_LT, ca, ap_kir_idx(k, off + len))), &saved, &st);
			ap_kir_assign(k, L->cur, v, val(L, in, &r));
			scope_close(L, saved);
		} else {
			ap_kir_assign(k, L->cur, v, val(L, in, &r));
		}
		off += len;
	}
	return ap_kir_ref(k, v);
}

static ap_kir_expr *gather_value(lctx *L, const ap_node *node, int t, lidx *ix)
{
	ap_kir_kernel *k = L->k;
	const ap_graph *g = L->g;
	int data = node->inputs[0], ind = node->inputs[1];
	const ap_tensor *dt = &g->tensors[data], *it = &g->tensors[ind];
	int64_t axis = ap_node_int(node, "axis", 0), D;
	int q = it->rank;
	lidx ii = shape_idx(it), di = shape_idx(dt);
	ap_kir_expr *v;

	if (axis < 0 || axis >= dt->rank)
		return unsupported(L, node, "axis %lld", (long long)axis);
	if (it->dtype != AP_DT_I64 && it->dtype != AP_DT_I32)
		return unsupported(L, node, "indices dtype %s", ap_dtype_name(it->dtype));
	D = dt->dims[axis];
	for (int d = 0; d < q; d++)
		ii.c[d] = coord(L, ix, (int)axis + d);
	/* in int64 until wrapped and clamped, then the index type */
	v = once(L, ap_kir_cast(k, AP_DT_I64, val(L, ind, &ii)));
	v = sel(L, bin(L, AP_KIR_LT, v, ap_kir_i64(k, 0)), ap_kir_addi(k, v, D), v);
	v = once(L, ap_kir_cast(k, k->index_type,
				bin(L, AP_KIR_MIN, bin(L, AP_KIR_MAX, v, ap_kir_i64(k, 0)),
				    ap_kir_i64(k, D > 0 ? D - 1 : 0))));
	for (int d = 0; d < dt->rank; d++) {
		if (d < axis)
			di.c[d] = coord(L, ix, d);
		else if (d == axis)
			di.c[d] = v;
		else
			di.c[d] = coord(L, ix, d + q - 1);
	}
	return val(L, data, &di);
}

static ap_kir_expr *pad_value(lctx *L, const ap_node *node, int t, lidx *ix)
{
	ap_kir_kernel *k = L->k;
	int x = node->inputs[0];
	const ap_tensor *xt = &L->g->tensors[x];
	const char *mode = ap_node_string(node, "mode", "constant");
	int r = xt->rank;
	lidx xi = shape_idx(xt);
	ap_kir_expr *cond = NULL;

	for (int d = 0; d < r; d++) {
		int64_t pb = attr_at(node, "pads", d, 0), D = xt->dims[d];
		ap_kir_expr *j = ap_kir_addi(k, coord(L, ix, d), -pb);

		if (strcmp(mode, "constant") == 0) {
			int64_t O = ix->dims[d];
			bool lo_ok = pb <= 0, hi_ok = O - pb <= D;

			if (!lo_ok) {
				ap_kir_expr *c = bin(L, AP_KIR_GE, j, ap_kir_idx(k, 0));
				cond = cond ? bin(L, AP_KIR_LAND, cond, c) : c;
			}
			if (!hi_ok) {
				ap_kir_expr *c = bin(L, AP_KIR_LT, j, ap_kir_idx(k, D));
				cond = cond ? bin(L, AP_KIR_LAND, cond, c) : c;
			}
		} else if (strcmp(mode, "reflect") == 0) {
			if (D == 1) {
				j = ap_kir_idx(k, 0);
			} else {
				/* reflect about the edges, repeatedly: period 2(D-1) */
				int64_t per = 2 * (D - 1);
				ap_kir_expr *m = bin(L, AP_KIR_REM, j, ap_kir_idx(k, per));

				m = once(L, sel(L, bin(L, AP_KIR_LT, m, ap_kir_idx(k, 0)), ap_kir_addi(k, m, per), m));
				j = sel(L, bin(L, AP_KIR_GE, m, ap_kir_idx(k, D)),
					ap_kir_add(k, ap_kir_idx(k, per), ap_kir_unary(k, AP_KIR_NEG, m)), m);
			}
		} else if (strcmp(mode, "edge") == 0) {
			j = bin(L, AP_KIR_MIN, bin(L, AP_KIR_MAX, j, ap_kir_idx(k, 0)),
				ap_kir_idx(k, D > 0 ? D - 1 : 0));
		} else {
			return unsupported(L, node, "mode %s", mode);
		}
		xi.c[d] = once(L, j);
	}
	if (strcmp(mode, "constant") == 0 && cond) {
		ap_dtype dt = L->g->tensors[t].dtype;
		ap_kir_var *v = ap_kir_var_new(k, dt, "pad");
		ap_kir_block *saved;
		ap_kir_stmt *st;

		ap_kir_let(k, L->cur, v, C(L, dt, ap_node_float(node, "value", 0)));
		if_open(L, cond, &saved, &st);
		ap_kir_assign(k, L->cur, v, val(L, x, &xi));
		scope_close(L, saved);
		return ap_kir_ref(k, v);
	}
	if (ap_tensor_numel(xt) == 0)
		return C(L, L->g->tensors[t].dtype, ap_node_float(node, "value", 0));
	return val(L, x, &xi);
}

/* ---- dispatch ------------------------------------------------------------------------- */

static ap_kir_expr *op_value(lctx *L, int n, int t, lidx *ix)
{
	const ap_graph *g = L->g;
	const ap_node *node = &g->nodes[n];
	ap_kir_kernel *k = L->k;
	ap_dtype out = g->tensors[t].dtype;

	switch (ap_op_category_of(node->op)) {
	case AP_CAT_ELEMWISE: {
		lidx r = *ix;

		return unary_value(L, node, val(L, node->inputs[0], &r), out);
	}
	case AP_CAT_BROADCAST:
		if (node->op == AP_OP_EXPAND) {
			lidx r = bcast(L, ix, node->inputs[0]);

			return val(L, node->inputs[0], &r);
		}
		if (node->op == AP_OP_WHERE) {
			lidx rc = bcast(L, ix, node->inputs[0]);
			lidx ra = bcast(L, ix, node->inputs[1]);
			lidx rb = bcast(L, ix, node->inputs[2]);
			ap_kir_expr *c = val(L, node->inputs[0], &rc);
			ap_kir_expr *a = val(L, node->inputs[1], &ra);
			ap_kir_expr *b = val(L, node->inputs[2], &rb);

			return sel(L, ap_kir_cast(k, AP_DT_BOOL, c), a, b);
		} else {
			lidx ra = bcast(L, ix, node->inputs[0]);
			lidx rb = bcast(L, ix, node->inputs[1]);
			ap_kir_expr *a = val(L, node->inputs[0], &ra);
			ap_kir_expr *b = val(L, node->inputs[1], &rb);

			return binary_value(L, node, a, b);
		}
	case AP_CAT_REDUCTION:
		return reduce_serial(L, node, t, ix);
	default:
		break;
	}
	switch (node->op) {
	case AP_OP_MATMUL:
		return matmul_value(L, node, t, ix);
	case AP_OP_CONV:
	case AP_OP_CONV_TRANSPOSE:
		return conv_value(L, node, t, ix);
	case AP_OP_MAX_POOL:
	case AP_OP_AVERAGE_POOL:
		return pool_value(L, node, t, ix);
	case AP_OP_LRN:
		return lrn_value(L, node, t, ix);
	case AP_OP_TRANSPOSE: {
		int x = node->inputs[0];
		lidx r = shape_idx(&g->tensors[x]);

		for (int d = 0; d < ix->rank; d++) {
			int64_t pd = attr_at(node, "perm", d, ix->rank - 1 - d);

			if (pd < 0 || pd >= r.rank)
				return unsupported(L, node, "bad perm");
			r.c[pd] = coord(L, ix, d);
		}
		return val(L, x, &r);
	}
	case AP_OP_SLICE: {
		int x = node->inputs[0];
		lidx r = shape_idx(&g->tensors[x]);

		for (int d = 0; d < r.rank; d++)
			r.c[d] = ap_kir_addi(k, ap_kir_muli(k, coord(L, ix, d), attr_at(node, "steps", d, 1)),
					     attr_at(node, "starts", d, 0));
		return val(L, x, &r);
	}
	case AP_OP_TILE: {
		int x = node->inputs[0];
		lidx r = shape_idx(&g->tensors[x]);

		for (int d = 0; d < r.rank; d++) {
			ap_kir_expr *c = coord(L, ix, d);

			r.c[d] = r.dims[d] == ix->dims[d] ? c : bin(L, AP_KIR_REM, c, ap_kir_idx(k, r.dims[d]));
		}
		return val(L, x, &r);
	}
	case AP_OP_SPLIT: {
		int x = node->inputs[0];
		int64_t axis = ap_node_int(node, "axis", 0), off = 0;
		lidx r = shape_idx(&g->tensors[x]);

		for (int o = 0; o < node->n_outputs && node->outputs[o] != t; o++)
			if (node->outputs[o] >= 0)
				off += g->tensors[node->outputs[o]].dims[axis];
		for (int d = 0; d < r.rank; d++)
			r.c[d] = d == axis ? ap_kir_addi(k, coord(L, ix, d), off) : coord(L, ix, d);
		return val(L, x, &r);
	}
	case AP_OP_CONCAT:
		return concat_value(L, node, t, ix);
	case AP_OP_GATHER:
		return gather_value(L, node, t, ix);
	case AP_OP_PAD:
		return pad_value(L, node, t, ix);
	case AP_OP_RESHAPE: {
		lidx r = relin(L, ix, node->inputs[0]);

		return val(L, node->inputs[0], &r);
	}
	default:
		return unsupported(L, node, "no lowering for this op");
	}
}

/* ---- kernels ---------------------------------------------------------------------------- */

typedef struct shape_str {
	char s[128];
} shape_str;

static shape_str shape_text(const ap_tensor *t)
{
	shape_str r;
	size_t len = 0;

	r.s[len++] = '[';
	for (int i = 0; i < t->rank && len + 24 < sizeof(r.s); i++)
		len += (size_t)snprintf(r.s + len, sizeof(r.s) - len, "%s%lld", i ? "," : "",
					(long long)t->dims[i]);
	r.s[len++] = ']';
	r.s[len] = 0;
	return r;
}

static unsigned pow2_at_least(int64_t n, unsigned lo, unsigned hi)
{
	unsigned p = lo;

	while (p < hi && (int64_t)p < n)
		p *= 2;
	return p;
}

/* Grid-stride loops, one per class of written tensors of equal shape. */
static void lower_pointwise(lctx *L, const ap_group *grp)
{
	ap_kir_kernel *k = L->k;
	const ap_graph *g = L->g;
	bool *done = calloc((size_t)grp->n_outputs + 1, sizeof(bool));
	int64_t max_n = 0;
	unsigned bs, grid;

	if (!done) {
		k->failed = true;
		return;
	}
	for (int i = 0; i < grp->n_outputs; i++) {
		int64_t n = ap_tensor_numel(&g->tensors[grp->outputs[i]]);

		if (n > max_n)
			max_n = n;
	}
	bs = pow2_at_least(max_n, 32, L->max_threads);
	grid = (unsigned)((max_n + bs - 1) / bs);
	if (grid > MAX_GRID)
		grid = MAX_GRID;
	if (grid < 1)
		grid = 1;
	k->grid[0] = grid;
	k->block[0] = bs;
	for (int i = 0; i < grp->n_outputs && !L->rc; i++) {
		const ap_tensor *first = &g->tensors[grp->outputs[i]];
		ap_kir_block *saved;
		ap_kir_var *iv;
		lidx ix;

		if (done[i])
			continue;
		iv = loop_open(L, "i",
			       ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), bs),
					  ap_kir_index_of(k, AP_KIR_THREAD_X)),
			       ap_kir_idx(k, ap_tensor_numel(first)), (int64_t)grid * bs, &saved);
		ix = shape_idx(first);
		ix.lin = ap_kir_ref(k, iv);
		/* name the coordinates once */
		for (int d = 0; d < ix.rank; d++)
			if (ix.dims[d] != 1)
				ix.c[d] = ap_kir_bind(k, L->cur, k->index_type, "x", coord(L, &ix, d));
		for (int j = i; j < grp->n_outputs; j++) {
			int t = grp->outputs[j];
			lidx r;

			if (done[j] || !same_dims(&ix, &g->tensors[t]))
				continue;
			done[j] = true;
			r = ix;
			ap_kir_store(k, L->cur, *arr_of(L, t), ix.lin, val(L, t, &r));
		}
		scope_close(L, saved);
	}
	free(done);
}

/* One block per output element: strided partial folds, then a tree in
 * shared memory.  The loop over output elements is uniform per block. */
static void lower_reduce_block(lctx *L, const ap_group *grp)
{
	ap_kir_kernel *k = L->k;
	const ap_graph *g = L->g;
	const ap_node *node = &g->nodes[grp->root];
	int y = node->outputs[0], x = node->inputs[0];
	ap_dtype dt = g->tensors[y].dtype;
	int64_t M = ap_tensor_numel(&g->tensors[y]), R = reduced_count(g, node);
	unsigned bs = pow2_at_least(R, 32, L->max_threads);
	unsigned grid = M > MAX_GRID ? MAX_GRID : (M < 1 ? 1 : (unsigned)M);
	ap_kir_array *sh = ap_kir_shared(k, "red", dt, bs);
	ap_kir_expr *tx = ap_kir_index_of(k, AP_KIR_THREAD_X);
	ap_kir_block *saved, *saved_r;
	ap_kir_var *o, *acc, *r;
	ap_kir_stmt *st;
	lidx ox, in;

	k->grid[0] = grid;
	k->block[0] = bs;
	o = loop_open(L, "o", ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_idx(k, M), grid, &saved);
	ox = shape_idx(&g->tensors[y]);
	ox.lin = ap_kir_ref(k, o);
	acc = ap_kir_var_new(k, dt, "acc");
	ap_kir_let(k, L->cur, acc, reduce_identity(L, node->op, dt));
	r = loop_open(L, "r", tx, ap_kir_idx(k, R), bs, &saved_r);
	in = reduce_in_idx(L, node, x, &ox, ap_kir_ref(k, r));
	ap_kir_assign(k, L->cur, acc, reduce_combine(L, node->op, ap_kir_ref(k, acc), val(L, x, &in)));
	scope_close(L, saved_r);
	ap_kir_store(k, L->cur, sh, tx, ap_kir_ref(k, acc));
	ap_kir_barrier(k, L->cur);
	for (unsigned s = bs / 2; s > 0; s /= 2) {
		ap_kir_block *sv;

		if_open(L, bin(L, AP_KIR_LT, tx, ap_kir_idx(k, s)), &sv, &st);
		{
			ap_kir_expr *mine = ap_kir_bind(k, L->cur, dt, "a", ap_kir_load(k, sh, tx));
			ap_kir_expr *other = ap_kir_bind(k, L->cur, dt, "b",
							 ap_kir_load(k, sh, ap_kir_addi(k, tx, s)));

			ap_kir_store(k, L->cur, sh, tx, reduce_combine(L, node->op, mine, other));
		}
		scope_close(L, sv);
		ap_kir_barrier(k, L->cur);
	}
	{
		ap_kir_block *sv;

		if_open(L, bin(L, AP_KIR_EQ, tx, ap_kir_idx(k, 0)), &sv, &st);
		ap_kir_store(k, L->cur, *arr_of(L, y), ap_kir_ref(k, o), ap_kir_load(k, sh, ap_kir_idx(k, 0)));
		scope_close(L, sv);
	}
	ap_kir_barrier(k, L->cur);   /* `red` is reused by the next element */
	scope_close(L, saved);
}

/* 32-bit index arithmetic (much cheaper on a GPU) when every tensor the
 * group touches has fewer than 2^30 elements: linear indices, coordinates
 * and a grid-stride step (< 2^26) then stay below 2^31. */
static ap_dtype index_type_for(const ap_graph *g, const ap_group *grp)
{
	const int64_t lim = (int64_t)1 << 30;

	for (int pass = 0; pass < 2; pass++) {
		int n = pass ? grp->n_views : grp->n_nodes;
		const int *list = pass ? grp->views : grp->nodes;

		for (int i = 0; i < n; i++) {
			const ap_node *node = &g->nodes[list[i]];

			for (int j = 0; j < node->n_inputs + node->n_outputs; j++) {
				int t = j < node->n_inputs ? node->inputs[j] : node->outputs[j - node->n_inputs];
				int64_t n = t >= 0 ? ap_tensor_numel(&g->tensors[t]) : 0;

				if (n < 0 || n >= lim)
					return AP_DT_I64;
			}
		}
	}
	return AP_DT_I32;
}

__ap_give ap_kir_kernel *ap_lower_group(__ap_keep const ap_partition *p, int gi,
					const char *name, const ap_lower_options *opt,
					ap_error *err)
{
	const ap_graph *g = p->g;
	const ap_group *grp = &p->groups[gi];
	lctx L;
	ap_kir_kernel *k;
	unsigned mt = opt && opt->max_block_threads ? opt->max_block_threads : 256;

	if (mt < 32)
		mt = 32;
	if (mt > 1024)
		mt = 1024;
	memset(&L, 0, sizeof(L));
	L.g = g;
	L.p = p;
	L.gi = gi;
	L.err = err;
	L.max_threads = mt;
	k = ap_kir_kernel_new(name);
	if (!k) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a group");
		return NULL;
	}
	L.k = k;
	L.cur = &k->body;
	k->index_type = index_type_for(g, grp);
	for (int i = 0; i < grp->n_outputs; i++) {
		int t = grp->outputs[i];
		char pname[32];

		snprintf(pname, sizeof(pname), "p%d", k->n_params);
		*arr_of(&L, t) = ap_kir_param(k, pname, g->tensors[t].dtype, true, t);
	}
	if (grp->kind == AP_GROUP_REDUCTION && grp->n_outputs == 1 &&
	    ap_op_category_of(g->nodes[grp->root].op) == AP_CAT_REDUCTION &&
	    grp->outputs[0] == g->nodes[grp->root].outputs[0] &&
	    reduced_count(g, &g->nodes[grp->root]) >= REDUCE_BLOCK_MIN)
		lower_reduce_block(&L, grp);
	else
		lower_pointwise(&L, grp);
	/* a header of comments: the fused ops and what each parameter holds.
	 * No graph names: the kernel is named after its content, so the same
	 * kernel in two graphs must print the same (ap_kernel_src lists the
	 * nodes and parameters by name). */
	{
		ap_kir_block hdr = {NULL, NULL};
		char ops[200] = "";
		size_t len = 0;

		for (int i = 0; i < grp->n_nodes && len + 40 < sizeof(ops); i++)
			len += (size_t)snprintf(ops + len, sizeof(ops) - len, " %s",
						ap_op_name(g->nodes[grp->nodes[i]].op));
		ap_kir_comment(k, &hdr, "%s group:%s", ap_group_kind_name(grp->kind), ops);
		for (int i = 0; i < k->n_arrays; i++) {
			const ap_kir_array *a = k->arrays[i];

			if (a->space == AP_KIR_GLOBAL)
				ap_kir_comment(k, &hdr, "%s: %s %s %s", a->name, a->written ? "writes" : "reads",
					       ap_dtype_name(a->type), shape_text(&g->tensors[a->tensor]).s);
		}
		if (hdr.first) {
			hdr.last->next = k->body.first;
			k->body.first = hdr.first;
			if (!k->body.last)
				k->body.last = hdr.last;
		}
	}
	free(L.memo);
	free(L.arrs);
	if (L.rc)
		return ap_kir_kernel_free(k);
	if (ap_kir_failed(k)) {
		ap_error_set(err, AP_ENOMEM, g->nodes[grp->root].name, NULL,
			     "out of memory lowering a group");
		return ap_kir_kernel_free(k);
	}
	return k;
}
