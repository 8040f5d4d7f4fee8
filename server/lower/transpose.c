/* transpose.c -- the transpose emitter: a transpose that moves the
 * innermost axis, with the elementwise and broadcast ops around it (rule
 * 6), through shared-memory tiles so that both the reads and the writes
 * are coalesced (the tiled transpose of NVIDIA's "An Efficient Matrix
 * Transpose in CUDA C/C++", with the padded tile against bank conflicts).
 *
 * Let T be the transposed tensor (the Transpose's output, of the output's
 * shape) and X its input.  The output's innermost axis `a` reads X across
 * rows; the output axis `b` that maps to X's innermost axis reads X along
 * rows.  The output is cut into tiles of `tile` x `tile` elements over
 * (b, a), times every combination of the other axes.  For each tile a
 * block of tile x `rows` threads
 *   1. computes T at (b0 + tx, a0 + ty + i*rows), tx fastest: X is read
 *      along its rows, and the ops before the transpose run on X's side;
 *      the values go to smem[ty + i*rows][tx];
 *   2. after a barrier, computes the output at (b0 + ty + i*rows, a0 + tx),
 *      tx fastest along the output's rows, reading T from
 *      smem[tx][ty + i*rows]; the ops after the transpose run on the
 *      output's side.
 * Every transpose of the micro-graph with the same permutation and input
 * shape is staged this way; anything else is built by the value builder
 * as usual.  Knobs: "tile" (16, 32), "rows" (threads along the tile's
 * second axis).
 */
#include "emitters.h"

#include <stdlib.h>
#include <string.h>

#define MAX_STAGED 4

typedef struct tr_plan {
	int n_staged;
	int staged[MAX_STAGED];         /* transposed tensors of m->g staged in tiles */
	int out;                        /* the shape the kernel iterates: a staged tensor */
	int rank, a, b;                 /* output axes: innermost, and X's innermost */
	int64_t dims[AP_MAX_RANK];
} tr_plan;

static bool perm_of(const ap_node *n, int rank, int64_t *perm)
{
	for (int d = 0; d < rank; d++) {
		perm[d] = ap_node_attr_at(n, "perm", d, rank - 1 - d);
		if (perm[d] < 0 || perm[d] >= rank)
			return false;
	}
	return true;
}

/* 1 when m is a tiled transpose (p filled), 0 when not, AP_ENOMEM. */
static int analyze(const ap_mgraph *m, tr_plan *p)
{
	const ap_graph *g = m->g;
	int64_t perm0[AP_MAX_RANK] = {0};
	const ap_tensor *x0 = NULL;

	memset(p, 0, sizeof(*p));
	p->out = -1;
	if (m->kind != AP_GROUP_TRANSPOSE)
		return false;
	for (int i = 0; i < g->n_nodes; i++) {
		const ap_node *n = &g->nodes[i];
		int64_t perm[AP_MAX_RANK];
		const ap_tensor *x;
		int r;

		if (n->op != AP_OP_TRANSPOSE || n->outputs[0] < 0)
			continue;
		x = &g->tensors[n->inputs[0]];
		r = x->rank;
		if (r < 2 || !perm_of(n, r, perm) || perm[r - 1] == r - 1)
			continue;
		if (!x0) {
			x0 = x;
			memcpy(perm0, perm, sizeof(perm0));
		} else if (!ap_dims_equal(x->rank, x->dims, x0->rank, x0->dims) ||
			   memcmp(perm, perm0, sizeof(int64_t) * (size_t)r) != 0) {
			continue;
		}
		if (p->n_staged < MAX_STAGED)
			p->staged[p->n_staged++] = n->outputs[0];
	}
	if (p->n_staged == 0)
		return false;
	p->out = p->staged[0];
	p->rank = g->tensors[p->out].rank;
	memcpy(p->dims, g->tensors[p->out].dims, sizeof(p->dims));
	p->a = p->rank - 1;
	for (int d = 0; d < p->rank; d++)
		if (perm0[d] == p->rank - 1)
			p->b = d;
	/* every output is iterated in the staged tensor's index space, and a
	 * staged tensor is only read there (its tile holds just that) */
	for (int i = 0; i < g->n_outputs; i++)
		if (ap_tensor_numel(&g->tensors[g->outputs[i]]) != ap_tensor_numel(&g->tensors[p->out]))
			return false;
	{
		unsigned char *cur = calloc((size_t)g->n_tensors + 1, 1);
		unsigned char *seen = calloc((size_t)g->n_tensors + 1, 1);
		bool ok = cur && seen;

		if (!ok) {
			free(cur);
			free(seen);
			return AP_ENOMEM;
		}

		for (int i = 0; ok && i < g->n_outputs; i++)
			ap_v_mark_current(g, g->outputs[i], false, cur, seen);
		for (int i = 0; ok && i < p->n_staged; i++)
			if (cur[p->staged[i]] != 1)
				ok = false;
		free(cur);
		free(seen);
		if (!ok)
			return false;
	}
	/* tiles pay when both tiled axes are long enough */
	return p->dims[p->a] >= 8 && p->dims[p->b] >= 8;
}

/* The analysis of a tiled transpose, kept for the binding. */
static int tr_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	tr_plan *p = malloc(sizeof(*p));
	int rc;

	(void)t;
	if (!p)
		return AP_ENOMEM;
	if ((rc = analyze(m, p)) <= 0) {
		free(p);
		return rc;
	}
	*an = p;
	return 1;
}

static int tr_space(const ap_bound *b, ap_space *sp)
{
	(void)b;
	sp->n = 2;
	sp->knobs[0] = (ap_knob){"tile", 2, {16, 32}, false};
	ap_knob_pow2(&sp->knobs[1], "rows", 2, 32);
	return 0;
}

static int tr_choose(const ap_bound *b, const ap_space *sp, ap_sched *s)
{
	(void)b;
	(void)sp;
	s->v[0] = 32;
	s->v[1] = 8;
	return 0;
}

static bool tr_config_ok(const ap_sched *s, const ap_target_info *t)
{
	int tile = s->v[0], rows = s->v[1];

	return (tile == 16 || tile == 32) && rows >= 1 && rows <= tile && tile % rows == 0 &&
	       (unsigned)(tile * rows) <= ap_block_cap(t) && tile * rows >= 32;
}

/* The configuration is the plan (tile, rows); it fits by tr_config_ok. */
static int tr_resolve(const ap_bound *b, const ap_sched *s, ap_plan *out)
{
	(void)out;
	return tr_config_ok(s, b->t);
}

typedef struct tr_ctx {
	const tr_plan *p;               /* the binding's analysis */
	ap_kir_array *tiles[MAX_STAGED];
	ap_kir_expr *tile_idx;          /* smem index of the current element, phase 2 */
	ap_vctx *v;
	ap_kir_kernel *k;
	int tile, rows;                 /* the knobs */
	int64_t nb, na;                 /* tiles along the output axes b and a */
	ap_kir_expr *tx, *ty;           /* the thread in the tile x rows block, tx fastest */
} tr_ctx;

static ap_kir_expr *hook(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	tr_ctx *c = user;

	if (!c->tile_idx)
		return NULL;
	for (int i = 0; i < c->p->n_staged; i++)
		if (c->p->staged[i] == t)
			return ap_kir_load(v->k, c->tiles[i], c->tile_idx);
	return NULL;
}

/* The coordinates of tile tl (tiles ordered b fastest, then a, then the
 * other axes' combinations): its first elements along b and a (*b0,
 * *a0) and the other axes' coordinates (other[d], row-major from the
 * batch index). */
static void tile_coords(tr_ctx *c, ap_kir_expr *tl, ap_kir_expr **b0, ap_kir_expr **a0, ap_kir_expr **other)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *tb = ap_kir_binary(k, AP_KIR_REM, tl, ap_kir_idx(k, c->nb));
	ap_kir_expr *ta = ap_kir_binary(k, AP_KIR_REM, ap_kir_binary(k, AP_KIR_DIV, tl, ap_kir_idx(k, c->nb)),
					ap_kir_idx(k, c->na));
	ap_kir_expr *bt = ap_kir_binary(k, AP_KIR_DIV, tl, ap_kir_idx(k, c->nb * c->na));
	int64_t stride = 1;

	*b0 = ap_kir_bind(k, v->cur, k->index_type, "b0", ap_kir_muli(k, tb, c->tile));
	*a0 = ap_kir_bind(k, v->cur, k->index_type, "a0", ap_kir_muli(k, ta, c->tile));
	for (int d = c->p->rank - 1; d >= 0; d--) {
		if (d == c->p->a || d == c->p->b)
			continue;
		other[d] = c->p->dims[d] == 1 ? ap_kir_idx(k, 0)
			   : ap_kir_bind(k, v->cur, k->index_type, "o",
					 ap_kir_binary(k, AP_KIR_REM,
						       stride == 1 ? bt : ap_kir_binary(k, AP_KIR_DIV, bt,
											ap_kir_idx(k, stride)),
						       ap_kir_idx(k, c->p->dims[d])));
		stride *= c->p->dims[d];
	}
}

/* Element i of the thread in phase 0 or 1 of the tile (b0, a0, other):
 * row r = ty + i * rows of the tile.  Phase 0: the staged tensors at
 * (b0 + tx, a0 + r), b along tx (X's rows), into tiles[..][r][tx];
 * phase 1: every output at (b0 + r, a0 + tx), a along tx, reading the
 * staged tensors from tiles[..][tx][r] (the hook).  Inside the output
 * only. */
static void tr_element(tr_ctx *c, int phase, int i, ap_kir_expr *b0, ap_kir_expr *a0, ap_kir_expr *const *other)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const ap_graph *g = v->g;
	ap_kir_expr *r = ap_kir_addi(k, c->ty, (int64_t)i * c->rows);
	ap_kir_expr *cb = phase == 0 ? ap_kir_add(k, b0, c->tx) : ap_kir_add(k, b0, r);
	ap_kir_expr *ca = phase == 0 ? ap_kir_add(k, a0, r) : ap_kir_add(k, a0, c->tx);
	ap_kir_block *sv;
	ap_lidx ix = ap_lidx_shape(&g->tensors[c->p->out]);

	for (int d = 0; d < c->p->rank; d++)
		ix.c[d] = d == c->p->a ? ca : d == c->p->b ? cb : other[d];
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND,
				 ap_kir_binary(k, AP_KIR_LT, cb, ap_kir_idx(k, c->p->dims[c->p->b])),
				 ap_kir_binary(k, AP_KIR_LT, ca, ap_kir_idx(k, c->p->dims[c->p->a]))),
		&sv, NULL);
	if (phase == 0) {
		ap_kir_expr *slot = ap_kir_add(k, ap_kir_muli(k, r, c->tile + 1), c->tx);

		for (int q = 0; q < c->p->n_staged; q++) {
			ap_lidx xi = ix;

			ap_kir_store(k, v->cur, c->tiles[q], slot, ap_val(v, c->p->staged[q], &xi));
		}
	} else {
		c->tile_idx = ap_kir_add(k, ap_kir_muli(k, c->tx, c->tile + 1), r);
		for (int q = 0; q < g->n_outputs; q++) {
			int o = g->outputs[q];
			ap_lidx oi = ap_lidx_relin(v, &ix, o);

			ap_kir_store(k, v->cur, ap_v_buffer(v, o), ap_lidx_linear(v, &oi),
				     ap_val(v, o, &oi));
		}
		c->tile_idx = NULL;
	}
	ap_v_close(v, sv);
}

/* The tiled transpose (the file comment): a grid-stride loop over the
 * tiles, each in two phases separated by barriers.  Errors:
 * AP_EUNSUPPORTED (not a tiled transpose, or a configuration that does
 * not fit), AP_ENOMEM. */
static int tr_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err)
{
	const ap_sched *s = &pl->s;
	const ap_mgraph *m = b->m;
	const ap_graph *g = m->g;
	tr_ctx c;
	ap_vctx v;
	int rc;
	int64_t batch = 1, n_tiles;
	unsigned grid;
	ap_kir_block *sv_t;
	ap_kir_var *tv;

	memset(&c, 0, sizeof(c));
	c.tile = s->v[0];
	c.rows = s->v[1];
	c.p = b->an;
	if (!tr_config_ok(s, b->t))
		return ap_error_set(err, AP_EUNSUPPORTED, g->nodes[m->root].name, NULL,
				    "transpose emitter: configuration tile %d, rows %d does not fit", c.tile, c.rows);
	if ((rc = ap_vctx_init(&v, m, k, err)))
		return rc;
	c.v = &v;
	c.k = k;
	v.leaf = hook;
	v.leaf_user = &c;
	c.nb = (c.p->dims[c.p->b] + c.tile - 1) / c.tile;
	c.na = (c.p->dims[c.p->a] + c.tile - 1) / c.tile;
	for (int d = 0; d < c.p->rank; d++)
		if (d != c.p->a && d != c.p->b)
			batch *= c.p->dims[d];
	n_tiles = c.nb * c.na * batch;
	grid = ap_grid_for(n_tiles, 1);
	k->grid[0] = grid;
	k->block[0] = (unsigned)(c.tile * c.rows);
	for (int i = 0; i < c.p->n_staged; i++) {
		char name[32];

		snprintf(name, sizeof(name), "tile_%d", i);
		c.tiles[i] = ap_kir_shared(k, name, g->tensors[c.p->staged[i]].dtype,
					   (int64_t)c.tile * (c.tile + 1));
	}
	c.tx = ap_kir_bind(k, v.cur, k->index_type, "tx",
			   ap_kir_binary(k, AP_KIR_REM, ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, c.tile)));
	c.ty = ap_kir_bind(k, v.cur, k->index_type, "ty",
			   ap_kir_binary(k, AP_KIR_DIV, ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, c.tile)));
	/* the tiles, grid-stride (uniform per block) */
	tv = ap_v_loop(&v, "tl", ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_idx(k, n_tiles), grid, &sv_t);
	{
		ap_kir_expr *b0, *a0, *other[AP_MAX_RANK] = {NULL};

		tile_coords(&c, ap_kir_ref(k, tv), &b0, &a0, other);
		for (int phase = 0; phase < 2 && !v.rc; phase++) {
			for (int i = 0; i < c.tile / c.rows && !v.rc; i++)
				tr_element(&c, phase, i, b0, a0, other);
			ap_kir_barrier(k, v.cur);   /* tiles full / free for the next tile */
		}
	}
	ap_v_close(&v, sv_t);
	rc = v.rc;
	ap_vctx_clear(&v);
	return rc;
}

static int tr_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const ap_sched *s = &pl->s;
	const tr_plan *p = b->an;
	int64_t tiles = 1;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(b->m, out) < 0)
		return AP_ENOMEM;
	out->threads = (unsigned)(s->v[0] * s->v[1]);
	for (int d = 0; d < p->rank; d++)
		tiles *= d == p->a || d == p->b ? (p->dims[d] + s->v[0] - 1) / s->v[0] : p->dims[d];
	out->blocks = ap_grid_for(tiles, 1);
	/* a tile (tile + 1 wide) per staged tensor, of its type */
	for (int i = 0; i < p->n_staged; i++)
		out->shared_bytes += (unsigned)(s->v[0] * (s->v[0] + 1)) *
				     (unsigned)ap_dtype_size(b->m->g->tensors[p->staged[i]].dtype);
	return 0;
}

const ap_emitter ap_emitter_transpose = {
	"transpose", tr_bind, NULL, tr_space, tr_choose, tr_emit, tr_traffic, tr_resolve, false, NULL,
};
