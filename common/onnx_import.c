/* onnx_import.c -- ap_onnx_import: an ONNX ModelProto (IR 3-13, default
 * domain opsets 1-25) into a validated Apollo graph of normalised nodes.
 *
 * The importer walks the ONNX nodes once, in file order (the IR requires
 * topological order), and keeps for every ONNX value name what it knows of
 * it (an `ival`): dtype and static shape always; the data when it is a
 * compile-time constant (initializer, Constant node, integer graph input
 * given with data, or a folded result); or "a large constant fill" for a
 * ConstantOfShape too big to spell out.  Nothing enters the graph until a
 * node that is kept needs it ("materialise"): a known value then becomes a
 * CONST tensor (at most AP_CONST_MAX_BYTES) or a PARAM whose data goes to
 * the parameter store; a fill becomes an Expand of a scalar CONST.
 *
 * Each ONNX node is lowered, for its opset, into zero or more normalised
 * nodes (ops.def): attributes and constant inputs resolved to the
 * normalised attributes, auto_pad/output_shape to explicit pads, legacy
 * broadcast=1 into a Reshape of the second operand, variadic Sum/Max/Min/
 * Mean into chains, Flatten/Squeeze/Unsqueeze into Reshape, Global*Pool
 * into reductions.  Every normalised node goes through emit(): its output
 * shapes come from ap__op_infer (ops.c), and when all its inputs are known
 * constants (any op: the reference evaluator, onnx_fold.c, implements them
 * all) and its outputs and the work are bounded (FOLD_MAX_BYTES,
 * FOLD_MAX_WORK) it is evaluated on the spot instead of being added, so
 * subgraphs that compute masks and tables from constants disappear.
 * Weights are not constants here: floating-point data too large to travel
 * by value (AP_CONST_MAX_BYTES), an initializer's or a Constant's, is a
 * PARAM that the client binds at launch (a training job's weights change
 * every step), so nothing that reads one is folded, and a model whose
 * integer inputs are given still compiles its data path instead of
 * collapsing into the evaluator.  This also makes the structure-only
 * import (no parameter store: ap_onnx_skeleton drops exactly those bytes)
 * fold what the full import folds, so both give one graph.  Shape,
 * Size, ConstantOfShape and Range are answered from static shapes and
 * constants directly, and an If whose condition is known is replaced by
 * the nodes of the branch it takes.
 *
 * At the end every graph output is made a VALUE tensor produced by a node
 * (an Identity is added when it is an input, a constant or listed twice),
 * eager_kernels is set, and ap_graph_validate checks the result.
 *
 * Errors name the ONNX node they concern (err->node) and say what was
 * wrong; no state outlives a call, so concurrent imports are independent.
 *
 * This file holds the entry point, the graph's inputs, initializers and
 * outputs, the walk over the nodes and the dispatch from an ONNX op name to
 * its importer; onnx_import_internal.h lists the other files (emit() is
 * ap__onnx_emit in onnx_import_emit.c; the op families each have theirs).
 */
#include "onnx_import_internal.h"
#include "pb_budget.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A model may take this many times its size once decoded, plus 16 MiB:
 * weights decode at 1x, structure at 2-18x (the backend-test models);
 * crafted bytes would take much more (issue 11, item 6). */
#define MODEL_DECODE_RATIO 16
#define MODEL_DECODE_FLOOR ((size_t)16 << 20)

static const struct { const char *onnx; ap_op op; } unary_ops[] = {
	{ "Neg", AP_OP_NEG }, { "Abs", AP_OP_ABS }, { "Exp", AP_OP_EXP }, { "Log", AP_OP_LOG },
	{ "Sqrt", AP_OP_SQRT }, { "Reciprocal", AP_OP_RECIPROCAL }, { "Tanh", AP_OP_TANH },
	{ "Sigmoid", AP_OP_SIGMOID }, { "Relu", AP_OP_RELU }, { "Erf", AP_OP_ERF },
	{ "Sign", AP_OP_SIGN }, { "Floor", AP_OP_FLOOR }, { "Ceil", AP_OP_CEIL },
	{ "Not", AP_OP_NOT }, { "Softsign", AP_OP_SOFTSIGN }, { "HardSwish", AP_OP_HARD_SWISH },
	{ "Mish", AP_OP_MISH }, { "Softplus", AP_OP_SOFTPLUS }, { "Sin", AP_OP_SIN },
	{ "Cos", AP_OP_COS }, { "IsNaN", AP_OP_IS_NAN },
};

static const struct { const char *onnx; ap_op op; } binary_ops[] = {
	{ "Add", AP_OP_ADD }, { "Sub", AP_OP_SUB }, { "Mul", AP_OP_MUL }, { "Div", AP_OP_DIV },
	{ "Pow", AP_OP_POW }, { "Mod", AP_OP_MOD }, { "PRelu", AP_OP_PRELU },
	{ "Equal", AP_OP_EQUAL }, { "Less", AP_OP_LESS }, { "Greater", AP_OP_GREATER },
	{ "LessOrEqual", AP_OP_LESS_OR_EQUAL }, { "GreaterOrEqual", AP_OP_GREATER_OR_EQUAL },
	{ "And", AP_OP_AND }, { "Or", AP_OP_OR }, { "Xor", AP_OP_XOR },
};

static const struct { const char *onnx; ap_op op; } reduce_ops[] = {
	{ "ReduceSum", AP_OP_REDUCE_SUM }, { "ReduceMean", AP_OP_REDUCE_MEAN },
	{ "ReduceMax", AP_OP_REDUCE_MAX }, { "ReduceMin", AP_OP_REDUCE_MIN },
	{ "ReduceProd", AP_OP_REDUCE_PROD }, { "ReduceSumSquare", AP_OP_REDUCE_SUM_SQUARE },
	{ "ReduceL1", AP_OP_REDUCE_L1 }, { "ReduceL2", AP_OP_REDUCE_L2 },
	{ "ReduceLogSum", AP_OP_REDUCE_LOG_SUM }, { "ReduceLogSumExp", AP_OP_REDUCE_LOG_SUM_EXP },
};

static int import_nodes(imp *im, const Onnx__GraphProto *g);

static int imp_if(imp *im, const Onnx__NodeProto *n)
{
	ival *c;
	double cond;
	const Onnx__AttributeProto *br;
	const Onnx__GraphProto *sub;
	const char *outer = im->node;
	int rc;

	TRY(ap__onnx_get_in(im, n, 0, true, &c));
	if (!known(c))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, c->name,
				     "If: the condition '%s' is not a compile-time constant; only "
				     "an If with a constant condition is supported (it is inlined)",
				     c->name);
	TRY(ap__onnx_get_scalar(im, c, "If condition", &cond));
	br = ap__onnx_attr(n, cond != 0 ? "then_branch" : "else_branch");
	if (!br || !br->g)
		return ap__onnx_fail(im, AP_EINVAL, NULL, "If: branch missing");
	sub = br->g;
	if (sub->n_output != n->n_output)
		return ap__onnx_fail(im, AP_EINVAL, NULL,
				     "If: branch has %zu outputs, the node %zu", sub->n_output,
				     n->n_output);
	rc = import_nodes(im, sub);
	im->node = outer;
	if (rc < 0)
		return rc;
	for (size_t k = 0; k < sub->n_output; k++) {
		const char *bn = sub->output[k]->name ? sub->output[k]->name : "";
		ival *v = ap__onnx_lookup(im, bn);

		if (!v)
			return ap__onnx_fail(im, AP_EINVAL, bn,
					     "If: branch output '%s' is not defined", bn);
		TRY(ap__onnx_bind(im, out_name(n, k), v));
	}
	return 0;
}

/* ---- dispatch ------------------------------------------------------------------------ */

static bool is_view_op(const char *op)
{
	return !strcmp(op, "Reshape") || !strcmp(op, "Flatten") || !strcmp(op, "Squeeze") ||
	       !strcmp(op, "Unsqueeze") || !strcmp(op, "Identity") || !strcmp(op, "Dropout");
}

static int import_node(imp *im, const Onnx__NodeProto *n)
{
	const char *op = n->op_type ? n->op_type : "";
	size_t i;

	if (!op[0])
		return ap__onnx_fail(im, AP_EINVAL, NULL, "node without an op_type");
	if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx"))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
				     "op '%s' of domain '%s' is not supported", op, n->domain);
	for (i = 0; i < sizeof(unary_ops) / sizeof(unary_ops[0]); i++)
		if (!strcmp(op, unary_ops[i].onnx))
			return ap__onnx_imp_unary(im, n, unary_ops[i].op);
	for (i = 0; i < sizeof(binary_ops) / sizeof(binary_ops[0]); i++)
		if (!strcmp(op, binary_ops[i].onnx))
			return ap__onnx_imp_binary(im, n, binary_ops[i].op);
	for (i = 0; i < sizeof(reduce_ops) / sizeof(reduce_ops[0]); i++)
		if (!strcmp(op, reduce_ops[i].onnx))
			return ap__onnx_imp_reduce(im, n, reduce_ops[i].op);
	if (!strcmp(op, "LeakyRelu")) return ap__onnx_imp_unary(im, n, AP_OP_LEAKY_RELU);
	if (!strcmp(op, "Elu")) return ap__onnx_imp_unary(im, n, AP_OP_ELU);
	if (!strcmp(op, "Selu")) return ap__onnx_imp_unary(im, n, AP_OP_SELU);
	if (!strcmp(op, "HardSigmoid")) return ap__onnx_imp_unary(im, n, AP_OP_HARD_SIGMOID);
	if (!strcmp(op, "Gelu")) return ap__onnx_imp_unary(im, n, AP_OP_GELU);
	if (!strcmp(op, "Cast")) return ap__onnx_imp_cast(im, n, false);
	if (!strcmp(op, "CastLike")) return ap__onnx_imp_cast(im, n, true);
	if (!strcmp(op, "Clip")) return ap__onnx_imp_clip(im, n);
	if (!strcmp(op, "Sum")) return ap__onnx_imp_variadic(im, n, AP_OP_ADD, false);
	if (!strcmp(op, "Mean")) return ap__onnx_imp_variadic(im, n, AP_OP_ADD, true);
	if (!strcmp(op, "Max")) return ap__onnx_imp_variadic(im, n, AP_OP_MAX, false);
	if (!strcmp(op, "Min")) return ap__onnx_imp_variadic(im, n, AP_OP_MIN, false);
	if (!strcmp(op, "Where")) return ap__onnx_imp_where(im, n);
	if (!strcmp(op, "Softmax")) return ap__onnx_imp_softmax(im, n, AP_OP_SOFTMAX);
	if (!strcmp(op, "LogSoftmax")) return ap__onnx_imp_softmax(im, n, AP_OP_LOG_SOFTMAX);
	if (!strcmp(op, "LayerNormalization")) return ap__onnx_imp_layer_norm(im, n);
	if (!strcmp(op, "Attention")) return ap__onnx_imp_attention(im, n);
	if (!strcmp(op, "BatchNormalization")) return ap__onnx_imp_batch_norm(im, n);
	if (!strcmp(op, "InstanceNormalization")) return ap__onnx_imp_instance_norm(im, n);
	if (!strcmp(op, "LRN")) return ap__onnx_imp_lrn(im, n);
	if (!strcmp(op, "MatMul")) return ap__onnx_imp_matmul(im, n);
	if (!strcmp(op, "Gemm")) return ap__onnx_imp_gemm(im, n);
	if (!strcmp(op, "Conv")) return ap__onnx_imp_conv(im, n, false);
	if (!strcmp(op, "ConvTranspose")) return ap__onnx_imp_conv(im, n, true);
	if (!strcmp(op, "MaxPool")) return ap__onnx_imp_pool(im, n, AP_OP_MAX_POOL);
	if (!strcmp(op, "AveragePool")) return ap__onnx_imp_pool(im, n, AP_OP_AVERAGE_POOL);
	if (!strcmp(op, "GlobalAveragePool"))
		return ap__onnx_imp_global_pool(im, n, AP_OP_REDUCE_MEAN);
	if (!strcmp(op, "GlobalMaxPool")) return ap__onnx_imp_global_pool(im, n, AP_OP_REDUCE_MAX);
	if (!strcmp(op, "Reshape")) return ap__onnx_imp_reshape(im, n);
	if (!strcmp(op, "Flatten")) return ap__onnx_imp_flatten(im, n);
	if (!strcmp(op, "Squeeze")) return ap__onnx_imp_squeeze(im, n, false);
	if (!strcmp(op, "Unsqueeze")) return ap__onnx_imp_squeeze(im, n, true);
	if (!strcmp(op, "Transpose")) return ap__onnx_imp_transpose(im, n);
	if (!strcmp(op, "Expand")) return ap__onnx_imp_expand(im, n);
	if (!strcmp(op, "Tile")) return ap__onnx_imp_tile(im, n);
	if (!strcmp(op, "Slice")) return ap__onnx_imp_slice(im, n);
	if (!strcmp(op, "Concat")) return ap__onnx_imp_concat(im, n);
	if (!strcmp(op, "Split")) return ap__onnx_imp_split(im, n);
	if (!strcmp(op, "Gather")) return ap__onnx_imp_gather(im, n);
	if (!strcmp(op, "Pad")) return ap__onnx_imp_pad(im, n);
	if (!strcmp(op, "Identity")) {
		ival *x;

		TRY(ap__onnx_get_in(im, n, 0, true, &x));
		return ap__onnx_bind(im, out_name(n, 0), x);
	}
	if (!strcmp(op, "Dropout")) return ap__onnx_imp_dropout(im, n);
	if (!strcmp(op, "Constant")) return ap__onnx_imp_constant(im, n);
	if (!strcmp(op, "ConstantOfShape")) return ap__onnx_imp_constant_of_shape(im, n);
	if (!strcmp(op, "Shape")) return ap__onnx_imp_shape(im, n, false);
	if (!strcmp(op, "Size")) return ap__onnx_imp_shape(im, n, true);
	if (!strcmp(op, "Range")) return ap__onnx_imp_range(im, n);
	if (!strcmp(op, "If")) return imp_if(im, n);
	if (!strcmp(op, "IsInf")) return ap__onnx_imp_is_inf(im, n);
	if (!strcmp(op, "Shrink")) return ap__onnx_imp_shrink(im, n);
	if (!strcmp(op, "GatherElements"))
		return ap__onnx_imp_elements(im, n, AP_OP_GATHER_ELEMENTS);
	if (!strcmp(op, "ScatterElements") || !strcmp(op, "Scatter"))
		return ap__onnx_imp_elements(im, n, AP_OP_SCATTER_ELEMENTS);
	if (!strcmp(op, "ScatterND")) return ap__onnx_imp_elements(im, n, AP_OP_SCATTER_ND);
	if (!strcmp(op, "Trilu")) return ap__onnx_imp_trilu(im, n);
	if (!strcmp(op, "CumSum")) return ap__onnx_imp_cumsum(im, n);
	if (!strcmp(op, "ArgMax")) return ap__onnx_imp_argext(im, n, AP_OP_ARG_MAX);
	if (!strcmp(op, "ArgMin")) return ap__onnx_imp_argext(im, n, AP_OP_ARG_MIN);
	if (!strcmp(op, "DepthToSpace")) return ap__onnx_imp_depth_space(im, n, true);
	if (!strcmp(op, "SpaceToDepth")) return ap__onnx_imp_depth_space(im, n, false);
	if (!strcmp(op, "Einsum")) return ap__onnx_imp_einsum(im, n);
	if (!strcmp(op, "Resize")) return ap__onnx_imp_resize(im, n, false);
	if (!strcmp(op, "Upsample")) return ap__onnx_imp_resize(im, n, true);
	return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "op '%s' is not supported", op);
}

/* Registers a graph's initializers, undecoded (ival.lazy): a weight when
 * floating-point and larger than AP_CONST_MAX_BYTES; one of rank > 8 is
 * poisoned (an error only when used).  AP_ETOOLARGE for a negative or too
 * large dimension, AP_ENOMEM. */
static int import_initializers(imp *im, const Onnx__GraphProto *g)
{
	for (size_t i = 0; i < g->n_initializer; i++) {
		const Onnx__TensorProto *tp = g->initializer[i];
		const char *name = tp->name ? tp->name : "";
		ival *v;

		if (!name[0])
			continue;
		v = ap__onnx_new_val(im, name);
		if (!v)
			return AP_ENOMEM;
		if (tp->n_dims > AP_MAX_RANK) {
			v->poison = "an initializer of rank > 8";
			snprintf(v->poison_node, sizeof(v->poison_node), "%s", name);
		} else {
			v->lazy = tp;
			v->sh.dtype = tp->has_data_type ? (ap_dtype)tp->data_type : AP_DT_UNDEF;
			v->sh.rank = (int)tp->n_dims;
			for (size_t d = 0; d < tp->n_dims; d++)
				v->sh.dims[d] = tp->dims[d];
			if (sh_numel(&v->sh) < 0) {
				im->node = NULL;
				return ap__onnx_fail(im, AP_ETOOLARGE, name,
						     "initializer '%s' has a negative or "
						     "too large dimension", name);
			}
			v->weight = float_dtype(v->sh.dtype) && sh_bytes(&v->sh) > AP_CONST_MAX_BYTES;
		}
		TRY(ap__onnx_bind(im, name, v));
	}
	return 0;
}

/* Registers a graph's initializers and imports its nodes in file order
 * (the main graph, or the branch an If takes), naming each node for
 * errors (its name, or "<op>_<counter>"); counts the nodes that add
 * kernels (im->eager). */
static int import_nodes(imp *im, const Onnx__GraphProto *g)
{
	char made[NAME_CAP];

	TRY(import_initializers(im, g));
	for (size_t i = 0; i < g->n_node; i++) {
		const Onnx__NodeProto *n = g->node[i];
		const char *op = n->op_type ? n->op_type : "";
		int before = im->n_emitted, rc;

		if (n->name && n->name[0]) {
			im->node = n->name;
		} else {
			snprintf(made, sizeof(made), "%s_%d", op[0] ? op : "node", im->n_made);
			im->node = made;
		}
		im->n_made++;
		rc = import_node(im, n);
		if (rc < 0)
			return rc;
		if (im->n_emitted > before && !is_view_op(op) && strcmp(op, "If") != 0)
			im->eager++;
	}
	return 0;
}

/* ---- graph inputs and outputs ----------------------------------------------------- */

static bool is_initializer(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_initializer; i++)
		if (g->initializer[i]->name && strcmp(g->initializer[i]->name, name) == 0)
			return true;
	return false;
}

static const ap_host_tensor *find_binding(const Onnx__GraphProto *g, const char *name, int pos,
					  const ap_host_tensor *const *b, int nb)
{
	for (int i = 0; i < nb; i++)
		if (b[i] && b[i]->name && strcmp(b[i]->name, name) == 0)
			return b[i];
	if (pos < nb && b[pos]) {
		/* by position, unless that binding names another input */
		for (size_t i = 0; i < g->n_input; i++)
			if (b[pos]->name && b[pos]->name[0] && g->input[i]->name &&
			    strcmp(g->input[i]->name, b[pos]->name) == 0)
				return NULL;
		return b[pos];
	}
	return NULL;
}

/* A binding that gives a shape alone (ap_shape_binding_parse): no dtype,
 * no bytes of data. */
static bool shape_binding(const ap_host_tensor *b)
{
	return b->dtype == AP_DT_UNDEF && b->nbytes == 0;
}

/* Every binding of a shape alone names a graph input that is not an
 * initializer.  0 or AP_EINVAL listing the inputs. */
static int check_shape_bindings(imp *im, const Onnx__GraphProto *g,
				const ap_host_tensor *const *b, int nb)
{
	char list[256];
	size_t used = 0;

	for (int i = 0; i < nb; i++) {
		bool found = false;

		if (!b[i] || !shape_binding(b[i]))
			continue;
		for (size_t k = 0; k < g->n_input && !found; k++)
			found = b[i]->name && g->input[k]->name &&
				!strcmp(g->input[k]->name, b[i]->name) &&
				!is_initializer(g, b[i]->name);
		if (found)
			continue;
		list[0] = 0;
		for (size_t k = 0; k < g->n_input && used < sizeof(list) - 1; k++) {
			const char *n = g->input[k]->name ? g->input[k]->name : "";
			int w;

			if (is_initializer(g, n))
				continue;
			w = snprintf(list + used, sizeof(list) - used, "%s'%s'", used ? ", " : "", n);
			if (w > 0)
				used += (size_t)w;
			if (used > sizeof(list) - 1)
				used = sizeof(list) - 1;   /* truncated */
		}
		im->node = NULL;
		return ap__onnx_fail(im, AP_EINVAL, b[i]->name, "a shape is given for '%s', which "
				     "is not an input of the model (its inputs: %s)",
				     b[i]->name ? b[i]->name : "", used ? list : "none");
	}
	return 0;
}

/* The declared shape of a graph input (tt->shape) into sh: a symbolic
 * dimension is -1 and needs a binding, whose shape must then match the
 * declared dimensions.  AP_EUNSUPPORTED for rank > 8, AP_EINVAL for a
 * symbolic dimension without a binding, AP_ESHAPE for a binding that does
 * not match. */
static int declared_shape(imp *im, const char *name, const Onnx__TypeProto__Tensor *tt,
			  const ap_host_tensor *bind_t, ap_shape *sh)
{
	if (tt->shape->n_dim > AP_MAX_RANK)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, name, "graph input '%s' has rank %zu",
				     name, tt->shape->n_dim);
	sh->rank = (int)tt->shape->n_dim;
	for (int d = 0; d < sh->rank; d++) {
		const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];

		if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
			sh->dims[d] = dim->dim_value;
		} else {
			sh->dims[d] = -1;
			if (!bind_t)
				return ap__onnx_fail(im, AP_EINVAL, name,
						     "graph input '%s' has symbolic dimension '%s' "
						     "(dim %d) and no binding gives its size", name,
						     dim->value_case ? dim->dim_param : "?", d);
		}
	}
	if (!bind_t)
		return 0;
	if (bind_t->rank != sh->rank)
		return ap__onnx_fail(im, AP_ESHAPE, name, "the binding of graph input '%s' "
				     "does not match its declared shape: the model gives it %d "
				     "dimensions, the binding %d", name, sh->rank, bind_t->rank);
	for (int d = 0; d < sh->rank; d++)
		if (sh->dims[d] >= 0 && sh->dims[d] != bind_t->dims[d])
			return ap__onnx_fail(im, AP_ESHAPE, name, "the binding of graph input "
					     "'%s' does not match its declared shape: dimension %d "
					     "is %lld in the model, %lld in the binding", name, d,
					     (long long)sh->dims[d], (long long)bind_t->dims[d]);
	return 0;
}

/* The dtype and shape of graph input `name` (type tt, NULL when not a
 * tensor; binding bind_t or NULL): the declared ones, the binding's where
 * it gives them.  AP_EUNSUPPORTED (not a tensor, rank > 8), AP_ESHAPE (a
 * binding of another dtype or shape), AP_EINVAL (no shape and no binding,
 * a symbolic dimension without a binding, a negative dimension). */
static int input_shape(imp *im, const char *name, const Onnx__TypeProto__Tensor *tt,
		       const ap_host_tensor *bind_t, ap_shape *sh)
{
	if (!tt)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, name, "graph input '%s' is not a tensor",
				     name);
	memset(sh, 0, sizeof(*sh));
	sh->dtype = tt->has_elem_type ? (ap_dtype)tt->elem_type : AP_DT_UNDEF;
	if (bind_t && shape_binding(bind_t) && sh->dtype == AP_DT_UNDEF)
		return ap__onnx_fail(im, AP_EINVAL, name, "graph input '%s' declares no dtype; "
				     "a binding of its shape alone cannot give one", name);
	if (bind_t && sh->dtype != AP_DT_UNDEF && !shape_binding(bind_t) &&
	    bind_t->dtype != sh->dtype)
		return ap__onnx_fail(im, AP_ESHAPE, name, "graph input '%s' is %s, its binding %s",
				     name, ap_dtype_name(sh->dtype), ap_dtype_name(bind_t->dtype));
	if (tt->shape)
		TRY(declared_shape(im, name, tt, bind_t, sh));
	else if (!bind_t)
		return ap__onnx_fail(im, AP_EINVAL, name,
				     "graph input '%s' has no shape and no binding", name);
	if (bind_t) {
		sh->rank = bind_t->rank;
		memcpy(sh->dims, bind_t->dims, sizeof(sh->dims));
		if (sh->dtype == AP_DT_UNDEF)
			sh->dtype = bind_t->dtype;
	}
	for (int d = 0; d < sh->rank; d++)
		if (sh->dims[d] < 0)
			return ap__onnx_fail(im, AP_EINVAL, name,
					     "graph input '%s' has dimension %lld", name,
					     (long long)sh->dims[d]);
	return 0;
}

/* What graph input v (its shape set; binding bind_t or NULL) is: a known
 * value when it is an integer input given with data (a compile-time
 * constant), else an INPUT tensor appended to the graph's inputs.
 * AP_EUNSUPPORTED for a dtype graphs do not have, AP_ENOMEM. */
static int input_value(imp *im, ival *v, const ap_host_tensor *bind_t)
{
	const ap_shape *sh = &v->sh;
	char tn[NAME_CAP];
	int t, *p;

	if (bind_t && (bind_t->data || bind_t->nbytes == 0) && int_dtype(sh->dtype) &&
	    bind_t->nbytes == (size_t)sh_numel(sh) * ap_dtype_size(sh->dtype)) {
		/* an integer input given with data: a compile-time constant */
		ap_host_tensor *c = ap__host_tensor_new(v->name, sh->dtype, sh->rank, sh->dims);

		if (!c)
			return ap__onnx_nomem(im);
		if (c->nbytes)
			memcpy(c->data, bind_t->data, c->nbytes);
		v->data = c;
		return 0;
	}
	if (!graph_dtype(sh->dtype))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, v->name, "graph input '%s' has dtype %s "
				     "(float32, float64, int32, int64, bool supported)", v->name,
				     ap_dtype_name(sh->dtype));
	if (ap__onnx_uniq(im, &im->tnames, v->name, tn) < 0)
		return AP_ENOMEM;
	t = ap_graph_add_tensor(im->g, tn, sh->dtype, sh->rank, sh->dims, AP_TENSOR_INPUT, NULL, 0);
	if (t < 0)
		return ap__onnx_nomem(im);
	p = realloc(im->g->inputs, (size_t)(im->g->n_inputs + 1) * sizeof(int));
	if (!p)
		return ap__onnx_nomem(im);
	im->g->inputs = p;
	im->g->inputs[im->g->n_inputs++] = t;
	v->tensor = t;
	return 0;
}

/* The graph inputs that are not initializers, each with its binding (by
 * name, else by position among them; b[0..nb), entries may be NULL).
 * Errors as input_shape and input_value. */
static int import_inputs(imp *im, const Onnx__GraphProto *g, const ap_host_tensor *const *b,
			 int nb)
{
	int pos = 0;

	TRY(check_shape_bindings(im, g, b, nb));
	for (size_t i = 0; i < g->n_input; i++) {
		const Onnx__ValueInfoProto *vi = g->input[i];
		const char *name = vi->name ? vi->name : "";
		const Onnx__TypeProto__Tensor *tt = vi->type && vi->type->value_case ==
			ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ? vi->type->tensor_type : NULL;
		const ap_host_tensor *bind_t;
		ap_shape sh;
		ival *v;

		if (is_initializer(g, name))
			continue;
		bind_t = find_binding(g, name, pos, b, nb);
		pos++;
		im->node = NULL;
		TRY(input_shape(im, name, tt, bind_t, &sh));
		v = ap__onnx_new_val(im, name);
		if (!v)
			return AP_ENOMEM;
		v->sh = sh;
		TRY(input_value(im, v, bind_t));
		TRY(ap__onnx_bind(im, name, v));
	}
	return 0;
}

/* A graph output that is an input, a constant or an output already: an
 * Identity of v named `name` (a node forced when the Identity folds).
 * The new tensor, or a negative AP_E*. */
static int copy_output(imp *im, ival *v, const char *name)
{
	ival *y;
	char nm[NAME_CAP];

	snprintf(nm, sizeof(nm), "%s_output", name);
	im->node = nm;
	if (ap__onnx_emit1(im, AP_OP_IDENTITY, NULL, 1, &v, name, NULL, &y) < 0)
		return im->err ? im->err->code : AP_EINVAL;
	im->node = NULL;
	if (y->tensor < 0) {
		/* Identity of a constant folded: force a node */
		int in = ap__onnx_materialise(im, v), out;

		if (in < 0)
			return in;
		if (ap__onnx_uniq(im, &im->tnames, name, nm) < 0)
			return AP_ENOMEM;
		out = ap_graph_add_tensor(im->g, nm, v->sh.dtype, v->sh.rank, v->sh.dims,
					  AP_TENSOR_VALUE, NULL, 0);
		if (out < 0)
			return ap__onnx_nomem(im);
		snprintf(nm, sizeof(nm), "%s_output", name);
		if (ap__onnx_emit_node(im, nm, AP_OP_IDENTITY, NULL, 0, 1, &in, 1, &out) < 0)
			return AP_ENOMEM;
		y->tensor = out;
	}
	return y->tensor;
}

/* Marks every graph output's tensor is_output and lists it in g->outputs:
 * a VALUE tensor produced by a node, named as the model names it when
 * that name is free (copy_output otherwise).  AP_EINVAL for an output no
 * node produces, AP_EUNSUPPORTED for a poisoned one, AP_ENOMEM. */
static int import_outputs(imp *im, const Onnx__GraphProto *g)
{
	im->node = NULL;
	for (size_t i = 0; i < g->n_output; i++) {
		const char *name = g->output[i]->name ? g->output[i]->name : "";
		ival *v = ap__onnx_lookup(im, name);
		int t;
		int *p;

		if (!v)
			return ap__onnx_fail(im, AP_EINVAL, name,
					     "graph output '%s' is not produced", name);
		if (v->poison)
			return ap__onnx_fail(im, AP_EUNSUPPORTED, name,
					     "graph output '%s' is %s of node '%s'", name,
					     v->poison, v->poison_node);
		t = v->tensor;
		if (t < 0 || im->g->tensors[t].kind != AP_TENSOR_VALUE || im->g->tensors[t].is_output) {
			/* an input, constant or repeated output: copy it */
			t = copy_output(im, v, name);
			if (t < 0)
				return t;
		} else if (strcmp(im->g->tensors[t].name, name) != 0 &&
			   !ap__onnx_ss_has(&im->tnames, name)) {
			/* name the output tensor as the model does */
			char *nn = ap_strdup(name);

			if (!nn || ap__onnx_ss_add(&im->tnames, name) < 0) {
				free(nn);
				return ap__onnx_nomem(im);
			}
			free(im->g->tensors[t].name);
			im->g->tensors[t].name = nn;
		}
		im->g->tensors[t].is_output = true;
		p = realloc(im->g->outputs, (size_t)(im->g->n_outputs + 1) * sizeof(int));
		if (!p)
			return ap__onnx_nomem(im);
		im->g->outputs = p;
		im->g->outputs[im->g->n_outputs++] = t;
	}
	return 0;
}

/* ---- the entry point ---------------------------------------------------------- */

/* Decodes buf[0..len) as an onnx.ModelProto within MODEL_DECODE_RATIO
 * times its size (plus MODEL_DECODE_FLOOR); when shape_only, only its
 * structure (ap_onnx_skeleton: the large weights' bytes dropped).  NULL
 * with err set: AP_ENOMEM, AP_ETOOLARGE (over the budget), AP_EMESSAGE
 * (not a ModelProto), or ap_onnx_skeleton's errors. */
static Onnx__ModelProto *decode_model(const uint8_t *buf, size_t len, bool shape_only,
				      ap_error *err)
{
	Onnx__ModelProto *m;
	ap_pb_budget budget;
	uint8_t *skeleton = NULL;

	if (shape_only) {   /* structure only: the weights' bytes are never read */
		size_t n = 0;

		if (ap_onnx_skeleton(buf, len, &skeleton, &n, err))
			return NULL;
		buf = skeleton;
		len = n;
	}
	ap_pb_budget_init(&budget, ap_pb_decode_limit(len, MODEL_DECODE_RATIO, MODEL_DECODE_FLOOR));
	m = onnx__model_proto__unpack(&budget.allocator, len, buf);
	free(skeleton);   /* protobuf-c copied what it kept */
	if (!m && budget.out_of_memory) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory decoding the ONNX model");
		return NULL;
	}
	if (!m && budget.exceeded) {
		ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
			     "a %zu-byte ONNX model would take more than %zu bytes to decode", len,
			     budget.limit);
		return NULL;
	}
	if (!m) {
		ap_error_set(err, AP_EMESSAGE, NULL, NULL,
			     "%zu bytes do not decode as an ONNX ModelProto", len);
		return NULL;
	}
	return m;
}

/* The default-domain ("" or "ai.onnx") opset m imports (the last listed),
 * 1 for a model of IR < 3 without opset_import, -1 when none. */
static int64_t model_opset(const Onnx__ModelProto *m)
{
	int64_t opset = -1;

	for (size_t i = 0; i < m->n_opset_import; i++) {
		const Onnx__OperatorSetIdProto *o = m->opset_import[i];

		if (!o->domain || !o->domain[0] || strcmp(o->domain, "ai.onnx") == 0)
			opset = o->has_version ? o->version : 1;
	}
	if (m->n_opset_import == 0 && m->ir_version < 3)
		opset = 1;
	return opset;
}

__ap_give ap_graph *ap_onnx_import(const uint8_t *buf, size_t len,
				   const ap_host_tensor *const *bindings, int n_bindings,
				   __ap_give ap_params **params, ap_error *err)
{
	return ap_onnx_import_dir(buf, len, NULL, bindings, n_bindings, params, err);
}

__ap_give ap_graph *ap_onnx_import_dir(const uint8_t *buf, size_t len, const char *model_dir,
				       const ap_host_tensor *const *bindings, int n_bindings,
				       __ap_give ap_params **params, ap_error *err)
{
	Onnx__ModelProto *m;
	imp im;
	ap_error local;
	int rc;

	if (params)
		*params = NULL;
	if (!err)
		err = &local;
	ap_error_clear(err);
	memset(&im, 0, sizeof(im));
	im.err = err;
	im.shape_only = !params;
	im.model_dir = model_dir;
	m = decode_model(buf, len, im.shape_only, err);
	if (!m)
		return NULL;
	im.opset = model_opset(m);
	if (!m->graph) {
		ap_error_set(err, AP_EMESSAGE, NULL, NULL, "the model has no graph");
		goto fail;
	}
	if (im.opset < 1 || im.opset > 25) {
		ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
			     "default-domain opset %lld is not supported (1..25)", (long long)im.opset);
		goto fail;
	}
	im.g = ap_graph_new(m->graph->name ? m->graph->name : "");
	if (!im.g) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto fail;
	}
	rc = import_inputs(&im, m->graph, bindings, n_bindings < 0 ? 0 : n_bindings);
	if (rc == 0)
		rc = import_nodes(&im, m->graph);
	if (rc == 0)
		rc = import_outputs(&im, m->graph);
	if (rc < 0) {
		if (!err->code)
			ap_error_set(err, rc, im.node, NULL, "import failed");
		goto fail;
	}
	im.g->eager_kernels = im.eager;
	rc = ap_graph_validate(im.g, err);
	if (rc < 0)
		goto fail;
	if (params) {
		*params = im.params;
		im.params = NULL;
		if (!*params)
			*params = calloc(1, sizeof(**params));
	}
	ap_params_free(im.params);
	ap__onnx_clear(&im);
	onnx__model_proto__free_unpacked(m, NULL);
	return im.g;
fail:
	ap_params_free(im.params);
	ap__onnx_clear(&im);
	onnx__model_proto__free_unpacked(m, NULL);
	ap_graph_free(im.g);
	return NULL;
}
