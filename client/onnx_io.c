/* onnx_io.c -- the graph inputs and outputs of an ONNX model.
 *
 * Backend-test data names its files input_K.pb by position among the graph
 * inputs that are not initializers (old IR 3 models list their initializers
 * among the inputs); the .pb's own name may be empty or different.  The
 * command needs that list to rename bindings to the real input names and to
 * say which input of a model has symbolic dims.  Only the model's structure
 * is decoded (ap_onnx_skeleton: the weights' bytes are skipped, never
 * read), with the same protobuf-c decoder (proto/onnx.proto) the importer
 * uses.
 */
#include "tool.h"

#include <stdlib.h>
#include <string.h>

#include "proto/onnx.pb-c.h"

/* Apollo's dtype for an ONNX elem_type (the numbers are the same); UNDEF
 * for one Apollo does not know. */
static ap_dtype onnx_dtype(int32_t t)
{
	switch (t) {
	case AP_DT_F32: case AP_DT_U8: case AP_DT_I8: case AP_DT_I32:
	case AP_DT_I64: case AP_DT_BOOL: case AP_DT_F64: case AP_DT_F16: case AP_DT_BF16:
		return (ap_dtype)t;
	default:
		return AP_DT_UNDEF;
	}
}

/* The name of the first symbolic dim of `vi` (malloc'd; "?" when the dim
 * or the whole shape is unnamed / unknown), or NULL for a static shape or
 * a value that is not a tensor.  Sets *dt.  *oom on allocation failure. */
static char *first_symbolic(const Onnx__ValueInfoProto *vi, ap_dtype *dt, bool *oom)
{
	const Onnx__TypeProto__Tensor *tt;
	const char *name = NULL;
	char *sym;

	*dt = AP_DT_UNDEF;
	if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
		return NULL;
	tt = vi->type->tensor_type;
	if (tt->has_elem_type)
		*dt = onnx_dtype(tt->elem_type);
	if (!tt->shape) {
		name = "?";
	} else {
		for (size_t j = 0; j < tt->shape->n_dim && !name; j++) {
			const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[j];
			if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
				continue;
			name = d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
			       d->dim_param && *d->dim_param ? d->dim_param : "?";
		}
		if (!name)
			return NULL;        /* every dim static */
	}
	sym = ap_strdup(name);
	if (!sym)
		*oom = true;
	return sym;
}

/* The declared shape of `vi` into *sh (its symbols' names copied).
 * False on ENOMEM. */
static bool declared_shape(const Onnx__ValueInfoProto *vi, ap_onnx_shape *sh)
{
	const Onnx__TensorShapeProto *shape;

	sh->rank = -1;
	if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
	    !(shape = vi->type->tensor_type->shape) || shape->n_dim > AP_MAX_RANK)
		return true;
	sh->rank = (int)shape->n_dim;
	for (int j = 0; j < sh->rank; j++) {
		const Onnx__TensorShapeProto__Dimension *d = shape->dim[j];

		sh->dims[j] = -1;
		if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
		    d->dim_value >= 0)
			sh->dims[j] = d->dim_value;
		else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
			 d->dim_param && *d->dim_param && !(sh->sym[j] = ap_strdup(d->dim_param)))
			return false;
	}
	return true;
}

/* The dims the model states for tensor `name` of g (an initializer, a graph
 * input or a value_info with every dimension fixed): its rank, or -1. */
static int stated_dims(const Onnx__GraphProto *g, const char *name, int64_t *dims)
{
	for (size_t i = 0; i < g->n_initializer; i++) {
		const Onnx__TensorProto *t = g->initializer[i];

		if (t->name && !strcmp(t->name, name) && t->n_dims <= AP_MAX_RANK) {
			memcpy(dims, t->dims, t->n_dims * sizeof(int64_t));
			return (int)t->n_dims;
		}
	}
	for (int list = 0; list < 2; list++) {
		Onnx__ValueInfoProto **v = list ? g->value_info : g->input;
		size_t n = list ? g->n_value_info : g->n_input;

		for (size_t i = 0; i < n; i++) {
			ap_onnx_shape sh = { 0 };
			bool fixed;

			if (!v[i]->name || strcmp(v[i]->name, name))
				continue;
			if (!declared_shape(v[i], &sh))
				sh.rank = -1;
			fixed = sh.rank >= 0;
			for (int d = 0; d < sh.rank; d++) {
				fixed = fixed && sh.dims[d] >= 0;
				free(sh.sym[d]);
			}
			if (fixed)
				memcpy(dims, sh.dims, (size_t)sh.rank * sizeof(int64_t));
			return fixed ? sh.rank : -1;
		}
	}
	return -1;
}

/* The valid index range of integer input `name`: the smallest stated
 * dimension along the axis of a Gather (of the main graph) that takes it
 * as indices; 0 when none is known. */
static int64_t index_bound(const Onnx__GraphProto *g, const char *name)
{
	int64_t bound = 0, dims[AP_MAX_RANK];

	for (size_t i = 0; i < g->n_node; i++) {
		const Onnx__NodeProto *n = g->node[i];
		int64_t axis = 0;
		int rank;

		if (!n->op_type || strcmp(n->op_type, "Gather") || n->n_input < 2 ||
		    !n->input[1] || strcmp(n->input[1], name) || !n->input[0])
			continue;
		for (size_t a = 0; a < n->n_attribute; a++)
			if (n->attribute[a]->name && !strcmp(n->attribute[a]->name, "axis"))
				axis = n->attribute[a]->i;
		rank = stated_dims(g, n->input[0], dims);
		if (axis < 0)
			axis += rank;
		if (rank > 0 && axis >= 0 && axis < rank && dims[axis] > 0 &&
		    (bound == 0 || dims[axis] < bound))
			bound = dims[axis];
	}
	return bound;
}

ap_onnx_io *ap_onnx_io_free(ap_onnx_io *io)
{
	if (!io)
		return NULL;
	for (int i = 0; i < io->n_inputs; i++) {
		free(io->inputs[i]);
		free(io->input_symbolic[i]);
		for (int d = 0; d < AP_MAX_RANK; d++)
			free(io->input_shape[i].sym[d]);
	}
	free(io->input_shape);
	for (int i = 0; i < io->n_outputs; i++)
		free(io->outputs[i]);
	free(io->inputs);
	free(io->input_dtype);
	free(io->input_symbolic);
	free(io->outputs);
	free(io);
	return NULL;
}

int ap_onnx_io_input(const ap_onnx_io *io, const char *name)
{
	for (int i = 0; i < io->n_inputs; i++)
		if (!strcmp(io->inputs[i], name))
			return i;
	return -1;
}

static bool is_initializer(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_initializer; i++)
		if (g->initializer[i]->name && !strcmp(g->initializer[i]->name, name))
			return true;
	return false;
}

int ap_onnx_io_read(const uint8_t *buf, size_t len, ap_onnx_io **out, ap_error *err)
{
	Onnx__ModelProto *m;
	const Onnx__GraphProto *g;
	ap_onnx_io *io;
	uint8_t *sk = NULL;
	size_t sl = 0;
	bool oom = false;
	int rc;

	*out = NULL;
	/* the structure is enough: the weights' bytes are never read */
	rc = ap_onnx_skeleton(buf, len, &sk, &sl, err);
	if (rc < 0)
		return rc;
	m = onnx__model_proto__unpack(NULL, sl, sk);
	free(sk);
	if (!m || !m->graph) {
		if (m)
			onnx__model_proto__free_unpacked(m, NULL);
		return ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				    "%zu bytes are not an ONNX ModelProto (%s)", len,
				    m ? "no graph" : "malformed protobuf");
	}
	g = m->graph;
	io = calloc(1, sizeof(*io));
	if (!io)
		goto nomem;
	io->inputs = calloc(g->n_input + 1, sizeof(char *));
	io->input_symbolic = calloc(g->n_input + 1, sizeof(char *));
	io->input_dtype = calloc(g->n_input + 1, sizeof(ap_dtype));
	io->input_shape = calloc(g->n_input + 1, sizeof(ap_onnx_shape));
	io->outputs = calloc(g->n_output + 1, sizeof(char *));
	if (!io->inputs || !io->input_symbolic || !io->input_dtype || !io->input_shape ||
	    !io->outputs)
		goto nomem;
	for (size_t i = 0; i < g->n_input; i++) {
		const Onnx__ValueInfoProto *vi = g->input[i];
		const char *name = vi->name ? vi->name : "";
		int k = io->n_inputs;

		if (is_initializer(g, name))
			continue;
		io->inputs[k] = ap_strdup(name);
		io->input_symbolic[k] = first_symbolic(vi, &io->input_dtype[k], &oom);
		io->n_inputs++;
		if (!io->inputs[k] || oom || !declared_shape(vi, &io->input_shape[k]))
			goto nomem;
		io->input_shape[k].index_bound = index_bound(g, name);
	}
	for (size_t i = 0; i < g->n_output; i++) {
		io->outputs[i] = ap_strdup(g->output[i]->name);
		io->n_outputs++;
		if (!io->outputs[i])
			goto nomem;
	}
	onnx__model_proto__free_unpacked(m, NULL);
	*out = io;
	return 0;
nomem:
	onnx__model_proto__free_unpacked(m, NULL);
	ap_onnx_io_free(io);
	return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
}
