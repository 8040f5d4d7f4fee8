/* check_partition.c -- opening compound ops (expand.c) and the fusion
 * groups (partition.c), checked structurally: which nodes land in which
 * group, the group kinds, what each group writes and reads.
 *
 * Each case builds a small graph by hand, validates it, expands it and
 * partitions it, then compares a one-line-per-group summary
 * ("kind:node,node>out,out") with the expected text.
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

/* "kind:a,b>t,u" per group, joined by " | ". */
static char *summary(const ap_partition *p)
{
	static const char *const kinds[] = {"ew", "bc", "red", "single"};
	size_t cap = 4096, len = 0;
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

static void expect_groups(ap_graph *g, const char *want)
{
	ap_error err;
	ap_graph *eg;
	ap_partition *p;
	char *got;

	ap_error_clear(&err);
	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	eg = ap_partition_expand(g, &err);
	ck_assert_msg(eg != NULL, "expand: %s", err.msg);
	p = ap_partition_build(eg, &err);
	ck_assert_msg(p != NULL, "partition: %s", err.msg);
	got = summary(p);
	ck_assert_msg(strcmp(got, want) == 0, "groups:\n  got  %s\n  want %s", got, want);
	/* every live node of the primitive graph is in exactly one group or
	 * read through; groups come producers first */
	for (int i = 0; i < p->n_groups; i++)
		for (int j = 0; j < p->groups[i].n_inputs; j++) {
			int prod = eg->tensors[p->groups[i].inputs[j]].producer;
			if (prod >= 0 && p->group_of[prod] >= 0)
				ck_assert_int_lt(p->group_of[prod], i);
		}
	free(got);
	ap_partition_free(p);
	ap_graph_free(eg);
	ap_graph_free(g);
}

/* (1) ew+ew, (2) bc+ew: one broadcast group, intermediates not written. */
START_TEST(rules_elementwise_broadcast)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), b = in(g, "b", DIMS(8));
	int a = val(g, "a", DIMS(4, 8)), c = val(g, "c", DIMS(4, 8)), y = val(g, "y", DIMS(4, 8));

	node(g, "exp", AP_OP_EXP, LIST(x), LIST(a));
	node(g, "add", AP_OP_ADD, LIST(a, b), LIST(c));
	node(g, "tanh", AP_OP_TANH, LIST(c), LIST(y));
	out(g, y);
	expect_groups(g, "bc:exp,add,tanh>y");
}
END_TEST

/* (4), (5): producers join the reduction, which ends the group. */
START_TEST(rules_reduction_ends_group)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), b = in(g, "b", DIMS(4, 1));
	int a = val(g, "a", DIMS(4, 8)), s = val(g, "s", DIMS(4, 1)), y = val(g, "y", DIMS(4, 1));
	int n;

	node(g, "mul", AP_OP_MUL, LIST(x, b), LIST(a));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(a), LIST(s));
	reduce_attrs(g, n, 1, 1);
	node(g, "sqrt", AP_OP_SQRT, LIST(s), LIST(y));
	out(g, y);
	expect_groups(g, "red:mul,sum>s | ew:sqrt>y");
}
END_TEST

/* A producer read by a group it cannot join is written once: exp feeds
 * the reduction and the division; merging it into the division would make
 * a cycle (exp -> sum -> div), merging it into the sum would make the sum
 * write e. */
START_TEST(acyclic_and_written_tensors)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8));
	int e = val(g, "e", DIMS(4, 8)), s = val(g, "s", DIMS(4, 1)), y = val(g, "y", DIMS(4, 8));
	int n;

	node(g, "exp", AP_OP_EXP, LIST(x), LIST(e));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(e), LIST(s));
	reduce_attrs(g, n, 1, 1);
	node(g, "div", AP_OP_DIV, LIST(e, s), LIST(y));
	out(g, y);
	expect_groups(g, "ew:exp>e | red:sum>s | bc:div>y");
}
END_TEST

/* A group may write several tensors of the iteration space's shape, but a
 * smaller intermediate read elsewhere stays in its own group. */
START_TEST(multi_output_same_shape_only)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), v = in(g, "v", DIMS(8));
	int e = val(g, "e", DIMS(4, 8)), y = val(g, "y", DIMS(4, 8));
	int w = val(g, "w", DIMS(8)), z = val(g, "z", DIMS(4, 8));

	node(g, "exp", AP_OP_EXP, LIST(x), LIST(e));
	node(g, "neg", AP_OP_NEG, LIST(e), LIST(y));
	node(g, "abs", AP_OP_ABS, LIST(v), LIST(w));
	node(g, "mul", AP_OP_MUL, LIST(x, w), LIST(z));
	out(g, e);
	out(g, y);
	out(g, z);
	out(g, w);
	expect_groups(g, "ew:exp,neg>e,y | ew:abs>w | bc:mul>z");
}
END_TEST

/* Views are read through; a view that is a graph output is a copy. */
START_TEST(views_read_through)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(2, 6));
	int r = val(g, "r", DIMS(3, 4)), y = val(g, "y", DIMS(3, 4)), r2 = val(g, "r2", DIMS(12));

	node(g, "reshape", AP_OP_RESHAPE, LIST(x), LIST(r));
	node(g, "relu", AP_OP_RELU, LIST(r), LIST(y));
	node(g, "flat", AP_OP_RESHAPE, LIST(y), LIST(r2));
	out(g, r2);
	expect_groups(g, "ew:relu,flat>r2");
}
END_TEST

/* MatMul, Conv, Transpose... are groups of their own; a Transpose read only
 * by a MatMul joins it (Gemm's transB). */
START_TEST(single_ops_and_gemm)
{
	ap_graph *g = ap_graph_new("t");
	int a = in(g, "a", DIMS(3, 4)), w = in(g, "w", DIMS(5, 4)), c = in(g, "c", DIMS(5));
	int y = val(g, "y", DIMS(3, 5)), z = val(g, "z", DIMS(3, 5));
	int n;

	n = node(g, "gemm", AP_OP_GEMM, LIST(a, w, c), LIST(y));
	ap_node_set_int(g, n, "transB", 1);
	node(g, "relu", AP_OP_RELU, LIST(y), LIST(z));
	out(g, z);
	expect_groups(g, "single:gemm,gemm>gemm/MatMul1 | bc:gemm,relu>z");
}
END_TEST

/* Softmax opens into max, exp and sum; nodes keep the original name. */
START_TEST(softmax_opened)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(2, 16)), y = val(g, "y", DIMS(2, 16));
	int n = node(g, "sm", AP_OP_SOFTMAX, LIST(x), LIST(y));

	ap_node_set_ints(g, n, "axes", (int64_t[]){1}, 1);
	out(g, y);
	expect_groups(g, "red:sm>sm/ReduceMax0 | bc:sm,sm>sm/Exp2 | red:sm>sm/ReduceSum3 | bc:sm>y");
}
END_TEST

/* Dead nodes are dropped; an Expand of a constant is read through. */
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
	expect_groups(g, "single:mm>m | bc:add>y");
}
END_TEST

START_TEST(dump_format)
{
	ap_graph *g = ap_graph_new("t");
	int x = in(g, "x", DIMS(4, 8)), s = val(g, "s", DIMS(4)), y = val(g, "y", DIMS(4));
	ap_error err;
	ap_graph *eg;
	ap_partition *p;
	char *text = NULL;
	size_t len = 0;
	FILE *f;
	int n;

	n = node(g, "mean", AP_OP_REDUCE_MEAN, LIST(x), LIST(s));
	reduce_attrs(g, n, 1, 0);
	node(g, "neg", AP_OP_NEG, LIST(s), LIST(y));
	out(g, y);
	ck_assert_int_eq(ap_graph_validate(g, &err), 0);
	eg = ap_partition_expand(g, &err);
	p = ap_partition_build(eg, &err);
	f = open_memstream(&text, &len);
	ck_assert_int_eq(ap_partition_dump(p, f), 0);
	fclose(f);
	ck_assert_str_eq(text,
			 "group 0 reduction root=ReduceSum(mean) nodes=[ReduceSum(mean)] views=[] "
			 "out=[mean/ReduceSum0:float32[4]] in=[x:float32[4,8]]\n"
			 "group 1 broadcast root=Neg(neg) nodes=[Div(mean) Neg(neg)] views=[] "
			 "out=[y:float32[4]] in=[mean/ReduceSum0:float32[4]]\n");
	free(text);
	ap_partition_free(p);
	ap_graph_free(eg);
	ap_graph_free(g);
}
END_TEST

static Suite *partition_suite(void)
{
	Suite *s = suite_create("partition");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, rules_elementwise_broadcast);
	tcase_add_test(tc, rules_reduction_ends_group);
	tcase_add_test(tc, acyclic_and_written_tensors);
	tcase_add_test(tc, multi_output_same_shape_only);
	tcase_add_test(tc, views_read_through);
	tcase_add_test(tc, single_ops_and_gemm);
	tcase_add_test(tc, softmax_opened);
	tcase_add_test(tc, dead_nodes_and_constant_fills);
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
