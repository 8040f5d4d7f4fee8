/* partition.c -- sub-graphs and micro-graphs by APOLLO's aggregation rules
 * (MLSys 2022, section 3; see partition.h for the rules and the result):
 * the driver of the partitioner, and its result.
 *
 * In: a primitive, topologically sorted graph.  Out: groups of nodes, each
 * to become one kernel, in an order where producers come first, with the
 * sub-graphs they lie in and a reason for every edge between two groups.
 *
 * Method (the file that does each step in brackets):
 *  1. Liveness: a node is live when one of its outputs is a graph output
 *     or is read by a live node (reverse topological sweep).  [group.c]
 *  2. Views (Reshape, Identity) and Expands of a constant whose output is
 *     not a graph output are "read through": they belong to no group,
 *     every kernel that reads them recomputes them from their input as an
 *     index remap, and every node that reads one is recorded as a reader of
 *     its input too, so data flow between groups is seen through any chain
 *     of them.  [group.c]
 *  3. Every other live node starts as its own group (union-find) with a
 *     kind from its op's category; the primitives of a compound op kept
 *     whole start as one sealed group; a Gemm's transposed operand starts
 *     in its MatMul's group.  [group.c]
 *  4. Merges (check_merge): for every producer -> consumer edge, consumers
 *     in topological order, the consumer's group tries to absorb the
 *     producer's; passes repeat until one merges nothing, so every edge
 *     left between two groups fails some check -- the reason the explain
 *     report gives.  In the first pass a matmul or conv does not yet join
 *     an injective consumer, so that the injective op can first join the
 *     group it feeds (a prologue, which saves its whole output).  The
 *     cycle check searches only between the two groups' places in a
 *     topological order of the group graph that every merge repairs
 *     locally (Pearce and Kelly; see order.c).
 *     Evaluation counts (the cost model's, server/cost) model what the
 *     value builder of the lowering recomputes:
 *     E(t) is how many times the kernel evaluates elements of tensor t
 *     (each written element once, plus what its readers in the group
 *     evaluate times the elements each reads: K for a matmul operand, the
 *     reduced count for a reduction, one for elementwise and index maps).
 *     A matmul or conv must be evaluated once per element; a prologue may
 *     add at most max_recompute evaluations per element.  [group.c runs
 *     the passes, rules.c holds the rules table and the checks, order.c
 *     the topological order]
 *  5. Recompute (level apollo): a cheap group (elementwise, broadcast,
 *     injective, transpose) whose results are read by groups it could not
 *     join is duplicated into those consumers when the modelled bytes go
 *     down: each consumer then reads the group's inputs instead of its
 *     results, and the group's writes (and, once no consumer is left, its
 *     reads) disappear.  Duplication rewrites the graph (clone nodes carry
 *     the original names, clone tensors "NAME~k") and steps 1-5 run again,
 *     until nothing is duplicated.  [recompute.c; the rounds here]
 *  6. Sub-graphs: groups connected by edges that avoid opaque groups,
 *     then strongly connected sets of those merged, so that the sub-graphs
 *     form a DAG; waves are depths in it.  [subgraph.c]
 *  7. Every edge between two groups gets its reason [subgraph.c]; the
 *     groups are ordered topologically (Kahn, smallest node first) and
 *     their members, absorbed views, written and read tensors collected
 *     [here].
 * Upward feedback (ap_partition_cut) is in subgraph.c, the dumps in
 * dump.c; partition_internal.h lists what the files share.
 */
#include "partition_internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_REWRITES 8

/* ---- names -------------------------------------------------------------------- */

const char *ap_fuse_level_name(ap_fuse_level level)
{
	switch (level) {
	case AP_FUSE_NONE: return "none";
	case AP_FUSE_RULES: return "rules";
	default: return "apollo";
	}
}

const char *ap_group_kind_name(ap_group_kind kind)
{
	switch (kind) {
	case AP_GROUP_ELEMWISE: return "elementwise";
	case AP_GROUP_BROADCAST: return "broadcast";
	case AP_GROUP_REDUCTION: return "reduction";
	case AP_GROUP_OPAQUE: return "opaque";
	case AP_GROUP_INJECTIVE: return "injective";
	case AP_GROUP_TRANSPOSE: return "transpose";
	case AP_GROUP_MATMUL: return "matmul";
	case AP_GROUP_CONV: return "conv";
	case AP_GROUP_WHOLE: return "whole";
	case AP_GROUP_STITCHED: return "stitched";
	case AP_GROUP_ATTENTION: return "attention";
	case AP_GROUP_WINDOW: return "window";
	}
	return "?";
}

const char *ap_boundary_reason_key(ap_boundary_reason r)
{
	switch (r) {
	case AP_WHY_LEVEL: return "level";
	case AP_WHY_OPAQUE: return "opaque";
	case AP_WHY_WHOLE: return "keep-whole";
	case AP_WHY_HINT: return "hint";
	case AP_WHY_RULE: return "rule";
	case AP_WHY_SHAPE: return "shape";
	case AP_WHY_RECOMPUTE: return "recompute";
	case AP_WHY_SIZE: return "size-cap";
	case AP_WHY_CYCLE: return "cycle";
	case AP_WHY_REFUSED: return "refused";
	case AP_WHY_STITCH: return "stitch";
	}
	return "rule";
}

/* ---- the result --------------------------------------------------------------- */

/* Frees a group's arrays and zeroes it. */
static void group_clear(ap_group *grp)
{
	free(grp->nodes);
	free(grp->views);
	free(grp->outputs);
	free(grp->inputs);
	free(grp->refusals);
	memset(grp, 0, sizeof(*grp));
}

/* Frees the groups, boundaries, sub-graphs, refusals and the private part
 * (partition.h). */
ap_partition *ap_partition_free(__ap_take ap_partition *p)
{
	if (!p)
		return NULL;
	for (int i = 0; i < p->n_groups; i++)
		group_clear(&p->groups[i]);
	free(p->groups);
	free(p->group_of);
	for (int i = 0; i < p->n_subgraphs; i++)
		free(p->subgraphs[i].deps);
	free(p->subgraphs);
	for (int i = 0; i < p->n_boundaries; i++)
		free(p->boundaries[i].detail);
	free(p->boundaries);
	for (int i = 0; i < p->n_refusals; i++)
		free(p->refusals[i]);
	free(p->refusals);
	if (p->priv) {
		ap_graph_free(p->priv->owned);
		free(p->priv->through);
		free(p->priv->rd_off);
		free(p->priv->rd);
		free(p->priv->tmark);
		free(p->priv->nmark);
		free(p->priv);
	}
	free(p);
	return NULL;
}

/* Root, views, outputs and inputs of group gi from its members (sorted)
 * and part->group_of.  Sets are kept free of repeats by marks (a fresh
 * stamp per call: written and read tensors never coincide, as the ones
 * have their producer inside the group and the others outside). */
int ap__partition_fill_group(ap_partition *part, int gi)
{
	const ap_graph *g = part->g;
	ap_partition_priv *pv = part->priv;
	ap_group *grp = &part->groups[gi];
	int max_out = 0, max_in = 0, max_views = 0, stamp = ++pv->mark_stamp;

	free(grp->views);
	free(grp->outputs);
	free(grp->inputs);
	grp->views = grp->outputs = grp->inputs = NULL;
	grp->n_views = grp->n_outputs = grp->n_inputs = 0;
	grp->root = grp->nodes[grp->n_nodes - 1];
	/* room for the most each set can hold */
	for (int i = 0; i < grp->n_nodes; i++) {
		const ap_node *node = &g->nodes[grp->nodes[i]];

		max_out += node->n_outputs;
		max_in += node->n_inputs;
		for (int in = 0; in < node->n_inputs; in++)
			for (int t = node->inputs[in]; t >= 0; t = view_source_of(g, pv->through, t))
				max_views++;
	}
	if (max_out > 0 && !(grp->outputs = malloc((size_t)max_out * sizeof(int))))
		return AP_ENOMEM;
	if (max_in > 0 && !(grp->inputs = malloc((size_t)max_in * sizeof(int))))
		return AP_ENOMEM;
	if (max_views > 0 && !(grp->views = malloc((size_t)max_views * sizeof(int))))
		return AP_ENOMEM;
	for (int i = 0; i < grp->n_nodes; i++) {
		int m = grp->nodes[i];
		const ap_node *node = &g->nodes[m];
		ap_group_kind nk = ap__partition_node_kind(node);

		if (grp->kind == AP_GROUP_WINDOW ? ap_node_is_window(g, node)
		    : (is_anchor(nk) || nk == AP_GROUP_OPAQUE) && grp->kind != AP_GROUP_WHOLE)
			grp->root = m;
		for (int o = 0; o < node->n_outputs; o++) {
			int t = node->outputs[o];
			bool out;

			if (t < 0)
				continue;
			out = g->tensors[t].is_output;
			for (int r = pv->rd_off[t]; r < pv->rd_off[t + 1] && !out; r++)
				if (part->group_of[pv->rd[r]] != gi)
					out = true;
			if (out && pv->tmark[t] != stamp) {
				pv->tmark[t] = stamp;
				grp->outputs[grp->n_outputs++] = t;
			}
		}
		for (int in = 0; in < node->n_inputs; in++) {
			int t = node->inputs[in];

			/* walk back through read-through views */
			while (t >= 0) {
				int p = g->tensors[t].producer;
				int src = view_source_of(g, pv->through, t);

				if (src >= 0) {
					if (pv->nmark[p] != stamp) {
						pv->nmark[p] = stamp;
						grp->views[grp->n_views++] = p;
					}
					t = src;
					continue;
				}
				if (g->tensors[t].kind != AP_TENSOR_CONST &&
				    (p < 0 || part->group_of[p] != gi) && pv->tmark[t] != stamp) {
					pv->tmark[t] = stamp;
					grp->inputs[grp->n_inputs++] = t;
				}
				break;
			}
		}
	}
	if (grp->n_views > 1)
		qsort(grp->views, (size_t)grp->n_views, sizeof(int), cmp_int);
	return 0;
}

/* Turns the union-find groups of c into part's arrays: groups in a
 * topological order that takes, among the ready groups, the one holding the
 * smallest node (topo_groups). */
static int finish(ap_pctx *c, ap_partition *part, ap_error *err)
{
	int N = c->N, n_roots = 0, n_placed;
	int *roots = malloc(((size_t)N + 1) * sizeof(int));

	if (!roots)
		goto nomem;
	part->group_of = malloc(((size_t)N + 1) * sizeof(int));
	part->priv->tmark = calloc((size_t)c->T + 1, sizeof(int));
	part->priv->nmark = calloc((size_t)N + 1, sizeof(int));
	if (!part->group_of || !part->priv->tmark || !part->priv->nmark)
		goto nomem;
	for (int n = 0; n < N; n++)
		part->group_of[n] = -1;
	n_placed = ap__partition_topo_groups(c, roots, &n_roots);
	part->groups = calloc((size_t)n_roots + 1, sizeof(ap_group));
	if (!part->groups)
		goto nomem;
	for (int gi = 0; gi < n_placed; gi++) {
		ap_group *grp = &part->groups[gi];

		part->n_groups = gi + 1;
		grp->kind = (ap_group_kind)c->kind[roots[gi]];
		grp->n_nodes = ap__partition_members(c, roots[gi], -1);
		grp->nodes = malloc(((size_t)grp->n_nodes + 1) * sizeof(int));
		if (!grp->nodes)
			goto nomem;
		memcpy(grp->nodes, c->list, (size_t)grp->n_nodes * sizeof(int));
		for (int i = 0; i < grp->n_nodes; i++)
			part->group_of[grp->nodes[i]] = gi;
	}
	if (n_placed < n_roots) {
		ap_error_set(err, AP_EINTERNAL, NULL, NULL, "partition: the group graph has a cycle");
		goto fail;
	}
	for (int gi = 0; gi < part->n_groups; gi++)
		if (ap__partition_fill_group(part, gi) < 0)
			goto nomem;
	if (ap__partition_collect_boundaries(c, part) < 0 || ap__partition_compute_subgraphs(part) < 0)
		goto nomem;
	free(roots);
	return 0;
nomem:
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory partitioning the graph");
fail:
	free(roots);
	return err ? err->code : AP_ENOMEM;
}

/* ---- the driver --------------------------------------------------------------- */

/* Rounds of grouping (group.c) and, at level apollo, recompute
 * (recompute.c), each on the graph the last one rewrote, until nothing is
 * duplicated or MAX_REWRITES rounds ran; the last grouping becomes the
 * partition (finish).  See partition.h. */
__ap_give ap_partition *ap_partition_build(__ap_keep const ap_graph *g,
					   const ap_partition_options *opt, ap_error *err)
{
	ap_pctx c;
	ap_partition *part = calloc(1, sizeof(*part));
	ap_graph *owned = NULL;
	const ap_graph *cur = g;
	int n_recomputed = 0, n_dups = 0, rc;

	memset(&c, 0, sizeof(c));
	if (!part || !(part->priv = calloc(1, sizeof(ap_partition_priv)))) {
		free(part);
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory partitioning the graph");
		return NULL;
	}
	for (int round = 0;; round++) {
		int n_dup, n_cloned = 0;
		ap_graph *ng;

		if (ap__partition_group(&c, cur, opt, err) < 0)
			goto fail;
		if (c.level != AP_FUSE_APOLLO || round >= MAX_REWRITES)
			break;
		n_dup = ap__partition_recompute(&c, n_dups, &ng, &n_cloned, err);
		if (n_dup < 0)
			goto fail;
		if (n_dup == 0)
			break;
		n_dups += n_dup;
		n_recomputed += n_cloned;
		ap__partition_ctx_free(&c);
		ap_graph_free(owned);
		owned = ng;
		cur = ng;
	}
	part->g = cur;
	part->level = c.level;
	part->n_recomputed = n_recomputed;
	part->priv->owned = owned;
	owned = NULL;
	/* the partition keeps what fill_group and splitting need */
	part->priv->through = c.through;
	part->priv->rd_off = c.rd_off;
	part->priv->rd = c.rd;
	rc = finish(&c, part, err);
	c.through = NULL;
	c.rd_off = NULL;
	c.rd = NULL;
	ap__partition_ctx_free(&c);
	if (rc < 0)
		return ap_partition_free(part);
	return part;
fail:
	ap_graph_free(owned);
	ap__partition_ctx_free(&c);
	return ap_partition_free(part);
}

/* See partition.h: the CSR the grouping made, which the partition keeps. */
const int *ap_partition_readers(const ap_partition *p, int t, int *n)
{
	const ap_partition_priv *pv = p->priv;

	*n = pv->rd_off[t + 1] - pv->rd_off[t];
	return pv->rd + pv->rd_off[t];
}
