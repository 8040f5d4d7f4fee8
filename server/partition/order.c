/* order.c -- the group graph's topological order, which keeps the
 * partition acyclic cheaply (APOLLO, MLSys 2022, section 3: "every merge
 * keeps the graph acyclic").
 *
 * The merge checks ask, for a producer group p and a consumer group q
 * joined by an edge, whether another path leads from p to q (merging them
 * would then make the group graph cyclic).  Searching all of p's
 * descendants for every check costs time quadratic in the graph, so the
 * partition keeps a topological order of the group graph, c->ord, and
 * bounds the search by it, as in Pearce and Kelly's dynamic topological
 * sort (D. J. Pearce, P. H. J. Kelly, "A dynamic topological sort algorithm
 * for directed acyclic graphs", ACM JEA 11, 2006):
 *   - every group on a path from p to q has a place between ord[p] and
 *     ord[q], so the search from p skips groups placed after q;
 *   - merging p into q (no other path between them) keeps q's place for
 *     the merged group; p's consumers reached by that search, F (all
 *     placed before q), must now follow it.  Pearce-Kelly moves them: B
 *     is the merged group and the groups placed after min ord(F) from
 *     which a path leads into it; B (in its old order) then F (in its old
 *     order) take the places B and F held, sorted.  Only groups of F and B
 *     move, and each keeps the order of its set, so every edge still goes
 *     from a smaller place to a larger one.
 * The places are 0 .. groups-1 at the start, with holes where merged
 * groups were; c->at maps a place back to its root.  The first order (and
 * the final order of the groups, partition.c) is Kahn's, taking among the
 * ready groups the one that holds the smallest node (topo_groups).
 */
#include "partition_internal.h"

#include <assert.h>
#include <stdlib.h>

/* The consumers of group r (roots other than r reading a tensor some member
 * of r writes), each once, into c->succ; returns their count. */
static int successors(ap_pctx *c, int r)
{
	const ap_graph *g = c->g;
	int n = 0;

	c->cur_stamp++;
	for (int m = c->head[r]; m >= 0; m = c->next[m]) {
		const ap_node *node = &g->nodes[m];

		for (int o = 0; o < node->n_outputs; o++) {
			int t = node->outputs[o];

			if (t < 0)
				continue;
			for (int k = c->rd_off[t]; k < c->rd_off[t + 1]; k++) {
				int h = find(c, c->rd[k]);

				if (h != r && c->stamp[h] != c->cur_stamp) {
					c->stamp[h] = c->cur_stamp;
					c->succ[n++] = h;
				}
			}
		}
	}
	return n;
}

/* A binary min-heap of node indices. */
static void heap_push(int *heap, int *n, int v)
{
	int i = (*n)++;

	while (i > 0 && heap[(i - 1) / 2] > v) {
		heap[i] = heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	heap[i] = v;
}

static int heap_pop(int *heap, int *n)
{
	int top = heap[0], v = heap[--(*n)], i = 0;

	for (;;) {
		int k = 2 * i + 1;

		if (k >= *n)
			break;
		if (k + 1 < *n && heap[k + 1] < heap[k])
			k++;
		if (heap[k] >= v)
			break;
		heap[i] = heap[k];
		i = k;
	}
	if (*n > 0)
		heap[i] = v;
	return top;
}

/* The groups (roots with members) in a topological order of the group
 * graph, into `out`: Kahn's algorithm, taking among the ready groups the
 * one that holds the smallest node (a heap keyed by that node).  Returns
 * how many were placed; fewer than there are groups when the group graph
 * has a cycle.  O((groups + edges) log groups) plus O(nodes). */
int ap__partition_topo_groups(ap_pctx *c, int *out, int *n_groups)
{
	int n_roots = 0, n_heap = 0, k = 0;

	for (int n = 0; n < c->N; n++) {
		c->low[n] = -1;
		c->indeg[n] = 0;
	}
	for (int n = 0; n < c->N; n++) {
		int r;

		if (!c->live[n] || c->through[n])
			continue;
		r = find(c, n);
		if (c->low[r] < 0) {
			c->low[r] = n;
			n_roots++;
		}
	}
	for (int r = 0; r < c->N; r++) {
		int ns;

		if (c->head[r] < 0)
			continue;
		ns = successors(c, r);
		for (int i = 0; i < ns; i++)
			c->indeg[c->succ[i]]++;
	}
	for (int r = 0; r < c->N; r++)
		if (c->head[r] >= 0 && c->indeg[r] == 0)
			heap_push(c->heap, &n_heap, c->low[r]);
	while (n_heap > 0) {
		int r = find(c, heap_pop(c->heap, &n_heap)), ns;

		out[k++] = r;
		ns = successors(c, r);
		for (int i = 0; i < ns; i++)
			if (--c->indeg[c->succ[i]] == 0)
				heap_push(c->heap, &n_heap, c->low[c->succ[i]]);
	}
	*n_groups = n_roots;
	return k;
}

/* True when some path leads from group p to group q through another group
 * (c->via gets the last group before q on the first one found).  A
 * depth-first search from p over groups placed before q; when it finds no
 * path, c->fwd holds every group it reached (the set F of merge). */
bool ap__partition_indirect_path(ap_pctx *c, int p, int q)
{
	const ap_graph *g = c->g;
	int sp = 0;

	assert(c->ord[p] < c->ord[q]);
	c->n_fwd = 0;
	c->fwd_p = p;
	c->fwd_q = q;
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
						if (grp != p) {
							c->via = grp;
							c->fwd_p = c->fwd_q = -1;
							return true;
						}
						continue;
					}
					if (c->ord[h] > c->ord[q])
						continue;    /* placed after q: no path back into it */
					c->stamp[h] = c->cur_stamp;
					c->stack[sp++] = h;
					c->fwd[c->n_fwd++] = h;
				}
			}
		}
	}
	return false;
}

/* Puts the roots of `set` (n of them) in the order of their places; `pos`
 * receives those places, ascending. */
static void sort_by_place(ap_pctx *c, int *set, int n, int *pos)
{
	for (int i = 0; i < n; i++)
		pos[i] = c->ord[set[i]];
	qsort(pos, (size_t)n, sizeof(int), cmp_int);
	for (int i = 0; i < n; i++)
		set[i] = c->at[pos[i]];
}

/* Merges producer group p into consumer group q, which passed check_merge
 * (so no path leads from p to q through a third group), by uniting node n
 * (in q) with node u (in p); the merged group keeps root q and its place,
 * and the groups of F and B move as explained above. */
void ap__partition_merge(ap_pctx *c, int p, int q, int n, int u, int kind)
{
	const ap_graph *g = c->g;
	int nb = 0, nf, sp = 0, lb = c->N, i = 0, j = 0;

	if (c->fwd_p != p || c->fwd_q != q)
		ap__partition_indirect_path(c, p, q);     /* F of this edge (check_merge ran it last) */
	ap__partition_unite(c, n, u, kind);
	assert(find(c, n) == q);
	c->at[c->ord[p]] = -1;
	c->fwd_p = c->fwd_q = -1;
	nf = c->n_fwd;
	if (nf == 0)
		return;
	for (int k = 0; k < nf; k++)
		if (c->ord[c->fwd[k]] < lb)
			lb = c->ord[c->fwd[k]];
	/* B: q and the groups placed after lb with a path into q, backwards
	 * over the producers of the members' inputs */
	c->cur_stamp++;
	c->stamp[q] = c->cur_stamp;
	c->bwd[nb++] = q;
	c->stack[sp++] = q;
	while (sp > 0) {
		int grp = c->stack[--sp];

		for (int m = c->head[grp]; m >= 0; m = c->next[m]) {
			const ap_node *node = &g->nodes[m];

			for (int in = 0; in < node->n_inputs; in++) {
				int t, w, h;

				if (node->inputs[in] < 0)
					continue;
				t = source_of(g, c->through, node->inputs[in]);
				w = g->tensors[t].producer;
				if (w < 0)
					continue;
				h = find(c, w);
				if (h == grp || c->stamp[h] == c->cur_stamp || c->ord[h] <= lb)
					continue;
				c->stamp[h] = c->cur_stamp;
				c->stack[sp++] = h;
				c->bwd[nb++] = h;
			}
		}
	}
	/* B then F, each in its old order, over the places they held */
	sort_by_place(c, c->bwd, nb, c->pos);
	sort_by_place(c, c->fwd, nf, c->pos + nb);
	while (i < nb || j < nf) {       /* merge the two sorted place lists */
		if (j >= nf || (i < nb && c->pos[i] < c->pos[nb + j])) {
			c->pool[i + j] = c->pos[i];
			i++;
		} else {
			c->pool[i + j] = c->pos[nb + j];
			j++;
		}
	}
	for (int k = 0; k < nb + nf; k++) {
		int r = k < nb ? c->bwd[k] : c->fwd[k - nb];

		c->ord[r] = c->pool[k];
		c->at[c->pool[k]] = r;
	}
}
