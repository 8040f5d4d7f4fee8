/* check_import.c -- the ONNX importer (common/onnx_import*.c).
 *
 * 1. Every test folder under ../shared/testdata (or $APOLLO_TESTDATA) is
 *    imported with the bindings of its test_data_set_0/input_*.pb, and each
 *    graph output's dtype and shape must equal output_K.pb's.  Folders that
 *    are known not to import are listed below with the reason, and must
 *    fail with the stated error code (so that the list stays honest).
 *    Each is imported a second time from its structure alone (no
 *    parameter store: ap_onnx_skeleton) and must give the same graph.
 * 2. Targeted cases on real models (silero's If, ppocr's symbolic dims,
 *    mlp_gelu_ln's eager kernel count, onnx-light's ConstantOfShape weights)
 *    and on small models built here with protobuf-c (legacy broadcast, old
 *    Softmax axes, integer inputs that become constants, error naming,
 *    float64 intermediates, BatchNormalization's training forms).
 * 3. The structure alone: the weights' pages of every model made
 *    unreadable (PROT_NONE) while the importer and the client's io reader
 *    read it, and ap_onnx_skeleton's cases (data that does not match its
 *    dims, external data, typed values, a large Constant, bytes that do
 *    not walk, nesting too deep), each against the full import.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/tool.h"
#include "common/graph.h"
#include "common/pb_wire.h"
#include "proto/onnx.pb-c.h"

/* ---- files ------------------------------------------------------------------ */

static char testdata[1024];

static const char *td(void)
{
	const char *env = getenv("APOLLO_TESTDATA");

	if (!testdata[0])
		snprintf(testdata, sizeof(testdata), "%s", env && env[0] ? env : "../shared/testdata");
	return testdata;
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	*len = fread(buf, 1, (size_t)n, f);
	fclose(f);
	return buf;
}

static ap_host_tensor *load_pb(const char *dir, const char *kind, int k)
{
	char p[1200];
	size_t len;
	uint8_t *buf;
	ap_host_tensor *t;
	ap_error err;

	snprintf(p, sizeof(p), "%s/test_data_set_0/%s_%d.pb", dir, kind, k);
	buf = slurp(p, &len);
	if (!buf)
		return NULL;
	t = ap_onnx_tensor_decode(buf, len, &err);
	free(buf);
	ck_assert_msg(t != NULL, "%s: %s", p, err.msg);
	return t;
}

typedef struct loaded {
	ap_host_tensor *in[32];
	int n_in;
	ap_host_tensor *out[32];
	int n_out;
} loaded;

static void load_all(const char *dir, loaded *l)
{
	memset(l, 0, sizeof(*l));
	while (l->n_in < 32 && (l->in[l->n_in] = load_pb(dir, "input", l->n_in)))
		l->n_in++;
	while (l->n_out < 32 && (l->out[l->n_out] = load_pb(dir, "output", l->n_out)))
		l->n_out++;
}

static void free_all(loaded *l)
{
	for (int i = 0; i < l->n_in; i++)
		ap_host_tensor_free(l->in[i]);
	for (int i = 0; i < l->n_out; i++)
		ap_host_tensor_free(l->out[i]);
}

/* Imports dir/model.onnx with `bindings` (NULL: those of data set 0). */
static ap_graph *import_dir(const char *dir, ap_params **params, ap_error *err, loaded *l)
{
	char p[1200];
	size_t len;
	uint8_t *buf;
	ap_graph *g;

	snprintf(p, sizeof(p), "%s/model.onnx", dir);
	buf = slurp(p, &len);
	ck_assert_msg(buf != NULL, "cannot read %s", p);
	load_all(dir, l);
	g = ap_onnx_import(buf, len, (const ap_host_tensor *const *)l->in, l->n_in, params, err);
	free(buf);
	return g;
}

/* The same model imported from its structure alone (no parameter store:
 * ap_onnx_skeleton), with the bindings already in `l`.  *skeleton_len
 * gets the skeleton's size. */
static ap_graph *import_structure(const char *dir, const loaded *l, size_t *model_len,
				  size_t *skeleton_len, ap_error *err)
{
	char p[1800];
	uint8_t *buf, *sk = NULL;
	ap_graph *g;

	snprintf(p, sizeof(p), "%s/model.onnx", dir);
	buf = slurp(p, model_len);
	ck_assert_msg(buf != NULL, "cannot read %s", p);
	ck_assert_int_eq(ap_onnx_skeleton(buf, *model_len, &sk, skeleton_len, err), 0);
	free(sk);
	g = ap_onnx_import(buf, *model_len, (const ap_host_tensor *const *)l->in, l->n_in, NULL, err);
	free(buf);
	return g;
}

static ap_graph *import_named(const char *rel, ap_params **params, ap_error *err, loaded *l)
{
	char dir[1200];

	snprintf(dir, sizeof(dir), "%s/%s", td(), rel);
	return import_dir(dir, params, err, l);
}

static int count_op(const ap_graph *g, ap_op op)
{
	int c = 0;

	for (int n = 0; n < g->n_nodes; n++)
		c += g->nodes[n].op == op;
	return c;
}

/* ---- 1. every test folder ------------------------------------------------------ */

static const struct {
	const char *name;
	int code;
	const char *why;
} known_gaps[] = {
	/* { "test_folder", AP_E..., "why" }, -- none at present */
	{ NULL, 0, NULL },
};

static int gap_code(const char *name, const char **why)
{
	for (size_t i = 0; known_gaps[i].name; i++)
		if (strcmp(known_gaps[i].name, name) == 0) {
			*why = known_gaps[i].why;
			return known_gaps[i].code;
		}
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

START_TEST(import_every_test)
{
	static const char *folders[] = { "onnx-node", "onnx-simple", "onnx-pytorch-converted",
					 "onnx-pytorch-operator", "onnx-light", "models", "training" };
	int ok = 0, gaps = 0, total = 0, failed = 0, same = 0;
	size_t model_bytes = 0, skeleton_bytes = 0;
	char first_fail[2400] = "";

	for (size_t f = 0; f < sizeof(folders) / sizeof(folders[0]); f++) {
		char dir[1200];
		DIR *d;
		struct dirent *e;
		char *names[1024];
		int n_names = 0;

		snprintf(dir, sizeof(dir), "%s/%s", td(), folders[f]);
		d = opendir(dir);
		ck_assert_msg(d != NULL, "no test data at %s (set APOLLO_TESTDATA)", dir);
		while ((e = readdir(d)) && n_names < 1024) {
			char p[1600];
			struct stat st;

			snprintf(p, sizeof(p), "%s/%s/model.onnx", dir, e->d_name);
			if (e->d_name[0] != '.' && stat(p, &st) == 0)
				names[n_names++] = strdup(e->d_name);
		}
		closedir(d);
		qsort(names, (size_t)n_names, sizeof(char *), cmp_str);
		for (int i = 0; i < n_names; i++) {
			char sub[1600];
			ap_error err;
			ap_params *params = NULL;
			loaded l;
			ap_graph *g;
			const char *why = NULL;
			int want = gap_code(names[i], &why);
			bool good = true;

			snprintf(sub, sizeof(sub), "%s/%s", dir, names[i]);
			g = import_dir(sub, &params, &err, &l);
			total++;
			if (want) {
				if (g || err.code != want) {
					good = false;
					snprintf(first_fail, sizeof(first_fail), "%s: listed as a gap (%s) "
						 "but import gave %d", sub, why, g ? 0 : err.code);
				} else {
					printf("known gap: %s/%s: %s\n", folders[f], names[i], why);
					gaps++;
				}
			} else if (!g) {
				good = false;
				snprintf(first_fail, sizeof(first_fail), "%s: error %d (%s) at node '%s': %s",
					 sub, err.code, ap_error_name(err.code), err.node, err.msg);
			} else {
				if (g->n_outputs != l.n_out)
					good = false;
				for (int k = 0; good && k < g->n_outputs; k++) {
					const ap_tensor *t = &g->tensors[g->outputs[k]];
					const ap_host_tensor *o = l.out[k];

					good = t->dtype == o->dtype && t->rank == o->rank &&
					       memcmp(t->dims, o->dims, sizeof(int64_t) * (size_t)t->rank) == 0 &&
					       t->kind == AP_TENSOR_VALUE && t->producer >= 0;
				}
				if (!good)
					snprintf(first_fail, sizeof(first_fail),
						 "%s: graph outputs differ from output_K.pb", sub);
				/* every PARAM has its data in the store */
				for (int t = 0; good && t < g->n_tensors; t++) {
					const ap_tensor *ten = &g->tensors[t];
					const ap_host_tensor *h;

					if (ten->kind == AP_TENSOR_CONST)
						ck_assert_uint_le(ten->nbytes, AP_CONST_MAX_BYTES);
					if (ten->kind != AP_TENSOR_PARAM)
						continue;
					h = ap_params_find(params, ten->name);
					ck_assert_msg(h != NULL, "%s: no data for param %s", sub, ten->name);
					ck_assert_uint_eq(h->nbytes, (size_t)ap_tensor_numel(ten) *
							  ap_dtype_size(ten->dtype));
				}
				if (good) {   /* the structure alone is the same graph */
					uint8_t h1[32], h2[32];
					size_t ml = 0, sl = 0;
					ap_graph *s2 = import_structure(sub, &l, &ml, &sl, &err);

					ck_assert_msg(s2 != NULL, "%s: the structure alone does not import: %s",
						      sub, err.msg);
					ck_assert_int_eq(ap_graph_hash_named(g, h1), 0);
					ck_assert_int_eq(ap_graph_hash_named(s2, h2), 0);
					ck_assert_msg(!memcmp(h1, h2, 32),
						      "%s: imported from its structure alone, another graph", sub);
					ck_assert_int_eq(s2->eager_kernels, g->eager_kernels);
					ap_graph_free(s2);
					model_bytes += ml;
					skeleton_bytes += sl;
					same++;
					ok++;
				}
			}
			if (!good) {
				failed++;
				fprintf(stderr, "%s\n", first_fail);
			}
			ap_graph_free(g);
			ap_params_free(params);
			free_all(&l);
			free(names[i]);
		}
	}
	printf("import: %d of %d test folders imported with matching output shapes, "
	       "%d known gaps, %d failed\n", ok, total, gaps, failed);
	printf("import: %d imported from their structure alone to the same graph; %zu bytes of "
	       "models, %zu of skeletons\n", same, model_bytes, skeleton_bytes);
	ck_assert_msg(failed == 0, "%d folders failed; first: %s", failed, first_fail);
	ck_assert_int_gt(ok, 450);
}
END_TEST

/* ---- 2. real models ---------------------------------------------------------------- */

START_TEST(silero_if_inlined)
{
	ap_error err;
	ap_params *params = NULL;
	loaded l;
	ap_graph *g = import_named("models/silero_vad_op18_ifless", &params, &err, &l);

	ck_assert_msg(g != NULL, "%s", err.msg);
	/* sr (int64 scalar given with data) became a constant: inputs are
	 * input and state */
	ck_assert_int_eq(g->n_inputs, 2);
	ck_assert_str_eq(g->tensors[g->inputs[0]].name, "input");
	ck_assert_str_eq(g->tensors[g->inputs[1]].name, "state");
	ck_assert_int_eq(ap_graph_find_tensor(g, "sr"), -1);
	/* the 16 kHz branch's four encoder convolutions, the STFT and the decoder */
	ck_assert_int_eq(count_op(g, AP_OP_CONV), 6);
	ck_assert_int_eq(count_op(g, AP_OP_GEMM), 2);
	/* only that branch's weights are parameters */
	ck_assert_ptr_nonnull(ap_params_find(params, "model.stft.forward_basis_buffer"));
	ck_assert_ptr_null(ap_params_find(params, "model_8k.stft.forward_basis_buffer"));
	ck_assert_int_gt((int)g->eager_kernels, 0);
	ck_assert_int_le((int)g->eager_kernels, g->n_nodes);
	ap_graph_free(g);
	ap_params_free(params);
	free_all(&l);
}
END_TEST

START_TEST(symbolic_dims_bound)
{
	char p[1200];
	size_t len;
	uint8_t *buf;
	int64_t dims[4] = { 2, 3, 48, 96 };
	ap_host_tensor x = { "x", AP_DT_F32, 4, { 0 }, NULL, 0 };
	const ap_host_tensor *b[1] = { &x };
	ap_error err;
	ap_graph *g;

	memcpy(x.dims, dims, sizeof(dims));
	snprintf(p, sizeof(p), "%s/models/ppocr_mobile_v2_cls/model.onnx", td());
	buf = slurp(p, &len);
	ck_assert_ptr_nonnull(buf);
	/* shape only (no data): batch 2, width 96 */
	g = ap_onnx_import(buf, len, b, 1, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(g->tensors[g->inputs[0]].dims[0], 2);
	ck_assert_int_eq(g->tensors[g->outputs[0]].rank, 2);
	ck_assert_int_eq(g->tensors[g->outputs[0]].dims[0], 2);
	ck_assert_int_eq(g->tensors[g->outputs[0]].dims[1], 2);
	ap_graph_free(g);
	/* no binding: the symbolic dims cannot be resolved */
	g = ap_onnx_import(buf, len, NULL, 0, NULL, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EINVAL);
	ck_assert_str_eq(err.tensor, "x");
	ck_assert_ptr_nonnull(strstr(err.msg, "symbolic"));
	/* a binding that contradicts a fixed dim (3 channels) */
	x.dims[1] = 4;
	g = ap_onnx_import(buf, len, b, 1, NULL, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_ESHAPE);
	free(buf);
}
END_TEST

/* Non-view, non-Constant ONNX nodes of a model, counted from the file. */
static unsigned onnx_kernel_nodes(const char *rel)
{
	static const char *free_ops[] = { "Constant", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
					  "Identity", "Dropout" };
	char p[1200];
	size_t len;
	uint8_t *buf;
	Onnx__ModelProto *m;
	unsigned c = 0;

	snprintf(p, sizeof(p), "%s/%s/model.onnx", td(), rel);
	buf = slurp(p, &len);
	ck_assert_ptr_nonnull(buf);
	m = onnx__model_proto__unpack(NULL, len, buf);
	ck_assert_ptr_nonnull(m);
	for (size_t i = 0; i < m->graph->n_node; i++) {
		bool f = false;

		for (size_t k = 0; k < sizeof(free_ops) / sizeof(free_ops[0]); k++)
			f |= strcmp(m->graph->node[i]->op_type, free_ops[k]) == 0;
		c += !f;
	}
	onnx__model_proto__free_unpacked(m, NULL);
	free(buf);
	return c;
}

START_TEST(eager_kernels_mlp)
{
	ap_error err;
	loaded l;
	ap_graph *g = import_named("models/mlp_gelu_ln", NULL, &err, &l);

	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_uint_eq(g->eager_kernels, onnx_kernel_nodes("models/mlp_gelu_ln"));
	ck_assert_uint_eq(g->eager_kernels, 20);
	ck_assert_int_eq(count_op(g, AP_OP_GEMM), 3);
	ap_graph_free(g);
	free_all(&l);
}
END_TEST

START_TEST(constant_of_shape_weights)
{
	ap_error err;
	ap_params *params = NULL;
	loaded l;
	ap_graph *g = import_named("onnx-light/test_vgg19", &params, &err, &l);

	ck_assert_msg(g != NULL, "%s", err.msg);
	/* the weights are ConstantOfShape fills: broadcasts of scalar
	 * constants, nothing materialised */
	ck_assert_int_eq(params->n, 0);
	ck_assert_int_eq(count_op(g, AP_OP_CONV), 16);
	for (int n = 0; n < g->n_nodes; n++) {
		const ap_node *nd = &g->nodes[n];

		if (nd->op != AP_OP_CONV)
			continue;
		ck_assert_int_eq(g->nodes[g->tensors[nd->inputs[1]].producer].op, AP_OP_EXPAND);
	}
	for (int t = 0; t < g->n_tensors; t++)
		ck_assert_uint_le(g->tensors[t].nbytes, AP_CONST_MAX_BYTES);
	ap_graph_free(g);
	ap_params_free(params);
	free_all(&l);
}
END_TEST

START_TEST(integer_inputs_become_constants)
{
	ap_error err;
	loaded l;
	ap_graph *g = import_named("onnx-node/test_reshape_negative_dim", NULL, &err, &l);

	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(g->n_inputs, 1);
	ck_assert_int_eq(g->tensors[g->inputs[0]].dtype, AP_DT_F32);
	ck_assert_int_eq(g->n_nodes, 1);
	ck_assert_int_eq(g->nodes[0].op, AP_OP_RESHAPE);
	ck_assert_int_eq(g->nodes[0].n_inputs, 1);
	ap_graph_free(g);
	free_all(&l);

	g = import_named("onnx-node/test_slice_neg_steps", NULL, &err, &l);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(g->n_inputs, 1);
	{
		const ap_attr *st = ap_node_attr(&g->nodes[0], "starts");
		const ap_attr *sp = ap_node_attr(&g->nodes[0], "steps");

		ck_assert_ptr_nonnull(st);
		ck_assert_ptr_nonnull(sp);
		ck_assert_int_eq(st->n_ints, 3);
		for (int d = 0; d < 3; d++) {
			ck_assert_int_ge(st->ints[d], 0);
			ck_assert_int_lt(st->ints[d], g->tensors[g->inputs[0]].dims[d]);
		}
	}
	ap_graph_free(g);
	free_all(&l);
}
END_TEST

START_TEST(hash_stable_across_imports)
{
	ap_error err;
	loaded l1, l2;
	uint8_t h1[32], h2[32];
	ap_graph *a = import_named("models/squeezenet1_1", NULL, &err, &l1);
	ap_graph *b = import_named("models/squeezenet1_1", NULL, &err, &l2);

	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ap_graph_hash(a, h1);
	ap_graph_hash(b, h2);
	ck_assert_mem_eq(h1, h2, 32);
	ap_graph_free(a);
	ap_graph_free(b);
	free_all(&l1);
	free_all(&l2);
}
END_TEST

/* ---- 3. small models built here ------------------------------------------------------ */

/* A tiny ONNX model builder over the protobuf-c structures; everything
 * lives in one arena freed by mb_free. */
typedef struct mb {
	void *arena[512];
	int n_arena;
	Onnx__ModelProto m;
	Onnx__GraphProto g;
	Onnx__OperatorSetIdProto os;
	Onnx__OperatorSetIdProto *osp[1];
	Onnx__NodeProto *nodes[32];
	Onnx__ValueInfoProto *ins[8], *outs[8];
	Onnx__TensorProto *inits[8];
} mb;

static void *mb_alloc(mb *b, size_t n)
{
	void *p = calloc(1, n);

	ck_assert_ptr_nonnull(p);
	ck_assert_int_lt(b->n_arena, 512);
	b->arena[b->n_arena++] = p;
	return p;
}

static char *mb_str(mb *b, const char *s)
{
	char *d = mb_alloc(b, strlen(s) + 1);

	strcpy(d, s);
	return d;
}

static void mb_init(mb *b, int64_t opset)
{
	memset(b, 0, sizeof(*b));
	onnx__model_proto__init(&b->m);
	onnx__graph_proto__init(&b->g);
	onnx__operator_set_id_proto__init(&b->os);
	b->os.domain = "";
	b->os.has_version = 1;
	b->os.version = opset;
	b->osp[0] = &b->os;
	b->m.has_ir_version = 1;
	b->m.ir_version = 7;
	b->m.n_opset_import = 1;
	b->m.opset_import = b->osp;
	b->m.graph = &b->g;
	b->g.name = "t";
	b->g.node = b->nodes;
	b->g.input = b->ins;
	b->g.output = b->outs;
	b->g.initializer = b->inits;
}

/* Splits "a,b,,c" into strings ("" for an omitted optional input). */
static char **mb_list(mb *b, const char *csv, size_t *n)
{
	char **v = mb_alloc(b, 16 * sizeof(char *));
	const char *p = csv;

	*n = 0;
	if (!csv[0])
		return v;
	for (;;) {
		const char *c = strchr(p, ',');
		size_t len = c ? (size_t)(c - p) : strlen(p);
		char *s = mb_alloc(b, len + 1);

		memcpy(s, p, len);
		v[(*n)++] = s;
		if (!c)
			break;
		p = c + 1;
	}
	return v;
}

static Onnx__NodeProto *mb_node(mb *b, const char *op, const char *in, const char *out,
				const char *name)
{
	Onnx__NodeProto *n = mb_alloc(b, sizeof(*n));

	onnx__node_proto__init(n);
	n->op_type = mb_str(b, op);
	n->name = mb_str(b, name);
	n->input = mb_list(b, in, &n->n_input);
	n->output = mb_list(b, out, &n->n_output);
	n->attribute = mb_alloc(b, 8 * sizeof(*n->attribute));
	b->nodes[b->g.n_node++] = n;
	return n;
}

static Onnx__AttributeProto *mb_attr(mb *b, Onnx__NodeProto *n, const char *name,
				     Onnx__AttributeProto__AttributeType type)
{
	Onnx__AttributeProto *a = mb_alloc(b, sizeof(*a));

	onnx__attribute_proto__init(a);
	a->name = mb_str(b, name);
	a->has_type = 1;
	a->type = type;
	n->attribute[n->n_attribute++] = a;
	return a;
}

static void mb_int(mb *b, Onnx__NodeProto *n, const char *name, int64_t v)
{
	Onnx__AttributeProto *a = mb_attr(b, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);

	a->has_i = 1;
	a->i = v;
}

static void mb_ints(mb *b, Onnx__NodeProto *n, const char *name, int cnt, ...)
{
	Onnx__AttributeProto *a = mb_attr(b, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
	va_list ap;

	a->ints = mb_alloc(b, sizeof(int64_t) * (size_t)(cnt + 1));
	a->n_ints = (size_t)cnt;
	va_start(ap, cnt);
	for (int i = 0; i < cnt; i++)
		a->ints[i] = va_arg(ap, int64_t);
	va_end(ap);
}

static void mb_float(mb *b, Onnx__NodeProto *n, const char *name, float v)
{
	Onnx__AttributeProto *a = mb_attr(b, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);

	a->has_f = 1;
	a->f = v;
}

/* A tensor value info; a negative dim is symbolic ("N"). */
static Onnx__ValueInfoProto *mb_vi(mb *b, const char *name, int elem, int rank, const int64_t *dims)
{
	Onnx__ValueInfoProto *v = mb_alloc(b, sizeof(*v));
	Onnx__TypeProto *tp = mb_alloc(b, sizeof(*tp));
	Onnx__TypeProto__Tensor *tt = mb_alloc(b, sizeof(*tt));
	Onnx__TensorShapeProto *sh = mb_alloc(b, sizeof(*sh));

	onnx__value_info_proto__init(v);
	onnx__type_proto__init(tp);
	onnx__type_proto__tensor__init(tt);
	onnx__tensor_shape_proto__init(sh);
	v->name = mb_str(b, name);
	v->type = tp;
	tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
	tp->tensor_type = tt;
	tt->has_elem_type = 1;
	tt->elem_type = elem;
	if (rank >= 0) {
		tt->shape = sh;
		sh->dim = mb_alloc(b, sizeof(*sh->dim) * (size_t)(rank + 1));
		sh->n_dim = (size_t)rank;
		for (int d = 0; d < rank; d++) {
			Onnx__TensorShapeProto__Dimension *dm = mb_alloc(b, sizeof(*dm));

			onnx__tensor_shape_proto__dimension__init(dm);
			if (dims[d] >= 0) {
				dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
				dm->dim_value = dims[d];
			} else {
				dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
				dm->dim_param = mb_str(b, "N");
			}
			sh->dim[d] = dm;
		}
	}
	return v;
}

static void mb_input(mb *b, const char *name, int elem, int rank, const int64_t *dims)
{
	b->ins[b->g.n_input++] = mb_vi(b, name, elem, rank, dims);
}

static void mb_output(mb *b, const char *name)
{
	b->outs[b->g.n_output++] = mb_vi(b, name, 1, -1, NULL);
}

static void mb_init_tensor(mb *b, const char *name, int dtype, int rank, const int64_t *dims,
			   const void *data, size_t nbytes)
{
	Onnx__TensorProto *t = mb_alloc(b, sizeof(*t));

	onnx__tensor_proto__init(t);
	t->name = mb_str(b, name);
	t->has_data_type = 1;
	t->data_type = dtype;
	t->dims = mb_alloc(b, sizeof(int64_t) * (size_t)(rank + 1));
	if (rank > 0)
		memcpy(t->dims, dims, sizeof(int64_t) * (size_t)rank);
	t->n_dims = (size_t)rank;
	t->has_raw_data = 1;
	t->raw_data.data = mb_alloc(b, nbytes + 1);
	memcpy(t->raw_data.data, data, nbytes);
	t->raw_data.len = nbytes;
	b->inits[b->g.n_initializer++] = t;
}

static ap_graph *mb_import(mb *b, const ap_host_tensor *const *bind, int nb, ap_params **params,
			   ap_error *err)
{
	size_t len = onnx__model_proto__get_packed_size(&b->m);
	uint8_t *buf = malloc(len + 1);
	ap_graph *g;

	onnx__model_proto__pack(&b->m, buf);
	g = ap_onnx_import(buf, len, bind, nb, params, err);
	free(buf);
	return g;
}

static void mb_free(mb *b)
{
	for (int i = 0; i < b->n_arena; i++)
		free(b->arena[i]);
}

START_TEST(legacy_broadcast)
{
	mb b;
	int64_t da[4] = { 2, 3, 4, 5 }, db[2] = { 3, 4 };
	Onnx__NodeProto *n;
	ap_error err;
	ap_graph *g;
	int add = -1;

	/* opset 6: Add(A [2,3,4,5], B [3,4], broadcast=1, axis=1): B aligned
	 * at axis 1, which numpy broadcasting does after B -> [3,4,1] */
	mb_init(&b, 6);
	mb_input(&b, "A", 1, 4, da);
	mb_input(&b, "B", 1, 2, db);
	n = mb_node(&b, "Add", "A,B", "C", "legacy_add");
	mb_int(&b, n, "broadcast", 1);
	mb_int(&b, n, "axis", 1);
	mb_output(&b, "C");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(count_op(g, AP_OP_RESHAPE), 1);
	for (int i = 0; i < g->n_nodes; i++)
		if (g->nodes[i].op == AP_OP_ADD)
			add = i;
	ck_assert_int_ge(add, 0);
	{
		const ap_tensor *rb = &g->tensors[g->nodes[add].inputs[1]];

		ck_assert_int_eq(rb->rank, 3);
		ck_assert_int_eq(rb->dims[0], 3);
		ck_assert_int_eq(rb->dims[1], 4);
		ck_assert_int_eq(rb->dims[2], 1);
	}
	ck_assert_int_eq(g->tensors[g->outputs[0]].rank, 4);
	ck_assert_uint_eq(g->eager_kernels, 1);
	ap_graph_free(g);
	mb_free(&b);

	/* the same at opset 7 is plain numpy broadcasting: [3,4] vs [...,4,5] fails */
	mb_init(&b, 7);
	mb_input(&b, "A", 1, 4, da);
	mb_input(&b, "B", 1, 2, db);
	mb_node(&b, "Add", "A,B", "C", "numpy_add");
	mb_output(&b, "C");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_ESHAPE);
	ck_assert_str_eq(err.node, "numpy_add");
	mb_free(&b);
}
END_TEST

static const ap_attr *softmax_axes(int64_t opset, int64_t axis)
{
	static ap_attr copy;
	static int64_t vals[8];
	mb b;
	int64_t d[3] = { 2, 3, 4 };
	Onnx__NodeProto *n;
	ap_error err;
	ap_graph *g;
	const ap_attr *a;

	mb_init(&b, opset);
	mb_input(&b, "x", 1, 3, d);
	n = mb_node(&b, "Softmax", "x", "y", "sm");
	mb_int(&b, n, "axis", axis);
	mb_output(&b, "y");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(g->n_nodes, 1);
	a = ap_node_attr(&g->nodes[0], "axes");
	ck_assert_ptr_nonnull(a);
	copy = *a;
	memcpy(vals, a->ints, sizeof(int64_t) * (size_t)a->n_ints);
	copy.ints = vals;
	ap_graph_free(g);
	mb_free(&b);
	return &copy;
}

START_TEST(old_softmax_axes)
{
	const ap_attr *a;

	/* opset < 13: coerced to 2-D at axis: normalised over axis..r-1 */
	a = softmax_axes(11, 1);
	ck_assert_int_eq(a->n_ints, 2);
	ck_assert_int_eq(a->ints[0], 1);
	ck_assert_int_eq(a->ints[1], 2);
	a = softmax_axes(11, -3);
	ck_assert_int_eq(a->n_ints, 3);
	/* opset 13: one axis */
	a = softmax_axes(13, 1);
	ck_assert_int_eq(a->n_ints, 1);
	ck_assert_int_eq(a->ints[0], 1);
	a = softmax_axes(13, -1);
	ck_assert_int_eq(a->n_ints, 1);
	ck_assert_int_eq(a->ints[0], 2);
}
END_TEST

START_TEST(old_attribute_forms)
{
	mb b;
	int64_t d[2] = { 4, 6 };
	Onnx__NodeProto *n;
	ap_error err;
	ap_graph *g;
	const ap_tensor *y;

	/* opset 9: Slice and Unsqueeze take attributes, not inputs */
	mb_init(&b, 9);
	mb_input(&b, "x", 1, 2, d);
	n = mb_node(&b, "Slice", "x", "s", "slice");
	mb_ints(&b, n, "starts", 2, (int64_t)1, (int64_t)-4);
	mb_ints(&b, n, "ends", 2, (int64_t)3, (int64_t)INT64_MAX);
	mb_ints(&b, n, "axes", 2, (int64_t)0, (int64_t)1);
	n = mb_node(&b, "Unsqueeze", "s", "u", "unsq");
	mb_ints(&b, n, "axes", 1, (int64_t)0);
	mb_node(&b, "Exp", "u", "y", "exp");
	mb_output(&b, "y");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	y = &g->tensors[g->outputs[0]];
	ck_assert_int_eq(y->rank, 3);
	ck_assert_int_eq(y->dims[0], 1);
	ck_assert_int_eq(y->dims[1], 2);
	ck_assert_int_eq(y->dims[2], 4);
	ck_assert_int_eq(ap_node_attr(&g->nodes[0], "starts")->ints[1], 2);
	ap_graph_free(g);
	mb_free(&b);
}
END_TEST

START_TEST(shape_arithmetic_folded)
{
	mb b;
	int64_t dx[3] = { -1, 6, 4 }, bx[3] = { 5, 6, 4 }, one = 1, zero = 0;
	int64_t axes0[1] = { 0 };
	ap_host_tensor x = { "x", AP_DT_F32, 3, { 0 }, NULL, 0 };
	const ap_host_tensor *bind[1] = { &x };
	ap_error err;
	ap_graph *g;
	Onnx__NodeProto *n;

	memcpy(x.dims, bx, sizeof(bx));
	/* y = Reshape(x, Concat(Gather(Shape(x), 0), [-1])) : [N, 24] */
	mb_init(&b, 13);
	mb_input(&b, "x", 1, 3, dx);
	mb_init_tensor(&b, "zero", 7, 0, NULL, &zero, 8);
	mb_init_tensor(&b, "minus1", 7, 1, &one, &(int64_t){ -1 }, 8);
	mb_init_tensor(&b, "axes0", 7, 1, &one, axes0, 8);
	mb_node(&b, "Shape", "x", "s", "shape");
	n = mb_node(&b, "Gather", "s,zero", "n", "gather");
	mb_int(&b, n, "axis", 0);
	mb_node(&b, "Unsqueeze", "n,axes0", "n1", "unsq");
	n = mb_node(&b, "Concat", "n1,minus1", "shp", "concat");
	mb_int(&b, n, "axis", 0);
	mb_node(&b, "Reshape", "x,shp", "r", "reshape");
	mb_node(&b, "Relu", "r", "y", "relu");
	mb_output(&b, "y");
	g = mb_import(&b, bind, 1, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	/* only the Reshape (a view) and the Relu remain */
	ck_assert_int_eq(g->n_nodes, 2);
	ck_assert_int_eq(g->tensors[g->outputs[0]].dims[0], 5);
	ck_assert_int_eq(g->tensors[g->outputs[0]].dims[1], 24);
	ck_assert_uint_eq(g->eager_kernels, 1);
	for (int t = 0; t < g->n_tensors; t++)
		ck_assert_int_ne(g->tensors[t].kind, AP_TENSOR_CONST);
	ap_graph_free(g);
	mb_free(&b);
}
END_TEST

START_TEST(outputs_are_values)
{
	mb b;
	int64_t d[1] = { 4 };
	float c[4] = { 1, 2, 3, 4 };
	ap_error err;
	ap_graph *g;

	/* outputs: the input itself, a constant, and one value twice */
	mb_init(&b, 13);
	mb_input(&b, "x", 1, 1, d);
	mb_init_tensor(&b, "k", 1, 1, d, c, sizeof(c));
	mb_node(&b, "Relu", "x", "r", "relu");
	mb_output(&b, "x");
	mb_output(&b, "k");
	mb_output(&b, "r");
	mb_output(&b, "r");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(g->n_outputs, 4);
	for (int i = 0; i < 4; i++) {
		const ap_tensor *t = &g->tensors[g->outputs[i]];

		ck_assert_int_eq(t->kind, AP_TENSOR_VALUE);
		ck_assert_int_ge(t->producer, 0);
		for (int j = 0; j < i; j++)
			ck_assert_int_ne(g->outputs[i], g->outputs[j]);
		ck_assert_int_ne(g->outputs[i], g->inputs[0]);
	}
	ck_assert_str_eq(g->tensors[g->outputs[2]].name, "r");
	ck_assert_int_eq(count_op(g, AP_OP_IDENTITY), 3);
	ap_graph_free(g);
	mb_free(&b);
}
END_TEST

START_TEST(errors_name_the_node)
{
	mb b;
	int64_t d[2] = { 2, 3 }, shape_dims[1] = { 2 };
	ap_error err;
	ap_graph *g;

	/* an op Apollo does not have */
	mb_init(&b, 13);
	mb_input(&b, "x", 1, 2, d);
	mb_node(&b, "Relu", "x", "r", "first");
	mb_node(&b, "NonMaxSuppression", "r", "y", "nms_7");
	mb_output(&b, "y");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_str_eq(err.node, "nms_7");
	ck_assert_ptr_nonnull(strstr(err.msg, "NonMaxSuppression"));
	mb_free(&b);

	/* a Reshape whose shape is only known at run time */
	mb_init(&b, 13);
	mb_input(&b, "x", 1, 2, d);
	mb_input(&b, "shape", 7, 1, shape_dims);
	mb_node(&b, "Reshape", "x,shape", "y", "dyn_reshape");
	mb_output(&b, "y");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_str_eq(err.node, "dyn_reshape");
	ck_assert_str_eq(err.tensor, "shape");
	mb_free(&b);

	/* an input nothing produces */
	mb_init(&b, 13);
	mb_input(&b, "x", 1, 2, d);
	mb_node(&b, "Add", "x,ghost", "y", "");
	mb_output(&b, "y");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EINVAL);
	ck_assert_str_eq(err.node, "Add_0");
	ck_assert_str_eq(err.tensor, "ghost");
	mb_free(&b);

	/* an If whose condition is a real input */
	mb_init(&b, 13);
	mb_input(&b, "c", 9, 0, NULL);
	mb_node(&b, "If", "c", "y", "branchy");
	mb_output(&b, "y");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_str_eq(err.node, "branchy");
	mb_free(&b);

	/* an Einsum without its equation: refused, the node named (it was read
	 * from an unwritten buffer once) */
	mb_init(&b, 13);
	mb_input(&b, "x", 1, 2, d);
	mb_node(&b, "Einsum", "x", "y", "no_equation");
	mb_output(&b, "y");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EINVAL);
	ck_assert_str_eq(err.node, "no_equation");
	ck_assert_ptr_nonnull(strstr(err.msg, "no 'equation' attribute"));
	mb_free(&b);

	/* bytes that are not a model */
	g = ap_onnx_import((const uint8_t *)"\x0a\xff\xff\xff", 4, NULL, 0, NULL, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EMESSAGE);
}
END_TEST

START_TEST(large_constant_becomes_param)
{
	mb b;
	int64_t dx[2] = { 4, 512 }, dw[2] = { 512, 8 }, ds[1] = { 2 };
	float *w = calloc(512 * 8, sizeof(float));
	int64_t shape_vals[2] = { 4, 8 };
	ap_params *params = NULL;
	ap_error err;
	ap_graph *g;
	const ap_host_tensor *p;
	Onnx__NodeProto *n;

	w[17] = 3.5f;
	mb_init(&b, 13);
	mb_input(&b, "x", 1, 2, dx);
	mb_init_tensor(&b, "W", 1, 2, dw, w, 512 * 8 * sizeof(float));
	mb_init_tensor(&b, "fill_shape", 7, 1, ds, shape_vals, sizeof(shape_vals));
	mb_node(&b, "MatMul", "x,W", "h", "mm");
	n = mb_node(&b, "ConstantOfShape", "fill_shape", "ones", "cos");
	(void)n;
	mb_node(&b, "Add", "h,ones", "y", "add");
	mb_output(&b, "y");
	g = mb_import(&b, NULL, 0, &params, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(g->tensors[ap_graph_find_tensor(g, "W")].kind, AP_TENSOR_PARAM);
	p = ap_params_find(params, "W");
	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq(p->nbytes, 512 * 8 * sizeof(float));
	ck_assert(((float *)p->data)[17] == 3.5f);
	/* the small ConstantOfShape [4,8] of zeros is a CONST by value */
	ck_assert_int_eq(g->tensors[ap_graph_find_tensor(g, "ones")].kind, AP_TENSOR_CONST);
	ck_assert_uint_eq(g->eager_kernels, 2);
	ap_graph_free(g);
	ap_params_free(params);
	mb_free(&b);
	free(w);
}
END_TEST

/* Weights are not constants: an embedding gathered with token ids given
 * at import (integer inputs become constants) stays a Gather over a PARAM,
 * while a small table computed from a small initializer, and a sum of a
 * large integer initializer (indices, not a weight), fold away -- in the
 * structure-only import too (no parameter store: the skeleton keeps
 * integer data), which must give the very same graph. */
START_TEST(weights_are_not_folded)
{
	mb b;
	int64_t de[2] = { 64, 32 }, dt[1] = { 32 }, di[1] = { 4 }, dn[1] = { 600 };
	int64_t ids[4] = { 3, 0, 63, 7 }, *idx = calloc(600, sizeof(int64_t));
	float *e = calloc(64 * 32, sizeof(float)), t[32];
	ap_host_tensor x = { "ids", AP_DT_I64, 1, { 4 }, ids, sizeof(ids) };
	const ap_host_tensor *bind[1] = { &x };
	ap_params *params = NULL;
	ap_error err;
	ap_graph *g, *s;
	uint8_t h1[32], h2[32];
	Onnx__NodeProto *n;

	for (int i = 0; i < 32; i++)
		t[i] = 0.1f * (float)i;
	for (int i = 0; i < 600; i++)
		idx[i] = i % 5;
	mb_init(&b, 17);
	mb_input(&b, "ids", 7, 1, di);
	mb_init_tensor(&b, "E", 1, 2, de, e, 64 * 32 * sizeof(float));   /* 8 KiB: a weight */
	mb_init_tensor(&b, "T", 1, 1, dt, t, sizeof(t));                 /* 128 B: a constant */
	mb_init_tensor(&b, "I", 7, 1, dn, idx, 600 * sizeof(int64_t));   /* 4.7 KiB of indices */
	mb_node(&b, "Gather", "E,ids", "emb", "embed");
	mb_node(&b, "Sin", "T", "table", "sin");
	mb_node(&b, "ReduceSum", "I", "isum", "count");
	n = mb_node(&b, "Cast", "isum", "fsum", "to_float");
	mb_int(&b, n, "to", 1);
	mb_node(&b, "Mul", "emb,table", "m", "scale");
	mb_node(&b, "Mul", "m,fsum", "y", "scale_sum");
	mb_output(&b, "y");
	g = mb_import(&b, bind, 1, &params, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_msg(ap_graph_find_tensor(g, "E") >= 0, "the weight was folded away");
	ck_assert_int_eq(g->tensors[ap_graph_find_tensor(g, "E")].kind, AP_TENSOR_PARAM);
	ck_assert_int_eq(count_op(g, AP_OP_GATHER), 1);
	ck_assert_int_eq(count_op(g, AP_OP_SIN), 0);
	ck_assert_int_eq(count_op(g, AP_OP_REDUCE_SUM), 0);
	ck_assert_int_eq(count_op(g, AP_OP_MUL), 2);
	ck_assert_int_eq(g->n_nodes, 3);
	s = mb_import(&b, bind, 1, NULL, &err);
	ck_assert_msg(s != NULL, "structure only: %s", err.msg);
	ck_assert_int_eq(ap_graph_hash_named(g, h1), 0);
	ck_assert_int_eq(ap_graph_hash_named(s, h2), 0);
	ck_assert_msg(!memcmp(h1, h2, 32), "the structure-only import gives another graph (%d nodes)",
		      s->n_nodes);
	ap_graph_free(g);
	ap_graph_free(s);
	ap_params_free(params);
	mb_free(&b);
	free(e);
	free(idx);
}
END_TEST

/* float64 intermediates: ONNX function bodies (ReduceLogSumExp's, among
 * others) cast to double, reduce and cast back.  The tensors keep float64;
 * constants are folded in double and stored as 8-byte CONSTs. */
START_TEST(float64_intermediates)
{
	mb b;
	int64_t dx[2] = { 2, 3 }, dk[1] = { 3 }, dax[1] = { 1 };
	double k[3] = { 1e-10, 2, 3 }, one = 1;
	int64_t ax = 1;
	ap_error err;
	ap_graph *g;
	loaded l;
	int rs = -1, t;

	/* the ONNX backend test: Cast(to=double) -> Exp -> ReduceSum -> Log -> CastLike */
	g = import_named("onnx-node/test_reduce_log_sum_exp_empty_set_expanded", NULL, &err, &l);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(count_op(g, AP_OP_CAST), 2);
	for (int n = 0; n < g->n_nodes; n++)
		if (g->nodes[n].op == AP_OP_REDUCE_SUM)
			rs = n;
	ck_assert_int_ge(rs, 0);
	ck_assert_int_eq(g->tensors[g->nodes[rs].inputs[0]].dtype, AP_DT_F64);
	ck_assert_int_eq(g->tensors[g->nodes[rs].outputs[0]].dtype, AP_DT_F64);
	ck_assert_int_eq(g->tensors[g->inputs[0]].dtype, AP_DT_F32);
	ck_assert_int_eq(g->tensors[g->outputs[0]].dtype, AP_DT_F32);
	ap_graph_free(g);
	free_all(&l);

	/* a float64 input, a float64 constant folded in double (1e-10 + 1 is
	 * not a float32 value), a float64 reduction and a float64 output */
	mb_init(&b, 18);
	mb_input(&b, "x", AP_DT_F64, 2, dx);
	mb_init_tensor(&b, "k", AP_DT_F64, 1, dk, k, sizeof(k));
	mb_init_tensor(&b, "one", AP_DT_F64, 0, NULL, &one, sizeof(one));
	mb_init_tensor(&b, "axes", AP_DT_I64, 1, dax, &ax, sizeof(ax));
	mb_node(&b, "Add", "k,one", "k1", "fold");
	mb_node(&b, "Mul", "x,k1", "m", "mul");
	mb_node(&b, "ReduceSum", "m,axes", "s", "sum");
	mb_int(&b, b.nodes[b.g.n_node - 1], "keepdims", 0);
	mb_node(&b, "Cast", "m", "y", "cast");
	mb_int(&b, b.nodes[b.g.n_node - 1], "to", AP_DT_F32);
	mb_output(&b, "y");
	mb_output(&b, "s");
	g = mb_import(&b, NULL, 0, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(g->n_nodes, 3);
	ck_assert_int_eq(count_op(g, AP_OP_ADD), 0);
	ck_assert_int_eq(g->tensors[g->inputs[0]].dtype, AP_DT_F64);
	ck_assert_int_eq(g->tensors[g->outputs[0]].dtype, AP_DT_F32);
	ck_assert_int_eq(g->tensors[g->outputs[1]].dtype, AP_DT_F64);
	ck_assert_int_eq(g->tensors[g->outputs[1]].rank, 1);
	t = ap_graph_find_tensor(g, "k1");
	ck_assert_int_ge(t, 0);
	ck_assert_int_eq(g->tensors[t].kind, AP_TENSOR_CONST);
	ck_assert_int_eq(g->tensors[t].dtype, AP_DT_F64);
	ck_assert_uint_eq(g->tensors[t].nbytes, 3 * sizeof(double));
	ck_assert(((double *)g->tensors[t].data)[0] == 1e-10 + 1.0);
	ck_assert(((double *)g->tensors[t].data)[2] == 4.0);
	ap_graph_free(g);
	mb_free(&b);
}
END_TEST

/* One BatchNormalization model: x [4,3,5,6] input, scale/B/mean/var [3]
 * initializers, node outputs `outs` (comma list, "" for one left out), graph
 * outputs `graph_outs`; training_mode / is_test / momentum set when >= 0. */
static ap_graph *bn_model(int64_t opset, const char *outs, const char *graph_outs, int train,
			  int is_test, float momentum, ap_error *err)
{
	mb b;
	int64_t dx[4] = { 4, 3, 5, 6 }, dc[1] = { 3 };
	float sc[3] = { 1, 2, 0.5f }, bi[3] = { 0, 1, -1 }, mu[3] = { 0.1f, 0.2f, 0.3f };
	float va[3] = { 1, 2, 3 };
	Onnx__NodeProto *n;
	ap_graph *g;
	size_t cnt;
	char **names;

	mb_init(&b, opset);
	mb_input(&b, "x", 1, 4, dx);
	mb_init_tensor(&b, "scale", 1, 1, dc, sc, sizeof(sc));
	mb_init_tensor(&b, "B", 1, 1, dc, bi, sizeof(bi));
	mb_init_tensor(&b, "input_mean", 1, 1, dc, mu, sizeof(mu));
	mb_init_tensor(&b, "input_var", 1, 1, dc, va, sizeof(va));
	n = mb_node(&b, "BatchNormalization", "x,scale,B,input_mean,input_var", outs, "bn");
	mb_float(&b, n, "epsilon", 1e-3f);
	if (train >= 0)
		mb_int(&b, n, "training_mode", train);
	if (is_test >= 0)
		mb_int(&b, n, "is_test", is_test);
	if (momentum >= 0)
		mb_float(&b, n, "momentum", momentum);
	names = mb_list(&b, graph_outs, &cnt);
	for (size_t i = 0; i < cnt; i++)
		mb_output(&b, names[i]);
	g = mb_import(&b, NULL, 0, NULL, err);
	mb_free(&b);
	return g;
}

static const ap_node *only_bn(const ap_graph *g)
{
	const ap_node *bn = NULL;

	for (int i = 0; i < g->n_nodes; i++)
		if (g->nodes[i].op == AP_OP_BATCH_NORM) {
			ck_assert_ptr_null(bn);
			bn = &g->nodes[i];
		}
	ck_assert_ptr_nonnull(bn);
	return bn;
}

/* BatchNormalization in training mode: opset 15 training_mode=1 (all
 * outputs, one left out, Y only), the legacy forms (opset 9 with five
 * outputs, opset 6 is_test=0), the inference form left as it was, and the
 * refusals (saved_var, statistics outputs in inference mode, a bad
 * training_mode). */
START_TEST(batchnorm_training_mode)
{
	ap_error err;
	ap_graph *g;
	const ap_node *bn;

	g = bn_model(15, "y,rm,rv", "y,rm,rv", 1, -1, 0.8f, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	bn = only_bn(g);
	ck_assert_int_eq(ap_node_int(bn, "training_mode", 0), 1);
	ck_assert(fabs(ap_node_float(bn, "momentum", 0) - 0.8) < 1e-6);
	ck_assert(fabs(ap_node_float(bn, "epsilon", 0) - 1e-3) < 1e-9);
	ck_assert_int_eq(bn->n_inputs, 5);
	ck_assert_int_eq(bn->n_outputs, 3);
	ck_assert_int_eq(g->n_outputs, 3);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(g->outputs[k], bn->outputs[k]);
	ck_assert_int_eq(g->tensors[bn->outputs[0]].rank, 4);
	ck_assert_int_eq(g->tensors[bn->outputs[0]].dims[3], 6);
	for (int k = 1; k < 3; k++) {
		ck_assert_int_eq(g->tensors[bn->outputs[k]].rank, 1);
		ck_assert_int_eq(g->tensors[bn->outputs[k]].dims[0], 3);
		ck_assert_int_eq(g->tensors[bn->outputs[k]].dtype, AP_DT_F32);
	}
	ck_assert_str_eq(g->tensors[bn->outputs[2]].name, "rv");
	ck_assert_uint_eq(g->eager_kernels, 1);
	ap_graph_free(g);

	/* running_mean left out; momentum defaults to 0.9 */
	g = bn_model(14, "y,,rv", "y,rv", 1, -1, -1, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	bn = only_bn(g);
	ck_assert_int_eq(bn->n_outputs, 3);
	ck_assert_int_eq(bn->outputs[1], -1);
	ck_assert_int_eq(g->tensors[bn->outputs[2]].dims[0], 3);
	ck_assert(fabs(ap_node_float(bn, "momentum", 0) - 0.9) < 1e-6);
	ap_graph_free(g);

	/* Y only, training: the batch statistics still normalise */
	g = bn_model(15, "y", "y", 1, -1, -1, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	bn = only_bn(g);
	ck_assert_int_eq(bn->n_outputs, 1);
	ck_assert_int_eq(ap_node_int(bn, "training_mode", 0), 1);
	ap_graph_free(g);

	/* inference mode stays the plain form: no training attributes */
	g = bn_model(15, "y", "y", 0, -1, -1, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	bn = only_bn(g);
	ck_assert_int_eq(bn->n_outputs, 1);
	ck_assert_ptr_null(ap_node_attr(bn, "training_mode"));
	ck_assert_ptr_null(ap_node_attr(bn, "momentum"));
	ap_graph_free(g);

	/* opsets 7-13: five outputs mean training; mean/var are the running ones */
	g = bn_model(9, "y,m,v,sm,sv", "y,m,v", -1, -1, 0.7f, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	bn = only_bn(g);
	ck_assert_int_eq(ap_node_int(bn, "training_mode", 0), 1);
	ck_assert(fabs(ap_node_float(bn, "momentum", 0) - 0.7) < 1e-6);
	ck_assert_int_eq(bn->n_outputs, 3);
	ck_assert_int_eq(g->tensors[g->outputs[1]].dims[0], 3);
	ap_graph_free(g);

	/* ... but saved_var is refused (runtimes disagree on its meaning) */
	g = bn_model(9, "y,m,v,sm,sv", "y,sv", -1, -1, -1, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);

	/* opset 6: an explicit is_test decides */
	g = bn_model(6, "y", "y", -1, 0, -1, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_node_int(only_bn(g), "training_mode", 0), 1);
	ap_graph_free(g);
	g = bn_model(6, "y", "y", -1, 1, -1, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_ptr_null(ap_node_attr(only_bn(g), "training_mode"));
	ap_graph_free(g);

	/* statistics outputs in inference mode are invalid if used */
	g = bn_model(15, "y,rm,rv", "y,rm", 0, -1, -1, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	/* training_mode other than 0 / 1 */
	g = bn_model(15, "y", "y", 2, -1, -1, &err);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(err.code, AP_EINVAL);
	ck_assert_str_eq(err.node, "bn");
}
END_TEST

/* ---- the structure alone (ap_onnx_skeleton) ---------------------------------------- */

enum { SK_MODEL, SK_GRAPH, SK_NODE, SK_ATTR, SK_TENSOR };

/* Makes every whole page inside the raw_data of a large tensor
 * (initializers, Constant values, in subgraphs too) of the message of
 * kind `k` in `n` bytes at `p` unreadable; returns the bytes protected.
 * Field numbers from onnx.proto, walked by hand as the skeleton does. */
static size_t protect_weights(int k, const uint8_t *p, size_t n, size_t page)
{
	ap_pbw r;
	ap_pbw_field f;
	size_t done = 0;

	ap_pbw_init(&r, p, n);
	while (ap_pbw_next(&r, &f) == 1) {
		int child = -1;

		if (f.wire != 2)
			continue;
		if (k == SK_TENSOR && f.number == 9 && f.len > AP_CONST_MAX_BYTES) {
			uintptr_t a = ((uintptr_t)f.data + page - 1) & ~(uintptr_t)(page - 1);
			uintptr_t b = ((uintptr_t)f.data + f.len) & ~(uintptr_t)(page - 1);

			if (b > a) {
				ck_assert_int_eq(mprotect((void *)a, b - a, PROT_NONE), 0);
				done += b - a;
			}
			continue;
		}
		switch (k) {
		case SK_MODEL: child = f.number == 7 ? SK_GRAPH : -1; break;
		case SK_GRAPH: child = f.number == 1 ? SK_NODE : f.number == 5 ? SK_TENSOR : -1; break;
		case SK_NODE: child = f.number == 5 ? SK_ATTR : -1; break;
		case SK_ATTR:
			child = f.number == 5 || f.number == 10 ? SK_TENSOR
				: f.number == 6 || f.number == 11 ? SK_GRAPH : -1;
			break;
		}
		if (child >= 0)
			done += protect_weights(child, f.data, f.len, page);
	}
	return done;
}

/* Every model under models/: a copy whose weights' pages cannot be read
 * (a read would end the test with SIGSEGV) imports from its structure
 * alone to the full import's graph, every weight a PARAM without data,
 * and the client's io lists read from it too. */
START_TEST(structure_never_reads_weights)
{
	static const char *models[] = { "mlp_gelu_ln", "bert_like_2l", "squeezenet1_1",
					"silero_vad_op18_ifless", "ppocr_mobile_v2_cls" };
	size_t page = (size_t)sysconf(_SC_PAGESIZE), all = 0, all_guarded = 0;

	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
		char dir[1200], p[1300];
		uint8_t *buf, *region, *sk = NULL, h1[32], h2[32];
		size_t len, map_len, guarded, sl = 0;
		ap_params *params = NULL;
		ap_onnx_io *io = NULL;
		ap_graph *full, *g;
		ap_error err;
		loaded l;
		int n_param = 0;

		snprintf(dir, sizeof(dir), "%s/models/%s", td(), models[i]);
		snprintf(p, sizeof(p), "%s/model.onnx", dir);
		buf = slurp(p, &len);
		ck_assert_msg(buf != NULL, "cannot read %s", p);
		load_all(dir, &l);
		full = ap_onnx_import(buf, len, (const ap_host_tensor *const *)l.in, l.n_in, &params,
				      &err);
		ck_assert_msg(full != NULL, "%s: %s", models[i], err.msg);
		ck_assert_int_eq(ap_graph_hash_named(full, h1), 0);

		map_len = (len + page - 1) / page * page;
		region = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		ck_assert(region != MAP_FAILED);
		memcpy(region, buf, len);
		guarded = protect_weights(SK_MODEL, region, len, page);

		ck_assert_int_eq(ap_onnx_skeleton(region, len, &sk, &sl, &err), 0);
		ck_assert_uint_le(sl, len - guarded);
		free(sk);
		g = ap_onnx_import(region, len, (const ap_host_tensor *const *)l.in, l.n_in, NULL, &err);
		ck_assert_msg(g != NULL, "%s from its structure: %s", models[i], err.msg);
		ck_assert_int_eq(ap_graph_hash_named(g, h2), 0);
		ck_assert_msg(!memcmp(h1, h2, 32), "%s: another graph from its structure", models[i]);
		for (int t = 0; t < g->n_tensors; t++)
			if (g->tensors[t].kind == AP_TENSOR_PARAM) {
				ck_assert_ptr_null(g->tensors[t].data);
				ck_assert_ptr_nonnull(ap_params_find(params, g->tensors[t].name));
				n_param++;
			}
		ck_assert_int_eq(n_param, params->n);
		ck_assert_int_eq(ap_onnx_io_read(region, len, &io, &err), 0);
		ck_assert_int_gt(io->n_inputs, 0);
		printf("structure: %s: %zu bytes, %zu of them unreadable, skeleton %zu bytes, "
		       "%d weights\n", models[i], len, guarded, sl, n_param);
		if (!strcmp(models[i], "mlp_gelu_ln"))
			ck_assert_uint_gt(guarded, len / 10 * 9);
		all += len;
		all_guarded += guarded;
		ap_onnx_io_free(io);
		ck_assert_int_eq(munmap(region, map_len), 0);
		ap_graph_free(g);
		ap_graph_free(full);
		ap_params_free(params);
		free_all(&l);
		free(buf);
	}
	ck_assert_uint_gt(all_guarded, all / 10 * 8);
}
END_TEST

/* ap_onnx_skeleton on one initializer W (dims [n], dtype dt) added to an
 * input x of the same shape: its data as raw_data, as typed values, or in
 * an external file.  The skeleton, the full import and the import from
 * the structure alone must agree: the same error code, or the same graph
 * with W's data gone from the skeleton. */
enum sk_data { SK_RAW, SK_TYPED, SK_EXTERNAL };

static const struct sk_case {
	const char *what;
	int dtype;
	int64_t n;          /* W's dims: [n] */
	enum sk_data how;
	int64_t values;     /* values (or raw elements) actually present */
	int want;           /* 0 or the error code */
} sk_cases[] = {
	{ "large raw float", AP_DT_F32, 4096, SK_RAW, 4096, 0 },
	{ "small raw float kept", AP_DT_F32, 16, SK_RAW, 16, 0 },
	{ "large raw float, too few bytes", AP_DT_F32, 4096, SK_RAW, 4000, AP_EINVAL },
	{ "large raw float, too many bytes", AP_DT_F32, 4096, SK_RAW, 4097, AP_EINVAL },
	{ "large typed float", AP_DT_F32, 2000, SK_TYPED, 2000, 0 },
	{ "large typed float, one short", AP_DT_F32, 2000, SK_TYPED, 1999, AP_EINVAL },
	{ "large typed double", AP_DT_F64, 600, SK_TYPED, 600, 0 },
	{ "large typed int64", AP_DT_I64, 600, SK_TYPED, 600, 0 },
	{ "large typed int64, one over", AP_DT_I64, 600, SK_TYPED, 601, AP_EINVAL },
	{ "large typed int32", AP_DT_I32, 1500, SK_TYPED, 1500, 0 },
	/* a large external tensor: external_data_read (the skeleton keeps it,
	 * the structure imports without its file) */
};

static uint8_t *sk_model(const struct sk_case *c, size_t *len)
{
	mb b;
	int64_t d[1] = { c->n };
	size_t es = ap_dtype_size((ap_dtype)c->dtype), nv = (size_t)c->values;
	uint8_t *data = calloc(nv + 1, es), *buf;
	Onnx__TensorProto *w;
	Onnx__StringStringEntryProto *loc;

	for (size_t k = 0; k < nv * es; k++)
		data[k] = (uint8_t)(k * 7 + 1);
	mb_init(&b, 13);
	mb_input(&b, "x", c->dtype, 1, d);
	mb_init_tensor(&b, "W", c->dtype, 1, d, data, nv * es);
	w = b.inits[0];
	if (c->how != SK_RAW) {
		w->has_raw_data = 0;
		w->raw_data.len = 0;
	}
	if (c->how == SK_TYPED) {
		switch (c->dtype) {
		case AP_DT_F32:
			w->float_data = mb_alloc(&b, nv * sizeof(float));
			w->n_float_data = nv;
			for (size_t k = 0; k < nv; k++)
				w->float_data[k] = (float)k * 0.5f;
			break;
		case AP_DT_F64:
			w->double_data = mb_alloc(&b, nv * sizeof(double));
			w->n_double_data = nv;
			for (size_t k = 0; k < nv; k++)
				w->double_data[k] = (double)k * 0.25;
			break;
		case AP_DT_I64:
			w->int64_data = mb_alloc(&b, nv * sizeof(int64_t));
			w->n_int64_data = nv;
			for (size_t k = 0; k < nv; k++)   /* short, long and negative varints */
				w->int64_data[k] = k % 3 ? (int64_t)k << 40 : -(int64_t)k;
			break;
		default:
			w->int32_data = mb_alloc(&b, nv * sizeof(int32_t));
			w->n_int32_data = nv;
			for (size_t k = 0; k < nv; k++)
				w->int32_data[k] = k % 2 ? (int32_t)k * 1000 : -(int32_t)k;
			break;
		}
	}
	if (c->how == SK_EXTERNAL) {
		loc = mb_alloc(&b, sizeof(*loc));
		onnx__string_string_entry_proto__init(loc);
		loc->key = "location";
		loc->value = "weights.bin";
		w->external_data = mb_alloc(&b, sizeof(*w->external_data));
		w->external_data[0] = loc;
		w->n_external_data = 1;
		w->has_data_location = 1;
		w->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
	}
	mb_node(&b, "Add", "x,W", "y", "add");
	mb_output(&b, "y");
	*len = onnx__model_proto__get_packed_size(&b.m);
	buf = malloc(*len + 1);
	onnx__model_proto__pack(&b.m, buf);
	mb_free(&b);
	free(data);
	return buf;
}

START_TEST(skeleton_cases)
{
	for (size_t i = 0; i < sizeof(sk_cases) / sizeof(sk_cases[0]); i++) {
		const struct sk_case *c = &sk_cases[i];
		size_t len = 0, sl = 0, es = ap_dtype_size((ap_dtype)c->dtype);
		uint8_t *buf = sk_model(c, &len), *sk = NULL, h1[32], h2[32];
		bool large = (size_t)c->n * es > AP_CONST_MAX_BYTES;
		bool strip = large && (c->dtype == AP_DT_F32 || c->dtype == AP_DT_F64);
		ap_params *params = NULL;
		ap_graph *full, *g;
		ap_error e1, e2, e3;
		int rc;

		rc = ap_onnx_skeleton(buf, len, &sk, &sl, &e1);
		full = ap_onnx_import(buf, len, NULL, 0, &params, &e2);
		g = ap_onnx_import(buf, len, NULL, 0, NULL, &e3);
		ck_assert_msg(rc == c->want, "%s: skeleton %d, want %d", c->what, rc, c->want);
		if (c->want) {
			ck_assert_ptr_null(sk);
			ck_assert_str_eq(e1.tensor, "W");
			ck_assert_msg(!full && e2.code == c->want, "%s: the full import: %d", c->what,
				      full ? 0 : e2.code);
			ck_assert_msg(!g && e3.code == c->want, "%s: the structure: %d", c->what,
				      g ? 0 : e3.code);
			ck_assert_str_eq(e3.tensor, "W");
		} else {
			Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, sl, sk);
			const Onnx__TensorProto *w;
			const ap_tensor *tw;

			ck_assert_msg(full != NULL, "%s: %s", c->what, e2.msg);
			ck_assert_msg(g != NULL, "%s: %s", c->what, e3.msg);
			ck_assert_int_eq(ap_graph_hash_named(full, h1), 0);
			ck_assert_int_eq(ap_graph_hash_named(g, h2), 0);
			ck_assert_msg(!memcmp(h1, h2, 32), "%s: another graph", c->what);
			ck_assert_ptr_nonnull(m);
			w = m->graph->initializer[0];
			ck_assert_str_eq(w->name, "W");
			ck_assert_uint_eq(w->n_dims, 1);
			ck_assert_int_eq(w->dims[0], c->n);
			ck_assert_int_eq(w->data_type, c->dtype);
			/* a weight's data gone when large; every byte kept when
			 * small, or integers (indices the importer may fold) */
			ck_assert_int_eq(w->has_raw_data || w->n_float_data || w->n_double_data ||
					 w->n_int64_data || w->n_int32_data, !strip);
			if (strip)
				ck_assert_uint_lt(sl + (size_t)c->n, len);
			else
				ck_assert(sl == len && !memcmp(sk, buf, len));
			tw = &g->tensors[ap_graph_find_tensor(g, "W")];
			ck_assert_int_eq(tw->kind, large ? AP_TENSOR_PARAM : AP_TENSOR_CONST);
			if (large)
				ck_assert_ptr_nonnull(ap_params_find(params, "W"));
			onnx__model_proto__free_unpacked(m, NULL);
		}
		free(sk);
		ap_graph_free(full);
		ap_graph_free(g);
		ap_params_free(params);
		free(buf);
	}
}
END_TEST

/* A ModelProto whose graph holds a node whose attribute holds a graph
 * ... `levels` messages below the model, built inside out into `out`
 * (1100 bytes); returns its length. */
static size_t nested(uint8_t *out, int levels)
{
	static const uint8_t tags[3] = { (6 << 3) | 2, (1 << 3) | 2, (5 << 3) | 2 };
	uint8_t tmp[1100];
	size_t len = 0;

	for (int k = levels - 1; k >= 0; k--) {
		size_t hl = 0;
		uint8_t tag = k == 0 ? (7 << 3) | 2 : tags[k % 3];

		tmp[hl++] = tag;
		hl += ap_pbw_put_varint(tmp + hl, len);
		ck_assert_uint_lt(hl + len, sizeof(tmp));
		memcpy(tmp + hl, out, len);
		len += hl;
		memcpy(out, tmp, len);
	}
	return len;
}

/* A large Constant's value, bytes that do not walk, and nesting (If
 * branches inside If branches) deeper than the skeleton follows. */
START_TEST(skeleton_constant_and_bad_bytes)
{
	mb b;
	int64_t d[1] = { 2048 };
	float *v = calloc(2048, sizeof(float));
	Onnx__NodeProto *n;
	Onnx__AttributeProto *a;
	Onnx__TensorProto *t;
	ap_params *params = NULL;
	ap_graph *full, *g;
	ap_error err;
	uint8_t *buf, *sk = NULL, h1[32], h2[32], deep[1100];
	size_t len, sl = 0, dl = 0;

	mb_init(&b, 13);
	mb_input(&b, "x", AP_DT_F32, 1, d);
	n = mb_node(&b, "Constant", "", "c", "const");
	a = mb_attr(&b, n, "value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
	t = mb_alloc(&b, sizeof(*t));
	onnx__tensor_proto__init(t);
	t->has_data_type = 1;
	t->data_type = AP_DT_F32;
	t->dims = d;
	t->n_dims = 1;
	t->has_raw_data = 1;
	t->raw_data.data = (uint8_t *)v;
	t->raw_data.len = 2048 * sizeof(float);
	a->t = t;
	mb_node(&b, "Mul", "x,c", "y", "mul");
	mb_output(&b, "y");
	len = onnx__model_proto__get_packed_size(&b.m);
	buf = malloc(len);
	onnx__model_proto__pack(&b.m, buf);
	ck_assert_int_eq(ap_onnx_skeleton(buf, len, &sk, &sl, &err), 0);
	ck_assert_uint_lt(sl + 8192, len);
	full = ap_onnx_import(buf, len, NULL, 0, &params, &err);
	ck_assert_msg(full != NULL, "%s", err.msg);
	g = ap_onnx_import(buf, len, NULL, 0, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_graph_hash_named(full, h1), 0);
	ck_assert_int_eq(ap_graph_hash_named(g, h2), 0);
	ck_assert(!memcmp(h1, h2, 32));
	ck_assert_int_eq(g->tensors[ap_graph_find_tensor(g, "c")].kind, AP_TENSOR_PARAM);
	free(sk);
	sk = NULL;

	/* truncated: the last byte of the model missing */
	ck_assert_int_eq(ap_onnx_skeleton(buf, len - 1, &sk, &sl, &err), AP_EMESSAGE);
	ck_assert_ptr_null(sk);
	/* a length past the end */
	ck_assert_int_eq(ap_onnx_skeleton((const uint8_t *)"\x3a\x7f\x0a", 3, &sk, &sl, &err),
			 AP_EMESSAGE);
	/* no bytes at all: an empty model, which the importer refuses */
	ck_assert_int_eq(ap_onnx_skeleton(buf, 0, &sk, &sl, &err), 0);
	ck_assert_uint_eq(sl, 0);
	free(sk);
	sk = NULL;

	/* graph -> node -> attribute g -> graph ...: 30 messages deep walks,
	 * 100 deep is refused before the importer decodes it */
	ck_assert_int_eq(ap_onnx_skeleton(deep, nested(deep, 30), &sk, &sl, &err), 0);
	free(sk);
	sk = NULL;
	dl = nested(deep, 100);
	ck_assert_int_eq(ap_onnx_skeleton(deep, dl, &sk, &sl, &err), AP_EMESSAGE);
	ck_assert_ptr_null(sk);
	ck_assert_ptr_null(ap_onnx_import(deep, dl, NULL, 0, NULL, &err));
	ck_assert_int_eq(err.code, AP_EMESSAGE);

	ap_graph_free(full);
	ap_graph_free(g);
	ap_params_free(params);
	mb_free(&b);
	free(buf);
	free(v);
}
END_TEST


/* ---- external data (ap_onnx_import_dir) and shape bindings ------------------------- */

#define EXT_N 2048   /* floats: 8 KiB, over AP_CONST_MAX_BYTES, a weight */

/* Makes the last initializer added keep its data in `location` (offset,
 * length; a negative one is left out) instead of raw_data. */
static void mb_externalise(mb *b, const char *location, long long offset, long long length)
{
	Onnx__TensorProto *t = b->inits[b->g.n_initializer - 1];
	const char *keys[3] = { "location", "offset", "length" };
	char vals[3][32];
	int n = 0;

	t->has_raw_data = 0;
	t->raw_data.len = 0;
	t->has_data_location = 1;
	t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
	t->external_data = mb_alloc(b, 3 * sizeof(*t->external_data));
	snprintf(vals[1], sizeof(vals[1]), "%lld", offset);
	snprintf(vals[2], sizeof(vals[2]), "%lld", length);
	for (int k = 0; k < 3; k++) {
		Onnx__StringStringEntryProto *e;

		if ((k == 1 && offset < 0) || (k == 2 && length < 0))
			continue;
		e = mb_alloc(b, sizeof(*e));
		onnx__string_string_entry_proto__init(e);
		e->key = mb_str(b, keys[k]);
		e->value = mb_str(b, k == 0 ? location : vals[k]);
		t->external_data[n++] = e;
	}
	t->n_external_data = (size_t)n;
}

/* Y = X [N, EXT_N] + W, W's data in `location` at `offset` (length
 * `length`, -1: left out). */
static void ext_model(mb *b, const char *location, long long offset, long long length)
{
	int64_t dx[2] = { -1, EXT_N }, dw[1] = { EXT_N };
	float zero[EXT_N] = { 0 };

	mb_init(b, 17);
	mb_input(b, "X", 1, 2, dx);
	mb_init_tensor(b, "W", 1, 1, dw, zero, sizeof(zero));
	mb_externalise(b, location, offset, length);
	mb_node(b, "Add", "X,W", "Y", "add");
	mb_output(b, "Y");
}

static ap_graph *mb_import_dir(mb *b, const char *dir, const ap_host_tensor *const *bind, int nb,
			       ap_params **params, ap_error *err)
{
	size_t len = onnx__model_proto__get_packed_size(&b->m);
	uint8_t *buf = malloc(len + 1);
	ap_graph *g;

	onnx__model_proto__pack(&b->m, buf);
	g = ap_onnx_import_dir(buf, len, dir, bind, nb, params, err);
	free(buf);
	return g;
}

static void write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");

	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(p, 1, n, f), n);
	fclose(f);
}

/* A temp folder base/ with base/m/ (the model's folder); the weights
 * (prefixed by 16 bytes) in base/m/w.bin and base/outside.bin. */
static void ext_folders(char *base, size_t cap, char *mdir, float *w)
{
	char p[600];
	uint8_t buf[16 + EXT_N * 4];

	snprintf(base, cap, "/tmp/apollo-ext.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base));
	snprintf(mdir, 512, "%s/m", base);
	ck_assert_int_eq(mkdir(mdir, 0700), 0);
	for (int i = 0; i < EXT_N; i++)
		w[i] = 0.5f * (float)i - 3.0f;
	memset(buf, 0x7f, 16);
	memcpy(buf + 16, w, EXT_N * 4);
	snprintf(p, sizeof(p), "%s/w.bin", mdir);
	write_file(p, buf, sizeof(buf));
	snprintf(p, sizeof(p), "%s/outside.bin", base);
	write_file(p, buf, sizeof(buf));
}

static void ext_cleanup(const char *base)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(external_data_read)
{
	static float w[EXT_N];
	char base[512], mdir[512], p[600];
	ap_host_tensor *shape;
	ap_params *params = NULL;
	const ap_host_tensor *pw;
	ap_graph *g, *s;
	uint8_t h1[32], h2[32];
	ap_error err;
	mb b;

	ext_folders(base, sizeof(base), mdir, w);
	ck_assert_int_eq(ap_shape_binding_parse("X=3x2048", &shape, &err), 0);
	ext_model(&b, "w.bin", 16, EXT_N * 4);
	/* with weights: the values written */
	g = mb_import_dir(&b, mdir, (const ap_host_tensor *const *)&shape, 1, &params, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	pw = ap_params_find(params, "W");
	ck_assert_ptr_nonnull(pw);
	ck_assert_uint_eq(pw->nbytes, sizeof(w));
	ck_assert_int_eq(memcmp(pw->data, w, sizeof(w)), 0);
	ck_assert_int_eq(g->tensors[g->inputs[0]].dims[0], 3);
	/* structure only: the same graph, and the file is never opened */
	snprintf(p, sizeof(p), "%s/w.bin", mdir);
	ck_assert_int_eq(unlink(p), 0);
	s = mb_import_dir(&b, mdir, (const ap_host_tensor *const *)&shape, 1, NULL, &err);
	ck_assert_msg(s != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_graph_hash_named(g, h1), 0);
	ck_assert_int_eq(ap_graph_hash_named(s, h2), 0);
	ck_assert_int_eq(memcmp(h1, h2, 32), 0);
	ap_graph_free(s);
	/* ...and without a folder (the daemon's import) too */
	s = mb_import_dir(&b, NULL, (const ap_host_tensor *const *)&shape, 1, NULL, &err);
	ck_assert_msg(s != NULL, "%s", err.msg);
	ap_graph_free(s);
	/* with weights, the missing file is an error naming tensor and file */
	ap_params_free(params);
	params = NULL;
	ck_assert_ptr_null(mb_import_dir(&b, mdir, (const ap_host_tensor *const *)&shape, 1,
					 &params, &err));
	ck_assert_int_eq(err.code, AP_EIO);
	ck_assert_msg(strstr(err.msg, "'W'") && strstr(err.msg, "w.bin"), "%s", err.msg);
	/* without a folder, weights cannot be read: the client binds them */
	ck_assert_ptr_null(mb_import_dir(&b, NULL, (const ap_host_tensor *const *)&shape, 1,
					 &params, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, "'W'") && strstr(err.msg, "bound by the client"), "%s",
		      err.msg);
	ck_assert_ptr_null(ap_onnx_import((const uint8_t *)"", 0, NULL, 0, NULL, &err));
	ap_graph_free(g);
	ap_params_free(params);
	ap_host_tensor_free(shape);
	mb_free(&b);
	ext_cleanup(base);
}
END_TEST

/* Imports the model with W at (location, offset, length) with weights:
 * refused with `code` and a message holding 'W', the location and `what`. */
static void ext_refused(const char *mdir, const char *location, long long offset,
			long long length, int code, const char *what)
{
	ap_host_tensor *shape;
	ap_params *params = NULL;
	ap_error err;
	mb b;

	ck_assert_int_eq(ap_shape_binding_parse("X=1x2048", &shape, &err), 0);
	ext_model(&b, location, offset, length);
	ck_assert_ptr_null(mb_import_dir(&b, mdir, (const ap_host_tensor *const *)&shape, 1,
					 &params, &err));
	ck_assert_ptr_null(params);
	ck_assert_msg(err.code == code, "%s: code %d: %s", location, err.code, err.msg);
	ck_assert_msg(strstr(err.msg, "'W'") && strstr(err.msg, location) && strstr(err.msg, what),
		      "%s", err.msg);
	ap_host_tensor_free(shape);
	mb_free(&b);
}

START_TEST(external_data_refused)
{
	static float w[EXT_N];
	char base[512], mdir[512], p[700], q[700];

	ext_folders(base, sizeof(base), mdir, w);
	/* out of the folder: by "..", an absolute path, a link */
	ext_refused(mdir, "../outside.bin", 16, EXT_N * 4, AP_EINVAL, "'..'");
	ext_refused(mdir, "/etc/passwd", 0, -1, AP_EINVAL, "absolute");
	snprintf(p, sizeof(p), "%s/outside.bin", base);
	snprintf(q, sizeof(q), "%s/link.bin", mdir);
	ck_assert_int_eq(symlink(p, q), 0);
	ext_refused(mdir, "link.bin", 16, EXT_N * 4, AP_EINVAL, "outside");
	/* a link that stays inside is followed */
	snprintf(q, sizeof(q), "%s/inside.bin", mdir);
	ck_assert_int_eq(symlink("w.bin", q), 0);
	{
		ap_host_tensor *shape;
		ap_params *params = NULL;
		ap_error err;
		ap_graph *g;
		mb b;

		ck_assert_int_eq(ap_shape_binding_parse("X=1x2048", &shape, &err), 0);
		ext_model(&b, "inside.bin", 16, -1);   /* length: to the end */
		g = mb_import_dir(&b, mdir, (const ap_host_tensor *const *)&shape, 1, &params, &err);
		ck_assert_msg(g != NULL, "%s", err.msg);
		ck_assert_int_eq(memcmp(ap_params_find(params, "W")->data, w, sizeof(w)), 0);
		ap_graph_free(g);
		ap_params_free(params);
		ap_host_tensor_free(shape);
		mb_free(&b);
	}
	/* past the end of the file; a length that disagrees with the dims */
	ext_refused(mdir, "w.bin", 32, EXT_N * 4, AP_EINVAL, "truncated");
	ext_refused(mdir, "w.bin", 100000, EXT_N * 4, AP_EINVAL, "offset");
	ext_refused(mdir, "w.bin", 16, EXT_N * 2, AP_EINVAL, "need 8192");
	ext_refused(mdir, "w.bin", 0, -1, AP_EINVAL, "need 8192");
	ext_refused(mdir, "w.bin", -1, -1, AP_EINVAL, "need 8192");
	ext_refused(mdir, "missing.bin", 0, -1, AP_EIO, "cannot open");
	/* a truncated file */
	snprintf(p, sizeof(p), "%s/w.bin", mdir);
	ck_assert_int_eq(truncate(p, 4096), 0);
	ext_refused(mdir, "w.bin", 16, EXT_N * 4, AP_EINVAL, "truncated");
	ext_cleanup(base);
}
END_TEST

/* ap_onnx_external_files on ext_model's W at `location`: rc, and *loc the
 * one location listed (or NULL). */
static int ext_files(const char *mdir, const char *location, bool twice, char **loc, ap_error *err)
{
	int64_t dw[1] = { EXT_N };
	static float zero[EXT_N];
	char **locs, **paths;
	uint8_t *buf;
	size_t len;
	int n, rc;
	mb b;

	ext_model(&b, location, 16, EXT_N * 4);
	if (twice) {   /* a second tensor in the same file, spelled another way */
		char other[64];

		snprintf(other, sizeof(other), "./%s", location);
		mb_init_tensor(&b, "W2", 1, 1, dw, zero, sizeof(zero));
		mb_externalise(&b, location, 16, EXT_N * 4);
		mb_init_tensor(&b, "W3", 1, 1, dw, zero, sizeof(zero));
		mb_externalise(&b, other, 16, EXT_N * 4);
	}
	len = onnx__model_proto__get_packed_size(&b.m);
	buf = malloc(len + 1);
	onnx__model_proto__pack(&b.m, buf);
	rc = ap_onnx_external_files(buf, len, mdir, &locs, &paths, &n, err);
	free(buf);
	mb_free(&b);
	*loc = NULL;
	if (rc == 0) {
		ck_assert_int_eq(n, twice ? 2 : 1);
		*loc = locs[0];
		ck_assert_ptr_nonnull(strstr(paths[0], "/m/w.bin"));
		ck_assert_int_eq(paths[0][0], '/');
		if (twice)
			ck_assert_str_eq(locs[1], "./w.bin");
		for (int i = 0; i < n; i++) {
			if (i)
				free(locs[i]);
			free(paths[i]);
		}
		free(locs);
		free(paths);
	}
	return rc;
}

START_TEST(external_data_files)
{
	static float w[EXT_N];
	char base[512], mdir[512], *loc, **locs, **paths;
	int n;
	ap_error err;
	mb b;
	uint8_t *buf;
	size_t len;

	ext_folders(base, sizeof(base), mdir, w);
	ck_assert_int_eq(ext_files(mdir, "w.bin", false, &loc, &err), 0);
	ck_assert_str_eq(loc, "w.bin");
	free(loc);
	ck_assert_int_eq(ext_files(mdir, "w.bin", true, &loc, &err), 0);   /* each location once */
	free(loc);
	/* checked as the importer checks before reading */
	ck_assert_int_eq(ext_files(mdir, "../outside.bin", false, &loc, &err), AP_EINVAL);
	ck_assert_msg(strstr(err.msg, "'W'") && strstr(err.msg, "'..'"), "%s", err.msg);
	ck_assert_int_eq(ext_files(mdir, "/etc/passwd", false, &loc, &err), AP_EINVAL);
	ck_assert_int_eq(ext_files(mdir, "missing.bin", false, &loc, &err), AP_EIO);
	ck_assert_msg(strstr(err.msg, "missing.bin"), "%s", err.msg);
	/* a model without external data lists none; bytes that are no model */
	mb_init(&b, 17);
	mb_output(&b, "Y");
	len = onnx__model_proto__get_packed_size(&b.m);
	buf = malloc(len + 1);
	onnx__model_proto__pack(&b.m, buf);
	ck_assert_int_eq(ap_onnx_external_files(buf, len, mdir, &locs, &paths, &n, &err), 0);
	ck_assert_int_eq(n, 0);
	free(locs);
	free(paths);
	free(buf);
	mb_free(&b);
	ck_assert_int_lt(ap_onnx_external_files((const uint8_t *)"\xff\xff", 2, mdir, &locs, &paths,
						&n, &err), 0);
	ext_cleanup(base);
}
END_TEST

START_TEST(shape_bindings)
{
	static const struct { const char *spec; int code; const char *why; } bad[] = {
		{ "X", AP_EINVAL, "NAME=DIMS" }, { "=3", AP_EINVAL, "NAME=DIMS" },
		{ "X=0x2048", AP_EINVAL, "is 0" }, { "X=-1x2048", AP_EINVAL, "positive" },
		{ "X=3x", AP_EINVAL, "ends with" }, { "X=3xx4", AP_EINVAL, "positive" },
		{ "X=3*4", AP_EINVAL, "positive" }, { "X=1x1x1x1x1x1x1x1x1", AP_EINVAL, "more than" },
		{ "X=99999999999999999999", AP_ETOOLARGE, "over" },
		{ "X=100000x100000x100000", AP_ETOOLARGE, "elements" },
	};
	static const struct { const char *spec; int code; const char *why; } wrong[] = {
		{ "X=3x100", AP_ESHAPE, "dimension 1 is 2048 in the model, 100 in the binding" },
		{ "X=3", AP_ESHAPE, "the model gives it 2 dimensions, the binding 1" },
		{ "Z=3x2048", AP_EINVAL, "'Z', which is not an input of the model (its inputs: 'X')" },
		{ "W=2048", AP_EINVAL, "not an input" },
	};
	int64_t dx[2] = { -1, EXT_N }, dw[1] = { EXT_N };
	static float zero[EXT_N];
	ap_host_tensor *t;
	ap_error err;
	ap_graph *g;
	mb b;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ap_error_clear(&err);
		ck_assert_int_eq(ap_shape_binding_parse(bad[i].spec, &t, &err), bad[i].code);
		ck_assert_ptr_null(t);
		ck_assert_msg(strstr(err.msg, bad[i].why), "%s: %s", bad[i].spec, err.msg);
	}
	ck_assert_int_eq(ap_shape_binding_parse("in.put:0=1x3x224x224", &t, &err), 0);
	ck_assert_str_eq(t->name, "in.put:0");
	ck_assert_int_eq(t->rank, 4);
	ck_assert_int_eq(t->dims[3], 224);
	ck_assert_int_eq(t->dtype, AP_DT_UNDEF);
	ck_assert_ptr_null(t->data);
	ap_host_tensor_free(t);
	mb_init(&b, 17);
	mb_input(&b, "X", 1, 2, dx);
	mb_init_tensor(&b, "W", 1, 1, dw, zero, sizeof(zero));
	mb_node(&b, "Add", "X,W", "Y", "add");
	mb_output(&b, "Y");
	for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
		ck_assert_int_eq(ap_shape_binding_parse(wrong[i].spec, &t, &err), 0);
		g = mb_import(&b, (const ap_host_tensor *const *)&t, 1, NULL, &err);
		ck_assert_ptr_null(g);
		ck_assert_int_eq(err.code, wrong[i].code);
		ck_assert_msg(strstr(err.msg, wrong[i].why), "%s: %s", wrong[i].spec, err.msg);
		ap_host_tensor_free(t);
	}
	ck_assert_int_eq(ap_shape_binding_parse("X=5x2048", &t, &err), 0);
	g = mb_import(&b, (const ap_host_tensor *const *)&t, 1, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(g->tensors[g->inputs[0]].dtype, AP_DT_F32);
	ck_assert_int_eq(g->tensors[g->inputs[0]].dims[0], 5);
	ap_graph_free(g);
	ap_host_tensor_free(t);
	mb_free(&b);
}
END_TEST

static Suite *import_suite(void)
{
	Suite *s = suite_create("import");
	TCase *all = tcase_create("testdata");
	TCase *tc = tcase_create("targeted");

	tcase_set_timeout(all, 300);
	tcase_add_test(all, import_every_test);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, silero_if_inlined);
	tcase_add_test(tc, symbolic_dims_bound);
	tcase_add_test(tc, eager_kernels_mlp);
	tcase_add_test(tc, constant_of_shape_weights);
	tcase_add_test(tc, integer_inputs_become_constants);
	tcase_add_test(tc, hash_stable_across_imports);
	tcase_add_test(tc, legacy_broadcast);
	tcase_add_test(tc, old_softmax_axes);
	tcase_add_test(tc, old_attribute_forms);
	tcase_add_test(tc, shape_arithmetic_folded);
	tcase_add_test(tc, weights_are_not_folded);
	tcase_add_test(tc, outputs_are_values);
	tcase_add_test(tc, errors_name_the_node);
	tcase_add_test(tc, large_constant_becomes_param);
	tcase_add_test(tc, float64_intermediates);
	tcase_add_test(tc, batchnorm_training_mode);
	tcase_add_test(tc, structure_never_reads_weights);
	tcase_add_test(tc, skeleton_cases);
	tcase_add_test(tc, skeleton_constant_and_bad_bytes);
	tcase_add_test(tc, external_data_read);
	tcase_add_test(tc, external_data_refused);
	tcase_add_test(tc, external_data_files);
	tcase_add_test(tc, shape_bindings);
	suite_add_tcase(s, all);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(import_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
