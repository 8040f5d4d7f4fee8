/* group.c -- one grouping of one graph (APOLLO, MLSys 2022, section 3:
 * micro-graphs by the aggregation rules), steps 1-4 of partition.c.
 *
 * In: a primitive, topologically sorted graph and the options.  Out: the
 * grouping state (ap_pctx): groups as union-find sets of live nodes, each
 * with a kind, and the readers of every tensor, after merges to a
 * fixpoint.  Liveness first, then the read-through views and the readers
 * seen through them, then one group per node (the primitives of a
 * compound op kept whole sealed into one; a Gemm's transposed operand in
 * its MatMul's group), then passes of merges over every producer ->
 * consumer edge, consumers in topological order, until a pass merges
 * nothing.  Whether an edge merges is rules.c's question; the order the
 * merges keep (and the cycle check) is order.c's.
 */
#include "partition_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- groups as union-find sets ------------------------------------------------ */

/* Unites the groups of nodes a and b: a's root stays the root, takes kind
 * `kind` and b's members appended to its list. */
void ap__partition_unite(ap_pctx *c, int a, int b, int kind)
{
	int ra = find(c, a), rb = find(c, b), m;

	if (ra == rb)
		return;
	c->uf[rb] = ra;
	c->kind[ra] = kind;
	c->size[ra] += c->size[rb];
	m = c->head[ra];
	if (m < 0) {
		c->head[ra] = c->head[rb];
	} else {
		while (c->next[m] >= 0)
			m = c->next[m];
		c->next[m] = c->head[rb];
	}
	c->head[rb] = -1;
}

/* Members of roots a and b (b may be -1) into c->list, ascending; returns
 * the count. */
int ap__partition_members(ap_pctx *c, int a, int b)
{
	int n = 0;
	int roots[2] = {a, b};

	for (int s = 0; s < 2; s++) {
		if (roots[s] < 0)
			continue;
		for (int m = c->head[roots[s]]; m >= 0; m = c->next[m])
			c->list[n++] = m;
	}
	qsort(c->list, (size_t)n, sizeof(int), cmp_int);
	return n;
}

/* ---- the grouping state ------------------------------------------------------- */

/* Sets c up for graph g and the options (NULL: defaults) and allocates
 * its arrays: per node (N + 1), per tensor (T + 1, rd_off T + 2), the cost
 * model's evaluation scratch.  Every allocation is tried; returns false
 * when one failed (ap__partition_ctx_free releases the others). */
static bool ctx_init(ap_pctx *c, const ap_graph *g, const ap_partition_options *opt)
{
	int N = g->n_nodes, T = g->n_tensors;
	ap_fuse_level lv = opt ? opt->level : AP_FUSE_DEFAULT;

	memset(c, 0, sizeof(*c));
	c->g = g;
	c->N = N;
	c->T = T;
	c->level = lv == AP_FUSE_DEFAULT ? AP_FUSE_APOLLO : lv;
	c->max_nodes = opt && opt->max_group_nodes ? opt->max_group_nodes : AP_PARTITION_MAX_GROUP_NODES;
	c->max_recompute = opt && opt->max_recompute ? opt->max_recompute : AP_PARTITION_MAX_RECOMPUTE;
	c->target = opt ? opt->target : NULL;
	c->no_layer1 = opt && opt->no_layer1;
	c->live = calloc((size_t)N + 1, sizeof(bool));
	c->through = calloc((size_t)N + 1, sizeof(bool));
	c->barrier = calloc((size_t)N + 1, sizeof(bool));
	c->whole = calloc((size_t)N + 1, sizeof(int));
	c->rd_off = calloc((size_t)T + 2, sizeof(int));
	c->uf = malloc(((size_t)N + 1) * sizeof(int));
	c->kind = malloc(((size_t)N + 1) * sizeof(int));
	c->head = malloc(((size_t)N + 1) * sizeof(int));
	c->next = malloc(((size_t)N + 1) * sizeof(int));
	c->size = malloc(((size_t)N + 1) * sizeof(int));
	c->stamp = calloc((size_t)N + 1, sizeof(int));
	c->stack = malloc(((size_t)N + 1) * sizeof(int));
	c->mark = calloc((size_t)N + 1, sizeof(int));
	c->evals = ap_cost_evals_new(g);
	c->t_mark = calloc((size_t)T + 1, sizeof(int));
	c->list = malloc(((size_t)N + 1) * sizeof(int));
	c->tmark = calloc((size_t)T + 1, sizeof(int));
	c->slice = malloc(((size_t)N + 1) * sizeof(int));
	c->ord = malloc(((size_t)N + 1) * sizeof(int));
	c->at = malloc(((size_t)N + 1) * sizeof(int));
	c->fwd = malloc(((size_t)N + 1) * sizeof(int));
	c->bwd = malloc(((size_t)N + 1) * sizeof(int));
	c->pos = malloc(((size_t)N + 1) * sizeof(int));
	c->pool = malloc(((size_t)N + 1) * sizeof(int));
	c->low = malloc(((size_t)N + 1) * sizeof(int));
	c->indeg = malloc(((size_t)N + 1) * sizeof(int));
	c->heap = malloc(((size_t)N + 1) * sizeof(int));
	c->succ = malloc(((size_t)N + 1) * sizeof(int));
	c->fwd_p = c->fwd_q = -1;
	return c->live && c->through && c->barrier && c->whole && c->rd_off && c->uf && c->kind &&
	       c->head && c->next && c->size && c->stamp && c->stack && c->mark && c->evals &&
	       c->t_mark && c->list && c->tmark && c->slice && c->ord && c->at && c->fwd && c->bwd &&
	       c->pos && c->pool && c->low && c->indeg && c->heap && c->succ;
}

/* Frees c's arrays (NULL ones too) and zeroes it. */
void ap__partition_ctx_free(ap_pctx *c)
{
	free(c->live);
	free(c->through);
	free(c->barrier);
	free(c->whole);
	free(c->rd_off);
	free(c->rd);
	free(c->uf);
	free(c->kind);
	free(c->head);
	free(c->next);
	free(c->size);
	free(c->stamp);
	free(c->stack);
	free(c->mark);
	ap_cost_evals_free(c->evals);
	free(c->t_mark);
	free(c->list);
	free(c->tmark);
	free(c->slice);
	free(c->ord);
	free(c->at);
	free(c->fwd);
	free(c->bwd);
	free(c->pos);
	free(c->pool);
	free(c->low);
	free(c->indeg);
	free(c->heap);
	free(c->succ);
	memset(c, 0, sizeof(*c));
}

/* ---- steps 1 and 2: liveness, read-through nodes, readers --------------------- */

/* Step 1: c->live, by a reverse topological sweep: a node is live when
 * one of its outputs is a graph output or read by a live node.  `needed`
 * (per tensor, zeroed) is scratch. */
static void liveness(ap_pctx *c, bool *needed)
{
	const ap_graph *g = c->g;

	for (int t = 0; t < c->T; t++)
		needed[t] = g->tensors[t].is_output;
	for (int n = c->N - 1; n >= 0; n--) {
		const ap_node *node = &g->nodes[n];

		for (int o = 0; o < node->n_outputs; o++)
			if (node->outputs[o] >= 0 && needed[node->outputs[o]])
				c->live[n] = true;
		if (!c->live[n])
			continue;
		for (int i = 0; i < node->n_inputs; i++)
			if (node->inputs[i] >= 0)
				needed[node->inputs[i]] = true;
	}
}

/* Per node: its "_whole" id (c->whole), whether opt names it a barrier
 * (c->barrier), and step 2, whether it is read through (c->through): a
 * live view, or a live Expand of a constant, whose one output is not a
 * graph output.  Nodes in topological order, so an Expand sees through
 * the views before it. */
static void node_flags(ap_pctx *c, const ap_partition_options *opt)
{
	const ap_graph *g = c->g;

	for (int n = 0; n < c->N; n++) {
		const ap_node *node = &g->nodes[n];

		c->whole[n] = (int)ap_node_int(node, "_whole", 0);
		for (int b = 0; opt && b < opt->n_barriers; b++)
			if (opt->barriers[b] && strcmp(opt->barriers[b], node->name) == 0)
				c->barrier[n] = true;
		if (!c->live[n] || node->n_outputs != 1 || node->outputs[0] < 0 ||
		    g->tensors[node->outputs[0]].is_output || node->n_inputs < 1 || node->inputs[0] < 0)
			continue;
		if (ap_op_is_view(node->op)) {
			c->through[n] = true;
		} else if (node->op == AP_OP_EXPAND) {
			/* a constant fill: free to recompute wherever it is read */
			int t = source_of(g, c->through, node->inputs[0]);

			c->through[n] = g->tensors[t].kind == AP_TENSOR_CONST;
		}
	}
}

/* The readers of every tensor as CSR (c->rd_off, c->rd): the live nodes
 * not read through that read it, directly or through a chain of
 * read-through views.  Counts in a first pass, fills in a second; `fill`
 * (per tensor, zeroed) is scratch.  0 or AP_ENOMEM. */
static int find_readers(ap_pctx *c, int *fill)
{
	const ap_graph *g = c->g;

	for (int pass = 0; pass < 2; pass++) {
		for (int n = 0; n < c->N; n++) {
			const ap_node *node = &g->nodes[n];

			if (!c->live[n] || c->through[n])
				continue;
			for (int i = 0; i < node->n_inputs; i++) {
				for (int t = node->inputs[i]; t >= 0; t = view_source_of(g, c->through, t)) {
					if (pass == 0)
						c->rd_off[t + 1]++;
					else
						c->rd[c->rd_off[t] + fill[t]++] = n;
				}
			}
		}
		if (pass == 0) {
			for (int t = 0; t < c->T; t++)
				c->rd_off[t + 1] += c->rd_off[t];
			c->rd = malloc(((size_t)c->rd_off[c->T] + 1) * sizeof(int));
			if (!c->rd)
				return AP_ENOMEM;
		}
	}
	return 0;
}

/* ---- step 3: initial groups --------------------------------------------------- */

typedef struct whole_member {
	int id, node;
} whole_member;

/* qsort order of whole_member: by whole id, then node. */
static int cmp_whole(const void *a, const void *b)
{
	const whole_member *x = a, *y = b;

	if (x->id != y->id)
		return (x->id > y->id) - (x->id < y->id);
	return (x->node > y->node) - (x->node < y->node);
}

/* Seals the primitives of each compound op kept whole into one group of
 * kind AP_GROUP_WHOLE, rooted at its first node, the others appended in
 * node order: the members sorted by (whole id, node). */
static int seal_whole(ap_pctx *c)
{
	int n_whole = 0;
	whole_member *w = malloc(((size_t)c->N + 1) * sizeof(*w));

	if (!w)
		return AP_ENOMEM;
	for (int n = 0; n < c->N; n++) {
		if (c->live[n] && !c->through[n] && c->whole[n]) {
			w[n_whole].id = c->whole[n];
			w[n_whole++].node = n;
		}
	}
	qsort(w, (size_t)n_whole, sizeof(*w), cmp_whole);
	for (int i = 0, first = 0; i < n_whole; i++) {
		if (i == 0 || w[i].id != w[i - 1].id) {
			first = w[i].node;
			c->kind[first] = AP_GROUP_WHOLE;
		} else {
			ap__partition_unite(c, first, w[i].node, AP_GROUP_WHOLE);
		}
	}
	free(w);
	return 0;
}

/* A Transpose made by opening a Gemm (transA/transB) and read only by its
 * MatMul is that MatMul's operand layout, at every level: it joins the
 * MatMul's group. */
static void gemm_transposes(ap_pctx *c)
{
	const ap_graph *g = c->g;

	for (int n = 0; n < c->N; n++) {
		const ap_node *node = &g->nodes[n];
		int t = node->outputs[0], reader = -1;
		bool one = true;

		if (!c->live[n] || c->through[n] || node->op != AP_OP_TRANSPOSE || t < 0 ||
		    g->tensors[t].is_output)
			continue;
		for (int i = c->rd_off[t]; i < c->rd_off[t + 1]; i++) {
			if (reader >= 0 && c->rd[i] != reader)
				one = false;
			reader = c->rd[i];
		}
		if (one && reader >= 0 && g->nodes[reader].op == AP_OP_MATMUL &&
		    strcmp(g->nodes[reader].name, node->name) == 0 && !c->whole[n])
			ap__partition_unite(c, reader, n, AP_GROUP_MATMUL);
	}
}

/* Step 3: one group per live node not read through, of its node's kind;
 * a compound op kept whole is one sealed group; a Gemm's transposed
 * operand is in its MatMul's group.  0 or AP_ENOMEM. */
static int initial_groups(ap_pctx *c)
{
	for (int n = 0; n < c->N; n++) {
		c->uf[n] = n;
		c->kind[n] = ap__partition_node_kind(&c->g->nodes[n]);
		c->head[n] = (c->live[n] && !c->through[n]) ? n : -1;
		c->next[n] = -1;
		c->size[n] = 1;
	}
	if (seal_whole(c) < 0)
		return AP_ENOMEM;
	gemm_transposes(c);
	return 0;
}

/* A topological order of the initial groups into c->ord and c->at, which
 * the merges keep (order.c).  False when the groups form a cycle. */
static bool initial_order(ap_pctx *c)
{
	int n_groups, n_placed = ap__partition_topo_groups(c, c->bwd, &n_groups);

	if (n_placed < n_groups)
		return false;
	for (int n = 0; n < c->N; n++)
		c->at[n] = -1;
	for (int k = 0; k < n_placed; k++) {
		c->ord[c->bwd[k]] = k;
		c->at[k] = c->bwd[k];
	}
	return true;
}

/* ---- step 4: merges to a fixpoint --------------------------------------------- */

/* One pass of merges, consumers in topological order.  True if any. */
static bool merge_pass(ap_pctx *c)
{
	const ap_graph *g = c->g;
	bool any = false;

	for (int n = 0; n < c->N; n++) {
		const ap_node *node = &g->nodes[n];

		if (!c->live[n] || c->through[n])
			continue;
		for (int i = 0; i < node->n_inputs; i++) {
			for (int t = node->inputs[i]; t >= 0; t = view_source_of(g, c->through, t)) {
				int u = g->tensors[t].producer, p, q, kind;

				if (u < 0 || !c->live[u] || c->through[u])
					continue;
				p = find(c, u);
				q = find(c, n);
				if (p == q)
					continue;
				/* first pass: an injective consumer waits for its own consumer */
				if (c->pass == 1 && (c->kind[p] == AP_GROUP_MATMUL || c->kind[p] == AP_GROUP_CONV) &&
				    is_inj(c->kind[q]))
					continue;
				if (ap__partition_check_merge(c, p, q, &kind, NULL, 0) < 0) {
					ap__partition_merge(c, p, q, n, u, kind);
					any = true;
				}
			}
		}
	}
	return any;
}

/* Liveness, read-through nodes, readers, initial groups, merges to a
 * fixpoint (steps 1-4 of partition.c).  0, or AP_ENOMEM, AP_EINTERNAL (the
 * initial groups form a cycle) with `err` set. */
int ap__partition_group(ap_pctx *c, const ap_graph *g, const ap_partition_options *opt,
			ap_error *err)
{
	bool ok = ctx_init(c, g, opt);
	bool *needed = calloc((size_t)g->n_tensors + 1, sizeof(bool));
	int *fill = calloc((size_t)g->n_tensors + 1, sizeof(int));
	int rc = 0;

	if (!ok || !needed || !fill)
		goto nomem;
	liveness(c, needed);
	node_flags(c, opt);
	if (find_readers(c, fill) < 0 || initial_groups(c) < 0)
		goto nomem;
	if (!initial_order(c)) {
		rc = ap_error_set(err, AP_EINTERNAL, NULL, NULL, "partition: the group graph has a cycle");
		goto out;
	}
	/* 4. merges to a fixpoint */
	for (c->pass = 1; c->pass <= AP_PARTITION_MAX_PASSES; c->pass++)
		if (!merge_pass(c) && c->pass > 1)
			break;
	goto out;
nomem:
	rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory partitioning the graph");
out:
	free(needed);
	free(fill);
	return rc;
}
