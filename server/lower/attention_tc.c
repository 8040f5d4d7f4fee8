/* attention_tc.c -- the attention emitter's tensor-core form: 16 query
 * rows a warp on mma.sync (float16, bfloat16; TF32 for float32 with
 * allow_tf32), and on sm_90a a warpgroup per 64 query rows on wgmma (see
 * attention.c).
 */
#include "attention_internal.h"

#include "common/tmap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rounds the n float32 elements of register array f to TF32 (what the
 * tensor core reads of them: PTX cvt.rna.tf32.f32). */
static void round_tf32(actx *c, ap_kir_array *f, int n)
{
	ap_kir_block *saved;
	ap_kir_var *i = ap_v_loop_unrolled(c->v, "r", n, &saved);

	ap_kir_store(c->k, c->v->cur, f, ap_kir_ref(c->k, i),
		     ap_kir_call(c->k, AP_KIR_TF32, ap_kir_load(c->k, f, ap_kir_ref(c->k, i)), NULL));
	ap_v_close(c->v, saved);
}

/* TF32: the probabilities of the warp's 16 rows, held in the m16n8 C
 * layout in cf (per n8 tile j: P[g][2t, 2t + 1], P[g + 8][2t, 2t + 1]),
 * into the m16n8k8 A layout in af (per k8 step j: P[g][t], P[g + 8][t],
 * P[g][t + 4], P[g + 8][t + 4]), rounded to TF32.  P[g][c] sits in lane
 * 4g + c / 2, element c % 2: two source lanes, 4g + t / 2 and
 * 4g + 2 + t / 2, each shuffled (its four elements; the caller's parity
 * picks). */
static void tf32_a_from_c(actx *c, ap_kir_array *cf, ap_kir_array *af, int tiles, ap_kir_expr *tq)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *lane = ap_kir_binary(k, AP_KIR_AND, ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, 31));
	ap_kir_expr *odd = ap_kir_bind(k, v->cur, AP_DT_BOOL, "od",
				       ap_kir_binary(k, AP_KIR_NE, ap_kir_binary(k, AP_KIR_AND, tq, ap_kir_idx(k, 1)),
						     ap_kir_idx(k, 0)));
	ap_kir_expr *src[2];
	ap_kir_block *saved;
	ap_kir_var *j;

	src[0] = ap_kir_bind(k, v->cur, k->index_type, "sl",
			     ap_kir_add(k, ap_kir_binary(k, AP_KIR_AND, lane, ap_kir_idx(k, ~3)),
					ap_kir_binary(k, AP_KIR_SHR, tq, ap_kir_idx(k, 1))));
	src[1] = ap_kir_bind(k, v->cur, k->index_type, "sl", ap_kir_addi(k, src[0], 2));
	j = ap_v_loop_unrolled(v, "pj", tiles, &saved);
	for (int h = 0; h < 2; h++)          /* source lane: columns t, t + 4 */
		for (int r = 0; r < 2; r++) {    /* rows g, g + 8 */
			ap_kir_var *x[2];

			for (int e = 0; e < 2; e++) {
				x[e] = ap_kir_var_new(k, AP_DT_F32, "px");
				ap_kir_let(k, v->cur, x[e], NULL);
				ap_kir_shfl(k, v->cur, x[e], AP_KIR_SHFL_IDX,
					    ap_kir_load(k, cf, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, j), 4), 2 * r + e)),
					    src[h], 32);
			}
			ap_kir_store(k, v->cur, af, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, j), 4), 2 * h + r),
				     ap_kir_call(k, AP_KIR_TF32,
						 ap_kir_select(k, odd, ap_kir_ref(k, x[1]), ap_kir_ref(k, x[0])), NULL));
		}
	ap_v_close(v, saved);
}

/* ---- the tensor-core form ---------------------------------------------------------------
 *
 * FlashAttention-2's warp layout (Dao, "FlashAttention-2", 2023, section
 * 3.3) on mma.sync m16n8k16: a block takes 16 * W query rows of one batch,
 * 16 rows a warp, and walks the keys in tiles of BK.  Q's tile is staged
 * in shared memory once and held as A fragments (ldmatrix .x4); each key
 * tile of K and V is staged in shared memory (rows padded by tc_ldq /
 * tc_ldv; zero past the head dims and past the last key).  For a tile:
 *   S = Q K^T      K's rows are B's columns: ldmatrix .x2, mma into BK / 8
 *                  accumulator fragments (float32);
 *   scores         the first product's epilogue on each element a lane
 *                  holds (rows g and g + 8 of the warp's 16, g = lane / 4),
 *                  -inf past the last key;
 *   online softmax a row's maximum over the four lanes that hold it (two
 *                  xor shuffles), exp(s - m') in float32, the lane's part
 *                  of the row sum kept per lane (the four are summed at
 *                  the end: the rescale factor is the same for all four);
 *   O += P V       the score fragments of two n8 tiles are, element for
 *                  element, the A fragment of one k16 step (the m16n8k16
 *                  C and A layouts, kir.h), so P goes to 16-bit registers
 *                  without shared memory; V's tile is B with its rows
 *                  along k: ldmatrix .x2 .trans.
 * With K and V both copied by cp.async the tiles have two stages: the
 * next tile's copies are issued before this tile's products.  At the end
 * O = acc / l through O's epilogue; the statistics other kernels read as
 * in the SIMT form.  P is rounded to the operand type before PV as the
 * unfused graph rounds its probabilities, but before the division by the
 * sum (as FlashAttention does).  TF32 (m16n8k8, float32 registers): Q and
 * K through 32-bit ldmatrix, V's B fragments one element a lane, P moved
 * from the C layout to the A layout by shuffles (tf32_a_from_c), every
 * operand rounded to TF32 first. */

/* A tensor map of Q, K or V (knob tma): its dimensions, innermost first,
 * as factors of the operand's strided view -- dim[i] the view's
 * dimension, fac[i] the factor (op_map_of). */
typedef struct op_map {
	int n;
	int dim[AP_TMAP_MAX_RANK], fac[AP_TMAP_MAX_RANK];
} op_map;

/* The tensor-core form's state (emit_tc and its steps): W warps of 16
 * query rows (BQ = 16 * W), key tiles of BK in NST stages. */
typedef struct att_tc {
	actx *c;
	ap_dtype T, A;                  /* the operand type; float32 accumulators */
	int64_t Dp, Dvp, ldq, ldv;      /* padded head dims; shared row lengths (tc_ldq, tc_ldv) */
	int BK, BQ, NST;
	int NS, NO;                     /* n8 tiles of a score tile (BK / 8) and of O (Dvp / 8) */
	bool tf32;
	int KS;                         /* k step of an mma */
	int AF, BF, CF;                 /* elements of the A, B and C fragments a lane */
	int64_t ntiles;                 /* key tiles */
	ap_kir_expr *nt;                /* those the current query tile visits: ntiles, or under a
					   causal mask those up to its last row's diagonal
					   (tile_bound) */
	ap_kir_array *qs, *ks, *vs;     /* shared: Q's tile, the K and V tiles */
	ap_kir_array *qf, *kf, *vf;     /* registers: Q's A fragments, a B fragment of K, of V */
	ap_kir_array *sacc, *pf, *oacc; /* registers: scores (C), probabilities (A), O (C) */
	ap_kir_expr *warp, *lane, *g, *tq;       /* g = lane / 4, tq = lane % 4 */
	ap_kir_expr *l8, *l16, *hi, *j2;         /* lane % 8, lane % 16, lane / 16, (lane / 8) % 2 */
	ap_kir_expr *wrow, *ninf;       /* the warp's first row; -inf */
	ap_kir_var *mrun[2], *lrun[2];  /* running max and sum of rows g (0) and g + 8 (1) */
	double sc;                      /* the scale folded into the exponent (p->sfold), else 1:
					   sacc and mrun hold Y1 and its maxima, S / sc */
	/* the current key tile */
	ap_kir_expr *key0, *kbase, *vbase;   /* its first key; its stage's K and V offsets */
	ap_kir_expr *mnew[2], *dead[2], *alpha[2];
	ap_kir_expr *mlog2[2];          /* the exponent's offset: mnew log2(e), 0 while dead */
	ap_kir_var *rs[2];              /* the lane's part of the tile's row sums */
	/* knob tma: the operands' maps (Q's where p->q_tma), the mbarriers
	 * full[0..1] of the K / V stages and full[2] of Q's tile, the key
	 * tiles this block loaded before the current query tile (a stage's
	 * uses continue across query tiles: tile kt of this one is the
	 * block's kn + kt-th, in stage (kn + kt) % 2, phase parity
	 * ((kn + kt) / 2) % 2) and Q's phase parity qph */
	op_map map[3];
	ap_kir_array *full;
	ap_kir_var *kn, *qph;
	/* tma=2 (warp specialised): the stages' and Q's release barriers
	 * empty[0..2] (count: the query warpgroups), and the thread that
	 * issues the loads (the producer warpgroup's first; 0 otherwise) */
	ap_kir_array *empty;
	unsigned issuer;
	/* ping-pong (knob overlap 2): turn[g] completes a phase when the
	 * other query warpgroup has issued a key tile's products (count 4:
	 * each of its warps' first lane); wgx, this warpgroup's g (0, 1) */
	ap_kir_array *turn;
	ap_kir_expr *wgx;
} att_tc;

/* ---- Q, K and V by TMA (knob tma, wgmma) -------------------------------------------
 *
 * A swizzled wgmma tile of R rows whose contiguous coordinate (the head
 * dim) spans ja = swizzle / es elements per atom row is, atom column by
 * atom column, a TMA box of ja x R elements with the same swizzle:
 * columns i ja .. lie at i R ja (ap__wg_swizzled_place; gemm_tma.c's file
 * comment says why, check_kir's tmap_load_swizzled pins it).  K's and V's
 * key tiles are both such tiles (R = BK keys; K read K-major, V MN-major,
 * the same placement), so a stage is Dp / ja boxes of K and Dvp / ja of
 * V, box i at head-dim coordinate i ja and key key0, every batch
 * coordinate the block's; Q's tile (R = BQ query rows, K-major) likewise,
 * where Q is a map too.  A map's dimensions are the view's factors (head,
 * row, then the batch dims' factors of extent > 1): past D, Dv, Nq and Nk
 * the boxes are zero-filled, which is the padding the tiles need.
 * Thread 0 expects the tile's bytes on its mbarrier and issues the
 * boxes; every thread waits on the tile it reads (the phase form of
 * docs/hopper-pipeline.md, as the GEMM's tma=1). */

/* Operand `role`'s (0 Q, 1 K^T, 2 V) map with boxes of ja head-dim
 * elements x `rows` rows (queries or keys), swizzled by sw bytes, zero
 * fill: *m its dimensions, *d the description.  False when the view is
 * not such a map (ap__att_op_tma's rules). */
static bool op_map_of(const ap_graph *g, const att_plan *p, int role, int ja, int rows, int sw, op_map *m,
		      ap_tmap_desc *d)
{
	const ap_sview *sv = &p->sv[role];
	int rank = g->tensors[role == 0 ? p->q : role == 1 ? p->kt : p->v].rank;
	int hd = role == 1 ? rank - 2 : rank - 1, kd = role == 1 ? rank - 1 : rank - 2;
	int64_t es = (int64_t)ap_dtype_size(p->t);

	memset(m, 0, sizeof(*m));
	memset(d, 0, sizeof(*d));
	if (!p->aw[role] || ja <= 0 || sv->off != 0 || sv->rank != rank || sv->first[hd + 1] - sv->first[hd] != 1 ||
	    sv->first[kd + 1] - sv->first[kd] != 1 || sv->fs[sv->first[hd]] != 1)
		return false;
	m->dim[0] = hd;
	m->fac[0] = sv->first[hd];
	m->dim[1] = kd;
	m->fac[1] = sv->first[kd];
	m->n = 2;
	for (int dd = rank - 3; dd >= 0; dd--)
		for (int q = sv->first[dd + 1] - 1; q >= sv->first[dd]; q--) {
			if (sv->fe[q] <= 1 || sv->fs[q] == 0)   /* one index, or broadcast (grouped-query K, V) */
				continue;
			if (m->n == AP_TMAP_MAX_RANK)
				return false;
			m->dim[m->n] = dd;
			m->fac[m->n++] = q;
		}
	d->dtype = ap_tmap_dtype_of(p->t);
	d->rank = m->n;
	for (int i = 0; i < m->n; i++) {
		int64_t fs = sv->fs[m->fac[i]];

		d->dims[i] = (uint64_t)sv->fe[m->fac[i]];
		if (i > 0 && (fs <= 0 || (fs * es) % 16))
			return false;
		if (i > 0)
			d->strides[i - 1] = (uint64_t)(fs * es);
		d->box[i] = i == 0 ? (uint32_t)ja : i == 1 ? (uint32_t)rows : 1u;
		d->estrides[i] = 1;
	}
	d->swizzle = ap_tmap_swizzle_of((unsigned)sw);
	d->l2 = AP_TMAP_L2_128B;
	d->oob = AP_TMAP_OOB_ZERO;
	return ap_tmap_check(d, NULL, NULL, 0) == 0;
}

/* (attention_internal.h) */
bool ap__att_op_tma(const ap_graph *g, const att_plan *p, int role)
{
	size_t es = ap_dtype_size(p->t);
	int sw = tc_wg_swizzle(role == 2 ? tc_dvpad(p) : tc_dpad(p), es);
	op_map m;
	ap_tmap_desc d;

	/* rows: the largest tile of either kind (128 query rows, 64 keys) */
	return sw > 0 && op_map_of(g, p, role, sw / (int)es, role ? 64 : 128, sw, &m, &d);
}

/* The coordinates (innermost first) of operand `role`'s box at head-dim
 * column `head` and row (query or key) `row` for the block's batch: per
 * map dimension its factor's part of the view's index
 * (ap_sview_factor_coord, as ap_sview_offset splits it). */
static void op_coords(att_tc *s, int role, ap_kir_expr *head, ap_kir_expr *row, ap_kir_expr **co)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	const op_map *m = &s->map[role];
	ap_lidx ix = role == 1 ? ap__att_idx2(c, p->kt, head, row)
			       : ap__att_idx2(c, role == 0 ? p->q : p->v, row, head);

	for (int i = 0; i < m->n; i++)
		co[i] = ap_sview_factor_coord(c->k, &p->sv[role], m->dim[i], m->fac[i], ix.c[m->dim[i]]);
}

/* Operand `role`'s tile of `rows` rows from row r0 into its array at
 * element `at` by TMA, in the body of thread 0's `one`: the boxes of
 * each swizzle span of the head dim (above), on barrier full[bar]. */
static void tma_tile(att_tc *s, ap_kir_stmt *one, int role, int64_t rows, ap_kir_expr *r0, ap_kir_expr *at,
		     ap_kir_expr *bar)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	int ja = c->sw[role] / (int)ap_dtype_size(s->T);
	int64_t cols = role == 2 ? s->Dvp : s->Dp;

	for (int64_t i = 0; i < cols / ja; i++) {
		ap_kir_expr *co[AP_TMAP_MAX_RANK];

		op_coords(s, role, ap_kir_idx(k, i * ja), r0, co);
		ap_kir_tma_load(k, &one->body, role == 0 ? s->qs : role == 1 ? s->ks : s->vs,
				ap_kir_addi(k, at, i * rows * ja), ap_v_buffer(c->v, c->p->leaf[role]), co, s->full, bar);
	}
}

/* if (thread s->issuer): the statement tma_tile's boxes are issued in. */
static ap_kir_stmt *tma_issuer(att_tc *s)
{
	ap_kir_kernel *k = s->c->k;

	return ap_kir_if(k, s->c->v->cur, ap_kir_binary(k, AP_KIR_EQ, ap_kir_index_of(k, AP_KIR_THREAD_X),
							 ap_kir_idx(k, s->issuer)));
}

/* The barrier of stage st's tile of `role` (1 K, 2 V): full[st] (and
 * empty[st]) for both, except under warp specialisation or the overlap
 * (kv_apart), where V's tiles have barriers of their own, [3 + st] (Q's
 * is [2]): K's stage is free once S = Q K^T completed, V's once
 * O += P V did -- a tile later under the overlap -- so that the next K
 * tile loads a whole key tile's time before it is used
 * (FlashAttention-3's separate K and V pipelines). */
static bool kv_apart(const att_tc *s)
{
	return s->c->ws || (s->c->overlap && s->c->wg && s->NST == 2);
}

static ap_kir_expr *kv_bar(const att_tc *s, int role, ap_kir_expr *st)
{
	return kv_apart(s) && role == 2 ? ap_kir_addi(s->c->k, st, 3) : st;
}

/* Key tile `tile` of K and V into stage st by TMA (above): thread
 * s->issuer expects their bytes on full[st] and issues the boxes; where
 * they are apart (kv_apart) only one of them, `only` (1 K, 2 V), on its
 * barrier (kv_bar). */
static void tma_fill_roles(att_tc *s, ap_kir_expr *tile, ap_kir_expr *st, int only)
{
	ap_kir_kernel *k = s->c->k;
	int64_t es = (int64_t)ap_dtype_size(s->T);
	ap_kir_stmt *one = tma_issuer(s);
	ap_kir_expr *key0 = ap_kir_muli(k, tile, s->BK);

	if (!one)
		return;
	if (!only) {   /* K and V on one barrier: the stage's bytes */
		ap_kir_mbar_arrive(k, &one->body, s->full, st, ap_kir_int(k, AP_DT_I32, s->BK * (s->Dp + s->Dvp) * es));
		tma_tile(s, one, 1, s->BK, key0, ap_kir_muli(k, st, s->BK * s->ldq), st);
		tma_tile(s, one, 2, s->BK, key0, ap_kir_muli(k, st, s->BK * s->ldv), st);
		return;
	}
	ap_kir_mbar_arrive(k, &one->body, s->full, kv_bar(s, only, st),
			   ap_kir_int(k, AP_DT_I32, s->BK * (only == 1 ? s->Dp : s->Dvp) * es));
	tma_tile(s, one, only, s->BK, key0, ap_kir_muli(k, st, s->BK * (only == 1 ? s->ldq : s->ldv)),
		 kv_bar(s, only, st));
}

static void tma_fill(att_tc *s, ap_kir_expr *tile, ap_kir_expr *st)
{
	tma_fill_roles(s, tile, st, 0);
}

/* Ping-pong's barriers (c->pingpong): turn[0..1], count 4, initialised
 * in `one` (thread 0's set-up, fenced after). */
static void pingpong_setup(att_tc *s, ap_kir_stmt *one)
{
	ap_kir_kernel *k = s->c->k;

	if (!s->c->pingpong)
		return;
	s->turn = ap_kir_mbarriers(k, "turn", 2);
	if (!s->turn)
		return;
	for (int i = 0; i < 2; i++)
		ap_kir_mbar_init(k, &one->body, s->turn, ap_kir_idx(k, i), ap_kir_int(k, AP_DT_I32, 4));
}

/* The operands' maps (Q's where p->q_tma), the mbarriers (the two
 * stages', and Q's) initialised by thread 0 and fenced for the async
 * proxy, kn = qph = 0 (before the tile loop).  AP_ENOMEM or AP_EINTERNAL
 * (a map refused) through err. */
static int tma_setup(att_tc *s, ap_error *err)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int es = (int)ap_dtype_size(s->T), nbar = kv_apart(s) ? 5 : (int)tc_tma_barrier_bytes(p) / 8;
	ap_kir_stmt *one;

	for (int role = p->q_tma ? 0 : 1; role <= 2; role++) {
		ap_tmap_desc d;

		if (!op_map_of(v->g, p, role, c->sw[role] / es, role ? s->BK : s->BQ, c->sw[role], &s->map[role], &d) ||
		    ap_kir_tensor_map(k, ap_v_buffer(v, p->leaf[role]), &d) < 0)
			return ap_error_set(err, ap_kir_failed(k) ? AP_ENOMEM : AP_EINTERNAL, NULL, NULL,
					    "attention emitter: %s's tensor map refused", role == 0 ? "Q" : role == 1 ? "K" : "V");
	}
	ap_kir_comment(k, v->cur, "operands %s by TMA: boxes of their tensor maps, K and V into 2 stages, each "
		       "tile on its mbarrier%s", p->q_tma ? "Q, K and V" : "K and V",
		       kv_apart(s) ? " (K's and V's apart: [0..1] K, [2] Q, [3..4] V)" : "");
	s->full = ap_kir_mbarriers(k, "full", nbar);
	if (c->ws)   /* released by each query warpgroup */
		s->empty = ap_kir_mbarriers(k, "empty", nbar);
	one = tma_issuer(s);
	if (!s->full || !one || (c->ws && !s->empty))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention");
	for (int i = 0; i < nbar; i++) {
		ap_kir_mbar_init(k, &one->body, s->full, ap_kir_idx(k, i), ap_kir_int(k, AP_DT_I32, 1));
		if (c->ws)
			ap_kir_mbar_init(k, &one->body, s->empty, ap_kir_idx(k, i), ap_kir_int(k, AP_DT_I32, s->BQ / 64));
	}
	pingpong_setup(s, one);
	ap_kir_fence_proxy_async(k, &one->body);
	ap_kir_barrier(k, v->cur);
	s->kn = ap_kir_var_new(k, k->index_type, "kn");
	ap_kir_let(k, v->cur, s->kn, ap_kir_idx(k, 0));
	s->qph = ap_kir_var_new(k, k->index_type, "qph");
	ap_kir_let(k, v->cur, s->qph, ap_kir_idx(k, 0));
	return ap_kir_failed(k) ? ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention") : 0;
}

/* The copying producer's set-up (knob tma=3): full[0..1] the K stages,
 * full[2] Q's tile and full[3..4] the V stages (kv_bar), each count 128
 * (every producer thread arrives once its copies of the tile are
 * complete and fenced); empty[0..4] their releases, count W / 4;
 * initialised by thread 0 and fenced, then kn = qph = 0.  AP_ENOMEM
 * through err. */
static int copy_setup(att_tc *s, ap_error *err)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_stmt *one;

	ap_kir_comment(k, v->cur, "warp specialisation: warpgroup %d copies Q, K and V (K and V into 2 stages; full / "
		       "empty mbarriers [0..1] K, [2] Q, [3..4] V), warpgroups 0..%d compute on them; persistent blocks", s->BQ / 64, s->BQ / 64 - 1);
	s->full = ap_kir_mbarriers(k, "full", 5);
	s->empty = ap_kir_mbarriers(k, "empty", 5);
	one = ap_kir_if(k, v->cur, ap_kir_binary(k, AP_KIR_EQ, ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, 0)));
	if (!s->full || !s->empty || !one)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention");
	for (int i = 0; i < 5; i++) {
		ap_kir_mbar_init(k, &one->body, s->full, ap_kir_idx(k, i), ap_kir_int(k, AP_DT_I32, 128));
		ap_kir_mbar_init(k, &one->body, s->empty, ap_kir_idx(k, i), ap_kir_int(k, AP_DT_I32, s->BQ / 64));
	}
	pingpong_setup(s, one);
	ap_kir_fence_proxy_async(k, &one->body);
	ap_kir_barrier(k, v->cur);
	return ap_kir_failed(k) ? ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention") : 0;
}

/* The TMA form's grid: persistent blocks, as many as fit on the SMs at
 * once (threads, blocks, shared memory and registers per SM: the
 * estimate the cost model uses, tc_regs, or the launch's count where
 * the warpgroups split them, tc_ws_maxnreg), each walking query tiles
 * and carrying its stages' phases on (kn) -- FlashAttention-3's
 * persistent schedule, in the grid-stride order.  A block more than fit
 * would start only once another ended, its tiles a wave late. */
static unsigned tma_grid(const att_tc *s, const ap_target_info *t)
{
	int W = s->BQ / 16, tma = s->c->ws ? (s->c->tma ? 2 : 3) : 1;
	unsigned threads = 32u * (unsigned)W + (s->c->ws ? 128u : 0u), per;
	size_t smem = tc_smem(s->c->p, t, W, s->BK) + tc_barrier_bytes(s->c->p, tma, s->c->pingpong ? 2 : s->c->overlap);

	per = tc_blocks_per_sm(t, threads, (unsigned)smem, tc_launch_regs(s->c->p, t, W, s->BK, tma));
	return t->sm_count * (per ? per : 1);
}

/* The key tiles the query tile from row q0 visits (s->nt:
 * ap__att_key_tiles). */
static void tile_bound(att_tc *s, ap_kir_expr *q0)
{
	s->nt = ap__att_key_tiles(s->c, q0, s->BQ, s->BK, s->ntiles, "nt");
}

/* The block-wide use, base + nt - 1, of the query tile's last key tile
 * (its stage: the use's parity), bound as "lu". */
static ap_kir_expr *last_use(att_tc *s, ap_kir_expr *base)
{
	ap_kir_kernel *k = s->c->k;
	ap_kir_expr *last = s->c->p->causal_k >= 0 ? ap_kir_add(k, base, ap_kir_addi(k, s->nt, -1))
						      : ap_kir_addi(k, base, s->ntiles - 1);

	return ap_kir_bind(k, s->c->v->cur, k->index_type, "lu", last);
}

/* The query tile's key tiles counted into kn, Q's parity flipped where
 * Q's tile comes on its barrier (knob tma; else nothing). */
static void tma_next_query_tile(att_tc *s)
{
	ap_kir_kernel *k = s->c->k;

	if (!s->c->tma && !s->c->ws)
		return;
	ap_kir_assign(k, s->c->v->cur, s->kn, ap_kir_add(k, ap_kir_ref(k, s->kn), s->nt));
	if (s->c->p->q_tma || s->c->ws)
		ap_kir_assign(k, s->c->v->cur, s->qph, ap_kir_binary(k, AP_KIR_XOR, ap_kir_ref(k, s->qph), ap_kir_idx(k, 1)));
}

/* The block's index of key tile kt of the current query tile: kn + kt. */
static ap_kir_expr *tma_use(att_tc *s, ap_kir_expr *kt)
{
	return ap_kir_bind(s->c->k, s->c->v->cur, s->c->k->index_type, "ku", ap_kir_add(s->c->k, ap_kir_ref(s->c->k, s->kn), kt));
}

/* Waits until the key tile of use u (tma_use) has landed in its stage
 * (role 1: K's part, 2: V's, where they have barriers of their own:
 * kv_bar). */
static void tma_wait_role(att_tc *s, ap_kir_expr *u, int role)
{
	ap_kir_kernel *k = s->c->k;

	ap_kir_mbar_wait(k, s->c->v->cur, s->full, kv_bar(s, role, ap_kir_binary(k, AP_KIR_AND, u, ap_kir_idx(k, 1))),
			 ap_kir_binary(k, AP_KIR_AND, ap_kir_binary(k, AP_KIR_SHR, u, ap_kir_idx(k, 1)), ap_kir_idx(k, 1)));
}

static void tma_wait(att_tc *s, ap_kir_expr *u)
{
	tma_wait_role(s, u, 1);
}

/* The shared tiles and the register fragments, and a comment per
 * operand saying how it is staged.  AP_ENOMEM through err when an
 * allocation failed. */
static int tc_declare(att_tc *s, const ap_target_info *t, ap_error *err)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;

	if (c->wg) {   /* swizzled tiles start on their patterns' repeats */
		s->qs = ap_kir_shared_dyn_aligned(k, "qs", s->T, s->BQ * s->ldq, c->sw[0] ? 8u * (unsigned)c->sw[0] : 16u);
		s->ks = ap_kir_shared_dyn_aligned(k, "ks", s->T, s->NST * s->BK * s->ldq, c->sw[1] ? 8u * (unsigned)c->sw[1] : 16u);
		s->vs = ap_kir_shared_dyn_aligned(k, "vs", s->T, s->NST * s->BK * s->ldv, c->sw[2] ? 8u * (unsigned)c->sw[2] : 16u);
	} else {
		/* static arrays within the 48 KiB every block has, dynamic
		 * shared memory past it (the runtime asks for it: tc_fits) */
		ap_kir_array *(*shared)(ap_kir_kernel *, const char *, ap_dtype, int64_t) =
			tc_smem(p, t, s->BQ / 16, s->BK) <= t->shared_per_block ? ap_kir_shared : ap_kir_shared_dyn;

		s->qs = shared(k, "qs", s->T, s->BQ * s->ldq);
		s->ks = shared(k, "ks", s->T, s->NST * s->BK * s->ldq);
		s->vs = shared(k, "vs", s->T, s->NST * s->BK * s->ldv);
	}
	ap_kir_mma_frag_sizes(p->mma, &s->AF, &s->BF, &s->CF);
	s->qf = ap_kir_local(k, "qf", s->T, s->Dp / s->KS * s->AF);
	s->kf = ap_kir_local(k, "kf", s->T, s->BF);
	s->vf = ap_kir_local(k, "vf", s->T, s->BF);
	s->sacc = ap_kir_local(k, "sf", s->A, s->NS * 4);
	s->pf = ap_kir_local(k, "pf", s->T, s->NS * 4);     /* 16-bit: BK / 16 A fragments of 8; TF32: BK / 8 of 4 */
	s->oacc = ap_kir_local(k, "of", s->A, s->NO * 4);
	if (ap_kir_failed(k))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention");
	for (int r = 0; r < 3; r++) {
		static const char *const names[] = {"Q", "K", "V"};

		if (c->tma && (r > 0 || p->q_tma))
			continue;   /* tma_setup's comment */
		if (p->aw[r])
			ap_kir_comment(k, c->v->cur, "operand %s: cp.async, %zu bytes a copy", names[r],
				       (size_t)p->aw[r] * ap_dtype_size(s->T));
		else
			ap_kir_comment(k, c->v->cur, "operand %s: through registers (computed on the way, or "
				       "not contiguous along the head dim)", names[r]);
	}
	return 0;
}

/* (emitters.h) */
void ap__mma_lanes(ap_kir_kernel *k, ap_kir_block *b, ap_mma_lanes *l)
{
	ap_kir_expr *tid = ap_kir_index_of(k, AP_KIR_THREAD_X);

	l->warp = ap_kir_bind(k, b, k->index_type, "w", ap_kir_binary(k, AP_KIR_SHR, tid, ap_kir_idx(k, 5)));
	l->lane = ap_kir_bind(k, b, k->index_type, "ln", ap_kir_binary(k, AP_KIR_AND, tid, ap_kir_idx(k, 31)));
	l->g = ap_kir_bind(k, b, k->index_type, "g", ap_kir_binary(k, AP_KIR_SHR, l->lane, ap_kir_idx(k, 2)));
	l->tq = ap_kir_bind(k, b, k->index_type, "tq", ap_kir_binary(k, AP_KIR_AND, l->lane, ap_kir_idx(k, 3)));
	l->l8 = ap_kir_binary(k, AP_KIR_AND, l->lane, ap_kir_idx(k, 7));
	l->l16 = ap_kir_binary(k, AP_KIR_AND, l->lane, ap_kir_idx(k, 15));
	l->hi = ap_kir_binary(k, AP_KIR_SHR, l->lane, ap_kir_idx(k, 4));
	l->j2 = ap_kir_binary(k, AP_KIR_AND, ap_kir_binary(k, AP_KIR_SHR, l->lane, ap_kir_idx(k, 3)), ap_kir_idx(k, 1));
}

/* The thread's warp and lane parts (ap__mma_lanes) and -inf. */
static void tc_lanes(att_tc *s)
{
	ap_mma_lanes l;

	ap__mma_lanes(s->c->k, s->c->v->cur, &l);
	s->warp = l.warp;
	s->lane = l.lane;
	s->g = l.g;
	s->tq = l.tq;
	s->l8 = l.l8;
	s->l16 = l.l16;
	s->hi = l.hi;
	s->j2 = l.j2;
	s->ninf = ap_kir_float(s->c->k, s->A, -INFINITY);
}

/* Key tile rows key0.. of K and V into their stages' shared tiles at
 * element offsets koff and voff (ap__att_stage_rows; the caller commits). */
static void stage_kv_rows(att_tc *s, ap_kir_expr *koff, ap_kir_expr *voff, ap_kir_expr *key0)
{
	actx *c = s->c;
	const att_plan *p = c->p;

	ap__att_stage_rows(c, s->ks, koff, 1, s->BK, s->Dp, s->ldq, key0, p->Nk, p->D);
	ap__att_stage_rows(c, s->vs, voff, 2, s->BK, s->Dvp, s->ldv, key0, p->Nk, p->Dv);
}

/* The key tiles in flight before the key loop (two stages): tile 0's K
 * and V into stage kn % 2 (the block's first use of the query tile; 0
 * without TMA: each query tile starts at stage 0); where K and V are
 * apart (the overlap, kv_apart) tile 1's K too, into the other stage
 * (ov_key_loop keeps K a tile ahead of V) -- by TMA, or as cp.async
 * groups: tile 0's, then tile 1's K (committed even when empty, so that
 * the loop's group counts hold). */
static void first_tiles(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *u = c->tma ? ap_kir_ref(k, s->kn) : ap_kir_idx(k, 0);
	ap_kir_expr *st = ap_kir_binary(k, AP_KIR_AND, u, ap_kir_idx(k, 1));
	ap_kir_expr *nst = ap_kir_binary(k, AP_KIR_AND, ap_kir_addi(k, u, 1), ap_kir_idx(k, 1));
	ap_kir_block *s2;

	if (!kv_apart(s)) {
		if (c->tma) {
			tma_fill(s, ap_kir_idx(k, 0), st);
		} else {
			stage_kv_rows(s, ap_kir_idx(k, 0), ap_kir_idx(k, 0), ap_kir_idx(k, 0));
			ap_kir_cp_commit(k, v->cur);
		}
		return;
	}
	if (c->tma) {
		tma_fill_roles(s, ap_kir_idx(k, 0), st, 1);
		tma_fill_roles(s, ap_kir_idx(k, 0), st, 2);
	} else {
		stage_kv_rows(s, ap_kir_idx(k, 0), ap_kir_idx(k, 0), ap_kir_idx(k, 0));
		ap_kir_cp_commit(k, v->cur);
	}
	ap_v_if(v, ap_kir_binary(k, AP_KIR_GT, s->nt, ap_kir_idx(k, 1)), &s2, NULL);
	if (c->tma)
		tma_fill_roles(s, ap_kir_idx(k, 1), nst, 1);
	else
		ap__att_stage_rows(c, s->ks, ap_kir_muli(k, nst, s->BK * s->ldq), 1, s->BK, s->Dp, s->ldq,
				   ap_kir_idx(k, s->BK), c->p->Nk, c->p->D);
	ap_v_close(v, s2);
	if (!c->tma)
		ap_kir_cp_commit(k, v->cur);
}

/* The block's BQ query rows from q0 into qs (with two stages, the first
 * key tile's copies issued behind them: first_tiles), then the warp's 16 rows as A
 * fragments qf by ldmatrix .x4 (matrix j = lane / 8: rows (j % 2) * 8..,
 * k (j / 2) * KS / 2..), rounded for TF32. */
static void tc_load_q(att_tc *s, ap_kir_expr *q0)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *kk;

	if (c->tma && p->q_tma) {   /* Q's boxes on full[2], then the first key tile's */
		ap_kir_stmt *one = tma_issuer(s);

		if (one) {
			ap_kir_mbar_arrive(k, &one->body, s->full, ap_kir_idx(k, 2),
					   ap_kir_int(k, AP_DT_I32, s->BQ * s->Dp * (int64_t)ap_dtype_size(s->T)));
			tma_tile(s, one, 0, s->BQ, q0, ap_kir_idx(k, 0), ap_kir_idx(k, 2));
		}
		first_tiles(s);
		ap_kir_mbar_wait(k, v->cur, s->full, ap_kir_idx(k, 2), ap_kir_ref(k, s->qph));
		return;
	}
	ap__att_stage_rows(c, s->qs, ap_kir_idx(k, 0), 0, s->BQ, s->Dp, s->ldq, q0, p->Nq, p->D);
	if (p->aw[0])
		ap_kir_cp_commit(k, v->cur);
	if (s->NST == 2)   /* the first key tile's copies or boxes, in flight while Q's fragments load */
		first_tiles(s);
	if (p->aw[0])   /* Q's group: tile 0's copies (and K's of tile 1: kv_apart) after it */
		ap_kir_cp_wait(k, v->cur, s->NST == 2 && !c->tma ? (kv_apart(s) ? 2 : 1) : 0);
	if (c->wg) {   /* wgmma reads Q from shared memory through the async proxy */
		ap_kir_fence_proxy_async(k, v->cur);
		ap_kir_barrier(k, v->cur);
		return;
	}
	ap_kir_barrier(k, v->cur);
	kk = ap_v_loop_unrolled(v, "kq", s->Dp / s->KS, &saved);
	ap_kir_ldmatrix(k, v->cur, s->qf, ap_kir_muli(k, ap_kir_ref(k, kk), s->AF), s->qs,
			ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, s->warp, 16), s->l16), s->ldq),
				   ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, kk), s->KS), ap_kir_muli(k, s->hi, s->KS / 2))),
			4, false);
	ap_v_close(v, saved);
	if (s->tf32)
		round_tf32(c, s->qf, s->Dp / s->KS * s->AF);
}

/* The row statistics m = -inf, l = 0 of the lane's two rows and the
 * output accumulators set to zero. */
static void tc_init_state(att_tc *s)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;
	ap_kir_block *saved;
	ap_kir_var *i;

	for (int h = 0; h < 2; h++) {
		s->mrun[h] = ap_kir_var_new(k, s->A, "m");
		s->lrun[h] = ap_kir_var_new(k, s->A, "l");
		ap_kir_let(k, v->cur, s->mrun[h], s->ninf);
		ap_kir_let(k, v->cur, s->lrun[h], ap_kir_float(k, s->A, 0));
	}
	i = ap_v_loop_unrolled(v, "z", s->NO * 4, &saved);
	ap_kir_store(k, v->cur, s->oacc, ap_kir_ref(k, i), ap_kir_float(k, s->A, 0));
	ap_v_close(v, saved);
}

/* Key tile kt in shared memory: with two stages, the next tile's copies
 * go into the other stage (its last readers passed the barrier first)
 * and this one's are waited for; with one, this tile is staged and
 * waited for.  Sets key0 and the stage's offsets kbase / vbase. */
static void tc_stage_kv(att_tc *s, ap_kir_var *kt)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *kst;

	s->key0 = ap_kir_bind(k, v->cur, k->index_type, "k0", ap_kir_muli(k, ap_kir_ref(k, kt), s->BK));
	ap_kir_barrier(k, v->cur);
	if (c->tma) {   /* the next tile's boxes into the stage the barrier freed; this one's waited for */
		ap_kir_expr *u = tma_use(s, ap_kir_ref(k, kt));
		ap_kir_block *s2;

		kst = ap_kir_bind(k, v->cur, k->index_type, "st", ap_kir_binary(k, AP_KIR_AND, u, ap_kir_idx(k, 1)));
		ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, ap_kir_addi(k, ap_kir_ref(k, kt), 1), s->nt), &s2, NULL);
		tma_fill(s, ap_kir_addi(k, ap_kir_ref(k, kt), 1), ap_kir_binary(k, AP_KIR_AND, ap_kir_addi(k, u, 1), ap_kir_idx(k, 1)));
		ap_v_close(v, s2);
		tma_wait(s, u);
		s->kbase = ap_kir_bind(k, v->cur, k->index_type, "kb", ap_kir_muli(k, kst, s->BK * s->ldq));
		s->vbase = ap_kir_bind(k, v->cur, k->index_type, "vb", ap_kir_muli(k, kst, s->BK * s->ldv));
		return;
	}
	if (s->NST == 2) {
		ap_kir_expr *nx = ap_kir_bind(k, v->cur, k->index_type, "kn", ap_kir_addi(k, ap_kir_ref(k, kt), 1));
		ap_kir_block *s2;

		kst = ap_kir_bind(k, v->cur, k->index_type, "st", ap_kir_binary(k, AP_KIR_AND, ap_kir_ref(k, kt), ap_kir_idx(k, 1)));
		ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, nx, s->nt), &s2, NULL);
		{
			ap_kir_expr *nst = ap_kir_binary(k, AP_KIR_AND, nx, ap_kir_idx(k, 1));
			ap_kir_expr *nkey0 = ap_kir_muli(k, nx, s->BK);

			stage_kv_rows(s, ap_kir_muli(k, nst, s->BK * s->ldq), ap_kir_muli(k, nst, s->BK * s->ldv), nkey0);
		}
		ap_v_close(v, s2);
		ap_kir_cp_commit(k, v->cur);
		ap_kir_cp_wait(k, v->cur, 1);
	} else {
		kst = ap_kir_idx(k, 0);
		stage_kv_rows(s, kst, kst, s->key0);
		ap__att_async_done(c, p->aw[1] || p->aw[2]);
	}
	s->kbase = ap_kir_bind(k, v->cur, k->index_type, "kb", ap_kir_muli(k, kst, s->BK * s->ldq));
	s->vbase = ap_kir_bind(k, v->cur, k->index_type, "vb", ap_kir_muli(k, kst, s->BK * s->ldv));
	if (c->wg)
		ap_kir_fence_proxy_async(k, v->cur);
	ap_kir_barrier(k, v->cur);
}

/* wgmma's layouts of the Q and K tiles (K-major: rows along M or N, the
 * head dim along K) and of the V tile (MN-major: keys along K, its head
 * dim along N), ap__att_wg_place's: swizzled, atoms of 8 rows 8 W bytes
 * apart (SBO), V's next W bytes of head dim BK W bytes on (LBO). */
static ap_kir_wg_layout wg_qk_layout(const att_tc *s)
{
	int sw = s->c->sw[1];

	return sw ? (ap_kir_wg_layout){false, 16, 8 * sw, sw} : (ap_kir_wg_layout){false, 128, (int)(16 * s->Dp), 0};
}

static ap_kir_wg_layout wg_v_layout(const att_tc *s)
{
	int sw = s->c->sw[2];

	return sw ? (ap_kir_wg_layout){true, (int)s->BK * sw, 8 * sw, sw}
		  : (ap_kir_wg_layout){true, (int)(16 * s->Dvp), 128, 0};
}

/* S = Q K^T on wgmma (sm_90a, FlashAttention-3's first product): per k16
 * step of the head dim one m64nBKk16 of the warpgroup -- A its 64 query
 * rows of the Q tile, B the K tile -- into the score accumulators, whose
 * layout is mma.sync's per warp (warp q of the warpgroup: rows 16 q..). */
static void wg_qk(att_tc *s, bool wait)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *i, *kk;
	ap_kir_expr *row0 = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_SHR, s->warp, ap_kir_idx(k, 2)), 64);

	i = ap_v_loop_unrolled(v, "z", s->NS * 4, &saved);
	ap_kir_store(k, v->cur, s->sacc, ap_kir_ref(k, i), ap_kir_float(k, s->A, 0));
	ap_v_close(v, saved);
	ap_kir_wgmma_fence(k, v->cur, s->sacc);
	kk = ap_v_loop_unrolled(v, "kq", s->Dp / 16, &saved);
	ap_kir_wgmma(k, v->cur, s->T == AP_DT_F16 ? AP_KIR_WGMMA_F16 : AP_KIR_WGMMA_BF16, s->BK, s->sacc,
		     ap_kir_idx(k, 0), s->qs, ap__att_wg_place(c, 0, row0, ap_kir_muli(k, ap_kir_ref(k, kk), 16), s->BQ, s->Dp),
		     wg_qk_layout(s), s->ks,
		     ap_kir_add(k, s->kbase,
				ap__att_wg_place(c, 1, ap_kir_idx(k, 0), ap_kir_muli(k, ap_kir_ref(k, kk), 16), s->BK, s->Dp)),
		     wg_qk_layout(s));
	ap_v_close(v, saved);
	ap_kir_wgmma_commit(k, v->cur);
	if (wait)
		ap_kir_wgmma_wait(k, v->cur, 0, s->sacc);
}

/* O += P V on wgmma: per k16 step j of the key tile one m64nDvk16 with A
 * the probabilities' registers (pf: the A fragment of step j, the same
 * layout as mma.sync's) and B the V tile's keys 16 j.. */
static void wg_pv(att_tc *s, bool wait)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *j;

	ap_kir_wgmma_fence(k, v->cur, s->oacc);
	j = ap_v_loop_unrolled(v, "kj", s->BK / 16, &saved);
	ap_kir_wgmma(k, v->cur, s->T == AP_DT_F16 ? AP_KIR_WGMMA_F16 : AP_KIR_WGMMA_BF16, (int)s->Dvp, s->oacc,
		     ap_kir_idx(k, 0), s->pf, ap_kir_muli(k, ap_kir_ref(k, j), 8), wg_qk_layout(s), s->vs,
		     ap_kir_add(k, s->vbase,
				ap__att_wg_place(c, 2, ap_kir_muli(k, ap_kir_ref(k, j), 16), ap_kir_idx(k, 0), s->BK, s->Dvp)),
		     wg_v_layout(s));
	ap_v_close(v, saved);
	ap_kir_wgmma_commit(k, v->cur);
	if (wait)
		ap_kir_wgmma_wait(k, v->cur, 0, s->oacc);
}

/* S = Q K^T for the tile: the NS score fragments set to zero, then per k
 * step and n8 tile a B fragment of K by ldmatrix .x2 (K's rows are B's
 * columns: matrix j2 holds k j2 * KS / 2..) and an mma. */
static void tc_qk(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved, *s2;
	ap_kir_var *i, *kk, *ni;
	ap_kir_expr *si;

	i = ap_v_loop_unrolled(v, "z", s->NS * 4, &saved);
	ap_kir_store(k, v->cur, s->sacc, ap_kir_ref(k, i), ap_kir_float(k, s->A, 0));
	ap_v_close(v, saved);
	kk = ap_v_loop_unrolled(v, "kq", s->Dp / s->KS, &saved);
	ni = ap_v_loop_unrolled(v, "ni", s->NS, &s2);
	si = ap_kir_muli(k, ap_kir_ref(k, ni), 4);
	ap_kir_ldmatrix(k, v->cur, s->kf, ap_kir_idx(k, 0), s->ks,
			ap_kir_add(k, s->kbase,
				   ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, ni), 8), s->l8), s->ldq),
					      ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, kk), s->KS), ap_kir_muli(k, s->j2, s->KS / 2)))),
			2, false);
	if (s->tf32)
		round_tf32(c, s->kf, s->BF);
	ap_kir_mma(k, v->cur, c->p->mma, s->sacc, si, s->qf, ap_kir_muli(k, ap_kir_ref(k, kk), s->AF), s->kf,
		   ap_kir_idx(k, 0), s->sacc, si);
	ap_v_close(v, s2);
	ap_v_close(v, saved);
}

/* The scores' pass over the lane's elements, element e of n8 tile ni at
 * row wrow + g + 8 * (e / 2), key key0 + 8 * ni + 2 * tq + e % 2: `eval`,
 * the first product's epilogue on each (ap__att_score: S, or the causal
 * Where's x with c->visible; with c->fold S / c), -inf past the last key
 * where a tile passes it; else (the products are already the scores)
 * only that key mask. */
static void score_pass(att_tc *s, bool eval)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	bool masked = c->p->Nk % s->BK != 0;   /* a tile passes the last key */
	ap_kir_var *ni;

	if (!eval && !masked)
		return;
	ni = ap_v_loop_unrolled(v, "ni", s->NS, &saved);
	for (int e = 0; e < 4; e++) {
		ap_kir_expr *si = ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), 4), e);
		ap_kir_expr *key = ap_kir_bind(k, v->cur, k->index_type, "key",
					       ap_kir_add(k, ap_kir_add(k, s->key0, ap_kir_muli(k, ap_kir_ref(k, ni), 8)),
							  ap_kir_addi(k, ap_kir_muli(k, s->tq, 2), e & 1)));
		ap_kir_expr *row;
		ap_kir_var *sv;
		ap_kir_block *s2;

		if (!eval) {
			ap_kir_store(k, v->cur, s->sacc, si,
				     ap_kir_select(k, ap_kir_binary(k, AP_KIR_LT, key, ap_kir_idx(k, c->p->Nk)),
						   ap_kir_load(k, s->sacc, si), s->ninf));
			continue;
		}
		row = ap_kir_bind(k, v->cur, k->index_type, "r", ap_kir_add(k, s->wrow, ap_kir_addi(k, s->g, 8 * (e >> 1))));
		sv = ap_kir_var_new(k, s->A, "s");
		ap_kir_let(k, v->cur, sv, s->ninf);
		if (masked)
			ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, key, ap_kir_idx(k, c->p->Nk)), &s2, NULL);
		ap__att_score(c, sv, ap_kir_load(k, s->sacc, si), row, key);
		if (masked)
			ap_v_close(v, s2);
		ap_kir_store(k, v->cur, s->sacc, si, ap_kir_ref(k, sv));
	}
	ap_v_close(v, saved);
}

/* The scores of the tile in sacc (score_pass).  With the scale folded
 * (p->sfold) and S = c Y1 the products are S / c already.  Under a causal
 * mask (p->causal_k = k), a tile whose every key this warp's rows see --
 * key0 + BK - 1 <= wrow + k, wrow its first row -- takes the Where's x
 * (nothing at all when that is c Y1, folded), the tiles on the diagonal
 * the whole epilogue, mask included (FlashAttention-2 masks only the
 * diagonal blocks, section 3.1.1). */
static void tc_scores(att_tc *s)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_stmt *diag;

	if (p->causal_k < 0) {
		score_pass(s, !(c->fold && p->sx == p->s));
		return;
	}
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LE, ap_kir_addi(k, s->key0, s->BK - 1), ap_kir_addi(k, s->wrow, p->causal_k)),
		&saved, &diag);
	c->visible = true;
	score_pass(s, !(c->fold && p->sx == p->cx));
	c->visible = false;
	ap_v_else(v, diag);
	score_pass(s, true);
	ap_v_close(v, saved);
}

/* The online softmax's maxima for rows g (h = 0) and g + 8 (h = 1): the
 * lane's maximum, then the row's over the four lanes that hold it (two
 * xor shuffles); the new maximum mnew, `dead` while every score so far
 * is -inf, the rescale factor alpha = exp(m - mnew), the probabilities'
 * exponent offset mlog2 = mnew log2(e) (0 while dead: every score is then
 * -inf and its probability exp2(-inf) = 0, FlashAttention-2's check for a
 * masked row, one select a row where there was one a score), and rs = 0,
 * the lane's part of the tile's row sum.  The lane's maximum is fmaxf's
 * (one FMNMX a score where a compare and a select took two): it passes
 * over a NaN score, whose probability exp2(NaN) still makes the row sum
 * and the output NaN, as the unfused softmax's. */
static void tc_row_max(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_dtype A = s->A;
	ap_kir_block *saved;

	for (int h = 0; h < 2; h++) {
		ap_kir_var *mx = ap_kir_var_new(k, A, "mx"), *ni;
		ap_kir_expr *mt, *dm;

		ap_kir_let(k, v->cur, mx, s->ninf);
		ni = ap_v_loop_unrolled(v, "ni", s->NS, &saved);
		for (int e = 2 * h; e < 2 * h + 2; e++)
			ap_kir_assign(k, v->cur, mx, ap_kir_call(k, AP_KIR_FMAX, ap_kir_ref(k, mx),
								 ap_kir_load(k, s->sacc, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), 4), e))));
		ap_v_close(v, saved);
		mt = ap__att_xor_reduce(c, ap_kir_ref(k, mx), true, 4);
		s->mnew[h] = ap_kir_bind(k, v->cur, A, "mn", ap_kir_binary(k, AP_KIR_MAX, ap_kir_ref(k, s->mrun[h]), mt));
		/* every score so far -inf: nothing to rescale, nothing to add */
		s->dead[h] = ap_kir_bind(k, v->cur, AP_DT_BOOL, "dd", ap_kir_binary(k, AP_KIR_EQ, s->mnew[h], s->ninf));
		dm = ap_kir_binary(k, AP_KIR_SUB, ap_kir_ref(k, s->mrun[h]), s->mnew[h]);
		if (s->sc != 1)
			dm = ap_kir_binary(k, AP_KIR_MUL, dm, ap_kir_float(k, A, s->sc));
		s->alpha[h] = ap_kir_bind(k, v->cur, A, "al",
					  ap_kir_select(k, s->dead[h], ap_kir_float(k, A, 1), ap_kir_call(k, AP_KIR_EXP, dm, NULL)));
		s->mlog2[h] = ap_kir_bind(k, v->cur, A, "ml",
					  ap_kir_select(k, s->dead[h], ap_kir_float(k, A, 0),
							ap_kir_binary(k, AP_KIR_MUL, s->mnew[h], ap_kir_float(k, A, s->sc * M_LOG2E))));
		s->rs[h] = ap_kir_var_new(k, A, "rs");
		ap_kir_let(k, v->cur, s->rs[h], ap_kir_float(k, A, 0));
	}
}

/* The probabilities exp(s - mnew) of the tile as exp2(s log2(e) - mlog2)
 * -- one FFMA and one ex2.approx.ftz (AP_KIR_EX2_APPROX) a score where
 * expf took about eight instructions and a select (FlashAttention-2
 * section 3.1 scales by log2(e) the same way).  Within about 2^-20 of
 * exp(s - mnew) relatively, far below the 16-bit or TF32 operand P
 * becomes; the flush of results below 2^-126 drops nothing a row sum of
 * at least 1 (its maximum's exp2(0)) can hold -- summed into rs and
 * stored (as `type`) into `dst` at the scores' element indices. */
static void tile_probabilities(att_tc *s, ap_kir_array *dst, ap_dtype type)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;
	ap_dtype A = s->A;
	ap_kir_block *saved;
	ap_kir_var *ni = ap_v_loop_unrolled(v, "ni", s->NS, &saved);

	for (int e = 0; e < 4; e++) {
		ap_kir_expr *si = ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), 4), e);
		ap_kir_expr *x = ap_kir_binary(k, AP_KIR_SUB,
					       ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, s->sacc, si), ap_kir_float(k, A, s->sc * M_LOG2E)),
					       s->mlog2[e >> 1]);
		ap_kir_expr *pv = ap_kir_bind(k, v->cur, A, "p", ap_kir_call(k, AP_KIR_EX2_APPROX, x, NULL));

		ap_kir_assign(k, v->cur, s->rs[e >> 1], ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, s->rs[e >> 1]), pv));
		ap_kir_store(k, v->cur, dst, si, ap_kir_cast(k, type, pv));
	}
	ap_v_close(v, saved);
}

/* l = l * alpha + rs, m = mnew, and O's accumulators rescaled by alpha. */
static void rescale_state(att_tc *s)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;
	ap_kir_block *saved;
	ap_kir_var *ni;

	for (int h = 0; h < 2; h++) {
		ap_kir_assign(k, v->cur, s->lrun[h], ap_kir_binary(k, AP_KIR_ADD,
								    ap_kir_binary(k, AP_KIR_MUL, ap_kir_ref(k, s->lrun[h]), s->alpha[h]),
								    ap_kir_ref(k, s->rs[h])));
		ap_kir_assign(k, v->cur, s->mrun[h], s->mnew[h]);
	}
	ni = ap_v_loop_unrolled(v, "no", s->NO, &saved);
	for (int e = 0; e < 4; e++) {
		ap_kir_expr *oi = ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), 4), e);

		ap_kir_store(k, v->cur, s->oacc, oi, ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, s->oacc, oi), s->alpha[e >> 1]));
	}
	ap_v_close(v, saved);
}

/* The probabilities exp(s - mnew) of the tile, summed into rs and moved
 * into pf as PV's A fragments (16-bit: the C fragments of n8 tiles 2j,
 * 2j + 1 are the A fragment of k16 step j; TF32: through the C layout
 * and tf32_a_from_c); then l = l * alpha + rs, m = mnew, and O's
 * accumulators rescaled by alpha. */
static void tc_probabilities(att_tc *s)
{
	tile_probabilities(s, s->tf32 ? s->sacc : s->pf, s->tf32 ? s->A : s->T);
	if (s->tf32)
		tf32_a_from_c(s->c, s->sacc, s->pf, s->NS, s->tq);
	rescale_state(s);
}

/* O += P V: per k step j of the tile and n8 tile no of O, V's B fragment
 * (16-bit: ldmatrix .x2 .trans, V's rows along k; TF32: b0 = V[t][g],
 * b1 = V[t + 4][g], one element a lane, since ldmatrix does not transpose
 * 32-bit elements) and an mma with the probabilities' A fragment. */
static void tc_pv(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved, *s2;
	ap_kir_var *j = ap_v_loop_unrolled(v, "kj", s->BK / s->KS, &saved);
	ap_kir_var *no = ap_v_loop_unrolled(v, "no", s->NO, &s2);
	ap_kir_expr *oi = ap_kir_muli(k, ap_kir_ref(k, no), 4);

	if (s->tf32) {
		for (int e = 0; e < 2; e++)
			ap_kir_store(k, v->cur, s->vf, ap_kir_idx(k, e),
				     ap_kir_call(k, AP_KIR_TF32,
						 ap_kir_load(k, s->vs, ap_kir_add(k, s->vbase,
							ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, j), 8),
												ap_kir_addi(k, s->tq, 4 * e)), s->ldv),
								   ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, no), 8), s->g)))), NULL));
	} else {
		ap_kir_ldmatrix(k, v->cur, s->vf, ap_kir_idx(k, 0), s->vs,
				ap_kir_add(k, s->vbase,
					   ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, j), 16),
										   ap_kir_add(k, ap_kir_muli(k, s->j2, 8), s->l8)), s->ldv),
						      ap_kir_muli(k, ap_kir_ref(k, no), 8))),
				2, true);
	}
	ap_kir_mma(k, v->cur, c->p->mma, s->oacc, oi, s->pf, ap_kir_muli(k, ap_kir_ref(k, j), s->AF), s->vf,
		   ap_kir_idx(k, 0), s->oacc, oi);
	ap_v_close(v, s2);
	ap_v_close(v, saved);
}

/* After the last key tile: each row's sum from the four lanes that hold
 * parts of it, O = acc (1 / l) through O's epilogue (rows below Nq,
 * columns below Dv: one division a row, not one an element), and the
 * statistics others read (from the lanes with tq = 0). */
static void tc_store(att_tc *s)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *no;
	ap_kir_expr *inv[2];

	for (int h = 0; h < 2; h++) {
		ap_kir_assign(k, v->cur, s->lrun[h], ap__att_xor_reduce(c, ap_kir_ref(k, s->lrun[h]), false, 4));
		inv[h] = ap_kir_bind(k, v->cur, s->A, "il",
				     ap_kir_binary(k, AP_KIR_DIV, ap_kir_float(k, s->A, 1),
						   ap__att_divisor(c, ap_kir_ref(k, s->lrun[h]))));
	}
	no = ap_v_loop_unrolled(v, "no", s->NO, &saved);
	for (int e = 0; e < 4; e++) {
		ap_kir_expr *row = ap_kir_bind(k, v->cur, k->index_type, "r",
					       ap_kir_add(k, s->wrow, ap_kir_addi(k, s->g, 8 * (e >> 1))));
		ap_kir_expr *col = ap_kir_bind(k, v->cur, k->index_type, "col",
					       ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, no), 8),
							  ap_kir_addi(k, ap_kir_muli(k, s->tq, 2), e & 1)));
		ap_kir_block *s2;

		ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_LT, row, ap_kir_idx(k, p->Nq)),
					 ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, p->Dv))), &s2, NULL);
		c->out = ap_kir_bind(k, v->cur, s->A, "o",
				     ap_kir_binary(k, AP_KIR_MUL,
						   ap_kir_load(k, s->oacc, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, no), 4), e)),
						   inv[e >> 1]));
		ap__epilogue_store(v, p->maps, ap__att_idx2(c, p->o, row, col));
		c->out = NULL;
		ap_v_close(v, s2);
	}
	ap_v_close(v, saved);
	for (int h = 0; h < 2 && (p->m_out || p->l_out || p->n_stat); h++) {
		ap_kir_expr *row = ap_kir_bind(k, v->cur, k->index_type, "r", ap_kir_add(k, s->wrow, ap_kir_addi(k, s->g, 8 * h)));

		ap_kir_var *m = s->mrun[h];

		if (s->sc != 1) {   /* S's maximum from Y1's */
			m = ap_kir_var_new(k, s->A, "ms");
			ap_kir_let(k, v->cur, m, ap_kir_binary(k, AP_KIR_MUL, ap_kir_ref(k, s->mrun[h]), ap_kir_float(k, s->A, s->sc)));
		}
		ap__att_store_stats(c, row, ap_kir_binary(k, AP_KIR_EQ, s->tq, ap_kir_idx(k, 0)), m, s->lrun[h]);
	}
}

/* ---- the overlap of the softmax with O += P V (wgmma, two stages) ---- */

/* After the previous O += P V completed: l, m and O's rescale
 * (rescale_state), and P (the operand type) from the scores' registers as
 * the next O += P V's A fragments. */
static void ov_commit_probabilities(att_tc *s)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;
	ap_kir_block *saved;
	ap_kir_var *ni;

	rescale_state(s);
	ni = ap_v_loop_unrolled(v, "ni", s->NS * 4, &saved);
	ap_kir_store(k, v->cur, s->pf, ap_kir_ref(k, ni), ap_kir_cast(k, s->T, ap_kir_load(k, s->sacc, ap_kir_ref(k, ni))));
	ap_v_close(v, saved);
}

/* The key loop with FlashAttention-3's overlap inside a warpgroup
 * (docs/hopper-pipeline.md, "The overlap without warp specialisation"):
 * tile j's scores and probabilities are computed while tile j-1's
 * O += P V runs on the tensor cores.  K runs a tile ahead of V
 * (kv_apart): once every warpgroup is past the wait that completes tile
 * kt-1's O += P V (the barrier after it) -- and so past tile kt's
 * S = Q K^T -- tile kt+1's V goes into the V stage tile kt-1's left and
 * tile kt+2's K into the K stage tile kt's left, a tile and a half
 * before they are read; K of tile kt and V of tile kt-1 are waited for
 * where they are read (by TMA: their barriers, kv_bar; by cp.async: all
 * but the newest group, the one just issued).  Tiles 0 and 1's K came
 * with Q (first_tiles). */
static void ov_key_loop(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_var *kt;
	ap_kir_expr *st, *prev, *u, *lu;
	ap_kir_block *ksaved, *s2;
	ap_kir_stmt *first;

	ap_kir_comment(k, v->cur, "the key loop: tile j's softmax overlaps tile j-1's O += P V (wgmma in flight); "
		       "K a tile ahead of V");
	kt = ap_v_loop(v, "kt", ap_kir_idx(k, 0), s->nt, 1, &ksaved);
	if (c->tma) {   /* tile kt's K landed */
		u = tma_use(s, ap_kir_ref(k, kt));
		tma_wait_role(s, u, 1);
	} else {
		u = ap_kir_ref(k, kt);
		ap_kir_cp_wait(k, v->cur, 1);   /* K of tile kt and V of tile kt-1 landed (this thread's copies) */
		ap_kir_fence_proxy_async(k, v->cur);
		ap_kir_barrier(k, v->cur);      /* ... and every thread's */
	}
	st = ap_kir_bind(k, v->cur, k->index_type, "st", ap_kir_binary(k, AP_KIR_AND, u, ap_kir_idx(k, 1)));
	prev = ap_kir_bind(k, v->cur, k->index_type, "sp", ap_kir_binary(k, AP_KIR_AND, ap_kir_addi(k, u, 1), ap_kir_idx(k, 1)));
	s->key0 = ap_kir_bind(k, v->cur, k->index_type, "k0", ap_kir_muli(k, ap_kir_ref(k, kt), s->BK));
	s->kbase = ap_kir_bind(k, v->cur, k->index_type, "kb", ap_kir_muli(k, st, s->BK * s->ldq));
	wg_qk(s, false);
	ap_v_if(v, ap_kir_binary(k, AP_KIR_GT, ap_kir_ref(k, kt), ap_kir_idx(k, 0)), &s2, &first);
	if (c->tma)
		tma_wait_role(s, ap_kir_addi(k, u, -1), 2);   /* tile kt-1's V landed */
	s->vbase = ap_kir_bind(k, v->cur, k->index_type, "vp", ap_kir_muli(k, prev, s->BK * s->ldv));
	wg_pv(s, false);                /* tile kt-1's O += P V, in flight ... */
	ap_kir_wgmma_wait(k, v->cur, 1, s->sacc);   /* ... while S is complete */
	ap_v_else(v, first);
	ap_kir_wgmma_wait(k, v->cur, 0, s->sacc);
	ap_v_close(v, s2);
	tc_scores(s);
	tc_row_max(s);
	/* the probabilities in S's registers: O += P V of tile kt-1 still reads P */
	tile_probabilities(s, s->sacc, s->A);
	ap_kir_wgmma_wait(k, v->cur, 0, s->oacc);   /* O += P V of tile kt-1 done here ... */
	ap_kir_barrier(k, v->cur);                  /* ... and in every warpgroup: V's stage prev and K's st are free */
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, ap_kir_addi(k, ap_kir_ref(k, kt), 1), s->nt), &s2, NULL);
	if (c->tma)
		tma_fill_roles(s, ap_kir_addi(k, ap_kir_ref(k, kt), 1), prev, 2);
	else
		ap__att_stage_rows(c, s->vs, ap_kir_muli(k, prev, s->BK * s->ldv), 2, s->BK, s->Dvp, s->ldv,
				   ap_kir_muli(k, ap_kir_addi(k, ap_kir_ref(k, kt), 1), s->BK), c->p->Nk, c->p->Dv);
	ap_v_close(v, s2);
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, ap_kir_addi(k, ap_kir_ref(k, kt), 2), s->nt), &s2, NULL);
	if (c->tma)
		tma_fill_roles(s, ap_kir_addi(k, ap_kir_ref(k, kt), 2), st, 1);
	else
		ap__att_stage_rows(c, s->ks, ap_kir_muli(k, st, s->BK * s->ldq), 1, s->BK, s->Dp, s->ldq,
				   ap_kir_muli(k, ap_kir_addi(k, ap_kir_ref(k, kt), 2), s->BK), c->p->Nk, c->p->D);
	ap_v_close(v, s2);
	if (!c->tma)
		ap_kir_cp_commit(k, v->cur);   /* a group a tile, empty or not */
	ov_commit_probabilities(s);
	ap_v_close(v, ksaved);
	/* the last tile's O += P V once its V landed (by cp.async: the group
	 * before the newest, committed after the last wait) */
	lu = last_use(s, c->tma ? ap_kir_ref(k, s->kn) : ap_kir_idx(k, 0));
	if (c->tma) {
		tma_wait_role(s, lu, 2);
	} else {
		ap_kir_cp_wait(k, v->cur, 0);
		ap_kir_fence_proxy_async(k, v->cur);
		ap_kir_barrier(k, v->cur);
	}
	s->vbase = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_AND, lu, ap_kir_idx(k, 1)), s->BK * s->ldv);
	wg_pv(s, true);
}

/* ---- warp specialisation (knob tma=2) ---- */

/* Ping-pong (knob overlap 2; FlashAttention-3 section 3.1, there with
 * named barriers): the two query warpgroups issue a key tile's products
 * in turns, so that one's softmax runs while the other's products hold
 * the tensor cores.  Warpgroup g waits for its turn at key-tile use u --
 * the other's issue of use u - 1 (g = 0; its first passes at once) or of
 * use u (g = 1): turn[g], parity (u + g + 1) % 2 -- and, having issued,
 * passes the turn (pp_pass).  Both warpgroups visit the same key tiles
 * (one query tile a block), so the turns alternate strictly and a phase
 * is waited for before the next completes.  No-ops without ping-pong. */
static void pp_wait(att_tc *s, ap_kir_expr *u)
{
	ap_kir_kernel *k = s->c->k;

	if (!s->c->pingpong)
		return;
	ap_kir_mbar_wait(k, s->c->v->cur, s->turn, s->wgx,
			 ap_kir_binary(k, AP_KIR_AND, ap_kir_add(k, ap_kir_addi(k, u, 1), s->wgx), ap_kir_idx(k, 1)));
}

static void pp_pass(att_tc *s)
{
	ap_kir_kernel *k = s->c->k;

	if (!s->c->pingpong)
		return;
	ap_kir_mbar_arrive_each(k, s->c->v->cur, s->turn, ap_kir_binary(k, AP_KIR_XOR, s->wgx, ap_kir_idx(k, 1)), 32);
}

/* This warpgroup's release of barrier empty[x]: its first thread arrives
 * once the warpgroup's wgmma reading the tile have completed. */
static void ws_release(att_tc *s, ap_kir_expr *x)
{
	ap_kir_mbar_arrive_each(s->c->k, s->c->v->cur, s->empty, x, 128);
}

/* A query warpgroup's key loop with the overlap inside the warpgroup
 * (knob overlap=1; ov_key_loop's order) under warp specialisation: per
 * key tile kt (use u = kn + kt) wait for its K, S = Q K^T committed,
 * tile kt-1's V waited for and its O += P V committed behind it, the
 * wait that leaves only that one in flight -- S complete: K's stage
 * released -- the scores and probabilities, then the wait for O += P V
 * and the release of tile kt-1's V stage, and P for the next O += P V.
 * After the loop the last tile's O += P V, waited for, and its V stage
 * released.  K's stage is free a key tile before V's: the producer
 * loads tile kt + 2's K while tile kt + 1 is computed on. */
static void ws_overlap_loop(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *ksaved, *s2;
	ap_kir_stmt *first;
	ap_kir_var *kt;
	ap_kir_expr *u, *st, *prev, *last, *lu;

	if (c->pingpong)
		s->wgx = ap_kir_bind(k, v->cur, k->index_type, "wgx",
				     ap_kir_binary(k, AP_KIR_SHR, ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, 7)));
	kt = ap_v_loop(v, "kt", ap_kir_idx(k, 0), s->nt, 1, &ksaved);
	u = tma_use(s, ap_kir_ref(k, kt));
	tma_wait_role(s, u, 1);
	pp_wait(s, u);
	st = ap_kir_bind(k, v->cur, k->index_type, "st", ap_kir_binary(k, AP_KIR_AND, u, ap_kir_idx(k, 1)));
	prev = ap_kir_bind(k, v->cur, k->index_type, "sp", ap_kir_binary(k, AP_KIR_AND, ap_kir_addi(k, u, 1), ap_kir_idx(k, 1)));
	s->key0 = ap_kir_bind(k, v->cur, k->index_type, "k0", ap_kir_muli(k, ap_kir_ref(k, kt), s->BK));
	s->kbase = ap_kir_bind(k, v->cur, k->index_type, "kb", ap_kir_muli(k, st, s->BK * s->ldq));
	wg_qk(s, false);
	ap_v_if(v, ap_kir_binary(k, AP_KIR_GT, ap_kir_ref(k, kt), ap_kir_idx(k, 0)), &s2, &first);
	tma_wait_role(s, ap_kir_addi(k, u, -1), 2);   /* tile kt-1's V landed (use u - 1) */
	s->vbase = ap_kir_bind(k, v->cur, k->index_type, "vp", ap_kir_muli(k, prev, s->BK * s->ldv));
	wg_pv(s, false);                            /* tile kt-1's O += P V, in flight ... */
	pp_pass(s);
	ap_kir_wgmma_wait(k, v->cur, 1, s->sacc);   /* ... while S is complete */
	ap_v_else(v, first);
	pp_pass(s);
	ap_kir_wgmma_wait(k, v->cur, 0, s->sacc);
	ap_v_close(v, s2);
	ws_release(s, kv_bar(s, 1, st));            /* K's stage: S = Q K^T read it */
	tc_scores(s);
	tc_row_max(s);
	tile_probabilities(s, s->sacc, s->A);
	ap_kir_wgmma_wait(k, v->cur, 0, s->oacc);   /* O += P V of tile kt-1 done: V's stage is free */
	ap_v_if(v, ap_kir_binary(k, AP_KIR_GT, ap_kir_ref(k, kt), ap_kir_idx(k, 0)), &s2, NULL);
	ws_release(s, kv_bar(s, 2, prev));
	ap_v_close(v, s2);
	ov_commit_probabilities(s);
	ap_v_close(v, ksaved);
	lu = last_use(s, ap_kir_ref(k, s->kn));
	last = ap_kir_bind(k, v->cur, k->index_type, "sl", ap_kir_binary(k, AP_KIR_AND, lu, ap_kir_idx(k, 1)));
	tma_wait_role(s, lu, 2);
	s->vbase = ap_kir_muli(k, last, s->BK * s->ldv);
	wg_pv(s, true);
	ws_release(s, kv_bar(s, 2, last));
}

/* The wait of the producer for the release of barrier x's tile
 * (empty[x], parity `par` ^ 1: its first use passes at once). */
static void ws_wait_free(att_tc *s, ap_kir_expr *x, ap_kir_expr *par)
{
	ap_kir_kernel *k = s->c->k;

	ap_kir_mbar_wait(k, s->c->v->cur, s->empty, x, ap_kir_binary(k, AP_KIR_XOR, par, ap_kir_idx(k, 1)));
}

/* A tile the copying producer wrote announced on full[x] by each of its
 * threads: its copies complete (`copies`: cp.async was used), fenced for
 * the async proxy (wgmma reads the tile through it), an arrival. */
static void ws_announce(att_tc *s, ap_kir_expr *x, bool copies)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;

	ap__att_async_done(s->c, copies);
	ap_kir_fence_proxy_async(k, v->cur);
	ap_kir_mbar_arrive(k, v->cur, s->full, x, NULL);
}

/* The producer warpgroup (emit_ws): per query tile of the block, once
 * the previous tile's Q is released (empty[2]), Q's tile on full[2]; per
 * key tile (use u = kn + kt, stage u % 2), once K's stage is released
 * (empty[u % 2]) K's tile on full[u % 2], then once V's is (empty[3 +
 * u % 2]) V's on full[3 + u % 2] (kv_bar).  tma=2: thread s->issuer expects each
 * tile's bytes and issues its boxes (tma_tile, tma_fill).  tma=3: the
 * producer's 128 threads copy them (ap__att_stage_rows dealt over
 * threadIdx.x & 127: cp.async where the plan copies an operand so, else
 * loads and stores through the value builder) and announce each at once
 * (ws_announce: with two K / V stages and the query warpgroups' release
 * of a stage one key tile late under the overlap, a later announcement
 * would wait on that release). */
static void ws_produce(att_tc *s, unsigned grid, ap_kir_var *qp)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int64_t es = (int64_t)ap_dtype_size(s->T);
	ap_kir_block *tsaved, *ksaved;
	ap_kir_var *kt;
	ap_kir_expr *q0, *u, *st, *par;

	if (!c->tma) {
		c->stage_tid = ap_kir_bind(k, v->cur, k->index_type, "pt",
					   ap_kir_binary(k, AP_KIR_AND, ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, 127)));
		c->stage_nt = 128;
	}
	q0 = ap__att_open_tiles(c, s->BQ, grid, &tsaved);
	tile_bound(s, q0);
	ws_wait_free(s, ap_kir_idx(k, 2), ap_kir_ref(k, qp));
	if (c->tma) {
		ap_kir_stmt *one = tma_issuer(s);

		if (one) {
			ap_kir_mbar_arrive(k, &one->body, s->full, ap_kir_idx(k, 2),
					   ap_kir_int(k, AP_DT_I32, s->BQ * s->Dp * es));
			tma_tile(s, one, 0, s->BQ, q0, ap_kir_idx(k, 0), ap_kir_idx(k, 2));
		}
	} else {
		ap__att_stage_rows(c, s->qs, ap_kir_idx(k, 0), 0, s->BQ, s->Dp, s->ldq, q0, p->Nq, p->D);
		ws_announce(s, ap_kir_idx(k, 2), p->aw[0]);
	}
	ap_kir_assign(k, v->cur, qp, ap_kir_binary(k, AP_KIR_XOR, ap_kir_ref(k, qp), ap_kir_idx(k, 1)));
	kt = ap_v_loop(v, "kt", ap_kir_idx(k, 0), s->nt, 1, &ksaved);
	u = tma_use(s, ap_kir_ref(k, kt));
	st = ap_kir_bind(k, v->cur, k->index_type, "ps", ap_kir_binary(k, AP_KIR_AND, u, ap_kir_idx(k, 1)));
	par = ap_kir_bind(k, v->cur, k->index_type, "pp",
			  ap_kir_binary(k, AP_KIR_AND, ap_kir_binary(k, AP_KIR_SHR, u, ap_kir_idx(k, 1)), ap_kir_idx(k, 1)));
	/* K's tile once K's stage is free, then V's once V's is */
	for (int role = 1; role <= 2; role++) {
		ws_wait_free(s, kv_bar(s, role, st), par);
		if (c->tma) {
			tma_fill_roles(s, ap_kir_ref(k, kt), st, role);
		} else {
			ap_kir_expr *key0 = ap_kir_muli(k, ap_kir_ref(k, kt), s->BK);

			if (role == 1)
				ap__att_stage_rows(c, s->ks, ap_kir_muli(k, st, s->BK * s->ldq), 1, s->BK, s->Dp, s->ldq, key0,
						   p->Nk, p->D);
			else
				ap__att_stage_rows(c, s->vs, ap_kir_muli(k, st, s->BK * s->ldv), 2, s->BK, s->Dvp, s->ldv, key0,
						   p->Nk, p->Dv);
			ws_announce(s, kv_bar(s, role, st), p->aw[role]);
		}
	}
	ap_v_close(v, ksaved);
	ap_kir_assign(k, v->cur, s->kn, ap_kir_add(k, ap_kir_ref(k, s->kn), s->nt));
	ap_v_close(v, tsaved);
	c->stage_tid = NULL;
	c->stage_nt = 0;
}

/* FlashAttention-3's warp specialisation (docs/hopper-pipeline.md,
 * section 4, "FA3 forward"; Shah et al. 2024, section 3.1): after the
 * barriers' set-up (tma_setup: full[0..1] the K / V stages, full[2] Q's
 * tile, each count 1; empty[0..2] their releases, count W / 4; or
 * copy_setup, full's count 128), ROLES with
 *   - the producer warpgroup, threads [32 W, 32 W + 128): per query tile
 *     of the block (open_tiles' order), once the previous tile's Q is
 *     released (empty[2]) Q's tile on full[2]; per key tile, once its
 *     stage is released (empty[u % 2], u the block's key-tile use: kn +
 *     kt), K's and V's tiles on full[u % 2] -- by TMA (tma=2) or
 *     copied (tma=3): ws_produce;
 *   - the query warpgroups, threads [0, 32 W), each on its own: wait for
 *     Q, then per key tile wait for its stage, S = Q K^T, the online
 *     softmax, O += P V (each wgmma waited for), release the stage; after
 *     the last, release Q and store O.
 * No __syncthreads inside; the phases carry across the block's query
 * tiles (kn, the parities of Q's barriers), both arms counting alike.
 * With two query warpgroups or more each arm first sets its registers
 * (setmaxnreg: the producer gives back all but a few, the query
 * warpgroups take them; tc_ws_maxnreg). */
static void emit_ws(att_tc *s, const ap_target_info *t, int W)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	unsigned producer = 32u * (unsigned)W;
	ap_kir_stmt *roles = ap_kir_roles(k, v->cur), *prod, *cons;
	ap_kir_block *outer = v->cur, *tsaved, *ksaved;
	ap_kir_var *kt, *qp;
	ap_kir_expr *q0, *u;
	unsigned grid = tma_grid(s, t), launch, preg = 0, creg = 0;

	/* two query warpgroups or more: the producer's registers to them */
	if (!tc_ws_maxnreg(t, W, c->tma ? 2 : 3, &launch, &preg, &creg))
		preg = creg = 0;
	prod = ap_kir_arm(k, roles, producer, producer + 128u, 128, -(int)preg);
	cons = ap_kir_arm(k, roles, 0, producer, 128, (int)creg);
	if (!prod || !cons)
		return;
	/* the producer */
	v->cur = &prod->body;
	s->issuer = producer;
	s->kn = ap_kir_var_new(k, k->index_type, "kn");
	qp = ap_kir_var_new(k, k->index_type, "qp");
	ap_kir_let(k, v->cur, s->kn, ap_kir_idx(k, 0));
	ap_kir_let(k, v->cur, qp, ap_kir_idx(k, 0));
	ws_produce(s, grid, qp);
	/* the query warpgroups */
	v->cur = &cons->body;
	s->issuer = 0;
	s->kn = ap_kir_var_new(k, k->index_type, "kn");
	s->qph = ap_kir_var_new(k, k->index_type, "qph");
	ap_kir_let(k, v->cur, s->kn, ap_kir_idx(k, 0));
	ap_kir_let(k, v->cur, s->qph, ap_kir_idx(k, 0));
	q0 = ap__att_open_tiles(c, s->BQ, grid, &tsaved);
	tile_bound(s, q0);
	s->wrow = ap_kir_bind(k, v->cur, k->index_type, "wr", ap_kir_add(k, q0, ap_kir_muli(k, s->warp, 16)));
	ap_kir_mbar_wait(k, v->cur, s->full, ap_kir_idx(k, 2), ap_kir_ref(k, s->qph));
	tc_init_state(s);
	if (c->overlap) {
		ws_overlap_loop(s);
		goto stored;
	}
	kt = ap_v_loop(v, "kt", ap_kir_idx(k, 0), s->nt, 1, &ksaved);
	u = tma_use(s, ap_kir_ref(k, kt));
	tma_wait_role(s, u, 1);
	{
		ap_kir_expr *kst = ap_kir_bind(k, v->cur, k->index_type, "st", ap_kir_binary(k, AP_KIR_AND, u, ap_kir_idx(k, 1)));

		s->key0 = ap_kir_bind(k, v->cur, k->index_type, "k0", ap_kir_muli(k, ap_kir_ref(k, kt), s->BK));
		s->kbase = ap_kir_bind(k, v->cur, k->index_type, "kb", ap_kir_muli(k, kst, s->BK * s->ldq));
		s->vbase = ap_kir_bind(k, v->cur, k->index_type, "vb", ap_kir_muli(k, kst, s->BK * s->ldv));
		wg_qk(s, true);
		ws_release(s, kv_bar(s, 1, kst));   /* S = Q K^T completed: K's stage is free */
		tc_scores(s);
		tc_row_max(s);
		tc_probabilities(s);
		tma_wait_role(s, u, 2);
		wg_pv(s, true);
		ws_release(s, kv_bar(s, 2, kst));   /* O += P V completed: V's stage is free */
	}
	ap_v_close(v, ksaved);
stored:
	ws_release(s, ap_kir_idx(k, 2));   /* Q's tile: its last S = Q K^T completed */
	tc_store(s);
	tma_next_query_tile(s);
	ap_v_close(v, tsaved);
	v->cur = outer;
}

/* The tensor-core form (the comment above): W warps of 16 query rows, key
 * tiles of BK; per key tile tc_stage_kv, tc_qk, tc_scores, tc_row_max,
 * tc_probabilities and tc_pv, then tc_store.  Errors: AP_EUNSUPPORTED
 * (the tiles do not fit the target: tc_fits), AP_ENOMEM. */
int ap__att_emit_tc(actx *c, const ap_target_info *t, int W, int BK, ap_error *err)
{
	const att_plan *p = c->p;
	ap_vctx *v = c->v;
	ap_kir_kernel *k = c->k;
	att_tc s;
	int rc;
	ap_kir_expr *q0;
	ap_kir_var *kt;
	ap_kir_block *tsaved, *ksaved;

	if (!tc_fits(p, t, W, BK))
		return ap_error_set(err, AP_EUNSUPPORTED, v->g->nodes[v->m->root].name, NULL,
				    "attention emitter: %d warps and %d keys a tile do not fit", W, BK);
	memset(&s, 0, sizeof(s));
	s.c = c;
	s.T = p->t;
	s.A = AP_DT_F32;
	s.sc = p->sfold > 0 ? p->sfold : 1;
	c->fold = p->sfold > 0;
	s.Dp = tc_dpad(p);
	s.Dvp = tc_dvpad(p);
	s.ldq = tc_ldq(p);
	s.ldv = tc_ldv(p);
	s.BK = BK;
	s.BQ = 16 * W;
	s.NS = BK / 8;
	s.NO = (int)(s.Dvp / 8);
	s.NST = tc_stages(p);
	s.tf32 = tc_tf32(p);
	s.KS = s.tf32 ? 8 : 16;
	c->wg = tc_wg(p, t) && W % 4 == 0;
	if (c->wg) {   /* wgmma's tiles: no padding, swizzled */
		s.ldq = s.Dp;
		s.ldv = s.Dvp;
		c->sw[0] = c->sw[1] = tc_wg_swizzle(s.Dp, ap_dtype_size(s.T));
		c->sw[2] = tc_wg_swizzle(s.Dvp, ap_dtype_size(s.T));
		ap_kir_comment(k, v->cur, "wgmma (sm_90a): %d warpgroups of 64 query rows, Q and K tiles "
			       "swizzled by %d bytes, V by %d", W / 4, c->sw[0], c->sw[2]);
	}
	if ((rc = tc_declare(&s, t, err)))
		return rc;
	if (c->tma && (!c->wg || s.NST != 2 || (c->ws && !p->q_tma)))
		return ap_error_set(err, AP_EINTERNAL, v->g->nodes[v->m->root].name, NULL,
				    "attention emitter: TMA without wgmma's two stages%s", c->ws ? " or Q's map" : "");
	if (c->tma && (rc = tma_setup(&s, err)))
		return rc;
	if (c->ws && !c->tma && (!c->wg || s.NST != 2))
		return ap_error_set(err, AP_EINTERNAL, v->g->nodes[v->m->root].name, NULL,
				    "attention emitter: a copying producer without wgmma's two stages");
	if (c->ws && !c->tma && (rc = copy_setup(&s, err)))
		return rc;
	s.ntiles = (p->Nk + BK - 1) / BK;
	k->block[0] = 32u * (unsigned)W + (c->ws ? 128u : 0u);
	tc_lanes(&s);
	if (c->ws) {
		emit_ws(&s, t, W);
		return ap_kir_failed(k) ? ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention") : 0;
	}
	q0 = ap__att_open_tiles(c, s.BQ, c->tma ? tma_grid(&s, t) : 0, &tsaved);
	tile_bound(&s, q0);
	/* the first of this warp's 16 rows */
	s.wrow = ap_kir_bind(k, v->cur, k->index_type, "wr", ap_kir_add(k, q0, ap_kir_muli(k, s.warp, 16)));
	tc_load_q(&s, q0);
	tc_init_state(&s);
	if (c->wg && c->overlap && s.NST == 2) {
		ov_key_loop(&s);
		tc_store(&s);
		tma_next_query_tile(&s);
		ap_v_close(v, tsaved);
		return 0;
	}
	kt = ap_v_loop(v, "kt", ap_kir_idx(k, 0), s.nt, 1, &ksaved);
	tc_stage_kv(&s, kt);
	if (c->wg)
		wg_qk(&s, true);
	else
		tc_qk(&s);
	tc_scores(&s);
	tc_row_max(&s);
	tc_probabilities(&s);
	if (c->wg)
		wg_pv(&s, true);
	else
		tc_pv(&s);
	ap_v_close(v, ksaved);
	tc_store(&s);
	tma_next_query_tile(&s);
	ap_v_close(v, tsaved);
	return 0;
}

