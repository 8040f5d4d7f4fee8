/* gemm_tma.c -- wgmma's operand tiles filled by TMA (schedule knob tma=1,
 * sm_90a): each operand a 2-D tensor map, each stage of the tiles a set
 * of boxes landing on the stage's mbarrier, persistent blocks (one per SM
 * at most) walking the output tiles and loading the next tile's first
 * stages before the epilogue of this one.  The phase form of
 * docs/hopper-pipeline.md (no warp specialisation): thread 0 issues every
 * fill, every thread waits on the stage it reads.
 *
 * Why a wgmma tile is a set of TMA boxes.  A tile with the swizzle of W
 * bytes (ap__gemm_wg_swizzle; W / es = ja elements) is laid out in atoms
 * of 8 rows of W bytes, 8 W bytes apart (SBO), each row's 16-byte chunks
 * permuted by XOR with (row * W / 128) mod (W / 16) (ap__wg_swizzled_place)
 * -- which is the order in which a TMA box of ja x R elements with the
 * same swizzle lands (PTX ISA, "Tensor Memory Accelerator: swizzling
 * modes"; common/tmap.c, ap_tmap_load; check_kir tmap_load_swizzled pins
 * the two to the ISA's atom figures).  So:
 *   - K-major (K contiguous in memory and in the tile): the tile's rows
 *     (bm or bn of them, R) split along K into bk / ja boxes of ja x R,
 *     box i at i R ja elements of the stage (the next atom column);
 *   - MN-major (M or N contiguous): the tile's bk rows of K split along
 *     M or N into rows / ja boxes of ja x bk, box i at i bk ja.
 * TMA fills what lies past the tensor's edges with zeros, so M, N and K
 * need no predicates, and the whole box counts toward the stage's
 * transaction bytes (assumed here as in common/tmap.h; the device kit's
 * gpu_tma_box settles it).
 *
 * The pipeline, per block (S stages, D = S - 2 fills ahead when a K
 * tile's wgmma stay in flight through the next, else S - 1):
 *   init full[0..S) (count 1), fence.proxy.async, barrier
 *   fill the first tile's K tiles 0 .. D-1
 *   for each tile of the block (grid-stride):
 *     for kt:  barrier (every thread's wgmma reading the stage about to be
 *              refilled have completed: wait_group 1 ran in kt - 1)
 *              fill K tile kt + D (if any) into stage pst
 *              wait full[cst] parity cph; wgmma on stage cst
 *     wgmma.wait_group 0; barrier; fill the next tile's K tiles 0 .. D-1
 *     epilogue (registers only: the fills land meanwhile)
 * pst, cst and cph are carried across tiles, advanced by compare and
 * select (no division in the loop).
 */
#include "gemm_internal.h"

#include "common/tmap.h"

#include <string.h>

/* Whether operand `role` can be a 2-D tensor map: a buffer read through
 * views with one stride 1 -- the coordinate its wgmma tile keeps
 * contiguous -- and the other a multiple of 16 bytes (the driver's rule
 * for a global stride), starting at the buffer's first element (the
 * runtime binds a map to the buffer's address). */
static bool tma_operand(const gemm_plan *p, int role)
{
	const gemm_opnd *o = role ? &p->b : &p->a;
	int64_t es = (int64_t)ap_dtype_size(p->in_t), far, outer = role ? p->N : p->Mr;
	bool ar, br;

	ap__gemm_tile_layouts(p, &ar, &br);
	if (!o->plain || o->composite || o->staged || o->gather || o->vec <= 0 || o->k_fast != (role ? br : ar) ||
	    o->s_base != 0)
		return false;
	far = o->k_fast ? o->s_outer : o->s_k;
	if (!(far > 0 && (far * es) % 16 == 0 && far * es < ((int64_t)1 << 40) && outer <= ((int64_t)1 << 32) &&
	      p->K <= ((int64_t)1 << 32)))
		return false;
	/* batches of tiles (not folded): each batch factor of extent > 1 one
	 * more dimension of the map (box 1), its stride a positive multiple of
	 * 16 bytes; at most five in all (a broadcast factor, stride 0, is
	 * none: its coordinate moves nothing) */
	for (int d = 0, n = 2; d < p->nb && !p->fold; d++)
		for (int q = 0; q < o->batch[d].n; q++) {
			int64_t s = o->batch[d].s[q];

			if (o->batch[d].e[q] > 1 && s &&
			    (s < 0 || (s * es) % 16 || s * es >= ((int64_t)1 << 40) || ++n > AP_TMAP_MAX_RANK))
				return false;
		}
	return true;
}

/* Whether the product's operands can be filled by TMA in some
 * configuration: wgmma, no convolution, batch dims either folded into A's
 * rows one stride apart or batches of tiles (each batch factor a map
 * dimension), two distinct buffers (a map per buffer), each a tensor map
 * (tma_operand). */
bool ap__gemm_tma_operands(const gemm_plan *p)
{
	return p->wg && !p->conv && (!p->fold || p->a_linear) && p->a.leaf != p->b.leaf && tma_operand(p, 0) &&
	       tma_operand(p, 1);
}

/* Operand `role`'s boxes in configuration c (the file comment): ja
 * elements along the tile's contiguous coordinate (the swizzle's span),
 * `rows` along the other, `nbox` of them a stage. */
void ap__gemm_tma_box(const gemm_plan *p, const gemm_cfg *c, int role, int *ja, int *rows, int *nbox)
{
	bool ar, br;
	int es = (int)ap_dtype_size(p->in_t), sw = ap__gemm_wg_swizzle(p, c, role), outer = role ? c->bn : c->bm;

	ap__gemm_tile_layouts(p, &ar, &br);
	*ja = sw / es;
	if (*ja <= 0) {
		*rows = *nbox = 0;
		return;
	}
	*rows = (role ? br : ar) ? outer : c->bk;
	*nbox = ((role ? br : ar) ? c->bk : outer) / *ja;
}

/* Whether configuration c can run tma=1: the operands can (above), no
 * split-K, two stages at least, both tiles swizzled (an unswizzled
 * core-matrix tile is not a box) and every box within the driver's 256
 * elements a dimension. */
bool ap__gemm_tma_fits(const gemm_plan *p, const gemm_cfg *c)
{
	if (!ap__gemm_tma_operands(p) || c->splitk > 1 || c->stages < 2)
		return false;
	for (int role = 0; role < 2; role++) {
		int ja, rows, nbox;

		ap__gemm_tma_box(p, c, role, &ja, &rows, &nbox);
		if (ja <= 0 || nbox <= 0 || rows > 256 || ja > 256)
			return false;
	}
	return true;
}

/* Fills d with operand `role`'s map: dimension 0 the contiguous
 * coordinate (K for a K-major tile, else M or N), dimension 1 the other,
 * its stride in bytes, then (batches of tiles) each batch factor of
 * extent > 1, Y's innermost batch dim first, a factor's inner part first
 * (batch_coords gives their coordinates); the box of ap__gemm_tma_box,
 * 1 along the batch; zero fill. */
static void tma_desc(gctx *c, int role, ap_tmap_desc *d)
{
	const gemm_plan *p = c->p;
	const gemm_opnd *o = role ? &p->b : &p->a;
	uint64_t es = ap_dtype_size(p->in_t), outer = (uint64_t)(role ? p->N : p->Mr);
	int ja, rows, nbox;

	ap__gemm_tma_box(p, &c->c, role, &ja, &rows, &nbox);
	memset(d, 0, sizeof(*d));
	d->dtype = ap_tmap_dtype_of(p->in_t);
	d->dims[0] = o->k_fast ? (uint64_t)p->K : outer;
	d->dims[1] = o->k_fast ? outer : (uint64_t)p->K;
	d->strides[0] = (uint64_t)(o->k_fast ? o->s_outer : o->s_k) * es;
	d->box[0] = (uint32_t)ja;
	d->box[1] = (uint32_t)rows;
	d->estrides[0] = d->estrides[1] = 1;
	d->rank = 2;
	for (int b = p->nb - 1; b >= 0 && !p->fold; b--)
		for (int q = o->batch[b].n - 1; q >= 0; q--)
			if (o->batch[b].e[q] > 1 && o->batch[b].s[q]) {
				d->dims[d->rank] = (uint64_t)o->batch[b].e[q];
				d->strides[d->rank - 1] = (uint64_t)o->batch[b].s[q] * es;
				d->box[d->rank] = 1;
				d->estrides[d->rank++] = 1;
			}
	d->swizzle = ap_tmap_swizzle_of((unsigned)c->r->sw[role]);
	d->l2 = AP_TMAP_L2_128B;
	d->oob = AP_TMAP_OOB_ZERO;
}

/* x = x == S - 1 ? 0 : x + 1, and *flip ^= 1 where it wrapped (NULL: no
 * parity). */
static void advance(gctx *c, ap_kir_block *b, ap_kir_var *x, ap_kir_var *flip)
{
	ap_kir_kernel *k = c->k;
	ap_kir_expr *last = ap_kir_binary(k, AP_KIR_EQ, ap_kir_ref(k, x), I(c, c->c.stages - 1));

	if (flip)
		ap_kir_assign(k, b, flip, ap_kir_select(k, last, ap_kir_binary(k, AP_KIR_XOR, ap_kir_ref(k, flip), I(c, 1)),
							ap_kir_ref(k, flip)));
	last = ap_kir_binary(k, AP_KIR_EQ, ap_kir_ref(k, x), I(c, c->c.stages - 1));
	ap_kir_assign(k, b, x, ap_kir_select(k, last, I(c, 0), ap_kir_addi(k, ap_kir_ref(k, x), 1)));
}

/* Operand `role`'s map coordinates past the first two (tma_desc's batch
 * dimensions) for Y's batch coordinates bc: a factor's part of its dim's
 * coordinate (ap__gemm_factor_coord, as the operands' addresses split
 * it). */
static int batch_coords(gctx *c, int role, ap_kir_expr *const *bc, ap_kir_expr **co)
{
	const gemm_plan *p = c->p;
	const gemm_opnd *o = role ? &p->b : &p->a;
	int n = 0;

	for (int b = p->nb - 1; b >= 0 && !p->fold; b--)
		for (int q = o->batch[b].n - 1; q >= 0; q--)
			if (o->batch[b].e[q] > 1 && o->batch[b].s[q])
				co[n++] = ap__gemm_factor_coord(c, bc[b], &o->batch[b], q);
	return n;
}

/* Fills: thread `issuer` (an IF in b) expects the stage's bytes on
 * full[pst] and issues K tile kt's boxes of A (rows m0 ..) and B (columns
 * n0 ..) of Y's batch bc into stage pst; then every thread advances pst
 * (and flips *flip where it wraps; NULL: no parity). */
static void fill(gctx *c, ap_kir_block *b, ap_kir_expr *kt, ap_kir_expr *m0, ap_kir_expr *n0, ap_kir_expr *const *bc,
		 unsigned issuer, ap_kir_var *flip)
{
	ap_kir_kernel *k = c->k;
	int64_t es = (int64_t)ap_dtype_size(c->p->in_t);
	ap_kir_expr *st = ap_kir_ref(k, c->pst), *k0 = ap_kir_muli(k, kt, c->c.bk);
	ap_kir_stmt *one = ap_kir_if(k, b, ap_kir_binary(k, AP_KIR_EQ, c->tid, I(c, issuer)));

	if (!one)
		return;
	ap_kir_mbar_arrive(k, &one->body, c->full, st,
			   ap_kir_int(k, AP_DT_I32, (int64_t)(c->c.bm + c->c.bn) * c->c.bk * es));
	for (int role = 0; role < 2; role++) {
		const gemm_opnd *o = role ? &c->p->b : &c->p->a;
		ap_kir_expr *o0 = role ? n0 : m0;
		int ja, rows, nbox;

		ap__gemm_tma_box(c->p, &c->c, role, &ja, &rows, &nbox);
		for (int i = 0; i < nbox; i++) {
			/* box i: along the contiguous coordinate i ja on from the
			 * tile's start (K for a K-major tile) */
			ap_kir_expr *co[AP_TMAP_MAX_RANK];

			co[0] = ap_kir_addi(k, o->k_fast ? k0 : o0, (int64_t)i * ja);
			co[1] = o->k_fast ? o0 : k0;
			batch_coords(c, role, bc, co + 2);
			ap_kir_tma_load(k, &one->body, role ? c->sb : c->sa,
					ap_kir_addi(k, ap_kir_mul(k, st, I(c, role ? c->b_stage : c->a_stage)),
						    (int64_t)i * rows * ja),
					ap_v_buffer(c->v, o->leaf), co, c->full, st);
		}
	}
	advance(c, b, c->pst, flip);
}

/* The fills ahead of the pipeline: D, or S - 1 without wgmma overlap. */
static int ahead(gctx *c)
{
	return c->wg_overlap ? c->c.stages - 2 : c->c.stages - 1;
}

/* The output tile `tile` of the grid-stride order: its first row and
 * column and Y's batch coordinates (as open_tile and the prefetch split
 * it), bound in the current block. */
static void tile_coords(gctx *c, ap_kir_expr *tile, ap_kir_expr **m0, ap_kir_expr **n0, ap_kir_expr **bc,
			ap_kir_expr **bi)
{
	int64_t per = (int64_t)c->tiles_m * c->tiles_n;
	ap_kir_expr *b;

	if (c->p->tb == 1) {
		ap__gemm_tile_origin(c, c->v->cur, tile, "pm", "pn", m0, n0);
		for (int d = 0; d < c->p->nb; d++)
			bc[d] = I(c, 0);
		if (bi)
			*bi = I(c, 0);
		return;
	}
	ap__gemm_tile_origin(c, c->v->cur, ap_kir_binary(c->k, AP_KIR_REM, tile, I(c, per)), "pm", "pn", m0, n0);
	b = ap_kir_binary(c->k, AP_KIR_DIV, tile, I(c, per));
	if (bi)   /* the tile's linear batch (a convolution's group) */
		b = *bi = ap_kir_bind(c->k, c->v->cur, c->k->index_type, "pbi", b);
	ap__gemm_batch_coords(c, c->v->cur, b, "pb", bc);
}

/* Fills K tiles 0 .. min(D, ktl) - 1 of output tile `tile` (the caller
 * knows it exists and that the stages are free). */
void ap__gemm_tma_prefetch(gctx *c, ap_kir_expr *tile)
{
	ap_kir_expr *m0, *n0, *bc[AP_MAX_RANK];
	int n = ahead(c) < c->ktl ? ahead(c) : c->ktl;

	tile_coords(c, tile, &m0, &n0, bc, NULL);
	for (int j = 0; j < n; j++)
		fill(c, c->v->cur, I(c, j), m0, n0, bc, 0, NULL);
}

/* Before the tile loop: the two tensor maps, the ring's barriers
 * initialised by thread 0 and fenced for the async proxy, pst / cst / cph
 * at 0, and the block's first tile prefetched.  0, or -1 when a map is
 * refused (the kernel is marked failed). */
/* The operands' two tensor maps (tma_desc); -1 when one is refused. */
static int make_maps(gctx *c)
{
	for (int role = 0; role < 2; role++) {
		ap_tmap_desc d;

		tma_desc(c, role, &d);
		if (ap_kir_tensor_map(c->k, ap_v_buffer(c->v, (role ? c->p->b : c->p->a).leaf), &d) < 0)
			return -1;
	}
	return 0;
}

int ap__gemm_tma_setup(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_stmt *one;

	if (make_maps(c) < 0)
		return -1;
	ap_kir_comment(k, v->cur, "operands A and B by TMA: boxes of the tensor maps into %d stages, each on its "
		       "mbarrier; persistent blocks", c->c.stages);
	c->full = ap_kir_mbarriers(k, "full", c->c.stages);
	one = ap_kir_if(k, v->cur, ap_kir_binary(k, AP_KIR_EQ, c->tid, I(c, 0)));
	if (!c->full || !one)
		return -1;
	for (int s = 0; s < c->c.stages; s++)
		ap_kir_mbar_init(k, &one->body, c->full, I(c, s), ap_kir_int(k, AP_DT_I32, 1));
	ap_kir_fence_proxy_async(k, &one->body);
	ap_kir_barrier(k, v->cur);
	c->pst = ap_kir_var_new(k, k->index_type, "pst");
	c->cst = ap_kir_var_new(k, k->index_type, "cst");
	c->cph = ap_kir_var_new(k, k->index_type, "cph");
	ap_kir_let(k, v->cur, c->pst, I(c, 0));
	ap_kir_let(k, v->cur, c->cst, I(c, 0));
	ap_kir_let(k, v->cur, c->cph, I(c, 0));
	ap__gemm_tma_prefetch(c, ap_kir_index_of(k, AP_KIR_BLOCK_X));
	return ap_kir_failed(k) ? -1 : 0;
}

/* The K loop of output tile `tile` (first row and column c->m0, c->n0;
 * its first D K tiles already filled) and the next tile's prefetch (the
 * file comment). */
void ap__gemm_mainloop_tma(gctx *c, ap_kir_expr *tile)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int D = ahead(c);
	ap_kir_block *ksaved, *saved;
	ap_kir_var *kt = ap_v_loop(v, "kt", I(c, 0), I(c, c->ktl), 1, &ksaved);
	ap_kir_expr *nxt, *next;

	ap_kir_barrier(k, v->cur);
	nxt = ap_kir_bind(k, v->cur, k->index_type, "nx", ap_kir_addi(k, ap_kir_ref(k, kt), D));
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, nxt, I(c, c->ktl)), &saved, NULL);
	fill(c, v->cur, nxt, c->m0, c->n0, c->bcoord, 0, NULL);
	ap_v_close(v, saved);
	ap_kir_mbar_wait(k, v->cur, c->full, ap_kir_ref(k, c->cst), ap_kir_ref(k, c->cph));
	ap__gemm_compute_tile(c, ap_kir_ref(k, c->cst));
	advance(c, v->cur, c->cst, c->cph);
	ap_v_close(v, ksaved);
	if (c->wg_overlap)   /* the last K tile's products */
		ap_kir_wgmma_wait(k, v->cur, 0, c->acc);
	/* every thread's products are complete: the stages are free for the
	 * next tile's first K tiles, which land during this one's epilogue */
	ap_kir_barrier(k, v->cur);
	next = ap_kir_bind(k, v->cur, k->index_type, "nt", ap_kir_addi(k, tile, c->grid));
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, next, I(c, c->tiles)), &saved, NULL);
	ap__gemm_tma_prefetch(c, next);
	ap_v_close(v, saved);
}

/* ---- tma=2: warp specialisation (docs/hopper-pipeline.md, section 4) ---------------------- */


/* Whether configuration c can run tma=3, the producer warpgroup copying
 * (produce_copies): wgmma, no split-K, two stages at least, and at most
 * 64 elements a producer thread of register-staged operands (its share
 * of the tiles ap__gemm_copy_mode sends through registers). */
bool ap__gemm_ws_copies_fit(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t)
{
	int regs = 0;

	if (!p->wg || c->splitk > 1 || c->stages < 2)
		return false;
	for (int role = 0; role < 2; role++) {
		stage_mode m;

		if (ap__gemm_copy_mode(p, role, c, t, &m) == 0)
			regs += ((role ? c->bn : c->bm) * c->bk + 127) / 128;
	}
	return regs <= 64;
}

/* The producer's wait until stage pst is released (empty[pst], parity
 * pph ^ 1: its first use passes at once). */
static void wait_released(gctx *c, ap_kir_var *pph)
{
	ap_kir_kernel *k = c->k;

	ap_kir_mbar_wait(k, c->v->cur, c->empty, ap_kir_ref(k, c->pst),
			 ap_kir_binary(k, AP_KIR_XOR, ap_kir_ref(k, pph), I(c, 1)));
}

/* tma=2's producer: for every tile of the block (grid-stride, open_tile's
 * order) and K tile, wait until stage pst is released (empty[pst], parity
 * pph ^ 1: its first use passes at once), then thread `producer` expects
 * the stage's bytes and issues its boxes (fill); pst and pph advance. */
static void produce_tma(gctx *c, unsigned producer, ap_kir_var *pph)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *tsaved, *ksaved;
	ap_kir_var *tile, *kt;
	ap_kir_expr *m0, *n0, *bc[AP_MAX_RANK];

	tile = ap_v_loop(v, "tile", ap_kir_index_of(k, AP_KIR_BLOCK_X), I(c, c->tiles), c->grid, &tsaved);
	tile_coords(c, ap_kir_ref(k, tile), &m0, &n0, bc, NULL);
	kt = ap_v_loop(v, "kt", I(c, 0), I(c, c->ktl), 1, &ksaved);
	wait_released(c, pph);
	fill(c, v->cur, ap_kir_ref(k, kt), m0, n0, bc, producer, pph);
	ap_v_close(v, ksaved);
	ap_v_close(v, tsaved);
}

/* The stage before x in the ring: x == 0 ? S - 1 : x - 1. */
static ap_kir_expr *previous(gctx *c, ap_kir_var *x)
{
	ap_kir_kernel *k = c->k;

	return ap_kir_select(k, ap_kir_binary(k, AP_KIR_EQ, ap_kir_ref(k, x), I(c, 0)), I(c, c->c.stages - 1),
			     ap_kir_addi(k, ap_kir_ref(k, x), -1));
}

/* Stage x announced by every producer thread: its copies of the stage
 * complete (cp.async.wait_group `pending`, with cp.async operands), its
 * stores and copies fenced for the async proxy (wgmma reads through it),
 * then its arrival on full[x] (count 128). */
static void announce(gctx *c, ap_kir_block *b, ap_kir_expr *x, int pending)
{
	if (c->a_async || c->b_async)
		ap_kir_cp_wait(c->k, b, pending);
	ap_kir_fence_proxy_async(c->k, b);
	ap_kir_mbar_arrive(c->k, b, c->full, x, NULL);
}

/* tma=3's producer, the 128 threads from `producer`: every tile of the
 * block and K tile in the consumers' order, into stage pst once it is
 * released (empty[pst], parity pph ^ 1) -- the operands cp.async copies
 * (ap__gemm_issue_async, dealt over the producer's threads; one commit
 * group a stage), the others loaded into registers through the value
 * builder (a convolution's im2col gather, a prologue) and stored into
 * the stage.  With three stages or more a stage is announced (announce)
 * one step late, after the next stage's copies are issued, so that a
 * thread's copies of one stage are in flight while it waits for those of
 * the stage before; the last one after the loops.  With two, at once:
 * the consumers, keeping a K tile's wgmma in flight, release a stage one
 * K tile late, and a late announcement would wait on that release.
 * CUTLASS's warp-specialised cp.async mainloop arrives with
 * cp.async.mbarrier.arrive instead; this form keeps the fence the async
 * proxy needs with the writer. */
static void produce_copies(gctx *c, unsigned producer, ap_kir_var *pph)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *tsaved, *ksaved, *saved;
	ap_kir_var *tile, *kt, *lag = NULL;
	ap_kir_expr *bc[AP_MAX_RANK], *tid = c->tid, *bi;
	unsigned nt = c->nt;
	bool late = c->c.stages >= 3;   /* announce one step late (the comment) */

	if (late) {   /* whether a stage waits for its announcement: all but the first step */
		lag = ap_kir_var_new(k, k->index_type, "lag");
		ap_kir_let(k, v->cur, lag, I(c, 0));
	}
	/* the producer's own thread index and count, for the copies' and the
	 * registers' dealing (copy_loop, reg_slot): threadIdx.x & 127 (the
	 * arm starts on a warpgroup), which tells the compiler its range --
	 * a subtraction left every (pt + 128 r) % 128 and / 128 of the
	 * register-staged gather to run, and ptxas spilled */
	c->tid = ap_kir_bind(k, v->cur, k->index_type, "pt", ap_kir_binary(k, AP_KIR_AND, tid, I(c, 127)));
	c->nt = 128;
	tile = ap_v_loop(v, "tile", ap_kir_index_of(k, AP_KIR_BLOCK_X), I(c, c->tiles), c->grid, &tsaved);
	tile_coords(c, ap_kir_ref(k, tile), &c->m0, &c->n0, bc, &bi);
	for (int d = 0; d < c->p->nb; d++)
		c->bcoord[d] = bc[d];
	c->tb_index = bi;
	kt = ap_v_loop(v, "kt", I(c, 0), I(c, c->ktl), 1, &ksaved);
	wait_released(c, pph);
	ap__gemm_declare_regs(c);
	ap__gemm_issue_tile(c, ap_kir_ref(k, c->pst), ap_kir_ref(k, kt));
	if (c->a_async || c->b_async)
		ap_kir_cp_commit(k, v->cur);
	if (late) {   /* the stage before pst's */
		ap_v_if(v, ap_kir_binary(k, AP_KIR_NE, ap_kir_ref(k, lag), I(c, 0)), &saved, NULL);
		announce(c, v->cur, previous(c, c->pst), 1);
		ap_v_close(v, saved);
	}
	ap__gemm_complete_tile(c, ap_kir_ref(k, c->pst));
	if (late)
		ap_kir_assign(k, v->cur, lag, I(c, 1));
	else
		announce(c, v->cur, ap_kir_ref(k, c->pst), 0);
	advance(c, v->cur, c->pst, pph);
	ap_v_close(v, ksaved);
	ap_v_close(v, tsaved);
	if (late) {   /* the last stage filled: the one before pst now */
		ap_v_if(v, ap_kir_binary(k, AP_KIR_NE, ap_kir_ref(k, lag), I(c, 0)), &saved, NULL);
		announce(c, v->cur, previous(c, c->pst), 0);
		ap_v_close(v, saved);
	}
	/* the consumers' tiles are their own (open_tile) */
	c->tid = tid;
	c->nt = nt;
	c->m0 = c->n0 = c->tb_index = NULL;
}

/* Before the tile loop of a warp-specialised GEMM (tma=2: TMA; tma=3: a
 * copying producer): for tma=2 the maps; full[S] (count 1 for the
 * producer's expect_tx arrival, 128 for the copying producer's threads)
 * and empty[S] (count W: each consumer warpgroup's release) initialised
 * by thread 0 and fenced; then ROLES with
 *   - the producer warpgroup, threads [128 W, 128 W + 128): pst and pph
 *     declared, then produce_tma or produce_copies;
 *   - the consumer warpgroups, threads [0, 128 W), each its own group:
 *     cst, cph and rst declared, *consumer set to the arm's body, where
 *     the caller opens the same tile loop (open_tile), and
 *     ap__gemm_mainloop_ws runs the K loop.
 * No __syncthreads inside: the warpgroups meet only on the barriers.  0,
 * or -1 when a map is refused or the IR fails. */
int ap__gemm_ws_setup(gctx *c, ap_kir_block **consumer)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int S = c->c.stages, W = c->c.tm * c->c.tn;
	bool tma = c->c.tma == 2;
	unsigned producer = 128u * (unsigned)W;
	ap_kir_stmt *one, *roles, *prod, *cons;
	ap_kir_var *pph;

	if (tma && make_maps(c) < 0)
		return -1;
	if (tma)
		ap_kir_comment(k, v->cur, "warp specialisation: warpgroup %d issues the TMA loads of operands A and B "
			       "into %d stages (full / empty mbarriers), warpgroups 0..%d run wgmma on them; persistent "
			       "blocks", W, S, W - 1);
	else
		ap_kir_comment(k, v->cur, "warp specialisation: warpgroup %d copies operands A and B (%s, %s) into %d "
			       "stages (full / empty mbarriers), warpgroups 0..%d run wgmma on them; persistent blocks",
			       W, c->a_async ? "cp.async" : "registers", c->b_async ? "cp.async" : "registers", S, W - 1);
	c->full = ap_kir_mbarriers(k, "full", S);
	c->empty = ap_kir_mbarriers(k, "empty", S);
	one = ap_kir_if(k, v->cur, ap_kir_binary(k, AP_KIR_EQ, c->tid, I(c, 0)));
	if (!c->full || !c->empty || !one)
		return -1;
	for (int s = 0; s < S; s++) {
		ap_kir_mbar_init(k, &one->body, c->full, I(c, s), ap_kir_int(k, AP_DT_I32, tma ? 1 : 128));
		ap_kir_mbar_init(k, &one->body, c->empty, I(c, s), ap_kir_int(k, AP_DT_I32, W));
	}
	ap_kir_fence_proxy_async(k, &one->body);
	ap_kir_barrier(k, v->cur);
	roles = ap_kir_roles(k, v->cur);
	prod = ap_kir_arm(k, roles, producer, producer + 128u, 128, 0);
	cons = ap_kir_arm(k, roles, 0, producer, 128, 0);
	if (!prod || !cons)
		return -1;
	/* the producer */
	v->cur = &prod->body;
	c->pst = ap_kir_var_new(k, k->index_type, "pst");
	pph = ap_kir_var_new(k, k->index_type, "pph");
	ap_kir_let(k, v->cur, c->pst, I(c, 0));
	ap_kir_let(k, v->cur, pph, I(c, 0));
	if (tma)
		produce_tma(c, producer, pph);
	else
		produce_copies(c, producer, pph);
	/* the consumers' ring state, carried across their tiles */
	v->cur = &cons->body;
	c->cst = ap_kir_var_new(k, k->index_type, "cst");
	c->cph = ap_kir_var_new(k, k->index_type, "cph");
	c->rst = ap_kir_var_new(k, k->index_type, "rst");
	ap_kir_let(k, v->cur, c->cst, I(c, 0));
	ap_kir_let(k, v->cur, c->cph, I(c, 0));
	ap_kir_let(k, v->cur, c->rst, I(c, 0));
	*consumer = v->cur;
	return ap_kir_failed(k) ? -1 : 0;
}

/* Stage x released by this warpgroup: its first thread arrives on
 * empty[x] (count W: the stage is free once every consumer warpgroup's
 * wgmma reading it have completed). */
static void release(gctx *c, ap_kir_block *b, ap_kir_expr *x)
{
	ap_kir_mbar_arrive_each(c->k, b, c->empty, x, 128);
}

/* A consumer warpgroup's K loop of one output tile: wait for stage cst
 * (full[cst], parity cph), its wgmma; with a K tile's products kept in
 * flight through the next (c->wg_overlap: wait_group 1) the previous
 * stage rst is released after the wait that covers it, else this one at
 * once; cst / cph advance.  After the loop the last group is waited for
 * and its stage released. */
void ap__gemm_mainloop_ws(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *ksaved, *saved;
	ap_kir_var *kt = ap_v_loop(v, "kt", I(c, 0), I(c, c->ktl), 1, &ksaved);

	ap_kir_mbar_wait(k, v->cur, c->full, ap_kir_ref(k, c->cst), ap_kir_ref(k, c->cph));
	ap__gemm_compute_tile(c, ap_kir_ref(k, c->cst));
	if (c->wg_overlap) {
		ap_v_if(v, ap_kir_binary(k, AP_KIR_GT, ap_kir_ref(k, kt), I(c, 0)), &saved, NULL);
		release(c, v->cur, ap_kir_ref(k, c->rst));
		ap_v_close(v, saved);
		ap_kir_assign(k, v->cur, c->rst, ap_kir_ref(k, c->cst));
	} else {
		release(c, v->cur, ap_kir_ref(k, c->cst));
	}
	advance(c, v->cur, c->cst, c->cph);
	ap_v_close(v, ksaved);
	if (c->wg_overlap) {   /* the last K tile's products, and its stage */
		ap_kir_wgmma_wait(k, v->cur, 0, c->acc);
		release(c, v->cur, ap_kir_ref(k, c->rst));
	}
}
