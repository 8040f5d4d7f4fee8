/* partition.c -- sub-graphs and micro-graphs by APOLLO's aggregation rules
 * (see partition.h for the rules and the result).
 *
 * In: a primitive, topologically sorted graph.  Out: groups of nodes, each
 * to become one kernel, in an order where producers come first, with the
 * sub-graphs they lie in and a reason for every edge between two groups.
 *
 * Method:
 *  1. Liveness: a node is live when one of its outputs is a graph output
 *     or is read by a live node (reverse topological sweep).
 *  2. Views (Reshape, Identity) and Expands of a constant whose output is
 *     not a graph output are "read through": they belong to no group,
 *     every kernel that reads them recomputes them from their input as an
 *     index remap, and every node that reads one is recorded as a reader of
 *     its input too, so data flow between groups is seen through any chain
 *     of them.
 *  3. Every other live node starts as its own group (union-find) with a
 *     kind from its op's category; the primitives of a compound op kept
 *     whole start as one sealed group; a Gemm's transposed operand starts
 *     in its MatMul's group.
 *  4. Merges (check_merge): for every producer -> consumer edge, consumers
 *     in topological order, the consumer's group tries to absorb the
 *     producer's; passes repeat until one merges nothing, so every edge
 *     left between two groups fails some check -- the reason the explain
 *     report gives.  In the first pass a matmul or conv does not yet join
 *     an injective consumer, so that the injective op can first join the
 *     group it feeds (a prologue, which saves its whole output).  The
 *     cycle check searches only between the two groups' places in a
 *     topological order of the group graph that every merge repairs
 *     locally (Pearce and Kelly; see indirect_path and merge).
 *     Evaluation counts (the cost model's, server/cost) model what the
 *     value builder of the lowering recomputes:
 *     E(t) is how many times the kernel evaluates elements of tensor t
 *     (each written element once, plus what its readers in the group
 *     evaluate times the elements each reads: K for a matmul operand, the
 *     reduced count for a reduction, one for elementwise and index maps).
 *     A matmul or conv must be evaluated once per element; a prologue may
 *     add at most max_recompute evaluations per element.
 *  5. Recompute (level apollo): a cheap group (elementwise, broadcast,
 *     injective, transpose) whose results are read by groups it could not
 *     join is duplicated into those consumers when the modelled bytes go
 *     down: each consumer then reads the group's inputs instead of its
 *     results, and the group's writes (and, once no consumer is left, its
 *     reads) disappear.  Duplication rewrites the graph (clone nodes carry
 *     the original names, clone tensors "NAME~k") and steps 1-5 run again,
 *     until nothing is duplicated.
 *  6. Sub-graphs: groups connected by edges that avoid opaque groups,
 *     then strongly connected sets of those merged, so that the sub-graphs
 *     form a DAG; waves are depths in it.
 *  7. Every edge between two groups gets its reason; the groups are
 *     ordered topologically (Kahn, smallest node first) and their members,
 *     absorbed views, written and read tensors collected.
 */
#include "partition.h"

#include "../cost/cost.h"

#include <assert.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PASSES 32
#define MAX_REWRITES 8
#define MAX_CLONE_NODES 16

struct ap_partition_priv {
	ap_graph *owned;     /* the rewritten graph (recompute), or NULL */
	bool *through;       /* per node: read through */
	int *rd_off, *rd;    /* per tensor: readers (non-through nodes), CSR */
	int *tmark, *nmark;  /* per tensor, per node: scratch marks (fill_group) */
	int mark_stamp;
};

typedef struct pctx {
	const ap_graph *g;
	ap_fuse_level level;
	unsigned max_nodes, max_recompute;
	const ap_target_info *target;   /* NULL: no product joins a pooling window */
	bool no_layer1;                 /* no pooling window joins a group */
	int N, T;
	bool *live;
	bool *through;
	bool *barrier;       /* per node: named in opt->barriers */
	int *whole;          /* per node: "_whole" id, 0 if none */
	int *rd_off, *rd;
	int *uf;             /* union-find parent per node */
	int *kind;           /* per union-find root */
	int *head, *next;    /* member lists per root */
	int *size;           /* members per root */
	int *stamp;          /* DFS marks per root */
	int *stack;
	int cur_stamp;
	int *mark;           /* per node scratch marks */
	int mark_stamp;
	ap_cost_evals_ctx *evals;  /* the cost model's evaluation counts */
	int ev_p, ev_q;      /* the groups eval_counts is counting */
	int *t_mark;         /* per tensor scratch marks */
	int t_stamp;
	int *tmark;          /* per tensor scratch marks (reads_mark) */
	int tmark_stamp;
	int *list;           /* node scratch list */
	int *slice;          /* node scratch list (edge_reason) */
	/* the group graph's topological order (see indirect_path, merge) */
	int *ord;            /* per root: its place; producers have smaller ones */
	int *at;             /* per place: the root there, -1 for none */
	int *fwd, n_fwd;     /* the groups the last indirect_path search reached */
	int fwd_p, fwd_q;    /* ... and its producer and consumer (-1: none) */
	int *bwd;            /* scratch: groups a merge moves down */
	int *pos, *pool;     /* scratch: places a merge hands out */
	int *low;            /* per root: its smallest member (topo_groups) */
	int *indeg;          /* per root: unplaced producers (topo_groups) */
	int *heap;           /* ready roots' smallest members (topo_groups) */
	int *succ;           /* scratch: a group's consumers (successors) */
	int via;             /* a third group found on an indirect path */
	int pass;
	bool outputs_failed; /* the last check_merge failed on written tensors */
} pctx;

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

static void say(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *buf, size_t cap, const char *fmt, ...)
{
	va_list ap;

	if (!buf || cap == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, cap, fmt, ap);
	va_end(ap);
}

/* ---- basics ------------------------------------------------------------------- */

static int find(pctx *c, int n)
{
	while (c->uf[n] != n) {
		c->uf[n] = c->uf[c->uf[n]];
		n = c->uf[n];
	}
	return n;
}

static double numel(const ap_graph *g, int t)
{
	int64_t n = ap_tensor_numel(&g->tensors[t]);

	return n > 0 ? (double)n : 0.0;
}

static uint64_t tensor_bytes(const ap_graph *g, int t)
{
	int64_t n = ap_tensor_numel(&g->tensors[t]);

	return n > 0 ? (uint64_t)n * ap_dtype_size(g->tensors[t].dtype) : 0;
}

/* The tensor a read-through view of t reads, or -1 when t is not made by
 * one. */
static int view_source_of(const ap_graph *g, const bool *through, int t)
{
	int p = g->tensors[t].producer;

	if (p >= 0 && through[p] && g->nodes[p].n_inputs > 0 && g->nodes[p].inputs[0] >= 0)
		return g->nodes[p].inputs[0];
	return -1;
}

/* The tensor in memory behind t: t with every read-through view undone. */
static int source_of(const ap_graph *g, const bool *through, int t)
{
	int s;

	while ((s = view_source_of(g, through, t)) >= 0)
		t = s;
	return t;
}

static bool is_anchor(int kind)
{
	return kind == AP_GROUP_REDUCTION || kind == AP_GROUP_MATMUL || kind == AP_GROUP_CONV;
}

static bool is_ewbc(int kind)
{
	return kind == AP_GROUP_ELEMWISE || kind == AP_GROUP_BROADCAST;
}

static bool is_inj(int kind)
{
	return kind == AP_GROUP_INJECTIVE || kind == AP_GROUP_TRANSPOSE;
}

static ap_group_kind node_kind(const ap_node *n)
{
	if (ap_op_is_view(n->op))
		return AP_GROUP_ELEMWISE;    /* a copy for a graph output */
	if (n->op == AP_OP_MAX_POOL || n->op == AP_OP_AVERAGE_POOL)
		return AP_GROUP_WINDOW;
	switch (ap_op_category_of(n->op)) {
	case AP_CAT_ELEMWISE: return AP_GROUP_ELEMWISE;
	case AP_CAT_BROADCAST: return AP_GROUP_BROADCAST;
	case AP_CAT_INJECTIVE: return AP_GROUP_INJECTIVE;
	case AP_CAT_TRANSPOSE: return AP_GROUP_TRANSPOSE;
	case AP_CAT_REDUCTION: return AP_GROUP_REDUCTION;
	case AP_CAT_MATMUL: return AP_GROUP_MATMUL;
	case AP_CAT_CONV: return AP_GROUP_CONV;
	default: return AP_GROUP_OPAQUE;
	}
}

/* A primitive that costs arithmetic per element (not an index map). */
static bool is_compute(const ap_node *n)
{
	ap_op_category cat = ap_op_category_of(n->op);

	if (ap_op_is_view(n->op) || n->op == AP_OP_EXPAND)
		return false;
	return cat == AP_CAT_ELEMWISE || cat == AP_CAT_BROADCAST;
}

/* Kind of a set of nodes: its anchor's, else the widest index map's. */
static ap_group_kind kind_of_nodes(const ap_graph *g, const int *nodes, int n)
{
	ap_group_kind k = AP_GROUP_ELEMWISE;

	for (int i = 0; i < n; i++) {
		ap_group_kind nk = node_kind(&g->nodes[nodes[i]]);

		if (is_anchor(nk) || nk == AP_GROUP_OPAQUE || nk == AP_GROUP_WINDOW)
			return nk;
		if (nk == AP_GROUP_TRANSPOSE || (nk == AP_GROUP_INJECTIVE && k != AP_GROUP_TRANSPOSE) ||
		    (nk == AP_GROUP_BROADCAST && k == AP_GROUP_ELEMWISE))
			k = nk;
	}
	return k;
}

static void unite(pctx *c, int a, int b, int kind)
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

/* Is tensor t needed outside the group made of roots p and q (q may be -1)? */
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

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return (x > y) - (x < y);
}

/* Members of roots a and b (b may be -1) into c->list, ascending; returns
 * the count. */
static int members(pctx *c, int a, int b)
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

/* ---- evaluation counts (the cost model's, server/cost) ------------------------------ */

static int gv_source_of(int t, void *user)
{
	pctx *c = user;

	return source_of(c->g, c->through, t);
}

static bool gv_written(int t, void *user)
{
	pctx *c = user;

	return needed_outside(c, t, c->ev_p, c->ev_q);
}

/* E(t) for every tensor read or made by the members of roots a and b (b
 * may be -1), written tensors being those needed outside a + b: the cost
 * model's evaluation counts of the value builder (ap_cost_evals), read
 * back with E_get.  Members are left in c->list (ascending), their count
 * returned. */
static int eval_counts(pctx *c, int a, int b)
{
	ap_cost_graph_view gv = {gv_source_of, gv_written, c};
	int n = members(c, a, b);

	c->ev_p = a;
	c->ev_q = b;
	ap_cost_evals(c->evals, c->list, n, &gv);
	return n;
}

static double E_get(pctx *c, int t)
{
	return ap_cost_eval_of(c->evals, t);
}

/* ---- merge checks ---------------------------------------------------------------- */

/* The kind of producer kind pk + consumer kind ck, or -1; *why explains. */
static int merged_kind(int pk, int ck, ap_fuse_level lv, char *why, size_t cap)
{
	bool pe = is_ewbc(pk), ce = is_ewbc(ck), pi = is_inj(pk), ci = is_inj(ck);
	bool pa = pk == AP_GROUP_MATMUL || pk == AP_GROUP_CONV;
	bool ca = ck == AP_GROUP_MATMUL || ck == AP_GROUP_CONV;
	bool apollo = lv == AP_FUSE_APOLLO;

	if (pe && ce)
		return pk == AP_GROUP_BROADCAST || ck == AP_GROUP_BROADCAST ? AP_GROUP_BROADCAST
									    : AP_GROUP_ELEMWISE;  /* (1)-(3) */
	if (pe && ck == AP_GROUP_REDUCTION)
		return AP_GROUP_REDUCTION;                                                /* (4), (5) */
	if (pk == AP_GROUP_REDUCTION) {
		say(why, cap, "rule: a reduction ends its micro-graph");
		return -1;
	}
	if (apollo) {
		if ((pe || pi) && ci)        /* (6), and injective ops with their producers */
			return pk == AP_GROUP_TRANSPOSE || ck == AP_GROUP_TRANSPOSE ? AP_GROUP_TRANSPOSE
										     : AP_GROUP_INJECTIVE;
		if (pi && (ce || ck == AP_GROUP_REDUCTION))   /* injective joins the group it feeds */
			return ck == AP_GROUP_REDUCTION ? AP_GROUP_REDUCTION : pk;
		if ((pe || pi) && ca)        /* prologue */
			return ck;
		if (pa && (ce || ci))        /* epilogue */
			return pk;
		/* Layer I: a pooling window with its producers, staged on chip
		 * (elementwise ones, or a convolution / matmul whose output
		 * tile Layer I recomputes with its halo), and its elementwise
		 * consumers; the driver asks the cost model whether the staged
		 * kernel pays and cuts the group where it does not */
		if ((pe || pa) && ck == AP_GROUP_WINDOW)
			return AP_GROUP_WINDOW;
		if (pk == AP_GROUP_WINDOW && ce)
			return AP_GROUP_WINDOW;
	}
	if (!apollo && ((pe || pi) && (ci || ca || ck == AP_GROUP_REDUCTION)))
		say(why, cap, "rule: fusion level %s has no rule for %s + %s (rules 1-5 only)",
		    ap_fuse_level_name(lv), ap_group_kind_name(pk), ap_group_kind_name(ck));
	else if (!apollo && pa && (ce || ci))
		say(why, cap, "rule: fusion level %s has no epilogue rule (%s + %s)",
		    ap_fuse_level_name(lv), ap_group_kind_name(pk), ap_group_kind_name(ck));
	else if (pa && ck == AP_GROUP_REDUCTION)
		say(why, cap, "rule: a reduction does not absorb a %s (no %s + reduction rule)",
		    ap_group_kind_name(pk), ap_group_kind_name(pk));
	else
		say(why, cap, "rule: no aggregation rule fuses %s + %s", ap_group_kind_name(pk),
		    ap_group_kind_name(ck));
	return -1;
}

/* A member of q named as a barrier reads something group p makes. */
static bool barrier_hit(pctx *c, int p, int q, char *why, size_t cap)
{
	const ap_graph *g = c->g;

	for (int v = c->head[q]; v >= 0; v = c->next[v]) {
		const ap_node *node = &g->nodes[v];

		if (!c->barrier[v])
			continue;
		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i], u;

			if (t < 0)
				continue;
			u = g->tensors[source_of(g, c->through, t)].producer;
			if (u >= 0 && find(c, u) == p && strcmp(g->nodes[u].name, node->name) != 0) {
				say(why, cap, "hint: %s is a fusion barrier (it starts a new kernel)",
				    node->name);
				return true;
			}
		}
	}
	return false;
}

/* The tensors the merged group p + q would write: all of one shape, or for
 * a reduction group only reductions' results. */
/* In the window group of p and q: marks (c->mark == c->mark_stamp) the
 * members that compute from the window node's result, the window node
 * included, and returns the window node (-1: none). */
static int window_downstream(pctx *c, int p, int q)
{
	const ap_graph *g = c->g;
	int n = members(c, p, q), w = -1;

	c->mark_stamp++;
	for (int i = 0; i < n; i++) {
		int m = c->list[i];
		const ap_node *node = &g->nodes[m];
		bool down = false;

		if (w < 0 && ap_node_is_window(g, node)) {
			w = m;
			down = true;
		}
		for (int j = 0; j < node->n_inputs && !down && w >= 0; j++) {
			int t = node->inputs[j] >= 0 ? source_of(g, c->through, node->inputs[j]) : -1;
			int u = t >= 0 ? g->tensors[t].producer : -1;

			down = u >= 0 && c->mark[u] == c->mark_stamp;
		}
		if (down)
			c->mark[m] = c->mark_stamp;
	}
	return w;
}

/* Do the windows of window node w tile its input exactly (each element
 * read by one window, none left out)?  Then Layer I computes the pooled
 * tensor once per element and can write it, or what is computed from it,
 * for other kernels too.  A global pooling always does; a pooling when
 * its windows are as large as its strides, undilated and unpadded, and
 * divide the input. */
static bool window_tiles_input(const ap_graph *g, const ap_node *w)
{
	const ap_tensor *x = &g->tensors[w->inputs[0]];

	if (ap_op_category_of(w->op) == AP_CAT_REDUCTION)
		return true;
	for (int d = 2; d < x->rank; d++) {
		int64_t k = ap_node_attr_at(w, "kernel_shape", d - 2, 1);

		if (ap_node_attr_at(w, "strides", d - 2, 1) != k || k < 1 || x->dims[d] % k != 0 ||
		    ap_node_attr_at(w, "dilations", d - 2, 1) != 1 ||
		    ap_node_attr_at(w, "pads", d - 2, 0) != 0 ||
		    ap_node_attr_at(w, "pads", d - 2 + x->rank - 2, 0) != 0)
			return false;
	}
	return true;
}

/* Marks (c->mark, a fresh c->mark_stamp) the members of groups p and q
 * that a product of theirs (MatMul, Conv) reads, directly or through
 * other members and read-through views: its prologue. */
static void prologue_mark(pctx *c, int p, int q)
{
	const ap_graph *g = c->g;
	int roots[2] = {p, q};
	bool more = true;

	c->mark_stamp++;
	for (int s = 0; s < 2; s++)
		for (int m = c->head[roots[s]]; m >= 0; m = c->next[m]) {
			ap_op_category cat = ap_op_category_of(g->nodes[m].op);

			if (cat == AP_CAT_MATMUL || cat == AP_CAT_CONV)
				c->mark[m] = c->mark_stamp;
		}
	/* backwards to a fixpoint: groups hold at most max_nodes members */
	while (more) {
		more = false;
		for (int s = 0; s < 2; s++)
			for (int m = c->head[roots[s]]; m >= 0; m = c->next[m]) {
				const ap_node *node = &g->nodes[m];

				if (c->mark[m] != c->mark_stamp)
					continue;
				for (int j = 0; j < node->n_inputs; j++) {
					int t = node->inputs[j] >= 0 ? source_of(g, c->through, node->inputs[j]) : -1;
					int u = t >= 0 ? g->tensors[t].producer : -1, r = u >= 0 ? find(c, u) : -1;

					if ((r == p || r == q) && c->mark[u] != c->mark_stamp) {
						c->mark[u] = c->mark_stamp;
						more = true;
					}
				}
			}
	}
}

static int outputs_check(pctx *c, int p, int q, int kind, char *why, size_t cap)
{
	const ap_graph *g = c->g;
	const ap_tensor *first = NULL;
	int roots[2] = {p, q};
	int w = kind == AP_GROUP_WINDOW ? window_downstream(c, p, q) : -1;
	bool product = kind == AP_GROUP_MATMUL || kind == AP_GROUP_CONV;

	/* a product's kernel (the GEMM, depthwise and attention emitters)
	 * writes the product and what is computed from it; a prologue tensor
	 * that other kernels read too is theirs to recompute (step 5) or a
	 * kernel of its own */
	if (product)
		prologue_mark(c, p, q);

	for (int s = 0; s < 2; s++) {
		for (int m = c->head[roots[s]]; m >= 0; m = c->next[m]) {
			const ap_node *node = &g->nodes[m];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o];

				if (t < 0 || !needed_outside(c, t, p, q))
					continue;
				if (w >= 0 && c->mark[m] != c->mark_stamp) {
					/* before the window: the pooled tensor's space,
					 * written by Layer I's fill */
					const ap_tensor *x = &g->tensors[g->nodes[w].inputs[0]];

					if (!ap_dims_equal(x->rank, x->dims, g->tensors[t].rank,
							   g->tensors[t].dims)) {
						say(why, cap, "shape: %s is read outside the window micro-graph "
							      "and has neither its shape nor the pooled tensor's",
						    g->tensors[t].name);
						return AP_WHY_SHAPE;
					}
					if (!window_tiles_input(g, &g->nodes[w])) {
						say(why, cap, "shape: %s is read outside the window micro-graph, and "
							      "the windows of %s overlap or leave gaps (Layer I "
							      "computes the pooled tensor once per element only "
							      "where the windows tile it)",
						    g->tensors[t].name, g->nodes[w].name);
						return AP_WHY_SHAPE;
					}
					continue;
				}
				if (product && c->mark[m] == c->mark_stamp &&
				    ap_op_category_of(node->op) != AP_CAT_MATMUL &&
				    ap_op_category_of(node->op) != AP_CAT_CONV) {
					say(why, cap, "rule: a product's micro-graph writes the product and what "
						      "follows it, and %s (before the product) is read outside it too",
					    g->tensors[t].name);
					return AP_WHY_RULE;
				}
				if (kind == AP_GROUP_REDUCTION) {
					if (ap_op_category_of(node->op) != AP_CAT_REDUCTION) {
						say(why, cap,
						    "rule: a reduction micro-graph writes only its result, "
						    "and %s is read outside it too", g->tensors[t].name);
						return AP_WHY_RULE;
					}
					continue;
				}
				if (!first) {
					first = &g->tensors[t];
				} else if (!ap_dims_equal(first->rank, first->dims,
							  g->tensors[t].rank, g->tensors[t].dims)) {
					say(why, cap,
					    "shape: the merged kernel would write %s and %s, of two "
					    "shapes (two iteration spaces)", first->name,
					    g->tensors[t].name);
					return AP_WHY_SHAPE;
				}
			}
		}
	}
	return -1;
}

/* A matmul or conv of the merged group evaluated more than once per element. */
static bool anchor_recomputed(pctx *c, int p, int q, char *why, size_t cap)
{
	const ap_graph *g = c->g;
	int n = eval_counts(c, p, q);

	for (int k = 0; k < n; k++) {
		const ap_node *node = &g->nodes[c->list[k]];
		int t = node->outputs[0];
		ap_op_category cat = ap_op_category_of(node->op);

		if ((cat != AP_CAT_MATMUL && cat != AP_CAT_CONV) || t < 0 || numel(g, t) == 0)
			continue;
		if (E_get(c, t) > numel(g, t) * (1.0 + 1e-9)) {
			say(why, cap, "rule: the %s result %s would be computed again for each element "
				      "it is broadcast to", ap_op_name(node->op), g->tensors[t].name);
			return true;
		}
	}
	return false;
}

/* Evaluations per element of group p's results when q computes them itself:
 * compute nodes of `nodes` (n of them) times the largest reuse, within q, of
 * a tensor p writes that q reads. */
static double recompute_cost(pctx *c, int p, int q, const int *nodes, int n)
{
	const ap_graph *g = c->g;
	double reuse = 0;
	int compute = 0;

	for (int i = 0; i < n; i++)
		if (is_compute(&g->nodes[nodes[i]]))
			compute++;
	if (compute == 0)
		return 0;
	eval_counts(c, q, -1);
	for (int m = c->head[p]; m >= 0; m = c->next[m]) {
		const ap_node *node = &g->nodes[m];

		for (int o = 0; o < node->n_outputs; o++) {
			int t = node->outputs[o];

			if (t >= 0 && numel(g, t) > 0 && E_get(c, t) / numel(g, t) > reuse)
				reuse = E_get(c, t) / numel(g, t);
		}
	}
	return compute * (reuse > 1 ? reuse : 1);
}

/* ---- the group graph's topological order ------------------------------------------- */

/* The merge checks ask, for a producer group p and a consumer group q
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
 * groups were; c->at maps a place back to its root. */

/* The consumers of group r (roots other than r reading a tensor some member
 * of r writes), each once, into c->succ; returns their count. */
static int successors(pctx *c, int r)
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
static int topo_groups(pctx *c, int *out, int *n_groups)
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
static bool indirect_path(pctx *c, int p, int q)
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
static void sort_by_place(pctx *c, int *set, int n, int *pos)
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
static void merge(pctx *c, int p, int q, int n, int u, int kind)
{
	const ap_graph *g = c->g;
	int nb = 0, nf, sp = 0, lb = c->N, i = 0, j = 0;

	if (c->fwd_p != p || c->fwd_q != q)
		indirect_path(c, p, q);     /* F of this edge (check_merge ran it last) */
	unite(c, n, u, kind);
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

static const char *node_label(pctx *c, int root)
{
	return c->g->nodes[root].name;
}

bool ap_node_is_window(const ap_graph *g, const ap_node *n)
{
	const ap_attr *ax;
	const ap_tensor *x;
	uint64_t mask = 0, spatial;

	if (n->op == AP_OP_MAX_POOL || n->op == AP_OP_AVERAGE_POOL)
		return true;
	if (n->op != AP_OP_REDUCE_SUM && n->op != AP_OP_REDUCE_MAX && n->op != AP_OP_REDUCE_MIN)
		return false;
	if (n->n_inputs < 1 || n->inputs[0] < 0 || n->n_outputs < 1 || n->outputs[0] < 0)
		return false;
	x = &g->tensors[n->inputs[0]];
	ax = ap_node_attr(n, "axes");
	if (!ax || x->rank < 3 || x->rank > 63)
		return false;
	for (int i = 0; i < ax->n_ints; i++) {
		if (ax->ints[i] < 2 || ax->ints[i] >= x->rank)
			return false;
		mask |= UINT64_C(1) << ax->ints[i];
	}
	spatial = ((UINT64_C(1) << x->rank) - 1) & ~UINT64_C(3);
	return mask == spatial;
}

/* Layer I's second kind of window: group q is one global-pooling
 * reduction (ap_node_is_window) and p a convolution's group -- ResNet's and
 * SqueezeNet's convolution -> activation -> global average pooling, a
 * training step's mean over H and W.  Staged per (batch, channel) plane,
 * the product's output never goes to memory. */
static bool reduction_window(pctx *c, int p, int q)
{
	const ap_graph *g = c->g;
	const ap_node *r = &g->nodes[c->head[q]];
	const ap_tensor *x;
	int64_t plane = 1;

	if (c->level != AP_FUSE_APOLLO || c->no_layer1 || c->size[q] != 1 ||
	    c->kind[p] != AP_GROUP_CONV || c->kind[q] != AP_GROUP_REDUCTION || !ap_node_is_window(g, r))
		return false;
	/* one (batch, channel) plane is Layer I's smallest tile */
	x = &g->tensors[r->inputs[0]];
	for (int d = 2; d < x->rank; d++)
		plane *= x->dims[d];
	return plane * (int64_t)ap_dtype_size(x->dtype) <= AP_WINDOW_STAGE_BYTES;
}

/* Does group q hold a convolution or a matmul? */
static bool group_has_product(pctx *c, int q)
{
	for (int m = c->head[q]; m >= 0; m = c->next[m]) {
		ap_op_category cat = ap_op_category_of(c->g->nodes[m].op);

		if (cat == AP_CAT_MATMUL || cat == AP_CAT_CONV)
			return true;
	}
	return false;
}

/* A product (group p's convolution or matmul) inside a pooling window's
 * Layer I kernel: computed tile by tile with its halo, on the SIMT units,
 * by a direct loop, instead of by its own tiled kernel.  Asks the cost
 * model with an estimated halo of 1.1 (Layer I picks tiles to stay near
 * it; a global pooling's tiles are exact, and the 10% then stands for
 * the direct loop's lack of register blocking: a product with a long
 * reduction, such as SqueezeNet's 512-channel classifier convolution,
 * stays on its tiled kernel).  Layer I asks again with its own tiles. */
static bool window_product_pays(pctx *c, int p, char *why, size_t cap)
{
	const double halo = 1.1;
	const ap_graph *g = c->g;
	int anchors = 0;

	/* one product and its epilogue: every other member reads something the
	 * group makes (a prologue would be recomputed for every output channel
	 * inside the window's kernel) */
	for (int m = c->head[p]; m >= 0; m = c->next[m]) {
		const ap_node *node = &g->nodes[m];
		ap_op_category cat = ap_op_category_of(node->op);
		bool inner = false;

		if (cat == AP_CAT_MATMUL || cat == AP_CAT_CONV) {
			anchors++;
			continue;
		}
		for (int i = 0; i < node->n_inputs && !inner; i++) {
			int t = node->inputs[i] >= 0 ? source_of(g, c->through, node->inputs[i]) : -1;
			int u = t >= 0 ? g->tensors[t].producer : -1;

			inner = u >= 0 && find(c, u) == p;
		}
		/* an index map before the product (a Concat, a Pad) costs nothing
		 * to recompute; arithmetic would run once per output channel */
		if (inner != is_compute(node)) {
			say(why, cap, "rule: only a product with its elementwise epilogue (and index maps "
				      "before it) joins a pooling window (%s is not one)", node->name);
			return false;
		}
	}
	if (anchors != 1) {
		say(why, cap, "rule: a group of %d products does not join a pooling window", anchors);
		return false;
	}

	for (int m = c->head[p]; m >= 0; m = c->next[m]) {
		const ap_node *node = &g->nodes[m];
		ap_op_category cat = ap_op_category_of(node->op);
		double k = 0;
		bool pays;

		if (cat != AP_CAT_MATMUL && cat != AP_CAT_CONV)
			continue;
		pays = c->target && ap_cost_staged_product_pays(c->target, g, node, halo, &k);
		if (c->target && k == 0) {
			say(why, cap, "rule: a %s does not join a pooling window", ap_op_name(node->op));
			return false;
		}
		if (!pays) {
			say(why, cap, "recompute: the cost model keeps %s (%.0f multiply-adds per element) "
				      "in its own kernel rather than inside the pooling window's",
			    node->name, k);
			return false;
		}
	}
	return true;
}

/* Can producer group p and consumer group q merge?  -1 with *kind_out, or
 * the reason (ap_boundary_reason) with `why` filled. */
static int check_merge(pctx *c, int p, int q, int *kind_out, char *why, size_t cap)
{
	const ap_graph *g = c->g;
	int pk = c->kind[p], ck = c->kind[q], kind, r;

	c->outputs_failed = false;
	if (c->level == AP_FUSE_NONE) {
		say(why, cap, "level: fusion level none (one kernel per primitive)");
		return AP_WHY_LEVEL;
	}
	if (pk == AP_GROUP_OPAQUE || ck == AP_GROUP_OPAQUE) {
		int o = pk == AP_GROUP_OPAQUE ? p : q;

		say(why, cap, "opaque: %s (%s) is opaque: a kernel and a sub-graph boundary of its own",
		    g->nodes[c->head[o]].name, ap_op_name(g->nodes[c->head[o]].op));
		return AP_WHY_OPAQUE;
	}
	if (pk == AP_GROUP_WHOLE || ck == AP_GROUP_WHOLE) {
		int o = pk == AP_GROUP_WHOLE ? p : q;

		say(why, cap, "keep-whole: %s is kept whole (keep_whole): a kernel of its own",
		    g->nodes[c->head[o]].name);
		return AP_WHY_WHOLE;
	}
	if (barrier_hit(c, p, q, why, cap))
		return AP_WHY_HINT;
	if (c->no_layer1 && (pk == AP_GROUP_WINDOW || ck == AP_GROUP_WINDOW)) {
		say(why, cap, "level: Layer I is off, a pooling window is a kernel of its own");
		return AP_WHY_LEVEL;
	}
	kind = merged_kind(pk, ck, c->level, why, cap);
	if (kind < 0 && reduction_window(c, p, q))
		kind = AP_GROUP_WINDOW;
	if (kind < 0)
		return AP_WHY_RULE;
	r = outputs_check(c, p, q, kind, why, cap);
	c->outputs_failed = r >= 0;
	if (r >= 0)
		return r;
	if (indirect_path(c, p, q)) {
		say(why, cap, "cycle: a path leads from here through %s back into the consumer",
		    g->nodes[c->via].name);
		return AP_WHY_CYCLE;
	}
	if (kind == AP_GROUP_WINDOW && (is_anchor(pk) || is_ewbc(pk)) && group_has_product(c, q)) {
		say(why, cap, "rule: the pooling window already computes a product: its producers "
			      "stay outside");
		return AP_WHY_RULE;
	}
	if (kind == AP_GROUP_WINDOW && is_anchor(pk) && !window_product_pays(c, p, why, cap))
		return AP_WHY_RECOMPUTE;
	if (kind != AP_GROUP_WINDOW && (is_anchor(pk) || is_anchor(ck)) &&
	    anchor_recomputed(c, p, q, why, cap))
		return AP_WHY_RULE;
	if ((kind == AP_GROUP_MATMUL || kind == AP_GROUP_CONV) && !is_anchor(pk)) {
		int n = members(c, p, -1);
		double cost = recompute_cost(c, p, q, c->list, n);

		if (cost > c->max_recompute) {
			say(why, cap,
			    "recompute: as a prologue of %s it would be evaluated %.0f times per element "
			    "(cap %u)", node_label(c, q), cost, c->max_recompute);
			return AP_WHY_RECOMPUTE;
		}
	}
	if ((unsigned)(c->size[p] + c->size[q]) > c->max_nodes) {
		say(why, cap, "size-cap: the merged micro-graph would hold %d nodes (cap %u)",
		    c->size[p] + c->size[q], c->max_nodes);
		return AP_WHY_SIZE;
	}
	*kind_out = kind;
	return -1;
}

/* One pass of merges, consumers in topological order.  True if any. */
static bool merge_pass(pctx *c)
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
				if (check_merge(c, p, q, &kind, NULL, 0) < 0) {
					merge(c, p, q, n, u, kind);
					any = true;
				}
			}
		}
	}
	return any;
}

/* ---- recompute: duplicating cheap producers --------------------------------------- */

typedef struct dup {
	int P, C;            /* roots */
	int n_nodes;
	int *nodes;          /* members of P that C needs, ascending */
} dup;

static bool cheap(pctx *c, int p)
{
	int k = c->kind[p];

	return (is_ewbc(k) || is_inj(k)) && c->size[p] <= MAX_CLONE_NODES;
}

/* Members of P on which the tensors of P that group C reads depend, into
 * out (ascending); returns the count. */
static int slice_for(pctx *c, int P, int C, int *out)
{
	const ap_graph *g = c->g;
	int n = members(c, P, -1), k = 0;

	c->mark_stamp++;
	/* seeds: members with an output C reads */
	for (int i = 0; i < n; i++) {
		const ap_node *node = &g->nodes[c->list[i]];

		for (int o = 0; o < node->n_outputs; o++) {
			int t = node->outputs[o];

			if (t < 0)
				continue;
			for (int r = c->rd_off[t]; r < c->rd_off[t + 1]; r++)
				if (find(c, c->rd[r]) == C)
					c->mark[c->list[i]] = c->mark_stamp;
		}
	}
	/* backwards through P */
	for (int i = n - 1; i >= 0; i--) {
		const ap_node *node = &g->nodes[c->list[i]];

		if (c->mark[c->list[i]] != c->mark_stamp)
			continue;
		for (int in = 0; in < node->n_inputs; in++) {
			int t = node->inputs[in], u;

			if (t < 0)
				continue;
			u = g->tensors[source_of(g, c->through, t)].producer;
			if (u >= 0 && find(c, u) == P)
				c->mark[u] = c->mark_stamp;
		}
	}
	for (int i = 0; i < n; i++)
		if (c->mark[c->list[i]] == c->mark_stamp)
			out[k++] = c->list[i];
	return k;
}

/* Marks in c->tmark, under a fresh c->tmark_stamp, every tensor group
 * `grp` reads: its members' inputs and the tensors read-through views of
 * them read (t is marked exactly when a member is among t's readers). */
static void reads_mark(pctx *c, int grp)
{
	const ap_graph *g = c->g;

	c->tmark_stamp++;
	for (int m = c->head[grp]; m >= 0; m = c->next[m]) {
		const ap_node *node = &g->nodes[m];

		for (int i = 0; i < node->n_inputs; i++)
			for (int t = node->inputs[i]; t >= 0; t = view_source_of(g, c->through, t))
				c->tmark[t] = c->tmark_stamp;
	}
}

typedef enum clone_status { CLONE_OK, CLONE_RULE, CLONE_COST, CLONE_SIZE } clone_status;

/* May group C compute the slice `nodes` of cheap group P itself?  *gain
 * gets the bytes C saves (reads of P's results minus new reads of P's
 * inputs), *cost the recompute cost. */
static clone_status clone_check(pctx *c, int P, int C, const int *nodes, int n, int64_t *gain,
				double *cost)
{
	const ap_graph *g = c->g;

	*gain = 0;
	*cost = 0;
	if (c->level != AP_FUSE_APOLLO || !cheap(c, P))
		return CLONE_RULE;
	if (c->kind[C] == AP_GROUP_OPAQUE || c->kind[C] == AP_GROUP_WHOLE ||
	    (c->kind[C] == AP_GROUP_WINDOW && c->no_layer1))
		return CLONE_RULE;
	if (merged_kind(c->kind[P], c->kind[C], c->level, NULL, 0) < 0)
		return CLONE_RULE;
	if (barrier_hit(c, P, C, NULL, 0))
		return CLONE_RULE;
	if ((unsigned)(c->size[C] + n) > c->max_nodes)
		return CLONE_SIZE;
	*cost = recompute_cost(c, P, C, nodes, n);
	if (*cost > c->max_recompute)
		return CLONE_COST;
	/* bytes: P's results C stops reading, P's inputs it starts reading */
	reads_mark(c, C);
	c->mark_stamp++;
	for (int i = 0; i < n; i++)
		c->mark[nodes[i]] = c->mark_stamp;
	for (int i = 0; i < n; i++) {
		const ap_node *node = &g->nodes[nodes[i]];

		for (int o = 0; o < node->n_outputs; o++)
			if (node->outputs[o] >= 0 && c->tmark[node->outputs[o]] == c->tmark_stamp)
				*gain += (int64_t)tensor_bytes(g, node->outputs[o]);
	}
	c->t_stamp++;      /* inputs counted once */
	for (int i = 0; i < n; i++) {
		const ap_node *node = &g->nodes[nodes[i]];

		for (int in = 0; in < node->n_inputs; in++) {
			int t, u;

			if (node->inputs[in] < 0)
				continue;
			t = source_of(g, c->through, node->inputs[in]);
			u = g->tensors[t].producer;
			if (g->tensors[t].kind == AP_TENSOR_CONST || (u >= 0 && c->mark[u] == c->mark_stamp))
				continue;
			if (c->t_mark[t] == c->t_stamp || c->tmark[t] == c->tmark_stamp)
				continue;
			c->t_mark[t] = c->t_stamp;
			*gain -= (int64_t)tensor_bytes(g, t);
		}
	}
	return CLONE_OK;
}

/* Bytes group P reads (distinct, from memory). */
static int64_t group_read_bytes(pctx *c, int P)
{
	const ap_graph *g = c->g;
	int64_t b = 0;

	c->t_stamp++;
	for (int m = c->head[P]; m >= 0; m = c->next[m]) {
		const ap_node *node = &g->nodes[m];

		for (int in = 0; in < node->n_inputs; in++) {
			int t, u;

			if (node->inputs[in] < 0)
				continue;
			t = source_of(g, c->through, node->inputs[in]);
			u = g->tensors[t].producer;
			if (g->tensors[t].kind == AP_TENSOR_CONST || (u >= 0 && find(c, u) == P) ||
			    c->t_mark[t] == c->t_stamp)
				continue;
			c->t_mark[t] = c->t_stamp;
			b += (int64_t)tensor_bytes(g, t);
		}
	}
	return b;
}

/* Chooses the duplications of this round; returns how many (in *out). */
static int choose_dups(pctx *c, dup **out, ap_error *err)
{
	const ap_graph *g = c->g;
	int n_dup = 0, cap = 0;
	dup *d = NULL;
	int *flag = calloc((size_t)c->N + 1, sizeof(int));   /* 1 producer, 2 consumer */
	int *cons = malloc(((size_t)c->N + 1) * sizeof(int));
	int *slice = malloc(((size_t)c->N + 1) * sizeof(int));
	int64_t *gain = malloc(((size_t)c->N + 1) * sizeof(int64_t));
	bool *ok = malloc(((size_t)c->N + 1) * sizeof(bool));

	*out = NULL;
	if (!flag || !cons || !slice || !gain || !ok)
		goto nomem;
	for (int P = 0; P < c->N; P++) {
		int n_cons = 0;
		int64_t saved = 0;
		bool remains = false, any = false;

		if (c->head[P] < 0 || find(c, P) != P || flag[P] || !cheap(c, P))
			continue;
		/* consumer groups of P's written tensors */
		c->cur_stamp++;
		for (int m = c->head[P]; m >= 0; m = c->next[m]) {
			const ap_node *node = &g->nodes[m];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o];

				if (t < 0)
					continue;
				if (g->tensors[t].is_output)
					remains = true;
				for (int r = c->rd_off[t]; r < c->rd_off[t + 1]; r++) {
					int h = find(c, c->rd[r]);

					if (h != P && c->stamp[h] != c->cur_stamp) {
						c->stamp[h] = c->cur_stamp;
						cons[n_cons++] = h;
					}
				}
			}
		}
		if (n_cons == 0)
			continue;
		for (int i = 0; i < n_cons; i++) {
			double cost;
			int n = slice_for(c, P, cons[i], slice);

			ok[i] = flag[cons[i]] != 1 &&
				clone_check(c, P, cons[i], slice, n, &gain[i], &cost) == CLONE_OK;
		}
		/* drop consumers that lose bytes, unless that keeps P alive */
		for (int round = 0; round < 2; round++) {
			bool all = !remains;
			int64_t s = 0;

			for (int i = 0; i < n_cons; i++) {
				if (!ok[i])
					all = false;
				else
					s += gain[i];
			}
			/* tensors no longer written: those only the absorbing consumers read */
			for (int m = c->head[P]; m >= 0; m = c->next[m]) {
				const ap_node *node = &g->nodes[m];

				for (int o = 0; o < node->n_outputs; o++) {
					int t = node->outputs[o];
					bool keep = false, read = false;

					if (t < 0)
						continue;
					if (g->tensors[t].is_output)
						keep = true;
					for (int r = c->rd_off[t]; r < c->rd_off[t + 1]; r++) {
						int h = find(c, c->rd[r]);

						if (h == P)
							continue;
						read = true;
						for (int i = 0; i < n_cons; i++)
							if (cons[i] == h && !ok[i])
								keep = true;
					}
					if (read && !keep)
						s += (int64_t)tensor_bytes(g, t);
				}
			}
			if (all)
				s += group_read_bytes(c, P);
			saved = s;
			if (saved > 0 || round == 1)
				break;
			for (int i = 0; i < n_cons; i++)
				if (ok[i] && gain[i] <= 0)
					ok[i] = false;
		}
		for (int i = 0; i < n_cons; i++)
			if (ok[i])
				any = true;
		if (saved <= 0 || !any)
			continue;
		flag[P] = 1;
		for (int i = 0; i < n_cons; i++) {
			int n;

			if (!ok[i])
				continue;
			if (n_dup == cap) {
				int ncap = cap ? 2 * cap : 8;
				dup *nd = realloc(d, (size_t)ncap * sizeof(*nd));

				if (!nd)
					goto nomem;
				d = nd;
				cap = ncap;
			}
			n = slice_for(c, P, cons[i], slice);
			d[n_dup].P = P;
			d[n_dup].C = cons[i];
			d[n_dup].n_nodes = n;
			d[n_dup].nodes = malloc(((size_t)n + 1) * sizeof(int));
			if (!d[n_dup].nodes)
				goto nomem;
			memcpy(d[n_dup].nodes, slice, (size_t)n * sizeof(int));
			n_dup++;
			flag[cons[i]] = 2;
		}
	}
	free(flag);
	free(cons);
	free(slice);
	free(gain);
	free(ok);
	*out = d;
	return n_dup;
nomem:
	for (int i = 0; i < n_dup; i++)
		free(d[i].nodes);
	free(d);
	free(flag);
	free(cons);
	free(slice);
	free(gain);
	free(ok);
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory choosing producers to recompute");
	return AP_ENOMEM;
}

/* What one rewrite clones: per node, the duplications that clone it
 * (ascending) as "slots", and per slot the tensors the clone writes. */
typedef struct clones {
	int *off;            /* per node, + 1: its slots (CSR) */
	int *dup_of;         /* per slot: the duplication */
	int *out_off;        /* per slot: where its tensors start in `outs` */
	int *outs;           /* per slot and output of the node: the clone's tensor
				(in the new graph), -1 for an absent output */
} clones;

/* The tensor duplication k's clone of t's producer writes in t's place, or
 * -1 when k does not clone that producer. */
static int clone_tensor(const ap_graph *g, const clones *cl, int k, int t)
{
	int p = g->tensors[t].producer;

	if (p < 0)
		return -1;
	for (int s = cl->off[p]; s < cl->off[p + 1]; s++) {
		if (cl->dup_of[s] != k)
			continue;
		for (int o = 0; o < g->nodes[p].n_outputs; o++)
			if (g->nodes[p].outputs[o] == t)
				return cl->outs[cl->out_off[s] + o];
	}
	return -1;
}

/* Appends v to a list that grows by doubling. */
static int push_int(int **arr, int *n, int *cap, int v)
{
	if (*n == *cap) {
		int ncap = *cap ? 2 * *cap : 64;
		int *na = realloc(*arr, (size_t)ncap * sizeof(int));

		if (!na)
			return AP_ENOMEM;
		*arr = na;
		*cap = ncap;
	}
	(*arr)[(*n)++] = v;
	return 0;
}

/* A copy of c->g in which each duplication's nodes (and the read-through
 * views after them) are cloned right after their originals and the
 * consumer group's members read the clones.  Sets *n_cloned.  Linear in
 * the graph plus the clones. */
static ap_graph *rewrite(pctx *c, const dup *d, int n_dup, int base, int *n_cloned, ap_error *err)
{
	const ap_graph *g = c->g;
	ap_graph *ng = ap_graph_new(g->name);
	clones cl = {0};
	int N = c->N, T = c->T, n_set = 0, cap_set = 0, n_slots, n_outs = 0;
	int *vr_off = calloc((size_t)T + 2, sizeof(int));     /* per tensor: through readers, CSR */
	int *vr = malloc(((size_t)N + 1) * sizeof(int));
	int *set = NULL;                                      /* clone sets, one after another */
	int *set_off = malloc(((size_t)n_dup + 1) * sizeof(int));
	int *slot_of = NULL;                                  /* per entry of `set`: its slot */
	int *fill = calloc((size_t)(N > T ? N : T) + 1, sizeof(int));   /* CSR fill, per tensor or node */
	int *ins = malloc(((size_t)T + 1) * sizeof(int));
	int *outs = malloc(((size_t)T + 1) * sizeof(int));
	char name[400];

	*n_cloned = 0;
	cl.off = calloc((size_t)N + 2, sizeof(int));
	if (!ng || !vr_off || !vr || !set_off || !fill || !ins || !outs || !cl.off)
		goto nomem;
	for (int t = 0; t < g->n_tensors; t++) {
		const ap_tensor *x = &g->tensors[t];
		int idx = ap_graph_add_tensor(ng, x->name, x->dtype, x->rank, x->dims, x->kind,
					      x->kind == AP_TENSOR_CONST ? x->data : NULL,
					      x->kind == AP_TENSOR_CONST ? x->nbytes : 0);

		if (idx < 0)
			goto nomem;
		ng->tensors[idx].is_output = x->is_output;
	}
	ng->inputs = malloc(((size_t)g->n_inputs + 1) * sizeof(int));
	ng->outputs = malloc(((size_t)g->n_outputs + 1) * sizeof(int));
	if (!ng->inputs || !ng->outputs)
		goto nomem;
	memcpy(ng->inputs, g->inputs, (size_t)g->n_inputs * sizeof(int));
	memcpy(ng->outputs, g->outputs, (size_t)g->n_outputs * sizeof(int));
	ng->n_inputs = g->n_inputs;
	ng->n_outputs = g->n_outputs;
	ng->eager_kernels = g->eager_kernels;
	/* read-through nodes by the tensor they read */
	for (int n = 0; n < N; n++)
		if (c->through[n])
			vr_off[g->nodes[n].inputs[0] + 1]++;
	for (int t = 0; t < T; t++)
		vr_off[t + 1] += vr_off[t];
	for (int n = 0; n < N; n++)
		if (c->through[n])
			vr[vr_off[g->nodes[n].inputs[0]] + fill[g->nodes[n].inputs[0]]++] = n;
	/* clone sets: the slice, then read-through nodes reading a clone */
	for (int k = 0; k < n_dup; k++) {
		set_off[k] = n_set;
		c->mark_stamp++;
		for (int i = 0; i < d[k].n_nodes; i++) {
			c->mark[d[k].nodes[i]] = c->mark_stamp;
			if (push_int(&set, &n_set, &cap_set, d[k].nodes[i]) < 0)
				goto nomem;
		}
		for (int i = set_off[k]; i < n_set; i++) {
			const ap_node *node = &g->nodes[set[i]];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o];

				if (t < 0)
					continue;
				for (int r = vr_off[t]; r < vr_off[t + 1]; r++) {
					if (c->mark[vr[r]] == c->mark_stamp)
						continue;
					c->mark[vr[r]] = c->mark_stamp;
					if (push_int(&set, &n_set, &cap_set, vr[r]) < 0)
						goto nomem;
				}
			}
		}
		qsort(set + set_off[k], (size_t)(n_set - set_off[k]), sizeof(int), cmp_int);
	}
	set_off[n_dup] = n_set;
	/* slots: per node, its duplications in ascending order */
	n_slots = n_set;
	cl.dup_of = malloc(((size_t)n_slots + 1) * sizeof(int));
	cl.out_off = malloc(((size_t)n_slots + 1) * sizeof(int));
	slot_of = malloc(((size_t)n_slots + 1) * sizeof(int));
	if (!cl.dup_of || !cl.out_off || !slot_of)
		goto nomem;
	for (int i = 0; i < n_set; i++)
		cl.off[set[i] + 1]++;
	for (int n = 0; n < N; n++)
		cl.off[n + 1] += cl.off[n];
	memset(fill, 0, ((size_t)N + 1) * sizeof(int));
	for (int k = 0; k < n_dup; k++) {
		for (int i = set_off[k]; i < set_off[k + 1]; i++) {
			int s = cl.off[set[i]] + fill[set[i]]++;

			cl.dup_of[s] = k;
			slot_of[i] = s;
		}
	}
	for (int n = 0; n < N; n++) {
		for (int s = cl.off[n]; s < cl.off[n + 1]; s++) {
			cl.out_off[s] = n_outs;
			n_outs += g->nodes[n].n_outputs;
		}
	}
	cl.outs = malloc(((size_t)n_outs + 1) * sizeof(int));
	if (!cl.outs)
		goto nomem;
	/* the clones' tensors, duplication by duplication, in node order */
	for (int k = 0; k < n_dup; k++) {
		for (int i = set_off[k]; i < set_off[k + 1]; i++) {
			const ap_node *node = &g->nodes[set[i]];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o], nt = -1;

				if (t >= 0) {
					const ap_tensor *x = &g->tensors[t];

					snprintf(name, sizeof(name), "%s~%d", x->name, base + k);
					nt = ap_graph_add_tensor(ng, name, x->dtype, x->rank, x->dims,
								 AP_TENSOR_VALUE, NULL, 0);
					if (nt < 0)
						goto nomem;
				}
				cl.outs[cl.out_off[slot_of[i]] + o] = nt;
			}
		}
	}
	for (int n = 0; n < N; n++) {
		const ap_node *node = &g->nodes[n];
		int r = find(c, n);

		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i], p = t >= 0 ? g->tensors[t].producer : -1;

			ins[i] = t;
			if (p < 0 || c->through[n] || c->head[r] < 0)
				continue;
			/* the first duplication into n's group that clones t's producer */
			for (int s = cl.off[p]; s < cl.off[p + 1]; s++) {
				if (d[cl.dup_of[s]].C == r) {
					ins[i] = clone_tensor(g, &cl, cl.dup_of[s], t);
					break;
				}
			}
		}
		if (ap__partition_copy_node(ng, node, ins, node->outputs) < 0)
			goto nomem;
		for (int s = cl.off[n]; s < cl.off[n + 1]; s++) {
			int k = cl.dup_of[s];

			for (int i = 0; i < node->n_inputs; i++) {
				int t = node->inputs[i], ct = t >= 0 ? clone_tensor(g, &cl, k, t) : -1;

				ins[i] = ct >= 0 ? ct : t;
			}
			for (int o = 0; o < node->n_outputs; o++)
				outs[o] = node->outputs[o] >= 0 ? cl.outs[cl.out_off[s] + o] : -1;
			if (ap__partition_copy_node(ng, node, ins, outs) < 0)
				goto nomem;
			if (!c->through[n])
				(*n_cloned)++;
		}
	}
	goto out;
nomem:
	ap_graph_free(ng);
	ng = NULL;
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory duplicating producers");
out:
	free(vr_off);
	free(vr);
	free(set);
	free(set_off);
	free(slot_of);
	free(fill);
	free(ins);
	free(outs);
	free(cl.off);
	free(cl.dup_of);
	free(cl.out_off);
	free(cl.outs);
	return ng;
}

/* ---- one grouping of one graph -------------------------------------------------- */

static void ctx_free(pctx *c)
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

typedef struct whole_member {
	int id, node;
} whole_member;

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
static int seal_whole(pctx *c)
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
			unite(c, first, w[i].node, AP_GROUP_WHOLE);
		}
	}
	free(w);
	return 0;
}

/* Liveness, read-through nodes, readers, initial groups, merges to a
 * fixpoint.  0, or AP_ENOMEM, AP_EINTERNAL (the initial groups form a
 * cycle) with `err` set. */
static int group(pctx *c, const ap_graph *g, const ap_partition_options *opt, ap_error *err)
{
	int N = g->n_nodes, T = g->n_tensors, n_rd, n_placed, n_groups;
	int *fill = NULL;
	bool *needed = NULL;
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
	needed = calloc((size_t)T + 1, sizeof(bool));
	fill = calloc((size_t)T + 1, sizeof(int));
	if (!c->live || !c->through || !c->barrier || !c->whole || !c->rd_off || !c->uf || !c->kind ||
	    !c->head || !c->next || !c->size || !c->stamp || !c->stack || !c->mark || !c->evals ||
	    !c->t_mark || !c->list || !c->tmark || !c->slice || !c->ord || !c->at || !c->fwd ||
	    !c->bwd || !c->pos || !c->pool || !c->low || !c->indeg || !c->heap || !c->succ || !needed ||
	    !fill)
		goto nomem;

	/* 1. liveness */
	for (int t = 0; t < T; t++)
		needed[t] = g->tensors[t].is_output;
	for (int n = N - 1; n >= 0; n--) {
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
	/* 2. read-through nodes and readers */
	for (int n = 0; n < N; n++) {
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
	for (int pass = 0; pass < 2; pass++) {
		for (int n = 0; n < N; n++) {
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
			for (int t = 0; t < T; t++)
				c->rd_off[t + 1] += c->rd_off[t];
			n_rd = c->rd_off[T];
			c->rd = malloc(((size_t)n_rd + 1) * sizeof(int));
			if (!c->rd)
				goto nomem;
		}
	}

	/* 3. initial groups; a compound op kept whole is one sealed group */
	for (int n = 0; n < N; n++) {
		c->uf[n] = n;
		c->kind[n] = node_kind(&g->nodes[n]);
		c->head[n] = (c->live[n] && !c->through[n]) ? n : -1;
		c->next[n] = -1;
		c->size[n] = 1;
	}
	if (seal_whole(c) < 0)
		goto nomem;

	/* a Transpose made by opening a Gemm (transA/transB) and read only by
	 * its MatMul is that MatMul's operand layout, at every level */
	for (int n = 0; n < N; n++) {
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
			unite(c, reader, n, AP_GROUP_MATMUL);
	}

	/* a topological order of the initial groups, kept by the merges */
	n_placed = topo_groups(c, c->bwd, &n_groups);
	if (n_placed < n_groups) {
		free(needed);
		free(fill);
		return ap_error_set(err, AP_EINTERNAL, NULL, NULL, "partition: the group graph has a cycle");
	}
	for (int n = 0; n < N; n++)
		c->at[n] = -1;
	for (int k = 0; k < n_placed; k++) {
		c->ord[c->bwd[k]] = k;
		c->at[k] = c->bwd[k];
	}

	/* 4. merges to a fixpoint */
	for (c->pass = 1; c->pass <= MAX_PASSES; c->pass++)
		if (!merge_pass(c) && c->pass > 1)
			break;
	free(needed);
	free(fill);
	return 0;
nomem:
	free(needed);
	free(fill);
	return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory partitioning the graph");
}

/* ---- results ------------------------------------------------------------------- */

static void group_clear(ap_group *grp)
{
	free(grp->nodes);
	free(grp->views);
	free(grp->outputs);
	free(grp->inputs);
	free(grp->refusals);
	memset(grp, 0, sizeof(*grp));
}

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
static int fill_group(ap_partition *part, int gi)
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
		ap_group_kind nk = node_kind(node);

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
static ap_boundary_reason edge_reason(pctx *c, int p, int q, char *why, size_t cap)
{
	int kind, r, saved_pass = c->pass;

	c->pass = MAX_PASSES + 1;
	why[0] = 0;
	r = check_merge(c, p, q, &kind, why, cap);
	c->pass = saved_pass;
	if (r < 0) {
		say(why, cap, "rule: no rule applies in the order the merges were made");
		return AP_WHY_RULE;
	}
	/* a cheap producer read elsewhere: say why it was not recomputed here */
	if (c->outputs_failed && c->level == AP_FUSE_APOLLO && cheap(c, p)) {
		int64_t gain;
		double cost;
		int n = slice_for(c, p, q, c->slice);
		clone_status s = clone_check(c, p, q, c->slice, n, &gain, &cost);

		if (s == CLONE_COST)
			say(why, cap, "recompute: its producers are read elsewhere too, and "
				      "recomputing them here would evaluate them %.0f times per "
				      "element (cap %u)", cost, c->max_recompute);
		else if (s == CLONE_OK)
			say(why, cap, "recompute: its producers are read elsewhere too, and "
				      "recomputing them here would not save global-memory bytes");
		if (s == CLONE_COST || s == CLONE_OK)
			return AP_WHY_RECOMPUTE;
	}
	return (ap_boundary_reason)r;
}

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
static int collect_boundaries(pctx *c, ap_partition *part)
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

static int compute_subgraphs(ap_partition *part)
{
	const ap_partition_priv *pv = part->priv;
	int G = part->n_groups, rc = AP_ENOMEM, ne = 0, cap = 0, nc = 0, n_order = 0, n_scc = 0;
	int *uf = malloc(((size_t)G + 1) * sizeof(int));
	int *comp = malloc(((size_t)G + 1) * sizeof(int));
	int *eu = NULL, *ev = NULL;
	int *off = calloc((size_t)G + 2, sizeof(int)), *roff = calloc((size_t)G + 2, sizeof(int));
	int *adj = NULL, *radj = NULL, *fill = calloc((size_t)G + 1, sizeof(int));
	int *stack = malloc(((size_t)G + 1) * sizeof(int)), *it = malloc(((size_t)G + 1) * sizeof(int));
	int *order = malloc(((size_t)G + 1) * sizeof(int)), *scc = malloc(((size_t)G + 1) * sizeof(int));
	int *num = malloc(((size_t)G + 1) * sizeof(int));
	bool *seen = calloc((size_t)G + 1, sizeof(bool));

	if (!uf || !comp || !off || !roff || !fill || !stack || !it || !order || !scc || !num || !seen)
		goto out;
	for (int i = 0; i < G; i++)
		uf[i] = i;
	for (int gi = 0; gi < G; gi++) {
		const ap_group *grp = &part->groups[gi];

		for (int j = 0; j < grp->n_outputs; j++) {
			int t = grp->outputs[j];

			for (int r = pv->rd_off[t]; r < pv->rd_off[t + 1]; r++) {
				int h = part->group_of[pv->rd[r]];

				if (h < 0 || h == gi)
					continue;
				if (ne == cap) {
					int ncap = cap ? 2 * cap : 64;
					int *nu = realloc(eu, (size_t)ncap * sizeof(int));
					int *nv;

					if (!nu)
						goto out;
					eu = nu;
					nv = realloc(ev, (size_t)ncap * sizeof(int));
					if (!nv)
						goto out;
					ev = nv;
					cap = ncap;
				}
				eu[ne] = gi;
				ev[ne++] = h;
				if (grp->kind != AP_GROUP_OPAQUE && part->groups[h].kind != AP_GROUP_OPAQUE) {
					int a = find_comp(uf, gi), b = find_comp(uf, h);

					if (a != b)
						uf[b] = a;
				}
			}
		}
	}
	/* components, numbered 0..nc-1; their graph in CSR, forward and reverse */
	for (int i = 0; i < G; i++)
		comp[i] = -1;
	for (int i = 0; i < G; i++)
		if (comp[find_comp(uf, i)] < 0)
			comp[find_comp(uf, i)] = nc++;
	for (int i = 0; i < G; i++)
		comp[i] = comp[find_comp(uf, i)];
	adj = malloc(((size_t)ne + 1) * sizeof(int));
	radj = malloc(((size_t)ne + 1) * sizeof(int));
	if (!adj || !radj)
		goto out;
	for (int e = 0; e < ne; e++) {
		off[comp[eu[e]] + 1]++;
		roff[comp[ev[e]] + 1]++;
	}
	for (int i = 0; i < nc; i++) {
		off[i + 1] += off[i];
		roff[i + 1] += roff[i];
	}
	for (int e = 0; e < ne; e++)
		adj[off[comp[eu[e]]] + fill[comp[eu[e]]]++] = comp[ev[e]];
	memset(fill, 0, ((size_t)G + 1) * sizeof(int));
	for (int e = 0; e < ne; e++)
		radj[roff[comp[ev[e]]] + fill[comp[ev[e]]]++] = comp[eu[e]];
	/* Kosaraju: finishing order forward, then labels backward; labels come
	 * out in a topological order of the condensed graph */
	for (int v = 0; v < nc; v++)
		if (!seen[v])
			dfs(off, adj, v, seen, stack, it, order, &n_order, NULL, 0);
	memset(seen, 0, ((size_t)G + 1) * sizeof(bool));
	for (int k = n_order - 1; k >= 0; k--)
		if (!seen[order[k]])
			dfs(roff, radj, order[k], seen, stack, it, NULL, NULL, scc, n_scc++);
	/* number sub-graphs by their first group */
	for (int i = 0; i < n_scc; i++)
		num[i] = -1;
	part->n_subgraphs = 0;
	for (int i = 0; i < G; i++) {
		int s = scc[comp[i]];

		if (num[s] < 0)
			num[s] = part->n_subgraphs++;
		part->groups[i].subgraph = num[s];
	}
	part->subgraphs = calloc((size_t)part->n_subgraphs + 1, sizeof(ap_subgraph));
	if (!part->subgraphs) {
		part->n_subgraphs = 0;
		goto out;
	}
	if (sub_deps(part, eu, ev, ne) < 0)
		goto out;
	/* waves, in the topological order of the Kosaraju labels */
	for (int l = 0; l < n_scc; l++) {
		ap_subgraph *sg = &part->subgraphs[num[l]];

		for (int d = 0; d < sg->n_deps; d++)
			if (part->subgraphs[sg->deps[d]].wave + 1 > sg->wave)
				sg->wave = part->subgraphs[sg->deps[d]].wave + 1;
	}
	rc = 0;
out:
	free(uf);
	free(comp);
	free(eu);
	free(ev);
	free(off);
	free(roff);
	free(adj);
	free(radj);
	free(fill);
	free(stack);
	free(it);
	free(order);
	free(scc);
	free(num);
	free(seen);
	return rc;
}

/* Turns the union-find groups of c into part's arrays: groups in a
 * topological order that takes, among the ready groups, the one holding the
 * smallest node (topo_groups). */
static int finish(pctx *c, ap_partition *part, ap_error *err)
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
	n_placed = topo_groups(c, roots, &n_roots);
	part->groups = calloc((size_t)n_roots + 1, sizeof(ap_group));
	if (!part->groups)
		goto nomem;
	for (int gi = 0; gi < n_placed; gi++) {
		ap_group *grp = &part->groups[gi];

		part->n_groups = gi + 1;
		grp->kind = (ap_group_kind)c->kind[roots[gi]];
		grp->n_nodes = members(c, roots[gi], -1);
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
		if (fill_group(part, gi) < 0)
			goto nomem;
	if (collect_boundaries(c, part) < 0 || compute_subgraphs(part) < 0)
		goto nomem;
	free(roots);
	return 0;
nomem:
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory partitioning the graph");
fail:
	free(roots);
	return err ? err->code : AP_ENOMEM;
}

__ap_give ap_partition *ap_partition_build(__ap_keep const ap_graph *g,
					   const ap_partition_options *opt, ap_error *err)
{
	pctx c;
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
		dup *d = NULL;
		int n_dup, n_cloned = 0;
		ap_graph *ng;

		if (group(&c, cur, opt, err) < 0)
			goto fail;
		if (c.level != AP_FUSE_APOLLO || round >= MAX_REWRITES)
			break;
		n_dup = choose_dups(&c, &d, err);
		if (n_dup < 0)
			goto fail;
		if (n_dup == 0)
			break;
		ng = rewrite(&c, d, n_dup, n_dups, &n_cloned, err);
		n_dups += n_dup;
		for (int i = 0; i < n_dup; i++)
			free(d[i].nodes);
		free(d);
		if (!ng)
			goto fail;
		n_recomputed += n_cloned;
		ctx_free(&c);
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
	ctx_free(&c);
	if (rc < 0)
		return ap_partition_free(part);
	return part;
fail:
	ap_graph_free(owned);
	ctx_free(&c);
	return ap_partition_free(part);
}

/* ---- upward feedback ----------------------------------------------------------- */

const int *ap_partition_readers(const ap_partition *p, int t, int *n)
{
	const ap_partition_priv *pv = p->priv;

	*n = pv->rd_off[t + 1] - pv->rd_off[t];
	return pv->rd + pv->rd_off[t];
}

int ap_partition_cut(ap_partition *p, int gi, const int *cut, int n_cut, const char *who,
		     const char *why)
{
	const ap_graph *g = p->g;
	ap_group *ng, *old;
	char **nr;
	int *start = NULL, k = 0, rid, bcap = p->n_boundaries, n, rc = AP_ENOMEM;
	int *old_nodes, *old_refs, n_refs;
	char detail[512];
	bool prev = false;

	if (gi < 0 || gi >= p->n_groups || p->groups[gi].n_nodes < 2)
		return AP_EINVAL;
	old = &p->groups[gi];
	n = old->n_nodes;
	start = malloc(((size_t)n + 1) * sizeof(int));
	if (!start)
		goto out;
	/* pieces: maximal runs of members inside or outside the cut */
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
	if (k < 2) {
		rc = AP_EINVAL;
		goto out;
	}
	nr = realloc(p->refusals, (size_t)(p->n_refusals + 1) * sizeof(char *));
	if (!nr)
		goto out;
	p->refusals = nr;
	nr[p->n_refusals] = ap_strdup(why);
	if (!nr[p->n_refusals])
		goto out;
	rid = p->n_refusals++;
	ng = realloc(p->groups, (size_t)(p->n_groups + k - 1) * sizeof(*ng));
	if (!ng)
		goto out;
	p->groups = ng;
	old = &p->groups[gi];
	memmove(&p->groups[gi + k], &p->groups[gi + 1],
		(size_t)(p->n_groups - gi - 1) * sizeof(ap_group));
	for (int j = 1; j < k; j++)
		memset(&p->groups[gi + j], 0, sizeof(ap_group));
	p->n_groups += k - 1;
	for (int v = 0; v < g->n_nodes; v++)
		if (p->group_of[v] > gi)
			p->group_of[v] += k - 1;
	/* pieces 1..k-1 first, from the old member list; then piece 0 in place */
	old_nodes = old->nodes;
	old_refs = old->refusals;
	n_refs = old->n_refusals;
	for (int j = k - 1; j >= 0; j--) {
		ap_group *grp = &p->groups[gi + j];
		int cnt = start[j + 1] - start[j];
		int *nodes = malloc((size_t)cnt * sizeof(int));
		int *refs = malloc(((size_t)n_refs + 1) * sizeof(int));

		if (!nodes || !refs) {
			free(nodes);
			free(refs);
			goto out;
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
		grp->kind = kind_of_nodes(g, nodes, cnt);
	}
	for (int j = 0; j < k; j++)
		if (fill_group(p, gi + j) < 0)
			goto out;
	/* the edges between the pieces */
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
					goto out;
			}
		}
	}
	rc = k;
out:
	free(start);
	return rc;
}

/* ---- dumps --------------------------------------------------------------------- */

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

		fprintf(f, "group %d %s sub=%d root=%s(%s) nodes=[", i, ap_group_kind_name(grp->kind),
			grp->subgraph, ap_op_name(g->nodes[grp->root].op), g->nodes[grp->root].name);
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
	for (int i = 0; i < p->n_boundaries; i++) {
		const ap_boundary *b = &p->boundaries[i];

		fprintf(f, "edge %d -> %d %s: %s\n", p->group_of[b->producer], p->group_of[b->consumer],
			g->tensors[b->tensor].name, b->detail);
	}
	return ferror(f) ? AP_EIO : 0;
}

int ap_partition_dump_json(const ap_partition *p, FILE *f)
{
	const ap_graph *g = p->g;

	fprintf(f, "{\"level\":\"%s\",\"groups\":[", ap_fuse_level_name(p->level));
	for (int i = 0; i < p->n_groups; i++) {
		const ap_group *grp = &p->groups[i];

		fprintf(f, "%s{\"kind\":\"%s\",\"subgraph\":%d,\"root\":", i ? "," : "",
			ap_group_kind_name(grp->kind), grp->subgraph);
		ap__json_string(f, g->nodes[grp->root].name);
		fprintf(f, ",\"nodes\":[");
		for (int j = 0; j < grp->n_nodes; j++) {
			fprintf(f, "%s", j ? "," : "");
			ap__json_string(f, g->nodes[grp->nodes[j]].name);
		}
		fprintf(f, "],\"ops\":[");
		for (int j = 0; j < grp->n_nodes; j++)
			fprintf(f, "%s\"%s\"", j ? "," : "", ap_op_name(g->nodes[grp->nodes[j]].op));
		fprintf(f, "],\"outputs\":[");
		for (int j = 0; j < grp->n_outputs; j++) {
			fprintf(f, "%s", j ? "," : "");
			ap__json_string(f, g->tensors[grp->outputs[j]].name);
		}
		fprintf(f, "],\"inputs\":[");
		for (int j = 0; j < grp->n_inputs; j++) {
			fprintf(f, "%s", j ? "," : "");
			ap__json_string(f, g->tensors[grp->inputs[j]].name);
		}
		fprintf(f, "]}");
	}
	fprintf(f, "],\"boundaries\":[");
	for (int i = 0; i < p->n_boundaries; i++) {
		const ap_boundary *b = &p->boundaries[i];

		fprintf(f, "%s{\"producer\":%d,\"consumer\":%d,\"tensor\":", i ? "," : "",
			p->group_of[b->producer], p->group_of[b->consumer]);
		ap__json_string(f, g->tensors[b->tensor].name);
		fprintf(f, ",\"reason\":\"%s\",\"detail\":", ap_boundary_reason_key(b->reason));
		ap__json_string(f, b->detail);
		fprintf(f, "}");
	}
	fprintf(f, "],\"subgraphs\":[");
	for (int i = 0; i < p->n_subgraphs; i++) {
		fprintf(f, "%s{\"wave\":%d,\"deps\":[", i ? "," : "", p->subgraphs[i].wave);
		for (int j = 0; j < p->subgraphs[i].n_deps; j++)
			fprintf(f, "%s%d", j ? "," : "", p->subgraphs[i].deps[j]);
		fprintf(f, "]}");
	}
	fprintf(f, "]}\n");
	return ferror(f) ? AP_EIO : 0;
}
