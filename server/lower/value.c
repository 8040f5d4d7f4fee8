/* value.c -- the value builder (see value.h): indices, the scoped memo,
 * leaves (constants and buffers), and the index maps of views, broadcasts
 * and data movement (transpose, slice, tile, split, concat, gather,
 * gather-elements, pad, trilu).
 * The element semantics live in scalar.c, loop-shaped ops in compute.c.
 */
#include "value.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct memo_ent {
	int tensor;
	ap_lidx ix;
	ap_kir_expr *val;
	int depth;
} memo_ent;

/* ---- context and errors --------------------------------------------------------- */

int ap_vctx_init(ap_vctx *v, const ap_mgraph *m, ap_kir_kernel *k, ap_error *err)
{
	const ap_graph *g = m->g;

	memset(v, 0, sizeof(*v));
	v->m = m;
	v->g = g;
	v->k = k;
	v->cur = &k->body;
	v->err = err;
	v->arr_of = calloc((size_t)g->n_tensors + 1, sizeof(*v->arr_of));
	if (!v->arr_of)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a micro-graph");
	for (int i = 0; i < g->n_outputs; i++) {
		int t = g->outputs[i];
		char name[32];

		snprintf(name, sizeof(name), "p%d", k->n_params);
		v->arr_of[t] = ap_kir_param(k, name, g->tensors[t].dtype, true, t);
	}
	return 0;
}

void ap_vctx_clear(ap_vctx *v)
{
	free(v->memo);
	free(v->arr_of);
	v->memo = NULL;
	v->arr_of = NULL;
}

ap_kir_expr *ap_v_fail(ap_vctx *v, int code, const ap_node *n, const char *fmt, ...)
{
	char buf[400];
	va_list ap;

	if (v->rc)
		return NULL;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	v->rc = code;
	ap_error_set(v->err, code, n ? n->name : NULL, NULL, "%s%s%s", n ? ap_op_name(n->op) : "",
		     n ? ": " : "", buf);
	return NULL;
}

/* ---- indices ------------------------------------------------------------------ */

ap_lidx ap_lidx_shape(const ap_tensor *t)
{
	ap_lidx r;

	memset(&r, 0, sizeof(r));
	r.rank = t->rank;
	for (int i = 0; i < t->rank; i++)
		r.dims[i] = t->dims[i];
	return r;
}

bool ap_lidx_same_dims(const ap_lidx *a, const ap_tensor *t)
{
	return ap_dims_equal(a->rank, a->dims, t->rank, t->dims);
}

int64_t ap_lidx_stride(const ap_lidx *ix, int d)
{
	int64_t s = 1;

	for (int i = d + 1; i < ix->rank; i++)
		s *= ix->dims[i];
	return s;
}

ap_kir_expr *ap_lidx_coord(ap_vctx *v, ap_lidx *ix, int d)
{
	ap_kir_kernel *k = v->k;
	ap_kir_expr *e;
	int64_t s;

	if (ix->dims[d] == 1)
		return ap_kir_idx(k, 0);
	if (ix->c[d])
		return ix->c[d];
	if (!ix->lin)
		return NULL;
	s = ap_lidx_stride(ix, d);
	e = ix->lin;
	if (s != 1)
		e = ap_kir_binary(k, AP_KIR_DIV, e, ap_kir_idx(k, s));
	if (d > 0)
		e = ap_kir_binary(k, AP_KIR_REM, e, ap_kir_idx(k, ix->dims[d]));
	ix->c[d] = e;
	return e;
}

ap_kir_expr *ap_lidx_linear(ap_vctx *v, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	ap_kir_expr *e;

	if (ix->lin)
		return ix->lin;
	e = ap_kir_idx(k, 0);
	for (int d = 0; d < ix->rank; d++) {
		if (ix->dims[d] == 1)
			continue;
		e = ap_kir_add(k, e, ap_kir_muli(k, ap_lidx_coord(v, ix, d), ap_lidx_stride(ix, d)));
	}
	ix->lin = e;
	return e;
}

ap_lidx ap_lidx_bcast(ap_vctx *v, ap_lidx *ix, int t)
{
	const ap_tensor *x = &v->g->tensors[t];
	ap_lidx r;

	if (ap_lidx_same_dims(ix, x))
		return *ix;
	r = ap_lidx_shape(x);
	for (int d = 0; d < x->rank; d++) {
		int od = d + ix->rank - x->rank;

		r.c[d] = (x->dims[d] == 1 || od < 0) ? ap_kir_idx(v->k, 0) : ap_lidx_coord(v, ix, od);
	}
	return r;
}

ap_lidx ap_lidx_relin(ap_vctx *v, ap_lidx *ix, int t)
{
	const ap_tensor *x = &v->g->tensors[t];
	ap_lidx r;

	if (ap_lidx_same_dims(ix, x))
		return *ix;
	r = ap_lidx_shape(x);
	r.lin = ap_lidx_linear(v, ix);
	return r;
}

bool ap_lidx_equal(const ap_lidx *a, const ap_lidx *b)
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

static ap_kir_expr *memo_find(ap_vctx *v, int t, const ap_lidx *ix)
{
	for (int i = v->n_memo - 1; i >= 0; i--)
		if (v->memo[i].tensor == t && ap_lidx_equal(&v->memo[i].ix, ix))
			return v->memo[i].val;
	return NULL;
}

void ap_v_remember(ap_vctx *v, int t, const ap_lidx *ix, ap_kir_expr *val)
{
	if (!val)
		return;
	if (v->n_memo == v->cap_memo) {
		int ncap = v->cap_memo ? 2 * v->cap_memo : 64;
		memo_ent *p = realloc(v->memo, (size_t)ncap * sizeof(*p));

		if (!p)
			return;   /* only a lost optimisation */
		v->memo = p;
		v->cap_memo = ncap;
	}
	v->memo[v->n_memo].tensor = t;
	v->memo[v->n_memo].ix = *ix;
	v->memo[v->n_memo].val = val;
	v->memo[v->n_memo].depth = v->depth;
	v->n_memo++;
}

ap_kir_var *ap_v_loop(ap_vctx *v, const char *prefix, ap_kir_expr *lo, ap_kir_expr *hi,
		      int64_t step, ap_kir_block **saved)
{
	ap_kir_var *var = ap_kir_var_new(v->k, v->k->index_type, prefix);
	ap_kir_stmt *s = ap_kir_for(v->k, v->cur, var, lo, hi, step);

	*saved = v->cur;
	v->cur = s ? &s->body : NULL;
	v->depth++;
	return var;
}

ap_kir_var *ap_v_loop_unrolled(ap_vctx *v, const char *prefix, int64_t n, ap_kir_block **saved)
{
	ap_kir_var *var = ap_v_loop(v, prefix, ap_kir_idx(v->k, 0), ap_kir_idx(v->k, n), 1, saved);

	if (*saved && (*saved)->last && (*saved)->last->kind == AP_KIR_S_FOR)
		(*saved)->last->unroll = -1;
	return var;
}

void ap_v_if(ap_vctx *v, ap_kir_expr *cond, ap_kir_block **saved, ap_kir_stmt **stmt)
{
	ap_kir_stmt *s = ap_kir_if(v->k, v->cur, cond);

	*saved = v->cur;
	if (stmt)
		*stmt = s;
	v->cur = s ? &s->body : NULL;
	v->depth++;
}

void ap_v_close(ap_vctx *v, ap_kir_block *saved)
{
	while (v->n_memo > 0 && v->memo[v->n_memo - 1].depth >= v->depth)
		v->n_memo--;
	v->depth--;
	v->cur = saved;
}

void ap_v_else(ap_vctx *v, ap_kir_stmt *stmt)
{
	while (v->n_memo > 0 && v->memo[v->n_memo - 1].depth >= v->depth)
		v->n_memo--;
	v->cur = stmt ? &stmt->orelse : NULL;
}

ap_kir_expr *ap_v_once(ap_vctx *v, ap_kir_expr *e)
{
	return e ? ap_kir_bind(v->k, v->cur, e->type, "s", e) : NULL;
}

/* ---- leaves: constants and buffers ----------------------------------------------- */

static ap_kir_expr *const_elem(ap_vctx *v, const ap_tensor *x, int64_t i)
{
	ap_kir_kernel *k = v->k;
	size_t es = ap_dtype_size(x->dtype);
	const unsigned char *src;

	if (!x->data || (uint64_t)(i + 1) * es > x->nbytes)
		return ap_v_fail(v, AP_EUNSUPPORTED, NULL, "constant %s is missing its data", x->name);
	src = (const unsigned char *)x->data + (size_t)i * es;
	switch (x->dtype) {
	case AP_DT_F32: { float f; memcpy(&f, src, 4); return ap_kir_float(k, AP_DT_F32, f); }
	case AP_DT_F64: { double d; memcpy(&d, src, 8); return ap_kir_float(k, AP_DT_F64, d); }
	case AP_DT_F16: case AP_DT_BF16: return ap_kir_float(k, x->dtype, ap_elem_get(src, x->dtype, 0));
	case AP_DT_I64: { int64_t q; memcpy(&q, src, 8); return ap_kir_int(k, AP_DT_I64, q); }
	case AP_DT_I32: { int32_t q; memcpy(&q, src, 4); return ap_kir_int(k, AP_DT_I32, q); }
	case AP_DT_I8: return ap_kir_int(k, AP_DT_I8, (int8_t)src[0]);
	case AP_DT_U8: return ap_kir_int(k, AP_DT_U8, src[0]);
	case AP_DT_BOOL: return ap_kir_int(k, AP_DT_BOOL, src[0] != 0);
	default: return ap_v_fail(v, AP_EUNSUPPORTED, NULL, "constant %s has dtype %s", x->name,
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

static ap_kir_expr *const_value(ap_vctx *v, int t, ap_lidx *ix)
{
	const ap_tensor *x = &v->g->tensors[t];
	int64_t n = ap_tensor_numel(x), i;
	ap_kir_expr *lin;

	if (n == 1 || const_uniform(x, n))
		return const_elem(v, x, 0);
	if (n <= 0)
		return ap_kir_const(v->k, x->dtype, 0);   /* never read */
	lin = ap_lidx_linear(v, ix);
	if (ap_kir_is_int(lin, &i) && i >= 0 && i < n)
		return const_elem(v, x, i);
	if (n > AP_CONST_BAKE_MAX)
		/* read from a buffer, as a weight: kernels of identical layers
		 * with different constants stay one kernel */
		return ap_kir_load(v->k, ap_v_buffer(v, t), lin);
	if (!v->arr_of[t]) {
		char name[32];

		if (!x->data || x->nbytes < (size_t)n * ap_dtype_size(x->dtype))
			return ap_v_fail(v, AP_EUNSUPPORTED, NULL, "constant %s is missing its data",
					 x->name);
		snprintf(name, sizeof(name), "c%d", v->n_consts++);
		v->arr_of[t] = ap_kir_const_array(v->k, name, x->dtype, n, x->data);
	}
	return ap_kir_load(v->k, v->arr_of[t], lin);
}

ap_kir_array *ap_v_buffer(ap_vctx *v, int t)
{
	if (!v->arr_of[t]) {
		char name[32];

		snprintf(name, sizeof(name), "p%d", v->k->n_params);
		v->arr_of[t] = ap_kir_param(v->k, name, v->g->tensors[t].dtype, false, t);
	}
	return v->arr_of[t];
}

/* ---- data movement ------------------------------------------------------------------ */

ap_kir_expr *ap_v_wrap_index(ap_vctx *v, ap_kir_expr *q, int64_t D)
{
	ap_kir_kernel *k = v->k;
	ap_kir_expr *x = ap_v_once(v, ap_kir_cast(k, AP_DT_I64, q));

	return ap_kir_select(k, ap_kir_binary(k, AP_KIR_LT, x, ap_kir_i64(k, 0)), ap_kir_addi(k, x, D), x);
}

/* Concat: one guarded assignment per input, `if (lo <= c < hi) x = in[...]`,
 * flat rather than nested so any number of inputs is fine. */
static ap_kir_expr *concat_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int64_t axis = ap_node_int(node, "axis", 0), off = 0;
	ap_dtype dt = v->g->tensors[t].dtype;
	ap_kir_var *x;
	ap_kir_expr *ca;
	int n_live = 0;

	if (axis < 0 || axis >= ix->rank)
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "axis %lld", (long long)axis);
	x = ap_kir_var_new(k, dt, "cat");
	ca = ap_lidx_coord(v, ix, (int)axis);
	for (int i = 0; i < node->n_inputs; i++)
		if (node->inputs[i] >= 0 && v->g->tensors[node->inputs[i]].dims[axis] > 0)
			n_live++;
	ap_kir_let(k, v->cur, x, ap_v_const(v, dt, 0));
	for (int i = 0; i < node->n_inputs && !v->rc; i++) {
		int in = node->inputs[i];
		int64_t len;
		ap_lidx r;

		if (in < 0)
			continue;
		len = v->g->tensors[in].dims[axis];
		if (len == 0)
			continue;
		r = *ix;
		r.lin = NULL;
		for (int d = 0; d < r.rank; d++)
			r.c[d] = ap_lidx_coord(v, ix, d);
		r.dims[axis] = len;
		r.c[axis] = ap_kir_addi(k, ca, -off);
		if (n_live > 1) {
			ap_kir_block *saved;

			ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND,
						 ap_kir_binary(k, AP_KIR_GE, ca, ap_kir_idx(k, off)),
						 ap_kir_binary(k, AP_KIR_LT, ca, ap_kir_idx(k, off + len))),
				&saved, NULL);
			ap_kir_assign(k, v->cur, x, ap_val(v, in, &r));
			ap_v_close(v, saved);
		} else {
			ap_kir_assign(k, v->cur, x, ap_val(v, in, &r));
		}
		off += len;
	}
	return ap_kir_ref(k, x);
}

static ap_kir_expr *gather_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	const ap_graph *g = v->g;
	int data = node->inputs[0], ind = node->inputs[1];
	const ap_tensor *dt = &g->tensors[data], *it = &g->tensors[ind];
	int64_t axis = ap_node_int(node, "axis", 0), D;
	int q = it->rank;
	ap_lidx ii = ap_lidx_shape(it), di = ap_lidx_shape(dt);
	ap_kir_expr *x;

	if (axis < 0 || axis >= dt->rank)
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "axis %lld", (long long)axis);
	if (it->dtype != AP_DT_I64 && it->dtype != AP_DT_I32)
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "indices dtype %s", ap_dtype_name(it->dtype));
	D = dt->dims[axis];
	for (int d = 0; d < q; d++)
		ii.c[d] = ap_lidx_coord(v, ix, (int)axis + d);
	/* in int64 until wrapped and clamped, then the index type */
	x = ap_v_once(v, ap_kir_cast(k, AP_DT_I64, ap_val(v, ind, &ii)));
	x = ap_kir_select(k, ap_kir_binary(k, AP_KIR_LT, x, ap_kir_i64(k, 0)), ap_kir_addi(k, x, D), x);
	x = ap_v_once(v, ap_kir_cast(k, k->index_type,
				     ap_kir_binary(k, AP_KIR_MIN,
						   ap_kir_binary(k, AP_KIR_MAX, x, ap_kir_i64(k, 0)),
						   ap_kir_i64(k, D > 0 ? D - 1 : 0))));
	for (int d = 0; d < dt->rank; d++) {
		if (d < axis)
			di.c[d] = ap_lidx_coord(v, ix, d);
		else if (d == axis)
			di.c[d] = x;
		else
			di.c[d] = ap_lidx_coord(v, ix, d + q - 1);
	}
	return ap_val(v, data, &di);
}

/* GatherElements: out[i...] = data[i... with i_axis = indices[i...]],
 * the index wrapped (negative counts from the end) and clamped as Gather's. */
static ap_kir_expr *gather_elements_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int data = node->inputs[0], ind = node->inputs[1];
	const ap_tensor *dt = &v->g->tensors[data];
	int64_t axis = ap_node_int(node, "axis", 0), D;
	ap_lidx di = ap_lidx_shape(dt), ii = *ix;
	ap_kir_expr *x;

	if (axis < 0 || axis >= dt->rank)
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "axis %lld", (long long)axis);
	D = dt->dims[axis];
	x = ap_v_wrap_index(v, ap_val(v, ind, &ii), D);
	x = ap_v_once(v, ap_kir_cast(k, k->index_type,
				     ap_kir_binary(k, AP_KIR_MIN,
						   ap_kir_binary(k, AP_KIR_MAX, x, ap_kir_i64(k, 0)),
						   ap_kir_i64(k, D > 0 ? D - 1 : 0))));
	for (int d = 0; d < dt->rank; d++)
		di.c[d] = d == axis ? x : ap_lidx_coord(v, ix, d);
	return ap_val(v, data, &di);
}

/* Trilu: keeps x where j - i >= k (upper) or j - i <= k (lower) over the
 * last two coordinates (i, j), else 0. */
static ap_kir_expr *trilu_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int r = ix->rank;
	int64_t kk = ap_node_int(node, "k", 0);
	bool upper = ap_node_int(node, "upper", 1) != 0;
	ap_kir_expr *diff, *keep;
	ap_lidx xi = *ix;

	if (r < 2)
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "rank %d", r);
	diff = ap_kir_binary(k, AP_KIR_SUB, ap_kir_cast(k, AP_DT_I64, ap_lidx_coord(v, ix, r - 1)),
			     ap_kir_cast(k, AP_DT_I64, ap_lidx_coord(v, ix, r - 2)));
	keep = ap_kir_binary(k, upper ? AP_KIR_GE : AP_KIR_LE, diff, ap_kir_i64(k, kk));
	return ap_kir_select(k, keep, ap_val(v, node->inputs[0], &xi),
			     ap_v_const(v, v->g->tensors[t].dtype, 0));
}

static ap_kir_expr *pad_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int x = node->inputs[0];
	const ap_tensor *xt = &v->g->tensors[x];
	const char *mode = ap_node_string(node, "mode", "constant");
	bool constant = strcmp(mode, "constant") == 0;
	int r = xt->rank;
	ap_lidx xi = ap_lidx_shape(xt);
	ap_kir_expr *cond = NULL;

	for (int d = 0; d < r; d++) {
		int64_t pb = ap_node_attr_at(node, "pads", d, 0), D = xt->dims[d];
		ap_kir_expr *j = ap_kir_addi(k, ap_lidx_coord(v, ix, d), -pb);

		if (constant) {
			int64_t O = ix->dims[d];
			ap_kir_expr *c = NULL;

			if (pb > 0)
				c = ap_kir_binary(k, AP_KIR_GE, j, ap_kir_idx(k, 0));
			if (O - pb > D) {
				ap_kir_expr *hi = ap_kir_binary(k, AP_KIR_LT, j, ap_kir_idx(k, D));

				c = c ? ap_kir_binary(k, AP_KIR_LAND, c, hi) : hi;
			}
			if (c)
				cond = cond ? ap_kir_binary(k, AP_KIR_LAND, cond, c) : c;
		} else if (strcmp(mode, "reflect") == 0) {
			if (D == 1) {
				j = ap_kir_idx(k, 0);
			} else {
				/* reflect about the edges, repeatedly: period 2(D-1) */
				int64_t per = 2 * (D - 1);
				ap_kir_expr *m = ap_kir_binary(k, AP_KIR_REM, j, ap_kir_idx(k, per));

				m = ap_v_once(v, ap_kir_select(k, ap_kir_binary(k, AP_KIR_LT, m, ap_kir_idx(k, 0)),
							       ap_kir_addi(k, m, per), m));
				j = ap_kir_select(k, ap_kir_binary(k, AP_KIR_GE, m, ap_kir_idx(k, D)),
						  ap_kir_add(k, ap_kir_idx(k, per), ap_kir_unary(k, AP_KIR_NEG, m)),
						  m);
			}
		} else if (strcmp(mode, "edge") == 0) {
			j = ap_kir_binary(k, AP_KIR_MIN, ap_kir_binary(k, AP_KIR_MAX, j, ap_kir_idx(k, 0)),
					  ap_kir_idx(k, D > 0 ? D - 1 : 0));
		} else {
			return ap_v_fail(v, AP_EUNSUPPORTED, node, "mode %s", mode);
		}
		xi.c[d] = ap_v_once(v, j);
	}
	if (constant && cond) {
		ap_dtype dt = v->g->tensors[t].dtype;
		ap_kir_var *p = ap_kir_var_new(k, dt, "pad");
		ap_kir_block *saved;

		ap_kir_let(k, v->cur, p, ap_v_const(v, dt, ap_node_float(node, "value", 0)));
		ap_v_if(v, cond, &saved, NULL);
		ap_kir_assign(k, v->cur, p, ap_val(v, x, &xi));
		ap_v_close(v, saved);
		return ap_kir_ref(k, p);
	}
	if (ap_tensor_numel(xt) == 0)
		return ap_v_const(v, v->g->tensors[t].dtype, ap_node_float(node, "value", 0));
	return ap_val(v, x, &xi);
}

/* ---- dispatch ------------------------------------------------------------------------- */

/* A broadcast op's value at ix: Expand reads its input at the broadcast
 * index; Where selects between its second and third inputs by the first;
 * any other is a binary op of its two inputs (ap_v_binary), each read at
 * its broadcast index. */
static ap_kir_expr *broadcast_value(ap_vctx *v, const ap_node *node, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;

	if (node->op == AP_OP_EXPAND) {
		ap_lidx r = ap_lidx_bcast(v, ix, node->inputs[0]);

		return ap_val(v, node->inputs[0], &r);
	}
	if (node->op == AP_OP_WHERE) {
		ap_lidx rc = ap_lidx_bcast(v, ix, node->inputs[0]);
		ap_lidx ra = ap_lidx_bcast(v, ix, node->inputs[1]);
		ap_lidx rb = ap_lidx_bcast(v, ix, node->inputs[2]);
		ap_kir_expr *c = ap_val(v, node->inputs[0], &rc);
		ap_kir_expr *a = ap_val(v, node->inputs[1], &ra);
		ap_kir_expr *b = ap_val(v, node->inputs[2], &rb);

		return ap_kir_select(k, ap_kir_cast(k, AP_DT_BOOL, c), a, b);
	} else {
		ap_lidx ra = ap_lidx_bcast(v, ix, node->inputs[0]);
		ap_lidx rb = ap_lidx_bcast(v, ix, node->inputs[1]);
		ap_kir_expr *a = ap_val(v, node->inputs[0], &ra);
		ap_kir_expr *b = ap_val(v, node->inputs[1], &rb);

		return ap_v_binary(v, node, a, b);
	}
}

/* Transpose: output coordinate d is the input's coordinate perm[d]
 * (reversed axes by default).  Fails the context on a bad perm. */
static ap_kir_expr *transpose_value(ap_vctx *v, const ap_node *node, ap_lidx *ix)
{
	int x = node->inputs[0];
	ap_lidx r = ap_lidx_shape(&v->g->tensors[x]);

	for (int d = 0; d < ix->rank; d++) {
		int64_t pd = ap_node_attr_at(node, "perm", d, ix->rank - 1 - d);

		if (pd < 0 || pd >= r.rank)
			return ap_v_fail(v, AP_EUNSUPPORTED, node, "bad perm");
		r.c[pd] = ap_lidx_coord(v, ix, d);
	}
	return ap_val(v, x, &r);
}

/* Slice (starts and steps one per dim, as the importer writes them):
 * input coordinate starts[d] + steps[d] * the output's. */
static ap_kir_expr *slice_value(ap_vctx *v, const ap_node *node, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int x = node->inputs[0];
	ap_lidx r = ap_lidx_shape(&v->g->tensors[x]);

	for (int d = 0; d < r.rank; d++)
		r.c[d] = ap_kir_addi(k, ap_kir_muli(k, ap_lidx_coord(v, ix, d),
						    ap_node_attr_at(node, "steps", d, 1)),
				     ap_node_attr_at(node, "starts", d, 0));
	return ap_val(v, x, &r);
}

/* Tile: input coordinate the output's modulo the input's dim (where the
 * dim is repeated). */
static ap_kir_expr *tile_value(ap_vctx *v, const ap_node *node, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int x = node->inputs[0];
	ap_lidx r = ap_lidx_shape(&v->g->tensors[x]);

	for (int d = 0; d < r.rank; d++) {
		ap_kir_expr *c = ap_lidx_coord(v, ix, d);

		r.c[d] = r.dims[d] == ix->dims[d] ? c
						  : ap_kir_binary(k, AP_KIR_REM, c, ap_kir_idx(k, r.dims[d]));
	}
	return ap_val(v, x, &r);
}

/* Split, output t: along `axis`, the input coordinate is the output's
 * plus the sizes of the outputs before t. */
static ap_kir_expr *split_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	const ap_graph *g = v->g;
	int x = node->inputs[0];
	int64_t axis = ap_node_int(node, "axis", 0), off = 0;
	ap_lidx r = ap_lidx_shape(&g->tensors[x]);

	for (int o = 0; o < node->n_outputs && node->outputs[o] != t; o++)
		if (node->outputs[o] >= 0)
			off += g->tensors[node->outputs[o]].dims[axis];
	for (int d = 0; d < r.rank; d++)
		r.c[d] = d == axis ? ap_kir_addi(v->k, ap_lidx_coord(v, ix, d), off)
				   : ap_lidx_coord(v, ix, d);
	return ap_val(v, x, &r);
}

/* The value of tensor t, made by node n of the micro-graph, at ix:
 * elementwise and broadcast ops per element, reductions and the other
 * loop ops through ap_v_loop_op (compute.c), movement ops as their
 * input at the mapped index.  NULL (the context failed) for an op with
 * no lowering. */
static ap_kir_expr *op_value(ap_vctx *v, int n, int t, ap_lidx *ix)
{
	const ap_graph *g = v->g;
	const ap_node *node = &g->nodes[n];
	ap_dtype out = g->tensors[t].dtype;

	switch (ap_op_category_of(node->op)) {
	case AP_CAT_ELEMWISE: {
		ap_lidx r = *ix;

		return ap_v_unary(v, node, ap_val(v, node->inputs[0], &r), out);
	}
	case AP_CAT_BROADCAST:
		return broadcast_value(v, node, ix);
	case AP_CAT_REDUCTION:
		return ap_v_loop_op(v, node, t, ix);
	default:
		break;
	}
	switch (node->op) {
	case AP_OP_MATMUL:
	case AP_OP_CONV:
	case AP_OP_CONV_TRANSPOSE:
	case AP_OP_MAX_POOL:
	case AP_OP_AVERAGE_POOL:
	case AP_OP_LRN:
	case AP_OP_SCATTER_ELEMENTS:
	case AP_OP_SCATTER_ND:
	case AP_OP_CUM_SUM:
	case AP_OP_ARG_MAX:
	case AP_OP_ARG_MIN:
		return ap_v_loop_op(v, node, t, ix);
	case AP_OP_GATHER_ELEMENTS:
		return gather_elements_value(v, node, t, ix);
	case AP_OP_TRILU:
		return trilu_value(v, node, t, ix);
	case AP_OP_TRANSPOSE:
		return transpose_value(v, node, ix);
	case AP_OP_SLICE:
		return slice_value(v, node, ix);
	case AP_OP_TILE:
		return tile_value(v, node, ix);
	case AP_OP_SPLIT:
		return split_value(v, node, t, ix);
	case AP_OP_CONCAT:
		return concat_value(v, node, t, ix);
	case AP_OP_GATHER:
		return gather_value(v, node, t, ix);
	case AP_OP_PAD:
		return pad_value(v, node, t, ix);
	case AP_OP_RESHAPE: {
		ap_lidx r = ap_lidx_relin(v, ix, node->inputs[0]);

		return ap_val(v, node->inputs[0], &r);
	}
	default:
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "no lowering for this op");
	}
}

ap_kir_expr *ap_val(ap_vctx *v, int t, ap_lidx *ix)
{
	const ap_graph *g = v->g;
	const ap_tensor *x;
	ap_kir_expr *r;
	int p;

	if (v->rc || t < 0)
		return NULL;
	r = memo_find(v, t, ix);
	if (r)
		return r;
	x = &g->tensors[t];
	p = x->producer;
	r = v->leaf ? v->leaf(v, t, ix, v->leaf_user) : NULL;
	if (v->rc)
		return NULL;
	if (r) {
		/* held by the emitter */
	} else if (x->kind == AP_TENSOR_CONST) {
		r = const_value(v, t, ix);
	} else if (p >= 0 && ap_op_is_view(g->nodes[p].op)) {
		int in = g->nodes[p].inputs[0];
		ap_lidx rl = ap_lidx_relin(v, ix, in);

		r = ap_val(v, in, &rl);
	} else if (p >= 0) {
		r = op_value(v, p, t, ix);
	} else {
		r = ap_kir_load(v->k, ap_v_buffer(v, t), ap_lidx_linear(v, ix));
	}
	r = ap_kir_bind(v->k, v->cur, x->dtype, "v", ap_kir_cast(v->k, x->dtype, r));
	ap_v_remember(v, t, ix, r);
	return r;
}

/* t is read at another index than the current one: so is everything it
 * is computed from. */
static void mark_other(const ap_graph *g, int t, unsigned char *cur, bool rows)
{
	int p;

	if (t < 0 || cur[t] == 2)
		return;
	cur[t] = 2;
	p = g->tensors[t].producer;
	if (p < 0 || (rows && ap_op_category_of(g->nodes[p].op) == AP_CAT_REDUCTION))
		return;
	for (int i = 0; i < g->nodes[p].n_inputs; i++)
		mark_other(g, g->nodes[p].inputs[i], cur, rows);
}

void ap_v_mark_current(const ap_graph *g, int t, bool rows, unsigned char *cur,
		       unsigned char *seen)
{
	int p;

	if (t < 0)
		return;
	if (!cur[t])
		cur[t] = 1;
	if (seen[t])
		return;
	seen[t] = 1;
	p = g->tensors[t].producer;
	if (p < 0)
		return;
	{
		const ap_node *n = &g->nodes[p];
		ap_op_category cat = ap_op_category_of(n->op);

		for (int i = 0; i < n->n_inputs; i++) {
			int x = n->inputs[i];

			if (x < 0)
				continue;
			if (cat == AP_CAT_REDUCTION) {
				/* reduced: read at every column (with `rows`, the
				 * caller marks the reduction's own pass) */
				if (!rows)
					mark_other(g, x, cur, rows);
				continue;
			}
			if (ap_op_is_view(n->op) || cat == AP_CAT_ELEMWISE ||
			    (cat == AP_CAT_BROADCAST &&
			     ap_dims_equal(g->tensors[x].rank, g->tensors[x].dims, g->tensors[t].rank,
					   g->tensors[t].dims))) {
				ap_v_mark_current(g, x, rows, cur, seen);
			} else {
				mark_other(g, x, cur, rows);
			}
		}
	}
}

ap_dtype ap_index_type_for(const ap_graph *g)
{
	const int64_t lim = (int64_t)1 << 30;

	for (int t = 0; t < g->n_tensors; t++) {
		int64_t n = ap_tensor_numel(&g->tensors[t]);

		if (n < 0 || n >= lim)
			return AP_DT_I64;
	}
	return AP_DT_I32;
}
