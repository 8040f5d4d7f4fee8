/* attention_kernel.c -- the attention emitter's kernel: the steps both
 * forms share (the leaf hook, staging rows of K and V, scores, the row
 * statistics, the tile loop) and the SIMT form (see attention.c).
 */
#include "attention_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* (emitters.h) Q and K are read K-major, V MN-major. */
ap_kir_expr *ap__wg_place(ap_kir_kernel *k, ap_kir_expr *r, ap_kir_expr *j, int64_t cols, int es)
{
	int E = 16 / es, lg = es == 2 ? 3 : es == 4 ? 2 : 1;   /* elements a core-matrix row, log2 */
	ap_kir_expr *hr = ap_kir_binary(k, AP_KIR_SHR, r, ap_kir_idx(k, 3)), *lr = ap_kir_binary(k, AP_KIR_AND, r, ap_kir_idx(k, 7));
	ap_kir_expr *hj = ap_kir_binary(k, AP_KIR_SHR, j, ap_kir_idx(k, lg)), *lj = ap_kir_binary(k, AP_KIR_AND, j, ap_kir_idx(k, E - 1));

	return ap_kir_add(k, ap_kir_add(k, ap_kir_muli(k, hr, 8 * cols), ap_kir_muli(k, hj, 8 * E)),
			  ap_kir_add(k, ap_kir_muli(k, lr, E), lj));
}

ap_kir_expr *ap__wg_swizzled_place(ap_kir_kernel *k, ap_kir_expr *r, ap_kir_expr *j, int64_t rows, int64_t ja,
				   int es)
{
	ap_kir_expr *lr = ap_kir_binary(k, AP_KIR_AND, r, ap_kir_idx(k, 7));
	ap_kir_expr *atom = ap_kir_add(k, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, j, ap_kir_idx(k, ja)), rows * ja),
				       ap_kir_muli(k, ap_kir_binary(k, AP_KIR_SHR, r, ap_kir_idx(k, 3)), 8 * ja));
	/* the row's chunk permutation: row * W / 128, W = ja es bytes a row */
	ap_kir_expr *x = ap_kir_binary(k, AP_KIR_SHR, ap_kir_muli(k, lr, ja * es), ap_kir_idx(k, 7));
	ap_kir_expr *chunk = ap_kir_binary(k, AP_KIR_XOR,
					   ap_kir_binary(k, AP_KIR_DIV, ap_kir_binary(k, AP_KIR_REM, j, ap_kir_idx(k, ja)),
							 ap_kir_idx(k, 16 / es)),
					   x);

	return ap_kir_add(k, ap_kir_add(k, atom, ap_kir_muli(k, lr, ja)),
			  ap_kir_add(k, ap_kir_muli(k, chunk, 16 / es), ap_kir_binary(k, AP_KIR_REM, j, ap_kir_idx(k, 16 / es))));
}

ap_kir_expr *ap__att_wg_place(actx *c, int role, ap_kir_expr *r, ap_kir_expr *j, int64_t rows, int64_t cols)
{
	int es = (int)ap_dtype_size(c->p->t);

	if (c->sw[role])
		return ap__wg_swizzled_place(c->k, r, j, rows, c->sw[role] / es, es);
	return ap__wg_place(c->k, r, j, cols, es);
}

/* What the output accumulator of a row is divided by: its sum l, or in
 * the safe form Max(l, 1) -- l itself wherever a score is finite (the
 * largest adds exp(0) = 1), 1 for a row of -inf scores, whose
 * accumulator stayed 0. */
ap_kir_expr *ap__att_divisor(actx *c, ap_kir_expr *l)
{
	return c->p->safe ? ap_v_max(c->v, l, ap_kir_float(c->k, l->type, 1.0)) : l;
}

ap_kir_expr *ap__att_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	actx *c = user;

	if (c->fold && t == c->p->sx && c->dot)
		return c->dot;
	if (t == c->p->y1 && c->dot)
		return ap_kir_cast(v->k, v->g->tensors[t].dtype, c->dot);
	if (t == c->p->o && c->out)
		return ap_kir_cast(v->k, v->g->tensors[t].dtype, c->out);
	/* the statistics enter a LogSumExp unrounded (FlashAttention keeps
	 * them in float32 for 16-bit operands) */
	if (t == c->p->m && c->mval)
		return c->mval;
	if (t == c->p->l && c->lval)
		return c->lval;
	return NULL;
}

/* Index into tensor x (of rank >= 2) at the block's batch, broadcast the
 * numpy way, and (r, c) for its last two dims. */
ap_lidx ap__att_idx2(actx *c, int x, ap_kir_expr *r, ap_kir_expr *col)
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

/* Butterfly over groups of `lanes` consecutive lanes (a power of two):
 * every lane ends with the max (or sum) of v over its group. */
ap_kir_expr *ap__att_xor_reduce(actx *c, ap_kir_expr *v, bool max, int lanes)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *vc = c->v;
	ap_kir_var *acc;

	if (!v)
		return NULL;   /* an allocation failed: the kernel is marked failed */
	acc = ap_kir_var_new(k, v->type, max ? "wm" : "ws");

	ap_kir_let(k, vc->cur, acc, v);
	for (int off = lanes / 2; off >= 1; off /= 2) {
		ap_kir_var *o = ap_kir_var_new(k, v->type, "sh");

		ap_kir_let(k, vc->cur, o, NULL);
		ap_kir_shfl(k, vc->cur, o, AP_KIR_SHFL_XOR, ap_kir_ref(k, acc), ap_kir_idx(k, off), 32);
		ap_kir_assign(k, vc->cur, acc, max ? ap_kir_binary(k, AP_KIR_MAX, ap_kir_ref(k, acc), ap_kir_ref(k, o))
						   : ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc), ap_kir_ref(k, o)));
	}
	return ap_kir_ref(k, acc);
}

/* The shared place of tile element (r, j) of ap__att_stage_rows: wgmma's
 * layouts, or row r at r * ld. */
static ap_kir_expr *stage_place(actx *c, int role, ap_kir_expr *r, ap_kir_expr *j, int64_t n, int64_t cols,
				int64_t ld)
{
	return c->wg ? ap__att_wg_place(c, role, r, j, n, cols) : ap_kir_add(c->k, ap_kir_muli(c->k, r, ld), j);
}

/* Stages rows [r0, r0 + n) of a tile of operand `role` (0 Q, 1 K^T, 2 V)
 * into the shared array `arr` (row r at arr[base + r * ld], `cols` elements of
 * arr's type), the block's threads striding over it: element (r, j) is
 * the operand at (r0 + r, j) -- K^T at (j, r0 + r) -- and zero past row
 * `rows_ok` or column `cols_ok`; r0 is a multiple of n (every caller's
 * tiles are), so no row test is made where n divides rows_ok.  Copied by
 * cp.async (p->aw[role] elements at a time, from its buffer; the caller
 * commits and waits) when the plan says so, else read through the value
 * builder (views and prologues in place).
 *
 * Where the threads are whole rows of copies (cols / w divides them) and
 * the copies a whole number of passes, a thread's column and first row
 * are computed once and each pass moves its row by threads / (cols / w):
 * the shared place advances by a constant (the wgmma layouts are linear
 * in whole 8-row groups, checked), a loop of constant trip count -- the per-copy division,
 * remainder and swizzle of the general loop gone (issue 25's "copy
 * addresses computed once", as the GEMM's ap__gemm_hoist_copies). */
void ap__att_stage_rows(actx *c, ap_kir_array *arr, ap_kir_expr *base, int role, int64_t n, int64_t cols,
		       int64_t ld, ap_kir_expr *r0, int64_t rows_ok, int64_t cols_ok)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const att_plan *p = c->p;
	int x = role == 0 ? p->q : role == 1 ? p->kt : p->v, w = p->aw[role] ? p->aw[role] : 1;
	bool trans = role == 1;
	unsigned nt = c->stage_tid ? c->stage_nt : ap_kir_block_threads(k);
	ap_kir_expr *tid = c->stage_tid ? c->stage_tid : ap_kir_index_of(k, AP_KIR_THREAD_X);
	int64_t cw = cols / w, passes = n * cw / nt, step = nt / cw, delta = 0;
	ap_kir_block *saved, *s2;
	ap_kir_var *e;
	ap_kir_expr *r, *j, *gr, *ok, *at;
	ap_kir_var *val;
	ap_lidx ix;

	if (nt % cw == 0 && (n * cw) % nt == 0 && passes >= 1 && passes <= 16 && (!c->wg || step % 8 == 0) &&
	    ap_kir_is_int(stage_place(c, role, ap_kir_idx(k, step), ap_kir_idx(k, 0), n, cols, ld), &delta)) {
		ap_kir_expr *rb = ap_kir_bind(k, v->cur, k->index_type, "sr", ap_kir_binary(k, AP_KIR_DIV, tid, ap_kir_idx(k, cw)));
		ap_kir_expr *jb = ap_kir_bind(k, v->cur, k->index_type, "sc",
					      ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, tid, ap_kir_idx(k, cw)), w));
		ap_kir_expr *at0 = ap_kir_bind(k, v->cur, k->index_type, "sp",
					       ap_kir_add(k, base, stage_place(c, role, rb, jb, n, cols, ld)));

		e = ap_v_loop(v, "e", ap_kir_idx(k, 0), ap_kir_idx(k, passes), 1, &saved);
		r = ap_kir_add(k, rb, ap_kir_muli(k, ap_kir_ref(k, e), step));
		j = jb;
		at = ap_kir_add(k, at0, ap_kir_muli(k, ap_kir_ref(k, e), delta));
	} else {
		e = ap_v_loop(v, "e", tid, ap_kir_idx(k, n * cw), nt, &saved);
		r = ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, e), ap_kir_idx(k, cw));
		j = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, e), ap_kir_idx(k, cw)), w);
		at = ap_kir_add(k, base, stage_place(c, role, r, j, n, cols, ld));
	}
	gr = ap_kir_bind(k, v->cur, k->index_type, "gr", ap_kir_add(k, r0, r));
	ok = rows_ok % n == 0 ? NULL : ap_kir_binary(k, AP_KIR_LT, gr, ap_kir_idx(k, rows_ok));
	if (cols_ok < cols) {
		ap_kir_expr *jok = ap_kir_binary(k, AP_KIR_LT, j, ap_kir_idx(k, cols_ok));

		ok = ok ? ap_kir_binary(k, AP_KIR_LAND, ok, jok) : jok;
	}
	ix = trans ? ap__att_idx2(c, x, j, gr) : ap__att_idx2(c, x, gr, j);
	if (p->aw[role]) {
		ap_kir_cp_async(k, v->cur, arr, at, ap_v_buffer(v, p->leaf[role]),
				ap_sview_offset(k, &p->sv[role], &ix), w, ok);
		ap_v_close(v, saved);
		return;
	}
	val = ap_kir_var_new(k, arr->type, "x");
	ap_kir_let(k, v->cur, val, ap_kir_float(k, arr->type, 0));
	if (ok)
		ap_v_if(v, ok, &s2, NULL);
	ap_kir_assign(k, v->cur, val, ap_kir_cast(k, arr->type, ap_val(v, x, &ix)));
	if (ok)
		ap_v_close(v, s2);
	ap_kir_store(k, v->cur, arr, at, ap_kir_ref(k, val));
	ap_v_close(v, saved);
}

/* The copies this thread issued are complete (when there are any): the
 * barrier that follows makes them the block's. */
void ap__att_async_done(actx *c, bool any)
{
	if (any) {
		ap_kir_cp_commit(c->k, c->v->cur);
		ap_kir_cp_wait(c->k, c->v->cur, 0);
	}
}

/* sv = S at (row, key) (float32 or float64): the first product's
 * epilogue on `dot`, Y1's value there; S is also stored when another
 * kernel reads it and row < Nq (rows past it are read at the last row,
 * never stored). */
void ap__att_score(actx *c, ap_kir_var *sv, ap_kir_expr *dot, ap_kir_expr *row, ap_kir_expr *key)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const att_plan *p = c->p;
	ap_kir_expr *rowc;
	ap_lidx ix;

	if (!sv || !dot || !row || !key)
		return;   /* an allocation failed: the kernel is marked failed */
	rowc = ap_kir_binary(k, AP_KIR_MIN, row, ap_kir_idx(k, p->Nq - 1));
	c->dot = ap_kir_bind(k, v->cur, dot->type, "dot", dot);
	ix = ap__att_idx2(c, p->s, rowc, key);
	ap_kir_assign(k, v->cur, sv, ap_kir_cast(k, sv->type, ap_val(v, c->visible ? p->cx : p->s, &ix)));
	if (p->s_out) {
		ap_kir_block *s3;
		ap_lidx ox = ap__att_idx2(c, p->s, row, key);

		ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, row, ap_kir_idx(k, p->Nq)), &s3, NULL);
		ap_kir_store(k, v->cur, ap_v_buffer(v, p->s), ap_lidx_linear(v, &ox),
			     ap_kir_cast(k, v->g->tensors[p->s].dtype, ap_kir_ref(k, sv)));
		ap_v_close(v, s3);
	}
	c->dot = NULL;
}

/* The row statistics other kernels read (the max m and the sum l of
 * row), stored when row < Nq and `cond`. */
void ap__att_store_stats(actx *c, ap_kir_expr *row, ap_kir_expr *cond, ap_kir_var *m, ap_kir_var *l)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const att_plan *p = c->p;
	ap_kir_block *s2;

	if (!p->m_out && !p->l_out && !p->n_stat)
		return;
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_LT, row, ap_kir_idx(k, p->Nq)), cond), &s2, NULL);
	for (int i = 0; i < p->n_stat; i++) {
		ap_lidx mix = ap__att_idx2(c, p->m, row, ap_kir_idx(k, 0)), ix = ap_lidx_relin(v, &mix, p->stat[i]);

		c->mval = ap_kir_ref(k, m);
		c->lval = ap_kir_ref(k, l);
		ap_kir_store(k, v->cur, ap_v_buffer(v, p->stat[i]), ap_lidx_linear(v, &ix),
			     ap_kir_cast(k, v->g->tensors[p->stat[i]].dtype, ap_val(v, p->stat[i], &ix)));
		c->mval = c->lval = NULL;
	}
	for (int w = 0; w < 2; w++) {
		int x = w ? p->l : p->m;
		ap_lidx ix;

		if (!(w ? p->l_out : p->m_out))
			continue;
		ix = ap__att_idx2(c, x, row, ap_kir_idx(k, 0));
		ap_kir_store(k, v->cur, ap_v_buffer(v, x), ap_lidx_linear(v, &ix),
			     ap_kir_cast(k, v->g->tensors[x].dtype, ap_kir_ref(k, w ? l : m)));
	}
	ap_v_close(v, s2);
}

/* Opens the grid-stride loop over the block tiles, `per` query rows of
 * one batch each (the grid is set here), with a barrier first (the
 * previous tile's shared memory is free after it); sets c->bc to the
 * tile's batch coordinates and returns its first query row.  *saved
 * closes the loop (ap_v_close). */
ap_kir_expr *ap__att_open_tiles(actx *c, int64_t per, unsigned max_grid, ap_kir_block **saved)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const att_plan *p = c->p;
	int64_t qblocks = (p->Nq + per - 1) / per, stride = 1;
	unsigned grid = ap_grid_for(p->batch * qblocks, 1);
	ap_kir_var *tile;
	ap_kir_expr *bi, *q0;

	if (max_grid > 0 && grid > max_grid)
		grid = max_grid;
	k->grid[0] = grid;
	tile = ap_v_loop(v, "tile", ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_idx(k, p->batch * qblocks), grid, saved);
	if (!c->ws)   /* warp specialised: the arms meet on mbarriers only */
		ap_kir_barrier(k, v->cur);
	if (p->causal_k >= 0) {
		/* causal (the key loop to the diagonal: attention_tc.c
		 * tile_bound, ap__att_emit_simt): the longest query tiles, the last rows, first
		 * and across the batch -- tile t is query tile qblocks - 1 -
		 * t / batch of batch t % batch -- so that the short ones fill
		 * the last wave (FlashAttention-3's causal order) */
		bi = ap_kir_bind(k, v->cur, k->index_type, "bi",
				 ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, tile), ap_kir_idx(k, p->batch)));
		q0 = ap_kir_bind(k, v->cur, k->index_type, "q0",
				 ap_kir_muli(k, ap_kir_binary(k, AP_KIR_SUB, ap_kir_idx(k, qblocks - 1),
							   ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, tile), ap_kir_idx(k, p->batch))),
					     per));
	} else {
		bi = ap_kir_bind(k, v->cur, k->index_type, "bi",
				 ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, tile), ap_kir_idx(k, qblocks)));
		q0 = ap_kir_bind(k, v->cur, k->index_type, "q0",
				 ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, tile), ap_kir_idx(k, qblocks)), per));
	}
	for (int d = p->nb - 1; d >= 0; d--) {
		c->bc[d] = p->bdims[d] == 1 ? ap_kir_idx(k, 0)
			   : ap_kir_bind(k, v->cur, k->index_type, "b",
					 ap_kir_binary(k, AP_KIR_REM, ap_kir_binary(k, AP_KIR_DIV, bi, ap_kir_idx(k, stride)),
						       ap_kir_idx(k, p->bdims[d])));
		stride *= p->bdims[d];
	}
	return q0;
}

/* The key tiles of `keys` keys a block of `rows` query rows from q0
 * visits: all ntiles of them, or under a causal mask (p->causal_k =
 * k >= 0: key j of row i masked where j > i + k) those holding a key its
 * last row i1 = min(q0 + rows, Nq) - 1 attends to, min((i1 + k) / keys +
 * 1, ntiles), bound as `name` -- every key of a later tile is masked for
 * every row of the block (-inf: probability 0), so skipping them changes
 * no sum (FlashAttention-2's causal loop bound, Dao 2023, section
 * 3.1.1).  At least 1: tile 0 holds key 0 <= i + k.  Both forms' key
 * loops (attention_tc.c tile_bound, ap__att_emit_simt). */
ap_kir_expr *ap__att_key_tiles(actx *c, ap_kir_expr *q0, int64_t rows, int64_t keys, int64_t ntiles,
			       const char *name)
{
	ap_kir_kernel *k = c->k;
	const att_plan *p = c->p;
	ap_kir_expr *i1, *need;

	if (p->causal_k < 0)
		return ap_kir_idx(k, ntiles);
	i1 = ap_kir_binary(k, AP_KIR_MIN, ap_kir_addi(k, q0, rows - 1), ap_kir_idx(k, p->Nq - 1));
	need = ap_kir_addi(k, ap_kir_binary(k, AP_KIR_DIV, ap_kir_addi(k, i1, p->causal_k), ap_kir_idx(k, keys)), 1);
	return ap_kir_bind(k, c->v->cur, k->index_type, name, ap_kir_binary(k, AP_KIR_MIN, need, ap_kir_idx(k, ntiles)));
}

/* The SIMT form's state (emit_simt): R warps a block, one query row a
 * warp, KEYS keys a tile, one key a lane. */
typedef struct att_simt {
	actx *c;
	ap_dtype A;                     /* the accumulator type */
	int nc;                         /* output columns a lane: lane, lane + 32, ... */
	ap_kir_array *ks, *vs;          /* the key tile of K ([key][D + 1]) and of V ([key][Dv]) */
	ap_kir_array *qs, *ps;          /* per warp: its row's query [D], its probabilities [KEYS] */
	ap_kir_array *acc;              /* the lane's output columns (registers) */
	ap_kir_expr *warp, *lane, *ninf;
	ap_kir_expr *row, *rowc, *valid;  /* the warp's row, clamped to Nq - 1, row < Nq */
	ap_kir_var *mrun, *lrun;        /* the row's running maximum and sum */
} att_simt;

/* The warp's row of Q into qs[warp][..] (the lanes striding over D), as
 * the accumulator type. */
static void simt_load_query(att_simt *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *d = ap_v_loop(v, "d", s->lane, ap_kir_idx(k, c->p->D), 32, &saved);
	ap_lidx ix = ap__att_idx2(c, c->p->q, s->rowc, ap_kir_ref(k, d));

	ap_kir_store(k, v->cur, s->qs, ap_kir_add(k, ap_kir_muli(k, s->warp, c->p->D), ap_kir_ref(k, d)),
		     ap_kir_cast(k, s->A, ap_val(v, c->p->q, &ix)));
	ap_v_close(v, saved);
}

/* The score of this lane's key of the tile at key0 (the tiles of K and V
 * staged first): the dot product of the row's query with the key, then
 * the first product's epilogue (score); -inf past the last key.
 * Returns it. */
static ap_kir_expr *simt_score(att_simt *s, ap_kir_expr *key0)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *key;
	ap_kir_var *dot, *sv;
	ap_kir_block *saved;

	ap_kir_barrier(k, v->cur);
	/* the key tile of K (from K^T) and of V */
	ap__att_stage_rows(c, s->ks, ap_kir_idx(k, 0), 1, KEYS, p->D, p->D + 1, key0, p->Nk, p->D);
	ap__att_stage_rows(c, s->vs, ap_kir_idx(k, 0), 2, KEYS, p->Dv, p->Dv, key0, p->Nk, p->Dv);
	ap_kir_barrier(k, v->cur);
	/* this lane's key: its score */
	key = ap_kir_bind(k, v->cur, k->index_type, "key", ap_kir_add(k, key0, s->lane));
	dot = ap_kir_var_new(k, s->A, "dot");
	ap_kir_let(k, v->cur, dot, ap_kir_float(k, s->A, 0));
	{
		ap_kir_var *d = ap_v_loop(v, "d", ap_kir_idx(k, 0), ap_kir_idx(k, p->D), 1, &saved);

		ap_kir_assign(k, v->cur, dot,
			      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, dot),
					    ap_kir_binary(k, AP_KIR_MUL,
							  ap_kir_load(k, s->qs, ap_kir_add(k, ap_kir_muli(k, s->warp, p->D), ap_kir_ref(k, d))),
							  ap_kir_load(k, s->ks, ap_kir_add(k, ap_kir_muli(k, s->lane, p->D + 1), ap_kir_ref(k, d))))));
		ap_v_close(v, saved);
	}
	/* S at (row, key): the first product's epilogue on the dot product */
	sv = ap_kir_var_new(k, s->A, "s");
	ap_kir_let(k, v->cur, sv, s->ninf);
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, key, ap_kir_idx(k, p->Nk)), &saved, NULL);
	ap__att_score(c, sv, ap_kir_ref(k, dot), s->row, key);
	ap_v_close(v, saved);
	return ap_kir_ref(k, sv);
}

/* The online softmax step for the tile (the file comment): the tile's
 * maximum over the warp, the new maximum m', the lane's probability
 * exp(s - m') into ps[warp][lane], l and m updated.  Returns the rescale
 * factor exp(m - m') of the output (1 while every score is -inf). */
static ap_kir_expr *simt_softmax(att_simt *s, ap_kir_expr *sval)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_dtype A = s->A;
	ap_kir_expr *mt, *mnew, *dead, *alpha, *pv, *psum;

	mt = ap__att_xor_reduce(c, sval, true, 32);
	mnew = ap_kir_bind(k, v->cur, A, "mn", ap_kir_binary(k, AP_KIR_MAX, ap_kir_ref(k, s->mrun), mt));
	/* with every score so far -inf, nothing to rescale and nothing to add */
	dead = ap_kir_bind(k, v->cur, AP_DT_BOOL, "dd", ap_kir_binary(k, AP_KIR_EQ, mnew, s->ninf));
	alpha = ap_kir_bind(k, v->cur, A, "al",
			    ap_kir_select(k, dead, ap_kir_float(k, A, 1),
					  ap_kir_call(k, AP_KIR_EXP, ap_kir_binary(k, AP_KIR_SUB, ap_kir_ref(k, s->mrun), mnew), NULL)));
	pv = ap_kir_bind(k, v->cur, A, "p",
			 ap_kir_select(k, dead, ap_kir_float(k, A, 0),
				       ap_kir_call(k, AP_KIR_EXP, ap_kir_binary(k, AP_KIR_SUB, sval, mnew), NULL)));
	psum = ap__att_xor_reduce(c, pv, false, 32);
	ap_kir_assign(k, v->cur, s->lrun, ap_kir_binary(k, AP_KIR_ADD, ap_kir_binary(k, AP_KIR_MUL, ap_kir_ref(k, s->lrun), alpha), psum));
	ap_kir_assign(k, v->cur, s->mrun, mnew);
	ap_kir_store(k, v->cur, s->ps, ap_kir_add(k, ap_kir_muli(k, s->warp, KEYS), s->lane), pv);
	ap_kir_barrier(k, v->cur);
	return alpha;
}

/* acc = acc * alpha + P V for this lane's output columns lane,
 * lane + 32, ... (those below Dv): the warp's probabilities from ps, V's
 * tile from vs. */
static void simt_accumulate(att_simt *s, ap_kir_expr *alpha)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_kir_var *e = ap_kir_var_new(k, k->index_type, "i");
	ap_kir_stmt *li = ap_kir_for_unroll(k, c->v->cur, e, ap_kir_idx(k, 0), ap_kir_idx(k, s->nc), 1, -1);
	ap_kir_expr *col = ap_kir_add(k, s->lane, ap_kir_muli(k, ap_kir_ref(k, e), 32));
	ap_kir_var *a2 = ap_kir_var_new(k, s->A, "a"), *j = ap_kir_var_new(k, k->index_type, "j");
	ap_kir_stmt *lj, *guard;

	if (!li)
		return;
	ap_kir_let(k, &li->body, a2, ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, s->acc, ap_kir_ref(k, e)), alpha));
	guard = ap_kir_if(k, &li->body, ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, c->p->Dv)));
	lj = guard ? ap_kir_for(k, &guard->body, j, ap_kir_idx(k, 0), ap_kir_idx(k, KEYS), 1) : NULL;
	if (lj)
		ap_kir_assign(k, &lj->body, a2,
			      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, a2),
					    ap_kir_binary(k, AP_KIR_MUL,
							  ap_kir_load(k, s->ps, ap_kir_add(k, ap_kir_muli(k, s->warp, KEYS), ap_kir_ref(k, j))),
							  ap_kir_load(k, s->vs, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, j), c->p->Dv), col)))));
	ap_kir_store(k, &li->body, s->acc, ap_kir_ref(k, e), ap_kir_ref(k, a2));
}

/* After the last key tile: O = acc / l at the lane's columns through O's
 * epilogue (rows below Nq), and the row's statistics others read (lane
 * 0). */
static void simt_store(att_simt *s)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved, *s2;
	ap_kir_var *i = ap_v_loop(v, "i", ap_kir_idx(k, 0), ap_kir_idx(k, s->nc), 1, &saved);
	ap_kir_expr *col = ap_kir_bind(k, v->cur, k->index_type, "col",
				       ap_kir_add(k, s->lane, ap_kir_muli(k, ap_kir_ref(k, i), 32)));

	ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, s->valid, ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, p->Dv))), &s2, NULL);
	c->out = ap_kir_bind(k, v->cur, s->A, "o", ap_kir_binary(k, AP_KIR_DIV, ap_kir_load(k, s->acc, ap_kir_ref(k, i)),
								  ap__att_divisor(c, ap_kir_ref(k, s->lrun))));
	ap__epilogue_store(v, p->maps, ap__att_idx2(c, p->o, s->rowc, col));
	c->out = NULL;
	ap_v_close(v, s2);
	ap_v_close(v, saved);
	ap__att_store_stats(c, s->row, ap_kir_binary(k, AP_KIR_EQ, s->lane, ap_kir_idx(k, 0)), s->mrun, s->lrun);
}

/* The SIMT form (the file comment): R warps a block, a query row each;
 * per key tile, simt_score, simt_softmax and simt_accumulate, then
 * simt_store.  Errors: AP_EUNSUPPORTED (R warps do not fit a block),
 * AP_ENOMEM. */
int ap__att_emit_simt(actx *c, const ap_target_info *t, int R, ap_error *err)
{
	const att_plan *p = c->p;
	ap_vctx *v = c->v;
	ap_kir_kernel *k = c->k;
	unsigned nt = 32u * (unsigned)R;
	int64_t ntiles;
	att_simt s;
	ap_kir_expr *tid, *qrow0;
	ap_kir_var *kt;
	ap_kir_block *tsaved, *ksaved;

	if (R < 1 || nt > ap_block_cap(t))
		return ap_error_set(err, AP_EUNSUPPORTED, c->v->g->nodes[c->v->m->root].name, NULL,
				    "attention emitter: %d rows per block", R);
	memset(&s, 0, sizeof(s));
	s.c = c;
	s.A = p->acc;
	s.nc = (int)((p->Dv + 31) / 32);
	s.ks = ap_kir_shared(k, "ks", s.A, KEYS * (p->D + 1));
	s.vs = ap_kir_shared(k, "vs", s.A, KEYS * p->Dv);
	s.qs = ap_kir_shared(k, "qs", s.A, (int64_t)R * p->D);
	s.ps = ap_kir_shared(k, "ps", s.A, (int64_t)R * KEYS);
	s.acc = ap_kir_local(k, "acc", s.A, s.nc);
	if (ap_kir_failed(k))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention");
	ntiles = (p->Nk + KEYS - 1) / KEYS;
	k->block[0] = nt;
	tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	s.warp = ap_kir_bind(k, v->cur, k->index_type, "w", ap_kir_binary(k, AP_KIR_SHR, tid, ap_kir_idx(k, 5)));
	s.lane = ap_kir_bind(k, v->cur, k->index_type, "ln", ap_kir_binary(k, AP_KIR_AND, tid, ap_kir_idx(k, 31)));
	s.ninf = ap_kir_float(k, s.A, -INFINITY);
	qrow0 = ap__att_open_tiles(c, R, 0, &tsaved);
	/* this warp's row; past the last row, the last row again (never stored),
	 * so that every warp takes part in the barriers and shuffles */
	s.row = ap_kir_bind(k, v->cur, k->index_type, "row", ap_kir_add(k, qrow0, s.warp));
	s.valid = ap_kir_bind(k, v->cur, AP_DT_BOOL, "ok", ap_kir_binary(k, AP_KIR_LT, s.row, ap_kir_idx(k, p->Nq)));
	s.rowc = ap_kir_bind(k, v->cur, k->index_type, "rc", ap_kir_binary(k, AP_KIR_MIN, s.row, ap_kir_idx(k, p->Nq - 1)));
	simt_load_query(&s);
	s.mrun = ap_kir_var_new(k, s.A, "m");
	s.lrun = ap_kir_var_new(k, s.A, "l");
	ap_kir_let(k, v->cur, s.mrun, s.ninf);
	ap_kir_let(k, v->cur, s.lrun, ap_kir_float(k, s.A, 0));
	{
		ap_kir_var *i = ap_kir_var_new(k, k->index_type, "z");
		ap_kir_stmt *lz = ap_kir_for_unroll(k, v->cur, i, ap_kir_idx(k, 0), ap_kir_idx(k, s.nc), 1, -1);

		if (lz)
			ap_kir_store(k, &lz->body, s.acc, ap_kir_ref(k, i), ap_kir_float(k, s.A, 0));
	}
	/* under a causal mask, to the block's last row's diagonal */
	kt = ap_v_loop(v, "kt", ap_kir_idx(k, 0), ap__att_key_tiles(c, qrow0, R, KEYS, ntiles, "nkt"), 1, &ksaved);
	{
		ap_kir_expr *key0 = ap_kir_bind(k, v->cur, k->index_type, "k0", ap_kir_muli(k, ap_kir_ref(k, kt), KEYS));
		ap_kir_expr *sval = simt_score(&s, key0);

		simt_accumulate(&s, simt_softmax(&s, sval));
	}
	ap_v_close(v, ksaved);
	simt_store(&s);
	ap_v_close(v, tsaved);
	return 0;
}

