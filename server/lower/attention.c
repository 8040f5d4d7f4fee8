/* attention.c -- the fused attention emitter: O = softmax(S) @ V with
 * S = f(Q @ K^T) (a scale, a mask: any elementwise epilogue of the first
 * product) as one kernel that never writes S or P, by the online softmax of
 * FlashAttention (Dao et al., 2022; Milakov and Gimelshein, "Online
 * normalizer calculation for softmax", 2018).
 *
 * The micro-graph (kind "attention", made by Layer II from the QK^T
 * product, the softmax statistics and the PV product, server/fuse) holds
 * the primitives Softmax opens into (expand.c):
 *   Y1 = MatMul(Q, KT); S = elementwise(Y1, ...); m = ReduceMax(S, last);
 *   E = Exp(S - m); l = ReduceSum(E, last); P = E / l; O = MatMul(P, V)
 * and O's epilogue (views, transposes, elementwise ops).  Per row of S the
 * kernel keeps a running maximum m and sum l and an output accumulator,
 * and for each tile of keys: s_j = S(q . k_j); m' = max(m, max_j s_j);
 * l = l * exp(m - m') + sum_j exp(s_j - m'); acc = acc * exp(m - m') +
 * sum_j exp(s_j - m') v_j; m = m'.  At the end O = acc / l, which is
 * softmax(S) @ V (a row whose scores are all -inf gives NaN, as the
 * unfused graph does).  S, m and l are written too when another kernel
 * reads them (a training step's backward pass recomputes P from them).
 *
 * Layout: a block takes `rows` query rows of one batch, one warp per row,
 * and walks the keys in tiles of 32 (a key per lane): the tile of K and
 * of V is staged in shared memory (the value builder loads it, so views
 * and prologues of K and V are read in place), each lane computes its
 * score against the row's query (held in shared memory), the warp reduces
 * the tile's maximum and sum with shuffles, writes its probabilities to
 * shared memory, and each lane accumulates the output columns lane, lane
 * + 32, ... of its row.  The host runs the same kernel (shuffles and
 * barriers emulated).
 *
 * Knobs: "rows" (query rows per block).
 */
#include "emitters.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEYS 32                     /* keys per tile: one per lane */

typedef struct att_plan {
	int mm1, mm2;                   /* the two products */
	int y1, s, m, e, l, p, o;       /* tensors: QK^T, scores, max, exp, sum, probabilities, PV */
	int q, kt, v;                   /* operands: Q [.., Nq, D], K^T [.., D, Nk], V [.., Nk, Dv] */
	int nb;                         /* batch dims of S (and O) */
	int64_t bdims[AP_MAX_RANK], batch, Nq, Nk, D, Dv;
	ap_dtype t, acc;
	ap_emap *maps;                  /* from O: its epilogue */
	bool *dep;                      /* per tensor: computed from Y1 */
	bool s_out, m_out, l_out;       /* written for other kernels */
} att_plan;

static void plan_clear(att_plan *p)
{
	free(p->maps);
	free(p->dep);
	p->maps = NULL;
	p->dep = NULL;
}

static int producer(const ap_graph *g, int t, ap_op op)
{
	int n = t >= 0 ? g->tensors[t].producer : -1;

	return n >= 0 && g->nodes[n].op == op ? n : -1;
}

/* A reduction of the last axis of x, keeping it. */
static bool last_axis_kept(const ap_graph *g, int node)
{
	const ap_node *n = &g->nodes[node];
	const ap_attr *ax = ap_node_attr(n, "axes");
	const ap_tensor *x = &g->tensors[n->inputs[0]];

	return ax && ax->n_ints == 1 && ax->ints[0] == x->rank - 1 && ap_node_int(n, "keepdims", 1) == 1;
}

/* 1 when m is O = softmax(f(Q K^T)) V as the file comment says (p
 * filled), 0 with *why when not, AP_ENOMEM. */
static int analyze(const ap_mgraph *m, const ap_target_info *t, att_plan *p, char *why, size_t cap)
{
	const ap_graph *g = m->g;
	int n_mm = 0, mms[2], dv_node, ex_node, sub_node, rs_node, rm_node;
	const ap_tensor *st, *qt, *kt, *vt, *ot;

	memset(p, 0, sizeof(*p));
	for (int i = 0; i < g->n_nodes; i++)
		if (g->nodes[i].op == AP_OP_MATMUL && n_mm++ < 2)
			mms[n_mm - 1] = i;
	if (n_mm != 2) {
		snprintf(why, cap, "%d products, not two", n_mm);
		return 0;
	}
	for (int i = 0; i < 2; i++) {
		int a = g->nodes[mms[i]].inputs[0];

		if (producer(g, a, AP_OP_DIV) >= 0) {
			p->mm2 = mms[i];
			p->mm1 = mms[1 - i];
		}
	}
	if (p->mm1 == p->mm2) {
		snprintf(why, cap, "no product of probabilities");
		return 0;
	}
	p->p = g->nodes[p->mm2].inputs[0];
	p->v = g->nodes[p->mm2].inputs[1];
	p->o = g->nodes[p->mm2].outputs[0];
	p->q = g->nodes[p->mm1].inputs[0];
	p->kt = g->nodes[p->mm1].inputs[1];
	p->y1 = g->nodes[p->mm1].outputs[0];
	/* P = E / l, E = Exp(S - m), m = ReduceMax(S), l = ReduceSum(E) */
	dv_node = producer(g, p->p, AP_OP_DIV);
	p->e = g->nodes[dv_node].inputs[0];
	p->l = g->nodes[dv_node].inputs[1];
	ex_node = producer(g, p->e, AP_OP_EXP);
	rs_node = producer(g, p->l, AP_OP_REDUCE_SUM);
	sub_node = ex_node >= 0 ? producer(g, g->nodes[ex_node].inputs[0], AP_OP_SUB) : -1;
	if (ex_node < 0 || rs_node < 0 || sub_node < 0) {
		snprintf(why, cap, "the probabilities are not exp(S - max) / sum");
		return 0;
	}
	p->s = g->nodes[sub_node].inputs[0];
	p->m = g->nodes[sub_node].inputs[1];
	if (g->nodes[rs_node].inputs[0] != p->e) {
		/* the partitioner may have recomputed exp(S - max) for the sum */
		int e2 = producer(g, g->nodes[rs_node].inputs[0], AP_OP_EXP);
		int s2 = e2 >= 0 ? producer(g, g->nodes[e2].inputs[0], AP_OP_SUB) : -1;

		if (s2 < 0 || g->nodes[s2].inputs[0] != p->s || g->nodes[s2].inputs[1] != p->m) {
			snprintf(why, cap, "the sum is not of exp(S - max)");
			return 0;
		}
	}
	rm_node = producer(g, p->m, AP_OP_REDUCE_MAX);
	if (rm_node < 0 || g->nodes[rm_node].inputs[0] != p->s || !last_axis_kept(g, rm_node) ||
	    !last_axis_kept(g, rs_node)) {
		snprintf(why, cap, "the softmax does not normalise the scores' last axis");
		return 0;
	}
	st = &g->tensors[p->s];
	qt = &g->tensors[p->q];
	kt = &g->tensors[p->kt];
	vt = &g->tensors[p->v];
	ot = &g->tensors[p->o];
	if (st->rank < 2 || qt->rank < 2 || kt->rank < 2 || vt->rank < 2 || ot->rank != st->rank) {
		snprintf(why, cap, "vector operands");
		return 0;
	}
	p->t = st->dtype;
	if (!ap_dtype_is_float(p->t) || qt->dtype != p->t || kt->dtype != p->t || vt->dtype != p->t ||
	    ot->dtype != p->t) {
		snprintf(why, cap, "operands of type %s", ap_dtype_name(qt->dtype));
		return 0;
	}
	p->acc = ap_acc_type(p->t);
	if (t->gpu && t->arch >= 80 &&
	    (p->t == AP_DT_F16 || p->t == AP_DT_BF16 || (p->t == AP_DT_F32 && t->allow_tf32))) {
		/* tensor-core products stay the GEMM emitter's (mma.sync), until
		 * this emitter has a tensor-core form */
		snprintf(why, cap, "%s products on sm_%d go to tensor cores", ap_dtype_name(p->t), t->arch);
		return 0;
	}
	p->nb = st->rank - 2;
	p->Nq = st->dims[p->nb];
	p->Nk = st->dims[p->nb + 1];
	p->D = qt->dims[qt->rank - 1];
	p->Dv = vt->dims[vt->rank - 1];
	p->batch = 1;
	for (int d = 0; d < p->nb; d++) {
		p->bdims[d] = st->dims[d];
		p->batch *= st->dims[d];
		if (ot->dims[d] != st->dims[d]) {
			snprintf(why, cap, "the two products have different batches");
			return 0;
		}
	}
	if (p->Nq < 1 || p->Nk < 1 || p->D < 1 || p->Dv < 1 || vt->dims[vt->rank - 2] != p->Nk ||
	    ot->dims[p->nb] != p->Nq || ot->dims[p->nb + 1] != p->Dv) {
		snprintf(why, cap, "shapes that do not chain");
		return 0;
	}
	/* shared memory: the K and V tiles, the rows' queries and probabilities */
	if ((size_t)(KEYS * (p->D + 1 + p->Dv) + 8 * (p->D + KEYS)) * ap_dtype_size(p->acc) >
	    t->shared_per_block) {
		snprintf(why, cap, "head dims %lld and %lld do not fit in shared memory", (long long)p->D,
			 (long long)p->Dv);
		return 0;
	}
	p->maps = calloc((size_t)g->n_tensors + 1, sizeof(ap_emap));
	p->dep = calloc((size_t)g->n_tensors + 1, sizeof(bool));
	if (!p->maps || !p->dep) {
		plan_clear(p);
		snprintf(why, cap, "out of memory");
		return AP_ENOMEM;
	}
	if (!ap__epilogue_maps(g, p->o, p->maps, false, why, cap)) {
		plan_clear(p);
		return 0;
	}
	/* S from Y1 element for element: a chain of elementwise and broadcast
	 * ops, each reading exactly one tensor that depends on Y1, of its own
	 * shape (the rest -- a scale, a mask -- read at the element) */
	p->dep[p->y1] = true;
	for (int i = 0; i < g->n_nodes; i++)
		for (int j = 0; j < g->nodes[i].n_inputs; j++)
			if (g->nodes[i].inputs[j] >= 0 && p->dep[g->nodes[i].inputs[j]])
				for (int o = 0; o < g->nodes[i].n_outputs; o++)
					if (g->nodes[i].outputs[o] >= 0)
						p->dep[g->nodes[i].outputs[o]] = true;
	for (int x = p->s; x != p->y1;) {
		int pn = g->tensors[x].producer, next = -1, nd = 0;
		ap_op_category cat = pn >= 0 ? ap_op_category_of(g->nodes[pn].op) : AP_CAT_OPAQUE;

		if (pn < 0 || (cat != AP_CAT_ELEMWISE && cat != AP_CAT_BROADCAST) || g->nodes[pn].op == AP_OP_EXPAND) {
			snprintf(why, cap, "the scores are not the first product element for element");
			plan_clear(p);
			return 0;
		}
		for (int j = 0; j < g->nodes[pn].n_inputs; j++) {
			int in = g->nodes[pn].inputs[j];

			if (in >= 0 && p->dep[in]) {
				nd++;
				next = in;
			}
		}
		if (nd != 1 || !ap_dims_equal(g->tensors[next].rank, g->tensors[next].dims, g->tensors[x].rank,
					      g->tensors[x].dims)) {
			snprintf(why, cap, "the scores are not the first product element for element");
			plan_clear(p);
			return 0;
		}
		x = next;
	}
	/* what it writes: O's epilogue, and S, the max and the sum for others */
	for (int i = 0; i < g->n_outputs; i++) {
		int x = g->outputs[i];

		if (p->maps[x].derived)
			continue;
		if (x == p->s)
			p->s_out = true;
		else if (x == p->m)
			p->m_out = true;
		else if (x == p->l)
			p->l_out = true;
		else {
			snprintf(why, cap, "it would write %s, which only the unfused form computes",
				 g->tensors[x].name);
			plan_clear(p);
			return 0;
		}
	}
	return 1;
}

int ap_lower_attention_ok(const ap_mgraph *m, const ap_target_info *t, char *why, size_t cap)
{
	att_plan p;
	int rc = analyze(m, t, &p, why, cap);

	plan_clear(&p);
	return rc;
}

static int at_match(const ap_mgraph *m, const ap_target_info *t)
{
	char why[200];

	return m->kind == AP_GROUP_ATTENTION ? ap_lower_attention_ok(m, t, why, sizeof(why)) : 0;
}

static int at_space(const ap_mgraph *m, const ap_target_info *t, ap_space *sp)
{
	sp->n = 1;
	ap_knob_pow2(&sp->knobs[0], "rows", 1, 8);
	while (sp->knobs[0].n > 1 && (unsigned)sp->knobs[0].values[sp->knobs[0].n - 1] * 32u > ap_block_cap(t))
		sp->knobs[0].n--;
	return 0;
}

static int at_choose(const ap_mgraph *m, const ap_target_info *t, const ap_space *sp, ap_sched *s)
{
	s->v[0] = sp->knobs[0].values[sp->knobs[0].n > 2 ? 2 : sp->knobs[0].n - 1];   /* 4 rows */
	return 0;
}

/* ---- the kernel ---------------------------------------------------------------------- */

typedef struct actx {
	const att_plan *p;
	ap_vctx *v;
	ap_kir_kernel *k;
	ap_kir_expr *bc[AP_MAX_RANK];   /* the block's batch coordinates */
	ap_kir_expr *dot;               /* leaf hook: Y1's value (a lane's dot product) */
	ap_kir_expr *out;               /* leaf hook: O's value */
} actx;

static ap_kir_expr *att_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	actx *c = user;

	if (t == c->p->y1 && c->dot)
		return ap_kir_cast(v->k, v->g->tensors[t].dtype, c->dot);
	if (t == c->p->o && c->out)
		return ap_kir_cast(v->k, v->g->tensors[t].dtype, c->out);
	return NULL;
}

/* Index into tensor x (of rank >= 2) at the block's batch, broadcast the
 * numpy way, and (r, c) for its last two dims. */
static ap_lidx idx2(actx *c, int x, ap_kir_expr *r, ap_kir_expr *col)
{
	const ap_tensor *t = &c->v->g->tensors[x];
	ap_lidx ix = ap_lidx_shape(t);
	int rank = t->rank, nb = c->p->nb;

	for (int j = 0; j < rank - 2; j++) {
		int d = j + nb - (rank - 2);

		ix.c[j] = d < 0 || t->dims[j] == 1 ? ap_kir_idx(c->k, 0) : c->bc[d];
	}
	ix.c[rank - 2] = r;
	ix.c[rank - 1] = col;
	return ix;
}

/* Butterfly over the 32 lanes: every lane ends with the max (or sum) of v. */
static ap_kir_expr *warp_reduce(actx *c, ap_kir_expr *v, bool max)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *vc = c->v;
	ap_kir_var *acc = ap_kir_var_new(k, v->type, max ? "wm" : "ws");

	ap_kir_let(k, vc->cur, acc, v);
	for (int off = 16; off >= 1; off /= 2) {
		ap_kir_var *o = ap_kir_var_new(k, v->type, "sh");

		ap_kir_let(k, vc->cur, o, NULL);
		ap_kir_shfl(k, vc->cur, o, AP_KIR_SHFL_XOR, ap_kir_ref(k, acc), ap_kir_idx(k, off), 32);
		ap_kir_assign(k, vc->cur, acc, max ? ap_kir_binary(k, AP_KIR_MAX, ap_kir_ref(k, acc), ap_kir_ref(k, o))
						   : ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc), ap_kir_ref(k, o)));
	}
	return ap_kir_ref(k, acc);
}

static int at_emit(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_kir_kernel *k,
		   ap_error *err)
{
	att_plan p;
	actx c;
	ap_vctx v;
	char why[200];
	int rc, R = s->v[0], nc;
	unsigned nt = 32u * (unsigned)R;
	int64_t qblocks, tiles, ntiles;
	unsigned grid;
	ap_dtype A;
	ap_kir_array *ks, *vs, *qs, *ps, *acc;
	ap_kir_expr *tid, *warp, *lane, *row, *rowc, *qrow0, *valid, *ninf;
	ap_kir_var *tile, *mrun, *lrun, *kt;
	ap_kir_block *tsaved, *ksaved, *saved;

	if ((rc = analyze(m, t, &p, why, sizeof(why))) <= 0)
		return ap_error_set(err, rc < 0 ? AP_ENOMEM : AP_EUNSUPPORTED, m->g->nodes[m->root].name, NULL,
				    "attention emitter: %s", why);
	if (R < 1 || nt > ap_block_cap(t)) {
		plan_clear(&p);
		return ap_error_set(err, AP_EUNSUPPORTED, m->g->nodes[m->root].name, NULL,
				    "attention emitter: %d rows per block", R);
	}
	if ((rc = ap_vctx_init(&v, m, k, err))) {
		plan_clear(&p);
		return rc;
	}
	memset(&c, 0, sizeof(c));
	c.p = &p;
	c.v = &v;
	c.k = k;
	A = p.acc;
	nc = (int)((p.Dv + 31) / 32);
	ks = ap_kir_shared(k, "ks", A, KEYS * (p.D + 1));
	vs = ap_kir_shared(k, "vs", A, KEYS * p.Dv);
	qs = ap_kir_shared(k, "qs", A, (int64_t)R * p.D);
	ps = ap_kir_shared(k, "ps", A, (int64_t)R * KEYS);
	acc = ap_kir_local(k, "acc", A, nc);
	if (ap_kir_failed(k)) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention");
		goto done;
	}
	qblocks = (p.Nq + R - 1) / R;
	tiles = p.batch * qblocks;
	ntiles = (p.Nk + KEYS - 1) / KEYS;
	grid = ap_grid_for(tiles, 1);
	k->grid[0] = grid;
	k->block[0] = nt;
	tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	warp = ap_kir_bind(k, v.cur, k->index_type, "w", ap_kir_binary(k, AP_KIR_SHR, tid, ap_kir_idx(k, 5)));
	lane = ap_kir_bind(k, v.cur, k->index_type, "ln", ap_kir_binary(k, AP_KIR_AND, tid, ap_kir_idx(k, 31)));
	ninf = ap_kir_float(k, A, -INFINITY);
	v.leaf = att_leaf;
	v.leaf_user = &c;
	tile = ap_v_loop(&v, "tile", ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_idx(k, tiles), grid, &tsaved);
	ap_kir_barrier(k, v.cur);
	{
		ap_kir_expr *bi = ap_kir_bind(k, v.cur, k->index_type, "bi",
					      ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, tile), ap_kir_idx(k, qblocks)));
		int64_t stride = 1;

		qrow0 = ap_kir_bind(k, v.cur, k->index_type, "q0",
				    ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, tile), ap_kir_idx(k, qblocks)), R));
		for (int d = p.nb - 1; d >= 0; d--) {
			c.bc[d] = p.bdims[d] == 1 ? ap_kir_idx(k, 0)
				  : ap_kir_bind(k, v.cur, k->index_type, "b",
						ap_kir_binary(k, AP_KIR_REM, ap_kir_binary(k, AP_KIR_DIV, bi, ap_kir_idx(k, stride)),
							      ap_kir_idx(k, p.bdims[d])));
			stride *= p.bdims[d];
		}
	}
	/* this warp's row; past the last row, the last row again (never stored),
	 * so that every warp takes part in the barriers and shuffles */
	row = ap_kir_bind(k, v.cur, k->index_type, "row", ap_kir_add(k, qrow0, warp));
	valid = ap_kir_bind(k, v.cur, AP_DT_BOOL, "ok", ap_kir_binary(k, AP_KIR_LT, row, ap_kir_idx(k, p.Nq)));
	rowc = ap_kir_bind(k, v.cur, k->index_type, "rc", ap_kir_binary(k, AP_KIR_MIN, row, ap_kir_idx(k, p.Nq - 1)));
	/* the row's query into shared memory */
	{
		ap_kir_var *d = ap_v_loop(&v, "d", lane, ap_kir_idx(k, p.D), 32, &saved);
		ap_lidx ix = idx2(&c, p.q, rowc, ap_kir_ref(k, d));

		ap_kir_store(k, v.cur, qs, ap_kir_add(k, ap_kir_muli(k, warp, p.D), ap_kir_ref(k, d)),
			     ap_kir_cast(k, A, ap_val(&v, p.q, &ix)));
		ap_v_close(&v, saved);
	}
	mrun = ap_kir_var_new(k, A, "m");
	lrun = ap_kir_var_new(k, A, "l");
	ap_kir_let(k, v.cur, mrun, ninf);
	ap_kir_let(k, v.cur, lrun, ap_kir_float(k, A, 0));
	{
		ap_kir_var *i = ap_kir_var_new(k, k->index_type, "z");
		ap_kir_stmt *lz = ap_kir_for_unroll(k, v.cur, i, ap_kir_idx(k, 0), ap_kir_idx(k, nc), 1, -1);

		if (lz)
			ap_kir_store(k, &lz->body, acc, ap_kir_ref(k, i), ap_kir_float(k, A, 0));
	}
	kt = ap_v_loop(&v, "kt", ap_kir_idx(k, 0), ap_kir_idx(k, ntiles), 1, &ksaved);
	{
		ap_kir_expr *key0 = ap_kir_bind(k, v.cur, k->index_type, "k0", ap_kir_muli(k, ap_kir_ref(k, kt), KEYS));
		ap_kir_expr *key, *sval, *mt, *mnew, *alpha, *pv, *psum, *dead;
		ap_kir_var *e, *dot;

		ap_kir_barrier(k, v.cur);
		/* the key tile of K (from K^T) and of V */
		for (int which = 0; which < 2; which++) {
			int64_t w = which ? p.Dv : p.D;
			ap_kir_var *ev = ap_v_loop(&v, "e", tid, ap_kir_idx(k, KEYS * w), nt, &saved);
			ap_kir_expr *j = ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, ev), ap_kir_idx(k, w));
			ap_kir_expr *col = ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, ev), ap_kir_idx(k, w));
			ap_kir_expr *kg = ap_kir_add(k, key0, j);
			ap_kir_var *x = ap_kir_var_new(k, A, "x");
			ap_kir_block *s2;
			ap_lidx ix;

			ap_kir_let(k, v.cur, x, ap_kir_float(k, A, 0));
			ap_v_if(&v, ap_kir_binary(k, AP_KIR_LT, kg, ap_kir_idx(k, p.Nk)), &s2, NULL);
			ix = which ? idx2(&c, p.v, kg, col) : idx2(&c, p.kt, col, kg);
			ap_kir_assign(k, v.cur, x, ap_kir_cast(k, A, ap_val(&v, which ? p.v : p.kt, &ix)));
			ap_v_close(&v, s2);
			ap_kir_store(k, v.cur, which ? vs : ks,
				     ap_kir_add(k, ap_kir_muli(k, j, which ? p.Dv : p.D + 1), col), ap_kir_ref(k, x));
			ap_v_close(&v, saved);
		}
		ap_kir_barrier(k, v.cur);
		/* this lane's key: its score */
		key = ap_kir_bind(k, v.cur, k->index_type, "key", ap_kir_add(k, key0, lane));
		dot = ap_kir_var_new(k, A, "dot");
		ap_kir_let(k, v.cur, dot, ap_kir_float(k, A, 0));
		{
			ap_kir_var *d = ap_v_loop(&v, "d", ap_kir_idx(k, 0), ap_kir_idx(k, p.D), 1, &saved);

			ap_kir_assign(k, v.cur, dot,
				      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, dot),
						    ap_kir_binary(k, AP_KIR_MUL,
								  ap_kir_load(k, qs, ap_kir_add(k, ap_kir_muli(k, warp, p.D), ap_kir_ref(k, d))),
								  ap_kir_load(k, ks, ap_kir_add(k, ap_kir_muli(k, lane, p.D + 1), ap_kir_ref(k, d))))));
			ap_v_close(&v, saved);
		}
		{
			/* S at (row, key): the first product's epilogue on the dot product */
			ap_kir_var *sv = ap_kir_var_new(k, A, "s");
			ap_kir_block *s2;
			ap_lidx ix;

			ap_kir_let(k, v.cur, sv, ninf);
			ap_v_if(&v, ap_kir_binary(k, AP_KIR_LT, key, ap_kir_idx(k, p.Nk)), &s2, NULL);
			c.dot = ap_kir_ref(k, dot);
			ix = idx2(&c, p.s, rowc, key);
			ap_kir_assign(k, v.cur, sv, ap_kir_cast(k, A, ap_val(&v, p.s, &ix)));
			if (p.s_out) {
				ap_kir_block *s3;
				ap_lidx ox = idx2(&c, p.s, rowc, key);

				ap_v_if(&v, valid, &s3, NULL);
				ap_kir_store(k, v.cur, ap_v_buffer(&v, p.s), ap_lidx_linear(&v, &ox),
					     ap_kir_cast(k, p.t, ap_kir_ref(k, sv)));
				ap_v_close(&v, s3);
			}
			c.dot = NULL;
			ap_v_close(&v, s2);
			sval = ap_kir_ref(k, sv);
		}
		mt = warp_reduce(&c, sval, true);
		mnew = ap_kir_bind(k, v.cur, A, "mn", ap_kir_binary(k, AP_KIR_MAX, ap_kir_ref(k, mrun), mt));
		/* with every score so far -inf, nothing to rescale and nothing to add */
		dead = ap_kir_bind(k, v.cur, AP_DT_BOOL, "dd", ap_kir_binary(k, AP_KIR_EQ, mnew, ninf));
		alpha = ap_kir_bind(k, v.cur, A, "al",
				    ap_kir_select(k, dead, ap_kir_float(k, A, 1),
						  ap_kir_call(k, AP_KIR_EXP, ap_kir_binary(k, AP_KIR_SUB, ap_kir_ref(k, mrun), mnew), NULL)));
		pv = ap_kir_bind(k, v.cur, A, "p",
				 ap_kir_select(k, dead, ap_kir_float(k, A, 0),
					       ap_kir_call(k, AP_KIR_EXP, ap_kir_binary(k, AP_KIR_SUB, sval, mnew), NULL)));
		psum = warp_reduce(&c, pv, false);
		ap_kir_assign(k, v.cur, lrun, ap_kir_binary(k, AP_KIR_ADD, ap_kir_binary(k, AP_KIR_MUL, ap_kir_ref(k, lrun), alpha), psum));
		ap_kir_assign(k, v.cur, mrun, mnew);
		ap_kir_store(k, v.cur, ps, ap_kir_add(k, ap_kir_muli(k, warp, KEYS), lane), pv);
		ap_kir_barrier(k, v.cur);
		/* this lane's output columns lane, lane + 32, ... */
		e = ap_kir_var_new(k, k->index_type, "i");
		{
			ap_kir_stmt *li = ap_kir_for_unroll(k, v.cur, e, ap_kir_idx(k, 0), ap_kir_idx(k, nc), 1, -1);
			ap_kir_expr *col = ap_kir_add(k, lane, ap_kir_muli(k, ap_kir_ref(k, e), 32));
			ap_kir_var *a2 = ap_kir_var_new(k, A, "a"), *j = ap_kir_var_new(k, k->index_type, "j");
			ap_kir_stmt *lj, *guard;

			if (li) {
				ap_kir_let(k, &li->body, a2, ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, acc, ap_kir_ref(k, e)), alpha));
				guard = ap_kir_if(k, &li->body, ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, p.Dv)));
				lj = guard ? ap_kir_for(k, &guard->body, j, ap_kir_idx(k, 0), ap_kir_idx(k, KEYS), 1) : NULL;
				if (lj)
					ap_kir_assign(k, &lj->body, a2,
						      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, a2),
								    ap_kir_binary(k, AP_KIR_MUL,
										  ap_kir_load(k, ps, ap_kir_add(k, ap_kir_muli(k, warp, KEYS), ap_kir_ref(k, j))),
										  ap_kir_load(k, vs, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, j), p.Dv), col)))));
				ap_kir_store(k, &li->body, acc, ap_kir_ref(k, e), ap_kir_ref(k, a2));
			}
		}
	}
	ap_v_close(&v, ksaved);
	/* O = acc / l, its epilogue, and the statistics others read */
	{
		ap_kir_var *i = ap_v_loop(&v, "i", ap_kir_idx(k, 0), ap_kir_idx(k, nc), 1, &saved);
		ap_kir_expr *col = ap_kir_bind(k, v.cur, k->index_type, "col",
					       ap_kir_add(k, lane, ap_kir_muli(k, ap_kir_ref(k, i), 32)));
		ap_kir_block *s2;

		ap_v_if(&v, ap_kir_binary(k, AP_KIR_LAND, valid, ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, p.Dv))), &s2, NULL);
		c.out = ap_kir_bind(k, v.cur, A, "o", ap_kir_binary(k, AP_KIR_DIV, ap_kir_load(k, acc, ap_kir_ref(k, i)),
								    ap_kir_ref(k, lrun)));
		ap__epilogue_store(&v, p.maps, idx2(&c, p.o, rowc, col));
		c.out = NULL;
		ap_v_close(&v, s2);
		ap_v_close(&v, saved);
	}
	if (p.m_out || p.l_out) {
		ap_kir_block *s2;

		ap_v_if(&v, ap_kir_binary(k, AP_KIR_LAND, valid, ap_kir_binary(k, AP_KIR_EQ, lane, ap_kir_idx(k, 0))), &s2, NULL);
		for (int w = 0; w < 2; w++) {
			int x = w ? p.l : p.m;
			ap_lidx ix;

			if (!(w ? p.l_out : p.m_out))
				continue;
			ix = idx2(&c, x, rowc, ap_kir_idx(k, 0));
			ap_kir_store(k, v.cur, ap_v_buffer(&v, x), ap_lidx_linear(&v, &ix),
				     ap_kir_cast(k, v.g->tensors[x].dtype, ap_kir_ref(k, w ? lrun : mrun)));
		}
		ap_v_close(&v, s2);
	}
	ap_v_close(&v, tsaved);
	rc = v.rc;
done:
	v.leaf = NULL;
	ap_vctx_clear(&v);
	plan_clear(&p);
	return rc;
}

static int at_traffic(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_traffic *out)
{
	att_plan p;
	char why[200];
	int rc;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(m, out) < 0)
		return AP_ENOMEM;
	if ((rc = analyze(m, t, &p, why, sizeof(why))) <= 0)
		return rc;
	out->flops = 2.0 * (double)p.batch * (double)p.Nq * (double)p.Nk * (double)(p.D + p.Dv);
	out->threads = 32u * (unsigned)s->v[0];
	out->blocks = ap_grid_for(p.batch * ((p.Nq + s->v[0] - 1) / s->v[0]), 1);
	out->shared_bytes = (unsigned)((KEYS * (p.D + 1 + p.Dv) + s->v[0] * (p.D + KEYS)) * ap_dtype_size(p.acc));
	plan_clear(&p);
	return 0;
}

const ap_emitter ap_emitter_attention = {
	"attention", at_match, at_space, at_choose, at_emit, at_traffic, NULL, false,
};
