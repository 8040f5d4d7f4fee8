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
 * to.
 */
#include "emitters.h"

#include <stdio.h>
#include <string.h>

static bool emap_equal(const ap_emap *a, const ap_emap *b)
{
	if (a->n != b->n)
		return false;
	for (int i = 0; i < a->n; i++) {
		const ap_emap_step *x = &a->s[i], *y = &b->s[i];

		if (x->perm != y->perm || !ap_dims_equal(x->rank, x->dims, y->rank, y->dims))
			return false;
		for (int d = 0; x->perm && d < x->rank; d++)
			if (x->p[d] != y->p[d])
				return false;
	}
	return true;
}

bool ap__epilogue_maps(const ap_graph *g, int y, ap_emap *maps, bool all_outputs, char *why, size_t cap)
{
	maps[y].derived = true;
	for (int i = 0; i < g->n_nodes; i++) {
		const ap_node *n = &g->nodes[i];
		ap_op_category cat = ap_op_category_of(n->op);
		const ap_emap *src = NULL;
		int o = n->outputs[0];

		for (int j = 0; j < n->n_inputs; j++) {
			int x = n->inputs[j];

			if (x < 0 || !maps[x].derived)
				continue;
			if (!ap_dims_equal(g->tensors[x].rank, g->tensors[x].dims, g->tensors[o].rank,
					   g->tensors[o].dims) && !ap_op_is_view(n->op) && n->op != AP_OP_TRANSPOSE) {
				snprintf(why, cap, "%s broadcasts the product", ap_op_name(n->op));
				return false;
			}
			if (src && !emap_equal(src, &maps[x])) {
				snprintf(why, cap, "%s reads the product at two different elements", ap_op_name(n->op));
				return false;
			}
			src = &maps[x];
		}
		if (!src || o < 0)
			continue;
		if (n->n_outputs != 1) {
			snprintf(why, cap, "%s after the product has several outputs", ap_op_name(n->op));
			return false;
		}
		maps[o] = *src;
		if (cat == AP_CAT_ELEMWISE || cat == AP_CAT_BROADCAST)
			continue;
		if (!ap_op_is_view(n->op) && n->op != AP_OP_TRANSPOSE) {
			snprintf(why, cap, "%s after the product", ap_op_name(n->op));
			return false;
		}
		if (maps[o].n == AP_EMAP_STEPS) {
			snprintf(why, cap, "too many views after the product");
			return false;
		}
		{
			ap_emap_step *st = &maps[o].s[maps[o].n++];
			const ap_tensor *ot = &g->tensors[o];

			memset(st, 0, sizeof(*st));
			st->perm = n->op == AP_OP_TRANSPOSE;
			st->rank = ot->rank;
			memcpy(st->dims, ot->dims, sizeof(st->dims));
			for (int d = 0; st->perm && d < ot->rank; d++)
				st->p[d] = (int)ap_node_attr_at(n, "perm", d, ot->rank - 1 - d);
		}
	}
	for (int i = 0; all_outputs && i < g->n_outputs; i++)
		if (!maps[g->outputs[i]].derived) {
			snprintf(why, cap, "it writes %s, which is not computed from the product",
				 g->tensors[g->outputs[i]].name);
			return false;
		}
	return true;
}


void ap__epilogue_store(ap_vctx *v, const ap_emap *maps, ap_lidx y_ix)
{
	const ap_graph *g = v->g;

	for (int i = 0; i < g->n_outputs && !v->rc; i++) {
		int o = g->outputs[i];
		const ap_emap *mp = &maps[o];
		ap_lidx ix = y_ix, val_ix;

		if (!mp->derived)
			continue;
		for (int s = 0; s < mp->n; s++) {
			const ap_emap_step *st = &mp->s[s];
			ap_lidx nx;

			memset(&nx, 0, sizeof(nx));
			nx.rank = st->rank;
			memcpy(nx.dims, st->dims, sizeof(nx.dims));
			if (st->perm) {
				for (int d = 0; d < st->rank; d++)
					nx.c[d] = ap_lidx_coord(v, &ix, st->p[d]);
			} else {
				nx.lin = ap_lidx_linear(v, &ix);
			}
			ix = nx;
		}
		val_ix = ix;
		ap_kir_store(v->k, v->cur, ap_v_buffer(v, o), ap_lidx_linear(v, &ix), ap_val(v, o, &val_ix));
	}
}
