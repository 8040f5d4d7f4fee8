/* stitch.c -- Layer II, memory stitching (APOLLO section 4.2; see fuse.h).
 *
 * The partition ends every micro-graph at a reduction (rule: "a reduction
 * ends its micro-graph"), so Softmax becomes max | sum | normalise and
 * LayerNorm mean | variance | normalise, each reading the row again from
 * global memory.  Memory stitching joins a reduction micro-graph with the
 * micro-graphs that consume its rows -- elementwise and broadcast ones,
 * and further reductions over the same rows -- into one micro-graph that
 * the stitched-reduction emitter (server/lower/rows.c) builds as one
 * kernel keeping each row on chip.
 *
 * Method, over the micro-graphs in topological order (the partition's
 * group order):
 *   1. for each reduction micro-graph not yet stitched, a candidate set C
 *      starts with it;
 *   2. candidates are tried in increasing position: the consumer
 *      micro-graphs of C (readers of a tensor C writes) and its cheap
 *      producers (the micro-graphs C reads: a sibling reduction over the
 *      same rows, as E[x^2] beside E[x], or the scaling that turns a sum
 *      into a mean) -- elementwise, broadcast and reduction ones, and
 *      transposes of the result -- unless a refusal excluded them
 *      (no_stitch);
 *   3. adding candidate Q keeps the micro-graph graph acyclic unless a
 *      path leads from C to Q, or from Q to C, through a micro-graph
 *      outside both; each direction is searched forward among the
 *      micro-graphs positioned before the target (positions rise along
 *      every path), within a budget (past it, Q is not added);
 *   4. the union is extracted and asked to the emitter
 *      (ap_lower_stitchable): its reductions must reduce the same rows,
 *      what follows them must be per element or per row, and a row must
 *      fit in registers or shared memory of the target.  A consumer that
 *      would fit but for the row size gets the boundary reason "stitch";
 *      a refused candidate is asked once more together with the
 *      reductions it reads that are in no set yet (BatchNorm's mean,
 *      re-read by the variance's pass: without its reduction it would be
 *      a value the kernel computes before every reduction and cannot
 *      write);
 *   5. a set of two or more becomes one stitched micro-graph; afterwards
 *      the list is sorted topologically again (Kahn's algorithm, ties by
 *      first position), since a stitched micro-graph takes the place of
 *      parts that were spread over the order.
 * Work is linear in the micro-graphs and their edges, plus the bounded
 * searches.
 */
#include "fuse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lower/lower.h"

#define SEARCH_BUDGET 4096

typedef struct sctx {
	ap_partition *p;
	ap_mgraph **ms;
	int n;
	const ap_target_info *t;
	const bool *no_stitch;
	int *unit_of_group;          /* per partition group: its micro-graph (index in ms) */
	int *set_of;                 /* per micro-graph: its stitched set (root index), -1 */
	int *set_next;               /* per micro-graph: next member of its set, -1 */
	int *succ_off, *succ;        /* micro-graph successors, CSR, ascending */
	int *pred_off, *pred;        /* micro-graph predecessors, CSR */
	int *mark;                   /* scratch stamps per micro-graph */
	int stamp;
	int *stack;
	int *tried;                  /* per micro-graph: the grow (1 + root) that tried it */
	int *node_seen;              /* per program node: the union stamp that took it */
	int node_stamp;
} sctx;

/* ---- the micro-graph graph --------------------------------------------------------- */

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return (x > y) - (x < y);
}

/* Successors of every micro-graph (the micro-graphs reading a tensor it
 * writes), de-duplicated and ascending. */
static int build_successors(sctx *c)
{
	int total = 0, *cnt = calloc((size_t)c->n + 1, sizeof(int));

	if (!cnt)
		return AP_ENOMEM;
	c->succ_off = calloc((size_t)c->n + 2, sizeof(int));
	if (!c->succ_off) {
		free(cnt);
		return AP_ENOMEM;
	}
	for (int pass = 0; pass < 2; pass++) {
		for (int u = 0; u < c->n; u++) {
			const ap_mgraph *m = c->ms[u];

			c->stamp++;
			for (int i = 0; i < m->g->n_outputs; i++) {
				int t = m->tensor_of[m->g->outputs[i]], nr;
				const int *rd = ap_partition_readers(c->p, t, &nr);

				for (int r = 0; r < nr; r++) {
					int gi = c->p->group_of[rd[r]], v;

					if (gi < 0 || (v = c->unit_of_group[gi]) == u || c->mark[v] == c->stamp)
						continue;
					c->mark[v] = c->stamp;
					if (pass == 0)
						cnt[u]++;
					else
						c->succ[c->succ_off[u] + cnt[u]++] = v;
				}
			}
		}
		if (pass == 0) {
			for (int u = 0; u < c->n; u++) {
				c->succ_off[u + 1] = c->succ_off[u] + cnt[u];
				total += cnt[u];
				cnt[u] = 0;
			}
			c->succ = malloc(((size_t)total + 1) * sizeof(int));
			if (!c->succ) {
				free(cnt);
				return AP_ENOMEM;
			}
		}
	}
	for (int u = 0; u < c->n; u++)
		qsort(c->succ + c->succ_off[u], (size_t)(c->succ_off[u + 1] - c->succ_off[u]),
		      sizeof(int), cmp_int);
	/* predecessors: the same edges reversed */
	c->pred_off = calloc((size_t)c->n + 2, sizeof(int));
	c->pred = malloc(((size_t)total + 1) * sizeof(int));
	if (!c->pred_off || !c->pred) {
		free(cnt);
		return AP_ENOMEM;
	}
	for (int u = 0; u < c->n; u++)
		for (int e = c->succ_off[u]; e < c->succ_off[u + 1]; e++)
			c->pred_off[c->succ[e] + 1]++;
	for (int u = 0; u < c->n; u++) {
		c->pred_off[u + 1] += c->pred_off[u];
		cnt[u] = 0;
	}
	for (int u = 0; u < c->n; u++)
		for (int e = c->succ_off[u]; e < c->succ_off[u + 1]; e++) {
			int v = c->succ[e];

			c->pred[c->pred_off[v] + cnt[v]++] = u;
		}
	free(cnt);
	return 0;
}

/* Pushes micro-graph v (positioned before `bound`) for the search, and,
 * when an earlier stitch made it part of a set, every member of that set
 * before `bound`: a stitched set is one node, whatever reaches one member
 * reaches all. */
static void push(sctx *c, int v, int bound, int *sp)
{
	if (v > bound || c->mark[v] == c->stamp)
		return;
	c->mark[v] = c->stamp;
	c->stack[(*sp)++] = v;
	if (c->set_of[v] >= 0)
		for (int w = c->set_of[v]; w >= 0; w = c->set_next[w])
			push(c, w, bound, sp);
}

/* Does a path lead from one of `from` (n_from micro-graphs) to one of `to`
 * (n_to) through micro-graphs outside both?  Only micro-graphs positioned
 * before the last target are searched (positions rise along every path);
 * past the budget the answer is yes, the safe one. */
static bool path_outside(sctx *c, const int *from, int n_from, const int *to, int n_to)
{
	int sp = 0, visited = 0, bound = -1;

	c->stamp++;
	for (int i = 0; i < n_to; i++)
		if (to[i] > bound)
			bound = to[i];
	for (int i = 0; i < n_from; i++)
		c->mark[from[i]] = c->stamp;
	for (int i = 0; i < n_to; i++)
		c->mark[to[i]] = c->stamp;   /* targets are not walked through */
	for (int i = 0; i < n_from; i++)
		for (int e = c->succ_off[from[i]]; e < c->succ_off[from[i] + 1]; e++)
			push(c, c->succ[e], bound, &sp);
	while (sp > 0) {
		int x = c->stack[--sp];

		if (++visited > SEARCH_BUDGET)
			return true;
		for (int e = c->succ_off[x]; e < c->succ_off[x + 1]; e++) {
			int v = c->succ[e];

			for (int i = 0; i < n_to; i++)
				if (v == to[i])
					return true;
			push(c, v, bound, &sp);
		}
	}
	return false;
}

/* Would adding q to the stitched set (n members) close a cycle?  The set
 * is acyclic as it is; a new cycle passes through q: a path from the set
 * to q, or from q to the set, through a micro-graph outside. */
static bool closes_cycle(sctx *c, const int *set, int n, int q)
{
	return path_outside(c, set, n, &q, 1) || path_outside(c, &q, 1, set, n);
}

/* ---- unions ------------------------------------------------------------------------ */

static bool in_set(const int *set, int n, int u)
{
	for (int i = 0; i < n; i++)
		if (set[i] == u)
			return true;
	return false;
}

/* The micro-graph of the union of micro-graphs set[0..n), writing what is
 * read outside the union or is a graph output.  NULL on ENOMEM (err set)
 * or an extraction failure. */
static ap_mgraph *extract_union(sctx *c, const int *set, int n, ap_error *err)
{
	const ap_graph *pg = c->p->g;
	int total = 0, k = 0, n_out = 0, n_groups = 0, root = -1;
	int *nodes, *outs, *groups;
	bool *member;
	ap_mgraph *m = NULL;

	for (int i = 0; i < n; i++) {
		total += c->ms[set[i]]->g->n_nodes;
		n_groups += c->ms[set[i]]->n_groups;
	}
	nodes = malloc(((size_t)total + 1) * sizeof(int));
	member = malloc(((size_t)total + 1) * sizeof(bool));
	outs = malloc(((size_t)total + 1) * sizeof(int) * 4);
	groups = malloc(((size_t)n_groups + 1) * sizeof(int));
	c->node_stamp++;
	if (!nodes || !member || !outs || !groups) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory stitching micro-graphs");
		goto out;
	}
	n_groups = 0;
	for (int i = 0; i < n; i++) {
		const ap_mgraph *pm = c->ms[set[i]];

		for (int j = 0; j < pm->n_groups; j++)
			groups[n_groups++] = pm->groups[j];
		for (int j = 0; j < pm->g->n_nodes; j++) {
			int v = pm->node_of[j];

			if (c->node_seen[v] == c->node_stamp) {
				/* a view both read through: a member wins */
				if (pm->member[j])
					for (int q = 0; q < k; q++)
						if (nodes[q] == v)
							member[q] = true;
				continue;
			}
			c->node_seen[v] = c->node_stamp;
			nodes[k] = v;
			member[k++] = pm->member[j];
		}
		for (int j = 0; j < pm->g->n_outputs; j++) {
			int t = pm->tensor_of[pm->g->outputs[j]], nr;
			const int *rd = ap_partition_readers(c->p, t, &nr);
			bool keep = pg->tensors[t].is_output;

			for (int r = 0; r < nr && !keep; r++) {
				int gi = c->p->group_of[rd[r]];

				if (gi < 0 || !in_set(set, n, c->unit_of_group[gi]))
					keep = true;
			}
			if (keep)
				outs[n_out++] = t;
		}
	}
	/* nodes ascending: sort the pairs by node */
	for (int i = 1; i < k; i++) {
		int v = nodes[i];
		bool mb = member[i];
		int j = i - 1;

		while (j >= 0 && nodes[j] > v) {
			nodes[j + 1] = nodes[j];
			member[j + 1] = member[j];
			j--;
		}
		nodes[j + 1] = v;
		member[j + 1] = mb;
	}
	qsort(groups, (size_t)n_groups, sizeof(int), cmp_int);
	/* the root: the first reduction */
	for (int i = 0; i < k && root < 0; i++)
		if (member[i] && ap_op_category_of(pg->nodes[nodes[i]].op) == AP_CAT_REDUCTION)
			root = nodes[i];
	if (root < 0)
		root = nodes[k - 1];
	m = ap_mgraph_extract(pg, nodes, member, k, outs, n_out, AP_GROUP_STITCHED, root, groups,
			      n_groups, err);
out:
	free(nodes);
	free(member);
	free(outs);
	free(groups);
	return m;
}

/* Gives the partition's boundaries from micro-graph a to micro-graph b
 * the reason that stitching them failed. */
static void note_refusal(sctx *c, int a, int b, const char *why)
{
	ap_partition *p = c->p;
	char detail[400];

	snprintf(detail, sizeof(detail), "stitch: Layer II could not stitch the reduction with "
		 "this consumer: %s", why);
	for (int i = 0; i < p->n_boundaries; i++) {
		ap_boundary *bd = &p->boundaries[i];
		int gp = p->group_of[bd->producer], gc = p->group_of[bd->consumer];
		char *d;

		if (gp < 0 || gc < 0 || c->unit_of_group[gp] != a || c->unit_of_group[gc] != b)
			continue;
		if (bd->reason != AP_WHY_RULE)
			continue;
		d = ap_strdup(detail);
		if (!d)
			continue;
		free(bd->detail);
		bd->detail = d;
		bd->reason = AP_WHY_STITCH;
	}
}

static bool unit_excluded(const sctx *c, int u)
{
	const ap_mgraph *m = c->ms[u];

	for (int i = 0; i < m->n_groups; i++)
		if (c->no_stitch[m->groups[i]])
			return true;
	return false;
}

static bool is_reduction_unit(const ap_mgraph *m)
{
	return m->kind == AP_GROUP_REDUCTION;
}

static bool consumer_kind_ok(const ap_mgraph *m)
{
	return m->kind == AP_GROUP_ELEMWISE || m->kind == AP_GROUP_BROADCAST ||
	       m->kind == AP_GROUP_REDUCTION || m->kind == AP_GROUP_TRANSPOSE;
}

/* Appends micro-graph u to the set (growing it); false on ENOMEM. */
static bool set_push(int **set, int *n, int *cap, int u)
{
	if (*n == *cap) {
		int *ns = realloc(*set, (size_t)(2 * *cap) * sizeof(int));

		if (!ns)
			return false;
		*set = ns;
		*cap *= 2;
	}
	(*set)[(*n)++] = u;
	return true;
}

/* Asks the emitter whether set[0..n) is one stitched kernel; on yes the
 * union replaces *best.  1 yes, 0 no (why holds the reason), AP_ENOMEM. */
static int try_union(sctx *c, const int *set, int n, ap_mgraph **best, char *why, size_t cap,
		     ap_error *err)
{
	ap_error e2;
	ap_mgraph *u = extract_union(c, set, n, &e2);

	if (!u) {
		if (e2.code == AP_ENOMEM) {
			*err = e2;
			return AP_ENOMEM;
		}
		snprintf(why, cap, "%.200s", e2.msg);
		return 0;
	}
	{
		int rc = ap_lower_stitchable(u, c->t, why, cap);

		if (rc <= 0) {
			ap_mgraph_free(u);
			if (rc < 0)
				return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory stitching micro-graphs");
			return 0;
		}
	}
	ap_mgraph_free(*best);
	*best = u;
	return 1;
}

/* After candidate q (already the last of set[0..*n)) was refused: adds
 * the reductions q reads that are outside every set, then asks again.
 * This takes in a statistic whose row a later pass re-reads -- BatchNorm's
 * mean, read by both the variance's own mean-centred pass and the
 * normalisation -- which alone (without its reduction) is a value the
 * stitched kernel cannot write.  1 taken, 0 not (set restored), AP_ENOMEM. */
static int try_with_producers(sctx *c, int **set, int *n, int *cap, ap_mgraph **best, char *why,
			      size_t why_cap, ap_error *err)
{
	int n0 = *n, q = (*set)[*n - 1], rc;

	for (int e = c->pred_off[q]; e < c->pred_off[q + 1]; e++) {
		int v = c->pred[e];

		if (in_set(*set, *n, v) || c->set_of[v] >= 0 || !is_reduction_unit(c->ms[v]) ||
		    unit_excluded(c, v) || closes_cycle(c, *set, *n, v))
			continue;
		if (!set_push(set, n, cap, v))
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory stitching micro-graphs");
	}
	if (*n == n0)
		return 0;
	rc = try_union(c, *set, *n, best, why, why_cap, err);
	if (rc <= 0)
		*n = n0;
	return rc;
}

/* Grows a stitched set from reduction micro-graph r; its members (>= 2)
 * are recorded in c->set_of, and the stitched micro-graph replaces the
 * first member's slot of *out (the others become NULL).  0 or an error. */
static int grow(sctx *c, int r, ap_mgraph **stitched, int **members, int *n_members, ap_error *err)
{
	int cap = 16, n = 1, rc = 0, *set = malloc((size_t)cap * sizeof(int));
	ap_mgraph *best = NULL;
	char why[300];

	*stitched = NULL;
	*members = NULL;
	*n_members = 0;
	if (!set)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory stitching micro-graphs");
	set[0] = r;
	for (;;) {
		int q = -1;

		/* the first untried candidate: a consumer of the set, or a
		 * reduction the set reads (a sibling over the same rows, as
		 * E[x^2] beside E[x]) */
		for (int i = 0; i < n; i++) {
			for (int e = c->succ_off[set[i]]; e < c->succ_off[set[i] + 1]; e++) {
				int v = c->succ[e];

				if (c->tried[v] != r + 1 && !in_set(set, n, v) && c->set_of[v] < 0 &&
				    (q < 0 || v < q))
					q = v;
			}
			for (int e = c->pred_off[set[i]]; e < c->pred_off[set[i] + 1]; e++) {
				int v = c->pred[e];

				if (c->tried[v] != r + 1 && !in_set(set, n, v) && c->set_of[v] < 0 &&
				    (q < 0 || v < q))
					q = v;
			}
		}
		if (q < 0)
			break;
		c->tried[q] = r + 1;
		if (!consumer_kind_ok(c->ms[q]) || unit_excluded(c, q) || closes_cycle(c, set, n, q))
			continue;
		if (!set_push(&set, &n, &cap, q)) {
			rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory stitching micro-graphs");
			goto fail;
		}
		rc = try_union(c, set, n, &best, why, sizeof(why), err);
		if (rc == 0) {
			char why_alone[300];

			memcpy(why_alone, why, sizeof(why));
			rc = try_with_producers(c, &set, &n, &cap, &best, why, sizeof(why), err);
			if (rc == 0) {
				if (strstr(why_alone, "does not fit"))
					note_refusal(c, set[0], q, why_alone);
				n--;
			}
		}
		if (rc < 0)
			goto fail;
	}
	if (!best) {
		free(set);
		return 0;
	}
	*stitched = best;
	*members = set;
	*n_members = n;
	return 0;
fail:
	ap_mgraph_free(best);
	free(set);
	return rc;
}

/* Topological order of the micro-graphs after stitching (ties by the
 * position of their first part), in place. */
static int resort(sctx *c, ap_mgraph **ms, int n, const int *first, ap_error *err)
{
	const ap_graph *pg = c->p->g;
	int *unit_of_tensor = malloc(((size_t)pg->n_tensors + 1) * sizeof(int));
	int *fill = calloc((size_t)n + 1, sizeof(int));
	int *order = malloc(((size_t)n + 1) * sizeof(int));
	ap_mgraph **sorted = malloc(((size_t)n + 1) * sizeof(*sorted));
	int *off = calloc((size_t)n + 2, sizeof(int)), *adj = NULL;
	int rc = AP_ENOMEM;

	if (!unit_of_tensor || !fill || !order || !sorted || !off)
		goto out;
	for (int t = 0; t < pg->n_tensors; t++)
		unit_of_tensor[t] = -1;
	for (int u = 0; u < n; u++)
		for (int i = 0; i < ms[u]->g->n_outputs; i++)
			unit_of_tensor[ms[u]->tensor_of[ms[u]->g->outputs[i]]] = u;
	/* edges: the producer of each input -> the reader (duplicates harmless) */
	for (int pass = 0; pass < 2; pass++) {
		for (int u = 0; u < n; u++)
			for (int i = 0; i < ms[u]->g->n_inputs; i++) {
				int s = unit_of_tensor[ms[u]->tensor_of[ms[u]->g->inputs[i]]];

				if (s < 0 || s == u)
					continue;
				if (pass == 0)
					off[s + 1]++;
				else
					adj[off[s] + fill[s]++] = u;
			}
		if (pass == 0) {
			for (int u = 0; u < n; u++)
				off[u + 1] += off[u];
			adj = malloc(((size_t)off[n] + 1) * sizeof(int));
			if (!adj)
				goto out;
		}
	}
	rc = ap__fuse_toposort(n, off, adj, first, order);
	if (rc == AP_EINTERNAL) {
		ap_error_set(err, rc, NULL, NULL, "Layer II: the stitched micro-graphs form a cycle");
		goto out;
	}
	if (rc)
		goto out;
	for (int i = 0; i < n; i++)
		sorted[i] = ms[order[i]];
	memcpy(ms, sorted, (size_t)n * sizeof(*ms));
out:
	if (rc == AP_ENOMEM)
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory stitching micro-graphs");
	free(unit_of_tensor);
	free(fill);
	free(order);
	free(sorted);
	free(off);
	free(adj);
	return rc;
}

/* One sentence for the explain report. */
static char *describe(const ap_mgraph *m, int n_parts)
{
	char buf[300], ops[160] = "";
	size_t len = 0;
	int n_red = 0;

	for (int i = 0; i < m->g->n_nodes && len + 24 < sizeof(ops); i++) {
		if (ap_op_category_of(m->g->nodes[i].op) != AP_CAT_REDUCTION)
			continue;
		len += (size_t)snprintf(ops + len, sizeof(ops) - len, "%s%s", n_red ? ", " : "",
					ap_op_name(m->g->nodes[i].op));
		n_red++;
	}
	snprintf(buf, sizeof(buf), "stitched by Layer II: %d micro-graphs, %d reduction%s (%s) "
		 "with their consumers, each row kept on chip", n_parts, n_red, n_red == 1 ? "" : "s",
		 ops);
	return ap_strdup(buf);
}

int ap_fuse_stitch(ap_partition *p, ap_mgraph ***msp, int *np, const bool *no_stitch,
		   const ap_target_info *t, unsigned *n_stitched, ap_error *err)
{
	sctx c;
	ap_mgraph **ms = *msp;
	int n = *np, rc = AP_ENOMEM, k = 0;
	int *first = NULL;

	*n_stitched = 0;
	memset(&c, 0, sizeof(c));
	c.p = p;
	c.ms = ms;
	c.n = n;
	c.t = t;
	c.no_stitch = no_stitch;
	c.unit_of_group = malloc(((size_t)p->n_groups + 1) * sizeof(int));
	c.set_of = malloc(((size_t)n + 1) * sizeof(int));
	c.set_next = malloc(((size_t)n + 1) * sizeof(int));
	c.mark = calloc((size_t)n + 1, sizeof(int));
	c.stack = malloc(((size_t)n + 1) * sizeof(int));
	c.tried = calloc((size_t)n + 1, sizeof(int));
	c.node_seen = calloc((size_t)p->g->n_nodes + 1, sizeof(int));
	first = malloc(((size_t)n + 1) * sizeof(int));
	if (!c.unit_of_group || !c.set_of || !c.set_next || !c.mark || !c.stack || !c.tried ||
	    !c.node_seen || !first)
		goto nomem;
	for (int u = 0; u < n; u++) {
		c.set_of[u] = c.set_next[u] = -1;
		for (int i = 0; i < ms[u]->n_groups; i++)
			c.unit_of_group[ms[u]->groups[i]] = u;
	}
	if (build_successors(&c) < 0)
		goto nomem;
	for (int r = 0; r < n; r++) {
		ap_mgraph *st;
		int *set, n_set;

		if (c.set_of[r] >= 0 || !is_reduction_unit(ms[r]) || unit_excluded(&c, r))
			continue;
		if ((rc = grow(&c, r, &st, &set, &n_set, err)) < 0)
			goto out;
		if (!st)
			continue;
		free(st->detail);
		st->detail = describe(st, n_set);
		st->layers |= AP_LAYER_II;
		if (!st->detail) {
			ap_mgraph_free(st);
			free(set);
			goto nomem;
		}
		for (int i = 0; i < n_set; i++) {
			c.set_of[set[i]] = r;
			c.set_next[set[i]] = i + 1 < n_set ? set[i + 1] : -1;
			ap_mgraph_free(ms[set[i]]);
			ms[set[i]] = NULL;
		}
		ms[r] = st;   /* r is the set's smallest member */
		(*n_stitched)++;
		free(set);
	}
	/* compact, remembering each survivor's first position */
	for (int u = 0; u < n; u++) {
		if (!ms[u])
			continue;
		first[k] = u;
		ms[k++] = ms[u];
	}
	*np = k;
	rc = *n_stitched ? resort(&c, ms, k, first, err) : 0;
	goto out;
nomem:
	rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory stitching micro-graphs");
out:
	free(c.unit_of_group);
	free(c.set_of);
	free(c.set_next);
	free(c.mark);
	free(c.stack);
	free(c.tried);
	free(c.node_seen);
	free(c.succ_off);
	free(c.succ);
	free(c.pred_off);
	free(c.pred);
	free(first);
	return rc;
}
