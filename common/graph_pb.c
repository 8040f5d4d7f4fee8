/* graph_pb.c -- ap_graph <-> apollo.Graph (proto/apollo.proto).
 *
 * The wire form mirrors the IR one to one: tensors and nodes by index, op
 * types by name (ops.def), attributes typed.  Decoding trusts nothing: every
 * count is checked against a limit and every index against the tensor
 * count before the graph is built, so a hostile message costs at most its
 * own size; whole-graph checks (cycles, shapes) are ap_graph_validate's.
 * Encoding allocates each part with malloc and ap_graph_pb_free releases
 * exactly those parts.
 */
#include "graph.h"
#include "proto/apollo.pb-c.h"

#include <stdlib.h>
#include <string.h>

/* Most tensors / nodes / attributes / list values accepted from the wire. */
#define PB_MAX_ITEMS (1 << 24)
#define PB_MAX_ATTR_VALUES (1 << 20)

static bool dtype_known(int dt)
{
	return ap_dtype_in_graphs((ap_dtype)dt);
}

static int check_tensor(const Apollo__Tensor *pt, int i, ap_error *err)
{
	const char *name = pt->name ? pt->name : "";
	int64_t n = 1;

	if (pt->n_dims > AP_MAX_RANK)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
				    "tensor %d ('%s') has rank %zu (at most %d)", i, name, pt->n_dims,
				    AP_MAX_RANK);
	if (!dtype_known(pt->dtype))
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
				    "tensor %d ('%s') has unknown dtype %d", i, name, (int)pt->dtype);
	if ((int)pt->kind < 0 || (int)pt->kind > AP_TENSOR_CONST)
		return ap_error_set(err, AP_EINVAL, NULL, name, "tensor %d ('%s') has unknown kind %d",
				    i, name, (int)pt->kind);
	for (size_t d = 0; d < pt->n_dims; d++) {
		if (pt->dims[d] < 0)
			return ap_error_set(err, AP_ETOOLARGE, NULL, name,
					    "tensor '%s' has negative dimension %lld", name,
					    (long long)pt->dims[d]);
		if (pt->dims[d] == 0)
			n = 0;
	}
	for (size_t d = 0; d < pt->n_dims && n > 0; d++) {
		if (n > AP_MAX_ELEMENTS / pt->dims[d])
			return ap_error_set(err, AP_ETOOLARGE, NULL, name,
					    "tensor '%s' has more than %lld elements", name,
					    (long long)AP_MAX_ELEMENTS);
		n *= pt->dims[d];
	}
	if (pt->kind == APOLLO__TENSOR_KIND__TENSOR_CONST &&
	    pt->data.len != (size_t)n * ap_dtype_size((ap_dtype)pt->dtype))
		return ap_error_set(err, AP_EINVAL, NULL, name,
				    "constant '%s' carries %zu bytes, its shape needs %zu", name,
				    pt->data.len, (size_t)n * ap_dtype_size((ap_dtype)pt->dtype));
	return 0;
}

static int check_node(const Apollo__Node *pn, int i, size_t n_tensors, ap_error *err)
{
	const char *name = pn->name ? pn->name : "";

	if (ap_op_lookup(pn->op_type) < 0)
		return ap_error_set(err, AP_EUNSUPPORTED, name, NULL,
				    "node %d ('%s') has unknown op type '%s'", i, name,
				    pn->op_type ? pn->op_type : "");
	if (pn->n_inputs > PB_MAX_ITEMS || pn->n_outputs > PB_MAX_ITEMS ||
	    pn->n_attrs > PB_MAX_ITEMS)
		return ap_error_set(err, AP_ETOOLARGE, name, NULL, "node '%s' is too large", name);
	for (size_t k = 0; k < pn->n_inputs; k++)
		if (pn->inputs[k] < -1 || (int64_t)pn->inputs[k] >= (int64_t)n_tensors)
			return ap_error_set(err, AP_EINVAL, name, NULL,
					    "node '%s' input %zu refers to tensor %d, which does not exist (%zu tensors)",
					    name, k, pn->inputs[k], n_tensors);
	for (size_t k = 0; k < pn->n_outputs; k++)
		if (pn->outputs[k] < -1 || (int64_t)pn->outputs[k] >= (int64_t)n_tensors)
			return ap_error_set(err, AP_EINVAL, name, NULL,
					    "node '%s' output %zu refers to tensor %d, which does not exist (%zu tensors)",
					    name, k, pn->outputs[k], n_tensors);
	for (size_t a = 0; a < pn->n_attrs; a++) {
		const Apollo__Attribute *pa = pn->attrs[a];

		if (pa->type < APOLLO__ATTRIBUTE__TYPE__INT || pa->type > APOLLO__ATTRIBUTE__TYPE__FLOATS)
			return ap_error_set(err, AP_EINVAL, name, NULL,
					    "node '%s' attribute '%s' has unknown type %d", name,
					    pa->name ? pa->name : "", (int)pa->type);
		if (pa->n_ints > PB_MAX_ATTR_VALUES || pa->n_floats > PB_MAX_ATTR_VALUES)
			return ap_error_set(err, AP_ETOOLARGE, name, NULL,
					    "node '%s' attribute '%s' is too long", name,
					    pa->name ? pa->name : "");
	}
	return 0;
}

__ap_give ap_graph *ap_graph_from_pb(__ap_keep const struct Apollo__Graph *pb, ap_error *err)
{
	ap_graph *g;

	if (!pb) {
		ap_error_set(err, AP_EINVAL, NULL, NULL, "no graph");
		return NULL;
	}
	if (pb->n_tensors > PB_MAX_ITEMS || pb->n_nodes > PB_MAX_ITEMS ||
	    pb->n_inputs > PB_MAX_ITEMS || pb->n_outputs > PB_MAX_ITEMS) {
		ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
			     "graph has %zu tensors and %zu nodes (at most %d each)", pb->n_tensors,
			     pb->n_nodes, PB_MAX_ITEMS);
		return NULL;
	}
	for (size_t i = 0; i < pb->n_tensors; i++)
		if (check_tensor(pb->tensors[i], (int)i, err) < 0)
			return NULL;
	for (size_t i = 0; i < pb->n_nodes; i++)
		if (check_node(pb->nodes[i], (int)i, pb->n_tensors, err) < 0)
			return NULL;
	for (size_t i = 0; i < pb->n_inputs; i++)
		if (pb->inputs[i] < 0 || (size_t)pb->inputs[i] >= pb->n_tensors) {
			ap_error_set(err, AP_EINVAL, NULL, NULL,
				     "graph input %zu refers to tensor %d, which does not exist", i,
				     pb->inputs[i]);
			return NULL;
		}
	for (size_t i = 0; i < pb->n_outputs; i++)
		if (pb->outputs[i] < 0 || (size_t)pb->outputs[i] >= pb->n_tensors) {
			ap_error_set(err, AP_EINVAL, NULL, NULL,
				     "graph output %zu refers to tensor %d, which does not exist", i,
				     pb->outputs[i]);
			return NULL;
		}

	g = ap_graph_new(pb->name);
	if (!g)
		goto nomem;
	for (size_t i = 0; i < pb->n_tensors; i++) {
		const Apollo__Tensor *pt = pb->tensors[i];
		bool is_const = pt->kind == APOLLO__TENSOR_KIND__TENSOR_CONST;

		if (ap_graph_add_tensor(g, pt->name, (ap_dtype)pt->dtype, (int)pt->n_dims, pt->dims,
					(ap_tensor_kind)pt->kind, is_const ? pt->data.data : NULL,
					is_const ? pt->data.len : 0) < 0)
			goto nomem;
	}
	for (size_t i = 0; i < pb->n_nodes; i++) {
		const Apollo__Node *pn = pb->nodes[i];
		int n = ap_graph_add_node(g, pn->name, (ap_op)ap_op_lookup(pn->op_type),
					  (int)pn->n_inputs, pn->inputs, (int)pn->n_outputs,
					  pn->outputs);

		if (n < 0)
			goto nomem;
		for (size_t a = 0; a < pn->n_attrs; a++) {
			const Apollo__Attribute *pa = pn->attrs[a];
			const char *an = pa->name ? pa->name : "";
			int rc = 0;

			switch (pa->type) {
			case APOLLO__ATTRIBUTE__TYPE__INT: rc = ap_node_set_int(g, n, an, pa->i); break;
			case APOLLO__ATTRIBUTE__TYPE__FLOAT: rc = ap_node_set_float(g, n, an, pa->f); break;
			case APOLLO__ATTRIBUTE__TYPE__STRING:
				rc = ap_node_set_string(g, n, an, pa->s ? pa->s : "");
				break;
			case APOLLO__ATTRIBUTE__TYPE__INTS:
				rc = ap_node_set_ints(g, n, an, pa->ints, (int)pa->n_ints);
				break;
			default:
				rc = ap_node_set_floats(g, n, an, pa->floats, (int)pa->n_floats);
				break;
			}
			if (rc < 0)
				goto nomem;
		}
	}
	g->inputs = malloc((pb->n_inputs + 1) * sizeof(int));
	g->outputs = malloc((pb->n_outputs + 1) * sizeof(int));
	if (!g->inputs || !g->outputs)
		goto nomem;
	for (size_t i = 0; i < pb->n_inputs; i++)
		g->inputs[i] = pb->inputs[i];
	for (size_t i = 0; i < pb->n_outputs; i++) {
		g->outputs[i] = pb->outputs[i];
		g->tensors[pb->outputs[i]].is_output = true;
	}
	g->n_inputs = (int)pb->n_inputs;
	g->n_outputs = (int)pb->n_outputs;
	g->eager_kernels = pb->eager_kernels;
	return g;
nomem:
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory decoding a graph");
	return ap_graph_free(g);
}

/* ---- encoding ---------------------------------------------------------------- */

static void *dup_mem(const void *p, size_t n)
{
	void *d = malloc(n ? n : 1);

	if (d && n)
		memcpy(d, p, n);
	return d;
}

static void free_attr(Apollo__Attribute *a)
{
	if (!a)
		return;
	free(a->name);
	free(a->s);
	free(a->ints);
	free(a->floats);
	free(a);
}

static void free_node(Apollo__Node *n)
{
	if (!n)
		return;
	free(n->name);
	free(n->op_type);
	free(n->inputs);
	free(n->outputs);
	for (size_t a = 0; a < n->n_attrs; a++)
		free_attr(n->attrs[a]);
	free(n->attrs);
	free(n);
}

static void free_tensor(Apollo__Tensor *t)
{
	if (!t)
		return;
	free(t->name);
	free(t->dims);
	free(t->data.data);
	free(t);
}

void ap_graph_pb_free(__ap_take struct Apollo__Graph *pb)
{
	if (!pb)
		return;
	free(pb->name);
	for (size_t i = 0; i < pb->n_tensors; i++)
		free_tensor(pb->tensors[i]);
	free(pb->tensors);
	for (size_t i = 0; i < pb->n_nodes; i++)
		free_node(pb->nodes[i]);
	free(pb->nodes);
	free(pb->inputs);
	free(pb->outputs);
	free(pb);
}

static Apollo__Attribute *attr_to_pb(const ap_attr *a)
{
	Apollo__Attribute *pa = malloc(sizeof(*pa));

	if (!pa)
		return NULL;
	apollo__attribute__init(pa);
	pa->name = ap_strdup(a->name);
	pa->s = ap_strdup(a->type == AP_ATTR_STRING ? a->s : "");
	pa->ints = dup_mem(a->ints, (size_t)a->n_ints * sizeof(int64_t));
	pa->floats = dup_mem(a->floats, (size_t)a->n_floats * sizeof(double));
	if (!pa->name || !pa->s || !pa->ints || !pa->floats) {
		free_attr(pa);
		return NULL;
	}
	pa->type = (Apollo__Attribute__Type)a->type;
	pa->i = a->i;
	pa->f = a->f;
	pa->n_ints = a->type == AP_ATTR_INTS ? (size_t)a->n_ints : 0;
	pa->n_floats = a->type == AP_ATTR_FLOATS ? (size_t)a->n_floats : 0;
	return pa;
}

static Apollo__Node *node_to_pb(const ap_node *n)
{
	Apollo__Node *pn = malloc(sizeof(*pn));

	if (!pn)
		return NULL;
	apollo__node__init(pn);
	pn->name = ap_strdup(n->name);
	pn->op_type = ap_strdup(ap_op_name(n->op));
	pn->inputs = malloc(((size_t)n->n_inputs + 1) * sizeof(int32_t));
	pn->outputs = malloc(((size_t)n->n_outputs + 1) * sizeof(int32_t));
	pn->attrs = calloc((size_t)n->n_attrs + 1, sizeof(*pn->attrs));
	if (!pn->name || !pn->op_type || !pn->inputs || !pn->outputs || !pn->attrs) {
		free_node(pn);
		return NULL;
	}
	for (int i = 0; i < n->n_inputs; i++)
		pn->inputs[i] = n->inputs[i];
	pn->n_inputs = (size_t)n->n_inputs;
	for (int i = 0; i < n->n_outputs; i++)
		pn->outputs[i] = n->outputs[i];
	pn->n_outputs = (size_t)n->n_outputs;
	for (int a = 0; a < n->n_attrs; a++) {
		pn->attrs[a] = attr_to_pb(&n->attrs[a]);
		if (!pn->attrs[a]) {
			free_node(pn);
			return NULL;
		}
		pn->n_attrs = (size_t)a + 1;
	}
	return pn;
}

static Apollo__Tensor *tensor_to_pb(const ap_tensor *t)
{
	Apollo__Tensor *pt = malloc(sizeof(*pt));
	bool with_data = t->kind == AP_TENSOR_CONST && t->nbytes > 0 && t->data;

	if (!pt)
		return NULL;
	apollo__tensor__init(pt);
	pt->name = ap_strdup(t->name);
	pt->dims = dup_mem(t->dims, (size_t)t->rank * sizeof(int64_t));
	pt->data.data = with_data ? dup_mem(t->data, t->nbytes) : NULL;
	if (!pt->name || !pt->dims || (with_data && !pt->data.data)) {
		free_tensor(pt);
		return NULL;
	}
	pt->n_dims = (size_t)t->rank;
	pt->dtype = (Apollo__DataType)t->dtype;
	pt->kind = (Apollo__TensorKind)t->kind;
	pt->data.len = with_data ? t->nbytes : 0;
	return pt;
}

__ap_give struct Apollo__Graph *ap_graph_to_pb(__ap_keep const ap_graph *g)
{
	Apollo__Graph *pb = malloc(sizeof(*pb));

	if (!pb)
		return NULL;
	apollo__graph__init(pb);
	pb->name = ap_strdup(g->name);
	pb->tensors = calloc((size_t)g->n_tensors + 1, sizeof(*pb->tensors));
	pb->nodes = calloc((size_t)g->n_nodes + 1, sizeof(*pb->nodes));
	pb->inputs = malloc(((size_t)g->n_inputs + 1) * sizeof(int32_t));
	pb->outputs = malloc(((size_t)g->n_outputs + 1) * sizeof(int32_t));
	if (!pb->name || !pb->tensors || !pb->nodes || !pb->inputs || !pb->outputs)
		goto fail;
	for (int i = 0; i < g->n_tensors; i++) {
		pb->tensors[i] = tensor_to_pb(&g->tensors[i]);
		if (!pb->tensors[i])
			goto fail;
		pb->n_tensors = (size_t)i + 1;
	}
	for (int i = 0; i < g->n_nodes; i++) {
		pb->nodes[i] = node_to_pb(&g->nodes[i]);
		if (!pb->nodes[i])
			goto fail;
		pb->n_nodes = (size_t)i + 1;
	}
	for (int i = 0; i < g->n_inputs; i++)
		pb->inputs[i] = g->inputs[i];
	pb->n_inputs = (size_t)g->n_inputs;
	for (int i = 0; i < g->n_outputs; i++)
		pb->outputs[i] = g->outputs[i];
	pb->n_outputs = (size_t)g->n_outputs;
	pb->eager_kernels = g->eager_kernels;
	return pb;
fail:
	ap_graph_pb_free(pb);
	return NULL;
}
