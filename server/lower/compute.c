/* compute.c -- the loop-shaped ops of the value builder (see value.h):
 * reductions computed serially by one thread, MatMul (batched, with
 * broadcast batch dims and vector operands), Conv and ConvTranspose
 * (groups, strides, dilations, pads), MaxPool / AveragePool (pads,
 * count_include_pad, dilations), LRN, CumSum, ArgMax / ArgMin and the
 * scatters, each as the loop nest that computes one output element from
 * the values of its inputs (ONNX operator specifications).  Emitters that
 * tile these ops replace them; this is the form every emitter can fall
 * back on.
 *
 * The scatters are computed by pulling, not pushing: each output element
 * starts from data and visits every update that could address it, in
 * order (ScatterElements: those along the axis at its other coordinates;
 * ScatterND: all index tuples), so no two threads write one element and
 * duplicates combine in index order (reduction "none": the last wins).
 * The cost is the number of candidate updates per element.  An index out
 * of range addresses nothing (CONST indices are refused by validation).
 */
#include "value.h"

#include <string.h>

/* ---- reductions (serial) ---------------------------------------------------------------- */

/* Index into the reduction input x for output element `out` and reduced
 * element `r` (linear over the reduced axes). */
ap_lidx ap_reduce_in_idx(ap_vctx *v, const ap_node *node, int x, ap_lidx *out, ap_kir_expr *r)
{
	const ap_tensor *xt = &v->g->tensors[x];
	const ap_attr *ax = ap_node_attr(node, "axes");
	bool keep = ap_node_int(node, "keepdims", 1) != 0;
	bool red[AP_MAX_RANK] = {false};
	ap_lidx in = ap_lidx_shape(xt);
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
			e = ap_kir_binary(v->k, AP_KIR_DIV, e, ap_kir_idx(v->k, rstride));
		e = ap_kir_binary(v->k, AP_KIR_REM, e, ap_kir_idx(v->k, xt->dims[d]));
		in.c[d] = xt->dims[d] == 1 ? ap_kir_idx(v->k, 0) : e;
		rstride *= xt->dims[d];
	}
	for (int d = 0; d < xt->rank; d++) {
		if (red[d]) {
			if (keep)
				od++;
			continue;
		}
		in.c[d] = ap_lidx_coord(v, out, od++);
	}
	return in;
}

int64_t ap_reduced_count(const ap_graph *g, const ap_node *node)
{
	const ap_tensor *xt = &g->tensors[node->inputs[0]];
	const ap_attr *ax = ap_node_attr(node, "axes");
	int64_t n = 1;

	for (int i = 0; ax && i < ax->n_ints; i++)
		if (ax->ints[i] >= 0 && ax->ints[i] < xt->rank)
			n *= xt->dims[ax->ints[i]];
	return n;
}

static ap_kir_expr *reduce_serial(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	ap_dtype dt = v->g->tensors[t].dtype, at = ap_acc_type(dt);
	int x = node->inputs[0];
	int64_t R = ap_reduced_count(v->g, node);
	ap_kir_var *acc = ap_kir_var_new(k, at, "acc"), *r;
	ap_kir_block *saved;
	ap_lidx in;

	ap_kir_let(k, v->cur, acc, ap_v_reduce_identity(v, node->op, at));
	r = ap_v_loop(v, "r", ap_kir_idx(k, 0), ap_kir_idx(k, R), 1, &saved);
	in = ap_reduce_in_idx(v, node, x, ix, ap_kir_ref(k, r));
	ap_kir_assign(k, v->cur, acc, ap_v_reduce_combine(v, node->op, ap_kir_ref(k, acc),
							  ap_kir_cast(k, at, ap_val(v, x, &in))));
	ap_v_close(v, saved);
	return ap_kir_cast(k, dt, ap_kir_ref(k, acc));
}

/* ---- matmul, convolution, pooling ------------------------------------------------------- */

static ap_kir_expr *matmul_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	const ap_graph *g = v->g;
	int a = node->inputs[0], b = node->inputs[1];
	const ap_tensor *at = &g->tensors[a], *bt = &g->tensors[b];
	ap_dtype dt = g->tensors[t].dtype, acct = ap_acc_type(dt);
	int ra = at->rank, rb = bt->rank, ro = ix->rank;
	bool a1 = ra == 1, b1 = rb == 1;
	int nb = ro - (a1 ? 0 : 1) - (b1 ? 0 : 1);
	int64_t K = at->dims[ra - 1];
	ap_kir_expr *i = NULL, *j = NULL;
	ap_kir_var *acc = ap_kir_var_new(k, acct, "acc"), *kv;
	ap_kir_block *saved;
	ap_lidx ai = ap_lidx_shape(at), bi = ap_lidx_shape(bt);

	if (!b1)
		j = ap_lidx_coord(v, ix, ro - 1);
	if (!a1)
		i = ap_lidx_coord(v, ix, ro - 1 - (b1 ? 0 : 1));
	/* batch coordinates, right-aligned, size-1 dims read at 0 */
	for (int d = 0; d < ra - 2; d++) {
		int od = d + nb - (ra - 2);

		ai.c[d] = (at->dims[d] == 1 || od < 0) ? ap_kir_idx(k, 0) : ap_lidx_coord(v, ix, od);
	}
	for (int d = 0; d < rb - 2; d++) {
		int od = d + nb - (rb - 2);

		bi.c[d] = (bt->dims[d] == 1 || od < 0) ? ap_kir_idx(k, 0) : ap_lidx_coord(v, ix, od);
	}
	ap_kir_let(k, v->cur, acc, ap_v_const(v, acct, 0));
	kv = ap_v_loop(v, "k", ap_kir_idx(k, 0), ap_kir_idx(k, K), 1, &saved);
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
	ap_kir_assign(k, v->cur, acc,
		      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc),
			  ap_kir_binary(k, AP_KIR_MUL, ap_kir_cast(k, acct, ap_val(v, a, &ai)),
					ap_kir_cast(k, acct, ap_val(v, b, &bi)))));
	ap_v_close(v, saved);
	return ap_kir_cast(k, dt, ap_kir_ref(k, acc));
}

/* Conv: out[n, m, o...] = B[m] + sum_{c, k...} X[n, g*Cg + c, o*s - pb + k*d] * W[m, c, k...]
 * ConvTranspose: out[n, m, o...] = B[m] + sum_{c, k...} X[n, ci, (o + pb - k*d) / s]
 *   * W[ci, m % Mg, k...] over ci = g*Cg + c where o + pb - k*d is a multiple of s. */
static ap_kir_expr *conv_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	const ap_graph *g = v->g;
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
	ap_lidx xi = ap_lidx_shape(xt), wi = ap_lidx_shape(wt), bi;
	ap_kir_block *saved;

	if (group < 1 || C_ % group || M % group || ns < 1)
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "bad group %lld for %lld -> %lld channels",
				   (long long)group, (long long)C_, (long long)M);
	Cg = C_ / group;
	Mg = M / group;
	n_ = ap_lidx_coord(v, ix, 0);
	m = ap_lidx_coord(v, ix, 1);
	gi = ap_v_once(v, ap_kir_binary(k, AP_KIR_DIV, m, ap_kir_idx(k, Mg)));
	mm = tr ? ap_v_once(v, ap_kir_binary(k, AP_KIR_REM, m, ap_kir_idx(k, Mg))) : NULL;
	acc = ap_kir_var_new(k, ap_acc_type(dt), "acc");
	if (bias >= 0) {
		bi = ap_lidx_shape(&g->tensors[bias]);
		bi.c[0] = m;
		ap_kir_let(k, v->cur, acc, ap_kir_cast(k, ap_acc_type(dt), ap_val(v, bias, &bi)));
	} else {
		ap_kir_let(k, v->cur, acc, ap_v_const(v, ap_acc_type(dt), 0));
	}
	cv = ap_v_loop(v, "c", ap_kir_idx(k, 0), ap_kir_idx(k, Cg), 1, &saved);
	saves[ns_saves++] = saved;
	ci = ap_v_once(v, ap_kir_add(k, ap_kir_muli(k, gi, Cg), ap_kir_ref(k, cv)));
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
		int64_t s = ap_node_attr_at(node, "strides", d, 1), dil = ap_node_attr_at(node, "dilations", d, 1);
		int64_t pb = ap_node_attr_at(node, "pads", d, 0);
		int64_t K = wt->dims[2 + d], D = xt->dims[2 + d], O = yt->dims[2 + d];
		ap_kir_var *kv = ap_v_loop(v, "k", ap_kir_idx(k, 0), ap_kir_idx(k, K), 1, &saved);
		ap_kir_expr *o = ap_lidx_coord(v, ix, 2 + d), *pos, *cond;

		saves[ns_saves++] = saved;
		wi.c[2 + d] = ap_kir_ref(k, kv);
		if (!tr) {
			pos = ap_v_once(v, ap_kir_add(k, ap_kir_addi(k, ap_kir_muli(k, o, s), -pb),
						 ap_kir_muli(k, ap_kir_ref(k, kv), dil)));
			xi.c[2 + d] = pos;
			if (pb == 0 && (O - 1) * s + (K - 1) * dil < D)
				continue;   /* always in range */
			cond = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_GE, pos, ap_kir_idx(k, 0)),
				   ap_kir_binary(k, AP_KIR_LT, pos, ap_kir_idx(k, D)));
		} else {
			pos = ap_v_once(v, ap_kir_add(k, ap_kir_addi(k, o, pb),
						 ap_kir_muli(k, ap_kir_ref(k, kv), -dil)));
			xi.c[2 + d] = s == 1 ? pos : ap_kir_binary(k, AP_KIR_DIV, pos, ap_kir_idx(k, s));
			cond = ap_kir_binary(k, AP_KIR_GE, pos, ap_kir_idx(k, 0));
			if (s != 1)
				cond = ap_kir_binary(k, AP_KIR_LAND, cond,
					   ap_kir_binary(k, AP_KIR_EQ, ap_kir_binary(k, AP_KIR_REM, pos, ap_kir_idx(k, s)),
					       ap_kir_idx(k, 0)));
			cond = ap_kir_binary(k, AP_KIR_LAND, cond,
				   ap_kir_binary(k, AP_KIR_LT, pos, ap_kir_idx(k, D * s)));
		}
		ap_v_if(v, cond, &saved, NULL);
		saves[ns_saves++] = saved;
	}
	ap_kir_assign(k, v->cur, acc,
		      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc),
			  ap_kir_binary(k, AP_KIR_MUL, ap_kir_cast(k, acc->type, ap_val(v, x, &xi)),
					ap_kir_cast(k, acc->type, ap_val(v, w, &wi)))));
	while (ns_saves > 0)
		ap_v_close(v, saves[--ns_saves]);
	return ap_kir_cast(k, dt, ap_kir_ref(k, acc));
}

/* MaxPool / AveragePool over the window o*s - pb + k*d, k < kernel_shape. */
static ap_kir_expr *pool_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	const ap_graph *g = v->g;
	bool avg = node->op == AP_OP_AVERAGE_POOL;
	bool incl = ap_node_int(node, "count_include_pad", 0) != 0;
	int x = node->inputs[0];
	const ap_tensor *xt = &g->tensors[x];
	ap_dtype dt = g->tensors[t].dtype;
	int ns = xt->rank - 2;
	ap_kir_var *acc = ap_kir_var_new(k, avg ? ap_acc_type(dt) : dt, "acc"), *cnt = NULL;
	ap_kir_block *saves[AP_MAX_RANK + 2];
	int n_saves = 0;
	ap_kir_expr *valid = NULL, *inpad = NULL;
	ap_lidx xi = ap_lidx_shape(xt);
	ap_kir_block *saved;

	if (ns < 1)
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "input rank %d", xt->rank);
	if (avg && !ap_dtype_is_float(dt))
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "dtype %s", ap_dtype_name(dt));
	ap_kir_let(k, v->cur, acc, avg ? ap_v_const(v, acc->type, 0) : ap_v_const(v, dt, ap_dtype_lowest(dt)));
	if (avg) {
		cnt = ap_kir_var_new(k, AP_DT_I64, "cnt");
		ap_kir_let(k, v->cur, cnt, ap_kir_i64(k, 0));
	}
	xi.c[0] = ap_lidx_coord(v, ix, 0);
	xi.c[1] = ap_lidx_coord(v, ix, 1);
	for (int d = 0; d < ns; d++) {
		int64_t K = ap_node_attr_at(node, "kernel_shape", d, 1);
		int64_t s = ap_node_attr_at(node, "strides", d, 1), dil = ap_node_attr_at(node, "dilations", d, 1);
		int64_t pb = ap_node_attr_at(node, "pads", d, 0), pe = ap_node_attr_at(node, "pads", ns + d, 0);
		int64_t D = xt->dims[2 + d];
		ap_kir_var *kv = ap_v_loop(v, "k", ap_kir_idx(k, 0), ap_kir_idx(k, K), 1, &saved);
		ap_kir_expr *pos;

		saves[n_saves++] = saved;
		pos = ap_v_once(v, ap_kir_add(k, ap_kir_addi(k, ap_kir_muli(k, ap_lidx_coord(v, ix, 2 + d), s), -pb),
					 ap_kir_muli(k, ap_kir_ref(k, kv), dil)));
		xi.c[2 + d] = pos;
		ap_kir_expr *in = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_GE, pos, ap_kir_idx(k, 0)),
					       ap_kir_binary(k, AP_KIR_LT, pos, ap_kir_idx(k, D)));
		ap_kir_expr *p = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_GE, pos, ap_kir_idx(k, -pb)),
				     ap_kir_binary(k, AP_KIR_LT, pos, ap_kir_idx(k, D + pe)));

		valid = valid ? ap_kir_binary(k, AP_KIR_LAND, valid, in) : in;
		inpad = inpad ? ap_kir_binary(k, AP_KIR_LAND, inpad, p) : p;
	}
	if (avg) {
		ap_kir_expr *counted = ap_v_once(v, incl ? inpad : valid);

		ap_kir_assign(k, v->cur, cnt,
			      ap_kir_add(k, ap_kir_ref(k, cnt), ap_kir_cast(k, AP_DT_I64, counted)));
	}
	ap_v_if(v, valid, &saved, NULL);
	saves[n_saves++] = saved;
	{
		ap_kir_expr *xv = ap_val(v, x, &xi);

		ap_kir_assign(k, v->cur, acc,
			      avg ? ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc), ap_kir_cast(k, acc->type, xv))
				  : ap_v_max(v, xv, ap_kir_ref(k, acc)));
	}
	while (n_saves > 0)
		ap_v_close(v, saves[--n_saves]);
	if (avg)
		return ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, acc), ap_kir_cast(k, dt, ap_kir_ref(k, cnt)));
	return ap_kir_ref(k, acc);
}

/* LRN: x / (bias + alpha/size * sum of x^2 over the channel window)^beta. */
static ap_kir_expr *lrn_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int x = node->inputs[0];
	const ap_tensor *xt = &v->g->tensors[x];
	ap_dtype dt = xt->dtype;
	double alpha = ap_node_float(node, "alpha", 1e-4), beta = ap_node_float(node, "beta", 0.75);
	double bias = ap_node_float(node, "bias", 1.0);
	int64_t size = ap_node_int(node, "size", 1);
	int64_t before = (size - 1) / 2, after = size - 1 - before;
	ap_kir_expr *c, *lo, *hi, *xv;
	ap_dtype at = ap_acc_type(dt);
	ap_kir_var *acc = ap_kir_var_new(k, at, "acc"), *j;
	ap_kir_block *saved;
	ap_lidx xi;

	if (xt->rank < 2 || !ap_dtype_is_float(dt) || size < 1)
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "input rank %d, dtype %s, size %lld", xt->rank,
				   ap_dtype_name(dt), (long long)size);
	c = ap_lidx_coord(v, ix, 1);
	lo = ap_kir_binary(k, AP_KIR_MAX, ap_kir_addi(k, c, -before), ap_kir_idx(k, 0));
	hi = ap_kir_binary(k, AP_KIR_MIN, ap_kir_addi(k, c, after + 1), ap_kir_idx(k, xt->dims[1]));
	xv = ap_val(v, x, ix);
	ap_kir_let(k, v->cur, acc, ap_v_const(v, at, 0));
	j = ap_v_loop(v, "j", lo, hi, 1, &saved);
	xi = *ix;
	xi.lin = NULL;
	for (int d = 0; d < xi.rank; d++)
		xi.c[d] = d == 1 ? ap_kir_ref(k, j) : ap_lidx_coord(v, ix, d);
	{
		ap_kir_expr *e = ap_kir_cast(k, at, ap_val(v, x, &xi));

		ap_kir_assign(k, v->cur, acc, ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc),
							    ap_kir_binary(k, AP_KIR_MUL, e, e)));
	}
	ap_v_close(v, saved);
	return ap_kir_cast(k, dt, ap_kir_binary(k, AP_KIR_DIV, ap_kir_cast(k, at, xv),
		   ap_kir_call(k, AP_KIR_POW,
			       ap_kir_binary(k, AP_KIR_ADD, ap_v_const(v, at, bias),
				   ap_kir_binary(k, AP_KIR_MUL, ap_v_const(v, at, alpha / (double)size), ap_kir_ref(k, acc))),
			       ap_v_const(v, at, beta))));
}


/* ---- scans, arg-reductions, scatters ---------------------------------------------------- */

/* CumSum: sum of x along the axis up to (reverse: from) the element,
 * itself included unless exclusive. */
static ap_kir_expr *cumsum_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int x = node->inputs[0];
	int64_t axis = ap_node_int(node, "axis", 0), L = ix->dims[axis];
	bool excl = ap_node_int(node, "exclusive", 0) != 0, rev = ap_node_int(node, "reverse", 0) != 0;
	ap_dtype dt = v->g->tensors[t].dtype;
	ap_kir_expr *c = ap_lidx_coord(v, ix, (int)axis), *lo, *hi;
	ap_kir_var *acc = ap_kir_var_new(k, dt, "acc"), *j;
	ap_kir_block *saved;
	ap_lidx xi = *ix;

	if (rev) {
		lo = excl ? ap_kir_addi(k, c, 1) : c;
		hi = ap_kir_idx(k, L);
	} else {
		lo = ap_kir_idx(k, 0);
		hi = excl ? c : ap_kir_addi(k, c, 1);
	}
	ap_kir_let(k, v->cur, acc, ap_v_const(v, dt, 0));
	j = ap_v_loop(v, "j", lo, hi, 1, &saved);
	xi.lin = NULL;
	for (int d = 0; d < xi.rank; d++)
		xi.c[d] = d == axis ? ap_kir_ref(k, j) : ap_lidx_coord(v, ix, d);
	ap_kir_assign(k, v->cur, acc, ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc), ap_val(v, x, &xi)));
	ap_v_close(v, saved);
	return ap_kir_ref(k, acc);
}

/* ArgMax / ArgMin: the first (select_last_index: the last) position of the
 * largest / smallest value along the axis, as int64. */
static ap_kir_expr *argext_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int x = node->inputs[0];
	const ap_tensor *xt = &v->g->tensors[x];
	int64_t axis = ap_node_int(node, "axis", 0), L = xt->dims[axis];
	bool keep = ap_node_int(node, "keepdims", 1) != 0;
	bool last = ap_node_int(node, "select_last_index", 0) != 0;
	ap_kir_binop cmp = node->op == AP_OP_ARG_MAX ? (last ? AP_KIR_GE : AP_KIR_GT)
						     : (last ? AP_KIR_LE : AP_KIR_LT);
	ap_kir_var *best = ap_kir_var_new(k, xt->dtype, "best"), *arg = ap_kir_var_new(k, AP_DT_I64, "arg");
	ap_kir_var *j;
	ap_kir_block *saved, *saved_if;
	ap_lidx xi = ap_lidx_shape(xt);
	ap_kir_expr *xv;

	for (int d = 0, od = 0; d < xt->rank; d++) {
		if (d == axis) {
			xi.c[d] = ap_kir_idx(k, 0);
			if (keep)
				od++;
			continue;
		}
		xi.c[d] = ap_lidx_coord(v, ix, od++);
	}
	ap_kir_let(k, v->cur, best, ap_val(v, x, &xi));
	ap_kir_let(k, v->cur, arg, ap_kir_i64(k, 0));
	j = ap_v_loop(v, "j", ap_kir_idx(k, 1), ap_kir_idx(k, L), 1, &saved);
	xi.c[axis] = ap_kir_ref(k, j);
	xi.lin = NULL;   /* ap_val derived it for element 0 */
	xv = ap_val(v, x, &xi);
	ap_v_if(v, ap_kir_binary(k, cmp, xv, ap_kir_ref(k, best)), &saved_if, NULL);
	ap_kir_assign(k, v->cur, best, xv);
	ap_kir_assign(k, v->cur, arg, ap_kir_cast(k, AP_DT_I64, ap_kir_ref(k, j)));
	ap_v_close(v, saved_if);
	ap_v_close(v, saved);
	return ap_kir_ref(k, arg);
}

/* acc combined with an update by the scatter's reduction. */
static ap_kir_expr *scatter_combine(ap_vctx *v, const char *red, ap_kir_expr *acc, ap_kir_expr *u)
{
	if (!strcmp(red, "add"))
		return ap_kir_binary(v->k, AP_KIR_ADD, acc, u);
	if (!strcmp(red, "mul"))
		return ap_kir_binary(v->k, AP_KIR_MUL, acc, u);
	if (!strcmp(red, "max"))
		return ap_v_max(v, acc, u);
	if (!strcmp(red, "min"))
		return ap_v_min(v, acc, u);
	return u;
}

/* ScatterElements: out[i...] = data[i...] combined, for every j along the
 * axis with indices[i... with i_axis = j] addressing i_axis, with
 * updates[same]. */
static ap_kir_expr *scatter_elements_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int data = node->inputs[0], ind = node->inputs[1], upd = node->inputs[2];
	const ap_tensor *it = &v->g->tensors[ind];
	int64_t axis = ap_node_int(node, "axis", 0), D = ix->dims[axis];
	const char *red = ap_node_string(node, "reduction", "none");
	ap_dtype dt = v->g->tensors[t].dtype;
	ap_kir_var *acc = ap_kir_var_new(k, dt, "acc"), *j;
	ap_kir_block *saved_in = NULL, *saved, *saved_if;
	ap_kir_expr *inside = NULL, *here, *q;
	ap_lidx ii = ap_lidx_shape(it);

	ap_kir_let(k, v->cur, acc, ap_val(v, data, ix));
	for (int d = 0; d < ix->rank; d++) {
		ap_kir_expr *c;

		if (d == axis || it->dims[d] >= ix->dims[d])
			continue;
		c = ap_kir_binary(k, AP_KIR_LT, ap_lidx_coord(v, ix, d), ap_kir_idx(k, it->dims[d]));
		inside = inside ? ap_kir_binary(k, AP_KIR_LAND, inside, c) : c;
	}
	if (inside)
		ap_v_if(v, inside, &saved_in, NULL);
	here = ap_v_once(v, ap_kir_cast(k, AP_DT_I64, ap_lidx_coord(v, ix, (int)axis)));
	j = ap_v_loop(v, "j", ap_kir_idx(k, 0), ap_kir_idx(k, it->dims[axis]), 1, &saved);
	for (int d = 0; d < ii.rank; d++)
		ii.c[d] = d == axis ? ap_kir_ref(k, j) : ap_lidx_coord(v, ix, d);
	q = ap_v_wrap_index(v, ap_val(v, ind, &ii), D);
	ap_v_if(v, ap_kir_binary(k, AP_KIR_EQ, q, here), &saved_if, NULL);
	ap_kir_assign(k, v->cur, acc, scatter_combine(v, red, ap_kir_ref(k, acc), ap_val(v, upd, &ii)));
	ap_v_close(v, saved_if);
	ap_v_close(v, saved);
	if (inside)
		ap_v_close(v, saved_in);
	return ap_kir_ref(k, acc);
}

/* ScatterND: out[i...] = data[i...] combined, for every index tuple n of
 * indices [N, K] (flattened) whose K components address i's first K
 * coordinates, with updates[n, i_K...]. */
static ap_kir_expr *scatter_nd_value(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	ap_kir_kernel *k = v->k;
	int data = node->inputs[0], ind = node->inputs[1], upd = node->inputs[2];
	const ap_tensor *it = &v->g->tensors[ind], *ut = &v->g->tensors[upd];
	const char *red = ap_node_string(node, "reduction", "none");
	ap_dtype dt = v->g->tensors[t].dtype;
	int64_t K = it->dims[it->rank - 1], N = 1, inner = 1;
	ap_kir_var *acc = ap_kir_var_new(k, dt, "acc"), *n;
	ap_kir_block *saved, *saved_if;
	ap_kir_expr *match = NULL, *tail = ap_kir_idx(k, 0);
	ap_lidx ui = ap_lidx_shape(ut);

	for (int d = 0; d + 1 < it->rank; d++)
		N *= it->dims[d];
	for (int d = ix->rank - 1; d >= (int)K; d--) {
		tail = ap_kir_add(k, tail, ap_kir_muli(k, ap_lidx_coord(v, ix, d), inner));
		inner *= ix->dims[d];
	}
	tail = ap_v_once(v, tail);
	ap_kir_let(k, v->cur, acc, ap_val(v, data, ix));
	n = ap_v_loop(v, "n", ap_kir_idx(k, 0), ap_kir_idx(k, N), 1, &saved);
	for (int j = 0; j < K; j++) {
		ap_lidx ii = ap_lidx_shape(it);
		ap_kir_expr *q, *c;

		ii.lin = ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, n), K), j);
		q = ap_v_wrap_index(v, ap_val(v, ind, &ii), ix->dims[j]);
		c = ap_kir_binary(k, AP_KIR_EQ, q, ap_kir_cast(k, AP_DT_I64, ap_lidx_coord(v, ix, j)));
		match = match ? ap_kir_binary(k, AP_KIR_LAND, match, c) : c;
	}
	ap_v_if(v, match, &saved_if, NULL);
	ui.lin = ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, n), inner), tail);
	ap_kir_assign(k, v->cur, acc, scatter_combine(v, red, ap_kir_ref(k, acc), ap_val(v, upd, &ui)));
	ap_v_close(v, saved_if);
	ap_v_close(v, saved);
	return ap_kir_ref(k, acc);
}

ap_kir_expr *ap_v_loop_op(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix)
{
	if (ap_op_category_of(node->op) == AP_CAT_REDUCTION)
		return reduce_serial(v, node, t, ix);
	switch (node->op) {
	case AP_OP_MATMUL:
		return matmul_value(v, node, t, ix);
	case AP_OP_CONV:
	case AP_OP_CONV_TRANSPOSE:
		return conv_value(v, node, t, ix);
	case AP_OP_MAX_POOL:
	case AP_OP_AVERAGE_POOL:
		return pool_value(v, node, t, ix);
	case AP_OP_LRN:
		return lrn_value(v, node, t, ix);
	case AP_OP_CUM_SUM:
		return cumsum_value(v, node, t, ix);
	case AP_OP_ARG_MAX:
	case AP_OP_ARG_MIN:
		return argext_value(v, node, t, ix);
	case AP_OP_SCATTER_ELEMENTS:
		return scatter_elements_value(v, node, t, ix);
	case AP_OP_SCATTER_ND:
		return scatter_nd_value(v, node, t, ix);
	default:
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "not a loop-shaped op");
	}
}
