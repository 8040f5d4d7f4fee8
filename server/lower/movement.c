/* movement.c -- the data-movement emitter: a micro-graph that writes one
 * Concat (with the slices, views, pads, gathers and elementwise ops that
 * feed it).
 *
 * The pointwise emitter computes a concatenation element by element,
 * choosing the operand with a branch per element.  This emitter peels it
 * (the operand-by-operand loop of XLA's concatenate emitter): one
 * grid-stride loop per operand over that operand's own elements, each
 * written at its place in the output -- no branch, and every operand's
 * reads and writes are contiguous runs.  The operand's value comes from
 * the value builder, so whatever feeds it (a slice, a view, elementwise
 * ops) is computed on the way.  When an operand's region is a multiple of
 * `vector` long on the last axis and starts at a multiple of it (always so
 * for a concatenation on another axis), each thread copies `vector`
 * consecutive elements: the operand, when it is a leaf, with one vector
 * load, and the output with one vector store.
 *
 * Knobs: "block" (threads per block), "vector" (1, 2, 4).
 */
#include "emitters.h"

#include <stdlib.h>
#include <string.h>

/* The Concat node writing m's only output, or -1. */
static int concat_root(const ap_mgraph *m)
{
	const ap_graph *g = m->g;
	int o, p;

	if (g->n_outputs != 1)
		return -1;
	o = g->outputs[0];
	p = g->tensors[o].producer;
	if (p < 0 || g->nodes[p].op != AP_OP_CONCAT)
		return -1;
	return p;
}

/* Can every operand region of concatenation node ci be copied w elements
 * at a time? */
static bool regions_allow(const ap_graph *g, int ci, int w)
{
	const ap_node *c = &g->nodes[ci];
	const ap_tensor *o = &g->tensors[c->outputs[0]];
	int64_t axis = ap_node_int(c, "axis", 0), off = 0;

	if (o->rank < 1 || !ap_kir_vector_ok(o->dtype, w) || o->dims[o->rank - 1] % w)
		return false;
	for (int i = 0; i < c->n_inputs; i++) {
		const ap_tensor *x;

		if (c->inputs[i] < 0)
			continue;
		x = &g->tensors[c->inputs[i]];
		if (x->dims[x->rank - 1] % w || (axis == o->rank - 1 && off % w))
			return false;
		off += x->dims[axis];
	}
	return true;
}

/* The analysis: the concatenation, the copy widths its operand regions
 * allow, and its largest operand (the grid covers its copies: the
 * operands are copied one after another). */
typedef struct mv_plan {
	int concat;                      /* the Concat node */
	bool width_ok[5];                /* [w]: copies of w elements, w = 2 or 4 */
	int64_t biggest;                 /* elements of the largest operand (>= 1) */
} mv_plan;

static int mv_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	const ap_graph *g = m->g;
	int c = concat_root(m);
	mv_plan *p;

	(void)t;
	if (c < 0 || ap_node_int(&g->nodes[c], "axis", 0) < 0) {
		snprintf(why, cap, "not a Concat micro-graph with a non-negative axis");
		return 0;
	}
	if (!(p = calloc(1, sizeof(*p))))
		return AP_ENOMEM;
	p->concat = c;
	for (int w = 2; w <= 4; w *= 2)
		p->width_ok[w] = regions_allow(g, c, w);
	p->biggest = 1;
	for (int i = 0; i < g->nodes[c].n_inputs; i++)
		if (g->nodes[c].inputs[i] >= 0 && ap_tensor_numel(&g->tensors[g->nodes[c].inputs[i]]) > p->biggest)
			p->biggest = ap_tensor_numel(&g->tensors[g->nodes[c].inputs[i]]);
	*an = p;
	return 1;
}

static bool width_ok(const mv_plan *p, int w)
{
	return w <= 1 || ((w == 2 || w == 4) && p->width_ok[w]);
}

static int mv_space(const ap_bound *b, ap_space *sp)
{
	sp->n = 2;
	ap_knob_pow2(&sp->knobs[0], "block", 32, ap_block_cap(b->t));
	sp->knobs[1] = (ap_knob){"vector", 1, {1}, false};
	for (int w = 2; w <= 4; w *= 2)
		if (width_ok(b->an, w))
			sp->knobs[1].values[sp->knobs[1].n++] = w;
	return 0;
}

static int mv_choose(const ap_bound *b, const ap_space *sp, ap_sched *s)
{
	int64_t n = ap_tensor_numel(&b->m->g->tensors[b->m->g->outputs[0]]);
	int w = sp->knobs[1].values[sp->knobs[1].n - 1];

	s->v[0] = (int)ap_pow2_at_least(n / w, 32, ap_block_cap(b->t));
	s->v[1] = w;
	return 0;
}

typedef struct mv_hook {
	int leaf;                        /* the operand's tensor when it is a vector-loaded leaf */
	ap_kir_var *lanes[4];
	int lane;
} mv_hook;

static ap_kir_expr *mv_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	mv_hook *h = user;

	return t == h->leaf ? ap_kir_ref(v->k, h->lanes[h->lane]) : NULL;
}

/* The configuration is the plan (block, vector width); it fits where
 * every operand region allows the width. */
static int mv_resolve(const ap_bound *b, const ap_sched *s, ap_plan *out)
{
	(void)out;
	return width_ok(b->an, s->v[1]);
}

static int mv_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err)
{
	const ap_sched *s = &pl->s;
	const ap_mgraph *m = b->m;
	const mv_plan *p = b->an;
	const ap_graph *g = m->g;
	const ap_node *c;
	const ap_tensor *ot;
	unsigned bs = (unsigned)s->v[0], grid;
	int w = s->v[1], rc;
	int64_t axis, off = 0;
	mv_hook h;
	ap_vctx v;

	if (!width_ok(p, w))
		return ap_error_set(err, AP_EUNSUPPORTED, g->nodes[m->root].name, NULL,
				    "movement emitter: not a concatenation copied %d at a time", w);
	c = &g->nodes[p->concat];
	ot = &g->tensors[c->outputs[0]];
	axis = ap_node_int(c, "axis", 0);
	if ((rc = ap_vctx_init(&v, m, k, err)))
		return rc;
	grid = ap_grid_for(p->biggest / w, bs);
	k->grid[0] = grid;
	k->block[0] = bs;
	memset(&h, 0, sizeof(h));
	v.leaf = mv_leaf;
	v.leaf_user = &h;
	for (int i = 0; i < c->n_inputs && !v.rc; i++) {
		int in = c->inputs[i];
		const ap_tensor *xt;
		int64_t n;
		ap_kir_block *saved;
		ap_kir_var *q;
		ap_kir_expr *base, *vals[4];

		if (in < 0)
			continue;
		xt = &g->tensors[in];
		n = ap_tensor_numel(xt);
		if (n <= 0) {
			off += xt->dims[axis];
			continue;
		}
		ap_kir_comment(k, v.cur, "operand %d: %lld elements at offset %lld on axis %lld", i,
			       (long long)n, (long long)off, (long long)axis);
		q = ap_v_loop(&v, "q",
			      ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), bs),
					 ap_kir_index_of(k, AP_KIR_THREAD_X)),
			      ap_kir_idx(k, n / w), (int64_t)grid * bs, &saved);
		base = ap_kir_bind(k, v.cur, k->index_type, "i", ap_kir_muli(k, ap_kir_ref(k, q), w));
		/* an operand read straight from memory: one vector load */
		h.leaf = -1;
		if (w > 1 && xt->producer < 0 && xt->kind != AP_TENSOR_CONST &&
		    ap_kir_vector_ok(xt->dtype, w)) {
			for (int j = 0; j < w; j++)
				h.lanes[j] = ap_kir_var_new(k, xt->dtype, "e");
			ap_kir_vload(k, v.cur, ap_v_buffer(&v, in), base, w, h.lanes);
			h.leaf = in;
		}
		{
			ap_lidx o0 = ap_lidx_shape(ot);

			for (int j = 0; j < w && !v.rc; j++) {
				ap_lidx xi = ap_lidx_shape(xt);

				h.lane = j;
				xi.lin = ap_kir_addi(k, base, j);
				vals[j] = ap_kir_bind(k, v.cur, ot->dtype, "w",
						      ap_kir_cast(k, ot->dtype, ap_val(&v, in, &xi)));
				if (j == 0) {
					/* the output element of the first lane: the
					 * operand's coordinates, shifted on the axis */
					for (int d = 0; d < ot->rank; d++)
						o0.c[d] = d == axis ? ap_kir_addi(k, ap_lidx_coord(&v, &xi, d), off)
								    : ap_lidx_coord(&v, &xi, d);
				}
			}
			if (w == 1)
				ap_kir_store(k, v.cur, ap_v_buffer(&v, c->outputs[0]), ap_lidx_linear(&v, &o0),
					     vals[0]);
			else
				ap_kir_vstore(k, v.cur, ap_v_buffer(&v, c->outputs[0]),
					      ap_lidx_linear(&v, &o0), w, vals);
		}
		ap_v_close(&v, saved);
		off += xt->dims[axis];
	}
	rc = v.rc;
	ap_vctx_clear(&v);
	return rc;
}

static int mv_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const ap_sched *s = &pl->s;
	const mv_plan *p = b->an;

	memset(out, 0, sizeof(*out));
	out->threads = (unsigned)s->v[0];
	out->blocks = ap_grid_for(p->biggest / s->v[1], s->v[0]);   /* mv_emit's grid */
	return ap__lower_inline_traffic(b->m, out);
}

const ap_emitter ap_emitter_movement = {
	"movement", mv_bind, NULL, mv_space, mv_choose, mv_emit, mv_traffic, mv_resolve, false, NULL,
};
