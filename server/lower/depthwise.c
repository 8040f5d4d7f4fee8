/* depthwise.c -- the depthwise / grouped convolution emitter: a Conv
 * micro-graph with fewer than 8 output channels per group (depthwise:
 * group == channels; the GEMM emitter's implicit GEMM refuses those, its
 * N dimension would be one or two columns wide) with its prologue and
 * epilogue, as one kernel of spatial tiles staged through shared memory
 * (the direct, tiled depthwise convolution of MobileNet-era libraries:
 * TFLite's and cuDNN's depthwise kernels, PaddleLite's "depthwise
 * direct"; the halo staging is that of stencil codes).
 *
 * A block computes a TH x TW tile of the output plane of one (image n,
 * output channel m) pair; the grid runs over n * M * tiles (the tiles of
 * one plane fastest, so neighbouring blocks share an input plane in the
 * cache), grid-stride beyond AP_MAX_GRID.  For each of the Cg input
 * channels of m's group in turn:
 *   1. the block stages the input window its tile needs -- the halo,
 *      (TH-1)*stride + (KH-1)*dilation + 1 rows by the same of columns,
 *      the padding zero-filled -- and the channel's KH x KW weights in
 *      shared memory, cooperatively (thread i stages elements i, i +
 *      threads, ...), each input element read through the value builder
 *      (an inlined elementwise producer, a prologue, is computed once per
 *      staged element), in the accumulation type;
 *   2. after a barrier, each thread computes "cols" consecutive outputs
 *      of one row of the tile (register blocking): per kernel row it loads
 *      the strip of (cols-1)*stride + (KW-1)*dilation + 1 inputs that its
 *      outputs share into registers, then does cols x KW multiply-adds
 *      against the weights (a shared-memory broadcast);
 *   3. a barrier frees the halo for the next channel.
 * The accumulators (float32 for float32 / float16 / bfloat16, float64 for
 * float64, as the GEMM emitter) then go through the epilogue
 * (epilogue.c): the Conv's bias added, each accumulator handed to the
 * value builder as Y's value, every output stored at the index its views
 * and transposes map Y's element to.  Micro-graphs whose outputs are not
 * all element-for-element functions of Y stay with the pointwise emitter.
 * 2-D convolutions (NCHW) and 1-D ones (NCW, as one row) are built;
 * output planes of fewer than 8 elements (the 1x1 planes of a
 * squeeze-excitation block) are left to the pointwise emitter.
 *
 * The host runs the same kernel: each barrier splits the thread loop
 * (server/kir/print.c), the accumulators live in per-thread slots.
 *
 * Knobs: "th", "tw" (the tile), "cols" (outputs per thread along W):
 * TH x TW / cols threads.  A configuration is buildable when its threads
 * are in [32, ap_block_cap], cols divides TW, the halo and the weights
 * fit the target's static shared memory (48 KiB), a thread's strip fits
 * MAX_STRIP registers, and a 1-D convolution's tile is one row.
 */
#include "emitters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Registers a thread's input strip may take (beyond: local memory). */
#define MAX_STRIP 32

enum { K_TH, K_TW, K_COLS };

typedef struct dw_plan {
	int node, x, w, bias, y;        /* the Conv and its tensors (bias -1 when none) */
	int ns;                         /* spatial dims: 1 or 2 */
	ap_dtype in_t, acc_t;
	int64_t N, C, M, groups, Cg, Mg;
	int64_t H, W, OH, OW;           /* 1-D: H = OH = 1 */
	int64_t KH, KW, sh, sw, dh, dw, ph, pw;   /* window, strides, dilations, begin pads */
	ap_emap *maps;                  /* per tensor of m->g */
} dw_plan;

static void plan_clear(dw_plan *p)
{
	free(p->maps);
	p->maps = NULL;
}

/* 1 when m is a convolution this emitter builds (p filled; plan_clear
 * frees it), 0 when not (*why says why), AP_ENOMEM. */
static int analyze(const ap_mgraph *m, dw_plan *p, char *why, size_t cap)
{
	const ap_graph *g = m->g;
	const ap_node *n;
	const ap_tensor *xt, *wt, *yt;
	ap_conv_ops co;
	int n_conv = 0, rc;

	memset(p, 0, sizeof(*p));
	p->node = -1;
	if (m->kind != AP_GROUP_CONV) {
		snprintf(why, cap, "not a convolution micro-graph");
		return 0;
	}
	for (int i = 0; i < g->n_nodes; i++)
		if (g->nodes[i].op == AP_OP_CONV || g->nodes[i].op == AP_OP_CONV_TRANSPOSE) {
			p->node = i;
			n_conv++;
		}
	if (n_conv != 1 || g->nodes[p->node].op != AP_OP_CONV) {
		snprintf(why, cap, "%d convolutions", n_conv);
		return 0;
	}
	n = &g->nodes[p->node];
	if (!ap__conv_ops(g, p->node, 2, &co, why, cap))
		return 0;
	p->x = co.x;
	p->w = co.w;
	p->bias = co.bias;
	p->y = co.y;
	xt = &g->tensors[p->x];
	wt = &g->tensors[p->w];
	yt = &g->tensors[p->y];
	p->ns = co.ns;
	p->in_t = co.in_t;
	p->acc_t = co.acc_t;
	p->N = xt->dims[0];
	p->C = co.C;
	p->M = co.M;
	p->groups = co.groups;
	p->Cg = co.Cg;
	p->Mg = co.Mg;
	if (yt->dims[0] != p->N) {
		snprintf(why, cap, "a batch of %lld images in, %lld out", (long long)p->N, (long long)yt->dims[0]);
		return 0;
	}
	if (p->Mg >= 8) {
		snprintf(why, cap, "%lld output channels per group: the GEMM emitter's", (long long)p->Mg);
		return 0;
	}
	if (wt->dims[0] != p->M || wt->dims[1] != p->Cg) {
		snprintf(why, cap, "weights of another shape");
		return 0;
	}
	p->H = p->OH = p->KH = p->sh = p->dh = 1;
	p->ph = 0;
	for (int d = 0; d < p->ns; d++) {
		bool row = p->ns == 2 && d == 0;
		int64_t st = ap_node_attr_at(n, "strides", d, 1), dl = ap_node_attr_at(n, "dilations", d, 1);
		int64_t pb = ap_node_attr_at(n, "pads", d, 0), pe = ap_node_attr_at(n, "pads", p->ns + d, 0);

		if (st < 1 || dl < 1 || pb < 0 || pe < 0) {
			snprintf(why, cap, "stride %lld, dilation %lld, pads %lld %lld", (long long)st,
				 (long long)dl, (long long)pb, (long long)pe);
			return 0;
		}
		*(row ? &p->H : &p->W) = xt->dims[2 + d];
		*(row ? &p->OH : &p->OW) = yt->dims[2 + d];
		*(row ? &p->KH : &p->KW) = wt->dims[2 + d];
		*(row ? &p->sh : &p->sw) = st;
		*(row ? &p->dh : &p->dw) = dl;
		*(row ? &p->ph : &p->pw) = pb;
	}
	if (p->N < 1 || p->M < 1 || p->Cg < 1 || p->H < 1 || p->W < 1 || p->OH < 1 || p->OW < 1 ||
	    p->KH < 1 || p->KW < 1) {
		snprintf(why, cap, "an empty convolution");
		return 0;
	}
	if (p->OH * p->OW < 8) {
		/* a squeeze-excitation's 1x1 planes: a block of 32+ threads per
		 * plane would leave all but a few idle (pointwise: one thread
		 * per output) */
		snprintf(why, cap, "output planes of %lld elements", (long long)(p->OH * p->OW));
		return 0;
	}
	p->maps = calloc((size_t)g->n_tensors + 1, sizeof(ap_emap));
	if (!p->maps) {
		snprintf(why, cap, "out of memory");
		return AP_ENOMEM;
	}
	if ((rc = ap__epilogue_maps(g, p->y, p->maps, true, why, cap)) <= 0) {
		plan_clear(p);
		return rc;
	}
	return 1;
}

/* ---- configuration ---------------------------------------------------------------- */

typedef struct dw_geom {
	int th, tw, cols;
	int tx_n;                       /* threads along a row of the tile: tw / cols */
	int threads;
	int64_t hh, hw;                 /* the halo: rows, columns */
	int64_t strip;                  /* inputs a thread holds per kernel row */
	size_t smem_bytes;              /* halo + weights */
	int64_t tiles_h, tiles_w, blocks;  /* tiles per plane; n * M * tiles */
} dw_geom;

static void geom_of(const dw_plan *p, const ap_sched *s, dw_geom *g)
{
	memset(g, 0, sizeof(*g));
	g->th = s->v[K_TH];
	g->tw = s->v[K_TW];
	g->cols = s->v[K_COLS];
	if (g->th < 1 || g->tw < 1 || g->cols < 1)
		return;
	g->tx_n = g->tw / g->cols;
	g->threads = g->th * g->tx_n;
	g->hh = (g->th - 1) * p->sh + (p->KH - 1) * p->dh + 1;
	g->hw = (g->tw - 1) * p->sw + (p->KW - 1) * p->dw + 1;
	g->strip = (g->cols - 1) * p->sw + (p->KW - 1) * p->dw + 1;
	g->smem_bytes = (size_t)(g->hh * g->hw + p->KH * p->KW) * ap_dtype_size(p->acc_t);
	g->tiles_h = (p->OH + g->th - 1) / g->th;
	g->tiles_w = (p->OW + g->tw - 1) / g->tw;
	g->blocks = p->N * p->M * g->tiles_h * g->tiles_w;
}

/* Static shared memory a block may use on t: 48 KiB at most (no opt-in). */
static size_t smem_limit(const ap_target_info *t)
{
	size_t lim = t->shared_per_block ? t->shared_per_block : 48 * 1024;

	return lim > 48 * 1024 ? 48 * 1024 : lim;
}

static bool cfg_valid(const dw_plan *p, const ap_sched *s, const ap_target_info *t)
{
	dw_geom g;

	geom_of(p, s, &g);
	/* (1-D: one tile row, the others would compute nothing) */
	return g.th >= 1 && g.cols >= 1 && g.tw >= g.cols && g.tw % g.cols == 0 && g.threads >= 32 &&
	       (unsigned)g.threads <= ap_block_cap(t) && g.smem_bytes <= smem_limit(t) &&
	       g.strip <= MAX_STRIP && (p->ns == 2 || g.th == 1);
}

static int dw_space(const ap_bound *b, ap_space *sp)
{
	(void)b;
	sp->n = 3;
	ap_knob_pow2(&sp->knobs[K_TH], "th", 1, 32);
	ap_knob_pow2(&sp->knobs[K_TW], "tw", 8, 64);
	ap_knob_pow2(&sp->knobs[K_COLS], "cols", 1, 4);
	return 0;
}

/* The default rule: a tile row as wide as the output row (a power of two
 * in [8, 64]), cols 4 / 2 / 1 for rows of 32+ / 16 / 8 (8 or 16 threads
 * along a row), as many tile rows as the plane has (a power of two) within
 * [32, ap_block_cap] threads; then fewer rows, narrower strips and
 * narrower tiles until the halo fits shared memory.  1-D: one row of 64,
 * 2 or 1 per thread.  Leaves *s invalid only for windows no configuration
 * holds (the match refuses those). */
static void choose_rule(const dw_plan *p, const ap_target_info *t, ap_sched *s)
{
	unsigned cap = ap_block_cap(t);
	int tw = p->ns == 1 ? 64 : (int)ap_pow2_at_least(p->OW, 8, 64);

	for (; tw >= 8; tw /= 2) {
		for (int cols = p->ns == 1 ? 2 : tw >= 32 ? 4 : tw >= 16 ? 2 : 1; cols >= 1; cols /= 2) {
			int tx_n = tw / cols;
			int lo = 32 / tx_n > 1 ? 32 / tx_n : 1, hi = (int)cap / tx_n;
			int th = (int)ap_pow2_at_least(p->OH, 1, 32);

			if (th < lo)
				th = lo;
			if (th > hi)
				th = hi;
			for (; th >= lo; th /= 2) {
				s->v[K_TH] = th;
				s->v[K_TW] = tw;
				s->v[K_COLS] = cols;
				if (cfg_valid(p, s, t))
					return;
			}
		}
	}
}

/* A convolution this emitter builds whose default rule finds a
 * configuration: the analysis, kept for the binding. */
static int dw_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	dw_plan *p = malloc(sizeof(*p));
	ap_sched s;
	int rc;

	if (!p)
		return AP_ENOMEM;
	if ((rc = analyze(m, p, why, cap)) <= 0) {
		free(p);
		return rc;
	}
	memset(&s, 0, sizeof(s));
	s.n = 3;
	choose_rule(p, t, &s);
	if (!cfg_valid(p, &s, t)) {
		snprintf(why, cap, "no tile of the depthwise rule fits the target");
		plan_clear(p);
		free(p);
		return 0;
	}
	*an = p;
	return 1;
}

static void dw_unbind(void *an)
{
	plan_clear(an);
	free(an);
}

static int dw_choose(const ap_bound *b, const ap_space *sp, ap_sched *s)
{
	(void)sp;
	choose_rule(b->an, b->t, s);
	return 0;
}

_Static_assert(sizeof(dw_geom) <= AP_PLAN_BYTES, "the depthwise plan fits ap_plan");

/* The plan: the tile's geometry (geom_of), which dw_traffic models and
 * dw_emit builds; it fits when cfg_valid. */
static int dw_resolve(const ap_bound *b, const ap_sched *s, ap_plan *out)
{
	if (s->n < 3)
		return 0;
	geom_of(b->an, s, (dw_geom *)out->x);
	return cfg_valid(b->an, s, b->t);
}

/* ---- the kernel ---------------------------------------------------------------------- */

typedef struct dw_ctx {
	const dw_plan *p;
	ap_kir_expr *acc;               /* the accumulator the epilogue hands out as Y (acc type) */
	ap_kir_expr *mo;                /* the block's output channel */
} dw_ctx;

/* Y's value at the element being stored: the accumulator plus the Conv's
 * bias, rounded to Y's type (every read of Y is at that element). */
static ap_kir_expr *acc_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	dw_ctx *c = user;
	ap_kir_expr *a;

	if (t != c->p->y || !c->acc)
		return NULL;
	a = c->acc;
	if (c->p->bias >= 0) {
		ap_lidx bi = ap_lidx_shape(&v->g->tensors[c->p->bias]);

		bi.c[0] = c->mo;
		a = ap_kir_binary(v->k, AP_KIR_ADD, a, ap_kir_cast(v->k, c->p->acc_t, ap_val(v, c->p->bias, &bi)));
	}
	return ap_kir_cast(v->k, v->g->tensors[t].dtype, a);
}

/* An index of the kernel's index type. */
static ap_kir_expr *I(ap_kir_kernel *k, int64_t v)
{
	return ap_kir_idx(k, v);
}

/* The coordinates of tensor t (X or Y) at (n, channel, row, col); 1-D
 * tensors have no row. */
static ap_lidx plane_index(ap_vctx *v, const dw_plan *p, int t, ap_kir_expr *n, ap_kir_expr *ch,
			   ap_kir_expr *row, ap_kir_expr *col)
{
	ap_lidx ix = ap_lidx_shape(&v->g->tensors[t]);

	ix.c[0] = n;
	ix.c[1] = ch;
	if (p->ns == 2) {
		ix.c[2] = row;
		ix.c[3] = col;
	} else {
		ix.c[2] = col;
	}
	return ix;
}

/* Stages the halo of input channel ci and its weights for output channel
 * mo, channel c of the group: thread tid takes elements tid, tid +
 * threads, ...; positions outside the input (padding) are zero. */
static void stage(ap_vctx *v, const dw_plan *p, const dw_geom *gm, ap_kir_array *halo,
		  ap_kir_array *wts, ap_kir_expr *tid, ap_kir_expr *n, ap_kir_expr *ci, ap_kir_expr *mo,
		  ap_kir_expr *c, ap_kir_expr *ih0, ap_kir_expr *iw0)
{
	ap_kir_kernel *k = v->k;
	ap_kir_block *sv, *sv2;
	ap_kir_stmt *st;
	ap_kir_var *iv;
	ap_kir_expr *i, *ih, *iw, *in;

	iv = ap_v_loop(v, "hi", tid, I(k, gm->hh * gm->hw), gm->threads, &sv);
	i = ap_kir_ref(k, iv);
	ih = ap_v_once(v, ap_kir_add(k, ih0, ap_kir_binary(k, AP_KIR_DIV, i, I(k, gm->hw))));
	iw = ap_v_once(v, ap_kir_add(k, iw0, ap_kir_binary(k, AP_KIR_REM, i, I(k, gm->hw))));
	in = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_GE, iw, I(k, 0)),
			   ap_kir_binary(k, AP_KIR_LT, iw, I(k, p->W)));
	if (p->ns == 2)
		in = ap_kir_binary(k, AP_KIR_LAND, in,
				   ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_GE, ih, I(k, 0)),
						 ap_kir_binary(k, AP_KIR_LT, ih, I(k, p->H))));
	ap_v_if(v, in, &sv2, &st);
	{
		ap_lidx xi = plane_index(v, p, p->x, n, ci, ih, iw);

		ap_kir_store(k, v->cur, halo, i, ap_kir_cast(k, p->acc_t, ap_val(v, p->x, &xi)));
	}
	ap_v_else(v, st);
	ap_kir_store(k, v->cur, halo, i, ap_v_const(v, p->acc_t, 0));
	ap_v_close(v, sv2);
	ap_v_close(v, sv);
	/* W[mo][c][kh][kw], linear */
	iv = ap_v_loop(v, "wi", tid, I(k, p->KH * p->KW), gm->threads, &sv);
	{
		ap_lidx wi = ap_lidx_shape(&v->g->tensors[p->w]);

		i = ap_kir_ref(k, iv);
		wi.lin = ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, mo, p->Cg), c), p->KH * p->KW), i);
		ap_kir_store(k, v->cur, wts, i, ap_kir_cast(k, p->acc_t, ap_val(v, p->w, &wi)));
	}
	ap_v_close(v, sv);
}

/* The thread's cols accumulators += the window of its outputs, from the
 * staged halo: per kernel row, the strip of inputs its outputs share is
 * loaded into registers once. */
static void accumulate(ap_vctx *v, const dw_plan *p, const dw_geom *gm, ap_kir_array *halo,
		       ap_kir_array *wts, ap_kir_expr *tx, ap_kir_expr *ty, ap_kir_var **acc)
{
	ap_kir_kernel *k = v->k;
	ap_kir_block *sv;
	ap_kir_var *khv = ap_v_loop(v, "kh", I(k, 0), I(k, p->KH), 1, &sv);
	ap_kir_expr *kh = ap_kir_ref(k, khv), *base, *strip[MAX_STRIP] = {NULL};

	if (sv && sv->last && sv->last->kind == AP_KIR_S_FOR)
		sv->last->unroll = -1;   /* the weights' indices become constants */
	base = ap_v_once(v, ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ty, p->sh),
								     ap_kir_muli(k, kh, p->dh)), gm->hw),
				       ap_kir_muli(k, tx, (int64_t)gm->cols * p->sw)));
	for (int64_t kw = 0; kw < p->KW; kw++) {
		ap_kir_expr *wv = ap_kir_bind(k, v->cur, p->acc_t, "wv",
					      ap_kir_load(k, wts, ap_kir_add(k, ap_kir_muli(k, kh, p->KW), I(k, kw))));

		for (int j = 0; j < gm->cols; j++) {
			int64_t q = j * p->sw + kw * p->dw;

			if (q >= MAX_STRIP)
				continue;   /* never: cfg_valid keeps strips shorter */
			if (!strip[q])
				strip[q] = ap_kir_bind(k, v->cur, p->acc_t, "xs",
						       ap_kir_load(k, halo, ap_kir_addi(k, base, q)));
			ap_kir_assign(k, v->cur, acc[j],
				      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc[j]),
						    ap_kir_binary(k, AP_KIR_MUL, strip[q], wv)));
		}
	}
	ap_v_close(v, sv);
}

static int dw_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err)
{
	const ap_sched *s = &pl->s;
	const ap_mgraph *m = b->m;
	const ap_target_info *t = b->t;
	const ap_graph *g = m->g;
	const dw_plan *p = b->an;
	dw_geom gm;
	dw_ctx c;
	ap_vctx v;
	ap_kir_array *halo, *wts;
	ap_kir_expr *tid, *tx, *ty;
	ap_kir_var *acc[4], *tv, *cv;
	ap_kir_block *sv_t, *sv_c;
	unsigned grid;
	int rc;

	if (s->n < 3 || !cfg_valid(p, s, t) || s->v[K_COLS] > 4)
		return ap_error_set(err, AP_EUNSUPPORTED, g->nodes[m->root].name, NULL,
				    "depthwise emitter: configuration refused (th %d, tw %d, cols %d)",
				    s->n >= 3 ? s->v[K_TH] : 0, s->n >= 3 ? s->v[K_TW] : 0, s->n >= 3 ? s->v[K_COLS] : 0);
	if ((rc = ap_vctx_init(&v, m, k, err)))
		return rc;
	gm = *(const dw_geom *)pl->x;
	memset(&c, 0, sizeof(c));
	c.p = p;
	v.leaf = acc_leaf;
	v.leaf_user = &c;
	grid = ap_grid_for(gm.blocks, 1);
	k->grid[0] = grid;
	k->block[0] = (unsigned)gm.threads;
	halo = ap_kir_shared(k, "halo", p->acc_t, gm.hh * gm.hw);
	wts = ap_kir_shared(k, "wts", p->acc_t, p->KH * p->KW);
	tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	tx = ap_kir_bind(k, v.cur, k->index_type, "tx", ap_kir_binary(k, AP_KIR_REM, tid, I(k, gm.tx_n)));
	ty = ap_kir_bind(k, v.cur, k->index_type, "ty", ap_kir_binary(k, AP_KIR_DIV, tid, I(k, gm.tx_n)));
	/* the tiles, grid-stride (uniform per block): plane tiles fastest */
	tv = ap_v_loop(&v, "tl", ap_kir_index_of(k, AP_KIR_BLOCK_X), I(k, gm.blocks), grid, &sv_t);
	{
		ap_kir_expr *tl = ap_kir_ref(k, tv);
		ap_kir_expr *bw = ap_kir_binary(k, AP_KIR_REM, tl, I(k, gm.tiles_w));
		ap_kir_expr *bh = ap_kir_binary(k, AP_KIR_REM, ap_kir_binary(k, AP_KIR_DIV, tl, I(k, gm.tiles_w)),
						I(k, gm.tiles_h));
		ap_kir_expr *nm = ap_v_once(&v, ap_kir_binary(k, AP_KIR_DIV, tl, I(k, gm.tiles_w * gm.tiles_h)));
		ap_kir_expr *mo = ap_kir_bind(k, v.cur, k->index_type, "mo", ap_kir_binary(k, AP_KIR_REM, nm, I(k, p->M)));
		ap_kir_expr *n = ap_kir_bind(k, v.cur, k->index_type, "n", ap_kir_binary(k, AP_KIR_DIV, nm, I(k, p->M)));
		ap_kir_expr *oh0 = ap_kir_bind(k, v.cur, k->index_type, "oh", ap_kir_muli(k, bh, gm.th));
		ap_kir_expr *ow0 = ap_kir_bind(k, v.cur, k->index_type, "ow", ap_kir_muli(k, bw, gm.tw));
		ap_kir_expr *ih0 = ap_v_once(&v, ap_kir_addi(k, ap_kir_muli(k, oh0, p->sh), -p->ph));
		ap_kir_expr *iw0 = ap_v_once(&v, ap_kir_addi(k, ap_kir_muli(k, ow0, p->sw), -p->pw));
		ap_kir_expr *c0 = ap_v_once(&v, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, mo, I(k, p->Mg)), p->Cg));

		for (int j = 0; j < gm.cols; j++) {
			acc[j] = ap_kir_var_new(k, p->acc_t, "acc");
			ap_kir_let(k, v.cur, acc[j], ap_v_const(&v, p->acc_t, 0));
		}
		/* the group's input channels, one staged halo each */
		cv = ap_v_loop(&v, "c", I(k, 0), I(k, p->Cg), 1, &sv_c);
		{
			ap_kir_expr *cc = ap_kir_ref(k, cv);
			ap_kir_expr *ci = ap_v_once(&v, ap_kir_add(k, c0, cc));

			stage(&v, p, &gm, halo, wts, tid, n, ci, mo, cc, ih0, iw0);
			ap_kir_barrier(k, v.cur);   /* halo and weights staged */
			accumulate(&v, p, &gm, halo, wts, tx, ty, acc);
			ap_kir_barrier(k, v.cur);   /* halo free for the next channel or tile */
		}
		ap_v_close(&v, sv_c);
		/* the epilogue, per output inside the plane */
		c.mo = mo;
		for (int j = 0; j < gm.cols && !v.rc; j++) {
			ap_kir_expr *oh = ap_kir_add(k, oh0, ty);
			ap_kir_expr *ow = ap_kir_add(k, ow0, ap_kir_addi(k, ap_kir_muli(k, tx, gm.cols), j));
			/* (1-D: OH = 1, the tile's other rows compute nothing) */
			ap_kir_expr *in = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_LT, oh, I(k, p->OH)),
							ap_kir_binary(k, AP_KIR_LT, ow, I(k, p->OW)));
			ap_kir_block *sv;

			ap_v_if(&v, in, &sv, NULL);
			c.acc = ap_kir_ref(k, acc[j]);
			ap__epilogue_store(&v, p->maps, plane_index(&v, p, p->y, n, mo, oh, ow));
			c.acc = NULL;
			ap_v_close(&v, sv);
		}
	}
	ap_v_close(&v, sv_t);
	v.leaf = NULL;
	rc = v.rc;
	ap_vctx_clear(&v);
	return rc;
}

/* ---- traffic --------------------------------------------------------------------------- */

static int dw_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const dw_plan *p = b->an;
	dw_geom gm = *(const dw_geom *)pl->x;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(b->m, out) < 0)
		return AP_ENOMEM;
	if (gm.threads > 0) {
		/* every input element and output once (the inline model's bytes);
		 * 2 K flops per output, K = Cg KH KW, the prologue once per staged
		 * element instead of once per multiply; the blocks load their
		 * halos (the overlap of neighbouring tiles re-read, from L2) and
		 * weights; a thread reads its strip and the weights from shared
		 * memory once per kernel row, its outputs' cols x KW products
		 * from registers */
		double outs = (double)p->N * (double)p->M * (double)p->OH * (double)p->OW;
		double es = (double)ap_dtype_size(p->in_t), as = (double)ap_dtype_size(p->acc_t);
		double staged = (double)gm.blocks * (double)p->Cg * (double)(gm.hh * gm.hw);
		double thread_rows = (double)gm.blocks * gm.threads * (double)p->Cg * (double)p->KH;

		out->flops = 2.0 * outs * (double)(p->Cg * p->KH * p->KW);
		out->threads = (unsigned)gm.threads;
		out->blocks = ap_grid_for(gm.blocks, 1);
		out->shared_bytes = (unsigned)gm.smem_bytes;
		out->tile_bytes = es * (staged + (double)gm.blocks * (double)(p->Cg * p->KH * p->KW));
		out->shared_read = as * thread_rows * (double)(gm.strip + p->KW);
		out->regs = (unsigned)(32 + 2 * gm.cols + gm.strip + p->KW);
	}
	return 0;
}

const ap_emitter ap_emitter_depthwise = {
	"depthwise", dw_bind, dw_unbind, dw_space, dw_choose, dw_emit, dw_traffic, dw_resolve, false, NULL,
};
