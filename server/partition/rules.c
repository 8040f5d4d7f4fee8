/* rules.c -- APOLLO's aggregation rules (MLSys 2022, section 3): may a
 * producer group and a consumer group merge, and into a group of which
 * kind?
 *
 * In: the grouping state of group.c (ap_pctx) and two groups joined by a
 * producer -> consumer edge.  Out: the merged group's kind, or the reason
 * (ap_boundary_reason) and one sentence why not.
 *
 * Two layers:
 *   - the rules proper, as data: a table indexed by producer kind and
 *     consumer kind that gives the merged group's kind, the lowest fusion
 *     level of the rule and the sentence below it (`rules`, read by
 *     merged_kind); and the kind of a node or of a set of nodes;
 *   - the checks a merge passes beyond its kinds (check_merge, in this
 *     order): opaque ops, compound ops kept whole and fusion barriers; the
 *     rules; the tensors the merged group writes (one shape; a reduction's
 *     result only; no prologue tensor of a product; a pooling window's
 *     space); no cycle through a third group (order.c); a pooling window's
 *     product pays (the cost model); a matmul or conv evaluated once per
 *     element and a prologue within max_recompute (the cost model's
 *     evaluation counts, kept for the two groups at hand); the size cap.
 * The checks never change the grouping; they only use its scratch state.
 */
#include "partition_internal.h"

#include <string.h>

/* ---- the rules ---------------------------------------------------------------- */

/* Short names of the group kinds, for the table only. */
enum {
	EW = AP_GROUP_ELEMWISE,
	BC = AP_GROUP_BROADCAST,
	RED = AP_GROUP_REDUCTION,
	INJ = AP_GROUP_INJECTIVE,
	TR = AP_GROUP_TRANSPOSE,
	MM = AP_GROUP_MATMUL,
	CONV = AP_GROUP_CONV,
	WIN = AP_GROUP_WINDOW,
	ANY = -1,                /* as a consumer: every kind */
};

/* The sentence that explains a refused pair of kinds. */
typedef enum refusal {
	NO_RULE,                 /* no aggregation rule fuses P + C */
	RULES_1_5,               /* level rules (or below) has no rule for P + C */
	NO_EPILOGUE,             /* level rules (or below) has no epilogue rule */
	REDUCTION_ENDS,          /* a reduction ends its micro-graph */
	NO_ABSORB,               /* a reduction does not absorb a product */
} refusal;

/* From which fusion level a rule holds. */
typedef enum rule_level {
	NEVER = 0,               /* no rule (an empty cell of the table) */
	RULES,                   /* rules (1)-(5): at every level the table is
				    asked at (level none never asks: check_merge
				    stops first) */
	APOLLO,                  /* level apollo only */
} rule_level;

/* One cell of the table: producer kind + consumer kind -> group kind, from
 * level `level` on; below it the pair is refused with `below`. */
typedef struct fusion_rule {
	int kind;
	rule_level level;
	refusal below;
} fusion_rule;

/* APOLLO's table (DESIGN.md, partition.h), indexed [producer kind]
 * [consumer kind]; the cells not listed are NEVER (a sentence of their
 * own, if any, in `never` below).  A pair listed twice does not build
 * (-Wextra's -Woverride-init). */
static const fusion_rule rules[AP_GROUP_KIND_COUNT][AP_GROUP_KIND_COUNT] = {
	/* (1)-(3) elementwise and broadcast */
	[EW][EW] = {EW, RULES, NO_RULE},
	[EW][BC] = {BC, RULES, NO_RULE},
	[BC][EW] = {BC, RULES, NO_RULE},
	[BC][BC] = {BC, RULES, NO_RULE},
	/* (4), (5) producers of a reduction */
	[EW][RED] = {RED, RULES, NO_RULE},
	[BC][RED] = {RED, RULES, NO_RULE},
	/* (6) elementwise/broadcast + transpose, and injective ops with their
	 * producers */
	[EW][INJ] = {INJ, APOLLO, RULES_1_5},
	[EW][TR] = {TR, APOLLO, RULES_1_5},
	[BC][INJ] = {INJ, APOLLO, RULES_1_5},
	[BC][TR] = {TR, APOLLO, RULES_1_5},
	[INJ][INJ] = {INJ, APOLLO, RULES_1_5},
	[INJ][TR] = {TR, APOLLO, RULES_1_5},
	[TR][INJ] = {TR, APOLLO, RULES_1_5},
	[TR][TR] = {TR, APOLLO, RULES_1_5},
	/* an injective op joins the group it feeds */
	[INJ][EW] = {INJ, APOLLO, NO_RULE},
	[INJ][BC] = {INJ, APOLLO, NO_RULE},
	[TR][EW] = {TR, APOLLO, NO_RULE},
	[TR][BC] = {TR, APOLLO, NO_RULE},
	[INJ][RED] = {RED, APOLLO, RULES_1_5},
	[TR][RED] = {RED, APOLLO, RULES_1_5},
	/* (6) a prologue of a matmul or conv */
	[EW][MM] = {MM, APOLLO, RULES_1_5},
	[BC][MM] = {MM, APOLLO, RULES_1_5},
	[INJ][MM] = {MM, APOLLO, RULES_1_5},
	[TR][MM] = {MM, APOLLO, RULES_1_5},
	[EW][CONV] = {CONV, APOLLO, RULES_1_5},
	[BC][CONV] = {CONV, APOLLO, RULES_1_5},
	[INJ][CONV] = {CONV, APOLLO, RULES_1_5},
	[TR][CONV] = {CONV, APOLLO, RULES_1_5},
	/* (6) an epilogue of a matmul or conv */
	[MM][EW] = {MM, APOLLO, NO_EPILOGUE},
	[MM][BC] = {MM, APOLLO, NO_EPILOGUE},
	[MM][INJ] = {MM, APOLLO, NO_EPILOGUE},
	[MM][TR] = {MM, APOLLO, NO_EPILOGUE},
	[CONV][EW] = {CONV, APOLLO, NO_EPILOGUE},
	[CONV][BC] = {CONV, APOLLO, NO_EPILOGUE},
	[CONV][INJ] = {CONV, APOLLO, NO_EPILOGUE},
	[CONV][TR] = {CONV, APOLLO, NO_EPILOGUE},
	/* Layer I: a pooling window with its producers, staged on chip
	 * (elementwise ones, or a convolution / matmul whose output tile
	 * Layer I recomputes with its halo), and its elementwise consumers;
	 * the driver asks the cost model whether the staged kernel pays and
	 * cuts the group where it does not */
	[EW][WIN] = {WIN, APOLLO, NO_RULE},
	[BC][WIN] = {WIN, APOLLO, NO_RULE},
	[MM][WIN] = {WIN, APOLLO, NO_RULE},
	[CONV][WIN] = {WIN, APOLLO, NO_RULE},
	[WIN][EW] = {WIN, APOLLO, NO_RULE},
	[WIN][BC] = {WIN, APOLLO, NO_RULE},
};

/* Pairs that no rule fuses at any level and that have a sentence of their
 * own (every other such pair: NO_RULE). */
static const struct {
	int producer, consumer;
	refusal why;
} never[] = {
	{RED, ANY, REDUCTION_ENDS},
	{MM, RED, NO_ABSORB},
	{CONV, RED, NO_ABSORB},
};

/* Writes the sentence of refusal r for producer kind pk + consumer kind ck
 * at level lv into why (cap bytes; nothing when why is NULL). */
static void say_refusal(refusal r, int pk, int ck, ap_fuse_level lv, char *why, size_t cap)
{
	switch (r) {
	case RULES_1_5:
		say(why, cap, "rule: fusion level %s has no rule for %s + %s (rules 1-5 only)",
		    ap_fuse_level_name(lv), ap_group_kind_name(pk), ap_group_kind_name(ck));
		break;
	case NO_EPILOGUE:
		say(why, cap, "rule: fusion level %s has no epilogue rule (%s + %s)",
		    ap_fuse_level_name(lv), ap_group_kind_name(pk), ap_group_kind_name(ck));
		break;
	case REDUCTION_ENDS:
		say(why, cap, "rule: a reduction ends its micro-graph");
		break;
	case NO_ABSORB:
		say(why, cap, "rule: a reduction does not absorb a %s (no %s + reduction rule)",
		    ap_group_kind_name(pk), ap_group_kind_name(pk));
		break;
	case NO_RULE:
		say(why, cap, "rule: no aggregation rule fuses %s + %s", ap_group_kind_name(pk),
		    ap_group_kind_name(ck));
		break;
	}
}

/* The kind of producer kind pk + consumer kind ck at level lv: the cell
 * of `rules` for the pair, when lv reaches its level; else -1, and *why
 * explains (`never` names the pairs with a sentence of their own). */
int ap__partition_merged_kind(int pk, int ck, ap_fuse_level lv, char *why, size_t cap)
{
	refusal r = NO_RULE;

	if (pk >= 0 && pk < AP_GROUP_KIND_COUNT && ck >= 0 && ck < AP_GROUP_KIND_COUNT) {
		const fusion_rule *f = &rules[pk][ck];

		if (f->level == RULES || (f->level == APOLLO && lv == AP_FUSE_APOLLO))
			return f->kind;
		r = f->below;
	}
	for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++)
		if (never[i].producer == pk && (never[i].consumer == ANY || never[i].consumer == ck))
			r = never[i].why;
	say_refusal(r, pk, ck, lv, why, cap);
	return -1;
}

/* The kind of the group a node starts in: its op's category's; a view
 * left in a group (a copy for a graph output) is elementwise, a pooling
 * a window. */
ap_group_kind ap__partition_node_kind(const ap_node *n)
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
ap_group_kind ap__partition_kind_of_nodes(const ap_graph *g, const int *nodes, int n)
{
	ap_group_kind k = AP_GROUP_ELEMWISE;

	for (int i = 0; i < n; i++) {
		ap_group_kind nk = ap__partition_node_kind(&g->nodes[nodes[i]]);

		if (is_anchor(nk) || nk == AP_GROUP_OPAQUE || nk == AP_GROUP_WINDOW)
			return nk;
		if (nk == AP_GROUP_TRANSPOSE || (nk == AP_GROUP_INJECTIVE && k != AP_GROUP_TRANSPOSE) ||
		    (nk == AP_GROUP_BROADCAST && k == AP_GROUP_ELEMWISE))
			k = nk;
	}
	return k;
}

/* ---- evaluation counts (the cost model's, server/cost) ------------------------ */

/* Is tensor t needed outside the group made of roots p and q (q may be -1)? */
static bool needed_outside(ap_pctx *c, int t, int p, int q)
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

/* The grouping as the cost model sees it (ap_cost_graph_view): the tensor
 * in memory behind t, and whether the group being counted writes t. */
static int gv_source_of(int t, void *user)
{
	ap_pctx *c = user;

	return source_of(c->g, c->through, t);
}

static bool gv_written(int t, void *user)
{
	ap_pctx *c = user;

	return needed_outside(c, t, c->ev_p, c->ev_q);
}

/* E(t) for every tensor read or made by the members of roots a and b (b
 * may be -1), written tensors being those needed outside a + b: the cost
 * model's evaluation counts of the value builder (ap_cost_evals), read
 * back with E_get.  Members are left in c->list (ascending), their count
 * returned. */
static int eval_counts(ap_pctx *c, int a, int b)
{
	ap_cost_graph_view gv = {gv_source_of, gv_written, c};
	int n = ap__partition_members(c, a, b);

	c->ev_p = a;
	c->ev_q = b;
	ap_cost_evals(c->evals, c->list, n, &gv);
	return n;
}

/* E(t) from the last eval_counts. */
static double E_get(ap_pctx *c, int t)
{
	return ap_cost_eval_of(c->evals, t);
}

/* ---- merge checks ------------------------------------------------------------- */

/* A member of q named as a barrier reads something group p makes. */
bool ap__partition_barrier_hit(ap_pctx *c, int p, int q, char *why, size_t cap)
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

/* In the window group of p and q: marks (c->mark == c->mark_stamp) the
 * members that compute from the window node's result, the window node
 * included, and returns the window node (-1: none). */
static int window_downstream(ap_pctx *c, int p, int q)
{
	const ap_graph *g = c->g;
	int n = ap__partition_members(c, p, q), w = -1;

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
static void prologue_mark(ap_pctx *c, int p, int q)
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

/* The tensors the merged group p + q would write: all of one shape, or for
 * a reduction group only reductions' results. */
static int outputs_check(ap_pctx *c, int p, int q, int kind, char *why, size_t cap)
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
static bool anchor_recomputed(ap_pctx *c, int p, int q, char *why, size_t cap)
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
double ap__partition_recompute_cost(ap_pctx *c, int p, int q, const int *nodes, int n)
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

/* ---- pooling windows (Layer I) ------------------------------------------------ */

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
static bool reduction_window(ap_pctx *c, int p, int q)
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
static bool group_has_product(ap_pctx *c, int q)
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
static bool window_product_pays(ap_pctx *c, int p, char *why, size_t cap)
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

/* ---- all checks of one merge -------------------------------------------------- */

/* The name of group root's node, for sentences. */
static const char *node_label(ap_pctx *c, int root)
{
	return c->g->nodes[root].name;
}

/* Can producer group p and consumer group q merge?  -1 with *kind_out, or
 * the reason (ap_boundary_reason) with `why` filled. */
int ap__partition_check_merge(ap_pctx *c, int p, int q, int *kind_out, char *why, size_t cap)
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
	if (ap__partition_barrier_hit(c, p, q, why, cap))
		return AP_WHY_HINT;
	if (c->no_layer1 && (pk == AP_GROUP_WINDOW || ck == AP_GROUP_WINDOW)) {
		say(why, cap, "level: Layer I is off, a pooling window is a kernel of its own");
		return AP_WHY_LEVEL;
	}
	kind = ap__partition_merged_kind(pk, ck, c->level, why, cap);
	if (kind < 0 && reduction_window(c, p, q))
		kind = AP_GROUP_WINDOW;
	if (kind < 0)
		return AP_WHY_RULE;
	r = outputs_check(c, p, q, kind, why, cap);
	c->outputs_failed = r >= 0;
	if (r >= 0)
		return r;
	if (ap__partition_indirect_path(c, p, q)) {
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
		int n = ap__partition_members(c, p, -1);
		double cost = ap__partition_recompute_cost(c, p, q, c->list, n);

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
