/* epilogue.c -- what the emitters of products (GEMM, convolution,
 * attention) share about their epilogues: the map from an element of the
 * product Y to the element of each output computed from it, and the
 * stores that follow it.
 *
 * An epilogue tensor is computed from Y element for element: elementwise
 * ops and broadcasts whose Y-derived input has the output's shape (other
 * inputs -- a bias, a residual -- are read at that element by the value
 * builder), views (a relinearisation) and transposes (a permutation of
 * the coordinates).  Each derived tensor gets the chain of views and
 * transposes that leads to it from Y (ap_emap); two Y-derived inputs of
 * one node must have the same chain (they are then the same element).
 * The emitter hands the accumulator to the value builder as Y's value (a
 * leaf hook, which may ignore the index: every read of Y is at the current
 * element) and stores each output at the index its chain maps Y's element
 * to.  A Split of a derived tensor sends each element of Y to one of its
 * outputs (a guarded store, AP_EMAP_PART).  A Concat of a derived tensor
 * with tensors of its shape that do not depend on Y (SqueezeNet's fire
 * modules: the expand1x1 convolution concatenated with the expand3x3
 * branch) is written whole by the product's kernel: Y's element stores
 * the derived element and each other input's element at the same index to
 * their places in the output (AP_EMAP_CONCAT), so a product whose output
 * is concatenated keeps its tiled kernel.  An output of Y's shape that
 * does not depend on Y at all (a sibling the partitioner grouped with the
 * product over the same iteration space) is stored at Y's index, its value
 * built from its own inputs.
 */
#include "emitters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool emap_equal(const ap_emap *a, const ap_emap *b)
{
	if (a->n != b->n)
		return false;
	for (int i = 0; i < a->n; i++) {
		const ap_emap_step *x = &a->s[i], *y = &b->s[i];

		if (x->perm != y->perm || !ap_dims_equal(x->rank, x->dims, y->rank, y->dims))
			return false;
		if ((x->perm == AP_EMAP_PART || x->perm == AP_EMAP_CONCAT) &&
		    (x->axis != y->axis || x->start != y->start || x->node != y->node))
			return false;
		for (int d = 0; x->perm == AP_EMAP_TRANSPOSE && d < x->rank; d++)
			if (x->p[d] != y->p[d])
				return false;
	}
	return true;
}

/* Whether Concat node n of g can end a product's epilogue: one input
 * derived from Y (maps), the others of its shape and independent of Y
 * (dep), a valid axis; its place (the start along the axis) to *start. */
static bool concat_of_derived(const ap_graph *g, const ap_node *n, const ap_emap *maps, const bool *dep,
			      int *axis, int64_t *start, char *why, size_t cap)
{
	const ap_tensor *ot = &g->tensors[n->outputs[0]];
	int64_t a = ap_node_int(n, "axis", 0), off = 0;
	int derived = -1;

	if (a < 0)
		a += ot->rank;
	if (a < 0 || a >= ot->rank) {
		snprintf(why, cap, "Concat axis %lld after the product", (long long)a);
		return false;
	}
	for (int j = 0; j < n->n_inputs; j++)
		if (n->inputs[j] >= 0 && maps[n->inputs[j]].derived)
			derived = n->inputs[j];
	for (int j = 0; j < n->n_inputs; j++) {
		int x = n->inputs[j];

		if (x < 0)
			continue;
		if (x == derived) {
			*start = off;
		} else if (dep[x] || !ap_dims_equal(g->tensors[x].rank, g->tensors[x].dims, g->tensors[derived].rank,
						    g->tensors[derived].dims)) {
			snprintf(why, cap, "Concat after the product of %s, %s", g->tensors[x].name,
				 dep[x] ? "which depends on the product" : "not of the product's shape");
			return false;
		}
		off += g->tensors[x].dims[a];
	}
	*axis = (int)a;
	return true;
}

/* Appends to maps[o] (a copy of its source's map) the step node n makes
 * o by.  False with *why when there is no room. */
static bool add_step(const ap_graph *g, const ap_node *n, int o, ap_emap *maps, char *why, size_t cap)
{
	ap_emap_step *st;
	const ap_tensor *ot = &g->tensors[o];

	if (maps[o].n == AP_EMAP_STEPS) {
		snprintf(why, cap, "too many views after the product");
		return false;
	}
	st = &maps[o].s[maps[o].n++];
	memset(st, 0, sizeof(*st));
	st->perm = n->op == AP_OP_TRANSPOSE ? AP_EMAP_TRANSPOSE
		   : n->op == AP_OP_SPLIT   ? AP_EMAP_PART
		   : n->op == AP_OP_CONCAT  ? AP_EMAP_CONCAT
					    : AP_EMAP_VIEW;
	st->node = (int)(n - g->nodes);
	st->rank = ot->rank;
	memcpy(st->dims, ot->dims, sizeof(st->dims));
	for (int d = 0; st->perm == AP_EMAP_TRANSPOSE && d < ot->rank; d++)
		st->p[d] = (int)ap_node_attr_at(n, "perm", d, ot->rank - 1 - d);
	if (st->perm == AP_EMAP_PART) {
		/* this output's place: after the outputs before it (sizes along
		 * the axis, as the value builder reads a Split) */
		int64_t axis = ap_node_int(n, "axis", 0);

		if (axis < 0)
			axis += ot->rank;
		if (axis < 0 || axis >= ot->rank) {
			snprintf(why, cap, "Split axis %lld after the product", (long long)axis);
			return false;
		}
		st->axis = (int)axis;
		for (int k = 0; k < n->n_outputs && n->outputs[k] != o; k++)
			if (n->outputs[k] >= 0)
				st->start += g->tensors[n->outputs[k]].dims[axis];
	}
	return true;
}

int ap__epilogue_maps(const ap_graph *g, int y, ap_emap *maps, bool all_outputs, char *why, size_t cap)
{
	bool *dep = calloc((size_t)g->n_tensors + 1, sizeof(bool));

	if (!dep) {
		snprintf(why, cap, "out of memory");
		return AP_ENOMEM;
	}
	maps[y].derived = true;
	dep[y] = true;
	for (int i = 0; i < g->n_nodes; i++) {
		const ap_node *n = &g->nodes[i];
		ap_op_category cat = ap_op_category_of(n->op);
		const ap_emap *src = NULL;
		bool concat = n->op == AP_OP_CONCAT;
		int axis = 0;
		int64_t start = 0;

		for (int j = 0; j < n->n_inputs; j++)
			if (n->inputs[j] >= 0 && dep[n->inputs[j]])
				for (int k = 0; k < n->n_outputs; k++)
					if (n->outputs[k] >= 0)
						dep[n->outputs[k]] = true;
		if (n->n_outputs < 1 || n->outputs[0] < 0)
			continue;
		for (int j = 0; j < n->n_inputs; j++) {
			int x = n->inputs[j];

			if (x < 0 || !maps[x].derived)
				continue;
			if (maps[x].n > 0 && maps[x].s[maps[x].n - 1].perm == AP_EMAP_CONCAT) {
				snprintf(why, cap, "%s reads a concatenation of the product", ap_op_name(n->op));
				goto no;
			}
			if (!ap_dims_equal(g->tensors[x].rank, g->tensors[x].dims, g->tensors[n->outputs[0]].rank,
					   g->tensors[n->outputs[0]].dims) && !ap_op_is_view(n->op) &&
			    n->op != AP_OP_TRANSPOSE && n->op != AP_OP_SPLIT && !concat) {
				snprintf(why, cap, "%s broadcasts the product", ap_op_name(n->op));
				goto no;
			}
			if (src && !emap_equal(src, &maps[x])) {
				snprintf(why, cap, "%s reads the product at two different elements", ap_op_name(n->op));
				goto no;
			}
			src = &maps[x];
		}
		if (!src)
			continue;
		if (n->n_outputs != 1 && n->op != AP_OP_SPLIT) {
			snprintf(why, cap, "%s after the product has several outputs", ap_op_name(n->op));
			goto no;
		}
		if (cat != AP_CAT_ELEMWISE && cat != AP_CAT_BROADCAST && !ap_op_is_view(n->op) &&
		    n->op != AP_OP_TRANSPOSE && n->op != AP_OP_SPLIT && !concat) {
			snprintf(why, cap, "%s after the product", ap_op_name(n->op));
			goto no;
		}
		if (concat && !concat_of_derived(g, n, maps, dep, &axis, &start, why, cap))
			goto no;
		for (int k = 0; k < n->n_outputs; k++) {
			int o = n->outputs[k];

			if (o < 0)
				continue;
			maps[o] = *src;
			if (cat != AP_CAT_ELEMWISE && cat != AP_CAT_BROADCAST && !add_step(g, n, o, maps, why, cap))
				goto no;
			if (concat) {
				maps[o].s[maps[o].n - 1].axis = axis;
				maps[o].s[maps[o].n - 1].start = start;
			}
		}
	}
	for (int i = 0; i < g->n_outputs; i++) {
		int o = g->outputs[i];

		if (maps[o].derived)
			continue;
		if (all_outputs && !dep[o] && ap_dims_equal(g->tensors[o].rank, g->tensors[o].dims, g->tensors[y].rank,
					     g->tensors[y].dims)) {
			/* beside the product: at Y's index, from its own inputs */
			maps[o].derived = true;
			maps[o].n = 0;
			continue;
		}
		if (all_outputs) {
			snprintf(why, cap, "it writes %s, which is not computed from the product",
				 g->tensors[o].name);
			goto no;
		}
	}
	free(dep);
	return 1;
no:
	free(dep);
	return 0;
}

void ap__epilogue_store(ap_vctx *v, const ap_emap *maps, ap_lidx y_ix)
{
	const ap_graph *g = v->g;

	for (int i = 0; i < g->n_outputs && !v->rc; i++) {
		int o = g->outputs[i];
		const ap_emap *mp = &maps[o];
		ap_lidx ix = y_ix, val_ix;
		ap_kir_expr *in_part = NULL;    /* past a Split: whether Y's element is this part's */
		ap_kir_block *saved = NULL;
		const ap_emap_step *cat = NULL; /* a Concat: the last step, stored below */

		if (!mp->derived)
			continue;
		for (int s = 0; s < mp->n; s++) {
			const ap_emap_step *st = &mp->s[s];
			ap_lidx nx;

			if (st->perm == AP_EMAP_CONCAT) {
				cat = st;
				break;
			}

			memset(&nx, 0, sizeof(nx));
			nx.rank = st->rank;
			memcpy(nx.dims, st->dims, sizeof(nx.dims));
			if (st->perm == AP_EMAP_TRANSPOSE) {
				for (int d = 0; d < st->rank; d++)
					nx.c[d] = ap_lidx_coord(v, &ix, st->p[d]);
			} else if (st->perm == AP_EMAP_PART) {
				ap_kir_expr *a = ap_lidx_coord(v, &ix, st->axis), *ok;

				for (int d = 0; d < st->rank; d++)
					nx.c[d] = d == st->axis ? ap_kir_addi(v->k, a, -st->start) : ap_lidx_coord(v, &ix, d);
				ok = ap_kir_binary(v->k, AP_KIR_LAND,
						   ap_kir_binary(v->k, AP_KIR_GE, a, ap_kir_idx(v->k, st->start)),
						   ap_kir_binary(v->k, AP_KIR_LT, a, ap_kir_idx(v->k, st->start + st->dims[st->axis])));
				in_part = in_part ? ap_kir_binary(v->k, AP_KIR_LAND, in_part, ok) : ok;
			} else {
				nx.lin = ap_lidx_linear(v, &ix);
			}
			ix = nx;
		}
		if (in_part)
			ap_v_if(v, in_part, &saved, NULL);
		if (cat) {
			/* each input's element at ix (the derived one is Y's), at its
			 * place along the axis */
			const ap_node *n = &g->nodes[cat->node];
			int64_t off = 0;

			for (int j = 0; j < n->n_inputs; j++) {
				int x = n->inputs[j];
				ap_lidx at;

				if (x < 0)
					continue;
				memset(&at, 0, sizeof(at));
				at.rank = cat->rank;
				memcpy(at.dims, cat->dims, sizeof(at.dims));
				for (int d = 0; d < cat->rank; d++)
					at.c[d] = d == cat->axis ? ap_kir_addi(v->k, ap_lidx_coord(v, &ix, d), off)
								 : ap_lidx_coord(v, &ix, d);
				val_ix = ix;
				ap_kir_store(v->k, v->cur, ap_v_buffer(v, o), ap_lidx_linear(v, &at), ap_val(v, x, &val_ix));
				off += g->tensors[x].dims[cat->axis];
			}
		} else {
			val_ix = ix;
			ap_kir_store(v->k, v->cur, ap_v_buffer(v, o), ap_lidx_linear(v, &ix), ap_val(v, o, &val_ix));
		}
		if (in_part)
			ap_v_close(v, saved);
	}
}
