/* partition_internal.h -- what the files of the partitioner (APOLLO's
 * partition phase, MLSys 2022, section 3) share and nobody else needs: the
 * grouping context, the partition's private part, a few small helpers, and
 * the functions one file calls in another (prefix ap__partition_).
 * expand.c and mgraph.c do not need it.
 *
 * The files, in the order ap_partition_build runs them:
 *   partition.c  the driver (rounds of grouping and recompute) and the
 *                result: groups in a topological order with their root,
 *                views, written and read tensors; the names of kinds
 *   group.c      one grouping of one graph: liveness, read-through views,
 *                readers, initial groups, merges to a fixpoint
 *   rules.c      the aggregation rules, a producer kind x consumer kind
 *                table, and the checks every merge passes
 *   order.c      the group graph's topological order that the merges keep
 *                (Pearce and Kelly) and the cycle check it bounds
 *   recompute.c  duplicating cheap producers into their consumers
 *   subgraph.c   boundaries with their reasons, sub-graphs and waves, and
 *                the cut of upward feedback
 *   dump.c       the partition as text and as JSON
 */
#ifndef AP_PARTITION_INTERNAL_H
#define AP_PARTITION_INTERNAL_H

#include "partition.h"

#include "../cost/cost.h"

#include <stdarg.h>

/* Merge passes of one grouping at most (group.c); edge_reason (subgraph.c)
 * asks check_merge as in a pass after the last. */
#define AP_PARTITION_MAX_PASSES 32

struct ap_partition_priv {
	ap_graph *owned;     /* the rewritten graph (recompute), or NULL */
	bool *through;       /* per node: read through */
	int *rd_off, *rd;    /* per tensor: readers (non-through nodes), CSR */
	int *tmark, *nmark;  /* per tensor, per node: scratch marks (fill_group) */
	int mark_stamp;
};

/* The state of one grouping of one graph (group.c), which the rules,
 * the order, recompute and the results read.  Groups are union-find sets
 * of nodes named by their root (find); per-root arrays are indexed by
 * node and meaningful at roots only. */
typedef struct ap_pctx {
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
	int *slice;          /* node scratch list (recompute_why) */
	/* the group graph's topological order (order.c) */
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
} ap_pctx;

/* ---- small helpers ------------------------------------------------------------ */

/* static inline: every file of the partitioner uses them, and find runs in
 * every merge check. */

/* snprintf into buf, when buf is not NULL (the checks explain themselves
 * only when asked). */
static inline void say(char *buf, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static inline void say(char *buf, size_t cap, const char *fmt, ...)
{
	va_list ap;

	if (!buf || cap == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, cap, fmt, ap);
	va_end(ap);
}

/* The root of node n's group (union-find, path halving). */
static inline int find(ap_pctx *c, int n)
{
	while (c->uf[n] != n) {
		c->uf[n] = c->uf[c->uf[n]];
		n = c->uf[n];
	}
	return n;
}

static inline double numel(const ap_graph *g, int t)
{
	int64_t n = ap_tensor_numel(&g->tensors[t]);

	return n > 0 ? (double)n : 0.0;
}

static inline uint64_t tensor_bytes(const ap_graph *g, int t)
{
	int64_t n = ap_tensor_numel(&g->tensors[t]);

	return n > 0 ? (uint64_t)n * ap_dtype_size(g->tensors[t].dtype) : 0;
}

/* The tensor a read-through view of t reads, or -1 when t is not made by
 * one. */
static inline int view_source_of(const ap_graph *g, const bool *through, int t)
{
	int p = g->tensors[t].producer;

	if (p >= 0 && through[p] && g->nodes[p].n_inputs > 0 && g->nodes[p].inputs[0] >= 0)
		return g->nodes[p].inputs[0];
	return -1;
}

/* The tensor in memory behind t: t with every read-through view undone. */
static inline int source_of(const ap_graph *g, const bool *through, int t)
{
	int s;

	while ((s = view_source_of(g, through, t)) >= 0)
		t = s;
	return t;
}

/* Kinds that define a group's iteration space: reduction, matmul, conv. */
static inline bool is_anchor(int kind)
{
	return kind == AP_GROUP_REDUCTION || kind == AP_GROUP_MATMUL || kind == AP_GROUP_CONV;
}

/* Elementwise or broadcast. */
static inline bool is_ewbc(int kind)
{
	return kind == AP_GROUP_ELEMWISE || kind == AP_GROUP_BROADCAST;
}

/* Injective or transpose (index maps). */
static inline bool is_inj(int kind)
{
	return kind == AP_GROUP_INJECTIVE || kind == AP_GROUP_TRANSPOSE;
}

/* qsort order of ints, ascending. */
static inline int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return (x > y) - (x < y);
}

/* ---- partition.c: the result -------------------------------------------------- */

/* Root, views, outputs and inputs of group gi of `part` from its members
 * (sorted) and part->group_of.  0 or AP_ENOMEM. */
int ap__partition_fill_group(ap_partition *part, int gi);

/* ---- group.c: one grouping of one graph --------------------------------------- */

/* Groups the live nodes of `g` into c: liveness, read-through nodes,
 * readers, initial groups, merges to a fixpoint (steps 1-4).  c is set up
 * here, its old content ignored (free it first); the caller frees it with
 * ap__partition_ctx_free, on failure too.  0, or AP_ENOMEM, AP_EINTERNAL
 * (the initial groups form a cycle) with `err` set. */
int ap__partition_group(ap_pctx *c, const ap_graph *g, const ap_partition_options *opt,
			ap_error *err);
/* Frees c's arrays (NULL ones too) and zeroes it. */
void ap__partition_ctx_free(ap_pctx *c);
/* Unites the groups of nodes a and b (a's root stays root) with kind `kind`. */
void ap__partition_unite(ap_pctx *c, int a, int b, int kind);
/* Members of roots a and b (b may be -1) into c->list, ascending; returns
 * the count. */
int ap__partition_members(ap_pctx *c, int a, int b);

/* ---- rules.c: the aggregation rules and the merge checks ---------------------- */

/* The group kind of producer kind pk + consumer kind ck at fusion level lv
 * (APOLLO's table), or -1 with `why` (may be NULL) explaining. */
int ap__partition_merged_kind(int pk, int ck, ap_fuse_level lv, char *why, size_t cap);
/* The group kind of one node by its op's category. */
ap_group_kind ap__partition_node_kind(const ap_node *n);
/* Kind of a set of nodes: its anchor's, else the widest index map's. */
ap_group_kind ap__partition_kind_of_nodes(const ap_graph *g, const int *nodes, int n);
/* Can producer group p and consumer group q merge?  -1 with *kind_out, or
 * the reason (ap_boundary_reason) with `why` filled. */
int ap__partition_check_merge(ap_pctx *c, int p, int q, int *kind_out, char *why, size_t cap);
/* A member of q named as a barrier reads something group p makes. */
bool ap__partition_barrier_hit(ap_pctx *c, int p, int q, char *why, size_t cap);
/* Evaluations per element of group p's results when q computes them
 * itself (nodes[0..n): the members of p it would compute). */
double ap__partition_recompute_cost(ap_pctx *c, int p, int q, const int *nodes, int n);

/* ---- order.c: the group graph's topological order ----------------------------- */

/* The groups in a topological order (Kahn, smallest node first) into
 * `out`; returns how many were placed, *n_groups how many there are
 * (fewer placed: the group graph has a cycle). */
int ap__partition_topo_groups(ap_pctx *c, int *out, int *n_groups);
/* True when a path leads from group p to group q through another group
 * (c->via names one); otherwise c->fwd holds the groups the search reached. */
bool ap__partition_indirect_path(ap_pctx *c, int p, int q);
/* Merges producer group p into consumer group q (united through node n of
 * q and node u of p), keeping the topological order. */
void ap__partition_merge(ap_pctx *c, int p, int q, int n, int u, int kind);

/* ---- recompute.c: duplicating cheap producers --------------------------------- */

/* One round of recompute over the grouping c (level apollo): chooses the
 * cheap producer groups to duplicate into their consumers and, when there
 * are any, writes the rewritten graph to *out (the clone tensors of
 * duplication k named "NAME~(base + k)") and its clone nodes' count to
 * *n_cloned.  Returns the number of duplications (0: *out is NULL), or
 * AP_ENOMEM with `err` set. */
int ap__partition_recompute(ap_pctx *c, int base, ap_graph **out, int *n_cloned, ap_error *err);
/* When p is a cheap producer that could have been recomputed in q: says
 * why it was not (the recompute cap, or no bytes saved) and returns true. */
bool ap__partition_recompute_why(ap_pctx *c, int p, int q, char *why, size_t cap);

/* ---- subgraph.c: boundaries and sub-graphs ------------------------------------ */

/* Every edge between two groups of c, with its reason, into part (sorted).
 * 0 or AP_ENOMEM. */
int ap__partition_collect_boundaries(ap_pctx *c, ap_partition *part);
/* Sub-graphs of part's groups and their deps and waves.  0 or AP_ENOMEM. */
int ap__partition_compute_subgraphs(ap_partition *part);

#endif
