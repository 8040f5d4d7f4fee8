/* graph.c -- building, copying and freeing graphs (see graph.h).
 *
 * A graph is two growable arrays (tensors, nodes) that refer to each other
 * by index.  Construction never validates: ap_graph_validate (validate.c)
 * checks the whole graph once it is complete.  Every allocation failure is
 * reported as AP_ENOMEM and leaves the graph as it was.
 */
#include "graph.h"

#include <stdlib.h>
#include <string.h>

/* Grows *arr (of *cap elements of `size` bytes) to hold at least `need`. */
static int grow(void **arr, int *cap, int need, size_t size)
{
	int ncap;
	void *p;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap * 2 : 16;
	while (ncap < need)
		ncap *= 2;
	p = realloc(*arr, (size_t)ncap * size);
	if (!p)
		return AP_ENOMEM;
	memset((char *)p + (size_t)*cap * size, 0, (size_t)(ncap - *cap) * size);
	*arr = p;
	*cap = ncap;
	return 0;
}

size_t ap_dtype_size(ap_dtype dt)
{
	switch (dt) {
	case AP_DT_F32: return 4;
	case AP_DT_U8: return 1;
	case AP_DT_I8: return 1;
	case AP_DT_I32: return 4;
	case AP_DT_I64: return 8;
	case AP_DT_BOOL: return 1;
	case AP_DT_F64: return 8;
	case AP_DT_F16: return 2;
	case AP_DT_BF16: return 2;
	default: return 0;
	}
}

const char *ap_dtype_name(ap_dtype dt)
{
	switch (dt) {
	case AP_DT_F32: return "float32";
	case AP_DT_U8: return "uint8";
	case AP_DT_I8: return "int8";
	case AP_DT_I32: return "int32";
	case AP_DT_I64: return "int64";
	case AP_DT_BOOL: return "bool";
	case AP_DT_F64: return "float64";
	case AP_DT_F16: return "float16";
	case AP_DT_BF16: return "bfloat16";
	default: return "undefined";
	}
}

bool ap_dtype_in_graphs(ap_dtype dt)
{
	return ap_dtype_size(dt) > 0;
}

double ap_dtype_lowest_finite(ap_dtype dt)
{
	switch (dt) {
	case AP_DT_F16: return -65504.0;
	case AP_DT_BF16: return -3.3895313892515355e38;
	case AP_DT_F32: return -3.4028234663852886e38;
	default: return -1.7976931348623157e308;
	}
}

bool ap_tensor_scalar(const ap_graph *g, int t, double *v)
{
	const ap_tensor *x = t >= 0 && t < g->n_tensors ? &g->tensors[t] : NULL;

	if (!x || x->kind != AP_TENSOR_CONST || !x->data || ap_tensor_numel(x) != 1 ||
	    x->nbytes < ap_dtype_size(x->dtype))
		return false;
	*v = ap_elem_get(x->data, x->dtype, 0);
	return true;
}

int64_t ap_tensor_numel(const ap_tensor *t)
{
	int64_t n = 1;

	for (int i = 0; i < t->rank; i++)
		if (t->dims[i] < 0)
			return -1;
	for (int i = 0; i < t->rank; i++)
		if (t->dims[i] == 0)
			return 0;
	for (int i = 0; i < t->rank; i++) {
		if (n > AP_MAX_ELEMENTS / t->dims[i])
			return -1;
		n *= t->dims[i];
	}
	return n;
}

bool ap_dims_equal(int rank_a, const int64_t *dims_a, int rank_b, const int64_t *dims_b)
{
	if (rank_a != rank_b)
		return false;
	for (int i = 0; i < rank_a; i++)
		if (dims_a[i] != dims_b[i])
			return false;
	return true;
}

__ap_give ap_graph *ap_graph_new(const char *name)
{
	ap_graph *g = calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	g->name = ap_strdup(name);
	if (!g->name)
		return ap_graph_free(g);
	return g;
}

static void attr_clear(ap_attr *a)
{
	free(a->name);
	free(a->s);
	free(a->ints);
	free(a->floats);
	memset(a, 0, sizeof(*a));
}

static void node_clear(ap_node *n)
{
	free(n->name);
	free(n->inputs);
	free(n->outputs);
	for (int i = 0; i < n->n_attrs; i++)
		attr_clear(&n->attrs[i]);
	free(n->attrs);
	memset(n, 0, sizeof(*n));
}

ap_graph *ap_graph_free(__ap_take ap_graph *g)
{
	if (!g)
		return NULL;
	for (int i = 0; i < g->n_tensors; i++) {
		free(g->tensors[i].name);
		free(g->tensors[i].data);
	}
	for (int i = 0; i < g->n_nodes; i++)
		node_clear(&g->nodes[i]);
	free(g->tensors);
	free(g->nodes);
	free(g->inputs);
	free(g->outputs);
	free(g->name);
	free(g);
	return NULL;
}

static int *dup_ints(const int *v, int n)
{
	int *d = malloc(n > 0 ? (size_t)n * sizeof(int) : 1);

	if (d && n > 0)
		memcpy(d, v, (size_t)n * sizeof(int));
	return d;
}

static int attr_copy(ap_attr *dst, const ap_attr *src)
{
	*dst = *src;
	dst->name = ap_strdup(src->name);
	dst->s = src->s ? ap_strdup(src->s) : NULL;
	dst->ints = NULL;
	dst->floats = NULL;
	if (src->n_ints > 0) {
		dst->ints = malloc((size_t)src->n_ints * sizeof(int64_t));
		if (dst->ints)
			memcpy(dst->ints, src->ints, (size_t)src->n_ints * sizeof(int64_t));
	}
	if (src->n_floats > 0) {
		dst->floats = malloc((size_t)src->n_floats * sizeof(double));
		if (dst->floats)
			memcpy(dst->floats, src->floats, (size_t)src->n_floats * sizeof(double));
	}
	if (!dst->name || (src->s && !dst->s) || (src->n_ints > 0 && !dst->ints) ||
	    (src->n_floats > 0 && !dst->floats)) {
		attr_clear(dst);
		return AP_ENOMEM;
	}
	return 0;
}

__ap_give ap_graph *ap_graph_copy(__ap_keep const ap_graph *g)
{
	ap_graph *c = ap_graph_new(g->name);

	if (!c)
		return NULL;
	for (int i = 0; i < g->n_tensors; i++) {
		const ap_tensor *t = &g->tensors[i];
		int idx = ap_graph_add_tensor(c, t->name, t->dtype, t->rank, t->dims, t->kind,
					      t->data, t->nbytes);
		if (idx < 0)
			return ap_graph_free(c);
		c->tensors[idx].is_output = t->is_output;
	}
	for (int i = 0; i < g->n_nodes; i++) {
		const ap_node *n = &g->nodes[i];
		int idx = ap_graph_add_node(c, n->name, n->op, n->n_inputs, n->inputs,
					    n->n_outputs, n->outputs);
		ap_node *cn;

		if (idx < 0)
			return ap_graph_free(c);
		cn = &c->nodes[idx];
		if (n->n_attrs > 0) {
			cn->attrs = calloc((size_t)n->n_attrs, sizeof(ap_attr));
			if (!cn->attrs)
				return ap_graph_free(c);
			for (int a = 0; a < n->n_attrs; a++) {
				if (attr_copy(&cn->attrs[a], &n->attrs[a]) < 0)
					return ap_graph_free(c);
				cn->n_attrs = a + 1;
			}
		}
	}
	/* producers as in the original, even where it is not yet valid */
	for (int i = 0; i < g->n_tensors; i++)
		c->tensors[i].producer = g->tensors[i].producer;
	c->inputs = dup_ints(g->inputs, g->n_inputs);
	c->outputs = dup_ints(g->outputs, g->n_outputs);
	if (!c->inputs || !c->outputs)
		return ap_graph_free(c);
	c->n_inputs = g->n_inputs;
	c->n_outputs = g->n_outputs;
	c->eager_kernels = g->eager_kernels;
	return c;
}

int ap_graph_add_tensor(ap_graph *g, const char *name, ap_dtype dt, int rank,
			const int64_t *dims, ap_tensor_kind kind,
			const void *data, size_t nbytes)
{
	ap_tensor *t;

	if (rank < 0 || rank > AP_MAX_RANK)
		return AP_EUNSUPPORTED;
	if (grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof(ap_tensor)))
		return AP_ENOMEM;
	t = &g->tensors[g->n_tensors];
	memset(t, 0, sizeof(*t));
	t->name = ap_strdup(name);
	if (!t->name)
		return AP_ENOMEM;
	if (data && nbytes > 0) {
		t->data = malloc(nbytes);
		if (!t->data) {
			free(t->name);
			t->name = NULL;
			return AP_ENOMEM;
		}
		memcpy(t->data, data, nbytes);
		t->nbytes = nbytes;
	}
	t->dtype = dt;
	t->rank = rank;
	for (int i = 0; i < rank; i++)
		t->dims[i] = dims[i];
	t->kind = kind;
	t->producer = -1;
	return g->n_tensors++;
}

int ap_graph_add_node(ap_graph *g, const char *name, ap_op op,
		      int n_inputs, const int *inputs,
		      int n_outputs, const int *outputs)
{
	ap_node *n;

	if (n_inputs < 0 || n_outputs < 0)
		return AP_EINVAL;
	if (grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(ap_node)))
		return AP_ENOMEM;
	n = &g->nodes[g->n_nodes];
	memset(n, 0, sizeof(*n));
	n->name = ap_strdup(name);
	n->inputs = dup_ints(inputs, n_inputs);
	n->outputs = dup_ints(outputs, n_outputs);
	if (!n->name || !n->inputs || !n->outputs) {
		node_clear(n);
		return AP_ENOMEM;
	}
	n->op = op;
	n->n_inputs = n_inputs;
	n->n_outputs = n_outputs;
	for (int i = 0; i < n_outputs; i++)
		if (outputs[i] >= 0 && outputs[i] < g->n_tensors)
			g->tensors[outputs[i]].producer = g->n_nodes;
	return g->n_nodes++;
}

/* Returns the attribute slot named `attr` of node n, replacing an existing
 * one (cleared) or appending a new one; NULL on ENOMEM or a bad index. */
static ap_attr *attr_slot(ap_graph *g, int n, const char *attr)
{
	ap_node *node;
	ap_attr *a, *p;
	char *name;

	if (n < 0 || n >= g->n_nodes)
		return NULL;
	node = &g->nodes[n];
	for (int i = 0; i < node->n_attrs; i++) {
		a = &node->attrs[i];
		if (strcmp(a->name, attr) == 0) {
			name = a->name;
			a->name = NULL;
			attr_clear(a);
			a->name = name;
			return a;
		}
	}
	name = ap_strdup(attr);
	if (!name)
		return NULL;
	p = realloc(node->attrs, (size_t)(node->n_attrs + 1) * sizeof(ap_attr));
	if (!p) {
		free(name);
		return NULL;
	}
	node->attrs = p;
	a = &node->attrs[node->n_attrs++];
	memset(a, 0, sizeof(*a));
	a->name = name;
	return a;
}

int ap_node_set_int(ap_graph *g, int n, const char *attr, int64_t v)
{
	ap_attr *a = attr_slot(g, n, attr);

	if (!a)
		return AP_ENOMEM;
	a->type = AP_ATTR_INT;
	a->i = v;
	return 0;
}

int ap_node_set_float(ap_graph *g, int n, const char *attr, double v)
{
	ap_attr *a = attr_slot(g, n, attr);

	if (!a)
		return AP_ENOMEM;
	a->type = AP_ATTR_FLOAT;
	a->f = v;
	return 0;
}

int ap_node_set_string(ap_graph *g, int n, const char *attr, const char *v)
{
	ap_attr *a = attr_slot(g, n, attr);

	if (!a)
		return AP_ENOMEM;
	a->type = AP_ATTR_STRING;
	a->s = ap_strdup(v);
	return a->s ? 0 : AP_ENOMEM;
}

int ap_node_set_ints(ap_graph *g, int n, const char *attr, const int64_t *v, int count)
{
	ap_attr *a = attr_slot(g, n, attr);

	if (!a || count < 0)
		return AP_ENOMEM;
	a->type = AP_ATTR_INTS;
	a->ints = malloc(count > 0 ? (size_t)count * sizeof(int64_t) : 1);
	if (!a->ints)
		return AP_ENOMEM;
	if (count > 0)
		memcpy(a->ints, v, (size_t)count * sizeof(int64_t));
	a->n_ints = count;
	return 0;
}

int ap_node_set_floats(ap_graph *g, int n, const char *attr, const double *v, int count)
{
	ap_attr *a = attr_slot(g, n, attr);

	if (!a || count < 0)
		return AP_ENOMEM;
	a->type = AP_ATTR_FLOATS;
	a->floats = malloc(count > 0 ? (size_t)count * sizeof(double) : 1);
	if (!a->floats)
		return AP_ENOMEM;
	if (count > 0)
		memcpy(a->floats, v, (size_t)count * sizeof(double));
	a->n_floats = count;
	return 0;
}

const ap_attr *ap_node_attr(const ap_node *node, const char *attr)
{
	for (int i = 0; i < node->n_attrs; i++)
		if (strcmp(node->attrs[i].name, attr) == 0)
			return &node->attrs[i];
	return NULL;
}

int64_t ap_node_attr_at(const ap_node *node, const char *attr, int i, int64_t dflt)
{
	const ap_attr *a = ap_node_attr(node, attr);

	if (!a || a->type != AP_ATTR_INTS || i < 0 || i >= a->n_ints)
		return dflt;
	return a->ints[i];
}

int64_t ap_node_int(const ap_node *node, const char *attr, int64_t dflt)
{
	const ap_attr *a = ap_node_attr(node, attr);

	if (!a)
		return dflt;
	if (a->type == AP_ATTR_INT)
		return a->i;
	if (a->type == AP_ATTR_FLOAT)
		return ap_f64_to_i64(a->f);
	return dflt;
}

double ap_node_float(const ap_node *node, const char *attr, double dflt)
{
	const ap_attr *a = ap_node_attr(node, attr);

	if (!a)
		return dflt;
	if (a->type == AP_ATTR_FLOAT)
		return a->f;
	if (a->type == AP_ATTR_INT)
		return (double)a->i;
	return dflt;
}

const char *ap_node_string(const ap_node *node, const char *attr, const char *dflt)
{
	const ap_attr *a = ap_node_attr(node, attr);

	return a && a->type == AP_ATTR_STRING && a->s ? a->s : dflt;
}

int ap_graph_find_tensor(const ap_graph *g, const char *name)
{
	for (int i = 0; i < g->n_tensors; i++)
		if (g->tensors[i].name && strcmp(g->tensors[i].name, name) == 0)
			return i;
	return -1;
}

/* Appends t to *list (*n entries). */
static int list_add(int **list, int *n, int t)
{
	int *p = realloc(*list, (size_t)(*n + 1) * sizeof(int));

	if (!p)
		return AP_ENOMEM;
	p[(*n)++] = t;
	*list = p;
	return 0;
}

int ap_graph_add_input(ap_graph *g, int t)
{
	if (t < 0 || t >= g->n_tensors)
		return AP_EINVAL;
	return list_add(&g->inputs, &g->n_inputs, t);
}

int ap_graph_add_output(ap_graph *g, int t)
{
	if (t < 0 || t >= g->n_tensors)
		return AP_EINVAL;
	if (list_add(&g->outputs, &g->n_outputs, t) < 0)
		return AP_ENOMEM;
	g->tensors[t].is_output = true;
	return 0;
}
