/* attention_grad.c -- the attention backward emitter: AttentionGrad
 * (ops.def) as one kernel that never holds an L x S tensor.
 *
 * For one head, with P = softmax(scale * Q K^T + mask) recomputed from Q,
 * K and the forward's LogSumExp (P_ij = exp(s_ij - lse_i)), and
 * D_i = dY_i . Y_i (= sum_j P_ij dP_ij), the gradients are
 *   dV_j = sum_i P_ij dY_i
 *   dS_ij = P_ij (dY_i . V_j - D_i)
 *   dK_j = scale * sum_i dS_ij Q_i
 *   dQ_i = scale * sum_j dS_ij K_j
 * (FlashAttention-2, Dao 2023, algorithm 2; the D_i identity is its
 * equation for the softmax's backward).  A key/value head shared by G
 * query heads (grouped-query attention) sums its dK and dV over them.
 *
 * One launch, two sweeps, each block taking one of them: a key block
 * (one key a thread) walks every query row of its key/value head's query
 * heads, staged a tile at a time in shared memory, accumulating its keys'
 * dK and dV in registers; a query block (one query row a thread) walks
 * the key tiles, accumulating its rows' dQ.  Each output element is
 * written once by one thread: no atomics and no workspace, at the price
 * of computing P twice (seven products of the sizes of S instead of
 * FlashAttention-2's five, which accumulates dQ with atomic adds).
 * Causal: a key block starts at the first query tile that sees its first
 * key, a query block stops after the tile holding its last row's
 * diagonal; tiles above the diagonal are never visited.  A score masked
 * out (-inf) has P = 0, a row whose LogSumExp is -inf too (every key
 * masked) contributes nothing.
 *
 * Everything is computed in the accumulation type (float32 for 16-bit
 * operands, the operands' type otherwise); the host runs the same kernel
 * (barriers emulated).  This is the SIMT form: no tensor cores yet.
 *
 * Knob: "threads" (keys of a key block, rows of a query block, and the
 * tile each stages).
 */
#include "emitters.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define HEAD_MAX 256                /* the longest head dim (register rows) */

typedef struct ag_plan {
	int node;                       /* the AttentionGrad node */
	int dy, q, k, v, y, lse, mask;  /* its inputs (mask: -1 when none) */
	int dq, dk, dv;                 /* outputs; -1 when the micro-graph does not write one */
	int r;                          /* rank of Q */
	int64_t nb, H, Hk, G, L, S, E, Ev;
	int64_t bdims[AP_MAX_RANK];     /* the leading batch dims (r - 3 of them) */
	double scale;
	bool causal;
	ap_dtype t, acc;
} ag_plan;

static bool written(const ap_graph *g, int x)
{
	for (int i = 0; x >= 0 && i < g->n_outputs; i++)
		if (g->outputs[i] == x)
			return true;
	return false;
}

/* m as one AttentionGrad node (its group: an opaque op alone).  1 with p
 * filled, 0 when not. */
static int analyze(const ap_mgraph *m, ag_plan *p)
{
	const ap_graph *g = m->g;
	const ap_node *n;
	const ap_tensor *q, *k, *v;
	int at = -1;

	memset(p, 0, sizeof(*p));
	for (int i = 0; i < g->n_nodes; i++) {
		if (g->nodes[i].op == AP_OP_ATTENTION_GRAD) {
			if (at >= 0)
				return 0;
			at = i;
		}
	}
	if (at < 0)
		return 0;
	n = &g->nodes[at];
	if (n->n_inputs < 6 || n->n_outputs != 3)
		return 0;
	p->node = at;
	p->dy = n->inputs[0];
	p->q = n->inputs[1];
	p->k = n->inputs[2];
	p->v = n->inputs[3];
	p->y = n->inputs[4];
	p->lse = n->inputs[5];
	p->mask = n->n_inputs > 6 ? n->inputs[6] : -1;
	p->dq = written(g, n->outputs[0]) ? n->outputs[0] : -1;
	p->dk = written(g, n->outputs[1]) ? n->outputs[1] : -1;
	p->dv = written(g, n->outputs[2]) ? n->outputs[2] : -1;
	q = &g->tensors[p->q];
	k = &g->tensors[p->k];
	v = &g->tensors[p->v];
	p->r = q->rank;
	p->nb = 1;
	for (int d = 0; d < p->r - 3; d++) {
		p->bdims[d] = q->dims[d];
		p->nb *= q->dims[d];
	}
	p->H = q->dims[p->r - 3];
	p->Hk = k->dims[p->r - 3];
	p->G = p->H / p->Hk;
	p->L = q->dims[p->r - 2];
	p->S = k->dims[p->r - 2];
	p->E = q->dims[p->r - 1];
	p->Ev = v->dims[p->r - 1];
	p->scale = ap_node_float(n, "scale", 1.0);
	p->causal = ap_node_int(n, "is_causal", 0) != 0;
	p->t = q->dtype;
	p->acc = ap_acc_type(p->t);
	/* the rows live in registers, their loops unrolled: head dims up to
	 * HEAD_MAX (longer ones get no kernel: AttentionGrad is unsupported) */
	return p->L > 0 && p->S > 0 && p->E > 0 && p->Ev > 0 && p->nb > 0 && p->E <= HEAD_MAX &&
	       p->Ev <= HEAD_MAX;
}

static int ag_match(const ap_mgraph *m, const ap_target_info *t)
{
	ag_plan p;

	(void)t;
	return analyze(m, &p);
}

/* Shared bytes of a block of T threads: the larger of the key sweep's
 * query tile (Q, dY rows, LogSumExp, D) and the query sweep's key tile
 * (K, V rows). */
static size_t ag_smem(const ag_plan *p, int T)
{
	int64_t a = (int64_t)T * (p->E + p->Ev + 2), b = (int64_t)T * (p->E + p->Ev);

	return (size_t)(a > b ? a : b) * ap_dtype_size(p->acc);
}

static int ag_space(const ap_mgraph *m, const ap_target_info *t, ap_space *sp)
{
	(void)m;
	sp->n = 1;
	ap_knob_pow2(&sp->knobs[0], "threads", 32, 256);
	while (sp->knobs[0].n > 1 && (unsigned)sp->knobs[0].values[sp->knobs[0].n - 1] > ap_block_cap(t))
		sp->knobs[0].n--;
	return 0;
}

static int ag_valid(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t)
{
	ag_plan p;

	if (!analyze(m, &p))
		return 0;
	return (unsigned)s->v[0] <= ap_block_cap(t) && ag_smem(&p, s->v[0]) <= t->shared_per_block;
}

/* 64 threads; fewer while the tiles do not fit in shared memory. */
static int ag_choose(const ap_mgraph *m, const ap_target_info *t, const ap_space *sp, ap_sched *s)
{
	ag_plan p;
	int T = 64;

	(void)sp;
	if (analyze(m, &p))
		while (T > 32 && ag_smem(&p, T) > t->shared_per_block)
			T /= 2;
	s->v[0] = T;
	return 0;
}

/* ---- the kernel ---------------------------------------------------------------------- */

typedef struct agc {
	const ag_plan *p;
	ap_vctx *v;
	ap_kir_kernel *k;
	ap_dtype A;
	int T;
	ap_kir_expr *bc[AP_MAX_RANK];   /* the tile's batch coordinates */
	ap_kir_expr *tid;
	ap_kir_expr *scale;
} agc;

/* Index into x (Q, K, V, dY, Y: rank r; LogSumExp: rank r - 1) at the
 * tile's batch, head h, row `row` and (rank r) column `col`. */
static ap_lidx at4(agc *c, int x, ap_kir_expr *h, ap_kir_expr *row, ap_kir_expr *col)
{
	const ap_tensor *t = &c->v->g->tensors[x];
	ap_lidx ix = ap_lidx_shape(t);
	int nb = c->p->r - 3;

	for (int d = 0; d < nb; d++)
		ix.c[d] = c->bc[d];
	ix.c[nb] = h;
	ix.c[nb + 1] = row;
	if (col)
		ix.c[nb + 2] = col;
	return ix;
}

/* Value of x at (head h, row, col) in the accumulation type. */
static ap_kir_expr *ld(agc *c, int x, ap_kir_expr *h, ap_kir_expr *row, ap_kir_expr *col)
{
	ap_lidx ix = at4(c, x, h, row, col);

	return ap_kir_cast(c->k, c->A, ap_val(c->v, x, &ix));
}

/* The score s_ij = scale * dot + mask(i, j), dot = q_i . k_j, and
 * P_ij = exp(s_ij - lse_i) (0 where s_ij is -inf: masked out, causal or
 * by the mask).  Returns P (bound). */
static ap_kir_expr *prob(agc *c, ap_kir_expr *dot, ap_kir_expr *h, ap_kir_expr *i, ap_kir_expr *j,
			 ap_kir_expr *lse)
{
	const ag_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *s = ap_kir_binary(k, AP_KIR_MUL, c->scale, dot), *ok = NULL, *pv;

	if (p->mask >= 0) {
		const ap_tensor *mt = &v->g->tensors[p->mask];
		ap_lidx ix = ap_lidx_shape(mt);
		int off = p->r - mt->rank;
		ap_kir_expr *mv;

		for (int d = 0; d < mt->rank; d++) {
			int sd = d + off;
			ap_kir_expr *co = sd < p->r - 3 ? c->bc[sd] : sd == p->r - 3 ? h : sd == p->r - 2 ? i : j;

			ix.c[d] = mt->dims[d] == 1 ? ap_kir_idx(k, 0) : co;
		}
		mv = ap_val(v, p->mask, &ix);
		if (mt->dtype == AP_DT_BOOL)
			ok = mv;
		else
			s = ap_kir_binary(k, AP_KIR_ADD, s, ap_kir_cast(k, c->A, mv));
	}
	s = ap_kir_bind(k, v->cur, c->A, "s", s);
	if (p->causal) {
		ap_kir_expr *cz = ap_kir_binary(k, AP_KIR_LE, j, i);

		ok = ok ? ap_kir_binary(k, AP_KIR_LAND, ok, cz) : cz;
	}
	{
		ap_kir_expr *live = ap_kir_binary(k, AP_KIR_NE, s, ap_kir_float(k, c->A, -INFINITY));

		ok = ok ? ap_kir_binary(k, AP_KIR_LAND, ok, live) : live;
	}
	pv = ap_kir_call(k, AP_KIR_EXP, ap_kir_binary(k, AP_KIR_SUB, s, lse), NULL);
	return ap_kir_bind(k, v->cur, c->A, "p", ap_kir_select(k, ok, pv, ap_kir_float(k, c->A, 0)));
}

/* sum over e < n of a[abase + e] * b[bbase + e] (b a register array when
 * bbase is NULL), unrolled: returns the bound sum. */
static ap_kir_expr *dotp(agc *c, ap_kir_array *a, ap_kir_expr *abase, ap_kir_array *b, int64_t n)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_var *acc = ap_kir_var_new(k, c->A, "dt");
	ap_kir_block *saved;
	ap_kir_var *e;

	ap_kir_let(k, v->cur, acc, ap_kir_float(k, c->A, 0));
	e = ap_v_loop_unrolled(v, "e", n, &saved);
	ap_kir_assign(k, v->cur, acc,
		      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc),
				    ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, a, ap_kir_add(k, abase, ap_kir_ref(k, e))),
						  ap_kir_load(k, b, ap_kir_ref(k, e)))));
	ap_v_close(v, saved);
	return ap_kir_ref(k, acc);
}

/* acc[e] += f * a[abase + e], e < n, unrolled. */
static void axpy(agc *c, ap_kir_array *acc, ap_kir_expr *f, ap_kir_array *a, ap_kir_expr *abase, int64_t n)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *e = ap_v_loop_unrolled(v, "e", n, &saved);

	ap_kir_store(k, v->cur, acc, ap_kir_ref(k, e),
		     ap_kir_binary(k, AP_KIR_ADD, ap_kir_load(k, acc, ap_kir_ref(k, e)),
				   ap_kir_binary(k, AP_KIR_MUL, f, ap_kir_load(k, a, ap_kir_add(k, abase, ap_kir_ref(k, e))))));
	ap_v_close(v, saved);
}

/* reg[e] = x at (h, row, e), e < n, unrolled (a register row). */
static void load_row(agc *c, ap_kir_array *reg, int x, ap_kir_expr *h, ap_kir_expr *row, int64_t n)
{
	ap_kir_block *saved;
	ap_kir_var *e = ap_v_loop_unrolled(c->v, "e", n, &saved);

	ap_kir_store(c->k, c->v->cur, reg, ap_kir_ref(c->k, e), ld(c, x, h, row, ap_kir_ref(c->k, e)));
	ap_v_close(c->v, saved);
}

/* Stores reg[e] * f (f NULL: 1) to output x at (h, row, e), e < n. */
static void store_row(agc *c, int x, ap_kir_array *reg, ap_kir_expr *f, ap_kir_expr *h, ap_kir_expr *row, int64_t n)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *e;
	ap_lidx ix;
	ap_kir_expr *val;

	if (x < 0)
		return;
	e = ap_v_loop_unrolled(v, "e", n, &saved);
	ix = at4(c, x, h, row, ap_kir_ref(k, e));
	val = ap_kir_load(k, reg, ap_kir_ref(k, e));
	if (f)
		val = ap_kir_binary(k, AP_KIR_MUL, val, f);
	ap_kir_store(k, v->cur, ap_v_buffer(v, x), ap_lidx_linear(v, &ix), ap_kir_cast(k, v->g->tensors[x].dtype, val));
	ap_v_close(v, saved);
}

static void zero(agc *c, ap_kir_array *reg, int64_t n)
{
	ap_kir_block *saved;
	ap_kir_var *e = ap_v_loop_unrolled(c->v, "e", n, &saved);

	ap_kir_store(c->k, c->v->cur, reg, ap_kir_ref(c->k, e), ap_kir_float(c->k, c->A, 0));
	ap_v_close(c->v, saved);
}

/* D_i = dY_i . Y_i at (h, row). */
static ap_kir_expr *delta(agc *c, ap_kir_expr *h, ap_kir_expr *row)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_var *acc = ap_kir_var_new(k, c->A, "D");
	ap_kir_block *saved;
	ap_kir_var *e;

	ap_kir_let(k, v->cur, acc, ap_kir_float(k, c->A, 0));
	e = ap_v_loop(v, "e", ap_kir_idx(k, 0), ap_kir_idx(k, c->p->Ev), 1, &saved);
	ap_kir_assign(k, v->cur, acc,
		      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc),
				    ap_kir_binary(k, AP_KIR_MUL, ld(c, c->p->dy, h, row, ap_kir_ref(k, e)),
						  ld(c, c->p->y, h, row, ap_kir_ref(k, e)))));
	ap_v_close(v, saved);
	return ap_kir_ref(k, acc);
}

/* Sets c->bc from the flat batch index bi. */
static void batch_coords(agc *c, ap_kir_expr *bi)
{
	ap_kir_kernel *k = c->k;
	int64_t stride = 1;

	for (int d = c->p->r - 4; d >= 0; d--) {
		c->bc[d] = c->p->bdims[d] == 1 ? ap_kir_idx(k, 0)
			   : ap_kir_bind(k, c->v->cur, k->index_type, "b",
					 ap_kir_binary(k, AP_KIR_REM, ap_kir_binary(k, AP_KIR_DIV, bi, ap_kir_idx(k, stride)),
						       ap_kir_idx(k, c->p->bdims[d])));
		stride *= c->p->bdims[d];
	}
}

/* The key sweep of tile `tile` (< nb * Hk * key blocks): the thread's key
 * j of head hk; dK_j and dV_j over the G query heads and every query row
 * that sees j, query tiles of T rows staged in shared memory (qs: Q
 * rows, ds: dY rows, ls: LogSumExp, dd: D). */
static void key_sweep(agc *c, ap_kir_expr *tile, ap_kir_array *sh)
{
	const ag_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int T = c->T;
	int64_t kblocks = (p->S + T - 1) / T, E = p->E, Ev = p->Ev;
	ap_kir_expr *bh, *hk, *j0, *j, *jc, *valid, *qstart;
	ap_kir_array *kr = ap_kir_local(k, "kr", c->A, E), *vr = ap_kir_local(k, "vr", c->A, Ev);
	ap_kir_array *dk = ap_kir_local(k, "dk", c->A, E), *dv = ap_kir_local(k, "dv", c->A, Ev);
	ap_kir_block *gs, *is, *rs, *s2;
	ap_kir_var *gv, *i0, *rr;
	int64_t oq = 0, od = (int64_t)T * E, ol = od + (int64_t)T * Ev, oD = ol + T;

	bh = ap_kir_bind(k, v->cur, k->index_type, "bh", ap_kir_binary(k, AP_KIR_DIV, tile, ap_kir_idx(k, kblocks)));
	j0 = ap_kir_bind(k, v->cur, k->index_type, "j0",
			 ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, tile, ap_kir_idx(k, kblocks)), T));
	hk = ap_kir_bind(k, v->cur, k->index_type, "hk", ap_kir_binary(k, AP_KIR_REM, bh, ap_kir_idx(k, p->Hk)));
	batch_coords(c, ap_kir_binary(k, AP_KIR_DIV, bh, ap_kir_idx(k, p->Hk)));
	j = ap_kir_bind(k, v->cur, k->index_type, "j", ap_kir_add(k, j0, c->tid));
	valid = ap_kir_bind(k, v->cur, AP_DT_BOOL, "jok", ap_kir_binary(k, AP_KIR_LT, j, ap_kir_idx(k, p->S)));
	jc = ap_kir_bind(k, v->cur, k->index_type, "jc", ap_kir_binary(k, AP_KIR_MIN, j, ap_kir_idx(k, p->S - 1)));
	load_row(c, kr, p->k, hk, jc, E);
	load_row(c, vr, p->v, hk, jc, Ev);
	zero(c, dk, E);
	zero(c, dv, Ev);
	/* causal: the first query tile holding a row >= j0 */
	qstart = p->causal ? ap_kir_bind(k, v->cur, k->index_type, "qs0",
					 ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, j0, ap_kir_idx(k, T)), T))
			   : ap_kir_idx(k, 0);
	gv = ap_v_loop(v, "g", ap_kir_idx(k, 0), ap_kir_idx(k, p->G), 1, &gs);
	{
		ap_kir_expr *h = ap_kir_bind(k, v->cur, k->index_type, "h",
					     ap_kir_add(k, ap_kir_muli(k, hk, p->G), ap_kir_ref(k, gv)));

		i0 = ap_v_loop(v, "i0", qstart, ap_kir_idx(k, p->L), T, &is);
		{
			ap_kir_expr *ir = ap_kir_bind(k, v->cur, k->index_type, "ir", ap_kir_add(k, ap_kir_ref(k, i0), c->tid));
			ap_kir_expr *irc = ap_kir_bind(k, v->cur, k->index_type, "irc",
						       ap_kir_binary(k, AP_KIR_MIN, ir, ap_kir_idx(k, p->L - 1)));
			ap_kir_block *es;
			ap_kir_var *e;

			/* the query tile: this thread's row into shared memory */
			ap_kir_barrier(k, v->cur);
			e = ap_v_loop(v, "e", ap_kir_idx(k, 0), ap_kir_idx(k, E), 1, &es);
			ap_kir_store(k, v->cur, sh, ap_kir_add(k, ap_kir_addi(k, ap_kir_muli(k, c->tid, E), oq), ap_kir_ref(k, e)),
				     ld(c, p->q, h, irc, ap_kir_ref(k, e)));
			ap_v_close(v, es);
			e = ap_v_loop(v, "e", ap_kir_idx(k, 0), ap_kir_idx(k, Ev), 1, &es);
			ap_kir_store(k, v->cur, sh, ap_kir_add(k, ap_kir_addi(k, ap_kir_muli(k, c->tid, Ev), od), ap_kir_ref(k, e)),
				     ld(c, p->dy, h, irc, ap_kir_ref(k, e)));
			ap_v_close(v, es);
			ap_kir_store(k, v->cur, sh, ap_kir_addi(k, c->tid, ol), ld(c, p->lse, h, irc, NULL));
			ap_kir_store(k, v->cur, sh, ap_kir_addi(k, c->tid, oD), delta(c, h, irc));
			ap_kir_barrier(k, v->cur);
			rr = ap_v_loop(v, "r", ap_kir_idx(k, 0), ap_kir_idx(k, T), 1, &rs);
			{
				ap_kir_expr *i = ap_kir_bind(k, v->cur, k->index_type, "i", ap_kir_add(k, ap_kir_ref(k, i0), ap_kir_ref(k, rr)));
				ap_kir_expr *qb = ap_kir_bind(k, v->cur, k->index_type, "qb", ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, rr), E), oq));
				ap_kir_expr *db = ap_kir_bind(k, v->cur, k->index_type, "db", ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, rr), Ev), od));
				ap_kir_expr *pv, *dp, *dsv;

				ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, valid, ap_kir_binary(k, AP_KIR_LT, i, ap_kir_idx(k, p->L))),
					&s2, NULL);
				pv = prob(c, dotp(c, sh, qb, kr, E), h, i, j,
					  ap_kir_load(k, sh, ap_kir_addi(k, ap_kir_ref(k, rr), ol)));
				dp = dotp(c, sh, db, vr, Ev);
				dsv = ap_kir_bind(k, v->cur, c->A, "ds",
						  ap_kir_binary(k, AP_KIR_MUL, pv,
								ap_kir_binary(k, AP_KIR_SUB, dp,
									      ap_kir_load(k, sh, ap_kir_addi(k, ap_kir_ref(k, rr), oD)))));
				axpy(c, dv, pv, sh, db, Ev);
				axpy(c, dk, dsv, sh, qb, E);
				ap_v_close(v, s2);
			}
			ap_v_close(v, rs);
		}
		ap_v_close(v, is);
	}
	ap_v_close(v, gs);
	ap_v_if(v, valid, &s2, NULL);
	store_row(c, p->dk, dk, c->scale, hk, j, E);
	store_row(c, p->dv, dv, NULL, hk, j, Ev);
	ap_v_close(v, s2);
}

/* The query sweep of tile `tile` (< nb * H * query blocks): the thread's
 * row i of head h; dQ_i over the key tiles of T keys that row sees,
 * staged in shared memory (ks: K rows, vs: V rows). */
static void query_sweep(agc *c, ap_kir_expr *tile, ap_kir_array *sh)
{
	const ag_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int T = c->T;
	int64_t qblocks = (p->L + T - 1) / T, E = p->E, Ev = p->Ev, ov = (int64_t)T * E;
	ap_kir_expr *bh, *h, *hk, *i0, *i, *ic, *valid, *kend, *lse, *D;
	ap_kir_array *qr = ap_kir_local(k, "qr", c->A, E), *dyr = ap_kir_local(k, "dyr", c->A, Ev);
	ap_kir_array *dq = ap_kir_local(k, "dq", c->A, E);
	ap_kir_block *js, *cs, *s2, *es;
	ap_kir_var *j0, *cc, *e;

	bh = ap_kir_bind(k, v->cur, k->index_type, "bh", ap_kir_binary(k, AP_KIR_DIV, tile, ap_kir_idx(k, qblocks)));
	i0 = ap_kir_bind(k, v->cur, k->index_type, "i0",
			 ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, tile, ap_kir_idx(k, qblocks)), T));
	h = ap_kir_bind(k, v->cur, k->index_type, "h", ap_kir_binary(k, AP_KIR_REM, bh, ap_kir_idx(k, p->H)));
	hk = ap_kir_bind(k, v->cur, k->index_type, "hk", ap_kir_binary(k, AP_KIR_DIV, h, ap_kir_idx(k, p->G)));
	batch_coords(c, ap_kir_binary(k, AP_KIR_DIV, bh, ap_kir_idx(k, p->H)));
	i = ap_kir_bind(k, v->cur, k->index_type, "i", ap_kir_add(k, i0, c->tid));
	valid = ap_kir_bind(k, v->cur, AP_DT_BOOL, "iok", ap_kir_binary(k, AP_KIR_LT, i, ap_kir_idx(k, p->L)));
	ic = ap_kir_bind(k, v->cur, k->index_type, "ic", ap_kir_binary(k, AP_KIR_MIN, i, ap_kir_idx(k, p->L - 1)));
	load_row(c, qr, p->q, h, ic, E);
	load_row(c, dyr, p->dy, h, ic, Ev);
	zero(c, dq, E);
	lse = ap_kir_bind(k, v->cur, c->A, "lse", ld(c, p->lse, h, ic, NULL));
	D = ap_kir_bind(k, v->cur, c->A, "Dd", delta(c, h, ic));
	/* causal: keys up to the tile's last row */
	kend = p->causal ? ap_kir_bind(k, v->cur, k->index_type, "ke",
				       ap_kir_binary(k, AP_KIR_MIN, ap_kir_addi(k, i0, T), ap_kir_idx(k, p->S)))
			 : ap_kir_idx(k, p->S);
	j0 = ap_v_loop(v, "j0", ap_kir_idx(k, 0), kend, T, &js);
	{
		ap_kir_expr *jr = ap_kir_bind(k, v->cur, k->index_type, "jr", ap_kir_add(k, ap_kir_ref(k, j0), c->tid));
		ap_kir_expr *jrc = ap_kir_bind(k, v->cur, k->index_type, "jrc",
					       ap_kir_binary(k, AP_KIR_MIN, jr, ap_kir_idx(k, p->S - 1)));

		ap_kir_barrier(k, v->cur);
		e = ap_v_loop(v, "e", ap_kir_idx(k, 0), ap_kir_idx(k, E), 1, &es);
		ap_kir_store(k, v->cur, sh, ap_kir_add(k, ap_kir_muli(k, c->tid, E), ap_kir_ref(k, e)),
			     ld(c, p->k, hk, jrc, ap_kir_ref(k, e)));
		ap_v_close(v, es);
		e = ap_v_loop(v, "e", ap_kir_idx(k, 0), ap_kir_idx(k, Ev), 1, &es);
		ap_kir_store(k, v->cur, sh, ap_kir_add(k, ap_kir_addi(k, ap_kir_muli(k, c->tid, Ev), ov), ap_kir_ref(k, e)),
			     ld(c, p->v, hk, jrc, ap_kir_ref(k, e)));
		ap_v_close(v, es);
		ap_kir_barrier(k, v->cur);
		cc = ap_v_loop(v, "c", ap_kir_idx(k, 0), ap_kir_idx(k, T), 1, &cs);
		{
			ap_kir_expr *j = ap_kir_bind(k, v->cur, k->index_type, "j", ap_kir_add(k, ap_kir_ref(k, j0), ap_kir_ref(k, cc)));
			ap_kir_expr *kb = ap_kir_bind(k, v->cur, k->index_type, "kb", ap_kir_muli(k, ap_kir_ref(k, cc), E));
			ap_kir_expr *vb = ap_kir_bind(k, v->cur, k->index_type, "vb", ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, cc), Ev), ov));
			ap_kir_expr *pv, *dp, *dsv;

			ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, valid, ap_kir_binary(k, AP_KIR_LT, j, ap_kir_idx(k, p->S))), &s2, NULL);
			pv = prob(c, dotp(c, sh, kb, qr, E), h, i, j, lse);
			dp = dotp(c, sh, vb, dyr, Ev);
			dsv = ap_kir_bind(k, v->cur, c->A, "ds",
					  ap_kir_binary(k, AP_KIR_MUL, pv, ap_kir_binary(k, AP_KIR_SUB, dp, D)));
			axpy(c, dq, dsv, sh, kb, E);
			ap_v_close(v, s2);
		}
		ap_v_close(v, cs);
	}
	ap_v_close(v, js);
	ap_v_if(v, valid, &s2, NULL);
	store_row(c, p->dq, dq, c->scale, h, i, E);
	ap_v_close(v, s2);
}

/* The whole kernel: a grid-stride loop over the key sweep's tiles, then
 * the query sweep's (each block's branch uniform, so the barriers inside
 * are reached by all its threads). */
static int ag_emit(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_kir_kernel *k,
		   ap_error *err)
{
	ag_plan p;
	agc c;
	ap_vctx v;
	int rc, T = s->v[0];
	int64_t nk, nq;
	unsigned grid;
	ap_kir_array *sh;
	ap_kir_var *tile;
	ap_kir_block *saved, *s2;
	ap_kir_stmt *br;

	if (!analyze(m, &p))
		return ap_error_set(err, AP_EUNSUPPORTED, m->g->nodes[m->root].name, NULL,
				    "attention backward emitter: not one AttentionGrad node");
	if (T < 32 || (unsigned)T > ap_block_cap(t) || ag_smem(&p, T) > t->shared_per_block)
		return ap_error_set(err, AP_EUNSUPPORTED, m->g->nodes[p.node].name, NULL,
				    "attention backward emitter: %d threads (head dims %lld, %lld) do not fit a block",
				    T, (long long)p.E, (long long)p.Ev);
	if ((rc = ap_vctx_init(&v, m, k, err)))
		return rc;
	memset(&c, 0, sizeof(c));
	c.p = &p;
	c.v = &v;
	c.k = k;
	c.A = p.acc;
	c.T = T;
	nk = p.nb * p.Hk * ((p.S + T - 1) / T);
	nq = p.nb * p.H * ((p.L + T - 1) / T);
	grid = ap_grid_for(nk + nq, 1);
	k->block[0] = (unsigned)T;
	k->grid[0] = grid;
	sh = ap_kir_shared(k, "sh", c.A, (int64_t)(ag_smem(&p, T) / ap_dtype_size(c.A)));
	c.tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	c.scale = ap_kir_float(k, c.A, p.scale);
	tile = ap_v_loop(&v, "tile", ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_idx(k, nk + nq), grid, &saved);
	ap_v_if(&v, ap_kir_binary(k, AP_KIR_LT, ap_kir_ref(k, tile), ap_kir_idx(k, nk)), &s2, &br);
	ap_kir_comment(k, v.cur, "key sweep: dK and dV of T keys");
	key_sweep(&c, ap_kir_ref(k, tile), sh);
	ap_v_else(&v, br);
	ap_kir_comment(k, v.cur, "query sweep: dQ of T query rows");
	query_sweep(&c, ap_kir_binary(k, AP_KIR_SUB, ap_kir_ref(k, tile), ap_kir_idx(k, nk)), sh);
	ap_v_close(&v, s2);
	ap_kir_barrier(k, v.cur);
	ap_v_close(&v, saved);
	rc = v.rc;
	if (!rc && ap_kir_failed(k))
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering the attention backward");
	ap_vctx_clear(&v);
	return rc;
}

/* Bytes: every input and output once.  Arithmetic: the key sweep's
 * q.k, dY.v, dV and dK updates and the query sweep's q.k, dY.v and dQ
 * update per (query, key) pair seen (about half of them when causal). */
static int ag_traffic(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_traffic *out)
{
	ag_plan p;
	double pairs;

	(void)t;
	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(m, out) < 0)
		return AP_ENOMEM;
	if (!analyze(m, &p))
		return 0;
	pairs = (double)p.nb * (double)p.H * (double)p.L * (double)p.S * (p.causal ? 0.5 : 1.0);
	out->flops = pairs * 2.0 * (double)(4 * p.E + 3 * p.Ev);
	out->threads = (unsigned)s->v[0];
	out->blocks = ap_grid_for(p.nb * p.Hk * ((p.S + s->v[0] - 1) / s->v[0]) +
				  p.nb * p.H * ((p.L + s->v[0] - 1) / s->v[0]), 1);
	out->shared_bytes = (unsigned)ag_smem(&p, s->v[0]);
	return 0;
}

const ap_emitter ap_emitter_attention_grad = {
	"attention_grad", ag_match, ag_space, ag_choose, ag_emit, ag_traffic, ag_valid, false, NULL,
};
