/* subgraph.c -- the graph between micro-graphs (APOLLO, MLSys 2022,
 * section 3: sub-graphs between opaque ops, with the micro-graphs inside
 * them), steps 6 and 7 of partition.c, and its refinement by the paper's
 * upward feedback (a layer below hands a group back).
 *
 * In: the grouping (ap_pctx) and the groups partition.c collected.  Out:
 * a boundary record for every edge between two groups with the reason
 * the merge checks give for it; sub-graphs (groups connected by edges
 * that avoid opaque groups, with strongly connected sets of those merged
 * by Kosaraju's algorithm so that the sub-graphs form a DAG), their
 * dependencies and waves (depths in that DAG).  ap_partition_cut splits a
 * group that a layer below refused into runs of members and records the
 * edges between the pieces.
 */
#include "partition_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- boundaries --------------------------------------------------------------- */

/* Appends the boundary (producer node u, consumer node v, tensor t, reason
 * r, a copy of detail) to part->boundaries, whose capacity *cap grows by
 * doubling.  0 or AP_ENOMEM. */
static int add_boundary(ap_partition *part, int *cap, int u, int v, int t, ap_boundary_reason r,
			const char *detail)
{
	ap_boundary *b;

	if (part->n_boundaries == *cap) {
		int ncap = *cap ? 2 * *cap : 16;
		ap_boundary *nb = realloc(part->boundaries, (size_t)ncap * sizeof(*nb));

		if (!nb)
			return AP_ENOMEM;
		part->boundaries = nb;
		*cap = ncap;
	}
	b = &part->boundaries[part->n_boundaries];
	b->producer = u;
	b->consumer = v;
	b->tensor = t;
	b->reason = r;
	b->detail = ap_strdup(detail);
	if (!b->detail)
		return AP_ENOMEM;
	part->n_boundaries++;
	return 0;
}

/* The reason the edge u -> v (u's group p, v's group q) was kept. */
static ap_boundary_reason edge_reason(ap_pctx *c, int p, int q, char *why, size_t cap)
{
	int kind, r, saved_pass = c->pass;

	c->pass = AP_PARTITION_MAX_PASSES + 1;
	why[0] = 0;
	r = ap__partition_check_merge(c, p, q, &kind, why, cap);
	c->pass = saved_pass;
	if (r < 0) {
		say(why, cap, "rule: no rule applies in the order the merges were made");
		return AP_WHY_RULE;
	}
	/* a cheap producer read elsewhere: say why it was not recomputed here */
	if (c->outputs_failed && ap__partition_recompute_why(c, p, q, why, cap))
		return AP_WHY_RECOMPUTE;
	return (ap_boundary_reason)r;
}

/* qsort order of boundaries: by producer, consumer, tensor. */
static int cmp_bound(const void *a, const void *b)
{
	const ap_boundary *x = a, *y = b;

	if (x->producer != y->producer)
		return (x->producer > y->producer) - (x->producer < y->producer);
	if (x->consumer != y->consumer)
		return (x->consumer > y->consumer) - (x->consumer < y->consumer);
	return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

/* Every edge between two groups, with its reason.  An edge (u, v, t) can
 * repeat only among the inputs of v, so repeats are looked for among the
 * boundaries of v. */
int ap__partition_collect_boundaries(ap_pctx *c, ap_partition *part)
{
	const ap_graph *g = c->g;
	int cap = 0;
	char why[400];

	for (int v = 0; v < c->N; v++) {
		const ap_node *node = &g->nodes[v];
		int first = part->n_boundaries;

		if (!c->live[v] || c->through[v])
			continue;
		for (int i = 0; i < node->n_inputs; i++) {
			int t, u, p, q;
			ap_boundary_reason r;
			bool dupl = false;

			if (node->inputs[i] < 0)
				continue;
			t = source_of(g, c->through, node->inputs[i]);
			u = g->tensors[t].producer;
			if (u < 0 || !c->live[u] || c->through[u])
				continue;
			p = find(c, u);
			q = find(c, v);
			if (p == q)
				continue;
			for (int b = first; b < part->n_boundaries && !dupl; b++)
				if (part->boundaries[b].producer == u && part->boundaries[b].tensor == t)
					dupl = true;
			if (dupl)
				continue;
			r = edge_reason(c, p, q, why, sizeof(why));
			if (add_boundary(part, &cap, u, v, t, r, why) < 0)
				return AP_ENOMEM;
		}
	}
	if (part->n_boundaries > 1)
		qsort(part->boundaries, (size_t)part->n_boundaries, sizeof(ap_boundary), cmp_bound);
	return 0;
}

/* ---- sub-graphs --------------------------------------------------------------- */

/* Sub-graphs: connected groups (edges not touching an opaque group), with
 * strongly connected sets of those components merged (Kosaraju) so that
 * the sub-graphs form a DAG. */
static int find_comp(int *uf, int x)
{
	while (uf[x] != x) {
		uf[x] = uf[uf[x]];
		x = uf[x];
	}
	return x;
}

/* Iterative DFS over CSR (off, adj) from `s`; appends nodes in finishing
 * order to `order` (when not NULL) or labels them `label` in `out`. */
static void dfs(const int *off, const int *adj, int s, bool *seen, int *stack, int *it,
		int *order, int *n_order, int *out, int label)
{
	int sp = 0;

	seen[s] = true;
	stack[sp] = s;
	it[sp++] = off[s];
	if (out)
		out[s] = label;
	while (sp > 0) {
		int v = stack[sp - 1];

		if (it[sp - 1] < off[v + 1]) {
			int w = adj[it[sp - 1]++];

			if (!seen[w]) {
				seen[w] = true;
				if (out)
					out[w] = label;
				stack[sp] = w;
				it[sp++] = off[w];
			}
			continue;
		}
		sp--;
		if (order)
			order[(*n_order)++] = v;
	}
}

typedef struct sub_edge {
	int sub, dep;
} sub_edge;

/* qsort order of sub_edge: by sub-graph, then dependency. */
static int cmp_sub_edge(const void *a, const void *b)
{
	const sub_edge *x = a, *y = b;

	if (x->sub != y->sub)
		return (x->sub > y->sub) - (x->sub < y->sub);
	return (x->dep > y->dep) - (x->dep < y->dep);
}

/* Each sub-graph's deps (ascending, no repeats) from the group edges
 * eu[e] -> ev[e] (ne of them): sorted pairs (sub-graph, dependency). */
static int sub_deps(ap_partition *part, const int *eu, const int *ev, int ne)
{
	sub_edge *se = malloc(((size_t)ne + 1) * sizeof(*se));
	int n = 0;

	if (!se)
		return AP_ENOMEM;
	for (int e = 0; e < ne; e++) {
		int a = part->groups[eu[e]].subgraph, b = part->groups[ev[e]].subgraph;

		if (a != b) {
			se[n].sub = b;
			se[n++].dep = a;
		}
	}
	qsort(se, (size_t)n, sizeof(*se), cmp_sub_edge);
	for (int i = 0, j; i < n; i = j) {
		ap_subgraph *sg = &part->subgraphs[se[i].sub];

		for (j = i; j < n && se[j].sub == se[i].sub; j++)
			;
		sg->deps = malloc((size_t)(j - i) * sizeof(int));
		if (!sg->deps) {
			free(se);
			return AP_ENOMEM;
		}
		for (int k = i; k < j; k++)
			if (k == i || se[k].dep != se[k - 1].dep)
				sg->deps[sg->n_deps++] = se[k].dep;
	}
	free(se);
	return 0;
}

/* What compute_subgraphs works with, for G groups. */
typedef struct condensation {
	int *uf;             /* per group: union-find parent (connected groups) */
	int *comp;           /* per group: its component, 0 .. nc-1 */
	int nc;
	int *eu, *ev;        /* the group edges eu[e] -> ev[e], ne of cap */
	int ne, cap;
	int *off, *adj;      /* the components' graph, CSR */
	int *roff, *radj;    /* ... reversed */
	int *fill, *stack, *it;   /* scratch (CSR fill, dfs) */
	int *order, n_order; /* components in finishing order (forward dfs) */
	int *scc, n_scc;     /* per component: its Kosaraju label, 0 .. n_scc-1 */
	int *num;            /* per label: its sub-graph */
	bool *seen;
} condensation;

/* Every edge between two groups of part (a tensor one writes that the
 * other reads) into k->eu, k->ev, uniting in k->uf the two groups when
 * neither is opaque.  0 or AP_ENOMEM. */
static int group_edges(ap_partition *part, condensation *k)
{
	const ap_partition_priv *pv = part->priv;

	for (int gi = 0; gi < part->n_groups; gi++) {
		const ap_group *grp = &part->groups[gi];

		for (int j = 0; j < grp->n_outputs; j++) {
			int t = grp->outputs[j];

			for (int r = pv->rd_off[t]; r < pv->rd_off[t + 1]; r++) {
				int h = part->group_of[pv->rd[r]];

				if (h < 0 || h == gi)
					continue;
				if (k->ne == k->cap) {
					int ncap = k->cap ? 2 * k->cap : 64;
					int *nu = realloc(k->eu, (size_t)ncap * sizeof(int));
					int *nv;

					if (!nu)
						return AP_ENOMEM;
					k->eu = nu;
					nv = realloc(k->ev, (size_t)ncap * sizeof(int));
					if (!nv)
						return AP_ENOMEM;
					k->ev = nv;
					k->cap = ncap;
				}
				k->eu[k->ne] = gi;
				k->ev[k->ne++] = h;
				if (grp->kind != AP_GROUP_OPAQUE && part->groups[h].kind != AP_GROUP_OPAQUE) {
					int a = find_comp(k->uf, gi), b = find_comp(k->uf, h);

					if (a != b)
						k->uf[b] = a;
				}
			}
		}
	}
	return 0;
}

/* The components of k->uf numbered 0 .. nc-1 (k->comp, per group) and
 * their graph in CSR, forward (off, adj) and reverse (roff, radj), an
 * entry per group edge.  0 or AP_ENOMEM. */
static int component_graph(condensation *k, int G)
{
	for (int i = 0; i < G; i++)
		k->comp[i] = -1;
	for (int i = 0; i < G; i++)
		if (k->comp[find_comp(k->uf, i)] < 0)
			k->comp[find_comp(k->uf, i)] = k->nc++;
	for (int i = 0; i < G; i++)
		k->comp[i] = k->comp[find_comp(k->uf, i)];
	k->adj = malloc(((size_t)k->ne + 1) * sizeof(int));
	k->radj = malloc(((size_t)k->ne + 1) * sizeof(int));
	if (!k->adj || !k->radj)
		return AP_ENOMEM;
	for (int e = 0; e < k->ne; e++) {
		k->off[k->comp[k->eu[e]] + 1]++;
		k->roff[k->comp[k->ev[e]] + 1]++;
	}
	for (int i = 0; i < k->nc; i++) {
		k->off[i + 1] += k->off[i];
		k->roff[i + 1] += k->roff[i];
	}
	for (int e = 0; e < k->ne; e++)
		k->adj[k->off[k->comp[k->eu[e]]] + k->fill[k->comp[k->eu[e]]]++] = k->comp[k->ev[e]];
	memset(k->fill, 0, ((size_t)G + 1) * sizeof(int));
	for (int e = 0; e < k->ne; e++)
		k->radj[k->roff[k->comp[k->ev[e]]] + k->fill[k->comp[k->ev[e]]]++] = k->comp[k->eu[e]];
	return 0;
}

/* Kosaraju: finishing order forward, then labels backward (k->scc); labels
 * come out in a topological order of the condensed graph. */
static void kosaraju(condensation *k, int G)
{
	for (int v = 0; v < k->nc; v++)
		if (!k->seen[v])
			dfs(k->off, k->adj, v, k->seen, k->stack, k->it, k->order, &k->n_order, NULL, 0);
	memset(k->seen, 0, ((size_t)G + 1) * sizeof(bool));
	for (int i = k->n_order - 1; i >= 0; i--)
		if (!k->seen[k->order[i]])
			dfs(k->roff, k->radj, k->order[i], k->seen, k->stack, k->it, NULL, NULL, k->scc,
			    k->n_scc++);
}

/* Sub-graphs numbered by their first group (k->num per label, each group's
 * subgraph), part->subgraphs allocated (zeroed).  0 or AP_ENOMEM. */
static int number_subgraphs(ap_partition *part, condensation *k)
{
	for (int i = 0; i < k->n_scc; i++)
		k->num[i] = -1;
	part->n_subgraphs = 0;
	for (int i = 0; i < part->n_groups; i++) {
		int s = k->scc[k->comp[i]];

		if (k->num[s] < 0)
			k->num[s] = part->n_subgraphs++;
		part->groups[i].subgraph = k->num[s];
	}
	part->subgraphs = calloc((size_t)part->n_subgraphs + 1, sizeof(ap_subgraph));
	if (!part->subgraphs) {
		part->n_subgraphs = 0;
		return AP_ENOMEM;
	}
	return 0;
}

/* Sub-graphs of part's groups (connected by edges that avoid opaque
 * groups, strongly connected sets of those merged), their deps and
 * waves (in the topological order of the Kosaraju labels).  0 or
 * AP_ENOMEM. */
int ap__partition_compute_subgraphs(ap_partition *part)
{
	int G = part->n_groups, rc = AP_ENOMEM;
	condensation k = {0};

	k.uf = malloc(((size_t)G + 1) * sizeof(int));
	k.comp = malloc(((size_t)G + 1) * sizeof(int));
	k.off = calloc((size_t)G + 2, sizeof(int));
	k.roff = calloc((size_t)G + 2, sizeof(int));
	k.fill = calloc((size_t)G + 1, sizeof(int));
	k.stack = malloc(((size_t)G + 1) * sizeof(int));
	k.it = malloc(((size_t)G + 1) * sizeof(int));
	k.order = malloc(((size_t)G + 1) * sizeof(int));
	k.scc = malloc(((size_t)G + 1) * sizeof(int));
	k.num = malloc(((size_t)G + 1) * sizeof(int));
	k.seen = calloc((size_t)G + 1, sizeof(bool));
	if (!k.uf || !k.comp || !k.off || !k.roff || !k.fill || !k.stack || !k.it || !k.order ||
	    !k.scc || !k.num || !k.seen)
		goto out;
	for (int i = 0; i < G; i++)
		k.uf[i] = i;
	if (group_edges(part, &k) < 0 || component_graph(&k, G) < 0)
		goto out;
	kosaraju(&k, G);
	if (number_subgraphs(part, &k) < 0 || sub_deps(part, k.eu, k.ev, k.ne) < 0)
		goto out;
	for (int l = 0; l < k.n_scc; l++) {
		ap_subgraph *sg = &part->subgraphs[k.num[l]];

		for (int d = 0; d < sg->n_deps; d++)
			if (part->subgraphs[sg->deps[d]].wave + 1 > sg->wave)
				sg->wave = part->subgraphs[sg->deps[d]].wave + 1;
	}
	rc = 0;
out:
	free(k.uf);
	free(k.comp);
	free(k.eu);
	free(k.ev);
	free(k.off);
	free(k.roff);
	free(k.adj);
	free(k.radj);
	free(k.fill);
	free(k.stack);
	free(k.it);
	free(k.order);
	free(k.scc);
	free(k.num);
	free(k.seen);
	return rc;
}

/* ---- upward feedback ---------------------------------------------------------- */

/* The pieces of group `old` for a cut: maximal runs of its members (in
 * their order) wholly inside or wholly outside cut[0..n_cut) (node
 * indices; n_cut == 0: the first and second halves).  Piece j is members
 * start[j] .. start[j + 1]; returns the number of pieces k (start has
 * n_nodes + 1 entries, start[k] = n_nodes). */
static int cut_runs(const ap_group *old, const int *cut, int n_cut, int *start)
{
	int n = old->n_nodes, k = 0;
	bool prev = false;

	for (int i = 0; i < n; i++) {
		bool in = false;

		if (n_cut == 0) {
			in = i >= (n + 1) / 2;
		} else {
			for (int j = 0; j < n_cut && !in; j++)
				in = cut[j] == old->nodes[i];
		}
		if (i == 0 || in != prev)
			start[k++] = i;
		prev = in;
	}
	start[k] = n;
	return k;
}

/* Appends a copy of `why` to p->refusals; returns its index or AP_ENOMEM. */
static int add_refusal(ap_partition *p, const char *why)
{
	char **nr = realloc(p->refusals, (size_t)(p->n_refusals + 1) * sizeof(char *));

	if (!nr)
		return AP_ENOMEM;
	p->refusals = nr;
	nr[p->n_refusals] = ap_strdup(why);
	if (!nr[p->n_refusals])
		return AP_ENOMEM;
	return p->n_refusals++;
}

/* Makes room for k - 1 more groups after group gi (zeroed; the later
 * groups move up, p->group_of follows).  0 or AP_ENOMEM. */
static int make_room(ap_partition *p, int gi, int k)
{
	ap_group *ng = realloc(p->groups, (size_t)(p->n_groups + k - 1) * sizeof(*ng));

	if (!ng)
		return AP_ENOMEM;
	p->groups = ng;
	memmove(&p->groups[gi + k], &p->groups[gi + 1],
		(size_t)(p->n_groups - gi - 1) * sizeof(ap_group));
	for (int j = 1; j < k; j++)
		memset(&p->groups[gi + j], 0, sizeof(ap_group));
	p->n_groups += k - 1;
	for (int v = 0; v < p->g->n_nodes; v++)
		if (p->group_of[v] > gi)
			p->group_of[v] += k - 1;
	return 0;
}

/* Groups gi .. gi + k - 1 become the k pieces of group gi (see cut_runs),
 * each with gi's refusal lineage plus refusal rid, its kind from its
 * nodes, and gi's sub-graph: pieces 1..k-1 first, from the old member
 * list, then piece 0 in place.  0 or AP_ENOMEM. */
static int split_pieces(ap_partition *p, int gi, int k, const int *start, int rid)
{
	const ap_group *old = &p->groups[gi];
	int *old_nodes = old->nodes, *old_refs = old->refusals, n_refs = old->n_refusals;

	for (int j = k - 1; j >= 0; j--) {
		ap_group *grp = &p->groups[gi + j];
		int cnt = start[j + 1] - start[j];
		int *nodes = malloc((size_t)cnt * sizeof(int));
		int *refs = malloc(((size_t)n_refs + 1) * sizeof(int));

		if (!nodes || !refs) {
			free(nodes);
			free(refs);
			return AP_ENOMEM;
		}
		memcpy(nodes, old_nodes + start[j], (size_t)cnt * sizeof(int));
		if (n_refs > 0)   /* old_refs is NULL before the first refusal */
			memcpy(refs, old_refs, (size_t)n_refs * sizeof(int));
		refs[n_refs] = rid;
		if (j == 0) {
			free(old_nodes);
			free(old_refs);
		} else {
			grp->subgraph = old->subgraph;
		}
		grp->nodes = nodes;
		grp->n_nodes = cnt;
		grp->refusals = refs;
		grp->n_refusals = n_refs + 1;
		for (int i = 0; i < cnt; i++)
			p->group_of[nodes[i]] = gi + j;
		grp->kind = ap__partition_kind_of_nodes(p->g, nodes, cnt);
	}
	return 0;
}

/* A boundary with reason AP_WHY_REFUSED and detail "refused by WHO: WHY"
 * for every edge into piece j from an earlier piece (groups gi .. gi + k
 * - 1).  0 or AP_ENOMEM. */
static int piece_boundaries(ap_partition *p, int gi, int k, const char *who, const char *why)
{
	const ap_graph *g = p->g;
	int bcap = p->n_boundaries;
	char detail[512];

	snprintf(detail, sizeof(detail), "refused by %s: %s", who ? who : "lowering",
		 why ? why : "");
	for (int j = 1; j < k; j++) {
		const ap_group *grp = &p->groups[gi + j];

		for (int i = 0; i < grp->n_nodes; i++) {
			const ap_node *node = &g->nodes[grp->nodes[i]];

			for (int in = 0; in < node->n_inputs; in++) {
				int t, u;

				if (node->inputs[in] < 0)
					continue;
				t = source_of(g, p->priv->through, node->inputs[in]);
				u = g->tensors[t].producer;
				if (u >= 0 && p->group_of[u] >= gi && p->group_of[u] < gi + j &&
				    add_boundary(p, &bcap, u, grp->nodes[i], t, AP_WHY_REFUSED, detail) < 0)
					return AP_ENOMEM;
			}
		}
	}
	return 0;
}

/* Upward feedback (partition.h): splits group gi where the refusal says,
 * records the refusal and the edges between the pieces.  The pieces or
 * AP_EINVAL, AP_ENOMEM. */
int ap_partition_cut(ap_partition *p, int gi, const int *cut, int n_cut, const char *who,
		     const char *why)
{
	int *start, k, rid, rc = AP_ENOMEM;

	if (gi < 0 || gi >= p->n_groups || p->groups[gi].n_nodes < 2)
		return AP_EINVAL;
	start = malloc(((size_t)p->groups[gi].n_nodes + 1) * sizeof(int));
	if (!start)
		return AP_ENOMEM;
	k = cut_runs(&p->groups[gi], cut, n_cut, start);
	if (k < 2) {
		rc = AP_EINVAL;
		goto out;
	}
	rid = add_refusal(p, why);
	if (rid < 0 || make_room(p, gi, k) < 0 || split_pieces(p, gi, k, start, rid) < 0)
		goto out;
	for (int j = 0; j < k; j++)
		if (ap__partition_fill_group(p, gi + j) < 0)
			goto out;
	if (piece_boundaries(p, gi, k, who, why) < 0)
		goto out;
	rc = k;
out:
	free(start);
	return rc;
}
