/* rows.c -- reduction emitters: plain row and column reductions, and the
 * stitched reductions of Layer II (APOLLO section 4.2, memory stitching),
 * as one kernel shape: a "row group".
 *
 * Every reduction of the micro-graph reduces the same full tensor shape S
 * over the same axes.  A row is one element of the kept axes (M rows), its
 * columns the elements of the reduced axes (N per row).  A block holds
 * `rows` rows; each row is reduced by `lanes` threads.  Two layouts:
 *   - row form (the last axis of S is reduced, so a row's columns are
 *     contiguous in memory): lanes are the fast thread index,
 *     tid = lane + lanes * slot, and consecutive lanes read consecutive
 *     columns;
 *   - column form (the last axis is kept): rows are the fast index,
 *     tid = slot + rows * lane, and consecutive threads read consecutive
 *     rows (the kept elements), lanes stride over the reduced elements.
 * Each thread folds its columns into a partial; a row's partials are
 * combined by a butterfly of warp shuffles (__shfl_xor_sync) over the lane
 * bits of the thread id, then, when a row spans several warps, through
 * shared memory; every thread of the row ends with the row's value (the
 * combination of XLA's row-reduction emitter and the warp-shuffle
 * reductions of the CUDA Programming Guide, "Warp Shuffle Functions").
 *
 * A stitched micro-graph (Layer II) has several reductions in "levels" (a
 * reduction whose input needs another's result is one level later), and
 * consumers: tensors computed per element of the row from the row's
 * reduced values (FULL) or per row (ROW).  The kernel makes one pass over
 * the row per level, then a last pass writing the FULL outputs; ROW
 * tensors are computed once per row, in registers, as soon as their
 * reductions are known.  The row's input elements (leaves read at the
 * element itself) are loaded from global memory once, in the first pass,
 * and kept on chip for the later passes: in registers (each thread holds
 * ceil(N / lanes) elements, the element loop fully unrolled) or, for long
 * rows, in shared memory.  A row that fits neither is not stitched (the
 * fusion layer falls back to separate kernels).
 *
 * Knobs: "lanes" (threads per row), "rows" (rows per block), "cache"
 * (0 none, 1 registers, 2 shared memory).
 */
#include "emitters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LEVELS 8
#define MAX_REDS 16
#define REG_CACHE_MAX 64            /* cached values per thread in registers */
#define CACHE_NONE 0
#define CACHE_REG 1
#define CACHE_SMEM 2

/* Tensor classes: computed per element of the row (FULL), per row (ROW),
 * or a FULL tensor transposed, written through the permutation (FULLT:
 * only as an output). */
enum { CL_OTHER = 0, CL_FULL, CL_ROW, CL_FULLT };

typedef struct rows_plan {
	int rank;
	int64_t S[AP_MAX_RANK];         /* full shape */
	bool red[AP_MAX_RANK];          /* reduced axes */
	int64_t M, N;                   /* rows, columns */
	bool column;                    /* the last axis (of size > 1) is kept */
	int n_red;
	int reds[MAX_REDS];             /* reduction nodes of m->g */
	int level_of[MAX_REDS];         /* 1.. */
	int n_levels;
	unsigned char *cls;             /* per tensor: CL_* (tensors after a reduction) */
	int *level;                     /* per tensor: the reductions it needs (0 none) */
	bool *cached;                   /* per tensor: a leaf kept on chip */
	int n_cached;
	size_t cached_bytes;            /* per element, all cached leaves */
	bool has_full_out;
} rows_plan;

static void plan_clear(rows_plan *p)
{
	free(p->cls);
	free(p->level);
	free(p->cached);
	memset(p, 0, sizeof(*p));
}

static bool same_axes(const ap_graph *g, const ap_node *a, const ap_node *b)
{
	const ap_tensor *xa = &g->tensors[a->inputs[0]], *xb = &g->tensors[b->inputs[0]];
	const ap_attr *aa = ap_node_attr(a, "axes"), *ab = ap_node_attr(b, "axes");
	bool ra[AP_MAX_RANK] = {false}, rb[AP_MAX_RANK] = {false};

	if (!ap_dims_equal(xa->rank, xa->dims, xb->rank, xb->dims))
		return false;
	for (int i = 0; aa && i < aa->n_ints; i++)
		if (aa->ints[i] >= 0 && aa->ints[i] < xa->rank)
			ra[aa->ints[i]] = true;
	for (int i = 0; ab && i < ab->n_ints; i++)
		if (ab->ints[i] >= 0 && ab->ints[i] < xb->rank)
			rb[ab->ints[i]] = true;
	for (int d = 0; d < xa->rank; d++)
		if (xa->dims[d] > 1 && ra[d] != rb[d])
			return false;
	return true;
}

/* Is tensor t (of shape dims) a row-shaped tensor of the plan: the kept
 * dims with the reduced ones set to 1 or left out? */
static bool row_shaped(const rows_plan *p, const ap_tensor *t)
{
	int64_t n = ap_tensor_numel(t);
	int j = 0;

	if (n != p->M)
		return false;
	if (t->rank == p->rank) {
		for (int d = 0; d < p->rank; d++)
			if (t->dims[d] != (p->red[d] ? 1 : p->S[d]))
				return false;
		return true;
	}
	/* keepdims = 0: the kept dims only (dims of size 1 may differ) */
	for (int d = 0; d < p->rank; d++) {
		if (p->red[d] || p->S[d] == 1)
			continue;
		while (j < t->rank && t->dims[j] == 1)
			j++;
		if (j >= t->rank || t->dims[j] != p->S[d])
			return false;
		j++;
	}
	while (j < t->rank && t->dims[j] == 1)
		j++;
	return j == t->rank;
}

static bool full_shaped(const rows_plan *p, const ap_tensor *t)
{
	return ap_dims_equal(t->rank, t->dims, p->rank, p->S);
}

/* The reductions of m (all reducing the same shape over the same axes)
 * into p->reds, and the row shape they define: S, the reduced axes,
 * M rows of N columns, and the form (column: the last axis of size > 1
 * is kept).  0 with *why when there is none, or too many, or they reduce
 * different rows. */
static int find_reductions(const ap_graph *g, rows_plan *p, char *why, size_t cap)
{
	const ap_tensor *x0;
	const ap_attr *ax;
	int last = -1;

	for (int i = 0; i < g->n_nodes; i++) {
		if (ap_op_category_of(g->nodes[i].op) != AP_CAT_REDUCTION)
			continue;
		if (p->n_red == MAX_REDS) {
			snprintf(why, cap, "more than %d reductions", MAX_REDS);
			return false;
		}
		if (p->n_red > 0 && !same_axes(g, &g->nodes[p->reds[0]], &g->nodes[i])) {
			snprintf(why, cap, "its reductions reduce different rows");
			return false;
		}
		p->reds[p->n_red++] = i;
	}
	if (p->n_red == 0) {
		snprintf(why, cap, "no reduction");
		return false;
	}
	x0 = &g->tensors[g->nodes[p->reds[0]].inputs[0]];
	p->rank = x0->rank;
	memcpy(p->S, x0->dims, sizeof(p->S));
	ax = ap_node_attr(&g->nodes[p->reds[0]], "axes");
	for (int i = 0; ax && i < ax->n_ints; i++)
		if (ax->ints[i] >= 0 && ax->ints[i] < p->rank)
			p->red[ax->ints[i]] = true;
	p->M = p->N = 1;
	for (int d = 0; d < p->rank; d++) {
		if (p->red[d])
			p->N *= p->S[d];
		else
			p->M *= p->S[d];
		if (p->S[d] > 1)
			last = d;
	}
	p->column = last >= 0 && !p->red[last];
	return true;
}

/* The level (the reductions it needs) and class of node i's output, the
 * nodes taken in topological order: a reduction's result is a row value
 * one level past its input; a transpose of a full tensor that is an
 * output is written through its permutation (FULLT); an elementwise,
 * broadcast or view op after a reduction makes a full tensor (FULL) or,
 * from row values only, a row value (ROW); anything before every
 * reduction stays unclassified (computed inline at any index).  False
 * with *why for anything else. */
static bool classify_node(const ap_graph *g, rows_plan *p, int i, char *why, size_t cap)
{
	const ap_node *n = &g->nodes[i];
	ap_op_category cat = ap_op_category_of(n->op);
	int lv = 0, o = n->outputs[0];
	bool row_in = false, full_in = false;

	for (int j = 0; j < n->n_inputs; j++) {
		int x = n->inputs[j];

		if (x < 0 || !p->level[x])
			continue;
		if (p->level[x] > lv)
			lv = p->level[x];
		if (p->cls[x] == CL_ROW)
			row_in = true;
		else
			full_in = true;
	}
	if (cat == AP_CAT_REDUCTION) {
		const ap_tensor *x = &g->tensors[n->inputs[0]];

		if (!full_shaped(p, x)) {
			snprintf(why, cap, "a reduction input of another shape");
			return false;
		}
		if (row_in) {
			snprintf(why, cap, "a reduction of a row value");
			return false;
		}
		if (lv + 1 > MAX_LEVELS) {
			snprintf(why, cap, "more than %d dependent reductions", MAX_LEVELS);
			return false;
		}
		for (int r = 0; r < p->n_red; r++)
			if (p->reds[r] == i)
				p->level_of[r] = lv + 1;
		if (lv + 1 > p->n_levels)
			p->n_levels = lv + 1;
		p->level[o] = lv + 1;
		p->cls[o] = CL_ROW;
		if (!row_shaped(p, &g->tensors[o])) {
			snprintf(why, cap, "a reduction result of an unexpected shape");
			return false;
		}
		return true;
	}
	for (int j = 0; j < n->n_inputs; j++)
		if (n->inputs[j] >= 0 && p->cls[n->inputs[j]] == CL_FULLT) {
			snprintf(why, cap, "a transposed value read again");
			return false;
		}
	if (n->op == AP_OP_TRANSPOSE && o >= 0 && g->tensors[o].is_output &&
	    full_shaped(p, &g->tensors[n->inputs[0]]) && (lv == 0 || p->cls[n->inputs[0]] == CL_FULL)) {
		/* written through the permutation */
		p->level[o] = lv;
		p->cls[o] = CL_FULLT;
		return true;
	}
	if (!lv)
		return true;   /* before every reduction: computed inline at any index */
	if (n->n_outputs != 1 || o < 0) {
		snprintf(why, cap, "%s after a reduction", ap_op_name(n->op));
		return false;
	}
	if (cat != AP_CAT_ELEMWISE && cat != AP_CAT_BROADCAST && !ap_op_is_view(n->op)) {
		snprintf(why, cap, "%s after a reduction", ap_op_name(n->op));
		return false;
	}
	p->level[o] = lv;
	if (full_shaped(p, &g->tensors[o]) ||
	    (ap_op_is_view(n->op) && p->cls[n->inputs[0]] == CL_FULL &&
	     ap_tensor_numel(&g->tensors[o]) == p->M * p->N && !p->column &&
	     full_shaped(p, &g->tensors[n->inputs[0]]))) {
		p->cls[o] = CL_FULL;
	} else if (!full_in && (row_shaped(p, &g->tensors[o]) ||
				(ap_op_is_view(n->op) && ap_tensor_numel(&g->tensors[o]) == p->M))) {
		/* a row value (a view of one keeps its linear index: the row) */
		p->cls[o] = CL_ROW;
	} else {
		snprintf(why, cap, "%s after a reduction writes neither a row nor a full tensor",
			 ap_op_name(n->op));
		return false;
	}
	return true;
}

/* The outputs: row values, or full tensors iterated element by element
 * (p->has_full_out).  False with *why for any other output. */
static bool classify_outputs(const ap_graph *g, rows_plan *p, char *why, size_t cap)
{
	for (int i = 0; i < g->n_outputs; i++) {
		int t = g->outputs[i];

		if (p->cls[t] == CL_ROW)
			continue;
		if (p->cls[t] == CL_FULLT) {
			p->has_full_out = true;
			continue;
		}
		if (p->cls[t] == CL_FULL || full_shaped(p, &g->tensors[t])) {
			if (p->cls[t] != CL_FULL)
				p->cls[t] = CL_FULL;
			p->has_full_out = true;
			continue;
		}
		snprintf(why, cap, "it writes %s, neither a row value nor a full tensor",
			 g->tensors[t].name);
		return false;
	}
	return true;
}

/* The leaves read only at the current element (cur, seen: scratch for
 * ap_v_mark_current), of the row's full size: they can be kept on chip
 * (p->cached, n_cached, cached_bytes). */
static void mark_cached(const ap_graph *g, rows_plan *p, unsigned char *cur, unsigned char *seen)
{
	for (int r = 0; r < p->n_red; r++)
		ap_v_mark_current(g, g->nodes[p->reds[r]].inputs[0], true, cur, seen);
	for (int i = 0; i < g->n_outputs; i++) {
		int o = g->outputs[i];

		if (p->cls[o] == CL_FULL)
			ap_v_mark_current(g, o, true, cur, seen);
		else if (p->cls[o] == CL_FULLT)
			ap_v_mark_current(g, g->nodes[g->tensors[o].producer].inputs[0], true, cur, seen);
	}
	for (int t = 0; t < g->n_tensors; t++) {
		const ap_tensor *x = &g->tensors[t];

		if (cur[t] == 1 && x->producer < 0 && x->kind != AP_TENSOR_CONST &&
		    ap_tensor_numel(x) == p->M * p->N) {
			p->cached[t] = true;
			p->n_cached++;
			p->cached_bytes += ap_dtype_size(x->dtype);
		}
	}
}

/* Analyses micro-graph m as a row group: 1 when it is one, 0 with *why
 * when not (a reason for people, e.g. for the explain report), AP_ENOMEM. */
static int analyze(const ap_mgraph *m, rows_plan *p, char *why, size_t cap)
{
	const ap_graph *g = m->g;
	unsigned char *cur = NULL, *seen = NULL;
	bool ok = true;

	memset(p, 0, sizeof(*p));
	if (!find_reductions(g, p, why, cap))
		return false;
	p->cls = calloc((size_t)g->n_tensors + 1, 1);
	p->level = calloc((size_t)g->n_tensors + 1, sizeof(int));
	p->cached = calloc((size_t)g->n_tensors + 1, sizeof(bool));
	cur = calloc((size_t)g->n_tensors + 1, 1);
	seen = calloc((size_t)g->n_tensors + 1, 1);
	if (!p->cls || !p->level || !p->cached || !cur || !seen) {
		snprintf(why, cap, "out of memory");
		free(cur);
		free(seen);
		plan_clear(p);
		return AP_ENOMEM;
	}
	/* levels and classes, nodes in topological order */
	for (int i = 0; i < g->n_nodes && ok; i++)
		ok = classify_node(g, p, i, why, cap);
	if (ok)
		ok = classify_outputs(g, p, why, cap);
	if (ok)
		mark_cached(g, p, cur, seen);
	free(cur);
	free(seen);
	if (!ok)
		plan_clear(p);
	return ok;
}

/* Passes over the row: one per level, plus one writing full outputs. */
static int n_passes(const rows_plan *p)
{
	return p->n_levels + (p->has_full_out ? 1 : 0);
}

/* ---- layout ---------------------------------------------------------------------- */

typedef struct layout {
	unsigned lanes, rows, block;
	int cache;
	int64_t ept;                    /* elements per thread (register cache) */
	unsigned grid;
} layout;

static unsigned block_threads(unsigned lanes, unsigned rows)
{
	return lanes * rows;
}

static size_t smem_cache_bytes(const rows_plan *p, unsigned rows)
{
	return (size_t)rows * (size_t)p->N * p->cached_bytes;
}

/* Smallest cache mode that works for (lanes, rows), or -1. */
static int cache_for(const rows_plan *p, unsigned lanes, unsigned rows, const ap_target_info *t)
{
	int64_t ept = (p->N + lanes - 1) / lanes;

	if (n_passes(p) <= 1 || p->n_cached == 0 || p->N == 0)
		return CACHE_NONE;
	if (ept * p->n_cached <= REG_CACHE_MAX)
		return CACHE_REG;
	if (smem_cache_bytes(p, rows) + 4096 <= t->shared_per_block)
		return CACHE_SMEM;
	return -1;
}

/* ---- the emitter interface ----------------------------------------------------------- */

static bool is_plain_reduction(const ap_mgraph *m)
{
	const ap_graph *g = m->g;
	const ap_node *root = &g->nodes[m->root];

	return m->kind == AP_GROUP_REDUCTION && ap_op_category_of(root->op) == AP_CAT_REDUCTION;
}

static bool config_ok(const rows_plan *p, unsigned lanes, unsigned rows, int cache,
		      const ap_target_info *t);

/* The default configuration by rule: row form, about 8 columns per thread
 * and enough rows per block for 128 threads; column form, up to 16
 * consecutive kept elements per block, the rest of the block on the
 * reduced elements; then the cheapest cache that holds the row on chip,
 * fewer rows per block or more lanes when it does not.  False when no
 * configuration holds the row. */
static bool default_config(const rows_plan *p, const ap_target_info *t, unsigned *lanes_out,
			   unsigned *rows_out, int *cache_out)
{
	unsigned cap = ap_block_cap(t), lanes, rows;
	int cache;

	if (p->column) {
		int64_t inner = 1;

		for (int d = p->rank - 1; d >= 0 && !p->red[d]; d--)
			inner *= p->S[d];
		rows = ap_pow2_at_least(inner, 1, 16);
		lanes = ap_pow2_at_least(p->N, 2, cap / rows);
		while (lanes * rows < 32)
			lanes *= 2;
	} else {
		lanes = ap_pow2_at_least((p->N + 7) / 8, 2, cap);
		rows = 1;
		while (lanes * rows < 128 && (int64_t)rows < p->M && lanes * rows * 2 <= cap)
			rows *= 2;
		while (lanes * rows < 32)
			rows *= 2;
	}
	cache = cache_for(p, lanes, rows, t);
	while (cache < 0 && rows > 1 && !p->column) {
		rows /= 2;
		while (lanes * rows < 32)
			lanes *= 2;
		cache = cache_for(p, lanes, rows, t);
	}
	/* registers rather than shared memory when more lanes make it fit */
	while (cache == CACHE_SMEM && lanes * 2 * rows <= cap &&
	       ((p->N + lanes * 2 - 1) / (lanes * 2)) * p->n_cached <= REG_CACHE_MAX) {
		lanes *= 2;
		cache = cache_for(p, lanes, rows, t);
	}
	*lanes_out = lanes;
	*rows_out = rows;
	*cache_out = cache < 0 ? CACHE_NONE : cache;
	return cache >= 0 && config_ok(p, lanes, rows, *cache_out, t);
}

int ap_lower_stitchable(const ap_mgraph *m, const ap_target_info *t, char *why, size_t cap)
{
	rows_plan p;
	unsigned lanes, rows;
	int cache, rc;
	bool ok;

	if ((rc = analyze(m, &p, why, cap)) <= 0)
		return rc;
	ok = default_config(&p, t, &lanes, &rows, &cache);
	if (!ok)
		snprintf(why, cap, "a row of %lld elements does not fit on chip (%d values per "
			 "element held, %u bytes of shared memory per block)", (long long)p.N,
			 p.n_cached, t->shared_per_block);
	plan_clear(&p);
	return ok;
}

/* Binds a row group of the form asked (a plain reduction along rows or
 * columns, or a stitched group) whose default configuration fits: the
 * analysis, kept. */
static int rr_bind_form(const ap_mgraph *m, const ap_target_info *t, void **an, bool column,
			bool stitched, char *why, size_t cap)
{
	rows_plan *p;
	unsigned lanes, rows;
	int cache, rc;

	if (stitched ? m->kind != AP_GROUP_STITCHED && m->kind != AP_GROUP_WHOLE
		     : !is_plain_reduction(m)) {
		snprintf(why, cap, stitched ? "not a stitched micro-graph" : "not a plain reduction");
		return 0;
	}
	if (!(p = malloc(sizeof(*p))))
		return AP_ENOMEM;
	if ((rc = analyze(m, p, why, cap)) <= 0) {
		free(p);
		return rc;
	}
	if ((stitched || p->column == column) && default_config(p, t, &lanes, &rows, &cache)) {
		*an = p;
		return 1;
	}
	if (!stitched && p->column != column)
		snprintf(why, cap, "a %s reduction", p->column ? "column" : "row");
	else
		snprintf(why, cap, "no configuration of the rule fits the target");
	plan_clear(p);
	free(p);
	return 0;
}

static int row_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	return rr_bind_form(m, t, an, false, false, why, cap);
}

static int col_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	return rr_bind_form(m, t, an, true, false, why, cap);
}

static int st_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	return rr_bind_form(m, t, an, false, true, why, cap);
}

static void rows_unbind(void *an)
{
	plan_clear(an);
	free(an);
}

/* Space: lanes and rows powers of two with lanes * rows in [32, cap]
 * (column form: rows <= 16, so a warp holds two lanes of a row at least);
 * cache modes that fit. */
static int rows_space(const ap_bound *b, ap_space *sp)
{
	const rows_plan *p = b->an;
	unsigned cap = ap_block_cap(b->t);

	memset(sp, 0, sizeof(*sp));
	sp->n = 3;
	if (p->column) {
		ap_knob_pow2(&sp->knobs[0], "lanes", 2, cap);
		ap_knob_pow2(&sp->knobs[1], "rows", 1, 16);
	} else {
		ap_knob_pow2(&sp->knobs[0], "lanes", 2, cap);
		ap_knob_pow2(&sp->knobs[1], "rows", 1, cap / 2);
	}
	sp->knobs[2] = (ap_knob){"cache", 3, {CACHE_NONE, CACHE_REG, CACHE_SMEM}, false};
	return 0;
}

/* Is (lanes, rows, cache) a usable configuration of plan p? */
static bool config_ok(const rows_plan *p, unsigned lanes, unsigned rows, int cache,
		      const ap_target_info *t)
{
	unsigned bt = block_threads(lanes, rows);

	if (bt < 32 || bt > ap_block_cap(t) || lanes < 2)
		return false;
	if (p->column && rows > 16)
		return false;
	if (n_passes(p) > 1 && p->n_cached > 0 && p->N > 0) {
		if (cache == CACHE_NONE)
			return false;
		if (cache == CACHE_REG && ((p->N + lanes - 1) / lanes) * p->n_cached > REG_CACHE_MAX)
			return false;
		if (cache == CACHE_SMEM && smem_cache_bytes(p, rows) + 4096 > t->shared_per_block)
			return false;
	} else if (cache != CACHE_NONE) {
		return false;
	}
	return true;
}

_Static_assert(sizeof(layout) <= AP_PLAN_BYTES, "the row layout fits ap_plan");

/* The plan of (lanes, rows, cache): the block, the elements a thread
 * holds of a row, the grid over the row groups; it fits when config_ok. */
static int rows_resolve(const ap_bound *b, const ap_sched *s, ap_plan *out)
{
	const rows_plan *p = b->an;
	layout *L = (layout *)out->x;

	L->lanes = (unsigned)s->v[0];
	L->rows = (unsigned)s->v[1];
	L->cache = s->v[2];
	L->block = block_threads(L->lanes, L->rows);
	L->ept = (p->N + L->lanes - 1) / L->lanes;
	L->grid = ap_grid_for(p->M, L->rows);
	return config_ok(p, L->lanes, L->rows, L->cache, b->t);
}

static int rows_choose(const ap_bound *b, const ap_space *sp, ap_sched *s)
{
	unsigned lanes = 32, rows = 1;
	int cache = CACHE_NONE;

	(void)sp;
	default_config(b->an, b->t, &lanes, &rows, &cache);
	s->v[0] = (int)lanes;
	s->v[1] = (int)rows;
	s->v[2] = cache;
	return 0;
}

/* ---- emission ---------------------------------------------------------------------- */

typedef struct rows_ctx {
	ap_vctx v;
	const rows_plan *p;             /* the binding's analysis */
	layout L;
	ap_kir_kernel *k;
	ap_kir_expr **row_val;          /* per tensor: its value for the current row */
	ap_kir_array **cache;           /* per tensor: on-chip copy of a cached leaf */
	ap_kir_expr *slot_idx;          /* cache index of the current element */
	ap_kir_expr *lane, *slot, *tid, *row, *valid;
	unsigned wp_count;              /* warps a row spans (rows_threads) */
	ap_kir_array *scratch[MAX_LEVELS][MAX_REDS];   /* per level and reduction: partials
							  of the row's warps (rows_arrays) */
} rows_ctx;

static ap_kir_expr *hook(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	rows_ctx *c = user;

	if (c->row_val[t])
		return c->row_val[t];
	if (c->cache[t] && c->slot_idx)
		return ap_kir_load(v->k, c->cache[t], c->slot_idx);
	return NULL;
}

/* The full index of element (row, col): kept coordinates from the row,
 * reduced ones from the column, each row-major. */
static ap_lidx full_index(rows_ctx *c, ap_kir_expr *row, ap_kir_expr *col)
{
	ap_kir_kernel *k = c->k;
	const rows_plan *p = c->p;
	ap_lidx ix;
	int64_t ks = 1, rs = 1;

	memset(&ix, 0, sizeof(ix));
	ix.rank = p->rank;
	for (int d = p->rank - 1; d >= 0; d--) {
		ap_kir_expr *base = p->red[d] ? col : row;
		int64_t *stride = p->red[d] ? &rs : &ks;
		ap_kir_expr *e;

		ix.dims[d] = p->S[d];
		if (p->S[d] == 1) {
			ix.c[d] = ap_kir_idx(k, 0);
			continue;
		}
		e = *stride == 1 ? base : ap_kir_binary(k, AP_KIR_DIV, base, ap_kir_idx(k, *stride));
		if (*stride * p->S[d] < (p->red[d] ? p->N : p->M))
			e = ap_kir_binary(k, AP_KIR_REM, e, ap_kir_idx(k, p->S[d]));
		ix.c[d] = ap_v_once(&c->v, e);
		*stride *= p->S[d];
	}
	return ix;
}

/* Index of row tensor t for the current row (its linear index is the row). */
static ap_lidx row_index(rows_ctx *c, int t)
{
	ap_lidx ix = ap_lidx_shape(&c->v.g->tensors[t]);

	ix.lin = c->row;
	return ix;
}

/* Combines the partials acc[0..n) of a row across its lanes: shuffle
 * butterflies, then shared memory when the row spans several warps. */
static void row_combine(rows_ctx *c, ap_kir_var *const *acc, const ap_op *ops, int n,
			ap_kir_array *const *scratch, unsigned wp_count)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = &c->v;
	const layout *L = &c->L;
	unsigned first, last, width;

	if (c->p->column) {
		first = L->rows;                  /* lane bits above the row bits */
		last = 16;
		width = 32;
	} else {
		first = 1;
		last = L->lanes > 32 ? 16 : L->lanes / 2;
		width = L->lanes > 32 ? 32 : L->lanes;
	}
	for (unsigned msk = last; msk >= first && msk > 0; msk /= 2) {
		for (int i = 0; i < n; i++) {
			ap_kir_var *o = ap_kir_var_new(k, acc[i]->type, "sh");

			ap_kir_let(k, v->cur, o, NULL);
			ap_kir_shfl(k, v->cur, o, AP_KIR_SHFL_XOR, ap_kir_ref(k, acc[i]),
				    ap_kir_int(k, AP_DT_I32, msk), width);
			ap_kir_assign(k, v->cur, acc[i],
				      ap_v_reduce_combine(v, ops[i], ap_kir_ref(k, acc[i]), ap_kir_ref(k, o)));
		}
		if (msk == first)
			break;
	}
	if (wp_count <= 1)
		return;
	/* several warps: one partial per warp through shared memory */
	{
		ap_kir_expr *wp, *writer;
		ap_kir_block *saved;
		ap_kir_var *w;

		if (c->p->column) {
			wp = ap_kir_binary(k, AP_KIR_DIV, c->tid, ap_kir_idx(k, 32));
			writer = ap_kir_binary(k, AP_KIR_LT, ap_kir_binary(k, AP_KIR_REM, c->tid, ap_kir_idx(k, 32)),
					       ap_kir_idx(k, L->rows));
		} else {
			wp = ap_kir_binary(k, AP_KIR_DIV, c->lane, ap_kir_idx(k, 32));
			writer = ap_kir_binary(k, AP_KIR_EQ, ap_kir_binary(k, AP_KIR_REM, c->lane, ap_kir_idx(k, 32)),
					       ap_kir_idx(k, 0));
		}
		ap_v_if(v, writer, &saved, NULL);
		for (int i = 0; i < n; i++)
			ap_kir_store(k, v->cur, scratch[i],
				     ap_kir_add(k, ap_kir_muli(k, c->slot, wp_count), wp),
				     ap_kir_ref(k, acc[i]));
		ap_v_close(v, saved);
		ap_kir_barrier(k, v->cur);
		for (int i = 0; i < n; i++)
			ap_kir_assign(k, v->cur, acc[i], ap_v_reduce_identity(v, ops[i], acc[i]->type));
		w = ap_v_loop(v, "w", ap_kir_idx(k, 0), ap_kir_idx(k, wp_count), 1, &saved);
		for (int i = 0; i < n; i++)
			ap_kir_assign(k, v->cur, acc[i],
				      ap_v_reduce_combine(v, ops[i], ap_kir_ref(k, acc[i]),
							  ap_kir_load(k, scratch[i],
								      ap_kir_add(k, ap_kir_muli(k, c->slot, wp_count),
										 ap_kir_ref(k, w)))));
		ap_v_close(v, saved);
		ap_kir_barrier(k, v->cur);   /* the scratch is reused by the next combine */
	}
}

/* One pass over the current row's elements: for each element,
 * body(c, pass, index) runs under `valid` with the element's cache slot
 * set.  The first pass loads the cached leaves. */
typedef void (*pass_body)(rows_ctx *c, int pass, ap_lidx *ix, void *arg);

static void row_pass(rows_ctx *c, int pass, pass_body body, void *arg)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = &c->v;
	const layout *L = &c->L;
	ap_kir_block *sv_valid, *sv_loop, *sv_in;
	ap_kir_expr *col, *in_range = NULL;
	ap_kir_var *kv;
	ap_lidx ix;

	ap_v_if(v, c->valid, &sv_valid, NULL);
	if (L->cache == CACHE_REG) {
		ap_kir_stmt *f;

		kv = ap_kir_var_new(k, k->index_type, "e");
		f = ap_kir_for_unroll(k, v->cur, kv, ap_kir_idx(k, 0), ap_kir_idx(k, L->ept), 1, -1);
		sv_loop = v->cur;
		v->cur = f ? &f->body : NULL;
		v->depth++;
		col = ap_v_once(v, ap_kir_add(k, c->lane, ap_kir_muli(k, ap_kir_ref(k, kv), L->lanes)));
		if (L->ept * L->lanes > c->p->N)
			in_range = ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, c->p->N));
		c->slot_idx = ap_kir_ref(k, kv);
	} else {
		kv = ap_v_loop(v, "col", c->lane, ap_kir_idx(k, c->p->N), L->lanes, &sv_loop);
		col = ap_kir_ref(k, kv);
		c->slot_idx = L->cache == CACHE_SMEM
				      ? ap_kir_add(k, ap_kir_muli(k, c->slot, c->p->N), col) : NULL;
	}
	if (in_range)
		ap_v_if(v, in_range, &sv_in, NULL);
	ix = full_index(c, c->row, col);
	if (pass == 0 && L->cache != CACHE_NONE) {
		/* load the row's leaves once; later passes read them on chip */
		ap_kir_expr *keep = c->slot_idx;

		c->slot_idx = NULL;
		for (int t = 0; t < v->g->n_tensors; t++) {
			if (!c->p->cached[t])
				continue;
			{
				ap_lidx r = ap_lidx_relin(v, &ix, t);

				ap_kir_store(k, v->cur, c->cache[t], keep,
					     ap_kir_load(k, ap_v_buffer(v, t), ap_lidx_linear(v, &r)));
			}
		}
		c->slot_idx = keep;
	}
	body(c, pass, &ix, arg);
	if (in_range)
		ap_v_close(v, sv_in);
	ap_v_close(v, sv_loop);
	ap_v_close(v, sv_valid);
	c->slot_idx = NULL;
}

typedef struct level_arg {
	int n;
	int idx[MAX_REDS];              /* plan reductions of this level */
	ap_kir_var *acc[MAX_REDS];
} level_arg;

static void level_body(rows_ctx *c, int pass, ap_lidx *ix, void *arg)
{
	level_arg *la = arg;
	ap_vctx *v = &c->v;

	for (int i = 0; i < la->n; i++) {
		const ap_node *node = &v->g->nodes[c->p->reds[la->idx[i]]];
		ap_lidx r = *ix;

		if (!la->acc[i])
			continue;   /* out of memory: the kernel is marked failed */
		ap_kir_assign(c->k, v->cur, la->acc[i],
			      ap_v_reduce_combine(v, node->op, ap_kir_ref(c->k, la->acc[i]),
						  ap_kir_cast(c->k, la->acc[i]->type, ap_val(v, node->inputs[0], &r))));
	}
}

static void output_body(rows_ctx *c, int pass, ap_lidx *ix, void *arg)
{
	ap_vctx *v = &c->v;
	const ap_graph *g = v->g;

	for (int i = 0; i < g->n_outputs; i++) {
		int o = g->outputs[i];
		ap_lidx r;

		if (c->p->cls[o] == CL_FULL) {
			r = ap_lidx_relin(v, ix, o);
			ap_kir_store(c->k, v->cur, ap_v_buffer(v, o), ap_lidx_linear(v, &r),
				     ap_val(v, o, &r));
		} else if (c->p->cls[o] == CL_FULLT) {
			/* the element of the transposed output: out[d] = in[perm[d]] */
			const ap_node *tn = &g->nodes[g->tensors[o].producer];
			ap_lidx in = *ix, out = ap_lidx_shape(&g->tensors[o]);

			for (int d = 0; d < out.rank; d++) {
				int64_t pd = ap_node_attr_at(tn, "perm", d, out.rank - 1 - d);

				out.c[d] = ap_lidx_coord(v, &in, (int)pd);
			}
			ap_kir_store(c->k, v->cur, ap_v_buffer(v, o), ap_lidx_linear(v, &out),
				     ap_kir_cast(c->k, g->tensors[o].dtype, ap_val(v, tn->inputs[0], &in)));
		}
	}
}

/* Computes, once per row, every row tensor that needs no reduction of a
 * later level than `lv`. */
static void row_values(rows_ctx *c, int lv)
{
	ap_vctx *v = &c->v;
	const ap_graph *g = v->g;

	for (int i = 0; i < g->n_nodes; i++) {
		int o = g->nodes[i].outputs[0];
		ap_lidx r;

		if (o < 0 || c->p->cls[o] != CL_ROW || c->row_val[o] || c->p->level[o] > lv)
			continue;
		if (ap_op_category_of(g->nodes[i].op) == AP_CAT_REDUCTION)
			continue;
		r = row_index(c, o);
		c->row_val[o] = ap_kir_bind(c->k, v->cur, g->tensors[o].dtype, "rv", ap_val(v, o, &r));
	}
}

/* The thread's lane and slot (its row of the block): row form,
 * tid = lane + lanes * slot; column form, tid = slot + rows * lane.
 * wp_count: the warps a row's partials span (combined through shared
 * memory past one).  Sets the kernel's grid and block. */
static void rows_threads(rows_ctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = &c->v;

	k->grid[0] = c->L.grid;
	k->block[0] = c->L.block;
	c->tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	if (c->p->column) {
		c->slot = ap_kir_binary(k, AP_KIR_REM, c->tid, ap_kir_idx(k, c->L.rows));
		c->lane = ap_kir_binary(k, AP_KIR_DIV, c->tid, ap_kir_idx(k, c->L.rows));
		c->wp_count = c->L.block / 32;
	} else {
		c->lane = ap_kir_binary(k, AP_KIR_REM, c->tid, ap_kir_idx(k, c->L.lanes));
		c->slot = ap_kir_binary(k, AP_KIR_DIV, c->tid, ap_kir_idx(k, c->L.lanes));
		c->wp_count = c->L.lanes > 32 ? c->L.lanes / 32 : 1;
	}
	c->lane = ap_kir_bind(k, v->cur, k->index_type, "lane", c->lane);
	c->slot = ap_kir_bind(k, v->cur, k->index_type, "slot", c->slot);
}

/* The arrays: on-chip copies of the row's cached leaves (cache_T:
 * registers, ept elements a thread, or shared memory, rows x N), and,
 * when a row spans several warps, the shared scratch of each reduction
 * (scr_LEVEL_J: one partial per row and warp, the accumulator type).  A
 * failed allocation marks the kernel failed. */
static void rows_arrays(rows_ctx *c)
{
	ap_kir_kernel *k = c->k;
	const ap_graph *g = c->v.g;

	for (int t2 = 0; t2 < g->n_tensors && c->L.cache != CACHE_NONE; t2++) {
		char name[32];

		if (!c->p->cached[t2])
			continue;
		snprintf(name, sizeof(name), "cache_%d", t2);
		c->cache[t2] = c->L.cache == CACHE_REG
				       ? ap_kir_local(k, name, g->tensors[t2].dtype, c->L.ept)
				       : ap_kir_shared(k, name, g->tensors[t2].dtype,
						       (int64_t)c->L.rows * c->p->N);
	}
	for (int lv = 1; lv <= c->p->n_levels; lv++)
		for (int i = 0, j = 0; i < c->p->n_red; i++) {
			char name[32];

			if (c->p->level_of[i] != lv || c->wp_count <= 1)
				continue;
			snprintf(name, sizeof(name), "scr_%d_%d", lv, j++);
			c->scratch[lv - 1][i] = ap_kir_shared(k, name,
							      ap_acc_type(g->tensors[g->nodes[c->p->reds[i]].outputs[0]].dtype),
							      (int64_t)c->L.rows * c->wp_count);
		}
}

/* Opens the grid-stride loop over the block's rows (uniform per block;
 * *saved closes it) and sets the thread's row c->row and c->valid:
 * threads past the last row compute on the last row (never stored), so
 * that no index leaves its tensor. */
static void open_rows(rows_ctx *c, ap_kir_block **saved)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = &c->v;
	ap_kir_var *r0 = ap_v_loop(v, "r", ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), c->L.rows),
				   ap_kir_idx(k, c->p->M), (int64_t)c->L.grid * c->L.rows, saved);
	ap_kir_expr *row = ap_kir_bind(k, v->cur, k->index_type, "rw", ap_kir_add(k, ap_kir_ref(k, r0), c->slot));

	c->valid = ap_kir_binary(k, AP_KIR_LT, row, ap_kir_idx(k, c->p->M));
	c->row = ap_kir_bind(k, v->cur, k->index_type, "row",
			     ap_kir_binary(k, AP_KIR_MIN, row, ap_kir_idx(k, c->p->M - 1)));
}

/* The reductions of level lv: an accumulator each (the accumulator type:
 * float32 for 16-bit), one pass over the row, the partials combined
 * across the row's lanes; their results and the row tensors they allow
 * become row values.  False (the context failed) when out of memory. */
static bool rows_level(rows_ctx *c, int lv)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = &c->v;
	const ap_graph *g = v->g;
	level_arg la;
	ap_op ops[MAX_REDS];
	ap_kir_array *scr[MAX_REDS];

	memset(&la, 0, sizeof(la));
	for (int i = 0; i < c->p->n_red; i++) {
		const ap_node *node = &g->nodes[c->p->reds[i]];
		ap_dtype dt = ap_acc_type(g->tensors[node->outputs[0]].dtype);   /* float32 for 16-bit */

		if (c->p->level_of[i] != lv)
			continue;
		la.idx[la.n] = i;
		la.acc[la.n] = ap_kir_var_new(k, dt, "acc");
		ap_kir_let(k, v->cur, la.acc[la.n], ap_v_reduce_identity(v, node->op, dt));
		ops[la.n] = node->op;
		scr[la.n] = c->wp_count > 1 ? c->scratch[lv - 1][i] : NULL;
		la.n++;
	}
	if (ap_kir_failed(k)) {
		ap_v_fail(v, AP_ENOMEM, NULL, "out of memory");
		return false;
	}
	row_pass(c, lv - 1, level_body, &la);
	row_combine(c, la.acc, ops, la.n, scr, c->wp_count);
	for (int i = 0; i < la.n; i++) {
		int o = g->nodes[c->p->reds[la.idx[i]]].outputs[0];

		c->row_val[o] = ap_kir_cast(k, g->tensors[o].dtype, ap_kir_ref(k, la.acc[i]));
	}
	row_values(c, lv);
	return true;
}

/* The row outputs, written by the first lane of each valid row. */
static void store_row_outputs(rows_ctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = &c->v;
	const ap_graph *g = v->g;
	ap_kir_block *sv;
	bool any = false;

	for (int i = 0; i < g->n_outputs; i++)
		any |= c->p->cls[g->outputs[i]] == CL_ROW;
	if (!any)
		return;
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, c->valid,
				 ap_kir_binary(k, AP_KIR_EQ, c->lane, ap_kir_idx(k, 0))),
		&sv, NULL);
	for (int i = 0; i < g->n_outputs; i++) {
		int o = g->outputs[i];
		ap_lidx r;

		if (c->p->cls[o] != CL_ROW)
			continue;
		r = row_index(c, o);
		ap_kir_store(k, v->cur, ap_v_buffer(v, o), c->row, ap_val(v, o, &r));
	}
	ap_v_close(v, sv);
}

/* The row-group kernel (the file comment): per block row, one pass per
 * level of reductions (rows_level), a pass writing the full outputs, and
 * the row outputs.  Errors: AP_EUNSUPPORTED (not a row group, or a
 * configuration that does not fit), AP_ENOMEM. */
static int rows_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err)
{
	const ap_mgraph *m = b->m;
	const ap_target_info *t = b->t;
	rows_ctx c;
	ap_vctx *v = &c.v;
	const ap_graph *g = m->g;
	ap_kir_block *sv_rows;
	int rc;

	memset(&c, 0, sizeof(c));
	c.p = b->an;
	c.k = k;
	c.L = *(const layout *)pl->x;
	if (!config_ok(c.p, c.L.lanes, c.L.rows, c.L.cache, t))
		return ap_error_set(err, AP_EUNSUPPORTED, g->nodes[m->root].name, NULL,
				    "reduction emitter: configuration lanes=%u rows=%u cache=%d does not fit",
				    c.L.lanes, c.L.rows, c.L.cache);
	if ((rc = ap_vctx_init(v, m, k, err)))
		return rc;
	c.row_val = calloc((size_t)g->n_tensors + 1, sizeof(*c.row_val));
	c.cache = calloc((size_t)g->n_tensors + 1, sizeof(*c.cache));
	if (!c.row_val || !c.cache) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a micro-graph");
		goto out;
	}
	v->leaf = hook;
	v->leaf_user = &c;
	rows_threads(&c);
	rows_arrays(&c);
	open_rows(&c, &sv_rows);
	for (int lv = 1; lv <= c.p->n_levels && !v->rc; lv++)
		if (!rows_level(&c, lv))
			break;
	if (c.p->has_full_out)
		row_pass(&c, c.p->n_levels, output_body, NULL);
	store_row_outputs(&c);
	if (c.L.cache == CACHE_SMEM)
		ap_kir_barrier(k, v->cur);   /* the cache is reused by the next rows */
	ap_v_close(v, sv_rows);
	rc = v->rc;
out:
	free(c.row_val);
	free(c.cache);
	ap_vctx_clear(v);
	return rc;
}

/* Arithmetic of g with every node evaluated once per element of its
 * output (ap__lower_node_flops). */
static double once_flops(const ap_graph *g)
{
	double f = 0;

	for (int i = 0; i < g->n_nodes; i++) {
		const ap_node *n = &g->nodes[i];

		if (n->n_outputs >= 1 && n->outputs[0] >= 0)
			f += ap__lower_node_flops(g, n, (double)ap_tensor_numel(&g->tensors[n->outputs[0]]));
	}
	return f;
}

static int rows_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const ap_mgraph *m = b->m;
	const rows_plan *p = b->an;
	const layout *L = (const layout *)pl->x;
	unsigned lanes = L->lanes, rows = L->rows;
	unsigned wp;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(m, out) < 0)
		return AP_ENOMEM;
	/* the kernel computes each value once per element of its own tensor
	 * (a reduction once per row, its readers take it from a register),
	 * not once per reader's element as the inline model counts */
	out->flops = once_flops(m->g);
	out->threads = L->block;
	wp = p->column ? out->threads / 32 : (lanes > 32 ? lanes / 32 : 1);
	out->blocks = L->grid;
	out->flops *= n_passes(p) > 0 ? n_passes(p) : 1;
	if (L->cache == CACHE_SMEM)
		out->shared_bytes += (unsigned)smem_cache_bytes(p, rows);
	/* each reduction's cross-warp scratch: a partial per row and warp, of
	 * its accumulator type (rows_arrays) */
	for (int r = 0; wp > 1 && r < p->n_red; r++)
		out->shared_bytes += rows * wp *
			(unsigned)ap_dtype_size(ap_acc_type(m->g->tensors[m->g->nodes[p->reds[r]].outputs[0]].dtype));
	out->uncoalesced = p->column && rows < 8;
	return 0;
}

/* ---- recomputation, as this kernel evaluates ---------------------------------------- */

/* One pass over the row for ap_cost_evals: views read through to their
 * source; the pass's roots are evaluated once per element. */
typedef struct pass_view {
	const ap_graph *g;
	const bool *root;
} pass_view;

static int pass_source_of(int t, void *user)
{
	const ap_graph *g = ((pass_view *)user)->g;
	int p;

	while ((p = g->tensors[t].producer) >= 0 && ap_op_is_view(g->nodes[p].op) &&
	       !g->tensors[t].is_output && g->nodes[p].inputs[0] >= 0)
		t = g->nodes[p].inputs[0];
	return t;
}

static bool pass_written(int t, void *user)
{
	return ((pass_view *)user)->root[t];
}

/* The evaluation model of rows_emit: one pass over the row per level of
 * reductions (its roots: those reductions' inputs) and one writing the
 * full outputs (their values; a transposed one's input).  Within a pass
 * the value builder's evaluation counts hold (ap_cost_evals over the
 * nodes computed per element); a reduction's result and every row value
 * are computed once per row and read from a register (as the cost model's
 * flops, rows_traffic, count them), so their readers add nothing to their
 * inputs.  A value evaluated in two passes counts twice.  The ratio:
 * evaluations per element, summed over the passes, of the most evaluated
 * tensor computed per element, among those at least as large as the
 * largest output (smaller ones are broadcast operands, as in the inline
 * model); 1 when none is evaluated more than once.  Not a row group: the
 * inline model. */
static double rows_recompute(const ap_bound *b)
{
	const ap_graph *g = b->m->g;
	const rows_plan *pp = b->an;
	ap_cost_evals_ctx *c = NULL;
	pass_view pv = {g, NULL};
	ap_cost_graph_view gv = {pass_source_of, pass_written, &pv};
	int *nodes = NULL, n = 0;
	bool *root = NULL;
	double *total = NULL, worst = 1;
	int64_t space = 0;

	c = ap_cost_evals_new(g);
	nodes = malloc(((size_t)g->n_nodes + 1) * sizeof(*nodes));
	root = calloc((size_t)g->n_tensors + 1, sizeof(*root));
	total = calloc((size_t)g->n_tensors + 1, sizeof(*total));
	if (!c || !nodes || !root || !total) {
		worst = 0;
		goto out;
	}
	/* the nodes computed per element: neither reductions nor row values
	 * nor the transposes written through their permutation */
	for (int i = 0; i < g->n_nodes; i++) {
		int o = g->nodes[i].outputs[0];

		if (ap_op_category_of(g->nodes[i].op) == AP_CAT_REDUCTION || o < 0 ||
		    pp->cls[o] == CL_ROW || pp->cls[o] == CL_FULLT)
			continue;
		nodes[n++] = i;
	}
	pv.root = root;
	for (int pass = 1; pass <= n_passes(pp); pass++) {
		memset(root, 0, ((size_t)g->n_tensors + 1) * sizeof(*root));
		if (pass <= pp->n_levels) {
			for (int r = 0; r < pp->n_red; r++)
				if (pp->level_of[r] == pass)
					root[pass_source_of(g->nodes[pp->reds[r]].inputs[0], &pv)] = true;
		} else {
			for (int i = 0; i < g->n_outputs; i++) {
				int o = g->outputs[i];

				if (pp->cls[o] == CL_FULL)
					root[o] = true;
				else if (pp->cls[o] == CL_FULLT)
					root[pass_source_of(g->nodes[g->tensors[o].producer].inputs[0], &pv)] = true;
			}
		}
		ap_cost_evals(c, nodes, n, &gv);
		for (int t = 0; t < g->n_tensors; t++)
			total[t] += ap_cost_eval_of(c, t);
	}
	for (int i = 0; i < g->n_outputs; i++)
		if (ap_tensor_numel(&g->tensors[g->outputs[i]]) > space)
			space = ap_tensor_numel(&g->tensors[g->outputs[i]]);
	for (int k = 0; k < n; k++) {
		const ap_node *node = &g->nodes[nodes[k]];
		int t = node->outputs[0];
		int64_t ne = ap_tensor_numel(&g->tensors[t]);

		if (ne <= 0 || ne < space || ap_op_is_view(node->op))
			continue;
		if (total[t] / (double)ne > worst)
			worst = total[t] / (double)ne;
	}
out:
	ap_cost_evals_free(c);
	free(nodes);
	free(root);
	free(total);
	return worst;
}

const ap_emitter ap_emitter_row_reduce = {
	"row_reduce", row_bind, rows_unbind, rows_space, rows_choose, rows_emit, rows_traffic, rows_resolve, false,
	rows_recompute,
};

const ap_emitter ap_emitter_column_reduce = {
	"column_reduce", col_bind, rows_unbind, rows_space, rows_choose, rows_emit, rows_traffic, rows_resolve, false,
	rows_recompute,
};

const ap_emitter ap_emitter_stitched = {
	"stitched", st_bind, rows_unbind, rows_space, rows_choose, rows_emit, rows_traffic, rows_resolve, false,
	rows_recompute,
};
