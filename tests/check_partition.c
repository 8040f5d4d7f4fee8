/* check_partition.c -- opening compound ops (expand.c) and the partition
 * (partition.c), checked structurally: which nodes land in which group,
 * the group kinds, what each group writes, the sub-graphs, and the reason
 * recorded for every edge between two groups.
 *
 * Each case builds a small graph by hand, validates it, expands it and
 * partitions it (at a given fusion level and options), then compares a
 * one-line-per-group summary ("kind:node,node>out,out" joined by " | ")
 * with the expected text.  Every rule has a case whose expected grouping
 * needs that rule: taking the rule out changes the grouping and fails the
 * case.  Every partition built here is also checked for its invariants:
 * groups in topological order, every edge between groups with a reason
 * (never the fall-back text).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/partition/partition.h"

#define DIMS(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
#define LIST(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__}

static void push(int **arr, int *n, int v)
{
	*arr = realloc(*arr, (size_t)(*n + 1) * sizeof(int));
	(*arr)[(*n)++] = v;
}

static int tensor(ap_graph *g, const char *name, ap_tensor_kind kind, const void *data, int rank,
		  const int64_t *dims)
{
	int64_t n = 1;
	int t;

	for (int i = 0; i < rank; i++)
		n *= dims[i];
	t = ap_graph_add_tensor(g, name, AP_DT_F32, rank, dims, kind, data,
				kind == AP_TENSOR_CONST ? (size_t)n * 4 : 0);
	ck_assert_int_ge(t, 0);
	if (kind == AP_TENSOR_INPUT)
		push(&g->inputs, &g->n_inputs, t);
	return t;
}

static int in(ap_graph *g, const char *name, int rank, const int64_t *dims)
{
	return tensor(g, name, AP_TENSOR_INPUT, NULL, rank, dims);
}

static int val(ap_graph *g, const char *name, int rank, const int64_t *dims)
{
	return tensor(g, name, AP_TENSOR_VALUE, NULL, rank, dims);
}

static void out(ap_graph *g, int t)
{
	g->tensors[t].is_output = true;
	push(&g->outputs, &g->n_outputs, t);
}

static int node(ap_graph *g, const char *name, ap_op op, int n_in, const int *ins, int n_out,
		const int *outs)
{
	int n = ap_graph_add_node(g, name, op, n_in, ins, n_out, outs);

	ck_assert_int_ge(n, 0);
	return n;
}

static void reduce_attrs(ap_graph *g, int n, int64_t axis, int keep)
{
	ap_node_set_ints(g, n, "axes", &axis, 1);
	ap_node_set_int(g, n, "keepdims", keep);
}

static void perm(ap_graph *g, int n, int64_t a, int64_t b)
{
	ap_node_set_ints(g, n, "perm", (int64_t[]){a, b}, 2);
}

static void conv_attrs(ap_graph *g, int n)
{
	ap_node_set_int(g, n, "group", 1);
	ap_node_set_ints(g, n, "strides", (int64_t[]){1, 1}, 2);
	ap_node_set_ints(g, n, "pads", (int64_t[]){0, 0, 0, 0}, 4);
	ap_node_set_ints(g, n, "dilations", (int64_t[]){1, 1}, 2);
}

static const char *const kinds[AP_GROUP_KIND_COUNT] = {"ew", "bc", "red", "opaque", "inj", "tr",
							"mm", "conv", "whole", "stitched", "attention",
							"win"};

/* "kind:a,b>t,u" per group, joined by " | ". */
static char *summary(const ap_partition *p)
{
	size_t cap = 8192, len = 0;
	char *s = calloc(cap, 1);

	for (int i = 0; i < p->n_groups; i++) {
		const ap_group *grp = &p->groups[i];

		len += (size_t)snprintf(s + len, cap - len, "%s%s:", i ? " | " : "", kinds[grp->kind]);
		for (int j = 0; j < grp->n_nodes; j++)
			len += (size_t)snprintf(s + len, cap - len, "%s%s", j ? "," : "",
						p->g->nodes[grp->nodes[j]].name);
		len += (size_t)snprintf(s + len, cap - len, ">");
		for (int j = 0; j < grp->n_outputs; j++)
			len += (size_t)snprintf(s + len, cap - len, "%s%s", j ? "," : "",
						p->g->tensors[grp->outputs[j]].name);
	}
	return s;
}

/* Invariants of every partition: producers first, every node in one group
 * at most, each edge between groups with a reason. */
static void check_invariants(const ap_partition *p)
{
	const ap_graph *g = p->g;

	for (int i = 0; i < p->n_groups; i++) {
		const ap_group *grp = &p->groups[i];

		ck_assert_int_ge(grp->n_nodes, 1);
		ck_assert_int_ge(grp->subgraph, 0);
		ck_assert_int_lt(grp->subgraph, p->n_subgraphs);
		for (int j = 0; j < grp->n_nodes; j++)
			ck_assert_int_eq(p->group_of[grp->nodes[j]], i);
		for (int j = 0; j < grp->n_inputs; j++) {
			int prod = g->tensors[grp->inputs[j]].producer;

			if (prod >= 0 && p->group_of[prod] >= 0)
				ck_assert_int_lt(p->group_of[prod], i);
		}
	}
	for (int i = 0; i < p->n_boundaries; i++) {
		const ap_boundary *b = &p->boundaries[i];

		ck_assert_int_ne(p->group_of[b->producer], p->group_of[b->consumer]);
		ck_assert_int_lt(p->group_of[b->producer], p->group_of[b->consumer]);
		ck_assert_ptr_nonnull(b->detail);
		ck_assert_msg(strlen(b->detail) > 0, "boundary without a detail");
		ck_assert_msg(strstr(b->detail, "no rule applies") == NULL, "fall-back reason: %s", b->detail);
		ck_assert_msg(strncmp(b->detail, ap_boundary_reason_key(b->reason),
				      strlen(ap_boundary_reason_key(b->reason))) == 0 ||
				      b->reason == AP_WHY_REFUSED,
			      "detail '%s' does not start with its key", b->detail);
	}
	/* every edge between two groups has a boundary record */
	for (int v = 0; v < g->n_nodes; v++) {
		const ap_node *node = &g->nodes[v];

		if (p->group_of[v] < 0)
			continue;
		for (int k = 0; k < node->n_inputs; k++) {
			int t = node->inputs[k], u;
			bool found = false;

			while (t >= 0 && g->tensors[t].producer >= 0 &&
			       p->group_of[g->tensors[t].producer] < 0 &&
			       g->nodes[g->tensors[t].producer].n_inputs > 0)
				t = g->nodes[g->tensors[t].producer].inputs[0];   /* through views */
			if (t < 0 || (u = g->tensors[t].producer) < 0 || p->group_of[u] < 0 ||
			    p->group_of[u] == p->group_of[v])
				continue;
			for (int b = 0; b < p->n_boundaries; b++)
				if (p->boundaries[b].producer == u && p->boundaries[b].consumer == v &&
				    p->boundaries[b].tensor == t)
					found = true;
			ck_assert_msg(found, "edge %s -> %s without a boundary", g->nodes[u].name, node->name);
		}
	}
}

typedef struct built {
	ap_graph *g, *eg;
	ap_partition *p;
	ap_expand_choices choices;
} built;

static built build_opt(ap_graph *g, const ap_partition_options *o, const ap_expand_options *xo)
{
	built b = {.g = g};
	ap_error err;

	ap_error_clear(&err);
	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	b.eg = ap_partition_expand(g, xo, &b.choices, &err);
	ck_assert_msg(b.eg != NULL, "expand: %s", err.msg);
	b.p = ap_partition_build(b.eg, o, &err);
	ck_assert_msg(b.p != NULL, "partition: %s", err.msg);
	check_invariants(b.p);
	return b;
}

static void built_free(built *b)
{
	ap_partition_free(b->p);
	ap_graph_free(b->eg);
	ap_graph_free(b->g);
	ap_expand_choices_clear(&b->choices);
}

static void expect_summary(const built *b, const char *want)
{
	char *got = summary(b->p);

	ck_assert_msg(strcmp(got, want) == 0, "groups:\n  got  %s\n  want %s", got, want);
	free(got);
}

/* The reason key of the boundary that carries tensor `name`. */
static const char *reason_of(const ap_partition *p, const char *name)
{
	for (int i = 0; i < p->n_boundaries; i++)
		if (strcmp(p->g->tensors[p->boundaries[i].tensor].name, name) == 0)
			return ap_boundary_reason_key(p->boundaries[i].reason);
	return "(none)";
}

static void expect_level(ap_graph *g, ap_fuse_level lv, const char *want)
{
	ap_partition_options o = {.level = lv};
	built b = build_opt(g, &o, NULL);

	expect_summary(&b, want);
	ap_partition_free(b.p);
	ap_graph_free(b.eg);
	ap_expand_choices_clear(&b.choices);
}

/* Builds at `lv` and frees everything, g included. */
static void expect_groups_at(ap_graph *g, ap_fuse_level lv, const char *want)
{
	expect_level(g, lv, want);
	ap_graph_free(g);
}

/* ---- rules (1)-(5) ------------------------------------------------------------------ */

/* (1) elementwise + elementwise; at level none each primitive alone. */
START_TEST(rule1_elementwise)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8));
	int a = val(g, "a", DIMS(4, 8)), y = val(g, "y", DIMS(4, 8));
	ap_partition_options none = {.level = AP_FUSE_NONE};
	built b;

	node(g, "exp", AP_OP_EXP, LIST(x), LIST(a));
	node(g, "tanh", AP_OP_TANH, LIST(a), LIST(y));
	out(g, y);
	expect_level(g, AP_FUSE_RULES, "ew:exp,tanh>y");
	expect_level(g, AP_FUSE_APOLLO, "ew:exp,tanh>y");
	b = build_opt(g, &none, NULL);
	expect_summary(&b, "ew:exp>a | ew:tanh>y");
	ck_assert_str_eq(reason_of(b.p, "a"), "level");
	built_free(&b);
}
END_TEST

/* (2) broadcast + elementwise, in both orders. */
START_TEST(rule2_broadcast_elementwise)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), bias = in(g, "b", DIMS(8));
	int a = val(g, "a", DIMS(4, 8)), c = val(g, "c", DIMS(4, 8)), y = val(g, "y", DIMS(4, 8));

	node(g, "add", AP_OP_ADD, LIST(x, bias), LIST(a));
	node(g, "exp", AP_OP_EXP, LIST(a), LIST(c));
	node(g, "add2", AP_OP_ADD, LIST(c, bias), LIST(y));
	out(g, y);
	expect_level(g, AP_FUSE_RULES, "bc:add,exp,add2>y");
	expect_groups_at(g, AP_FUSE_NONE, "bc:add>a | ew:exp>c | bc:add2>y");
}
END_TEST

/* (3) broadcast + broadcast. */
START_TEST(rule3_broadcast_broadcast)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), bias = in(g, "b", DIMS(8)), s = in(g, "s", DIMS(4, 1));
	int a = val(g, "a", DIMS(4, 8)), y = val(g, "y", DIMS(4, 8));

	node(g, "add", AP_OP_ADD, LIST(x, bias), LIST(a));
	node(g, "mul", AP_OP_MUL, LIST(a, s), LIST(y));
	out(g, y);
	expect_groups_at(g, AP_FUSE_RULES, "bc:add,mul>y");
}
END_TEST

/* (4) elementwise + reduction. */
START_TEST(rule4_elementwise_reduction)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8));
	int a = val(g, "a", DIMS(4, 8)), s = val(g, "s", DIMS(4, 1));
	int n;

	node(g, "exp", AP_OP_EXP, LIST(x), LIST(a));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(a), LIST(s));
	reduce_attrs(g, n, 1, 1);
	out(g, s);
	expect_groups_at(g, AP_FUSE_RULES, "red:exp,sum>s");
}
END_TEST

/* (5) broadcast + reduction; the reduction ends its group. */
START_TEST(rule5_broadcast_reduction_ends_group)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), b = in(g, "b", DIMS(4, 1));
	int a = val(g, "a", DIMS(4, 8)), s = val(g, "s", DIMS(4, 1)), y = val(g, "y", DIMS(4, 1));
	built bt;
	int n;

	node(g, "mul", AP_OP_MUL, LIST(x, b), LIST(a));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(a), LIST(s));
	reduce_attrs(g, n, 1, 1);
	node(g, "sqrt", AP_OP_SQRT, LIST(s), LIST(y));
	out(g, y);
	expect_level(g, AP_FUSE_RULES, "red:mul,sum>s | ew:sqrt>y");
	bt = build_opt(g, NULL, NULL);
	expect_summary(&bt, "red:mul,sum>s | ew:sqrt>y");
	ck_assert_str_eq(reason_of(bt.p, "s"), "rule");
	ck_assert_ptr_nonnull(strstr(bt.p->boundaries[0].detail, "a reduction ends its micro-graph"));
	built_free(&bt);
}
END_TEST

/* ---- rule (6) ------------------------------------------------------------------------ */

/* elementwise/broadcast + transpose -> transpose (apollo only). */
START_TEST(rule6_transpose)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), b = in(g, "b", DIMS(8));
	int a = val(g, "a", DIMS(4, 8)), y = val(g, "y", DIMS(8, 4));
	built bt;
	ap_partition_options rules = {.level = AP_FUSE_RULES};

	node(g, "add", AP_OP_ADD, LIST(x, b), LIST(a));
	perm(g, node(g, "tr", AP_OP_TRANSPOSE, LIST(a), LIST(y)), 1, 0);
	out(g, y);
	expect_level(g, AP_FUSE_APOLLO, "tr:add,tr>y");
	bt = build_opt(g, &rules, NULL);
	expect_summary(&bt, "bc:add>a | tr:tr>y");
	ck_assert_str_eq(reason_of(bt.p, "a"), "rule");
	built_free(&bt);
}
END_TEST

/* matmul + elementwise -> matmul: the epilogue (bias, activation) joins the
 * matmul; at level rules it does not. */
START_TEST(rule6_matmul_epilogue)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), w = in(g, "w", DIMS(8, 16)), b = in(g, "b", DIMS(16));
	int m = val(g, "m", DIMS(4, 16)), a = val(g, "a", DIMS(4, 16)), y = val(g, "y", DIMS(4, 16));

	node(g, "mm", AP_OP_MATMUL, LIST(x, w), LIST(m));
	node(g, "add", AP_OP_ADD, LIST(m, b), LIST(a));
	node(g, "relu", AP_OP_RELU, LIST(a), LIST(y));
	out(g, y);
	expect_level(g, AP_FUSE_RULES, "mm:mm>m | bc:add,relu>y");
	expect_groups_at(g, AP_FUSE_APOLLO, "mm:mm,add,relu>y");
}
END_TEST

/* An epilogue never broadcasts the matmul's result (that would compute
 * each dot product again per broadcast element). */
START_TEST(rule6_epilogue_no_broadcast)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), w = in(g, "w", DIMS(8, 1)), z = in(g, "z", DIMS(4, 16));
	int m = val(g, "m", DIMS(4, 1)), y = val(g, "y", DIMS(4, 16));
	built bt;

	node(g, "mm", AP_OP_MATMUL, LIST(x, w), LIST(m));
	node(g, "add", AP_OP_ADD, LIST(m, z), LIST(y));
	out(g, y);
	bt = build_opt(g, NULL, NULL);
	expect_summary(&bt, "mm:mm>m | bc:add>y");
	ck_assert_str_eq(reason_of(bt.p, "m"), "rule");
	ck_assert_ptr_nonnull(strstr(bt.p->boundaries[0].detail, "broadcast"));
	built_free(&bt);
}
END_TEST

/* elementwise + matmul -> matmul (prologue), within the recompute cap. */
START_TEST(rule6_matmul_prologue)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), w = in(g, "w", DIMS(8, 4));
	int r = val(g, "r", DIMS(4, 8)), y = val(g, "y", DIMS(4, 4));
	ap_partition_options tight = {.level = AP_FUSE_APOLLO, .max_recompute = 2};
	built bt;

	node(g, "relu", AP_OP_RELU, LIST(x), LIST(r));
	node(g, "mm", AP_OP_MATMUL, LIST(r, w), LIST(y));
	out(g, y);
	expect_level(g, AP_FUSE_RULES, "ew:relu>r | mm:mm>y");
	expect_level(g, AP_FUSE_APOLLO, "mm:relu,mm>y");
	/* each element of r is read by 4 outputs: over a cap of 2 */
	bt = build_opt(g, &tight, NULL);
	expect_summary(&bt, "ew:relu>r | mm:mm>y");
	ck_assert_str_eq(reason_of(bt.p, "r"), "recompute");
	built_free(&bt);
}
END_TEST

/* conv + elementwise -> conv, elementwise + conv -> conv. */
START_TEST(rule6_conv)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(1, 2, 5, 5)), w = in(g, "w", DIMS(2, 2, 1, 1));
	int r = val(g, "r", DIMS(1, 2, 5, 5)), c = val(g, "c", DIMS(1, 2, 5, 5));
	int y = val(g, "y", DIMS(1, 2, 5, 5));

	node(g, "relu", AP_OP_RELU, LIST(x), LIST(r));
	conv_attrs(g, node(g, "conv", AP_OP_CONV, LIST(r, w), LIST(c)));
	node(g, "sig", AP_OP_SIGMOID, LIST(c), LIST(y));
	out(g, y);
	expect_level(g, AP_FUSE_RULES, "ew:relu>r | conv:conv>c | ew:sig>y");
	expect_groups_at(g, AP_FUSE_APOLLO, "conv:relu,conv,sig>y");
}
END_TEST

/* Injective ops join the group they feed: a slice into an elementwise
 * consumer, a concat into a matmul prologue, a gather and a pad. */
START_TEST(injective_join_consumers)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), x2 = in(g, "x2", DIMS(4, 8)), w = in(g, "w", DIMS(16, 4));
	int idx = ap_graph_add_tensor(g, "idx", AP_DT_I32, 1, (int64_t[]){3}, AP_TENSOR_CONST,
				      (int32_t[]){0, 3, 1}, 12);
	int s = val(g, "s", DIMS(2, 8)), e = val(g, "e", DIMS(2, 8));
	int cc = val(g, "cc", DIMS(4, 16)), m = val(g, "m", DIMS(4, 4));
	int gt = val(g, "gt", DIMS(3, 8)), ge = val(g, "ge", DIMS(3, 8));
	int n;

	n = node(g, "slice", AP_OP_SLICE, LIST(x), LIST(s));
	ap_node_set_ints(g, n, "starts", (int64_t[]){1, 0}, 2);
	ap_node_set_ints(g, n, "steps", (int64_t[]){2, 1}, 2);
	node(g, "exp", AP_OP_EXP, LIST(s), LIST(e));
	n = node(g, "cat", AP_OP_CONCAT, LIST(x, x2), LIST(cc));
	ap_node_set_int(g, n, "axis", 1);
	node(g, "mm", AP_OP_MATMUL, LIST(cc, w), LIST(m));
	n = node(g, "gather", AP_OP_GATHER, LIST(x2, idx), LIST(gt));
	ap_node_set_int(g, n, "axis", 0);
	node(g, "neg", AP_OP_NEG, LIST(gt), LIST(ge));
	out(g, e);
	out(g, m);
	out(g, ge);
	expect_level(g, AP_FUSE_RULES, "inj:slice>s | ew:exp>e | inj:cat>cc | mm:mm>m | inj:gather>gt | ew:neg>ge");
	expect_groups_at(g, AP_FUSE_APOLLO, "inj:slice,exp>e | mm:cat,mm>m | inj:gather,neg>ge");
}
END_TEST

/* ---- acyclicity, caps, hints ------------------------------------------------------------ */

/* A merge whose groups are joined through a third group would make a
 * cycle: mm feeds the reduction and the division, the division reads the
 * reduction.  The guard checks reachability, not adjacency. */
START_TEST(acyclic_guard)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), w = in(g, "w", DIMS(8, 8));
	int m = val(g, "m", DIMS(4, 8)), s = val(g, "s", DIMS(4, 1)), y = val(g, "y", DIMS(4, 8));
	ap_partition_options rules = {.level = AP_FUSE_RULES};
	built bt;
	int n;

	node(g, "mm", AP_OP_MATMUL, LIST(x, w), LIST(m));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(m), LIST(s));
	reduce_attrs(g, n, 1, 1);
	node(g, "div", AP_OP_DIV, LIST(m, s), LIST(y));
	out(g, y);
	bt = build_opt(g, NULL, NULL);
	expect_summary(&bt, "mm:mm>m | red:sum>s | bc:div>y");
	for (int i = 0; i < bt.p->n_boundaries; i++)
		if (bt.p->group_of[bt.p->boundaries[i].producer] == 0 &&
		    bt.p->group_of[bt.p->boundaries[i].consumer] == 2)
			ck_assert_str_eq(ap_boundary_reason_key(bt.p->boundaries[i].reason), "cycle");
	ap_partition_free(bt.p);
	ap_graph_free(bt.eg);
	ap_expand_choices_clear(&bt.choices);
	/* the same with an elementwise producer at level rules (no recompute) */
	ap_graph_free(g);
	g = ap_graph_new("t2");
	x = in(g, "x", DIMS(4, 8));
	m = val(g, "e", DIMS(4, 8));
	s = val(g, "s", DIMS(4, 1));
	y = val(g, "y", DIMS(4, 8));
	node(g, "exp", AP_OP_EXP, LIST(x), LIST(m));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(m), LIST(s));
	reduce_attrs(g, n, 1, 1);
	node(g, "div", AP_OP_DIV, LIST(m, s), LIST(y));
	out(g, y);
	bt = build_opt(g, &rules, NULL);
	expect_summary(&bt, "ew:exp>e | red:sum>s | bc:div>y");
	built_free(&bt);
}
END_TEST

/* Random DAGs of elementwise, broadcast, reduction and matmul nodes, with
 * edges to recent and to distant producers: every partition is built
 * (the group graph stays acyclic, so the final topological sort succeeds)
 * and keeps its invariants, at each level and with a small size cap.  The
 * cycle check searches within a topological order of the groups that
 * every merge repairs (Pearce-Kelly): an order gone wrong would let a
 * merge close a cycle.  Deterministic (a fixed linear congruential
 * generator). */
static unsigned lcg(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (*s >> 16) & 0x7fff;
}

static ap_graph *random_dag(unsigned seed, int n_nodes)
{
	ap_graph *g = ap_graph_new("random");
	int *full = malloc((size_t)n_nodes * sizeof(int)), n_full = 0;   /* [4, 8] values */
	int *row = malloc((size_t)n_nodes * sizeof(int)), n_row = 0;     /* [4, 1] values */
	bool *read = calloc((size_t)n_nodes * 3 + 8, sizeof(bool));
	int w;
	char name[32];

	full[n_full++] = in(g, "x", DIMS(4, 8));
	w = in(g, "w", DIMS(8, 8));
	for (int i = 0; i < n_nodes; i++) {
		unsigned r = lcg(&seed) % 100;
		/* mostly a recent value, sometimes any earlier one */
		int a = lcg(&seed) % 4 ? full[n_full - 1 - (int)(lcg(&seed) % (n_full < 3 ? n_full : 3))]
				       : full[lcg(&seed) % n_full];
		int b = full[lcg(&seed) % n_full], t, n;

		snprintf(name, sizeof(name), "t%d", i);
		if (r < 20 && n_row > 0) {
			t = val(g, name, DIMS(4, 8));
			snprintf(name, sizeof(name), "n%d", i);
			node(g, name, AP_OP_ADD, LIST(a, row[lcg(&seed) % n_row]), LIST(t));
			full[n_full++] = t;
		} else if (r < 40) {
			t = val(g, name, DIMS(4, 1));
			snprintf(name, sizeof(name), "n%d", i);
			n = node(g, name, AP_OP_REDUCE_SUM, LIST(a), LIST(t));
			reduce_attrs(g, n, 1, 1);
			row[n_row++] = t;
		} else if (r < 55) {
			t = val(g, name, DIMS(4, 8));
			snprintf(name, sizeof(name), "n%d", i);
			node(g, name, AP_OP_MATMUL, LIST(a, w), LIST(t));
			full[n_full++] = t;
		} else if (r < 75) {
			t = val(g, name, DIMS(4, 8));
			snprintf(name, sizeof(name), "n%d", i);
			node(g, name, AP_OP_MUL, LIST(a, b), LIST(t));
			full[n_full++] = t;
		} else {
			t = val(g, name, DIMS(4, 8));
			snprintf(name, sizeof(name), "n%d", i);
			node(g, name, r < 88 ? AP_OP_EXP : AP_OP_TANH, LIST(a), LIST(t));
			full[n_full++] = t;
		}
	}
	/* outputs: every value nobody reads, and a few more */
	for (int n = 0; n < g->n_nodes; n++)
		for (int i = 0; i < g->nodes[n].n_inputs; i++)
			read[g->nodes[n].inputs[i]] = true;
	for (int t = 0; t < g->n_tensors; t++)
		if (g->tensors[t].kind == AP_TENSOR_VALUE && (!read[t] || lcg(&seed) % 16 == 0))
			out(g, t);
	free(full);
	free(row);
	free(read);
	return g;
}

START_TEST(random_dags_stay_acyclic)
{
	const ap_partition_options opts[] = {
		{.level = AP_FUSE_APOLLO}, {.level = AP_FUSE_RULES},
		{.level = AP_FUSE_APOLLO, .max_group_nodes = 4},
	};
	int cycles = 0;

	for (unsigned seed = 1; seed <= 60; seed++) {
		ap_graph *g = random_dag(seed, 20 + (int)(seed * 7 % 90));

		for (size_t o = 0; o < sizeof(opts) / sizeof(opts[0]); o++) {
			built b = build_opt(g, &opts[o], NULL);

			for (int i = 0; i < b.p->n_boundaries; i++)
				if (b.p->boundaries[i].reason == AP_WHY_CYCLE)
					cycles++;
			ap_partition_free(b.p);
			ap_graph_free(b.eg);
			ap_expand_choices_clear(&b.choices);
		}
		ap_graph_free(g);
	}
	ck_assert_int_gt(cycles, 0);   /* the guard had work to do */
}
END_TEST

/* Groups stay within max_group_nodes members. */
START_TEST(size_cap)
{
	ap_graph *g = ap_graph_new("t");
	int prev = in(g, "x", DIMS(16));
	ap_partition_options cap2 = {.level = AP_FUSE_APOLLO, .max_group_nodes = 2};
	const ap_op ops[] = {AP_OP_EXP, AP_OP_TANH, AP_OP_NEG, AP_OP_ABS, AP_OP_SQRT};
	built bt;

	for (int i = 0; i < 5; i++) {
		char name[8];
		int t;

		snprintf(name, sizeof(name), "t%d", i);
		t = val(g, name, DIMS(16));
		snprintf(name, sizeof(name), "n%d", i);
		node(g, name, ops[i], LIST(prev), LIST(t));
		prev = t;
	}
	out(g, prev);
	expect_level(g, AP_FUSE_APOLLO, "ew:n0,n1,n2,n3,n4>t4");
	bt = build_opt(g, &cap2, NULL);
	expect_summary(&bt, "ew:n0,n1>t1 | ew:n2,n3>t3 | ew:n4>t4");
	ck_assert_str_eq(reason_of(bt.p, "t1"), "size-cap");
	ck_assert_str_eq(reason_of(bt.p, "t3"), "size-cap");
	built_free(&bt);
}
END_TEST

/* A fusion barrier starts a new kernel: nothing before it joins it. */
START_TEST(barrier_hint)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(16));
	int a = val(g, "a", DIMS(16)), b = val(g, "b", DIMS(16)), y = val(g, "y", DIMS(16));
	ap_partition_options hint = {.level = AP_FUSE_APOLLO, .n_barriers = 1,
				     .barriers = (char *[]){"tanh"}};
	built bt;

	node(g, "exp", AP_OP_EXP, LIST(x), LIST(a));
	node(g, "tanh", AP_OP_TANH, LIST(a), LIST(b));
	node(g, "neg", AP_OP_NEG, LIST(b), LIST(y));
	out(g, y);
	bt = build_opt(g, &hint, NULL);
	expect_summary(&bt, "ew:exp>a | ew:tanh,neg>y");
	ck_assert_str_eq(reason_of(bt.p, "a"), "hint");
	built_free(&bt);
}
END_TEST

/* ---- recompute ------------------------------------------------------------------------ */

/* x - m feeds a reduction (via d*d) and a division: duplicating the cheap
 * producers into both consumers saves writing d and d*d and reading them
 * back (layer normalisation's shape). */
START_TEST(recompute_saves_bytes)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 64)), mu = in(g, "mu", DIMS(4, 1));
	int d = val(g, "d", DIMS(4, 64)), q = val(g, "q", DIMS(4, 64)), s = val(g, "s", DIMS(4, 1));
	int y = val(g, "y", DIMS(4, 64));
	built bt;
	int n;

	node(g, "sub", AP_OP_SUB, LIST(x, mu), LIST(d));
	node(g, "sq", AP_OP_MUL, LIST(d, d), LIST(q));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(q), LIST(s));
	reduce_attrs(g, n, 1, 1);
	node(g, "div", AP_OP_DIV, LIST(d, s), LIST(y));
	out(g, y);
	expect_level(g, AP_FUSE_RULES, "bc:sub,sq>d,q | red:sum>s | bc:div>y");
	bt = build_opt(g, NULL, NULL);
	expect_summary(&bt, "red:sub,sq,sum>s | bc:sub,div>y");
	ck_assert_int_eq(bt.p->n_recomputed, 3);
	ck_assert_ptr_ne(bt.p->g, bt.eg);     /* the partition owns the rewritten graph */
	built_free(&bt);
}
END_TEST

/* (a + b) + c read by two reductions: recomputing it in both would read
 * a, b and c twice -- no bytes saved, so the boundary stays. */
START_TEST(recompute_only_when_it_saves_bytes)
{
	ap_graph *g = ap_graph_new("t");
	int a = in(g, "a", DIMS(4, 64)), b = in(g, "b", DIMS(4, 64)), c = in(g, "c", DIMS(4, 64));
	int ab = val(g, "ab", DIMS(4, 64)), p = val(g, "p", DIMS(4, 64));
	int s = val(g, "s", DIMS(4, 1)), mx = val(g, "mx", DIMS(4, 1));
	built bt;
	int n;

	node(g, "add1", AP_OP_ADD, LIST(a, b), LIST(ab));
	node(g, "add2", AP_OP_ADD, LIST(ab, c), LIST(p));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(p), LIST(s));
	reduce_attrs(g, n, 1, 1);
	n = node(g, "max", AP_OP_REDUCE_MAX, LIST(p), LIST(mx));
	reduce_attrs(g, n, 1, 1);
	out(g, s);
	out(g, mx);
	bt = build_opt(g, NULL, NULL);
	expect_summary(&bt, "bc:add1,add2>p | red:sum>s | red:max>mx");
	ck_assert_int_eq(bt.p->n_recomputed, 0);
	ck_assert_str_eq(reason_of(bt.p, "p"), "recompute");
	ck_assert_ptr_nonnull(strstr(bt.p->boundaries[0].detail, "would not save"));
	built_free(&bt);
}
END_TEST

/* ---- opening compound ops, keep_whole ----------------------------------------------------- */

/* Softmax opens into max, exp and sum; the exp is recomputed by the sum and
 * by the division; nodes keep the original name. */
START_TEST(softmax_opened)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(2, 16)), y = val(g, "y", DIMS(2, 16));
	int n = node(g, "sm", AP_OP_SOFTMAX, LIST(x), LIST(y));

	ap_node_set_ints(g, n, "axes", (int64_t[]){1}, 1);
	out(g, y);
	expect_level(g, AP_FUSE_RULES,
		     "red:sm>sm/ReduceMax0 | bc:sm,sm>sm/Exp2 | red:sm>sm/ReduceSum3 | bc:sm>y");
	expect_groups_at(g, AP_FUSE_APOLLO, "red:sm>sm/ReduceMax0 | red:sm,sm,sm>sm/ReduceSum3 | bc:sm,sm,sm>y");
}
END_TEST

/* A compound op kept whole is one sealed group; the choice is recorded. */
START_TEST(keep_whole)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(2, 16));
	int e = val(g, "e", DIMS(2, 16)), s = val(g, "s", DIMS(2, 16)), y = val(g, "y", DIMS(2, 16));
	ap_expand_options keep = {.n_keep_whole = 1, .keep_whole = (char *[]){"Softmax"}};
	built bt;
	int n;

	node(g, "exp", AP_OP_EXP, LIST(x), LIST(e));
	n = node(g, "sm", AP_OP_SOFTMAX, LIST(e), LIST(s));
	ap_node_set_ints(g, n, "axes", (int64_t[]){1}, 1);
	node(g, "neg", AP_OP_NEG, LIST(s), LIST(y));
	out(g, y);
	bt = build_opt(g, NULL, &keep);
	expect_summary(&bt, "ew:exp>e | whole:sm,sm,sm,sm,sm>s | ew:neg>y");
	ck_assert_str_eq(reason_of(bt.p, "e"), "keep-whole");
	ck_assert_str_eq(reason_of(bt.p, "s"), "keep-whole");
	ck_assert_int_eq(bt.choices.n, 1);
	ck_assert_int_eq(bt.choices.items[0].op, AP_OP_SOFTMAX);
	ck_assert(!bt.choices.items[0].opened);
	ck_assert_int_eq(bt.choices.items[0].n_primitives, 5);
	ap_partition_free(bt.p);
	ap_graph_free(bt.eg);
	ap_expand_choices_clear(&bt.choices);
	/* opened by default */
	bt = build_opt(g, NULL, NULL);
	ck_assert_int_eq(bt.choices.n, 1);
	ck_assert(bt.choices.items[0].opened);
	ck_assert_int_eq(bt.p->n_groups, 3);
	built_free(&bt);
}
END_TEST

/* Elementwise activations stay whole unless open_all; opened, they are
 * chains of primitives in one group. */
START_TEST(activations_registry)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(16)), y = val(g, "y", DIMS(16));
	ap_expand_options all = {.open_all = true};
	built bt;

	node(g, "gelu", AP_OP_GELU, LIST(x), LIST(y));
	out(g, y);
	ck_assert(ap_partition_has_expansion(AP_OP_GELU));
	ck_assert(ap_partition_has_expansion(AP_OP_GEMM));
	ck_assert(!ap_partition_has_expansion(AP_OP_RELU));
	bt = build_opt(g, NULL, NULL);
	expect_summary(&bt, "ew:gelu>y");
	ck_assert(!bt.choices.items[0].opened);
	ap_partition_free(bt.p);
	ap_graph_free(bt.eg);
	ap_expand_choices_clear(&bt.choices);
	bt = build_opt(g, NULL, &all);
	ck_assert(bt.choices.items[0].opened);
	ck_assert_int_eq(bt.p->n_groups, 1);
	ck_assert_int_eq(bt.p->groups[0].n_nodes, bt.choices.items[0].n_primitives);
	ck_assert_int_ge(bt.p->groups[0].n_nodes, 5);
	built_free(&bt);
}
END_TEST

/* Gemm's transposed operand stays with its MatMul at every level. */
START_TEST(gemm_at_every_level)
{
	ap_graph *g = ap_graph_new("t");
	int a = in(g, "a", DIMS(3, 4)), w = in(g, "w", DIMS(5, 4)), c = in(g, "c", DIMS(5));
	int y = val(g, "y", DIMS(3, 5)), z = val(g, "z", DIMS(3, 5));
	int n;

	n = node(g, "gemm", AP_OP_GEMM, LIST(a, w, c), LIST(y));
	ap_node_set_int(g, n, "transB", 1);
	node(g, "relu", AP_OP_RELU, LIST(y), LIST(z));
	out(g, z);
	expect_level(g, AP_FUSE_NONE, "mm:gemm,gemm>gemm/MatMul1 | bc:gemm>y | ew:relu>z");
	expect_level(g, AP_FUSE_RULES, "mm:gemm,gemm>gemm/MatMul1 | bc:gemm,relu>z");
	expect_groups_at(g, AP_FUSE_APOLLO, "mm:gemm,gemm,gemm,relu>z");
}
END_TEST

/* ---- views, dead nodes ------------------------------------------------------------------- */

START_TEST(views_read_through)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(2, 6));
	int r = val(g, "r", DIMS(3, 4)), y = val(g, "y", DIMS(3, 4)), r2 = val(g, "r2", DIMS(12));

	node(g, "reshape", AP_OP_RESHAPE, LIST(x), LIST(r));
	node(g, "relu", AP_OP_RELU, LIST(r), LIST(y));
	node(g, "flat", AP_OP_RESHAPE, LIST(y), LIST(r2));
	out(g, r2);
	expect_groups_at(g, AP_FUSE_APOLLO, "ew:relu,flat>r2");
}
END_TEST

START_TEST(dead_nodes_and_constant_fills)
{
	ap_graph *g = ap_graph_new("t");
	float one = 1.0f;
	int x = in(g, "x", DIMS(8, 8));
	int k = tensor(g, "k", AP_TENSOR_CONST, &one, 0, NULL);
	int f = val(g, "fill", DIMS(8, 8)), y = val(g, "y", DIMS(8, 8)), d = val(g, "dead", DIMS(8, 8));
	int m = val(g, "m", DIMS(8, 8));

	node(g, "expand", AP_OP_EXPAND, LIST(k), LIST(f));
	node(g, "mm", AP_OP_MATMUL, LIST(x, x), LIST(m));
	node(g, "dead", AP_OP_EXP, LIST(x), LIST(d));
	node(g, "add", AP_OP_ADD, LIST(m, f), LIST(y));
	out(g, y);
	expect_level(g, AP_FUSE_RULES, "mm:mm>m | bc:add>y");
	expect_groups_at(g, AP_FUSE_APOLLO, "mm:mm,add>y");
}
END_TEST

/* ---- sub-graphs --------------------------------------------------------------------------- */

static void lrn_attrs(ap_graph *g, int n)
{
	ap_node_set_int(g, n, "size", 3);
	ap_node_set_float(g, n, "alpha", 1e-4);
	ap_node_set_float(g, n, "beta", 0.75);
	ap_node_set_float(g, n, "bias", 1.0);
}

/* Opaque ops split sub-graphs; an independent branch is its own sub-graph
 * in wave 0. */
START_TEST(subgraphs)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(1, 2, 4, 4)), z = in(g, "z", DIMS(8));
	int r = val(g, "r", DIMS(1, 2, 4, 4)), p = val(g, "p", DIMS(1, 2, 4, 4));
	int y = val(g, "y", DIMS(1, 2, 4, 4)), e = val(g, "e", DIMS(8));
	built bt;
	int n;

	node(g, "relu", AP_OP_RELU, LIST(x), LIST(r));
	n = node(g, "pool", AP_OP_LRN, LIST(r), LIST(p));   /* opaque */
	lrn_attrs(g, n);
	node(g, "sig", AP_OP_SIGMOID, LIST(p), LIST(y));
	node(g, "exp", AP_OP_EXP, LIST(z), LIST(e));
	out(g, y);
	out(g, e);
	bt = build_opt(g, NULL, NULL);
	expect_summary(&bt, "ew:relu>r | opaque:pool>p | ew:sig>y | ew:exp>e");
	ck_assert_str_eq(reason_of(bt.p, "r"), "opaque");
	ck_assert_str_eq(reason_of(bt.p, "p"), "opaque");
	ck_assert_int_eq(bt.p->n_subgraphs, 4);
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(bt.p->groups[i].subgraph, i);
	ck_assert_int_eq(bt.p->subgraphs[0].wave, 0);
	ck_assert_int_eq(bt.p->subgraphs[1].wave, 1);
	ck_assert_int_eq(bt.p->subgraphs[2].wave, 2);
	ck_assert_int_eq(bt.p->subgraphs[3].wave, 0);
	ck_assert_int_eq(bt.p->subgraphs[2].n_deps, 1);
	ck_assert_int_eq(bt.p->subgraphs[2].deps[0], 1);
	ck_assert_int_eq(bt.p->subgraphs[3].n_deps, 0);
	built_free(&bt);
}
END_TEST

/* A region that reaches around an opaque op is one sub-graph with it (the
 * sub-graphs must form a DAG). */
START_TEST(subgraph_around_opaque)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(1, 2, 4, 4));
	int r = val(g, "r", DIMS(1, 2, 4, 4)), p = val(g, "p", DIMS(1, 2, 4, 4));
	int y = val(g, "y", DIMS(1, 2, 4, 4));
	built bt;
	int n;

	node(g, "relu", AP_OP_RELU, LIST(x), LIST(r));
	n = node(g, "pool", AP_OP_LRN, LIST(r), LIST(p));   /* opaque */
	lrn_attrs(g, n);
	node(g, "add", AP_OP_ADD, LIST(r, p), LIST(y));
	out(g, y);
	bt = build_opt(g, NULL, NULL);
	expect_summary(&bt, "ew:relu>r | opaque:pool>p | bc:add>y");
	ck_assert_int_eq(bt.p->n_subgraphs, 1);
	built_free(&bt);
}
END_TEST

/* ---- feedback ------------------------------------------------------------------------------ */

START_TEST(split_on_refusal)
{
	ap_graph *g = ap_graph_new("t");
	int prev = in(g, "x", DIMS(16)), z = in(g, "z", DIMS(16));
	int zo = val(g, "zo", DIMS(16));
	ap_graph *g2;
	built bt;

	for (int i = 0; i < 5; i++) {
		char name[8];
		int t;

		snprintf(name, sizeof(name), "t%d", i);
		t = val(g, name, DIMS(16));
		snprintf(name, sizeof(name), "n%d", i);
		node(g, name, AP_OP_EXP, LIST(prev), LIST(t));
		prev = t;
	}
	node(g, "neg", AP_OP_NEG, LIST(z), LIST(zo));
	out(g, prev);
	out(g, zo);
	g2 = ap_graph_copy(g);
	bt = build_opt(g, NULL, NULL);
	expect_summary(&bt, "ew:n0,n1,n2,n3,n4>t4 | ew:neg>zo");
	/* no place named (a size limit): halves */
	ck_assert_int_eq(ap_partition_cut(bt.p, 0, NULL, 0, "lowering", "too big"), 2);
	expect_summary(&bt, "ew:n0,n1,n2>t2 | ew:n3,n4>t4 | ew:neg>zo");
	ck_assert_str_eq(reason_of(bt.p, "t2"), "refused");
	ck_assert_ptr_nonnull(strstr(bt.p->boundaries[0].detail, "refused by lowering: too big"));
	ck_assert_int_eq(ap_partition_cut(bt.p, 0, NULL, 0, "lowering", "still"), 2);
	expect_summary(&bt, "ew:n0,n1>t1 | ew:n2>t2 | ew:n3,n4>t4 | ew:neg>zo");
	ck_assert_int_eq(bt.p->groups[1].n_refusals, 2);
	ck_assert_int_eq(ap_partition_cut(bt.p, 3, NULL, 0, "lowering", "single"), AP_EINVAL);
	ck_assert_int_eq(ap_partition_cut(bt.p, 9, NULL, 0, "lowering", "none"), AP_EINVAL);
	check_invariants(bt.p);
	built_free(&bt);

	/* a refusal that names a node cuts around it: the runs before, at and
	 * after it, in topological order */
	bt = build_opt(g2, NULL, NULL);
	{
		int n2 = -1, all[5];

		for (int i = 0; i < bt.p->g->n_nodes; i++)
			if (strcmp(bt.p->g->nodes[i].name, "n2") == 0)
				n2 = i;
		ck_assert_int_ge(n2, 0);
		ck_assert_int_eq(ap_partition_cut(bt.p, 0, &n2, 1, "the backend", "n2 fails"), 3);
		expect_summary(&bt, "ew:n0,n1>t1 | ew:n2>t2 | ew:n3,n4>t4 | ew:neg>zo");
		ck_assert_ptr_nonnull(strstr(bt.p->boundaries[0].detail, "refused by the backend: n2 fails"));
		check_invariants(bt.p);
		/* a cut holding every member leaves one piece: refused */
		for (int i = 0; i < 2; i++)
			all[i] = bt.p->groups[0].nodes[i];
		ck_assert_int_eq(ap_partition_cut(bt.p, 0, all, 2, "lowering", "all"), AP_EINVAL);
	}
	built_free(&bt);
}
END_TEST

/* ---- dumps -------------------------------------------------------------------------------- */

START_TEST(dump_format)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), s = val(g, "s", DIMS(4)), y = val(g, "y", DIMS(4));
	char *text = NULL;
	size_t len = 0;
	FILE *f;
	built bt;
	int n;

	n = node(g, "mean", AP_OP_REDUCE_MEAN, LIST(x), LIST(s));
	reduce_attrs(g, n, 1, 0);
	node(g, "neg", AP_OP_NEG, LIST(s), LIST(y));
	out(g, y);
	bt = build_opt(g, NULL, NULL);
	f = open_memstream(&text, &len);
	ck_assert_int_eq(ap_partition_dump(bt.p, f), 0);
	fclose(f);
	ck_assert_str_eq(text,
			 "group 0 reduction sub=0 root=ReduceSum(mean) nodes=[ReduceSum(mean)] views=[] "
			 "out=[mean/ReduceSum0:float32[4]] in=[x:float32[4,8]]\n"
			 "group 1 broadcast sub=0 root=Neg(neg) nodes=[Div(mean) Neg(neg)] views=[] "
			 "out=[y:float32[4]] in=[mean/ReduceSum0:float32[4]]\n"
			 "edge 0 -> 1 mean/ReduceSum0: rule: a reduction ends its micro-graph\n");
	free(text);
	text = NULL;
	f = open_memstream(&text, &len);
	ck_assert_int_eq(ap_partition_dump_json(bt.p, f), 0);
	fclose(f);
	ck_assert_str_eq(text,
			 "{\"level\":\"apollo\",\"groups\":["
			 "{\"kind\":\"reduction\",\"subgraph\":0,\"root\":\"mean\",\"nodes\":[\"mean\"],"
			 "\"ops\":[\"ReduceSum\"],\"outputs\":[\"mean/ReduceSum0\"],\"inputs\":[\"x\"]},"
			 "{\"kind\":\"broadcast\",\"subgraph\":0,\"root\":\"neg\",\"nodes\":[\"mean\",\"neg\"],"
			 "\"ops\":[\"Div\",\"Neg\"],\"outputs\":[\"y\"],\"inputs\":[\"mean/ReduceSum0\"]}],"
			 "\"boundaries\":[{\"producer\":0,\"consumer\":1,\"tensor\":\"mean/ReduceSum0\","
			 "\"reason\":\"rule\",\"detail\":\"rule: a reduction ends its micro-graph\"}],"
			 "\"subgraphs\":[{\"wave\":0,\"deps\":[]}]}\n");
	free(text);
	built_free(&bt);
	ck_assert_ptr_null(ap_partition_free(NULL));
}
END_TEST

static Suite *partition_suite(void)
{
	Suite *s = suite_create("partition");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, rule1_elementwise);
	tcase_add_test(tc, rule2_broadcast_elementwise);
	tcase_add_test(tc, rule3_broadcast_broadcast);
	tcase_add_test(tc, rule4_elementwise_reduction);
	tcase_add_test(tc, rule5_broadcast_reduction_ends_group);
	tcase_add_test(tc, rule6_transpose);
	tcase_add_test(tc, rule6_matmul_epilogue);
	tcase_add_test(tc, rule6_epilogue_no_broadcast);
	tcase_add_test(tc, rule6_matmul_prologue);
	tcase_add_test(tc, rule6_conv);
	tcase_add_test(tc, injective_join_consumers);
	tcase_add_test(tc, acyclic_guard);
	tcase_add_test(tc, random_dags_stay_acyclic);
	tcase_add_test(tc, size_cap);
	tcase_add_test(tc, barrier_hint);
	tcase_add_test(tc, recompute_saves_bytes);
	tcase_add_test(tc, recompute_only_when_it_saves_bytes);
	tcase_add_test(tc, softmax_opened);
	tcase_add_test(tc, keep_whole);
	tcase_add_test(tc, activations_registry);
	tcase_add_test(tc, gemm_at_every_level);
	tcase_add_test(tc, views_read_through);
	tcase_add_test(tc, dead_nodes_and_constant_fills);
	tcase_add_test(tc, subgraphs);
	tcase_add_test(tc, subgraph_around_opaque);
	tcase_add_test(tc, split_on_refusal);
	tcase_add_test(tc, dump_format);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(partition_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
