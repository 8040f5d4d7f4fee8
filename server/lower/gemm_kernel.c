/* gemm_kernel.c -- the GEMM kernel's arithmetic and skeleton (the
 * emitter is described in gemm.c's file comment, the shared types in
 * gemm_internal.h): the SIMT and tensor-core (ldmatrix + mma.sync) steps
 * over a K tile, split-K's reduction across a thread-block cluster, the
 * epilogue (the accumulators handed to the value builder as Y, stored in
 * column pairs where they can be), and the skeleton -- staging choice,
 * shared arrays, launch shape, the threads' places, the single-stage and
 * pipelined K loops -- that ap__gemm_emit assembles.
 */
#include "gemm_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- SIMT arithmetic ---- */

/* acc[i][j] += A[k][ty*TM + i] * B[k][tx*TN + j] over the K tile in stage
 * st: per k, the thread's TM values of A and TN of B from the shared
 * tiles into the register arrays c->fa / c->fb (cast to the accumulator
 * type), then TM x TN multiply-adds. */
static void compute_simt(gctx *c, ap_kir_expr *st)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_dtype A = c->p->acc_t;
	int TM = c->c.tm, TN = c->c.tn;
	ap_kir_stmt *lk, *li, *lj;
	ap_kir_var *kk = ap_kir_var_new(k, k->index_type, "kk"), *i, *j;

	lk = ap_kir_for_unroll(k, v->cur, kk, I(c, 0), I(c, c->c.bk), 1, -1);
	if (!lk)
		return;
	for (int role = 0; role < 2; role++) {
		int n = role ? TN : TM;
		ap_kir_expr *base = ap_kir_muli(k, role ? c->tx : c->ty, n);

		i = ap_kir_var_new(k, k->index_type, "f");
		li = ap_kir_for_unroll(k, &lk->body, i, I(c, 0), I(c, n), 1, -1);
		if (!li)
			return;
		ap_kir_store(k, &li->body, role ? c->fb : c->fa, ap_kir_ref(k, i),
			     ap_kir_cast(k, A, ap_kir_load(k, role ? c->sb : c->sa,
					 ap__gemm_smem_index(c, role, st, ap_kir_add(k, base, ap_kir_ref(k, i)),
						    ap_kir_ref(k, kk)))));
	}
	i = ap_kir_var_new(k, k->index_type, "i");
	li = ap_kir_for_unroll(k, &lk->body, i, I(c, 0), I(c, TM), 1, -1);
	if (!li)
		return;
	j = ap_kir_var_new(k, k->index_type, "j");
	lj = ap_kir_for_unroll(k, &li->body, j, I(c, 0), I(c, TN), 1, -1);
	if (!lj)
		return;
	{
		ap_kir_expr *ai = ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, i), TN), ap_kir_ref(k, j));

		ap_kir_store(k, &lj->body, c->acc, ai,
			     ap_kir_binary(k, AP_KIR_ADD, ap_kir_load(k, c->acc, ai),
					   ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, c->fa, ap_kir_ref(k, i)),
							 ap_kir_load(k, c->fb, ap_kir_ref(k, j)))));
	}
}

/* ---- tensor-core arithmetic ---- */

/* What the steps of one K tile on tensor cores share (compute_tc): the
 * stage, the k-step loop and its variable, the fragment shapes, and the
 * parts of the lane that address ldmatrix's rows. */
typedef struct tc_step {
	ap_kir_expr *st;                /* the stage holding the K tile */
	ap_kir_var *kk;                 /* the k step (ks elements of K) */
	ap_kir_block *body;             /* the k-step loop's body */
	bool tf32;                      /* m16n8k8 on float32 registers */
	int E;                          /* elements in 16 bytes */
	int MI, NI;                     /* the warp's m16 row tiles and n8 column tiles */
	int na, nb, nc;                 /* elements of an A, B, C fragment a lane */
	ap_kir_expr *l16, *l8, *hi, *j2;  /* lane % 16, lane % 8, lane / 16, (lane / 8) % 2 */
	/* the place in stage st of the lane's first element (ldmatrix: its
	 * row address) for the warp's first row (column) tile and k step 0,
	 * bound once a K tile;
	 * row tile mi and k step kk read at abase + ap__gemm_smem_lin(16 mi, kk) (B:
	 * 8 ni), a constant offset once the loops are unrolled, which the
	 * compiler folds into the instruction (print.c) */
	ap_kir_expr *abase, *bbase;
} tc_step;

/* The A fragments of the warp's MI row tiles into c->fa (na elements
 * each): ldmatrix .x4 at s->abase (compute_tc).  TF32 from a k-major
 * tile (s->abase: the lane's (g, t)): one element a lane, a0 = A[g][t], a1 = A[g+8][t],
 * a2 = A[g][t+4], a3 = A[g+8][t+4].  False when a loop could not be
 * allocated (the kernel is marked failed). */
static bool load_a_frags(gctx *c, const tc_step *s)
{
	ap_kir_kernel *k = c->k;
	ap_kir_var *mi = ap_kir_var_new(k, k->index_type, "mi");
	ap_kir_stmt *lm = ap_kir_for_unroll(k, s->body, mi, I(c, 0), I(c, s->MI), 1, -1);

	if (!lm)
		return false;
	if (s->tf32 && !c->a_rowk) {
		for (int e = 0; e < 4; e++)
			ap_kir_store(k, &lm->body, c->fa,
				     ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, mi), s->na), e),
				     ap_kir_load(k, c->sa, ap_kir_add(k, s->abase,
						ap__gemm_smem_lin(c, 0, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, mi), 16), 8 * (e & 1)),
							 ap_kir_addi(k, ap_kir_ref(k, s->kk), 4 * (e >> 1))))));
		return true;
	}
	ap_kir_ldmatrix(k, &lm->body, c->fa, ap_kir_muli(k, ap_kir_ref(k, mi), s->na), c->sa,
			ap_kir_add(k, s->abase, ap__gemm_smem_lin(c, 0, ap_kir_muli(k, ap_kir_ref(k, mi), 16), ap_kir_ref(k, s->kk))),
			4, !c->a_rowk);
	return true;
}

/* The B fragments of the warp's NI column tiles into c->fb (nb elements
 * each): ldmatrix .x2 of one n8 tile at s->bbase (compute_tc).  TF32
 * from a k-major tile (s->bbase: the lane's (g, t)): one element a lane,
 * b0 = B[k=t][n=g], b1 = B[k=t+4][n=g].  False when a loop could
 * not be allocated. */
static bool load_b_frags(gctx *c, const tc_step *s)
{
	ap_kir_kernel *k = c->k;
	ap_kir_var *ni = ap_kir_var_new(k, k->index_type, "ni");
	ap_kir_stmt *ln = ap_kir_for_unroll(k, s->body, ni, I(c, 0), I(c, s->NI), 1, -1);

	if (!ln)
		return false;
	if (s->tf32 && !c->b_rowk) {
		for (int e = 0; e < 2; e++)
			ap_kir_store(k, &ln->body, c->fb,
				     ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), s->nb), e),
				     ap_kir_load(k, c->sb, ap_kir_add(k, s->bbase,
						ap__gemm_smem_lin(c, 1, ap_kir_muli(k, ap_kir_ref(k, ni), 8),
							 ap_kir_addi(k, ap_kir_ref(k, s->kk), 4 * e)))));
		return true;
	}
	ap_kir_ldmatrix(k, &ln->body, c->fb, ap_kir_muli(k, ap_kir_ref(k, ni), s->nb), c->sb,
			ap_kir_add(k, s->bbase, ap__gemm_smem_lin(c, 1, ap_kir_muli(k, ap_kir_ref(k, ni), 8), ap_kir_ref(k, s->kk))),
			2, !c->b_rowk);
	return true;
}

/* TF32: the fragments of the operands copied by cp.async as they are
 * (float32) are rounded to TF32 in the registers (PTX cvt.rna.tf32.f32);
 * register-staged operands were rounded on the way. */
static void round_frags_tf32(gctx *c, const tc_step *s)
{
	ap_kir_kernel *k = c->k;

	for (int role = 0; role < 2; role++) {
		ap_kir_var *e;
		ap_kir_stmt *le;
		ap_kir_array *f = role ? c->fb : c->fa;
		int n = role ? s->NI * s->nb : s->MI * s->na;

		if (!(role ? c->b_async : c->a_async))
			continue;
		e = ap_kir_var_new(k, k->index_type, "r");
		le = ap_kir_for_unroll(k, s->body, e, I(c, 0), I(c, n), 1, -1);
		if (le)
			ap_kir_store(k, &le->body, f, ap_kir_ref(k, e),
				     ap_kir_call(k, AP_KIR_TF32, ap_kir_load(k, f, ap_kir_ref(k, e)), NULL));
	}
}

/* MI x NI mma.sync of the warp's fragments into the accumulators
 * (acc[(mi * NI + ni) * nc ..], float32). */
static void mma_tiles(gctx *c, const tc_step *s)
{
	ap_kir_kernel *k = c->k;
	ap_kir_var *mi, *ni;
	ap_kir_stmt *lm, *ln;
	ap_kir_expr *ai;

	mi = ap_kir_var_new(k, k->index_type, "mi");
	lm = ap_kir_for_unroll(k, s->body, mi, I(c, 0), I(c, s->MI), 1, -1);
	if (!lm)
		return;
	ni = ap_kir_var_new(k, k->index_type, "ni");
	ln = ap_kir_for_unroll(k, &lm->body, ni, I(c, 0), I(c, s->NI), 1, -1);
	if (!ln)
		return;
	ai = ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, mi), s->NI), ap_kir_ref(k, ni)), s->nc);
	ap_kir_mma(k, &ln->body, c->p->mma, c->acc, ai, c->fa, ap_kir_muli(k, ap_kir_ref(k, mi), s->na), c->fb,
		   ap_kir_muli(k, ap_kir_ref(k, ni), s->nb), c->acc, ai);
}

/* Per k step of the K tile in stage st: A fragments of the warp's MI row
 * tiles and B fragments of its NI column tiles by ldmatrix (the warp's
 * first row and column c->wm0, c->wn0), TF32 rounding where needed, then
 * MI x NI mma.sync into the accumulators. */
static void compute_tc(gctx *c, ap_kir_expr *st)
{
	ap_kir_kernel *k = c->k;
	ap_kir_expr *lane = c->lane;
	tc_step s;
	ap_kir_stmt *lk;
	ap_kir_expr *g4, *q4;

	s.st = st;
	s.tf32 = c->p->mma == AP_KIR_MMA_TF32_1688;
	s.E = 16 / (int)ap_dtype_size(c->p->in_t);
	s.MI = c->c.bm / c->c.tm / 16;
	s.NI = c->c.bn / c->c.tn / 8;
	s.kk = ap_kir_var_new(k, k->index_type, "ks");
	s.l16 = ap_kir_binary(k, AP_KIR_AND, lane, I(c, 15));
	s.l8 = ap_kir_binary(k, AP_KIR_AND, lane, I(c, 7));
	s.hi = ap_kir_binary(k, AP_KIR_SHR, lane, I(c, 4));                 /* lane / 16 */
	s.j2 = ap_kir_binary(k, AP_KIR_AND, ap_kir_binary(k, AP_KIR_SHR, lane, I(c, 3)), I(c, 1));
	ap_kir_mma_frag_sizes(c->p->mma, &s.na, &s.nb, &s.nc);
	g4 = ap_kir_binary(k, AP_KIR_SHR, lane, I(c, 2));
	q4 = ap_kir_binary(k, AP_KIR_AND, lane, I(c, 3));
	/* A, ldmatrix .x4 from a row-major [m][k] tile: matrix j = lane / 8
	 * covers rows (j % 2) * 8.. and k (j / 2) * E..; in lane terms row
	 * lane % 16, k (lane / 16) * E.  k-major tiles (.trans): rows of the
	 * shared tile are k: k (j / 2) * 8 + lane % 8, m (j % 2) * 8.
	 * B, .x2 of one n8 tile from an [n][k] tile: matrix j = (lane / 8) % 2
	 * covers n lane % 8, k j * E..; k-major tiles (.trans): k j * 8 +
	 * lane % 8. */
	if (s.tf32 && !c->a_rowk)   /* TF32, k-major: a lane's element (g, t) of each */
		s.abase = ap__gemm_smem_index(c, 0, st, ap_kir_add(k, c->wm0, g4), q4);
	else if (c->a_rowk)
		s.abase = ap__gemm_smem_index(c, 0, st, ap_kir_add(k, c->wm0, s.l16), ap_kir_muli(k, s.hi, s.E));
	else
		s.abase = ap__gemm_smem_index(c, 0, st, ap_kir_add(k, c->wm0, ap_kir_muli(k, s.j2, 8)),
				     ap_kir_add(k, ap_kir_muli(k, s.hi, 8), s.l8));
	if (s.tf32 && !c->b_rowk)
		s.bbase = ap__gemm_smem_index(c, 1, st, ap_kir_add(k, c->wn0, g4), q4);
	else if (c->b_rowk)
		s.bbase = ap__gemm_smem_index(c, 1, st, ap_kir_add(k, c->wn0, s.l8), ap_kir_muli(k, s.j2, s.E));
	else
		s.bbase = ap__gemm_smem_index(c, 1, st, c->wn0, ap_kir_add(k, ap_kir_muli(k, s.j2, 8), s.l8));
	s.abase = ap_kir_bind(k, c->v->cur, k->index_type, "ab", s.abase);
	s.bbase = ap_kir_bind(k, c->v->cur, k->index_type, "bb", s.bbase);
	lk = ap_kir_for_unroll(k, c->v->cur, s.kk, I(c, 0), I(c, c->c.bk), s.tf32 ? 8 : 16, -1);
	if (!lk)
		return;
	s.body = &lk->body;
	if (!load_a_frags(c, &s) || !load_b_frags(c, &s))
		return;
	if (s.tf32 && (c->a_async || c->b_async))
		round_frags_tf32(c, &s);
	mma_tiles(c, &s);
}

/* ---- wgmma (sm_90a) ---- */

/* wgmma's layout of operand `role`'s tile (ap__gemm_smem_lin's wg_place):
 * K-major when the tile keeps K contiguous -- core matrices 128 bytes
 * apart along K (LBO), 8 rows of bk elements apart along M or N (SBO) --
 * else MN-major: 128 bytes apart along M or N (SBO), 8 k of all the
 * tile's rows apart along K (LBO).  Swizzled by W = r->sw[role] bytes
 * (ap__wg_swizzled_place): atoms of 8 rows 8 W bytes apart (SBO);
 * MN-major, the next W bytes along M or N bk W bytes on (LBO); K-major
 * leaves LBO unused (16, as encoded 1). */
static ap_kir_wg_layout wg_layout(gctx *c, int role)
{
	int es = (int)ap_dtype_size(c->p->in_t), rows = role ? c->c.bn : c->c.bm, sw = c->r->sw[role];
	ap_kir_wg_layout l;

	l.mn_major = !(role ? c->b_rowk : c->a_rowk);
	l.swizzle = sw;
	if (sw) {
		l.lbo = l.mn_major ? c->c.bk * sw : 16;
		l.sbo = 8 * sw;
		return l;
	}
	l.lbo = l.mn_major ? 8 * rows * es : 128;
	l.sbo = l.mn_major ? 128 : 8 * c->c.bk * es;
	return l;
}

/* The K tile in stage st on wgmma: per k16 step (k8: TF32) and m64 tile
 * of the warpgroup, one wgmma.m64nNk16 (m64nNk8) with N the warpgroup's columns, A from
 * the warpgroup's rows, B from its columns (each descriptor's start the
 * core matrix at (row, k)); then the group committed and waited for --
 * all of it, so that the stage may be refilled after the next barrier,
 * or (c->wg_overlap) all but this tile's, whose stage the copies leave
 * alone one tile longer. */
static void compute_wg(gctx *c, ap_kir_expr *st)
{
	ap_kir_kernel *k = c->k;
	ap_kir_block *cur = c->v->cur;
	int MI = c->c.bm / c->c.tm / 64, NI = c->c.bn / c->c.tn / 8;
	ap_kir_wgmma_kind kind = ap__gemm_wgmma_kind(c->p);
	ap_kir_wg_layout la = wg_layout(c, 0), lb = wg_layout(c, 1);
	ap_kir_var *kk, *mi;
	ap_kir_stmt *lk, *lm;
	ap_kir_expr *a0, *b0;

	ap_kir_wgmma_fence(k, cur, c->acc);
	kk = ap_kir_var_new(k, k->index_type, "ks");
	lk = ap_kir_for_unroll(k, cur, kk, I(c, 0), I(c, c->c.bk), ap_kir_wgmma_k(kind), -1);
	if (!lk)
		return;
	b0 = ap__gemm_smem_index(c, 1, st, c->wn0, ap_kir_ref(k, kk));
	mi = ap_kir_var_new(k, k->index_type, "mi");
	lm = ap_kir_for_unroll(k, &lk->body, mi, I(c, 0), I(c, MI), 1, -1);
	if (!lm)
		return;
	a0 = ap__gemm_smem_index(c, 0, st, ap_kir_add(k, c->wg0, ap_kir_muli(k, ap_kir_ref(k, mi), 64)),
				 ap_kir_ref(k, kk));
	ap_kir_wgmma(k, &lm->body, kind, 8 * NI, c->acc, ap_kir_muli(k, ap_kir_ref(k, mi), 4 * NI), c->sa, a0, la,
		     c->sb, b0, lb);
	ap_kir_wgmma_commit(k, cur);
	ap_kir_wgmma_wait(k, cur, c->wg_overlap ? 1 : 0, c->acc);
}

/* The barrier after which the stage's tiles are read: on wgmma each
 * thread first fences its shared-memory writes (cp.async, stores) for the
 * async proxy that wgmma reads through. */
static void tiles_ready(gctx *c)
{
	if (c->p->wg)
		ap_kir_fence_proxy_async(c->k, c->v->cur);
	ap_kir_barrier(c->k, c->v->cur);
}

/* ---- split-K ---- */

/* Every block of the cluster leaves its partial accumulators in shared
 * memory (red[e * nt + tid], coalesced); after a cluster barrier the block
 * of rank r sums the elements e of its share (e / (n / splitk) == r) over
 * the cluster's blocks in rank order -- the same order whichever block
 * finished first: deterministic -- and the epilogue stores only those
 * (own_element).  The caller ends the tile with a cluster barrier, so no
 * block overwrites or leaves its partials while another still reads
 * them. */
static void splitk_reduce(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int64_t n = c->acc->size, chunk = n / c->c.splitk;
	ap_kir_block *s1, *s2;
	ap_kir_var *e;
	ap_kir_expr *slot;

	e = ap_v_loop_unrolled(v, "e", n, &s1);
	slot = ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, e), c->nt), c->tid);
	ap_kir_store(k, v->cur, c->red, slot, ap_kir_load(k, c->acc, ap_kir_ref(k, e)));
	ap_v_close(v, s1);
	ap_kir_cluster_barrier(k, v->cur);
	e = ap_v_loop_unrolled(v, "e", n, &s1);
	slot = ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, e), c->nt), c->tid);
	ap_v_if(v, ap_kir_binary(k, AP_KIR_EQ, ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, e), I(c, chunk)), c->rank),
		&s2, NULL);
	{
		ap_kir_expr *sum = ap_kir_load_remote(k, c->red, slot, I(c, 0));

		for (int r = 1; r < c->c.splitk; r++)
			sum = ap_kir_binary(k, AP_KIR_ADD, sum, ap_kir_load_remote(k, c->red, slot, I(c, r)));
		ap_kir_store(k, v->cur, c->acc, ap_kir_ref(k, e), sum);
	}
	ap_v_close(v, s2);
	ap_v_close(v, s1);
}

/* Split-K: whether accumulator element `ai` is this block's to store
 * (NULL: every element is, no split). */
static ap_kir_expr *own_element(gctx *c, ap_kir_expr *ai)
{
	if (c->c.splitk <= 1)
		return NULL;
	return ap_kir_binary(c->k, AP_KIR_EQ, ap_kir_binary(c->k, AP_KIR_DIV, ai, I(c, c->acc->size / c->c.splitk)),
			     c->rank);
}

/* ---- epilogue ---- */

static ap_kir_expr *acc_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	gctx *c = user;

	ap_kir_expr *a;

	if (t != c->p->y)
		return NULL;
	a = ap_kir_load(v->k, c->acc, c->acc_index);
	if (c->p->bias >= 0) {
		/* the convolution's bias, per output channel */
		ap_lidx bi = ap_lidx_shape(&v->g->tensors[c->p->bias]);

		bi.c[0] = ap_lidx_coord(v, ix, 1);
		a = ap_kir_binary(v->k, AP_KIR_ADD, a, ap_kir_cast(v->k, c->acc->type, ap_val(v, c->p->bias, &bi)));
	}
	return ap_kir_cast(v->k, v->g->tensors[t].dtype, a);
}

/* Y's index for element (row, col) of the tile's batch. */
static ap_lidx y_index(gctx *c, ap_kir_expr *row, ap_kir_expr *col)
{
	ap_lidx ix = ap_lidx_shape(&c->g->tensors[c->p->y]);
	ap_kir_expr *bc[AP_MAX_RANK];

	if (c->p->conv) {
		/* Y[n][g * Mg + col][position], row = (n, position) */
		const gemm_plan *p = c->p;
		ap_kir_kernel *k = c->k;
		ap_kir_expr *n = ap_kir_binary(k, AP_KIR_DIV, row, I(c, p->ohw));
		ap_kir_expr *pos = ap_kir_binary(k, AP_KIR_REM, row, I(c, p->ohw));
		ap_kir_expr *m = ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Mg), col);

		ix.c[0] = n;
		ix.c[1] = m;
		ap__gemm_split_linear(c, pos, p->O, p->ns, &ix.c[2]);
		ix.lin = ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, n, p->groups * p->Mg), m), p->ohw), pos);
		return ix;
	}
	/* the linear index of a row-major Y: (batch, row) * N + col */
	if (c->p->fold || c->p->nb == 0)
		ix.lin = ap_kir_add(c->k, ap_kir_muli(c->k, row, c->p->N), col);
	else
		ix.lin = ap_kir_add(c->k, ap_kir_muli(c->k, ap_kir_add(c->k, ap_kir_muli(c->k, c->tb_index, c->p->M), row),
						      c->p->N), col);
	row = ap__gemm_row_split(c, row, bc);
	for (int d = 0; d < c->p->nb; d++)
		ix.c[d] = bc[d];
	ix.c[c->p->nb] = row;
	ix.c[c->p->nb + 1] = col;
	return ix;
}

/* Stores every output for the accumulator element acc[ai], which holds
 * Y[batch][row][col] (inside the problem: the caller checks). */
static void store_outputs(gctx *c, ap_kir_expr *ai, ap_kir_expr *row, ap_kir_expr *col)
{
	c->acc_index = ai;
	ap__epilogue_store(c->v, c->p->maps, y_index(c, row, col));
}

/* ---- the skeleton ---------------------------------------------------------------------- */

/* How each operand reaches shared memory (ap__gemm_copy_mode: cp.async where the
 * operand is read as it is; the host copies: the same statement, printed
 * as a copy), and a comment saying so for readers of the source
 * (tests/check_gemm.c requires cp.async in the PTX when one is). */
static void choose_staging(gctx *c)
{
	ap_kir_kernel *k = c->k;
	const gemm_plan *p = c->p;

	c->a_w = c->r->w[0];
	c->b_w = c->r->w[1];
	c->a_mode = c->r->mode[0];
	c->b_mode = c->r->mode[1];
	c->a_async = c->a_w > 0;
	c->b_async = c->b_w > 0;
	for (int role = 0; role < 2; role++) {
		int w = role ? c->b_w : c->a_w;

		stage_mode mode = role ? c->b_mode : c->a_mode;

		if (c->c.tma)
			continue;   /* ap__gemm_tma_setup says how */
		if (mode == STAGE_PAIRS)
			ap_kir_comment(k, c->v->cur, "operand %c: cp.async of the 4-byte pair holding each "
				       "gathered element, extracted into the tile", role ? 'B' : 'A');
		else if (mode == STAGE_COMPUTE)
			ap_kir_comment(k, c->v->cur, "operand %c: cp.async of its %s elements, %d bytes a copy, "
				       "%s into the tile", role ? 'B' : 'A',
				       ap_dtype_name(c->g->tensors[(role ? p->b : p->a).leaf].dtype),
				       w * (role ? p->b : p->a).src_es, (role ? p->b : p->a).casts_only ? "converted" : "computed");
		else if (w > 0)
			ap_kir_comment(k, c->v->cur, "operand %c: cp.async, %d bytes a copy", role ? 'B' : 'A',
				       w * (int)ap_dtype_size(p->in_t));
		else
			ap_kir_comment(k, c->v->cur, "operand %c: through registers (%s)", role ? 'B' : 'A',
				       !(role ? p->b : p->a).plain && !(role ? p->b : p->a).gather ? "computed on the way"
				       : "no cp.async here");
	}
}

/* The shared arrays: the A and B tiles sa / sb (rows lda / ldb elements,
 * padded by ap__gemm_pad_of; `stages` of them, one for a pair- or compute-staged
 * operand), the raw copies of pair-staged (pa / pb with their places in
 * the pair qa / qb) and compute-staged operands (ca / cb, the source
 * buffer's type), and split-K's partial tile red (bm x bn accumulators).
 * Static shared memory while it fits the target's per-block limit,
 * dynamic past it; wgmma's tiles always dynamic, aligned to their
 * swizzles' repeats.  A failed allocation marks the kernel failed (the
 * caller checks). */
static void declare_shared(gctx *c)
{
	ap_kir_kernel *k = c->k;
	const gemm_plan *p = c->p;
	int S = c->c.stages;
	size_t smem;

	c->lda = (c->a_rowk ? c->c.bk : c->c.bm) + ap__gemm_pad_of(p);
	c->ldb = (c->b_rowk ? c->c.bk : c->c.bn) + ap__gemm_pad_of(p);
	c->a_stage = (int64_t)c->lda * (c->a_rowk ? c->c.bm : c->c.bk);
	c->b_stage = (int64_t)c->ldb * (c->b_rowk ? c->c.bn : c->c.bk);
	smem = c->r->smem;
	{
		ap_kir_array *(*shared)(ap_kir_kernel *, const char *, ap_dtype, int64_t) =
			smem <= c->t->shared_per_block ? ap_kir_shared : ap_kir_shared_dyn;
		int64_t pairs_a = (int64_t)S * c->c.bm * c->c.bk, pairs_b = (int64_t)S * c->c.bn * c->c.bk;

		int64_t na = c->a_stage * (c->a_mode != STAGE_TILE ? 1 : S), nb = c->b_stage * (c->b_mode != STAGE_TILE ? 1 : S);

		/* wgmma's tiles: dynamic, a swizzled one starting on its
		 * pattern's repeat (8 W bytes; ap__gemm_smem_bytes counts it) */
		c->sa = p->wg ? ap_kir_shared_dyn_aligned(k, "sa", p->in_t, na,
							  c->r->sw[0] ? 8u * (unsigned)c->r->sw[0] : 16u)
			      : shared(k, "sa", p->in_t, na);
		c->sb = p->wg ? ap_kir_shared_dyn_aligned(k, "sb", p->in_t, nb,
							  c->r->sw[1] ? 8u * (unsigned)c->r->sw[1] : 16u)
			      : shared(k, "sb", p->in_t, nb);
		if (c->a_mode == STAGE_PAIRS) {
			c->pa = shared(k, "pa", p->in_t, 2 * pairs_a);
			c->qa = shared(k, "qa", AP_DT_U8, pairs_a);
		} else if (c->a_mode == STAGE_COMPUTE) {
			c->pa = shared(k, "ca", c->g->tensors[p->a.leaf].dtype, pairs_a);
		}
		if (c->b_mode == STAGE_PAIRS) {
			c->pb = shared(k, "pb", p->in_t, 2 * pairs_b);
			c->qb = shared(k, "qb", AP_DT_U8, pairs_b);
		} else if (c->b_mode == STAGE_COMPUTE) {
			c->pb = shared(k, "cb", c->g->tensors[p->b.leaf].dtype, pairs_b);
		}
		if (c->c.splitk > 1)
			c->red = shared(k, "red", p->acc_t, (int64_t)c->c.bm * c->c.bn);
	}
}

/* The launch: tiles_m x tiles_n output tiles per tile batch (tb of
 * them), a grid-stride loop of `grid` blocks over them; split-K makes
 * each tile a cluster of splitk blocks, rank r taking K tiles
 * [r * ktl, (r + 1) * ktl) (c->rank, c->kofs) and checking k < K on
 * every load.  Sets the kernel's grid, cluster and block. */
static void set_launch(gctx *c)
{
	ap_kir_kernel *k = c->k;
	const gemm_plan *p = c->p;
	int KT;

	c->tiles_m = (int)((p->Mr + c->c.bm - 1) / c->c.bm);
	c->tiles_n = (int)((p->N + c->c.bn - 1) / c->c.bn);
	c->tiles = p->tb * c->tiles_m * c->tiles_n;
	KT = (int)((p->K + c->c.bk - 1) / c->c.bk);
	c->kpred = p->K % c->c.bk != 0;
	if (c->c.splitk > 1) {
		/* a cluster of splitk blocks per tile, each ktl of its K tiles */
		c->grid = ap_grid_for(c->tiles, 1);
		if (c->grid > AP_MAX_GRID / (unsigned)c->c.splitk)
			c->grid = AP_MAX_GRID / (unsigned)c->c.splitk;
		k->cluster = (unsigned)c->c.splitk;
		k->grid[0] = c->grid * k->cluster;
		c->ktl = (KT + c->c.splitk - 1) / c->c.splitk;
		c->rank = ap_kir_index_of(k, AP_KIR_CLUSTER_RANK);
		c->kofs = ap_kir_muli(k, c->rank, c->ktl);
		c->kpred = true;
		ap_kir_comment(k, c->v->cur, "split-K: a cluster of %d blocks per tile, %d K tiles each, "
			       "partial tiles summed through distributed shared memory", c->c.splitk, c->ktl);
	} else {
		c->grid = ap_grid_for(c->tiles, 1);
		/* tma=1: persistent, at most a block an SM */
		if (c->c.tma && c->t->sm_count > 0 && c->grid > c->t->sm_count)
			c->grid = c->t->sm_count;
		k->grid[0] = c->grid;
		c->ktl = KT;
		c->kofs = I(c, 0);
	}
	k->block[0] = c->nt;
}

/* The thread's place in the tile and its registers.  Tensor cores: warp
 * (wm, wn) of WM x WN, wn fastest, its first row and column c->wm0 /
 * c->wn0 and c->lane; fragments fa (MI A fragments), fb (NI B fragments)
 * and float32 accumulators acc (MI x NI C fragments).  SIMT: thread
 * (ty, tx) of the (bm / tm) x (bn / tn) grid, tx fastest; fa / fb the tm
 * and tn operands of one k, acc the tm x tn register tile.  A failed
 * allocation marks the kernel failed (the caller checks). */
static void declare_threads(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const gemm_plan *p = c->p;

	c->tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	if (p->wg) {
		/* warpgroup (wgm, wgn) of tm x tn, wgn fastest; its warp q holds
		 * rows 16 q .. of each of its m64 tiles */
		int MI = c->c.bm / c->c.tm / 64, NI = c->c.bn / c->c.tn / 8;
		ap_kir_expr *wgi = ap_kir_binary(k, AP_KIR_SHR, c->tid, I(c, 7));
		ap_kir_expr *q = ap_kir_binary(k, AP_KIR_AND, ap_kir_binary(k, AP_KIR_SHR, c->tid, I(c, 5)), I(c, 3));

		c->acc = ap_kir_local(k, "acc", AP_DT_F32, (int64_t)MI * NI * 4);
		c->lane = ap_kir_bind(k, v->cur, k->index_type, "lane", ap_kir_binary(k, AP_KIR_AND, c->tid, I(c, 31)));
		c->wg0 = ap_kir_bind(k, v->cur, k->index_type, "wg",
				     ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, wgi, I(c, c->c.tn)), c->c.bm / c->c.tm));
		c->wm0 = ap_kir_bind(k, v->cur, k->index_type, "wm", ap_kir_add(k, c->wg0, ap_kir_muli(k, q, 16)));
		c->wn0 = ap_kir_bind(k, v->cur, k->index_type, "wn",
				     ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, wgi, I(c, c->c.tn)), c->c.bn / c->c.tn));
	} else if (p->tc) {
		int na, nb, nc, MI = c->c.bm / c->c.tm / 16, NI = c->c.bn / c->c.tn / 8;
		ap_kir_expr *warp = ap_kir_binary(k, AP_KIR_SHR, c->tid, I(c, 5));

		ap_kir_mma_frag_sizes(p->mma, &na, &nb, &nc);
		c->fa = ap_kir_local(k, "fa", p->in_t, (int64_t)MI * na);
		c->fb = ap_kir_local(k, "fb", p->in_t, (int64_t)NI * nb);
		c->acc = ap_kir_local(k, "acc", AP_DT_F32, (int64_t)MI * NI * nc);
		c->lane = ap_kir_bind(k, v->cur, k->index_type, "lane", ap_kir_binary(k, AP_KIR_AND, c->tid, I(c, 31)));
		/* warp (wm, wn), wn fastest */
		c->wm0 = ap_kir_bind(k, v->cur, k->index_type, "wm",
				     ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, warp, I(c, c->c.tn)), c->c.bm / c->c.tm));
		c->wn0 = ap_kir_bind(k, v->cur, k->index_type, "wn",
				     ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, warp, I(c, c->c.tn)), c->c.bn / c->c.tn));
	} else {
		c->fa = ap_kir_local_scratch(k, "fa", p->acc_t, c->c.tm);
		c->fb = ap_kir_local_scratch(k, "fb", p->acc_t, c->c.tn);
		c->acc = ap_kir_local(k, "acc", p->acc_t, (int64_t)c->c.tm * c->c.tn);
		c->tx = ap_kir_bind(k, v->cur, k->index_type, "tx",
				    ap_kir_binary(k, AP_KIR_REM, c->tid, I(c, c->c.bn / c->c.tn)));
		c->ty = ap_kir_bind(k, v->cur, k->index_type, "ty",
				    ap_kir_binary(k, AP_KIR_DIV, c->tid, I(c, c->c.bn / c->c.tn)));
	}
}

/* Whether every array declared so far exists (no allocation failed). */
static bool declared(gctx *c)
{
	return !ap_kir_failed(c->k) && c->sa && c->sb && (c->p->wg || (c->fa && c->fb)) && c->acc &&
	       (c->a_mode == STAGE_TILE || c->pa) && (c->a_mode != STAGE_PAIRS || c->qa) &&
	       (c->b_mode == STAGE_TILE || c->pb) && (c->b_mode != STAGE_PAIRS || c->qb) &&
	       (c->c.splitk <= 1 || c->red);
}

/* Rows of tiles a band of the persistent forms' grouped order holds. */
#define TILE_BAND 8

/* A tile's index within its batch, `rest`, split into the tile's first
 * row and column, bound in b as mname and nname.  Tiles row-major; the
 * persistent forms (tma >= 1, a block an SM walking tiles in waves)
 * group them: bands of TILE_BAND rows of tiles (the last band what is
 * left), each band column by column, so that a wave of consecutive
 * tiles re-reads a few rows of A and columns of B from L2 rather than
 * one row of A and all of B (Triton's grouped ordering, CUTLASS's tile
 * swizzle).  With m = rest % (band rows) the division by the last
 * band's height is a second constant one, selected. */
void ap__gemm_tile_origin(gctx *c, ap_kir_block *b, ap_kir_expr *rest, const char *mname,
			  const char *nname, ap_kir_expr **m0, ap_kir_expr **n0)
{
	ap_kir_kernel *k = c->k;
	ap_kir_expr *m, *n;
	int64_t G = c->tiles_m < TILE_BAND ? c->tiles_m : TILE_BAND, band = G * c->tiles_n, last = c->tiles_m % G;

	if (!c->c.tma || c->tiles_m <= 1 || c->tiles_n <= 1) {
		m = ap_kir_binary(k, AP_KIR_DIV, rest, I(c, c->tiles_n));
		n = ap_kir_binary(k, AP_KIR_REM, rest, I(c, c->tiles_n));
	} else {
		ap_kir_expr *r = ap_kir_bind(k, b, k->index_type, "band_r", ap_kir_binary(k, AP_KIR_REM, rest, I(c, band)));
		ap_kir_expr *first = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, rest, I(c, band)), G);

		m = ap_kir_binary(k, AP_KIR_REM, r, I(c, G));
		n = ap_kir_binary(k, AP_KIR_DIV, r, I(c, G));
		if (last) {   /* the last band, `last` rows high */
			ap_kir_expr *in_last = ap_kir_binary(k, AP_KIR_GE, rest, I(c, (c->tiles_m - last) * c->tiles_n));

			m = ap_kir_select(k, in_last, ap_kir_binary(k, AP_KIR_REM, r, I(c, last)), m);
			n = ap_kir_select(k, in_last, ap_kir_binary(k, AP_KIR_DIV, r, I(c, last)), n);
		}
		m = ap_kir_add(k, first, m);
	}
	*m0 = ap_kir_bind(k, b, k->index_type, mname, ap_kir_muli(k, m, c->c.bm));
	*n0 = ap_kir_bind(k, b, k->index_type, nname, ap_kir_muli(k, n, c->c.bn));
}

/* Opens the grid-stride loop over the output tiles (*saved closes it):
 * a barrier (the previous tile's last stage is read by everyone), then
 * the tile's batch bi (c->tb_index; not folded: its coordinates
 * c->bcoord, row-major over Y's batch dims) and its first row and column
 * c->m0, c->n0 (tiles row-major within a batch). */
static void open_tile(gctx *c, ap_kir_block **saved)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const gemm_plan *p = c->p;
	ap_kir_var *tile;
	ap_kir_expr *r, *bi, *rest;
	int64_t per = (int64_t)c->tiles_m * c->tiles_n;

	tile = ap_v_loop(v, "tile", ap_kir_index_of(k, c->c.splitk > 1 ? AP_KIR_CLUSTER_X : AP_KIR_BLOCK_X),
			 I(c, c->tiles), c->grid, saved);
	if (c->c.tma < 2)   /* warp specialised: the consumers' own tiles; stages come by barrier */
		ap_kir_barrier(k, v->cur);
	r = ap_kir_ref(k, tile);
	c->tile = ap_kir_ref(k, tile);
	bi = ap_kir_bind(k, v->cur, k->index_type, "bi", ap_kir_binary(k, AP_KIR_DIV, r, I(c, per)));
	rest = ap_kir_binary(k, AP_KIR_REM, r, I(c, per));
	ap__gemm_tile_origin(c, v->cur, rest, "m0", "n0", &c->m0, &c->n0);
	c->tb_index = bi;
	if (!p->fold)
		ap__gemm_batch_coords(c, v->cur, bi, "b", c->bcoord);
}

void ap__gemm_batch_coords(gctx *c, ap_kir_block *b, ap_kir_expr *bi, const char *name, ap_kir_expr **bc)
{
	const gemm_plan *p = c->p;
	int64_t stride = 1;

	for (int d = p->nb - 1; d >= 0; d--) {
		bc[d] = p->bdims[d] == 1 ? I(c, 0)
			: ap_kir_bind(c->k, b, c->k->index_type, name,
				      ap_kir_binary(c->k, AP_KIR_REM, ap_kir_binary(c->k, AP_KIR_DIV, bi, I(c, stride)),
						    I(c, p->bdims[d])));
		stride *= p->bdims[d];
	}
}

/* At the start of a tile: the registers of register-staged loads (ra,
 * rb: declared here so that they live from the issue to the store) and
 * the accumulators set to zero. */
static void clear_tile(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;

	ap__gemm_declare_regs(c);
	{
		ap_kir_var *e = ap_kir_var_new(k, k->index_type, "z");
		ap_kir_stmt *lz = ap_kir_for_unroll(k, v->cur, e, I(c, 0), I(c, c->acc->size), 1, -1);

		if (lz)
			ap_kir_store(k, &lz->body, c->acc, ap_kir_ref(k, e), ap_kir_const(k, c->acc->type, 0));
	}
}

/* The arithmetic of the K tile in stage st: wgmma, mma.sync or SIMT. */
void ap__gemm_compute_tile(gctx *c, ap_kir_expr *st)
{
	if (c->p->wg)
		compute_wg(c, st);
	else if (c->p->tc)
		compute_tc(c, st);
	else
		compute_simt(c, st);
}

/* The K loop with one stage: load, wait, compute (the host's default:
 * its threads run one after the other, there is no latency to hide). */
static void mainloop_single(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *ksaved;
	ap_kir_var *kt = ap_v_loop(v, "kt", I(c, 0), I(c, c->ktl), 1, &ksaved);

	ap_kir_barrier(k, v->cur);
	ap__gemm_issue_tile(c, I(c, 0), ap_kir_add(k, c->kofs, ap_kir_ref(k, kt)));
	ap__gemm_complete_tile(c, I(c, 0));
	if (c->a_async || c->b_async) {
		ap_kir_cp_commit(k, v->cur);
		ap_kir_cp_wait(k, v->cur, 0);
	}
	tiles_ready(c);
	ap__gemm_extract_tile(c, I(c, 0), ap_kir_add(k, c->kofs, ap_kir_ref(k, kt)));
	ap__gemm_compute_tile(c, I(c, 0));
	ap_v_close(v, ksaved);
}

/* The K loop with S >= 2 stages (the file comment): a prologue issuing
 * tiles 0 .. D-1 (one cp.async group each, empty past the block's last
 * K tile); then per K tile kt: wait for its group, issue tile kt + D
 * into the stage tile kt + D - S used, compute tile kt, and store the
 * registers of the register-staged loads into their stage; the last
 * groups are waited for after the loop.  D is S - 1, or S - 2 when a
 * tile's wgmma stay in flight through the next tile (c->wg_overlap: the
 * stage of tile kt - 1 is still being read while tile kt is issued). */
static void mainloop_pipelined(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int S = c->c.stages, D = c->wg_overlap ? S - 2 : S - 1;
	ap_kir_block *ksaved, *saved;
	ap_kir_var *kt, *stv = NULL, *nsv = NULL;
	ap_kir_expr *stage, *nxt, *nst, *more;

	ap__gemm_hoist_copies(c);
	/* prologue: stages 0 .. D-1 */
	for (int st = 0; st < D; st++) {
		if (st < c->ktl) {
			ap__gemm_issue_tile(c, I(c, st), ap_kir_addi(k, c->kofs, st));
			ap__gemm_complete_tile(c, I(c, st));
		}
		if (c->a_async || c->b_async)
			ap_kir_cp_commit(k, v->cur);
	}
	/* the stages of tile kt and of tile kt + D: kt % S and (kt + D) % S,
	 * carried across iterations (S > 2: advanced by a compare and select
	 * at the end of each, no division in the loop) */
	if (S > 2) {
		stv = ap_kir_var_new(k, k->index_type, "st");
		nsv = ap_kir_var_new(k, k->index_type, "ns");
		ap_kir_let(k, v->cur, stv, I(c, 0));
		ap_kir_let(k, v->cur, nsv, I(c, D));
	}
	/* main loop */
	kt = ap_v_loop(v, "kt", I(c, 0), I(c, c->ktl), 1, &ksaved);
	if (c->a_async || c->b_async)
		ap_kir_cp_wait(k, v->cur, D - 1);
	tiles_ready(c);
	stage = S == 2 ? ap_kir_bind(k, v->cur, k->index_type, "st", ap_kir_binary(k, AP_KIR_AND, ap_kir_ref(k, kt), I(c, 1)))
		       : ap_kir_ref(k, stv);
	ap__gemm_extract_tile(c, stage, ap_kir_add(k, c->kofs, ap_kir_ref(k, kt)));
	nxt = ap_kir_bind(k, v->cur, k->index_type, "nx", ap_kir_addi(k, ap_kir_ref(k, kt), D));
	nst = S == 2 ? ap_kir_bind(k, v->cur, k->index_type, "ns", ap_kir_binary(k, AP_KIR_AND, nxt, I(c, 1)))
		     : ap_kir_ref(k, nsv);
	more = ap_kir_binary(k, AP_KIR_LT, nxt, I(c, c->ktl));
	ap_v_if(v, more, &saved, NULL);
	ap__gemm_issue_tile(c, nst, ap_kir_add(k, c->kofs, nxt));
	ap_v_close(v, saved);
	if (c->a_async || c->b_async)
		ap_kir_cp_commit(k, v->cur);
	ap__gemm_compute_tile(c, stage);
	if (!c->a_async || !c->b_async) {
		ap_v_if(v, more, &saved, NULL);
		ap__gemm_complete_tile(c, nst);
		ap_v_close(v, saved);
	}
	for (int i = 0; S > 2 && i < 2; i++) {
		ap_kir_var *x = i ? nsv : stv;

		ap_kir_assign(k, v->cur, x, ap_kir_select(k, ap_kir_binary(k, AP_KIR_EQ, ap_kir_ref(k, x), I(c, S - 1)),
							  I(c, 0), ap_kir_addi(k, ap_kir_ref(k, x), 1)));
	}
	ap_v_close(v, ksaved);
	if (c->wg_overlap)   /* the last tile's products */
		ap_kir_wgmma_wait(k, v->cur, 0, c->acc);
	if (c->a_async || c->b_async)
		ap_kir_cp_wait(k, v->cur, 0);
}

/* Whether the tensor-core epilogue stores its C fragments' element pairs
 * (2t, 2t + 1 of a row: adjacent columns) as one vector store each: every
 * output of the micro-graph is Y's element's value at Y's own index (no
 * view, transpose, part or Concat between them: ap_emap with no steps), Y
 * is a row-major matrix (not a convolution's NCHW) of an even number of
 * columns (so a pair starts at an even element: aligned), the output
 * types make a vector of two, at most PAIR_OUTPUTS_MAX outputs, and with
 * split-K a pair never straddles two
 * ranks' shares of the accumulators. */
#define PAIR_OUTPUTS_MAX 8
static bool pair_stores(gctx *c)
{
	const ap_graph *g = c->g;

	if (g->n_outputs > PAIR_OUTPUTS_MAX || c->p->conv || c->p->N % 2 || (c->c.splitk > 1 && (c->acc->size / c->c.splitk) % 2))
		return false;
	for (int i = 0; i < g->n_outputs; i++) {
		const ap_emap *mp = &c->p->maps[g->outputs[i]];

		if (!mp->derived || mp->n || !ap_kir_vector_ok(g->tensors[g->outputs[i]].dtype, 2))
			return false;
	}
	return true;
}

/* The outputs of accumulator elements acc[ai] and acc[ai + 1], Y[row][col]
 * and Y[row][col + 1] (pair_stores holds; the caller checks the pair is
 * inside the problem): both values of every output, then one two-wide
 * vector store each (the epilogue's stores halved: issue 25, item 2). */
static void store_output_pairs(gctx *c, ap_kir_expr *ai, ap_kir_expr *row, ap_kir_expr *col)
{
	ap_kir_kernel *k = c->k;
	const ap_graph *g = c->g;
	ap_kir_expr *vals[PAIR_OUTPUTS_MAX][2];
	int n = g->n_outputs;

	for (int j = 0; j < 2 && !c->v->rc; j++) {
		ap_lidx ix = y_index(c, row, ap_kir_addi(k, col, j));

		c->acc_index = ap_kir_addi(k, ai, j);
		for (int i = 0; i < n && !c->v->rc; i++) {
			ap_lidx r = ix;
			ap_kir_var *x = ap_kir_var_new(k, g->tensors[g->outputs[i]].dtype, "w");

			ap_kir_let(k, c->v->cur, x, ap_val(c->v, g->outputs[i], &r));
			vals[i][j] = ap_kir_ref(k, x);
		}
	}
	for (int i = 0; i < n && !c->v->rc; i++) {
		ap_lidx ix = y_index(c, row, col);

		ap_kir_vstore(k, c->v->cur, ap_v_buffer(c->v, g->outputs[i]), ap_lidx_linear(c->v, &ix), 2, vals[i]);
	}
}

/* The epilogue on tensor cores: each lane holds, per (mi, ni) tile, the
 * m16n8 C fragment's elements e = 0..3 at row g + 8 * (e / 2) and column
 * 2t + e % 2 (g = lane / 4, t = lane % 4); each inside the problem (and,
 * with split-K, this block's to store: own_element) has its outputs
 * stored. */
static void epilogue_tc(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const gemm_plan *p = c->p;
	int na, nb, nc, MI = c->c.bm / c->c.tm / (p->wg ? 64 : 16), NI = c->c.bn / c->c.tn / 8;
	ap_kir_var *mi, *ni, *e;
	ap_kir_block *s1, *s2, *s3, *s4;
	ap_kir_expr *g4 = ap_kir_binary(k, AP_KIR_SHR, c->lane, I(c, 2));
	ap_kir_expr *q4 = ap_kir_binary(k, AP_KIR_AND, c->lane, I(c, 3));
	ap_kir_expr *row, *col, *ai, *in, *own;

	bool pairs = pair_stores(c);
	ap_kir_expr *ev;

	ap_kir_mma_frag_sizes(p->mma, &na, &nb, &nc);
	mi = ap_v_loop_unrolled(v, "mi", MI, &s1);
	ni = ap_v_loop_unrolled(v, "ni", NI, &s2);
	/* element e of the fragment (pairs: e = 2 * e2, and e + 1 with it) */
	e = ap_v_loop_unrolled(v, "e", pairs ? 2 : 4, &s3);
	ev = pairs ? ap_kir_muli(k, ap_kir_ref(k, e), 2) : ap_kir_ref(k, e);
	row = ap_kir_add(k, ap_kir_add(k, c->m0, c->wm0),
			 ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, mi), p->wg ? 64 : 16),
				    ap_kir_add(k, g4, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_SHR, ev, I(c, 1)), 8))));
	col = ap_kir_add(k, ap_kir_add(k, c->n0, c->wn0),
			 ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, ni), 8),
				    ap_kir_add(k, ap_kir_muli(k, q4, 2), ap_kir_binary(k, AP_KIR_AND, ev, I(c, 1)))));
	ai = ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, mi), NI),
						   ap_kir_ref(k, ni)), nc), ev);
	own = own_element(c, ai);
	row = ap_kir_bind(k, v->cur, k->index_type, "row", row);
	col = ap_kir_bind(k, v->cur, k->index_type, "col", col);
	in = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_LT, row, I(c, p->Mr)),
			   ap_kir_binary(k, AP_KIR_LT, col, I(c, p->N)));
	ap_v_if(v, own ? ap_kir_binary(k, AP_KIR_LAND, own, in) : in, &s4, NULL);
	if (pairs)
		store_output_pairs(c, ai, row, col);
	else
		store_outputs(c, ai, row, col);
	ap_v_close(v, s4);
	ap_v_close(v, s3);
	ap_v_close(v, s2);
	ap_v_close(v, s1);
}

/* The epilogue in SIMT: thread (ty, tx) holds rows m0 + ty * tm + i and
 * columns n0 + tx * tn + j, acc[i * tn + j]; each inside the problem
 * (checked only where the problem does not fill the tile) and this
 * block's to store under split-K has its outputs stored. */
static void epilogue_simt(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const gemm_plan *p = c->p;
	ap_kir_var *i, *j;
	ap_kir_block *s1, *s2, *s3;
	ap_kir_expr *row, *col, *ai, *in;

	i = ap_v_loop_unrolled(v, "i", c->c.tm, &s1);
	j = ap_v_loop_unrolled(v, "j", c->c.tn, &s2);
	row = ap_kir_bind(k, v->cur, k->index_type, "row",
			  ap_kir_add(k, c->m0, ap_kir_add(k, ap_kir_muli(k, c->ty, c->c.tm), ap_kir_ref(k, i))));
	col = ap_kir_bind(k, v->cur, k->index_type, "col",
			  ap_kir_add(k, c->n0, ap_kir_add(k, ap_kir_muli(k, c->tx, c->c.tn), ap_kir_ref(k, j))));
	ai = ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, i), c->c.tn), ap_kir_ref(k, j));
	in = own_element(c, ai);
	if (p->Mr % c->c.bm) {
		ap_kir_expr *cm = ap_kir_binary(k, AP_KIR_LT, row, I(c, p->Mr));

		in = in ? ap_kir_binary(k, AP_KIR_LAND, in, cm) : cm;
	}
	if (p->N % c->c.bn) {
		ap_kir_expr *cn = ap_kir_binary(k, AP_KIR_LT, col, I(c, p->N));

		in = in ? ap_kir_binary(k, AP_KIR_LAND, in, cn) : cn;
	}
	if (in)
		ap_v_if(v, in, &s3, NULL);
	store_outputs(c, ai, row, col);
	if (in)
		ap_v_close(v, s3);
	ap_v_close(v, s2);
	ap_v_close(v, s1);
}

/* The kernel (the file comment): per output tile, the K loop (one stage
 * or a pipeline), split-K's cluster reduction, and the epilogue, which
 * reads the accumulators as Y through the value builder's leaf hook.
 * Errors: AP_EUNSUPPORTED (not a GEMM this emitter builds, or a
 * configuration that does not fit the target), AP_ENOMEM. */
int ap__gemm_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err)
{
	const ap_mgraph *m = b->m;
	const ap_target_info *t = b->t;
	const gemm_plan *p = b->an;
	const gemm_res *r = (const gemm_res *)pl->x;
	gctx c;
	ap_vctx v;
	int rc;
	ap_kir_block *tsaved, *outer;

	memset(&c, 0, sizeof(c));
	c.m = m;
	c.g = m->g;
	c.p = p;
	c.r = r;
	c.c = r->c;
	c.t = t;
	c.k = k;
	if (!r->fits)
		return ap_error_set(err, AP_EUNSUPPORTED, m->g->nodes[m->root].name, NULL,
				    "gemm emitter: configuration %dx%dx%d/%dx%d/%d does not fit the target",
				    c.c.bm, c.c.bn, c.c.bk, c.c.tm, c.c.tn, c.c.stages);
	if ((rc = ap_vctx_init(&v, m, k, err)))
		return rc;
	c.v = &v;
	c.nt = r->threads;
	ap__gemm_tile_layouts(p, &c.a_rowk, &c.b_rowk);
	choose_staging(&c);
	/* wgmma's overlap needs a stage between the one read and the one
	 * filled, and operands staged straight into their stages (a pair- or
	 * compute-staged operand has one tile, rewritten every K tile) */
	c.wg_overlap = p->wg && c.c.stages >= 3 && c.a_mode == STAGE_TILE && c.b_mode == STAGE_TILE;
	if (c.c.tma >= 2)   /* each stage released by barrier: one K tile in flight needs no spare stage */
		c.wg_overlap = true;
	declare_shared(&c);
	set_launch(&c);
	declare_threads(&c);
	if (!declared(&c)) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a matmul");
		goto done;
	}
	/* the registers of register-staged loads (declared per tile by
	 * clear_tile; with a copying producer, tma=3, the producer's 128
	 * threads hold them, declared per K tile by gemm_tma.c) */
	if (c.c.tma == 3)
		c.nt = 128;
	c.a_regs = c.a_async ? 0 : ap__gemm_reg_count(&c, 0);
	c.b_regs = c.b_async ? 0 : ap__gemm_reg_count(&c, 1);
	c.nt = r->threads;
	c.a_reg = calloc((size_t)c.a_regs + 1, sizeof(*c.a_reg));
	c.b_reg = calloc((size_t)c.b_regs + 1, sizeof(*c.b_reg));
	if (!c.a_reg || !c.b_reg) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a matmul");
		goto done;
	}
	outer = v.cur;
	if (c.c.tma && (c.c.tma >= 2 ? ap__gemm_ws_setup(&c, &v.cur) : ap__gemm_tma_setup(&c)) < 0) {
		rc = ap_error_set(err, ap_kir_failed(k) ? AP_ENOMEM : AP_EINTERNAL, NULL, NULL,
				  "gemm emitter: the operands' tensor maps (tma=%d) could not be made", c.c.tma);
		goto done;
	}
	if (c.c.tma == 3)   /* the producer's registers; the consumers have none */
		c.a_regs = c.b_regs = 0;
	open_tile(&c, &tsaved);
	clear_tile(&c);
	if (c.c.tma >= 2)
		ap__gemm_mainloop_ws(&c);
	else if (c.c.tma)
		ap__gemm_mainloop_tma(&c, c.tile);
	else if (c.c.stages == 1)
		mainloop_single(&c);
	else
		mainloop_pipelined(&c);
	if (c.c.splitk > 1)
		splitk_reduce(&c);
	v.leaf = acc_leaf;
	v.leaf_user = &c;
	if (p->tc)
		epilogue_tc(&c);
	else
		epilogue_simt(&c);
	v.leaf = NULL;
	if (c.c.splitk > 1)   /* the cluster's partials are read: the next tile may reuse them */
		ap_kir_cluster_barrier(k, v.cur);
	ap_v_close(&v, tsaved);
	v.cur = outer;   /* out of the consumers' arm (tma=2, 3) */
	rc = v.rc;
	if (rc == 0 && r->lib && ap__gemm_attach_library(b, &pl->s, k) < 0)
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a matmul");
done:
	free(c.a_reg);
	free(c.b_reg);
	ap_vctx_clear(&v);
	return rc;
}
