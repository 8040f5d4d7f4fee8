/* onnx_import_internal.h -- what the files of the ONNX importer share and
 * nobody else needs (not installed; included only by common/onnx_import*.c).
 *
 *   onnx_import.c              ap_onnx_import: decoding, graph inputs,
 *                              initializers, the node walk and its dispatch
 *                              (ONNX op name -> importer), If, graph outputs
 *   onnx_import_values.c       errors, name sets, the ONNX name -> ival map,
 *                              known values, ONNX attribute and input readers
 *   onnx_import_emit.c         emit: one normalised node, inferred, then
 *                              folded or added; materialise: an ival into
 *                              the graph
 *   onnx_import_elementwise.c  unary, binary, variadic, Cast, Clip, Where, ...
 *   onnx_import_reduce.c       Reduce*, Softmax, ArgMax/ArgMin, CumSum
 *   onnx_import_nn.c           Conv, pools, normalisations, MatMul, Gemm,
 *                              LRN, Dropout
 *   onnx_import_shape.c        Reshape, Transpose, Slice, Concat, Gather,
 *                              Pad, Scatter, DepthToSpace, ...
 *   onnx_import_constant.c     Constant, ConstantOfShape, Shape, Size, Range
 *   onnx_import_einsum.c       Einsum
 *   onnx_import_resize.c       Resize, Upsample
 *
 * Static inline helpers here keep their short names; every function with
 * external linkage is ap__onnx_<verb>; an importer of an ONNX node is
 * ap__onnx_imp_<op> (errors as ap_onnx_import's: 0 or a negative AP_E*
 * with im->err set and naming the node).
 */
#ifndef AP_ONNX_IMPORT_INTERNAL_H
#define AP_ONNX_IMPORT_INTERNAL_H

#include "onnx_internal.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define NAME_CAP 256
#define MAX_INTS 16          /* longest INTS attribute the importer builds */

/* ---- what the importer knows of an ONNX value ---------------------------- */

typedef struct ival {
	char *name;
	ap_shape sh;
	int tensor;                      /* graph tensor, -1 until materialised */
	ap_host_tensor *data;            /* known value (owned) */
	const Onnx__TensorProto *lazy;   /* known value not yet decoded */
	bool fill;                       /* every element equals fill_f / fill_i */
	bool weight;                     /* large float data: never folded into */
	double fill_f;
	int64_t fill_i;
	const char *poison;              /* why this value must not be used */
	char poison_node[128];
} ival;

typedef struct entry {
	char *key;
	ival *v;
} entry;

typedef struct strset {
	char **slots;
	size_t cap, n;
} strset;

/* The state of one ap_onnx_import call (no state outlives it). */
typedef struct imp {
	ap_graph *g;
	ap_params *params;
	bool shape_only;                 /* no parameter store: large data never read */
	const char *model_dir;           /* external data's folder; NULL: unknown */
	uint64_t external_bytes;         /* external data read so far */
	int params_cap;
	int64_t opset;
	ap_error *err;
	entry *map;                      /* ONNX name -> ival (open addressing) */
	size_t map_cap, map_n;
	ival **all;                      /* every ival, for freeing */
	int n_all, cap_all;
	strset tnames, nnames;           /* names used in the graph */
	const char *node;                /* ONNX node being imported */
	int n_made;                      /* counter for made-up node names */
	int n_emitted;                   /* normalised nodes added so far */
	unsigned eager;
} imp;

/* Returns from the calling function when x is negative. */
#define TRY(x) do { int rc_ = (x); if (rc_ < 0) return rc_; } while (0)

/* ---- shapes, dtypes and known values ------------------------------------- */

static inline int64_t sh_numel(const ap_shape *s)
{
	return ap__shape_numel(s->rank, s->dims);
}

/* Bytes of a value, or -1 when its element count is out of range. */
static inline int64_t sh_bytes(const ap_shape *s)
{
	int64_t n = sh_numel(s);
	size_t es = ap_dtype_size(s->dtype);

	return n < 0 || es == 0 ? -1 : n * (int64_t)es;
}

/* The dtypes a graph tensor may have (validate.c accepts the same). */
static inline bool graph_dtype(ap_dtype dt)
{
	return dt == AP_DT_F32 || dt == AP_DT_F64 || dt == AP_DT_F16 || dt == AP_DT_BF16 ||
	       dt == AP_DT_I32 || dt == AP_DT_I64 || dt == AP_DT_BOOL;
}

static inline bool int_dtype(ap_dtype dt)
{
	return dt == AP_DT_I32 || dt == AP_DT_I64 || dt == AP_DT_I8 || dt == AP_DT_U8;
}

static inline bool float_dtype(ap_dtype dt)
{
	return dt == AP_DT_F32 || dt == AP_DT_F64 || dt == AP_DT_F16 || dt == AP_DT_BF16;
}

static inline bool known(const ival *v)
{
	return v && (v->data || v->lazy);
}

/* Known, and small enough to travel as a CONST (a structure-only import
 * decodes only these). */
static inline bool known_small(const ival *v)
{
	int64_t b = v ? sh_bytes(&v->sh) : -1;

	return known(v) && b >= 0 && b <= AP_CONST_MAX_BYTES;
}

/* Output k's name of n, "" when absent. */
static inline const char *out_name(const Onnx__NodeProto *n, size_t k)
{
	return k < n->n_output && n->output[k] ? n->output[k] : "";
}

/* ---- normalised attributes under construction ---------------------------- */

typedef struct abuf {
	ap_attr a[12];
	int64_t iv[12][MAX_INTS];
	int n;
} abuf;

static inline ap_attr *ab_slot(abuf *b, const char *name, ap_attr_type type)
{
	ap_attr *a = &b->a[b->n];

	memset(a, 0, sizeof(*a));
	a->name = (char *)name;
	a->type = type;
	a->ints = b->iv[b->n];
	b->n++;
	return a;
}

static inline void ab_int(abuf *b, const char *name, int64_t v)
{
	ab_slot(b, name, AP_ATTR_INT)->i = v;
}

static inline void ab_float(abuf *b, const char *name, double v)
{
	ab_slot(b, name, AP_ATTR_FLOAT)->f = v;
}

static inline void ab_str(abuf *b, const char *name, const char *s)
{
	ab_slot(b, name, AP_ATTR_STRING)->s = (char *)s;
}

/* An INTS attribute of n values (at most MAX_INTS are kept). */
static inline void ab_ints(abuf *b, const char *name, const int64_t *v, int n)
{
	ap_attr *a = ab_slot(b, name, AP_ATTR_INTS);

	if (n > MAX_INTS)
		n = MAX_INTS;
	memcpy(a->ints, v, (size_t)n * sizeof(int64_t));
	a->n_ints = n;
}

/* ---- onnx_import_values.c ------------------------------------------------- */

/* Sets im->err (code, the current node, `tensor`, the formatted message)
 * and returns code. */
int ap__onnx_fail(imp *im, int code, const char *tensor, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* ap__onnx_fail(im, AP_ENOMEM, NULL, "out of memory"). */
int ap__onnx_nomem(imp *im);
bool ap__onnx_ss_has(const strset *s, const char *name);
/* Adds a copy of name to s (nothing when present); 0 or AP_ENOMEM (no
 * error message set). */
int ap__onnx_ss_add(strset *s, const char *name);
/* Writes a name not yet in `s` (base, base_1, base_2, ...; NAME_CAP bytes)
 * to out and records it.  0 or AP_ENOMEM. */
int ap__onnx_uniq(imp *im, strset *s, const char *base, char *out);
/* The value ONNX name `name` refers to, NULL when none. */
ival *ap__onnx_lookup(imp *im, const char *name);
/* Makes ONNX name `name` refer to v (a later binding replaces an earlier;
 * an empty name binds nothing).  0 or AP_ENOMEM. */
int ap__onnx_bind(imp *im, const char *name, ival *v);
/* A new empty value (no shape, no data, tensor -1) that the importer owns;
 * NULL on ENOMEM (error set). */
ival *ap__onnx_new_val(imp *im, const char *name);
/* The data of a known value, decoding it on first use; NULL with the
 * error set. */
const ap_host_tensor *ap__onnx_val_data(imp *im, ival *v);
/* A TensorProto's data, from the model or its external file (graph.h,
 * ap_onnx_import_dir).  NULL with im->err set (the tensor's errors). */
__ap_give ap_host_tensor *ap__onnx_tensor_load(imp *im, const Onnx__TensorProto *tp,
					       const char *what);
/* A new known value holding t (consumed, even on error); NULL on ENOMEM. */
ival *ap__onnx_const_val(imp *im, const char *name, __ap_take ap_host_tensor *t);
/* A new known int64 vector value of n elements; NULL on ENOMEM. */
ival *ap__onnx_ints_val(imp *im, const char *name, const int64_t *vals, int n);
/* A new known scalar of dtype dt: f for floating dtypes, i otherwise. */
ival *ap__onnx_scalar_val(imp *im, const char *name, ap_dtype dt, double f, int64_t i);
/* ONNX attribute `name` of n, NULL when absent. */
const Onnx__AttributeProto *ap__onnx_attr(const Onnx__NodeProto *n, const char *name);
/* INT attribute (a FLOAT one converted), dflt when absent. */
int64_t ap__onnx_aint(const Onnx__NodeProto *n, const char *name, int64_t dflt);
/* FLOAT attribute (an INT one converted), dflt when absent. */
double ap__onnx_afloat(const Onnx__NodeProto *n, const char *name, double dflt);
/* Copies a STRING attribute (at most cap-1 bytes) into buf and returns
 * buf, or dflt when absent. */
const char *ap__onnx_astr(const Onnx__NodeProto *n, const char *name, const char *dflt, char *buf,
			  size_t cap);
/* INTS attribute: 1 when present (count in *cnt), 0 when absent,
 * AP_EUNSUPPORTED when it has more than max values. */
int ap__onnx_aints(imp *im, const Onnx__NodeProto *n, const char *name, int64_t *out, int max,
		   int *cnt);
/* Input k of n (NULL when absent or ""); AP_EINVAL when the name is
 * unknown, or when `required` and it is absent; AP_EUNSUPPORTED when it
 * is poisoned. */
int ap__onnx_get_in(imp *im, const Onnx__NodeProto *n, size_t k, bool required, ival **out);
/* The values of a known integer vector (or scalar) v, at most max;
 * AP_EUNSUPPORTED when v is not known or too long, AP_EINVAL when not
 * integer.  `what` names v in messages. */
int ap__onnx_get_ints(imp *im, ival *v, const char *what, int64_t *out, int max, int *cnt);
/* The single value of a known scalar (or 1-element) v as double. */
int ap__onnx_get_scalar(imp *im, ival *v, const char *what, double *out);
/* Axis normalised into [0, rank); AP_EINVAL when out of range. */
int ap__onnx_norm_axis(imp *im, int64_t axis, int rank, int64_t *out);
/* Axes normalised, sorted and made distinct (*n updated). */
int ap__onnx_norm_axes(imp *im, int64_t *axes, int *n, int rank);
/* Marks optional output k of n as unusable (e.g. Dropout's mask): using
 * it later fails with AP_EUNSUPPORTED and `why`. */
int ap__onnx_poison_out(imp *im, const Onnx__NodeProto *n, size_t k, const char *why);
/* Frees every value, the name map and the name sets (not g, not params). */
void ap__onnx_clear(imp *im);

/* ---- onnx_import_emit.c --------------------------------------------------- */

/* The graph tensor of v, creating it (CONST, PARAM or Expand of a fill)
 * on first use; the tensor index or a negative AP_E*. */
int ap__onnx_materialise(imp *im, ival *v);
/* Adds a node with a unique name derived from `base` and copies attrs;
 * the node index or AP_ENOMEM. */
int ap__onnx_emit_node(imp *im, const char *base, ap_op op, const ap_attr *attrs, int n_attrs,
		       int n_in, const int *ins, int n_out, const int *outs);
/* Lowers one normalised node: infers its outputs (ap__op_infer), folds it
 * when every input is a small known constant and every output is small,
 * adds it to the graph otherwise.  ins[i] may be NULL (optional input
 * left out); out_names[k] NULL or "" = output not produced.  given: output
 * shapes of the ops whose output shape is not inferred
 * (ap__op_shape_given).  outs[k] receives the new values.  At most 64
 * inputs and outputs (AP_EUNSUPPORTED). */
int ap__onnx_emit(imp *im, ap_op op, abuf *A, int n_in, ival *const *ins, int n_out,
		  const char *const *out_names, const ap_shape *given, ival **outs);
/* ap__onnx_emit of a node with one output. */
int ap__onnx_emit1(imp *im, ap_op op, abuf *A, int n_in, ival *const *ins, const char *out_name,
		   const ap_shape *given, ival **out);
/* x reshaped to (rank, dims); x itself when the shape is the same. */
int ap__onnx_reshape_to(imp *im, ival *x, int rank, const int64_t *dims, const char *out_name,
			ival **out);
/* x transposed by perm (rank values); x itself when perm is the identity. */
int ap__onnx_transpose_to(imp *im, ival *x, const int64_t *perm, const char *name, ival **out);

/* ---- importers of ONNX nodes: each reads node n and binds its outputs ---- */

/* onnx_import_elementwise.c */
int ap__onnx_imp_unary(imp *im, const Onnx__NodeProto *n, ap_op op);
int ap__onnx_imp_cast(imp *im, const Onnx__NodeProto *n, bool like);
int ap__onnx_imp_clip(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_binary(imp *im, const Onnx__NodeProto *n, ap_op op);
int ap__onnx_imp_variadic(imp *im, const Onnx__NodeProto *n, ap_op op, bool mean);
int ap__onnx_imp_where(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_is_inf(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_shrink(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_trilu(imp *im, const Onnx__NodeProto *n);

/* onnx_import_reduce.c */
int ap__onnx_imp_reduce(imp *im, const Onnx__NodeProto *n, ap_op op);
int ap__onnx_imp_softmax(imp *im, const Onnx__NodeProto *n, ap_op op);
int ap__onnx_imp_argext(imp *im, const Onnx__NodeProto *n, ap_op op);
int ap__onnx_imp_cumsum(imp *im, const Onnx__NodeProto *n);

/* onnx_import_nn.c */
int ap__onnx_imp_layer_norm(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_attention(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_batch_norm(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_instance_norm(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_lrn(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_matmul(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_gemm(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_conv(imp *im, const Onnx__NodeProto *n, bool transpose);
int ap__onnx_imp_pool(imp *im, const Onnx__NodeProto *n, ap_op op);
int ap__onnx_imp_global_pool(imp *im, const Onnx__NodeProto *n, ap_op op);
int ap__onnx_imp_dropout(imp *im, const Onnx__NodeProto *n);

/* onnx_import_shape.c */
int ap__onnx_imp_reshape(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_flatten(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_squeeze(imp *im, const Onnx__NodeProto *n, bool un);
int ap__onnx_imp_transpose(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_expand(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_tile(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_slice(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_concat(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_split(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_gather(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_pad(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_elements(imp *im, const Onnx__NodeProto *n, ap_op op);
int ap__onnx_imp_depth_space(imp *im, const Onnx__NodeProto *n, bool to_space);

/* onnx_import_constant.c */
int ap__onnx_imp_constant(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_constant_of_shape(imp *im, const Onnx__NodeProto *n);
int ap__onnx_imp_shape(imp *im, const Onnx__NodeProto *n, bool size);
int ap__onnx_imp_range(imp *im, const Onnx__NodeProto *n);

/* onnx_import_einsum.c */
int ap__onnx_imp_einsum(imp *im, const Onnx__NodeProto *n);

/* onnx_import_resize.c */
int ap__onnx_imp_resize(imp *im, const Onnx__NodeProto *n, bool upsample);

#endif
