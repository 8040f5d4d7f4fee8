/* gemm_stage.c -- the GEMM kernel's operand indexing and staging (the
 * emitter is described in gemm.c's file comment, the shared types in
 * gemm_internal.h): where each operand element lives (a plain buffer
 * through views, a convolution's im2col gather), the shared-memory tile
 * addresses, the cp.async copies (hoisted out of the K loop where they
 * are plain), pair and compute staging, and the register-staged loads of
 * prologue operands.
 */
#include "gemm_internal.h"

#include <stdlib.h>
#include <string.h>

ap_kir_expr *ap__gemm_row_split(gctx *c, ap_kir_expr *row, ap_kir_expr **bc)
{
	ap_kir_kernel *k = c->k;
	const gemm_plan *p = c->p;
	ap_kir_expr *rest;

	if (!p->fold) {
		for (int d = 0; d < p->nb; d++)
			bc[d] = c->bcoord[d];
		return row;
	}
	rest = ap_kir_binary(k, AP_KIR_DIV, row, I(c, p->M));
	for (int d = p->nb - 1; d >= 0; d--) {
		bc[d] = p->bdims[d] == 1 ? I(c, 0) : ap_kir_binary(k, AP_KIR_REM, rest, I(c, p->bdims[d]));
		if (d > 0)
			rest = ap_kir_binary(k, AP_KIR_DIV, rest, I(c, p->bdims[d]));
	}
	return p->M == 1 ? I(c, 0) : ap_kir_binary(k, AP_KIR_REM, row, I(c, p->M));
}

/* Index into operand `role`'s tensor for batch coordinates c->bcoord,
 * outer coordinate `o` (row of A, column of B) and k. */
static ap_lidx operand_index(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	const ap_tensor *t = &c->g->tensors[op->t];
	ap_lidx ix = ap_lidx_shape(t);
	int r = t->rank, nb = c->p->nb;
	ap_kir_expr *bc[AP_MAX_RANK];

	if (role == 0)
		o = ap__gemm_row_split(c, o, bc);
	else
		for (int d = 0; d < nb; d++)
			bc[d] = c->bcoord[d];
	for (int j = 0; j < r - 2; j++) {
		int d = j + nb - (r - 2);

		ix.c[j] = d < 0 || t->dims[j] == 1 ? I(c, 0) : bc[d];
	}
	ix.c[r - 2] = role ? kk : o;
	ix.c[r - 1] = role ? o : kk;
	return ix;
}

ap_kir_expr *ap__gemm_factor_coord(gctx *c, ap_kir_expr *x, const bdim *f, int q)
{
	int64_t inner = 1;

	for (int r = q + 1; r < f->n; r++)
		inner *= f->e[r];
	if (inner > 1)
		x = ap_kir_binary(c->k, AP_KIR_DIV, x, I(c, inner));
	if (q > 0)
		x = ap_kir_binary(c->k, AP_KIR_REM, x, I(c, f->e[q]));
	return x;
}

/* sum_q ap__gemm_factor_coord(x, q) * s_q over the factors of f (inner
 * to outer). */
static ap_kir_expr *factor_offset(gctx *c, ap_kir_expr *x, const bdim *f)
{
	ap_kir_expr *e = I(c, 0);

	for (int q = f->n - 1; q >= 0; q--)
		e = ap_kir_add(c->k, e, ap_kir_muli(c->k, ap__gemm_factor_coord(c, x, f, q), f->s[q]));
	return e;
}

/* The element of a plain operand's buffer at outer coordinate o and k. */
static ap_kir_expr *plain_offset(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	ap_kir_expr *bc[AP_MAX_RANK], *e;

	if (c->p->conv) {
		const gemm_plan *p = c->p;

		if (role == 1 && p->convt) {   /* W[g * Cg + k / kk][o][k % kk] */
			ap_kir_expr *ch = ap_kir_binary(k, AP_KIR_DIV, kk, I(c, p->kk));

			return ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Cg), ch), p->Mg), o), p->kk),
					  ap_kir_binary(k, AP_KIR_REM, kk, I(c, p->kk)));
		}
		if (role == 1)   /* W[g * Mg + o][k] */
			return ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Mg), o), p->K), kk);
		/* X[n][g * Cg + k][position]: n = o / ohw, position = o % ohw */
		return ap_kir_add(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, o, I(c, p->ohw)), p->C * p->ohw),
						ap_kir_binary(k, AP_KIR_REM, o, I(c, p->ohw))),
				  ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Cg), kk), p->ohw));
	}
	if (role == 0 && c->p->a_linear)
		return ap_kir_addi(k, ap_kir_add(k, ap_kir_muli(k, o, op->s_outer), ap_kir_muli(k, kk, op->s_k)),
				   op->s_base);
	if (role == 0)
		o = ap__gemm_row_split(c, o, bc);
	else
		for (int d = 0; d < c->p->nb; d++)
			bc[d] = c->bcoord[d];
	if (op->composite)
		e = ap_kir_addi(k, ap_kir_add(k, factor_offset(c, o, &op->fo), factor_offset(c, kk, &op->fk)),
				op->s_base);
	else
		e = ap_kir_addi(k, ap_kir_add(k, ap_kir_muli(k, o, op->s_outer), ap_kir_muli(k, kk, op->s_k)),
				op->s_base);
	for (int d = 0; d < c->p->nb; d++)
		e = ap_kir_add(k, e, factor_offset(c, bc[d], &op->batch[d]));
	return e;
}

/* Splits a linear index over dims[0..n) (row-major) into coordinates. */
void ap__gemm_split_linear(gctx *c, ap_kir_expr *lin, const int64_t *dims, int n,
			   ap_kir_expr **out)
{
	ap_kir_kernel *k = c->k;

	for (int d = n - 1; d >= 0; d--) {
		out[d] = d == 0 ? lin : ap_kir_binary(k, AP_KIR_REM, lin, I(c, dims[d]));
		if (d > 0)
			lin = ap_kir_binary(k, AP_KIR_DIV, lin, I(c, dims[d]));
	}
}

/* The part of a convolution's im2col row o that no k changes: the image
 * n and, per spatial dim, where the kernel's first tap meets the input
 * (o_d * stride - pad for Conv, o_d + pad for ConvTranspose).  With
 * `bind` each is an index variable of v->cur, computed once where a loop
 * keeps the row (ap__gemm_issue_async). */
typedef struct conv_row {
	ap_kir_expr *n, *base[3];
} conv_row;

static void conv_row_of(gctx *c, ap_kir_expr *o, bool bind, conv_row *r)
{
	const gemm_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_kir_expr *op[3];

	r->n = ap_kir_binary(k, AP_KIR_DIV, o, I(c, p->ohw));
	ap__gemm_split_linear(c, ap_kir_binary(k, AP_KIR_REM, o, I(c, p->ohw)), p->O, p->ns, op);
	if (bind)
		r->n = ap_kir_bind(k, c->v->cur, k->index_type, "img", r->n);
	for (int d = 0; d < p->ns; d++) {
		r->base[d] = p->convt ? ap_kir_addi(k, op[d], p->pd[d])
				      : ap_kir_addi(k, ap_kir_muli(k, op[d], p->st[d]), -p->pd[d]);
		if (bind)
			r->base[d] = ap_kir_bind(k, c->v->cur, k->index_type, "ib", r->base[d]);
	}
}

/* The implicit-GEMM element of a convolution's operand, emitting its
 * statements into v->cur: A (row = (n, output position), k = (input
 * channel in the group, kernel position)) is X at the input position the
 * kernel position meets -- Conv: o * stride - pad + kpos * dilation;
 * ConvTranspose: (o + pad - kpos * dilation) / stride where that divides
 * -- or 0 outside X (ONNX Conv / ConvTranspose); B (column m of group g,
 * k) is W[g * Mg + m][c][kpos] (Conv) or W[g * Cg + c][m][kpos]
 * (ConvTranspose).  For A, `row` may hold o's part already (conv_row_of;
 * NULL: computed here). */
static void conv_index(gctx *c, int role, ap_kir_expr *o, const conv_row *row, ap_kir_expr *kk, ap_lidx *ixp,
		       ap_kir_expr **validp)
{
	const gemm_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const ap_tensor *xt = &c->g->tensors[p->x], *wt = &c->g->tensors[p->w];
	ap_kir_expr *kp[3], *ch, *valid = NULL;
	conv_row own;
	ap_lidx ix;

	ch = ap_kir_binary(k, AP_KIR_DIV, kk, I(c, p->kk));
	ap__gemm_split_linear(c, ap_kir_binary(k, AP_KIR_REM, kk, I(c, p->kk)), p->KS, p->ns, kp);
	if (role == 1) {
		ix = ap_lidx_shape(wt);
		ix.c[0] = p->convt ? ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Cg), ch)
				   : ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Mg), o);
		ix.c[1] = p->convt ? o : ch;
		for (int d = 0; d < p->ns; d++)
			ix.c[2 + d] = kp[d];
		*ixp = ix;
		*validp = NULL;
		return;
	}
	if (!row) {
		conv_row_of(c, o, false, &own);
		row = &own;
	}
	ix = ap_lidx_shape(xt);
	ix.c[0] = row->n;
	ix.c[1] = ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Cg), ch);
	for (int d = 0; d < p->ns; d++) {
		ap_kir_expr *pos, *ok;

		if (!p->convt) {
			pos = ap_kir_bind(k, v->cur, k->index_type, "ip",
					  ap_kir_add(k, row->base[d], ap_kir_muli(k, kp[d], p->dl[d])));
			ix.c[2 + d] = pos;
			ok = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_GE, pos, I(c, 0)),
					   ap_kir_binary(k, AP_KIR_LT, pos, I(c, p->D[d])));
			if (p->pd[d] == 0 && (p->O[d] - 1) * p->st[d] + (p->KS[d] - 1) * p->dl[d] < p->D[d])
				ok = NULL;   /* always inside */
		} else {
			pos = ap_kir_bind(k, v->cur, k->index_type, "ip",
					  ap_kir_add(k, row->base[d], ap_kir_muli(k, kp[d], -p->dl[d])));
			ix.c[2 + d] = p->st[d] == 1 ? pos : ap_kir_binary(k, AP_KIR_DIV, pos, I(c, p->st[d]));
			ok = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_GE, pos, I(c, 0)),
					   ap_kir_binary(k, AP_KIR_LT, pos, I(c, p->D[d] * p->st[d])));
			if (p->st[d] != 1)
				ok = ap_kir_binary(k, AP_KIR_LAND, ok,
						   ap_kir_binary(k, AP_KIR_EQ,
								 ap_kir_binary(k, AP_KIR_REM, pos, I(c, p->st[d])),
								 I(c, 0)));
		}
		if (ok)
			valid = valid ? ap_kir_binary(k, AP_KIR_LAND, valid, ok) : ok;
	}
	*ixp = ix;
	*validp = valid;
}

/* The element of a convolution operand at (o, kk): W[..] for role 1, the
 * im2col element of X (0 in the padding) for role 0, through the value
 * builder. */
static ap_kir_expr *conv_element(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int t = role ? c->p->w : c->p->x;
	ap_kir_expr *valid;
	ap_kir_var *r;
	ap_kir_block *saved;
	ap_lidx ix;

	conv_index(c, role, o, NULL, kk, &ix, &valid);
	if (!valid)
		return ap_val(v, t, &ix);
	r = ap_kir_var_new(k, c->p->in_t, "x");
	ap_kir_let(k, v->cur, r, ap_v_const(v, c->p->in_t, 0));
	ap_v_if(v, valid, &saved, NULL);
	ap_kir_assign(k, v->cur, r, ap_val(v, t, &ix));
	ap_v_close(v, saved);
	return ap_kir_ref(k, r);
}


/* Shared-memory index of (outer, k) in stage `st` of operand `role`'s
 * tile (a pair- or compute-staged operand has one tile: st is ignored). */
/* wgmma's tiles (sm_90a): element (o, kk) of operand `role` in the
 * canonical layout of its major-ness (kir.h, ap_kir_wg_layout), as
 * (row, column) of ap__wg_place: K-major (a tile with K contiguous) rows
 * o, columns kk; MN-major rows kk, columns o.  Unswizzled, core matrices
 * of 8 rows of 16 bytes back to back; swizzled by
 * r->sw[role] bytes, atoms of 8 rows of that many bytes, 16-byte chunks
 * permuted per row (ap__wg_swizzled_place).  A copy of up to 8 elements
 * along the columns, from a multiple of its width, stays in one 16-byte
 * chunk either way. */
static ap_kir_expr *wg_place(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk)
{
	bool rowk = role ? c->b_rowk : c->a_rowk;
	int sw = c->r->sw[role], rows = role ? c->c.bn : c->c.bm;
	ap_kir_expr *r = rowk ? o : kk, *j = rowk ? kk : o;

	if (sw)
		return ap__wg_swizzled_place(c->k, r, j, rowk ? rows : c->c.bk,
					     sw / (int)ap_dtype_size(c->p->in_t), (int)ap_dtype_size(c->p->in_t));
	return ap__wg_place(c->k, r, j, rowk ? c->c.bk : rows, (int)ap_dtype_size(c->p->in_t));
}

/* The place of tile element (o, kk) in one stage of operand `role`'s
 * shared tile (linear in both: a sum of places is a place's offset). */
ap_kir_expr *ap__gemm_smem_lin(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk)
{
	ap_kir_kernel *k = c->k;
	int ld = role ? c->ldb : c->lda;

	if (c->p->wg)
		return wg_place(c, role, o, kk);
	return (role ? c->b_rowk : c->a_rowk) ? ap_kir_add(k, ap_kir_muli(k, o, ld), kk)
					      : ap_kir_add(k, ap_kir_muli(k, kk, ld), o);
}

ap_kir_expr *ap__gemm_smem_index(gctx *c, int role, ap_kir_expr *st, ap_kir_expr *o,
				  ap_kir_expr *kk)
{
	ap_kir_kernel *k = c->k;
	int64_t stage = role ? c->b_stage : c->a_stage;
	ap_kir_expr *e = ap__gemm_smem_lin(c, role, o, kk);

	if ((role ? c->b_mode : c->a_mode) != STAGE_TILE)
		return e;
	return ap_kir_add(k, ap_kir_mul(k, st, I(c, stage)), e);
}

/* Tile extents of operand `role`: outer rows and the problem's extent. */
static void extents(gctx *c, int role, int *rows, int64_t *total)
{
	*rows = role ? c->c.bn : c->c.bm;
	*total = role ? c->p->N : c->p->Mr;
}

/* Opens the loop over operand `role`'s copies of one K tile, dealt to the
 * threads (copy i of `copies`, each `w` elements along the contiguous
 * coordinate), and gives the copy's index and tile coordinates (*o,
 * *kk); the caller closes the loop with ap_v_close(v, *saved).  When
 * every thread makes the same number of copies (at most COPY_UNROLL) the
 * loop has that constant trip count and is unrolled, copy i = tid + j *
 * threads: its coordinates are shifts and masks of tid the compiler
 * computes once, outside the K loop (issue 25: no division in the main
 * loop); otherwise a thread-strided loop. */
#define COPY_UNROLL 8
/* ... and for copies of one 4- or 8-byte element (an operand whose
 * contiguous coordinate is not its tile's: TF32's k x n weight into a
 * K-major wgmma tile), twice as many: the thread-strided loop's division
 * and remainder per element cost the 4096^3 TF32 product on sm_90a 284
 * instructions a K tile, unrolled 227 (bench/gemm_sass.py) */
#define COPY_UNROLL_ELEMENTS 16

/* Whether operand `role`'s copies of w elements, f = fast extent / w of
 * them along a line of the tile, are dealt 8 lines at a time: copy i at
 * line 8 (i / 8f) + i % 8, chunk (i / 8) % f.  For a padded tile (rows
 * 16 bytes longer than their data, ap__gemm_pad_of, for ldmatrix) whose
 * line is shorter than 128 bytes (f < 8), the plain order puts the 8
 * lanes of a quarter-warp -- served together for 16-byte accesses -- on
 * 8 / f lines that share banks (2-way for f = 4: lines 80 bytes apart);
 * 8 lines of one chunk lie (f + 1) 16 bytes apart, 8 distinct bank groups
 * for even f.  A warp still reads whole lines' 32-byte sectors.  Tile-
 * staged cp.async operands of the mma.sync and SIMT paths only (wgmma's
 * tiles are swizzled; pair and compute staging keep copy order, which
 * ap__gemm_extract_tile reads back). */
static bool copy_interleaved(gctx *c, int role, int64_t f, int64_t slow_ext)
{
	return !c->p->wg && (role ? c->b_async : c->a_async) && (role ? c->b_mode : c->a_mode) == STAGE_TILE &&
	       f < 8 && f % 2 == 0 && slow_ext % 8 == 0;
}

/* Copy i's chunk along the line (fast, in elements) and line (slow), in
 * the order copy_interleaved says, of f chunks of w elements a line. */
static void copy_coords(gctx *c, bool inter, ap_kir_expr *i, int64_t f, int w, ap_kir_expr **fast,
			ap_kir_expr **slow)
{
	ap_kir_kernel *k = c->k;

	if (inter) {
		*fast = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, ap_kir_binary(k, AP_KIR_DIV, i, I(c, 8)), I(c, f)), w);
		*slow = ap_kir_add(k, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, i, I(c, 8 * f)), 8),
				   ap_kir_binary(k, AP_KIR_REM, i, I(c, 8)));
		return;
	}
	*fast = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, i, I(c, f)), w);
	*slow = ap_kir_binary(k, AP_KIR_DIV, i, I(c, f));
}

static ap_kir_expr *copy_loop(gctx *c, int role, int w, ap_kir_expr **o, ap_kir_expr **kk, int64_t *copies,
			      ap_kir_var **jv, ap_kir_block **saved)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	int rows = role ? c->c.bn : c->c.bm;
	int64_t fast_ext = op->k_fast ? c->c.bk : rows, slow_ext = op->k_fast ? rows : c->c.bk;
	ap_kir_expr *i, *fast, *slow;

	*jv = NULL;
	*copies = fast_ext / w * slow_ext;
	if (*copies % c->nt == 0 &&
	    *copies / c->nt <= (w == 1 && ap_dtype_size(c->p->in_t) >= 4 ? COPY_UNROLL_ELEMENTS : COPY_UNROLL)) {
		ap_kir_var *j = ap_v_loop_unrolled(c->v, "c", *copies / c->nt, saved);

		*jv = j;
		i = ap_kir_bind(k, c->v->cur, k->index_type, "ci", ap_kir_add(k, c->tid, ap_kir_muli(k, ap_kir_ref(k, j), c->nt)));
	} else {
		i = ap_kir_ref(k, ap_v_loop(c->v, "c", c->tid, I(c, *copies), c->nt, saved));
	}
	copy_coords(c, w > 0 && copy_interleaved(c, role, fast_ext / w, slow_ext), i, fast_ext / w, w, &fast, &slow);
	*o = op->k_fast ? slow : fast;
	*kk = op->k_fast ? fast : slow;
	return i;
}

/* cp.async of operand `role`'s K tile `kt` into stage `st`: each copy
 * moves `vec` elements along the contiguous coordinate (a pair-staged
 * operand: the pair holding its element, into stage st of the pairs,
 * the element's place in the pair into its parity byte; compute-staged:
 * the source's elements into stage st of the staging buffer, in copy
 * order). */
void ap__gemm_issue_async(gctx *c, int role, ap_kir_expr *st, ap_kir_expr *kt)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int rows, w = role ? c->b_w : c->a_w;
	int64_t total, copies;
	ap_kir_block *saved;
	ap_kir_expr *o, *kk, *og, *kg, *src, *copy, *pred = NULL;
	ap_kir_var *j = NULL;
	conv_row row, *rowp = NULL;

	extents(c, role, &rows, &total);
	if (op->gather && role == 0 && c->p->conv && !op->k_fast && w == 1 && c->nt % (unsigned)rows == 0) {
		/* im2col rows along the threads, as many threads as rows or a
		 * multiple: each thread keeps one row for the whole tile, so the
		 * row's image and positions are computed once, not per element
		 * (copy i = kk * rows + o, copy_loop's numbering) */
		o = ap_kir_bind(k, v->cur, k->index_type, "o", ap_kir_binary(k, AP_KIR_REM, c->tid, I(c, rows)));
		og = ap_kir_add(k, c->m0, o);
		conv_row_of(c, og, true, &row);
		rowp = &row;
		copies = (int64_t)rows * c->c.bk;
		kk = ap_kir_ref(k, ap_v_loop(v, "c", ap_kir_binary(k, AP_KIR_DIV, c->tid, I(c, rows)),
					     I(c, c->c.bk), (int64_t)(c->nt / (unsigned)rows), &saved));
		copy = ap_kir_add(k, ap_kir_muli(k, kk, rows), o);
	} else {
		copy = copy_loop(c, role, w, &o, &kk, &copies, &j, &saved);
		og = ap_kir_add(k, role ? c->n0 : c->m0, o);
	}
	kg = ap_kir_add(k, ap_kir_muli(k, kt, c->c.bk), kk);
	if (total % rows)
		pred = ap_kir_binary(k, AP_KIR_LT, og, I(c, total));
	if (c->kpred) {
		ap_kir_expr *pk = ap_kir_binary(k, AP_KIR_LT, kg, I(c, c->p->K));

		pred = pred ? ap_kir_binary(k, AP_KIR_LAND, pred, pk) : pk;
	}
	if (op->gather) {
		ap_kir_expr *valid;
		ap_lidx ix;

		/* a padding element is a copy of size 0: zero-filled */
		conv_index(c, role, og, rowp, kg, &ix, &valid);
		if (valid)
			pred = pred ? ap_kir_binary(k, AP_KIR_LAND, pred, valid) : valid;
		src = ap_sview_offset(c->k, &op->gv, &ix);
	} else {
		src = plain_offset(c, role, og, kg);
	}
	if ((role ? c->b_mode : c->a_mode) == STAGE_PAIRS) {
		ap_kir_expr *e = ap_kir_bind(k, v->cur, k->index_type, "e", src);
		ap_kir_expr *slot = ap_kir_add(k, ap_kir_muli(k, st, copies), copy);
		ap_kir_array *pairs = role ? c->pb : c->pa, *buf = ap_v_buffer(v, op->leaf);
		int64_t n = ap_tensor_numel(&c->g->tensors[op->leaf]);
		ap_kir_block *at = v->cur;

		if (n % 2) {
			/* an odd count of elements: the pair of the last one (an
			 * even index, parity 0) would end 2 bytes past the buffer,
			 * so that element is loaded and stored by itself -- no copy,
			 * which would zero-fill the slot behind the store's back */
			ap_kir_expr *last = ap_kir_binary(k, AP_KIR_GE, ap_kir_binary(k, AP_KIR_OR, e, I(c, 1)),
							 I(c, n));
			ap_kir_stmt *s = ap_kir_if(k, v->cur, pred ? ap_kir_binary(k, AP_KIR_LAND, pred, last)
								 : last);

			ap_kir_store(k, &s->body, pairs, ap_kir_muli(k, slot, 2), ap_kir_load(k, buf, e));
			at = &s->orelse;
		}
		ap_kir_cp_async(k, at, pairs, ap_kir_muli(k, slot, 2), buf,
				ap_kir_binary(k, AP_KIR_AND, e, I(c, -2)), 2, pred);
		ap_kir_store(k, v->cur, role ? c->qb : c->qa, slot,
			     ap_kir_cast(k, AP_DT_U8, ap_kir_binary(k, AP_KIR_AND, e, I(c, 1))));
	} else if ((role ? c->b_mode : c->a_mode) == STAGE_COMPUTE) {
		/* copy i's w elements at i * w of the stage: the tile's elements
		 * in the operand's order, as ap__gemm_extract_tile reads them back */
		ap_kir_expr *slot = ap_kir_add(k, ap_kir_muli(k, st, copies), copy);

		ap_kir_cp_async(k, v->cur, role ? c->pb : c->pa, ap_kir_muli(k, slot, w), ap_v_buffer(v, op->leaf),
				src, w, pred);
	} else if (c->cp_src[role] && j) {
		/* hoisted (ap__gemm_hoist_copies): copy 0's places plus this copy's
		 * and this K tile's increments */
		ap_kir_expr *dj = ap_kir_ref(k, j);

		src = ap_kir_add(k, c->cp_src[role],
				 ap_kir_add(k, ap_kir_muli(k, dj, c->cp_dsrc[role]),
					    ap_kir_muli(k, kt, (int64_t)c->c.bk * op->s_k)));
		ap_kir_cp_async(k, v->cur, role ? c->sb : c->sa,
				ap_kir_add(k, ap_kir_mul(k, st, I(c, role ? c->b_stage : c->a_stage)),
					   ap_kir_add(k, c->cp_dst[role], ap_kir_muli(k, dj, c->cp_ddst[role]))),
				ap_v_buffer(v, op->leaf), src, w, pred);
	} else {
		ap_kir_cp_async(k, v->cur, role ? c->sb : c->sa, ap__gemm_smem_index(c, role, st, o, kk),
				ap_v_buffer(v, op->leaf), src, w, pred);
	}
	ap_v_close(v, saved);
}

/* The copies' addresses of plain operands computed once a tile, before
 * its K loop (issue 25: copy addresses advanced by increments, not
 * recomputed in the main loop): an operand copied by cp.async straight
 * into its tile, not gathered, whose element offset is linear in its
 * outer coordinate and k (plain_offset: no folded batch, no composite
 * dimension), with copy_loop's unrolled numbering and whole rows of
 * copies per thread stride (threads a multiple of the copies a row):
 * copy j of a thread is copy 0 moved j * threads / row_copies rows, so
 * its source and tile places are copy 0's plus j times a constant, and
 * K tile kt's source is K tile 0's plus kt * bk * s_k.  ap__gemm_issue_async uses
 * them where set. */
void ap__gemm_hoist_copies(gctx *c)
{
	ap_kir_kernel *k = c->k;

	for (int role = 0; role < 2; role++) {
		const gemm_opnd *op = role ? &c->p->b : &c->p->a;
		int w = role ? c->b_w : c->a_w, rows = role ? c->c.bn : c->c.bm;
		int64_t fast_ext = op->k_fast ? c->c.bk : rows, slow_ext = op->k_fast ? rows : c->c.bk;
		int64_t f, copies, step, d_o, d_k;
		ap_kir_expr *fast, *slow, *o, *kk;
		bool inter;

		c->cp_src[role] = c->cp_dst[role] = NULL;
		/* w is set for cp.async operands only */
		if (!(role ? c->b_async : c->a_async) || w <= 0 || (role ? c->b_mode : c->a_mode) != STAGE_TILE ||
		    op->gather || c->p->conv || op->composite || (role == 0 && c->p->fold && !c->p->a_linear))
			continue;
		f = fast_ext / w;
		copies = f * slow_ext;
		inter = f > 0 && copy_interleaved(c, role, f, slow_ext);
		/* interleaved: copy j is copy 0 moved whole groups of 8 lines
		 * when the threads are whole groups (8 f copies) */
		if (f <= 0 || copies % c->nt || copies / c->nt > COPY_UNROLL || c->nt % (inter ? 8 * f : f))
			continue;
		step = c->nt / f;
		copy_coords(c, inter, c->tid, f, w, &fast, &slow);
		o = op->k_fast ? slow : fast;
		kk = op->k_fast ? fast : slow;
		d_o = op->k_fast ? step : 0;
		d_k = op->k_fast ? 0 : step;
		if (c->p->wg) {
			/* wgmma's tiles: a move by whole core matrices, or swizzled by
			 * whole atoms, is linear; a move of part of one is not */
			int64_t dr = (role ? c->b_rowk : c->a_rowk) ? d_o : d_k, dj = (role ? c->b_rowk : c->a_rowk) ? d_k : d_o;
			int64_t ja = c->r->sw[role] ? c->r->sw[role] / (int64_t)ap_dtype_size(c->p->in_t) : 8;

			if (dr % 8 || dj % ja)
				continue;
		}
		c->cp_src[role] = ap_kir_bind(k, c->v->cur, k->index_type, "cs",
					      plain_offset(c, role, ap_kir_add(k, role ? c->n0 : c->m0, o), kk));
		c->cp_dst[role] = ap_kir_bind(k, c->v->cur, k->index_type, "cd", ap__gemm_smem_lin(c, role, o, kk));
		c->cp_dsrc[role] = d_o * op->s_outer + d_k * op->s_k;
		c->cp_ddst[role] = (role ? c->b_rowk : c->a_rowk) ? d_o * (role ? c->ldb : c->lda) + d_k
								  : d_k * (role ? c->ldb : c->lda) + d_o;
		if (c->p->wg)   /* whole core matrices or atoms on (checked above): linear */
			ap_kir_is_int(wg_place(c, role, I(c, d_o), I(c, d_k)), &c->cp_ddst[role]);
	}
}

/* The value builder's leaf hook while a compute-staged tile element is
 * built: the source buffer's element is the staged one. */
static ap_kir_expr *staged_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	gctx *c = user;

	return t == c->hook_leaf ? c->hook_val : NULL;
}

/* x, an element of buffer `leaf`, through the Casts on the way to tensor
 * t (the views between them change no value; ap_sview_of_unary's chain,
 * every op a Cast, its input 0 the chain), as the value builder casts. */
static ap_kir_expr *apply_casts(gctx *c, int t, int leaf, ap_kir_expr *x)
{
	ap_dtype to[32];
	int n = 0;

	for (int u = t; u != leaf && c->g->tensors[u].producer >= 0;) {
		const ap_node *p = &c->g->nodes[c->g->tensors[u].producer];

		if (p->op == AP_OP_CAST && n < 32)
			to[n++] = c->g->tensors[u].dtype;
		u = p->inputs[0];
	}
	while (n > 0)
		x = ap_kir_cast(c->k, to[--n], x);
	return x;
}

/* Tile element (o, kk) of compute-staged operand `role` in K tile `ktile`
 * from its staged source element `src`: the operand's value (the value
 * builder, with src as the source buffer's element), 0 past K -- the
 * zero-filled copies give 0 there only when the ops are casts, so the
 * others are guarded (rows and columns past the problem are computed but
 * never stored). */
static ap_kir_expr *staged_value(gctx *c, int role, ap_kir_expr *ktile, ap_kir_expr *o, ap_kir_expr *kk,
				 ap_kir_expr *src)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_leaf_fn leaf = v->leaf;
	void *user = v->leaf_user;
	ap_kir_expr *og, *kg, *pred = NULL, *val;
	ap_kir_block *saved = NULL;
	ap_kir_var *r = NULL;
	ap_lidx ix;

	if (op->casts_only)
		return apply_casts(c, op->t, op->leaf, src);
	src = ap_kir_bind(k, v->cur, c->g->tensors[op->leaf].dtype, "s", src);
	og = ap_kir_add(k, role ? c->n0 : c->m0, o);
	kg = ap_kir_add(k, ap_kir_muli(k, ktile, c->c.bk), kk);
	if (c->kpred)
		pred = ap_kir_binary(k, AP_KIR_LT, kg, I(c, c->p->K));
	if (pred) {
		r = ap_kir_var_new(k, c->p->in_t, "x");
		ap_kir_let(k, v->cur, r, ap_v_const(v, c->p->in_t, 0));
		ap_v_if(v, pred, &saved, NULL);
	}
	c->hook_leaf = op->leaf;
	c->hook_val = src;
	v->leaf = staged_leaf;
	v->leaf_user = c;
	ix = operand_index(c, role, og, kg);   /* not a gather: those are casts only */
	val = ap_val(v, op->t, &ix);
	v->leaf = leaf;
	v->leaf_user = user;
	if (!pred)
		return val;
	ap_kir_assign(k, v->cur, r, val);
	ap_v_close(v, saved);
	return ap_kir_ref(k, r);
}

/* A pair- or compute-staged operand's stage `st` (K tile `ktile`) into its
 * tile (after the stage's copies are complete and a barrier; a barrier
 * before the tile is read): each element from its pair, at the place its
 * parity byte gives, or computed from its staged source element. */
static void extract_staged(gctx *c, int role, ap_kir_expr *st, ap_kir_expr *ktile)
{
	ap_kir_kernel *k = c->k;
	ap_kir_block *saved;
	ap_kir_array *stg = role ? c->pb : c->pa;
	ap_kir_expr *i, *o, *kk, *slot, *val;
	ap_kir_var *j;
	int64_t copies;

	i = copy_loop(c, role, 1, &o, &kk, &copies, &j, &saved);
	slot = ap_kir_bind(k, c->v->cur, k->index_type, "q", ap_kir_add(k, ap_kir_muli(k, st, copies), i));
	if ((role ? c->b_mode : c->a_mode) == STAGE_PAIRS) {
		val = ap_kir_load(k, stg, ap_kir_add(k, ap_kir_muli(k, slot, 2),
						     ap_kir_cast(k, k->index_type,
								 ap_kir_load(k, role ? c->qb : c->qa, slot))));
	} else {
		val = staged_value(c, role, ktile, o, kk, ap_kir_load(k, stg, slot));
		if (c->p->tc && c->p->mma == AP_KIR_MMA_TF32_1688)
			val = ap_kir_call(k, AP_KIR_TF32, val, NULL);
	}
	ap_kir_store(k, c->v->cur, role ? c->sb : c->sa, ap__gemm_smem_index(c, role, st, o, kk), val);
	ap_v_close(c->v, saved);
}

/* Every pair- or compute-staged operand's stage st (K tile ktile) into its
 * tile, and the barrier before the tiles are read. */
void ap__gemm_extract_tile(gctx *c, ap_kir_expr *st, ap_kir_expr *ktile)
{
	if (c->a_mode == STAGE_TILE && c->b_mode == STAGE_TILE)
		return;
	for (int role = 0; role < 2; role++)
		if ((role ? c->b_mode : c->a_mode) != STAGE_TILE)
			extract_staged(c, role, st, ktile);
	if (c->p->wg)   /* the tiles' stores, for wgmma's async-proxy reads */
		ap_kir_fence_proxy_async(c->k, c->v->cur);
	ap_kir_barrier(c->k, c->v->cur);
}

/* Elements per thread of a register-staged tile load. */
int ap__gemm_reg_count(gctx *c, int role)
{
	int rows = role ? c->c.bn : c->c.bm;

	return (int)((rows * c->c.bk + c->nt - 1) / c->nt);
}

/* The (outer, k) of register slot r of this thread, along the operand's
 * fast coordinate, and whether the slot is inside the tile. */
static void reg_slot(gctx *c, int role, int r, ap_kir_expr **o, ap_kir_expr **kk, ap_kir_expr **in_tile)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	int rows = role ? c->c.bn : c->c.bm;
	int64_t fast_ext = op->k_fast ? c->c.bk : rows, total = (int64_t)rows * c->c.bk;
	ap_kir_expr *e = ap_kir_addi(k, c->tid, (int64_t)r * c->nt);
	ap_kir_expr *fast = ap_kir_binary(k, AP_KIR_REM, e, I(c, fast_ext));
	ap_kir_expr *slow = ap_kir_binary(k, AP_KIR_DIV, e, I(c, fast_ext));

	*o = op->k_fast ? slow : fast;
	*kk = op->k_fast ? fast : slow;
	*in_tile = ((int64_t)(r + 1) * c->nt <= total) ? NULL : ap_kir_binary(k, AP_KIR_LT, e, I(c, total));
}

/* The registers of a register-staged tile load (ra for A, rb for B; a_regs
 * and b_regs of them), declared in v->cur: where they live from the
 * issue to the store. */
void ap__gemm_declare_regs(gctx *c)
{
	for (int role = 0; role < 2; role++)
		for (int i = 0; i < (role ? c->b_regs : c->a_regs); i++) {
			ap_kir_var **r = role ? &c->b_reg[i] : &c->a_reg[i];

			*r = ap_kir_var_new(c->k, c->p->in_t, role ? "rb" : "ra");
			ap_kir_let(c->k, c->v->cur, *r, NULL);
		}
}

/* Register-staged load of operand `role`'s K tile `kt`: each register
 * gets the element's value (0 outside the problem), through the value
 * builder. */
static void issue_regs(gctx *c, int role, ap_kir_expr *kt)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int n = role ? c->b_regs : c->a_regs;
	ap_kir_var **regs = role ? c->b_reg : c->a_reg;
	int64_t total = role ? c->p->N : c->p->Mr;
	int rows = role ? c->c.bn : c->c.bm;
	ap_dtype T = c->p->in_t;

	for (int r = 0; r < n; r++) {
		ap_kir_expr *o, *kk, *in_tile, *og, *kg, *pred = NULL;
		ap_kir_block *saved;
		ap_lidx ix;

		reg_slot(c, role, r, &o, &kk, &in_tile);
		og = ap_kir_add(k, role ? c->n0 : c->m0, o);
		kg = ap_kir_add(k, ap_kir_muli(k, kt, c->c.bk), kk);
		if (total % rows)
			pred = ap_kir_binary(k, AP_KIR_LT, og, I(c, total));
		if (c->kpred) {
			ap_kir_expr *pk = ap_kir_binary(k, AP_KIR_LT, kg, I(c, c->p->K));

			pred = pred ? ap_kir_binary(k, AP_KIR_LAND, pred, pk) : pk;
		}
		if (in_tile)
			pred = pred ? ap_kir_binary(k, AP_KIR_LAND, in_tile, pred) : in_tile;
		ap_kir_assign(k, v->cur, regs[r], ap_v_const(v, T, 0));
		if (pred)
			ap_v_if(v, pred, &saved, NULL);
		if ((role ? &c->p->b : &c->p->a)->plain && !(role ? &c->p->b : &c->p->a)->staged) {
			/* a buffer read through views: its element directly */
			int leaf = role ? c->p->b.leaf : c->p->a.leaf;

			ap_kir_assign(k, v->cur, regs[r],
				      ap_kir_load(k, ap_v_buffer(v, leaf), plain_offset(c, role, og, kg)));
		} else if (c->p->conv) {
			ap_kir_assign(k, v->cur, regs[r], conv_element(c, role, og, kg));
		} else {
			ix = operand_index(c, role, og, kg);
			ap_kir_assign(k, v->cur, regs[r], ap_val(v, role ? c->p->b.t : c->p->a.t, &ix));
		}
		if (pred)
			ap_v_close(v, saved);
	}
}

/* Stores the registers of a register-staged load into stage `st`. */
static void complete_regs(gctx *c, int role, ap_kir_expr *st)
{
	ap_kir_kernel *k = c->k;
	int n = role ? c->b_regs : c->a_regs;
	ap_kir_var **regs = role ? c->b_reg : c->a_reg;

	for (int r = 0; r < n; r++) {
		ap_kir_expr *o, *kk, *in_tile, *val = ap_kir_ref(k, regs[r]);
		ap_kir_block *saved;

		reg_slot(c, role, r, &o, &kk, &in_tile);
		if (c->p->tc && c->p->mma == AP_KIR_MMA_TF32_1688)
			val = ap_kir_call(k, AP_KIR_TF32, val, NULL);
		if (in_tile)
			ap_v_if(c->v, in_tile, &saved, NULL);
		ap_kir_store(k, c->v->cur, role ? c->sb : c->sa, ap__gemm_smem_index(c, role, st, o, kk), val);
		if (in_tile)
			ap_v_close(c->v, saved);
	}
}

/* Issues the loads of K tile kt into stage st (cp.async, or registers). */
void ap__gemm_issue_tile(gctx *c, ap_kir_expr *st, ap_kir_expr *kt)
{
	if (c->a_async)
		ap__gemm_issue_async(c, 0, st, kt);
	else
		issue_regs(c, 0, kt);
	if (c->b_async)
		ap__gemm_issue_async(c, 1, st, kt);
	else
		issue_regs(c, 1, kt);
}

void ap__gemm_complete_tile(gctx *c, ap_kir_expr *st)
{
	if (!c->a_async)
		complete_regs(c, 0, st);
	if (!c->b_async)
		complete_regs(c, 1, st);
}
