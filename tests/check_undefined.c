/* check_undefined.c -- regression tests for undefined behaviour that only
 * a sanitizer sees (issue 11, item 8).  `make check` builds this suite,
 * and the libraries it links, with -fsanitize=undefined (plus address)
 * and -fno-sanitize-recover=all into $(SAN_BUILD), so each case below
 * aborts on the code it was written against and passes once the UB is
 * gone; the same tree runs every suite in `make check-asan`.
 *
 * Covered: ConstantOfShape whose float value is NaN, infinite or beyond
 * int64 (the importer cast it to int64: UB, C11 6.3.1.4); a compile of a
 * single-sub-graph program, which sorted and copied empty dependency lists
 * through NULL pointers (qsort(NULL, 0) in partition, memcpy(dst, NULL, 0)
 * in plan: C11 7.1.4, 7.24.1p2).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/graph.h"
#include "proto/onnx.pb-c.h"
#include "server/plan/program.h"

/* A model: out = ConstantOfShape(shape = [2, 3], value = float `v`), with
 * the shape given as an int64 initializer. */
static ap_graph *constant_of_shape(float v, int elem_type, ap_error *err)
{
	Onnx__ModelProto m = ONNX__MODEL_PROTO__INIT;
	Onnx__GraphProto g = ONNX__GRAPH_PROTO__INIT;
	Onnx__OperatorSetIdProto os = ONNX__OPERATOR_SET_ID_PROTO__INIT;
	Onnx__OperatorSetIdProto *osp[1] = { &os };
	Onnx__NodeProto n = ONNX__NODE_PROTO__INIT, *np[1] = { &n };
	Onnx__AttributeProto a = ONNX__ATTRIBUTE_PROTO__INIT, *ap[1] = { &a };
	Onnx__TensorProto value = ONNX__TENSOR_PROTO__INIT;
	Onnx__TensorProto shape = ONNX__TENSOR_PROTO__INIT, *inits[1] = { &shape };
	Onnx__ValueInfoProto out = ONNX__VALUE_INFO_PROTO__INIT, *outs[1] = { &out };
	Onnx__TypeProto tp = ONNX__TYPE_PROTO__INIT;
	Onnx__TypeProto__Tensor tt = ONNX__TYPE_PROTO__TENSOR__INIT;
	int64_t shape_dims[1] = { 2 }, shape_vals[2] = { 2, 3 }, one[1] = { 1 };
	double dv = v;
	char *in_names[1] = { "shape" }, *out_names[1] = { "out" };
	uint8_t *buf;
	size_t len;
	ap_graph *r;

	os.domain = "";
	os.has_version = 1;
	os.version = 13;
	m.has_ir_version = 1;
	m.ir_version = 7;
	m.n_opset_import = 1;
	m.opset_import = osp;
	m.graph = &g;
	g.name = "cos";
	shape.name = "shape";
	shape.has_data_type = 1;
	shape.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
	shape.n_dims = 1;
	shape.dims = shape_dims;
	shape.n_int64_data = 2;
	shape.int64_data = shape_vals;
	g.n_initializer = 1;
	g.initializer = inits;
	value.name = "value";
	value.has_data_type = 1;
	value.data_type = elem_type;
	value.n_dims = 1;
	value.dims = one;
	if (elem_type == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE) {
		value.n_double_data = 1;
		value.double_data = &dv;
	} else {
		value.n_float_data = 1;
		value.float_data = &v;
	}
	a.name = "value";
	a.has_type = 1;
	a.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
	a.t = &value;
	n.op_type = "ConstantOfShape";
	n.name = "cos";
	n.n_input = 1;
	n.input = in_names;
	n.n_output = 1;
	n.output = out_names;
	n.n_attribute = 1;
	n.attribute = ap;
	g.n_node = 1;
	g.node = np;
	tt.has_elem_type = 1;
	tt.elem_type = elem_type;
	tp.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
	tp.tensor_type = &tt;
	out.name = "out";
	out.type = &tp;
	g.n_output = 1;
	g.output = outs;

	len = onnx__model_proto__get_packed_size(&m);
	buf = malloc(len);
	ck_assert_ptr_nonnull(buf);
	onnx__model_proto__pack(&m, buf);
	r = ap_onnx_import(buf, len, NULL, 0, NULL, err);
	free(buf);
	return r;
}

START_TEST(constant_of_shape_float_values)
{
	const float values[] = { NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 9.3e18f, 2.5f };
	const int types[] = { ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT,
			      ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE };

	for (size_t t = 0; t < 2; t++) {
		for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
			ap_error err;
			ap_graph *g = constant_of_shape(values[i], types[t], &err);
			const ap_tensor *o;

			ck_assert_msg(g != NULL, "value %g: %s", values[i], err.msg);
			/* folded: the output is produced from a CONST holding the
			 * value (NaN stays NaN) */
			o = &g->tensors[g->outputs[0]];
			ck_assert_int_eq(o->rank, 2);
			ck_assert_int_eq(o->dims[1], 3);
			for (int k = 0; k < g->n_tensors; k++) {
				const ap_tensor *c = &g->tensors[k];
				double x;

				if (c->kind != AP_TENSOR_CONST || c->nbytes < 4)
					continue;
				x = c->dtype == AP_DT_F64 ? *(double *)c->data : *(float *)c->data;
				ck_assert(isnan(values[i]) ? isnan(x) : x == (double)values[i]);
			}
			ap_graph_free(g);
		}
	}
}
END_TEST

/* y = Relu(x): one launch, one sub-graph with no dependencies. */
START_TEST(program_without_subgraph_deps)
{
	ap_graph *g = ap_graph_new("relu");
	int64_t d[2] = { 4, 8 };
	int x, y;
	ap_error err;
	ap_program *p;

	x = ap_graph_add_tensor(g, "x", AP_DT_F32, 2, d, AP_TENSOR_INPUT, NULL, 0);
	y = ap_graph_add_tensor(g, "y", AP_DT_F32, 2, d, AP_TENSOR_VALUE, NULL, 0);
	ck_assert_int_ge(ap_graph_add_node(g, "relu", AP_OP_RELU, 1, &x, 1, &y), 0);
	g->inputs = malloc(sizeof(int));
	g->outputs = malloc(sizeof(int));
	g->inputs[0] = x;
	g->outputs[0] = y;
	g->n_inputs = g->n_outputs = 1;
	g->tensors[y].is_output = true;
	ck_assert_int_eq(ap_graph_validate(g, &err), 0);
	p = ap_program_build(g, NULL, &err);
	ck_assert_msg(p != NULL, "%s", err.msg);
	ck_assert_int_eq(p->n_launches, 1);
	ck_assert_int_ge(p->n_subgraphs, 1);
	ck_assert_int_eq(p->subgraphs[0].n_deps, 0);
	ap_program_free(p);
	ap_graph_free(g);
}
END_TEST

static Suite *undefined_suite(void)
{
	Suite *s = suite_create("undefined");
	TCase *tc = tcase_create("undefined");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, constant_of_shape_float_values);
	tcase_add_test(tc, program_without_subgraph_deps);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(undefined_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
