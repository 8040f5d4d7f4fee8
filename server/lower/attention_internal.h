/* attention_internal.h -- what the attention emitter's three files share
 * (internal to server/lower/): the analysis (att_plan), the tensor-core
 * tiles' geometry, the kernel context and the steps both forms use.
 *   attention.c         the analysis, the space, the plan, the emitter record
 *   attention_kernel.c  the steps both forms share, and the SIMT form
 *   attention_tc.c      the tensor-core form (mma.sync, and wgmma on sm_90a)
 * The method is attention.c's file comment.
 */
#ifndef AP_LOWER_ATTENTION_INTERNAL_H
#define AP_LOWER_ATTENTION_INTERNAL_H

#include "emitters.h"

#define KEYS 32                     /* SIMT: keys per tile, one per lane */
#define TC_HEAD_MAX 128             /* tensor cores: the largest head dim (registers) */
#define TC_WG_HEAD_MAX 256          /* ... on wgmma (Q from shared memory; one wgmma's N) */
#define TC_PAD 8                    /* tensor cores: elements padding a shared row (16 bytes:
				       ldmatrix's eight rows fall in distinct banks) */

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
	bool safe;                      /* safe softmax: the max is Max(m, lowest finite), the
					   divisor Max(l, 1) -- a row of -inf scores gives 0
					   (match_softmax) */
	int n_stat;                     /* outputs computed from m and l alone (a LogSumExp) */
	int stat[4];
	bool tc;                        /* the tensor-core form (16-bit operands, sm_80 and later) */
	ap_kir_mma_kind mma;            /* its mma.sync shape and types */
	/* tensor cores: per operand (Q, K^T, V), elements per cp.async when it
	 * is a strided view of a buffer, contiguous along the head dim (0: read
	 * through the value builder), its view and buffer */
	int aw[3];
	ap_sview sv[3];
	int leaf[3];
	bool kv_tma;                    /* K and V can each be a tiled tensor map (ap__att_op_tma),
					   in distinct buffers: the wgmma form may fill their
					   tiles by TMA (knob tma) */
	bool q_tma;                     /* so can Q, in a buffer of its own: with tma=1 its
					   tile comes by TMA too */
	int64_t causal_k;               /* k >= 0 where S is Where(j <= i + k, x, -inf) of a causal
					   mask (attention.c causal_of): the tensor-core form
					   stops each query tile's key loop at its diagonal and
					   takes S = x in tiles below it; -1 otherwise */
	int cx;                         /* that x (S's shape) */
	int sx;                         /* with sfold: c * Y1, S itself or the causal Where's x */
	double sfold;                   /* c > 0 where S = c * Y1 is one Mul (or Div) by a
					   constant, both in the accumulation type, and S is
					   not written: the tensor-core form keeps the row
					   maxima of Y1 and folds c into the exponent
					   (attention.c scale_fold); 0 otherwise */
} att_plan;

/* Tensor-core tiles: head dims padded to the mma shapes (the k step of
 * QK^T: 16 for 16-bit operands, 8 for TF32; n8 for PV) and the shared
 * bytes of W warps (16 query rows each) and BK keys a tile. */
static inline bool tc_tf32(const att_plan *p)
{
	return p->mma == AP_KIR_MMA_TF32_1688;
}

static inline int64_t tc_dpad(const att_plan *p)
{
	int ks = tc_tf32(p) ? 8 : 16;

	return (p->D + ks - 1) / ks * ks;
}

static inline int64_t tc_dvpad(const att_plan *p)
{
	return (p->Dv + 7) / 8 * 8;
}

/* Row lengths (elements) of the shared Q / K tiles and of the V tile.
 * ldmatrix reads eight 16-byte rows at a time: 16 bytes of padding a row
 * put them in distinct banks (a row stride of 4 mod 32 words).  TF32
 * reads V's B fragments one element a lane (V[k][n] at rows t, t + 4 and
 * column g): a stride of 8 mod 32 words keeps the 32 lanes in distinct
 * banks. */
static inline int64_t tc_ldq(const att_plan *p)
{
	return tc_dpad(p) + (tc_tf32(p) ? 4 : TC_PAD);
}

static inline int64_t tc_ldv(const att_plan *p)
{
	int64_t d = tc_dvpad(p);

	return tc_tf32(p) ? d + (8 - d % 32 + 32) % 32 : d + TC_PAD;
}

/* Stages of the K and V tiles: two (the next tile's copies in flight
 * while the block computes on this one) when both are copied by
 * cp.async, else one. */
static inline int tc_stages(const att_plan *p)
{
	return p->aw[1] && p->aw[2] ? 2 : 1;
}

/* The tensor-core form on wgmma (sm_90a): 16-bit operands, V's head dim
 * at most 256 (one wgmma's N); a block of whole warpgroups (W a multiple
 * of 4) takes it. */
static inline bool tc_wg(const att_plan *p, const ap_target_info *t)
{
	return p->tc && t->wgmma && !tc_tf32(p) && tc_dvpad(p) <= 256;
}

/* The wgmma form's overlap of the softmax with O += P V (knob overlap):
 * it needs the next tile's copies to wait for the previous tile's last
 * reader, so two K / V stages. */
static inline bool tc_overlap_fits(const att_plan *p, const ap_target_info *t)
{
	return tc_wg(p, t) && tc_stages(p) == 2;
}

/* The swizzle (bytes: 128, 64 or 32) of a wgmma tile whose rows hold
 * `cols` elements of es bytes along their contiguous coordinate (the head
 * dim): the widest atom row dividing a row (kir.h, ap_kir_wg_layout;
 * gemm.c's ap__gemm_wg_swizzle says why).  0 when none does. */
static inline int tc_wg_swizzle(int64_t cols, size_t es)
{
	return ap_kir_wg_swizzle_fit(cols * (int64_t)es, cols * (int64_t)es);
}

/* The wgmma form's K and V tiles filled by TMA (knob tma): two stages,
 * both operands tensor maps (ap__att_kv_tma) and both tiles swizzled
 * (a box lands in a swizzled tile's order, attention_tc.c). */
static inline bool tc_tma_fits(const att_plan *p, const ap_target_info *t)
{
	size_t es = ap_dtype_size(p->t);

	return tc_overlap_fits(p, t) && p->kv_tma && tc_wg_swizzle(tc_dpad(p), es) > 0 &&
	       tc_wg_swizzle(tc_dvpad(p), es) > 0;
}

/* The warp-specialised TMA form (knob tma=2): the TMA form with Q a map
 * too (the producer loads every tile), whole warpgroups, and the
 * producer warpgroup within the block's thread cap. */
static inline bool tc_ws_fits(const att_plan *p, const ap_target_info *t, int W)
{
	return tc_tma_fits(p, t) && p->q_tma && W % 4 == 0 && 32u * (unsigned)W + 128u <= ap_block_cap(t) + t->ws_threads;
}

/* Bytes of the TMA form's mbarriers (knob tma): the two K / V stages',
 * and Q's where its tile comes by TMA too. */
static inline unsigned tc_tma_barrier_bytes(const att_plan *p)
{
	return 8u * (p->q_tma ? 3u : 2u);
}

/* The warp-specialised form with a copying producer (knob tma=3): any
 * operands (cp.async or through the producer's registers), two K / V
 * stages, whole warpgroups, the producer warpgroup within the block's
 * thread cap. */
static inline bool tc_wscopy_fits(const att_plan *p, const ap_target_info *t, int W)
{
	return tc_overlap_fits(p, t) && W % 4 == 0 && 32u * (unsigned)W + 128u <= ap_block_cap(t) + t->ws_threads;
}

/* Bytes of knob tma's mbarriers: tma=1 full per tile kind
 * (tc_tma_barrier_bytes), with the overlap for Q's tile and the two
 * stages of K and of V apart (attention_tc.c kv_bar); warp specialised
 * (2, 3), full and empty for those, and with ping-pong (overlap 2) the
 * two query warpgroups' turns. */
static inline unsigned tc_barrier_bytes(const att_plan *p, int tma, int overlap)
{
	return tma >= 2 ? (overlap == 2 ? 96u : 80u) : tma && overlap ? 40u : tma ? tc_tma_barrier_bytes(p) : 0u;
}

/* Whether W warps in form `tma` take ping-pong (knob overlap 2): warp
 * specialised (tma 2, 3) with exactly two query warpgroups, whose
 * products take turns (FlashAttention-3 section 3.1). */
static inline bool tc_pingpong_fits(int W, int tma)
{
	return W == 8 && tma >= 2;
}

/* Bytes of shared memory of W warps and BK keys a tile on t: the Q tile
 * and the K and V tiles' stages, padded rows; on wgmma unpadded swizzled
 * tiles, each starting on its pattern's repeat, plus the slack of the
 * run-time alignment (ap_kir_shared_dyn_aligned). */
static inline size_t tc_smem(const att_plan *p, const ap_target_info *t, int W, int BK)
{
	size_t es = ap_dtype_size(p->t);
	unsigned rq, rv;

	if (!tc_wg(p, t) || W % 4)
		return (size_t)(16 * W * tc_ldq(p) + tc_stages(p) * BK * (tc_ldq(p) + tc_ldv(p))) * es;
	rq = 8u * (unsigned)tc_wg_swizzle(tc_dpad(p), es);
	rv = 8u * (unsigned)tc_wg_swizzle(tc_dvpad(p), es);
	/* Q, then K's and V's stages, in tc_declare's order */
	return ap_kir_shared_dyn_bytes(3, (const size_t[]){ (size_t)(16 * W) * (size_t)tc_dpad(p) * es,
				       (size_t)(tc_stages(p) * BK) * (size_t)tc_dpad(p) * es,
				       (size_t)(tc_stages(p) * BK) * (size_t)tc_dvpad(p) * es },
				       (const unsigned[]){ rq, rq, rv });
}

/* Whether W warps and BK keys a tile fit on t: the block's threads, and
 * its tiles in shared memory within what a block may ask for -- dynamic
 * shared memory past the 48 KiB every block has (attention_tc.c
 * tc_declare; the runtime asks for it: cuFuncSetAttribute). */
static inline bool tc_fits(const att_plan *p, const ap_target_info *t, int W, int BK)
{
	size_t lim = t->shared_optin_per_block > t->shared_per_block ? t->shared_optin_per_block
								     : t->shared_per_block;

	return W >= 1 && (unsigned)W * 32u <= ap_block_cap(t) && BK % 16 == 0 && BK >= 16 &&
	       tc_smem(p, t, W, BK) <= lim;
}

/* Registers a thread of W warps and BK keys a tile holds, estimated: the
 * scores (BK / 2), their 16-bit copy (BK / 4) and the overlap's second
 * copy (BK / 4, counted with or without the overlap), the output
 * (Dv / 2), on mma.sync Q's fragments (D / 4), and about 32 for
 * addresses and the row state (attention.c tc_traffic: ptxas's counts at
 * sm_90a). */
static inline unsigned tc_regs(const att_plan *p, const ap_target_info *t, int W, int BK)
{
	bool wg = tc_wg(p, t) && W % 4 == 0;

	return (unsigned)(32 + BK + tc_dvpad(p) / 2 + (wg ? 0 : tc_dpad(p) / 4));
}

/* The register split of a warp-specialised form (knob tma 2 or 3) with
 * W / 4 >= 2 query warpgroups (FlashAttention-3 section 3.1; PTX ISA
 * "setmaxnreg"): the block of 32 W + 128 threads is launched with
 * *launch registers a thread -- the most its size leaves each
 * (__launch_bounds__(threads, 1); ptxas then reports exactly that many
 * for a kernel holding setmaxnreg: check_tune attention_setmaxnreg) --
 * the producer warpgroup first gives back all but *producer (24 issuing
 * TMA, 40 copying: tma=3 computes addresses and may stage through
 * registers) and the query warpgroups take *consumer each from the pool
 * so freed, a multiple of 8 up to 240, so that 128 * producer +
 * 32 W * consumer <= threads * launch (setmaxnreg.inc would otherwise
 * wait for registers never released).  False (no setmaxnreg) off the
 * GPU targets, for one query warpgroup (it has registers enough:
 * 256 threads of 248), other forms, or where the split would not raise
 * the query warpgroups' count. */
static inline bool tc_ws_maxnreg(const ap_target_info *t, int W, int tma, unsigned *launch, unsigned *producer,
				 unsigned *consumer)
{
	unsigned threads = 32u * (unsigned)W + 128u, r, prod = tma == 2 ? 24u : 40u, cons;

	if (!t->gpu || !t->regs_per_sm || tma < 2 || W < 8 || W % 4)
		return false;
	r = t->regs_per_sm / threads;
	r = (r > 255u ? 255u : r) & ~7u;
	if (r < prod)
		return false;
	cons = ((r * threads - 128u * prod) / (32u * (unsigned)W)) & ~7u;
	if (cons > 240u)
		cons = 240u;
	if (cons <= r)
		return false;
	*launch = r;
	*producer = prod;
	*consumer = cons;
	return true;
}

/* Blocks of `threads` threads resident on an SM with `smem` bytes of
 * shared memory and `regs` registers a thread: ap_cost_blocks_per_sm_regs
 * for the whole block, a producer warpgroup included -- which may pass the
 * cap a request's blocks keep (ap_target_info.ws_threads: apollod's 256
 * plus 128), so the cap is not applied here. */
static inline unsigned tc_blocks_per_sm(const ap_target_info *t, unsigned threads, unsigned smem, unsigned regs)
{
	ap_target_info u = *t;

	if (u.max_threads_per_block < threads)
		u.max_threads_per_block = threads;
	return ap_cost_blocks_per_sm_regs(&u, threads, smem, regs);
}

/* A thread's registers at the launch of W warps, BK keys a tile, form
 * `tma`: the split's launch count where tc_ws_maxnreg applies, else the
 * estimate tc_regs. */
static inline unsigned tc_launch_regs(const att_plan *p, const ap_target_info *t, int W, int BK, int tma)
{
	unsigned launch, prod, cons;

	return tc_ws_maxnreg(t, W, tma, &launch, &prod, &cons) ? launch : tc_regs(p, t, W, BK);
}

/* Whether W warps and BK keys a tile, in form `tma` (knob tma: 2 and 3
 * add a producer warpgroup), hold their registers: tc_regs within the
 * query warpgroups' share of tc_ws_maxnreg where that applies, else
 * tc_regs for each of the block's threads within the SM's register file
 * (else ptxas, bound by the block's size, would spill). */
static inline bool tc_regs_fit(const att_plan *p, const ap_target_info *t, int W, int BK, int tma)
{
	unsigned threads = 32u * (unsigned)W + (tma >= 2 ? 128u : 0u), launch, prod, cons;

	if (tc_ws_maxnreg(t, W, tma, &launch, &prod, &cons))
		return tc_regs(p, t, W, BK) <= cons;
	return !t->gpu || !t->regs_per_sm || tc_regs(p, t, W, BK) * threads <= t->regs_per_sm;
}

typedef struct actx {
	const att_plan *p;
	ap_vctx *v;
	ap_kir_kernel *k;
	ap_kir_expr *bc[AP_MAX_RANK];   /* the block's batch coordinates */
	ap_kir_expr *dot;               /* leaf hook: Y1's value (a lane's dot product) */
	bool fold;                      /* the tensor-core form's scale fold (p->sfold): the leaf
					   c * Y1 (p->sx) is the dot product itself */
	bool visible;                   /* ap__att_score evaluates the causal Where's x (p->cx):
					   a tile every key of which the rows see */
	ap_kir_expr *mval, *lval;       /* leaf hook: the row's max and sum (accumulator type) */
	ap_kir_expr *out;               /* leaf hook: O's value */
	bool wg;                        /* the tensor-core form on wgmma (sm_90a): Q, K and V
					   tiles in wgmma's layouts (ap__att_wg_place) */
	int sw[3];                      /* wg: the Q, K and V tiles' swizzles (tc_wg_swizzle) */
	bool overlap;                   /* wg with two K / V stages: tile j's softmax beside
					   tile j-1's O += P V (knob overlap; attention_tc.c) */
	bool pingpong;                  /* ws with two query warpgroups: their products take
					   turns (knob overlap 2; attention_tc.c ws_overlap_loop) */
	bool tma;                       /* wg with two K / V stages: their tiles filled by TMA
					   on two mbarriers (knob tma; attention_tc.c) */
	bool ws;                        /* tma=2: warp specialised -- a producer warpgroup
					   issues Q's, K's and V's loads, the warpgroups of
					   query rows wait for them (attention_tc.c, emit_ws);
					   tma=3 (ws without tma): the producer copies them
					   (cp.async or its registers) */
	ap_kir_expr *stage_tid;         /* set: ap__att_stage_rows deals its copies over
					   stage_nt threads numbered so (the copying
					   producer's); NULL: over the block */
	unsigned stage_nt;
} actx;

/* ---- attention_kernel.c: the shared steps and the SIMT form ---- */

/* wgmma's place (an element offset) of element (r, j) -- r the tile's row
 * (a query or key), j its head-dim column -- of operand `role`'s tile (0
 * Q, 1 K, 2 V) of `rows` rows of `cols` columns: swizzled by c->sw[role]
 * bytes (ap__wg_swizzled_place) or in core matrices (ap__wg_place).  Read
 * K-major for Q and K, MN-major for V. */
ap_kir_expr *ap__att_wg_place(actx *c, int role, ap_kir_expr *r, ap_kir_expr *j, int64_t rows, int64_t cols);

/* What the output accumulator of a row is divided by: its sum l, or in
 * the safe form Max(l, 1) -- l itself wherever a score is finite (the
 * largest adds exp(0) = 1), 1 for a row of -inf scores, whose
 * accumulator stayed 0. */
ap_kir_expr *ap__att_divisor(actx *c, ap_kir_expr *l);

/* The value builder's leaf hook of both forms: Y1's value is c->dot, the
 * row's max and sum c->mval and c->lval, O's value c->out (each where the
 * form set it); every other tensor the builder's own. */
ap_kir_expr *ap__att_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user);

/* Index into tensor x (of rank >= 2) at the block's batch, broadcast the
 * numpy way, and (r, c) for its last two dims. */
ap_lidx ap__att_idx2(actx *c, int x, ap_kir_expr *r, ap_kir_expr *col);

/* Butterfly over groups of `lanes` consecutive lanes (a power of two):
 * every lane ends with the max (or sum) of v over its group. */
ap_kir_expr *ap__att_xor_reduce(actx *c, ap_kir_expr *v, bool max, int lanes);

/* Stages rows [r0, r0 + n) of a tile of operand `role` (0 Q, 1 K^T, 2 V)
 * into the shared array `arr` (row r at arr[base + r * ld], `cols` elements of
 * arr's type), the block's threads (c->stage_nt threads numbered
 * c->stage_tid where set) striding over it: element (r, j) is
 * the operand at (r0 + r, j) -- K^T at (j, r0 + r) -- and zero past row
 * `rows_ok` or column `cols_ok`.  Copied by cp.async (p->aw[role]
 * elements at a time, from its buffer; the caller commits and waits) when
 * the plan says so, else read through the value builder (views and
 * prologues in place). */
void ap__att_stage_rows(actx *c, ap_kir_array *arr, ap_kir_expr *base, int role, int64_t n, int64_t cols,
		       int64_t ld, ap_kir_expr *r0, int64_t rows_ok, int64_t cols_ok);

/* The copies this thread issued are complete (when there are any): the
 * barrier that follows makes them the block's. */
void ap__att_async_done(actx *c, bool any);

/* sv = S at (row, key) (float32 or float64): the first product's
 * epilogue on `dot`, Y1's value there; S is also stored when another
 * kernel reads it and row < Nq (rows past it are read at the last row,
 * never stored). */
void ap__att_score(actx *c, ap_kir_var *sv, ap_kir_expr *dot, ap_kir_expr *row, ap_kir_expr *key);

/* The row statistics other kernels read (the max m and the sum l of
 * row), stored when row < Nq and `cond`. */
void ap__att_store_stats(actx *c, ap_kir_expr *row, ap_kir_expr *cond, ap_kir_var *m, ap_kir_var *l);

/* Opens the grid-stride loop over the block tiles, `per` query rows of
 * one batch each (the grid is set here: a block a tile, at most
 * max_grid blocks when max_grid > 0), with a barrier first (the previous
 * tile's shared memory is free after it); sets c->bc to the tile's batch
 * coordinates and returns its first query row.  *saved closes the loop
 * (ap_v_close). */
ap_kir_expr *ap__att_open_tiles(actx *c, int64_t per, unsigned max_grid, ap_kir_block **saved);
ap_kir_expr *ap__att_key_tiles(actx *c, ap_kir_expr *q0, int64_t rows, int64_t keys, int64_t ntiles,
			       const char *name);

/* The SIMT form (the file comment): R warps a block, a query row each;
 * per key tile, simt_score, simt_softmax and simt_accumulate, then
 * simt_store.  Errors: AP_EUNSUPPORTED (R warps do not fit a block),
 * AP_ENOMEM. */
int ap__att_emit_simt(actx *c, const ap_target_info *t, int R, ap_error *err);

/* ---- attention_tc.c: the tensor-core form ---- */

/* The tensor-core form (attention_tc.c, the comment on att_tc): W warps of 16 query rows, key
 * tiles of BK; per key tile tc_stage_kv, tc_qk, tc_scores, tc_row_max,
 * tc_probabilities and tc_pv, then tc_store.  Errors: AP_EUNSUPPORTED
 * (the tiles do not fit the target: tc_fits), AP_ENOMEM. */
int ap__att_emit_tc(actx *c, const ap_target_info *t, int W, int BK, ap_error *err);

/* Whether operand `role` (0 Q, 1 the plan's K^T, 2 V) can be a tiled
 * tensor map (common/tmap.h) filled a tile at a time: copied by cp.async
 * (a strided view contiguous along the head dim), the view starting at
 * its buffer's first element (the runtime binds a map to the buffer), the
 * head and row dims one factor each, at most five factors of extent > 1,
 * every stride but the head dim's a positive multiple of 16 bytes, the
 * tile swizzled.  A map per buffer: the caller asks for distinct buffers.
 * attention_tc.c. */
bool ap__att_op_tma(const ap_graph *g, const att_plan *p, int role);

#endif
