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
 * (barriers emulated).  That is the SIMT form (knob "threads": keys of a
 * key block, rows of a query block, and the tile each stages), for
 * float32 and float64, for every dtype on the host and before sm_80.
 * float16 and bfloat16 on sm_80 and later take the tensor-core form (the
 * comment above tc_sweep; knobs "warps" and "tile"): the same two sweeps
 * with 16 held rows a warp on mma.sync, ldmatrix and cp.async.
 */
#include "emitters.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
	/* the tensor-core form (16-bit operands on sm_80 and later, head dims
	 * up to TC_HEAD_MAX): its mma.sync kind and, per operand Q, K, V, dY
	 * (AG_Q ...), the cp.async width (0: staged through registers) with
	 * the operand as a view of its buffer */
	bool tc;
	ap_kir_mma_kind mma;
	int aw[4], leaf[4];
	ap_sview sv[4];
} ag_plan;

enum { AG_Q, AG_K, AG_V, AG_DY };

#define TC_HEAD_MAX 128             /* tensor cores: the longest head dim (fragments in registers) */
#define TC_PAD 8                    /* elements padding a shared row (16 bytes: ldmatrix's eight
				       rows fall in distinct banks) */

static bool written(const ap_graph *g, int x)
{
	for (int i = 0; x >= 0 && i < g->n_outputs; i++)
		if (g->outputs[i] == x)
			return true;
	return false;
}

/* m as one AttentionGrad node (its group: an opaque op alone), and the
 * form target t takes (t NULL: the SIMT form).  1 with p filled, 0 when
 * not. */
static int analyze(const ap_mgraph *m, const ap_target_info *t, ag_plan *p)
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
	p->tc = t && t->gpu && t->arch >= 80 && (p->t == AP_DT_F16 || p->t == AP_DT_BF16) &&
		k->dtype == p->t && v->dtype == p->t && g->tensors[p->dy].dtype == p->t &&
		p->E <= TC_HEAD_MAX && p->Ev <= TC_HEAD_MAX;
	if (p->tc) {
		const int ops[4] = {p->q, p->k, p->v, p->dy};

		p->mma = p->t == AP_DT_BF16 ? AP_KIR_MMA_BF16_16816 : AP_KIR_MMA_F16_16816;
		for (int i = 0; i < 4; i++)
			p->aw[i] = ap_sview_copy_width(g, ops[i], false, &p->sv[i], &p->leaf[i]);
	}
	/* the rows live in registers, their loops unrolled: head dims up to
	 * HEAD_MAX (longer ones get no kernel: AttentionGrad is unsupported) */
	return p->L > 0 && p->S > 0 && p->E > 0 && p->Ev > 0 && p->nb > 0 && p->E <= HEAD_MAX &&
	       p->Ev <= HEAD_MAX;
}

/* The analysis of one AttentionGrad node, kept for the binding. */
static int ag_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	ag_plan *p = malloc(sizeof(*p));

	if (!p)
		return AP_ENOMEM;
	if (!analyze(m, t, p)) {
		free(p);
		return 0;
	}
	*an = p;
	return 1;
}

/* Shared bytes of a block of T threads: the larger of the key sweep's
 * query tile (Q, dY rows, LogSumExp, D) and the query sweep's key tile
 * (K, V rows). */
static size_t ag_smem(const ag_plan *p, int T)
{
	int64_t a = (int64_t)T * (p->E + p->Ev + 2), b = (int64_t)T * (p->E + p->Ev);

	return (size_t)(a > b ? a : b) * ap_dtype_size(p->acc);
}

/* Tensor-core tiles: head dims padded to 16 (the k step of m16n8k16 and
 * two n8 tiles), shared rows padded by TC_PAD, the held rows' staging
 * row as long as the longer of the two. */
static int64_t tc_pad16(int64_t d)
{
	return (d + 15) / 16 * 16;
}

/* Stages of the streamed tiles: two (the next tile's copies in flight
 * during this one's products) when all four operands go by cp.async. */
static int tc_stages(const ag_plan *p)
{
	return p->aw[AG_Q] && p->aw[AG_K] && p->aw[AG_V] && p->aw[AG_DY] ? 2 : 1;
}

/* Shared bytes of W warps (16 held rows each) and streamed tiles of BT
 * rows: the held rows' staging tile, NST stages of the two streamed
 * operands, and the key sweep's per-query statistics (float32). */
static size_t tc_smem(const ag_plan *p, int W, int BT)
{
	int64_t ld1 = tc_pad16(p->E) + TC_PAD, ld2 = tc_pad16(p->Ev) + TC_PAD, ldh = ld1 > ld2 ? ld1 : ld2;
	int nst = tc_stages(p);

	return (size_t)(16 * W * ldh + nst * BT * (ld1 + ld2)) * ap_dtype_size(p->t) + (size_t)nst * 2 * BT * 4;
}

static bool tc_fits(const ag_plan *p, const ap_target_info *t, int W, int BT)
{
	return W >= 1 && (unsigned)W * 32u <= ap_block_cap(t) && BT >= 16 && BT % 16 == 0 &&
	       tc_smem(p, W, BT) <= t->shared_per_block;
}

/* Rows a block holds: threads (SIMT) or 16 a warp (tensor cores). */
static int held_rows(const ag_plan *p, const ap_sched *s)
{
	return p->tc ? 16 * s->v[0] : s->v[0];
}

/* SIMT: "threads".  Tensor cores: "warps" (16 held keys or query rows
 * each) and "tile" (rows of the streamed tiles). */
static int ag_space(const ap_bound *b, ap_space *sp)
{
	const ap_target_info *t = b->t;
	bool tc = ((const ag_plan *)b->an)->tc;

	sp->n = 1;
	if (tc) {
		ap_knob_pow2(&sp->knobs[0], "warps", 1, 8);
		while (sp->knobs[0].n > 1 && (unsigned)sp->knobs[0].values[sp->knobs[0].n - 1] * 32u > ap_block_cap(t))
			sp->knobs[0].n--;
		sp->n = 2;
		ap_knob_pow2(&sp->knobs[1], "tile", 16, 64);
		return 0;
	}
	ap_knob_pow2(&sp->knobs[0], "threads", 32, 256);
	while (sp->knobs[0].n > 1 && (unsigned)sp->knobs[0].values[sp->knobs[0].n - 1] > ap_block_cap(t))
		sp->knobs[0].n--;
	return 0;
}

/* A configuration resolved: threads (SIMT) or warps and the streamed
 * tile's rows (tensor cores), the rows a block holds, the key sweep's
 * and the query sweep's blocks, and the launch ag_traffic models. */
typedef struct ag_res {
	int t, bt;                      /* threads or warps; tile rows (tensor cores) */
	int held;                       /* rows a block holds (held_rows) */
	int64_t nk, nq;                 /* blocks of the key sweep, of the query sweep */
	unsigned threads, blocks, smem;
} ag_res;

_Static_assert(sizeof(ag_res) <= AP_PLAN_BYTES, "the attention backward plan fits ap_plan");

static int ag_resolve(const ap_bound *b, const ap_sched *s, ap_plan *out)
{
	const ag_plan *p = b->an;
	const ap_target_info *t = b->t;
	ag_res *r = (ag_res *)out->x;

	r->t = s->v[0];
	r->bt = p->tc ? s->v[1] : 0;
	r->held = held_rows(p, s);
	r->nk = p->nb * p->Hk * ((p->S + r->held - 1) / r->held);
	r->nq = p->nb * p->H * ((p->L + r->held - 1) / r->held);
	r->threads = p->tc ? 32u * (unsigned)r->t : (unsigned)r->t;
	r->blocks = ap_grid_for(r->nk + r->nq, 1);
	r->smem = (unsigned)(p->tc ? tc_smem(p, r->t, r->bt) : ag_smem(p, r->t));
	if (p->tc)
		return tc_fits(p, t, r->t, r->bt);
	return r->t >= 32 && (unsigned)r->t <= ap_block_cap(t) && ag_smem(p, r->t) <= t->shared_per_block;
}

/* SIMT: 64 threads, fewer while the tiles do not fit in shared memory.
 * Tensor cores: 4 warps (64 held rows), fewer while the grid leaves SMs
 * idle or the tiles do not fit; tiles of 64 streamed rows (32 past head
 * dim 64: the score, dP and gradient fragments share the registers), 16
 * for short sequences. */
static int ag_choose(const ap_bound *b, const ap_space *sp, ap_sched *s)
{
	const ag_plan *p = b->an;
	const ap_target_info *t = b->t;
	int T = 64, W = 4, BT;

	(void)sp;
	if (!p->tc) {
		while (T > 32 && p->E > 0 && ag_smem(p, T) > t->shared_per_block)
			T /= 2;
		s->v[0] = T;
		return 0;
	}
	while (W > 1 && (unsigned)W * 32u > ap_block_cap(t))
		W /= 2;
	while (W > 1 && p->nb * (p->Hk * ((p->S + 16 * W - 1) / (16 * W)) + p->H * ((p->L + 16 * W - 1) / (16 * W))) <
			(int64_t)t->sm_count)
		W /= 2;
	BT = p->E > 64 || p->Ev > 64 ? 32 : 64;
	while (BT > 16 && BT / 2 >= (p->L > p->S ? p->L : p->S))
		BT /= 2;
	while (W > 1 && !tc_fits(p, t, W, BT))
		W /= 2;
	while (BT > 16 && !tc_fits(p, t, W, BT))
		BT /= 2;
	s->v[0] = W;
	s->v[1] = BT;
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

/* ---- the tensor-core form ---------------------------------------------------------------
 *
 * FlashAttention-2's backward (Dao 2023, algorithm 2) on mma.sync
 * m16n8k16, laid out as the SIMT form's two sweeps so that each output is
 * still written once: a block holds 16 * W rows (16 a warp) and streams
 * the other side's rows in tiles of BT through shared memory.
 *   key sweep    holds keys (K and V as A fragments, ldmatrix .x4) and
 *                streams query tiles (Q, dY, and each query's LogSumExp
 *                and D = dY . Y, computed while staging):
 *                  S^T  = K Q^T, dP^T = V dY^T   (B: the tiles' rows, ldmatrix .x2)
 *                  P^T, dS^T = P^T (dP^T - D)     per element, float32
 *                  dV  += P^T dY, dK += dS^T Q    (A: P^T and dS^T from the C
 *                                                  fragments; B: ldmatrix .x2 .trans)
 *   query sweep  holds query rows (Q and dY) and streams key tiles (K, V):
 *                  S = Q K^T, dP = dY V^T, dS = P (dP - D), dQ += dS K.
 * The score and dP fragments of two n8 tiles are, element for element,
 * the A fragment of one k16 step (the m16n8k16 C and A layouts, kir.h),
 * so P and dS go to 16-bit registers without shared memory, rounded to
 * the operand type as FlashAttention-2 rounds them.  With all four
 * operands copied by cp.async the streamed tiles have two stages (the
 * next tile's copies issued before this tile's products).  A key sweep
 * over grouped-query heads runs the query tiles of its G heads as one
 * sequence of tiles; causal: it starts at the query tile holding its
 * first key, and a query sweep stops after the key tile holding its last
 * row's diagonal. */

typedef struct agt {
	agc *c;
	ap_dtype T;                     /* the operand type (accumulators: float32) */
	int W, BH, BT, NST, NS;         /* warps; held rows; streamed rows; stages; n8 tiles of BT */
	int AF, BF, CF;                 /* elements of the A, B and C fragments a lane */
	int64_t Ep, Evp, ld1, ld2, ldh; /* padded head dims; shared rows of the two streamed operands and the held */
	ap_kir_array *hs, *r1s, *r2s, *sts;     /* shared: held staging, streamed tiles, key sweep statistics */
	ap_kir_array *xf, *yf, *bfr;            /* registers: held A fragments (K or Q; V or dY), a B fragment */
	ap_kir_array *sacc, *dpacc, *pf, *dsf;  /* registers: S and dP (C), P and dS (A) */
	ap_kir_array *acc1, *acc2;              /* registers: dK or dQ, dV (C) */
	ap_mma_lanes ln;                /* the thread's place in the fragment layouts */
	/* the sweep */
	bool keys;                      /* a key sweep (else a query sweep) */
	ap_kir_expr *hrow0;             /* the lane's first held row (the warp's row g) */
	ap_kir_expr *lse[2], *D[2];     /* query sweep: rows g and g + 8's statistics */
	ap_kir_expr *hq, *hk;           /* query sweep: the query head; both: the key/value head */
	ap_kir_expr *first, *per;       /* key sweep: the first query tile, tiles a query head */
} agt;

/* Streamed tile u of the sweep: its query head *h and first row *t0 (a
 * key sweep runs per query tiles of each of its G heads in turn). */
static void tc_tile_of(agt *s, ap_kir_expr *u, ap_kir_expr **h, ap_kir_expr **t0)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;

	if (!s->keys) {
		*h = s->hq;
		*t0 = ap_kir_bind(k, v->cur, k->index_type, "t0", ap_kir_muli(k, u, s->BT));
		return;
	}
	*h = ap_kir_bind(k, v->cur, k->index_type, "h",
			 ap_kir_add(k, ap_kir_muli(k, s->hk, s->c->p->G), ap_kir_binary(k, AP_KIR_DIV, u, s->per)));
	*t0 = ap_kir_bind(k, v->cur, k->index_type, "t0",
			  ap_kir_muli(k, ap_kir_add(k, s->first, ap_kir_binary(k, AP_KIR_REM, u, s->per)), s->BT));
}

/* Stages rows [r0, r0 + n) of operand `op` (AG_Q ...) at head h into the
 * shared array arr (row r at base + r * ld, `cols` elements), the block's
 * threads striding over it; zero past row rows_ok and past the head dim.
 * By cp.async (p->aw[op] elements a copy; the caller commits and waits)
 * when the plan says so, else through registers. */
static void tc_stage(agt *s, ap_kir_array *arr, ap_kir_expr *base, int op, ap_kir_expr *h, ap_kir_expr *r0,
		     int n, int64_t cols, int64_t ld, int64_t rows_ok)
{
	agc *c = s->c;
	const ag_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const int x = op == AG_Q ? p->q : op == AG_K ? p->k : op == AG_V ? p->v : p->dy;
	const int64_t cols_ok = op == AG_Q || op == AG_K ? p->E : p->Ev;
	int w = p->aw[op] ? p->aw[op] : 1;
	ap_kir_block *saved, *s2;
	ap_kir_var *e = ap_v_loop(v, "e", c->tid, ap_kir_idx(k, n * cols / w), ap_kir_block_threads(k), &saved);
	ap_kir_expr *r = ap_kir_bind(k, v->cur, k->index_type, "sr", ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, e), ap_kir_idx(k, cols / w)));
	ap_kir_expr *j = ap_kir_bind(k, v->cur, k->index_type, "sc",
				     ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, e), ap_kir_idx(k, cols / w)), w));
	ap_kir_expr *gr = ap_kir_bind(k, v->cur, k->index_type, "gr", ap_kir_add(k, r0, r));
	ap_kir_expr *ok = ap_kir_binary(k, AP_KIR_LT, gr, ap_kir_idx(k, rows_ok));
	ap_kir_expr *at = ap_kir_add(k, base, ap_kir_add(k, ap_kir_muli(k, r, ld), j));
	ap_kir_var *val;
	ap_lidx ix;

	if (cols_ok < cols)
		ok = ap_kir_binary(k, AP_KIR_LAND, ok, ap_kir_binary(k, AP_KIR_LT, j, ap_kir_idx(k, cols_ok)));
	ix = at4(c, x, h, gr, j);
	if (p->aw[op]) {
		ap_kir_cp_async(k, v->cur, arr, at, ap_v_buffer(v, p->leaf[op]), ap_sview_offset(k, &p->sv[op], &ix), w, ok);
		ap_v_close(v, saved);
		return;
	}
	val = ap_kir_var_new(k, s->T, "x");
	ap_kir_let(k, v->cur, val, ap_kir_float(k, s->T, 0));
	ap_v_if(v, ok, &s2, NULL);
	ap_kir_assign(k, v->cur, val, ap_kir_cast(k, s->T, ap_val(v, x, &ix)));
	ap_v_close(v, s2);
	ap_kir_store(k, v->cur, arr, at, ap_kir_ref(k, val));
	ap_v_close(v, saved);
}

/* The block's held rows [r0, r0 + BH) of operand `op` (cols: its padded
 * head dim) at head h into the staging tile, then the warp's 16 as A
 * fragments `dst` (ldmatrix .x4 a k16 step: matrix j = lane / 8 holds
 * rows (j % 2) * 8.., k (j / 2) * 8..). */
static void tc_hold(agt *s, ap_kir_array *dst, int op, ap_kir_expr *h, ap_kir_expr *r0, int64_t cols, int64_t rows_ok)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;
	ap_kir_block *saved;
	ap_kir_var *kk;

	ap_kir_barrier(k, v->cur);
	tc_stage(s, s->hs, ap_kir_idx(k, 0), op, h, r0, s->BH, cols, s->ldh, rows_ok);
	if (s->c->p->aw[op]) {
		ap_kir_cp_commit(k, v->cur);
		ap_kir_cp_wait(k, v->cur, 0);
	}
	ap_kir_barrier(k, v->cur);
	kk = ap_v_loop_unrolled(v, "kh", cols / 16, &saved);
	ap_kir_ldmatrix(k, v->cur, dst, ap_kir_muli(k, ap_kir_ref(k, kk), s->AF), s->hs,
			ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, s->ln.warp, 16), s->ln.l16), s->ldh),
				   ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, kk), 16), ap_kir_muli(k, s->ln.hi, 8))),
			4, false);
	ap_v_close(v, saved);
}

/* arr[0 .. n) = 0, unrolled. */
static void tc_zero(agt *s, ap_kir_array *arr, int64_t n)
{
	ap_kir_block *saved;
	ap_kir_var *i = ap_v_loop_unrolled(s->c->v, "z", n, &saved);

	ap_kir_store(s->c->k, s->c->v->cur, arr, ap_kir_ref(s->c->k, i), ap_kir_float(s->c->k, AP_DT_F32, 0));
	ap_v_close(s->c->v, saved);
}

/* The streamed tile starting at row t0 (head h of the queries, hk of the
 * keys) into stage st: the key sweep's Q and dY rows and, a query a
 * thread, its LogSumExp and D (0 past the last query); the query sweep's
 * K and V rows. */
static void tc_stage_tile(agt *s, ap_kir_expr *st, ap_kir_expr *h, ap_kir_expr *hk, ap_kir_expr *t0)
{
	agc *c = s->c;
	const ag_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *b1 = ap_kir_muli(k, st, s->BT * s->ld1), *b2 = ap_kir_muli(k, st, s->BT * s->ld2);
	ap_kir_block *saved, *s2;
	ap_kir_var *rr;

	if (!s->keys) {
		tc_stage(s, s->r1s, b1, AG_K, hk, t0, s->BT, s->Ep, s->ld1, p->S);
		tc_stage(s, s->r2s, b2, AG_V, hk, t0, s->BT, s->Evp, s->ld2, p->S);
		return;
	}
	tc_stage(s, s->r1s, b1, AG_Q, h, t0, s->BT, s->Ep, s->ld1, p->L);
	tc_stage(s, s->r2s, b2, AG_DY, h, t0, s->BT, s->Evp, s->ld2, p->L);
	rr = ap_v_loop(v, "qr", c->tid, ap_kir_idx(k, s->BT), ap_kir_block_threads(k), &saved);
	{
		ap_kir_expr *i = ap_kir_bind(k, v->cur, k->index_type, "qi", ap_kir_add(k, t0, ap_kir_ref(k, rr)));
		ap_kir_expr *at = ap_kir_bind(k, v->cur, k->index_type, "qa",
					      ap_kir_add(k, ap_kir_muli(k, st, 2 * s->BT), ap_kir_ref(k, rr)));
		ap_kir_stmt *br;

		ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, i, ap_kir_idx(k, p->L)), &s2, &br);
		ap_kir_store(k, v->cur, s->sts, at, ld(c, p->lse, h, i, NULL));
		ap_kir_store(k, v->cur, s->sts, ap_kir_addi(k, at, s->BT), delta(c, h, i));
		ap_v_else(v, br);
		ap_kir_store(k, v->cur, s->sts, at, ap_kir_float(k, AP_DT_F32, 0));
		ap_kir_store(k, v->cur, s->sts, ap_kir_addi(k, at, s->BT), ap_kir_float(k, AP_DT_F32, 0));
		ap_v_close(v, s2);
	}
	ap_v_close(v, saved);
}

/* acc (NS n8 tiles of float32 C fragments) += the held A fragments af
 * (nk k16 steps) times the streamed tile's rows as B's columns (rows
 * base.. of `tile`, ldmatrix .x2: matrix j2 holds k j2 * 8..). */
static void tc_product(agt *s, ap_kir_array *acc, ap_kir_array *af, ap_kir_array *tile, ap_kir_expr *base,
		       int64_t ld, int64_t nk)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;
	ap_kir_block *saved, *s2;
	ap_kir_var *kk = ap_v_loop_unrolled(v, "kk", nk, &saved);
	ap_kir_var *ni = ap_v_loop_unrolled(v, "ni", s->NS, &s2);
	ap_kir_expr *ci = ap_kir_muli(k, ap_kir_ref(k, ni), 4);

	ap_kir_ldmatrix(k, v->cur, s->bfr, ap_kir_idx(k, 0), tile,
			ap_kir_add(k, base,
				   ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, ni), 8), s->ln.l8), ld),
					      ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, kk), 16), ap_kir_muli(k, s->ln.j2, 8)))),
			2, false);
	ap_kir_mma(k, v->cur, s->c->p->mma, acc, ci, af, ap_kir_muli(k, ap_kir_ref(k, kk), s->AF), s->bfr,
		   ap_kir_idx(k, 0), acc, ci);
	ap_v_close(v, s2);
	ap_v_close(v, saved);
}

/* acc (nn n8 tiles) += af (the tile's BT / 16 k16 steps of P or dS) times
 * the streamed tile's rows along k (ldmatrix .x2 .trans). */
static void tc_accumulate(agt *s, ap_kir_array *acc, ap_kir_array *af, ap_kir_array *tile, ap_kir_expr *base,
			  int64_t ld, int64_t nn)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;
	ap_kir_block *saved, *s2;
	ap_kir_var *j = ap_v_loop_unrolled(v, "kj", s->BT / 16, &saved);
	ap_kir_var *no = ap_v_loop_unrolled(v, "no", nn, &s2);
	ap_kir_expr *ci = ap_kir_muli(k, ap_kir_ref(k, no), 4);

	ap_kir_ldmatrix(k, v->cur, s->bfr, ap_kir_idx(k, 0), tile,
			ap_kir_add(k, base,
				   ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, j), 16),
									   ap_kir_add(k, ap_kir_muli(k, s->ln.j2, 8), s->ln.l8)), ld),
					      ap_kir_muli(k, ap_kir_ref(k, no), 8))),
			2, true);
	ap_kir_mma(k, v->cur, s->c->p->mma, acc, ci, af, ap_kir_muli(k, ap_kir_ref(k, j), s->AF), s->bfr,
		   ap_kir_idx(k, 0), acc, ci);
	ap_v_close(v, s2);
	ap_v_close(v, saved);
}

/* One streamed tile (rows t0.., stage st; query head h): the two
 * products, P and dS on each element a lane holds (element e of n8 tile
 * ni: held row hrow0 + g + 8 (e / 2), streamed row t0 + 8 ni + 2 tq +
 * e % 2; P = 0 past the last query or key), and the gradient products. */
static void tc_tile(agt *s, ap_kir_expr *st, ap_kir_expr *h, ap_kir_expr *t0)
{
	agc *c = s->c;
	const ag_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *b1 = ap_kir_bind(k, v->cur, k->index_type, "b1", ap_kir_muli(k, st, s->BT * s->ld1));
	ap_kir_expr *b2 = ap_kir_bind(k, v->cur, k->index_type, "b2", ap_kir_muli(k, st, s->BT * s->ld2));
	ap_kir_expr *bs = ap_kir_bind(k, v->cur, k->index_type, "bs", ap_kir_muli(k, st, 2 * s->BT));
	ap_kir_block *saved;
	ap_kir_var *ni;

	tc_zero(s, s->sacc, s->NS * 4);
	tc_zero(s, s->dpacc, s->NS * 4);
	tc_product(s, s->sacc, s->xf, s->r1s, b1, s->ld1, s->Ep / 16);
	tc_product(s, s->dpacc, s->yf, s->r2s, b2, s->ld2, s->Evp / 16);
	ni = ap_v_loop_unrolled(v, "ni", s->NS, &saved);
	for (int e = 0; e < 4; e++) {
		ap_kir_expr *si = ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), 4), e);
		ap_kir_expr *col = ap_kir_bind(k, v->cur, k->index_type, "cl",
					       ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, ni), 8), ap_kir_addi(k, ap_kir_muli(k, s->ln.tq, 2), e & 1)));
		ap_kir_expr *hr = ap_kir_bind(k, v->cur, k->index_type, "hr", ap_kir_addi(k, s->hrow0, 8 * (e >> 1)));
		ap_kir_expr *sr = ap_kir_bind(k, v->cur, k->index_type, "tr", ap_kir_add(k, t0, col));
		ap_kir_expr *i = s->keys ? sr : hr, *j = s->keys ? hr : sr;
		ap_kir_expr *valid = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_LT, i, ap_kir_idx(k, p->L)),
						   ap_kir_binary(k, AP_KIR_LT, j, ap_kir_idx(k, p->S)));
		ap_kir_expr *lse = s->keys ? ap_kir_load(k, s->sts, ap_kir_add(k, bs, col)) : s->lse[e >> 1];
		ap_kir_expr *D = s->keys ? ap_kir_load(k, s->sts, ap_kir_add(k, ap_kir_addi(k, bs, s->BT), col)) : s->D[e >> 1];
		ap_kir_expr *pv, *ds;

		/* the mask is read at clamped coordinates; P past the ends is 0 */
		pv = prob(c, ap_kir_load(k, s->sacc, si), h,
			  ap_kir_binary(k, AP_KIR_MIN, i, ap_kir_idx(k, p->L - 1)),
			  ap_kir_binary(k, AP_KIR_MIN, j, ap_kir_idx(k, p->S - 1)), lse);
		pv = ap_kir_bind(k, v->cur, AP_DT_F32, "pp", ap_kir_select(k, valid, pv, ap_kir_float(k, AP_DT_F32, 0)));
		ds = ap_kir_binary(k, AP_KIR_MUL, pv, ap_kir_binary(k, AP_KIR_SUB, ap_kir_load(k, s->dpacc, si), D));
		ap_kir_store(k, v->cur, s->pf, si, ap_kir_cast(k, s->T, pv));
		ap_kir_store(k, v->cur, s->dsf, si, ap_kir_cast(k, s->T, ds));
	}
	ap_v_close(v, saved);
	tc_accumulate(s, s->acc1, s->dsf, s->r1s, b1, s->ld1, s->Ep / 8);
	if (s->keys)
		tc_accumulate(s, s->acc2, s->pf, s->r2s, b2, s->ld2, s->Evp / 8);
}

/* Stores acc (nn n8 tiles over the warp's held rows) times f (NULL: 1)
 * into output x at head h: rows below rows_ok, columns below cols_ok. */
static void tc_store(agt *s, int x, ap_kir_array *acc, int64_t nn, ap_kir_expr *f, ap_kir_expr *h,
		     int64_t rows_ok, int64_t cols_ok)
{
	agc *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved, *s2;
	ap_kir_var *no;

	if (x < 0)
		return;
	no = ap_v_loop_unrolled(v, "no", nn, &saved);
	for (int e = 0; e < 4; e++) {
		ap_kir_expr *row = ap_kir_bind(k, v->cur, k->index_type, "r", ap_kir_addi(k, s->hrow0, 8 * (e >> 1)));
		ap_kir_expr *col = ap_kir_bind(k, v->cur, k->index_type, "col",
					       ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, no), 8), ap_kir_addi(k, ap_kir_muli(k, s->ln.tq, 2), e & 1)));
		ap_kir_expr *val = ap_kir_load(k, acc, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, no), 4), e));
		ap_lidx ix;

		ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_LT, row, ap_kir_idx(k, rows_ok)),
					 ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, cols_ok))), &s2, NULL);
		ix = at4(c, x, h, row, col);
		if (f)
			val = ap_kir_binary(k, AP_KIR_MUL, val, f);
		ap_kir_store(k, v->cur, ap_v_buffer(v, x), ap_lidx_linear(v, &ix), ap_kir_cast(k, v->g->tensors[x].dtype, val));
		ap_v_close(v, s2);
	}
	ap_v_close(v, saved);
}

/* One sweep of block tile `tile` (the comment above): the held rows'
 * fragments, then the streamed tiles (u < n, pipelined over NST
 * stages), then the gradients. */
static void tc_sweep(agt *s, bool keys, ap_kir_expr *tile)
{
	agc *c = s->c;
	const ag_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int64_t held = keys ? p->S : p->L, streamed = keys ? p->L : p->S;
	int64_t blocks = (held + s->BH - 1) / s->BH, nt = (streamed + s->BT - 1) / s->BT;
	ap_kir_expr *bh, *r0, *h, *hk, *n;
	ap_kir_block *saved, *s2;
	ap_kir_var *u;

	s->keys = keys;
	bh = ap_kir_bind(k, v->cur, k->index_type, "bh", ap_kir_binary(k, AP_KIR_DIV, tile, ap_kir_idx(k, blocks)));
	r0 = ap_kir_bind(k, v->cur, k->index_type, "r0",
			 ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, tile, ap_kir_idx(k, blocks)), s->BH));
	s->hrow0 = ap_kir_bind(k, v->cur, k->index_type, "hw",
			       ap_kir_add(k, r0, ap_kir_add(k, ap_kir_muli(k, s->ln.warp, 16), s->ln.g)));
	if (keys) {
		hk = ap_kir_bind(k, v->cur, k->index_type, "hk", ap_kir_binary(k, AP_KIR_REM, bh, ap_kir_idx(k, p->Hk)));
		batch_coords(c, ap_kir_binary(k, AP_KIR_DIV, bh, ap_kir_idx(k, p->Hk)));
		h = NULL;
		tc_hold(s, s->xf, AG_K, hk, r0, s->Ep, p->S);
		tc_hold(s, s->yf, AG_V, hk, r0, s->Evp, p->S);
		/* causal: from the query tile holding key r0 */
		s->first = p->causal ? ap_kir_bind(k, v->cur, k->index_type, "t1", ap_kir_binary(k, AP_KIR_DIV, r0, ap_kir_idx(k, s->BT)))
				     : ap_kir_idx(k, 0);
		s->per = ap_kir_bind(k, v->cur, k->index_type, "np", ap_kir_binary(k, AP_KIR_SUB, ap_kir_idx(k, nt), s->first));
		n = ap_kir_bind(k, v->cur, k->index_type, "nu", ap_kir_muli(k, s->per, p->G));
		tc_zero(s, s->acc2, s->Evp / 8 * 4);
	} else {
		h = ap_kir_bind(k, v->cur, k->index_type, "h", ap_kir_binary(k, AP_KIR_REM, bh, ap_kir_idx(k, p->H)));
		hk = ap_kir_bind(k, v->cur, k->index_type, "hk", ap_kir_binary(k, AP_KIR_DIV, h, ap_kir_idx(k, p->G)));
		batch_coords(c, ap_kir_binary(k, AP_KIR_DIV, bh, ap_kir_idx(k, p->H)));
		tc_hold(s, s->xf, AG_Q, h, r0, s->Ep, p->L);
		tc_hold(s, s->yf, AG_DY, h, r0, s->Evp, p->L);
		for (int e = 0; e < 2; e++) {
			ap_kir_expr *row = ap_kir_bind(k, v->cur, k->index_type, "rc",
						       ap_kir_binary(k, AP_KIR_MIN, ap_kir_addi(k, s->hrow0, 8 * e), ap_kir_idx(k, p->L - 1)));

			s->lse[e] = ap_kir_bind(k, v->cur, AP_DT_F32, "lse", ld(c, p->lse, h, row, NULL));
			s->D[e] = ap_kir_bind(k, v->cur, AP_DT_F32, "Dd", delta(c, h, row));
		}
		/* causal: key tiles up to the block's last row */
		n = p->causal ? ap_kir_bind(k, v->cur, k->index_type, "nu",
					    ap_kir_binary(k, AP_KIR_DIV,
							  ap_kir_addi(k, ap_kir_binary(k, AP_KIR_MIN, ap_kir_addi(k, r0, s->BH), ap_kir_idx(k, p->S)),
								      s->BT - 1), ap_kir_idx(k, s->BT)))
			      : ap_kir_idx(k, nt);
	}
	s->hq = h;
	s->hk = hk;
	tc_zero(s, s->acc1, s->Ep / 8 * 4);
	if (s->NST == 2) {
		/* the first tile's copies, into stage 0 */
		ap_kir_block *s3;
		ap_kir_expr *h0, *t00;

		ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, ap_kir_idx(k, 0), n), &s3, NULL);
		tc_tile_of(s, ap_kir_idx(k, 0), &h0, &t00);
		tc_stage_tile(s, ap_kir_idx(k, 0), h0, hk, t00);
		ap_v_close(v, s3);
		ap_kir_cp_commit(k, v->cur);
	}
	u = ap_v_loop(v, "u", ap_kir_idx(k, 0), n, 1, &saved);
	{
		ap_kir_expr *hu, *t0, *st;

		tc_tile_of(s, ap_kir_ref(k, u), &hu, &t0);
		ap_kir_barrier(k, v->cur);
		if (s->NST == 2) {
			ap_kir_expr *nx = ap_kir_bind(k, v->cur, k->index_type, "un", ap_kir_addi(k, ap_kir_ref(k, u), 1));
			ap_kir_expr *hn, *tn;

			st = ap_kir_bind(k, v->cur, k->index_type, "st", ap_kir_binary(k, AP_KIR_AND, ap_kir_ref(k, u), ap_kir_idx(k, 1)));
			ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, nx, n), &s2, NULL);
			tc_tile_of(s, nx, &hn, &tn);
			tc_stage_tile(s, ap_kir_binary(k, AP_KIR_AND, nx, ap_kir_idx(k, 1)), hn, hk, tn);
			ap_v_close(v, s2);
			ap_kir_cp_commit(k, v->cur);
			ap_kir_cp_wait(k, v->cur, 1);
		} else {
			st = ap_kir_idx(k, 0);
			tc_stage_tile(s, st, hu, hk, t0);
			if (p->aw[AG_Q] || p->aw[AG_K] || p->aw[AG_V] || p->aw[AG_DY]) {
				ap_kir_cp_commit(k, v->cur);
				ap_kir_cp_wait(k, v->cur, 0);
			}
		}
		ap_kir_barrier(k, v->cur);
		tc_tile(s, st, hu, t0);
	}
	ap_v_close(v, saved);
	if (keys) {
		tc_store(s, p->dk, s->acc1, s->Ep / 8, c->scale, hk, p->S, p->E);
		tc_store(s, p->dv, s->acc2, s->Evp / 8, NULL, hk, p->S, p->Ev);
	} else {
		tc_store(s, p->dq, s->acc1, s->Ep / 8, c->scale, h, p->L, p->E);
	}
}

/* The tensor-core form's arrays and lanes for W warps and streamed tiles
 * of BT rows.  AP_ENOMEM through err when an allocation failed. */
static int tc_setup(agt *s, agc *c, int W, int BT, ap_error *err)
{
	const ag_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;

	memset(s, 0, sizeof(*s));
	s->c = c;
	s->T = p->t;
	s->W = W;
	s->BH = 16 * W;
	s->BT = BT;
	s->NS = BT / 8;
	s->NST = tc_stages(p);
	s->Ep = tc_pad16(p->E);
	s->Evp = tc_pad16(p->Ev);
	s->ld1 = s->Ep + TC_PAD;
	s->ld2 = s->Evp + TC_PAD;
	s->ldh = s->ld1 > s->ld2 ? s->ld1 : s->ld2;
	ap_kir_mma_frag_sizes(p->mma, &s->AF, &s->BF, &s->CF);
	s->hs = ap_kir_shared(k, "hs", s->T, s->BH * s->ldh);
	s->r1s = ap_kir_shared(k, "r1s", s->T, s->NST * BT * s->ld1);
	s->r2s = ap_kir_shared(k, "r2s", s->T, s->NST * BT * s->ld2);
	s->sts = ap_kir_shared(k, "sts", AP_DT_F32, s->NST * 2 * BT);
	s->xf = ap_kir_local(k, "xf", s->T, s->Ep / 16 * s->AF);
	s->yf = ap_kir_local(k, "yf", s->T, s->Evp / 16 * s->AF);
	s->bfr = ap_kir_local(k, "bf", s->T, s->BF);
	s->sacc = ap_kir_local(k, "sa", AP_DT_F32, s->NS * 4);
	s->dpacc = ap_kir_local(k, "dpa", AP_DT_F32, s->NS * 4);
	s->pf = ap_kir_local(k, "pf", s->T, s->NS * 4);
	s->dsf = ap_kir_local(k, "dsf", s->T, s->NS * 4);
	s->acc1 = ap_kir_local(k, "ga", AP_DT_F32, s->Ep / 8 * 4);
	s->acc2 = ap_kir_local(k, "gv", AP_DT_F32, s->Evp / 8 * 4);
	if (ap_kir_failed(k))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering the attention backward");
	ap__mma_lanes(k, v->cur, &s->ln);
	for (int r = 0; r < 4; r++) {
		static const char *const names[] = {"Q", "K", "V", "dY"};

		if (p->aw[r])
			ap_kir_comment(k, v->cur, "operand %s: cp.async, %zu bytes a copy", names[r],
				       (size_t)p->aw[r] * ap_dtype_size(s->T));
		else
			ap_kir_comment(k, v->cur, "operand %s: through registers (not a contiguous, aligned view)", names[r]);
	}
	return 0;
}

/* The whole kernel: a grid-stride loop over the key sweep's tiles, then
 * the query sweep's (each block's branch uniform, so the barriers inside
 * are reached by all its threads); the SIMT or the tensor-core form as
 * the plan says.  Errors: AP_EUNSUPPORTED (not one AttentionGrad node,
 * or a schedule whose block does not fit the target), AP_ENOMEM. */
static int ag_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err)
{
	const ag_res *r = (const ag_res *)pl->x;
	const ap_mgraph *m = b->m;
	const ap_target_info *t = b->t;
	const ag_plan *p = b->an;
	agc c;
	agt ts;
	ap_vctx v;
	int rc;
	int64_t nk, nq;
	unsigned grid;
	ap_kir_array *sh = NULL;
	ap_kir_var *tile;
	ap_kir_block *saved, *s2;
	ap_kir_stmt *br;

	if (p->tc ? !tc_fits(p, t, r->t, r->bt)
		 : r->t < 32 || (unsigned)r->t > ap_block_cap(t) || ag_smem(p, r->t) > t->shared_per_block)
		return ap_error_set(err, AP_EUNSUPPORTED, m->g->nodes[p->node].name, NULL,
				    "attention backward emitter: the schedule's block (head dims %lld, %lld) does not fit",
				    (long long)p->E, (long long)p->Ev);
	if ((rc = ap_vctx_init(&v, m, k, err)))
		return rc;
	memset(&c, 0, sizeof(c));
	c.p = p;
	c.v = &v;
	c.k = k;
	c.A = p->acc;
	c.T = r->t;
	nk = r->nk;
	nq = r->nq;
	grid = r->blocks;
	k->block[0] = r->threads;
	k->grid[0] = grid;
	c.tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	c.scale = ap_kir_float(k, c.A, p->scale);
	if (p->tc) {
		if ((rc = tc_setup(&ts, &c, r->t, r->bt, err))) {
			ap_vctx_clear(&v);
			return rc;
		}
	} else {
		sh = ap_kir_shared(k, "sh", c.A, (int64_t)(ag_smem(p, c.T) / ap_dtype_size(c.A)));
	}
	tile = ap_v_loop(&v, "tile", ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_idx(k, nk + nq), grid, &saved);
	ap_v_if(&v, ap_kir_binary(k, AP_KIR_LT, ap_kir_ref(k, tile), ap_kir_idx(k, nk)), &s2, &br);
	ap_kir_comment(k, v.cur, "key sweep: dK and dV of a block of keys");
	if (p->tc)
		tc_sweep(&ts, true, ap_kir_ref(k, tile));
	else
		key_sweep(&c, ap_kir_ref(k, tile), sh);
	ap_v_else(&v, br);
	ap_kir_comment(k, v.cur, "query sweep: dQ of a block of query rows");
	if (p->tc)
		tc_sweep(&ts, false, ap_kir_binary(k, AP_KIR_SUB, ap_kir_ref(k, tile), ap_kir_idx(k, nk)));
	else
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
 * update per (query, key) pair seen (about half of them when causal); on
 * tensor cores for the tensor-core form. */
static int ag_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const ag_plan *p = b->an;
	const ag_res *r = (const ag_res *)pl->x;
	double pairs;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(b->m, out) < 0)
		return AP_ENOMEM;
	pairs = (double)p->nb * (double)p->H * (double)p->L * (double)p->S * (p->causal ? 0.5 : 1.0);
	out->flops = pairs * 2.0 * (double)(4 * p->E + 3 * p->Ev);
	out->threads = r->threads;
	out->blocks = r->blocks;
	out->shared_bytes = r->smem;
	out->tensor_cores = p->tc;
	if (p->tc) {
		/* registers a thread: S and dP (float32), P and dS (16-bit pairs)
		 * of a tile's BT / 8 n8 tiles, the gradient accumulators, the
		 * held fragments, about 40 for addresses and statistics (ptxas
		 * at GPT-2's head dim 64 on sm_90: 168 at tile 16, 226 at 64) */
		int64_t ns = r->bt / 8, ep = tc_pad16(p->E), evp = tc_pad16(p->Ev);
		int64_t regs = ns * 4 * 2 + ns * 4 + (ep + evp) / 8 * 4 + (ep + evp) / 4 + 40;

		out->regs = (unsigned)(regs > 255 ? 255 : regs);
	}
	return 0;
}

const ap_emitter ap_emitter_attention_grad = {
	"attention_grad", ag_bind, NULL, ag_space, ag_choose, ag_emit, ag_traffic, ag_resolve, false, NULL,
};
