/* partition.c -- fusion groups by APOLLO's aggregation rules (see
 * partition.h for the rules and the result).
 *
 * In: a primitive, topologically sorted graph.  Out: groups of nodes, each
 * to become one kernel, in an order where producers come first.
 *
 * Method:
 *  1. Liveness: a node is live when one of its outputs is a graph output
 *     or is read by a live node (reverse topological sweep).
 *  2. Views (Reshape, Identity) and Expands of a constant (the importer's
 *     constant fills) whose output is not a graph output are "read
 *     through": they belong to no group, every kernel that reads them
 *     recomputes them from their input as an index remap, and every node
 *     that reads one is recorded as a reader of its input too, so data
 *     flow between groups is seen through any chain of them.
 *  3. Every other live node starts as its own group (union-find), with a
 *     kind from its category; a Transpose read only by one MatMul joins it.
 *  4. In topological order, each consumer tries to absorb the groups of its
 *     producers.  A merge P -> C is allowed when the kinds combine by rules
 *     (1)-(5), the merged group's written tensors (those a node outside it
 *     reads, or graph outputs) all have one shape -- or, for a reduction
 *     group, are just the reduction's output -- and no path leads from P to
 *     C through a third group (depth-first search over the group graph).
 *  5. The groups are ordered topologically (Kahn, smallest node first) and
 *     their members, absorbed views, written and read tensors collected.
 */
#include "partition.h"

#include <stdlib.h>
#include <string.h>

typedef struct pctx {
	const ap_graph *g;
	int N, T;
	bool *live;
	bool *through;       /* per node: a view read through */
	int *rd_off, *rd;    /* per tensor: readers (non-through nodes), CSR */
	int *uf;             /* union-find parent per node */
	int *kind;           /* per union-find root */
	int *head, *next;    /* member lists per root */
	int *stamp;          /* DFS marks per root */
	int *stack;
	int cur_stamp;
} pctx;

const char *ap_group_kind_name(ap_group_kind kind)
{
	switch (kind) {
	case AP_GROUP_ELEMWISE: return "elementwise";
	case AP_GROUP_BROADCAST: return "broadcast";
	case AP_GROUP_REDUCTION: return "reduction";
	case AP_GROUP_SINGLE: return "single";
	}
	return "?";
}

static int find(pctx *c, int n)
{
	while (c->uf[n] != n) {
		c->uf[n] = c->uf[c->uf[n]];
		n = c->uf[n];
	}
	return n;
}

static bool same_shape(const ap_tensor *a, const ap_tensor *b)
{
	if (a->rank != b->rank)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (a->dims[i] != b->dims[i])
			return false;
	return true;
}

/* The tensor a node really reads for input `t`: t itself, and each tensor
 * a chain of read-through views leads back to. */
static int view_source(const pctx *c, int t)
{
	const ap_graph *g = c->g;
	int p = g->tensors[t].producer;

	if (p >= 0 && c->through[p] && g->nodes[p].n_inputs > 0 && g->nodes[p].inputs[0] >= 0)
		return g->nodes[p].inputs[0];
	return -1;
}

static ap_group_kind initial_kind(const ap_node *n)
{
	if (ap_op_is_view(n->op))
		return AP_GROUP_ELEMWISE;    /* a copy for a graph output */
	switch (ap_op_category_of(n->op)) {
	case AP_CAT_ELEMWISE: return AP_GROUP_ELEMWISE;
	case AP_CAT_BROADCAST: return AP_GROUP_BROADCAST;
	case AP_CAT_REDUCTION: return AP_GROUP_REDUCTION;
	default: return AP_GROUP_SINGLE;
	}
}

static void unite(pctx *c, int a, int b, int kind)
{
	int ra = find(c, a), rb = find(c, b), m;

	if (ra == rb)
		return;
	c->uf[rb] = ra;
	c->kind[ra] = kind;
	/* append rb's members to ra's list */
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

/* Is tensor t written by the group made of roots p and q (q may be -1)? */
static bool needed_outside(pctx *c, int t, int p, int q)
{
	if (c->g->tensors[t].is_output)
		return true;
	for (int i = c->rd_off[t]; i < c->rd_off[t + 1]; i++) {
		int r = find(c, c->rd[i]);

		if (r != p && r != q)
			return true;
	}
	return false;
}

/* Rule check on the tensors the merged group p+q would write. */
static bool outputs_ok(pctx *c, int p, int q, int kind)
{
	const ap_graph *g = c->g;
	const ap_tensor *first = NULL;
	int roots[2] = {p, q};

	for (int s = 0; s < 2; s++) {
		for (int m = c->head[roots[s]]; m >= 0; m = c->next[m]) {
			const ap_node *node = &g->nodes[m];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o];

				if (t < 0 || !needed_outside(c, t, p, q))
					continue;
				if (kind == AP_GROUP_REDUCTION) {
					if (ap_op_category_of(node->op) != AP_CAT_REDUCTION)
						return false;
					continue;
				}
				if (!first)
					first = &g->tensors[t];
				else if (!same_shape(first, &g->tensors[t]))
					return false;
			}
		}
	}
	return true;
}

/* True when some path leads from group p to group q through another group. */
static bool indirect_path(pctx *c, int p, int q)
{
	const ap_graph *g = c->g;
	int sp = 0;

	c->cur_stamp++;
	c->stamp[p] = c->cur_stamp;
	c->stack[sp++] = p;
	while (sp > 0) {
		int grp = c->stack[--sp];

		for (int m = c->head[grp]; m >= 0; m = c->next[m]) {
			const ap_node *node = &g->nodes[m];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o];

				if (t < 0)
					continue;
				for (int i = c->rd_off[t]; i < c->rd_off[t + 1]; i++) {
					int h = find(c, c->rd[i]);

					if (h == grp || c->stamp[h] == c->cur_stamp)
						continue;
					if (h == q) {
						if (grp != p)
							return true;
						continue;
					}
					c->stamp[h] = c->cur_stamp;
					c->stack[sp++] = h;
				}
			}
		}
	}
	return false;
}

static int merged_kind(int pk, int ck)
{
	if (pk != AP_GROUP_ELEMWISE && pk != AP_GROUP_BROADCAST)
		return -1;
	switch (ck) {
	case AP_GROUP_ELEMWISE:
		return pk;                              /* (1), (2) */
	case AP_GROUP_BROADCAST:
		return AP_GROUP_BROADCAST;              /* (2), (3) */
	case AP_GROUP_REDUCTION:
		return AP_GROUP_REDUCTION;              /* (4), (5) */
	default:
		return -1;
	}
}

static void try_merge(pctx *c, int producer, int consumer)
{
	int p = find(c, producer), q = find(c, consumer);
	int kind;

	if (p == q)
		return;
	kind = merged_kind(c->kind[p], c->kind[q]);
	if (kind < 0)
		return;
	if (!outputs_ok(c, p, q, kind))
		return;
	if (indirect_path(c, p, q))
		return;
	unite(c, q, p, kind);
}

static void ctx_free(pctx *c)
{
	free(c->live);
	free(c->through);
	free(c->rd_off);
	free(c->rd);
	free(c->uf);
	free(c->kind);
	free(c->head);
	free(c->next);
	free(c->stamp);
	free(c->stack);
}

ap_partition *ap_partition_free(__ap_take ap_partition *p)
{
	if (!p)
		return NULL;
	for (int i = 0; i < p->n_groups; i++) {
		free(p->groups[i].nodes);
		free(p->groups[i].views);
		free(p->groups[i].outputs);
		free(p->groups[i].inputs);
	}
	free(p->groups);
	free(p->group_of);
	free(p);
	return NULL;
}

/* Appends v to a set held as an array (linear membership test). */
static int set_add(int **arr, int *n, int v)
{
	int *p;

	for (int i = 0; i < *n; i++)
		if ((*arr)[i] == v)
			return 0;
	p = realloc(*arr, (size_t)(*n + 1) * sizeof(int));
	if (!p)
		return AP_ENOMEM;
	p[(*n)++] = v;
	*arr = p;
	return 0;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return (x > y) - (x < y);
}

/* Collects members (sorted), views, outputs, inputs and root of group gi
 * whose union-find root is r. */
static int fill_group(pctx *c, ap_partition *part, int gi, int r)
{
	const ap_graph *g = c->g;
	ap_group *grp = &part->groups[gi];

	grp->kind = (ap_group_kind)c->kind[r];
	for (int m = c->head[r]; m >= 0; m = c->next[m])
		if (set_add(&grp->nodes, &grp->n_nodes, m) < 0)
			return AP_ENOMEM;
	qsort(grp->nodes, (size_t)grp->n_nodes, sizeof(int), cmp_int);
	grp->root = grp->nodes[grp->n_nodes - 1];
	for (int i = 0; i < grp->n_nodes; i++) {
		int m = grp->nodes[i];
		const ap_node *node = &g->nodes[m];

		part->group_of[m] = gi;
		if (grp->kind == AP_GROUP_REDUCTION && ap_op_category_of(node->op) == AP_CAT_REDUCTION)
			grp->root = m;
		if (grp->kind == AP_GROUP_SINGLE && node->op != AP_OP_TRANSPOSE)
			grp->root = m;
		for (int o = 0; o < node->n_outputs; o++) {
			int t = node->outputs[o];

			if (t >= 0 && needed_outside(c, t, r, -1) &&
			    set_add(&grp->outputs, &grp->n_outputs, t) < 0)
				return AP_ENOMEM;
		}
		for (int in = 0; in < node->n_inputs; in++) {
			int t = node->inputs[in];

			/* walk back through read-through views */
			while (t >= 0) {
				int p = g->tensors[t].producer;
				int src = view_source(c, t);

				if (src >= 0) {
					if (set_add(&grp->views, &grp->n_views, p) < 0)
						return AP_ENOMEM;
					t = src;
					continue;
				}
				if (g->tensors[t].kind != AP_TENSOR_CONST &&
				    (p < 0 || find(c, p) != r) &&
				    set_add(&grp->inputs, &grp->n_inputs, t) < 0)
					return AP_ENOMEM;
				break;
			}
		}
	}
	return 0;
}

__ap_give ap_partition *ap_partition_build(__ap_keep const ap_graph *g, ap_error *err)
{
	pctx c;
	ap_partition *part = NULL;
	int N = g->n_nodes, T = g->n_tensors, n_rd = 0;
	int *root_group = NULL, *indeg = NULL, *order = NULL, *fill = NULL;
	bool *needed = NULL;

	memset(&c, 0, sizeof(c));
	c.g = g;
	c.N = N;
	c.T = T;
	c.live = calloc((size_t)N + 1, sizeof(bool));
	c.through = calloc((size_t)N + 1, sizeof(bool));
	c.rd_off = calloc((size_t)T + 2, sizeof(int));
	c.uf = malloc(((size_t)N + 1) * sizeof(int));
	c.kind = malloc(((size_t)N + 1) * sizeof(int));
	c.head = malloc(((size_t)N + 1) * sizeof(int));
	c.next = malloc(((size_t)N + 1) * sizeof(int));
	c.stamp = calloc((size_t)N + 1, sizeof(int));
	c.stack = malloc(((size_t)N + 1) * sizeof(int));
	part = calloc(1, sizeof(*part));
	if (!c.live || !c.through || !c.rd_off || !c.uf || !c.kind || !c.head || !c.next ||
	    !c.stamp || !c.stack || !part)
		goto nomem;
	part->g = g;
	part->group_of = malloc(((size_t)N + 1) * sizeof(int));
	if (!part->group_of)
		goto nomem;

	/* 1. liveness: reverse sweep with a per-tensor "needed" mark */
	needed = calloc((size_t)T + 1, sizeof(bool));
	if (!needed)
		goto nomem;
	for (int t = 0; t < T; t++)
		needed[t] = g->tensors[t].is_output;
	for (int n = N - 1; n >= 0; n--) {
		const ap_node *node = &g->nodes[n];

		for (int o = 0; o < node->n_outputs; o++)
			if (node->outputs[o] >= 0 && needed[node->outputs[o]])
				c.live[n] = true;
		if (!c.live[n])
			continue;
		for (int i = 0; i < node->n_inputs; i++)
			if (node->inputs[i] >= 0)
				needed[node->inputs[i]] = true;
	}
	/* 2. read-through views, and readers of each tensor through them */
	for (int n = 0; n < N; n++) {
		const ap_node *node = &g->nodes[n];

		if (!c.live[n] || node->n_outputs != 1 || node->outputs[0] < 0 ||
		    g->tensors[node->outputs[0]].is_output || node->n_inputs < 1 || node->inputs[0] < 0)
			continue;
		if (ap_op_is_view(node->op)) {
			c.through[n] = true;
		} else if (node->op == AP_OP_EXPAND) {
			/* a constant fill: free to recompute wherever it is read */
			int t = node->inputs[0];

			while (view_source(&c, t) >= 0)
				t = view_source(&c, t);
			c.through[n] = g->tensors[t].kind == AP_TENSOR_CONST;
		}
	}
	for (int pass = 0; pass < 2; pass++) {
		for (int n = 0; n < N; n++) {
			const ap_node *node = &g->nodes[n];

			if (!c.live[n] || c.through[n])
				continue;
			for (int i = 0; i < node->n_inputs; i++) {
				for (int t = node->inputs[i]; t >= 0; t = view_source(&c, t)) {
					if (pass == 0) {
						c.rd_off[t + 1]++;
					} else {
						c.rd[c.rd_off[t] + fill[t]++] = n;
					}
				}
			}
		}
		if (pass == 0) {
			for (int t = 0; t < T; t++)
				c.rd_off[t + 1] += c.rd_off[t];
			n_rd = c.rd_off[T];
			c.rd = malloc(((size_t)n_rd + 1) * sizeof(int));
			fill = calloc((size_t)T + 1, sizeof(int));
			if (!c.rd || !fill)
				goto nomem;
		}
	}

	/* 3. initial groups */
	for (int n = 0; n < N; n++) {
		c.uf[n] = n;
		c.kind[n] = initial_kind(&g->nodes[n]);
		c.head[n] = (c.live[n] && !c.through[n]) ? n : -1;
		c.next[n] = -1;
	}
	for (int n = 0; n < N; n++) {
		const ap_node *node = &g->nodes[n];
		int t, reader = -1;
		bool one = true;

		if (!c.live[n] || c.through[n] || node->op != AP_OP_TRANSPOSE)
			continue;
		t = node->outputs[0];
		if (t < 0 || g->tensors[t].is_output)
			continue;
		for (int i = c.rd_off[t]; i < c.rd_off[t + 1]; i++) {
			if (reader >= 0 && c.rd[i] != reader)
				one = false;
			reader = c.rd[i];
		}
		if (one && reader >= 0 && g->nodes[reader].op == AP_OP_MATMUL)
			unite(&c, reader, n, AP_GROUP_SINGLE);
	}

	/* 4. merges, consumers in topological order */
	for (int n = 0; n < N; n++) {
		const ap_node *node = &g->nodes[n];

		if (!c.live[n] || c.through[n])
			continue;
		for (int i = 0; i < node->n_inputs; i++) {
			for (int t = node->inputs[i]; t >= 0; t = view_source(&c, t)) {
				int p = g->tensors[t].producer;

				if (p >= 0 && c.live[p] && !c.through[p])
					try_merge(&c, p, n);
			}
		}
	}

	/* 5. groups in topological order */
	root_group = malloc(((size_t)N + 1) * sizeof(int));
	indeg = calloc((size_t)N + 1, sizeof(int));
	order = malloc(((size_t)N + 1) * sizeof(int));
	if (!root_group || !indeg || !order)
		goto nomem;
	for (int n = 0; n < N; n++) {
		root_group[n] = -1;
		part->group_of[n] = -1;
	}
	/* in-degrees over distinct group edges (counted with a stamp per source) */
	{
		int n_roots = 0;

		for (int n = 0; n < N; n++)
			if (c.head[n] >= 0 && find(&c, n) == n)
				order[n_roots++] = n;
		for (int i = 0; i < n_roots; i++) {
			int r = order[i];

			c.cur_stamp++;
			for (int m = c.head[r]; m >= 0; m = c.next[m]) {
				const ap_node *node = &g->nodes[m];

				for (int o = 0; o < node->n_outputs; o++) {
					int t = node->outputs[o];

					if (t < 0)
						continue;
					for (int k = c.rd_off[t]; k < c.rd_off[t + 1]; k++) {
						int h = find(&c, c.rd[k]);

						if (h != r && c.stamp[h] != c.cur_stamp) {
							c.stamp[h] = c.cur_stamp;
							indeg[h]++;
						}
					}
				}
			}
		}
		part->groups = calloc((size_t)n_roots + 1, sizeof(ap_group));
		if (!part->groups)
			goto nomem;
		/* Kahn: repeatedly take the ready group holding the smallest node */
		for (int gi = 0; gi < n_roots; gi++) {
			int pick = -1;

			for (int n = 0; n < N && pick < 0; n++) {
				int r;

				if (c.head[find(&c, n)] < 0 || !c.live[n] || c.through[n])
					continue;
				r = find(&c, n);
				if (root_group[r] < 0 && indeg[r] == 0)
					pick = r;
			}
			if (pick < 0) {
				ap_error_set(err, AP_EINTERNAL, NULL, NULL,
					     "partition: the group graph has a cycle");
				goto fail;
			}
			root_group[pick] = gi;
			part->n_groups = gi + 1;
			if (fill_group(&c, part, gi, pick) < 0)
				goto nomem;
			c.cur_stamp++;
			for (int m = c.head[pick]; m >= 0; m = c.next[m]) {
				const ap_node *node = &g->nodes[m];

				for (int o = 0; o < node->n_outputs; o++) {
					int t = node->outputs[o];

					if (t < 0)
						continue;
					for (int k = c.rd_off[t]; k < c.rd_off[t + 1]; k++) {
						int h = find(&c, c.rd[k]);

						if (h != pick && c.stamp[h] != c.cur_stamp) {
							c.stamp[h] = c.cur_stamp;
							indeg[h]--;
						}
					}
				}
			}
		}
	}
	free(root_group);
	free(indeg);
	free(order);
	free(fill);
	free(needed);
	ctx_free(&c);
	return part;
nomem:
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory partitioning the graph");
fail:
	free(root_group);
	free(indeg);
	free(order);
	free(fill);
	free(needed);
	ctx_free(&c);
	return ap_partition_free(part);
}

static void dump_tensor(FILE *f, const ap_graph *g, int t)
{
	const ap_tensor *x = &g->tensors[t];

	fprintf(f, "%s:%s[", x->name, ap_dtype_name(x->dtype));
	for (int i = 0; i < x->rank; i++)
		fprintf(f, "%s%lld", i ? "," : "", (long long)x->dims[i]);
	fprintf(f, "]");
}

int ap_partition_dump(const ap_partition *p, FILE *f)
{
	const ap_graph *g = p->g;

	for (int i = 0; i < p->n_groups; i++) {
		const ap_group *grp = &p->groups[i];

		fprintf(f, "group %d %s root=%s(%s) nodes=[", i, ap_group_kind_name(grp->kind),
			ap_op_name(g->nodes[grp->root].op), g->nodes[grp->root].name);
		for (int j = 0; j < grp->n_nodes; j++)
			fprintf(f, "%s%s(%s)", j ? " " : "", ap_op_name(g->nodes[grp->nodes[j]].op),
				g->nodes[grp->nodes[j]].name);
		fprintf(f, "] views=[");
		for (int j = 0; j < grp->n_views; j++)
			fprintf(f, "%s%s(%s)", j ? " " : "", ap_op_name(g->nodes[grp->views[j]].op),
				g->nodes[grp->views[j]].name);
		fprintf(f, "] out=[");
		for (int j = 0; j < grp->n_outputs; j++) {
			fprintf(f, "%s", j ? " " : "");
			dump_tensor(f, g, grp->outputs[j]);
		}
		fprintf(f, "] in=[");
		for (int j = 0; j < grp->n_inputs; j++) {
			fprintf(f, "%s", j ? " " : "");
			dump_tensor(f, g, grp->inputs[j]);
		}
		fprintf(f, "]\n");
	}
	return ferror(f) ? AP_EIO : 0;
}
