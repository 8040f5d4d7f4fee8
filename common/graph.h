/* graph.h -- Apollo's graph IR: tensors, nodes of Apollo's op set
 * (ops.def), the op registry, validation, canonical hashing, and the
 * conversions graph <-> protobuf (apollo.Graph) and ONNX -> graph.
 *
 * Layout: a graph owns two flat arrays.  Tensors and nodes refer to each
 * other by index (int), never by pointer, so a graph can be copied,
 * serialised and hashed without fix-ups.  Every tensor has a static shape
 * (row-major, outermost dimension first, rank <= AP_MAX_RANK; rank 0 is a
 * scalar).  Each VALUE tensor is produced by exactly one node; INPUT, PARAM
 * and CONST tensors by none.  CONST tensors carry their bytes (small
 * constants, at most AP_CONST_MAX_BYTES); PARAM tensors carry shape and
 * dtype only: their data stays with the client (ap_params).
 */
#ifndef AP_GRAPH_H
#define AP_GRAPH_H

#include "base.h"

#define AP_MAX_RANK 8
/* Largest constant that travels by value (bytes); larger ones are PARAMs. */
#define AP_CONST_MAX_BYTES 4096
/* Largest element count of any tensor: 2^36 (256 GiB of float32). */
#define AP_MAX_ELEMENTS ((int64_t)1 << 36)

/* Numbered as ONNX TensorProto.DataType and apollo.DataType.  F16 and
 * BF16 are IEEE 754 binary16 and bfloat16: storage types whose arithmetic
 * is done in float32 and rounded (kernels accumulate reductions and
 * products in float32, as frameworks do). */
typedef enum ap_dtype {
	AP_DT_UNDEF = 0,
	AP_DT_F32 = 1,
	AP_DT_U8 = 2,
	AP_DT_I8 = 3,
	AP_DT_I32 = 6,
	AP_DT_I64 = 7,
	AP_DT_BOOL = 9,
	AP_DT_F16 = 10,
	AP_DT_F64 = 11,
	AP_DT_BF16 = 16,
} ap_dtype;

typedef enum ap_tensor_kind {
	AP_TENSOR_VALUE = 0,
	AP_TENSOR_INPUT = 1,
	AP_TENSOR_PARAM = 2,
	AP_TENSOR_CONST = 3,
} ap_tensor_kind;

typedef enum ap_op {
#define X(e, name, cat, view) AP_OP_##e,
#include "ops.def"
#undef X
	AP_OP_COUNT
} ap_op;

typedef enum ap_op_category {
	AP_CAT_ELEMWISE,
	AP_CAT_BROADCAST,
	AP_CAT_INJECTIVE,
	AP_CAT_REDUCTION,
	AP_CAT_TRANSPOSE,
	AP_CAT_MATMUL,
	AP_CAT_CONV,
	AP_CAT_COMPOUND,
	AP_CAT_OPAQUE,
} ap_op_category;

typedef enum ap_attr_type {
	AP_ATTR_INT = 1,
	AP_ATTR_FLOAT = 2,
	AP_ATTR_STRING = 3,
	AP_ATTR_INTS = 4,
	AP_ATTR_FLOATS = 5,
} ap_attr_type;

typedef struct ap_attr {
	char *name;
	ap_attr_type type;
	int64_t i;
	double f;
	char *s;
	int64_t *ints;
	int n_ints;
	double *floats;
	int n_floats;
} ap_attr;

typedef struct ap_tensor {
	char *name;
	ap_dtype dtype;
	int rank;
	int64_t dims[AP_MAX_RANK];
	ap_tensor_kind kind;
	void *data;        /* CONST only: nbytes of row-major little-endian data */
	size_t nbytes;     /* CONST only */
	int producer;      /* node index, -1 for INPUT/PARAM/CONST */
	bool is_output;    /* listed among the graph outputs */
} ap_tensor;

typedef struct ap_node {
	char *name;        /* the imported node's name (unique; made up when empty) */
	ap_op op;
	int n_inputs;
	int *inputs;       /* tensor indices; -1 = optional input left out */
	int n_outputs;
	int *outputs;      /* tensor indices; -1 = optional output not produced */
	int n_attrs;
	ap_attr *attrs;
} ap_node;

typedef struct ap_graph {
	char *name;
	int n_tensors, cap_tensors;
	ap_tensor *tensors;
	int n_nodes, cap_nodes;
	ap_node *nodes;    /* topologically ordered after ap_graph_validate() */
	int n_inputs;
	int *inputs;       /* INPUT tensors in binding order */
	int n_outputs;
	int *outputs;
	unsigned eager_kernels; /* kernels an op-by-op runtime launches for the
				   imported model, views free (0 = unknown) */
} ap_graph;

/* ---- op registry (ops.c) ---------------------------------------------- */

/* "Add" for AP_OP_ADD; NULL for an out-of-range value. */
const char *ap_op_name(ap_op op);
/* The op named `name` (exact, case-sensitive), or -1 if Apollo has none. */
int ap_op_lookup(const char *name);
ap_op_category ap_op_category_of(ap_op op);
/* True for ops that only reinterpret memory (Reshape, Identity). */
bool ap_op_is_view(ap_op op);
/* Infers the output shapes and dtypes of node `n` of `g` from its inputs'
 * and its normalised attributes (ops.def) and checks them against the
 * output tensors, which must already carry the shapes.  Returns 0, AP_ESHAPE
 * (mismatch, naming node and tensor), AP_EINVAL (bad attribute). */
int ap_op_check(const ap_graph *g, int n, ap_error *err);

/* ---- tensors and graphs (graph.c) -------------------------------------- */

size_t ap_dtype_size(ap_dtype dt);           /* bytes per element; 0 if unknown */
const char *ap_dtype_name(ap_dtype dt);      /* "float32", ... */
/* True for the dtypes a graph may carry (wire format, ONNX import, Cast
 * targets): every dtype with a size. */
bool ap_dtype_in_graphs(ap_dtype dt);
/* F32, F64, F16 and BF16. */
bool ap_dtype_is_floating(ap_dtype dt);
/* The lowest finite value of floating type dt (-65504 for F16, -(2 - 2^-7)
 * 2^127 for BF16, -FLT_MAX, and -DBL_MAX for F64 and any other type): the
 * max a safe softmax clamps a fully masked row's maximum to. */
double ap_dtype_lowest_finite(ap_dtype dt);

/* ---- 16-bit floats and typed elements (half.c) ---------------------------- */

/* Bit-exact conversions (IEEE 754 binary16, Google's bfloat16): float32 ->
 * 16 bits rounds to nearest, ties to even (f16: overflow to infinity from
 * 65520 on, subnormals kept; NaN stays a quiet NaN); 16 bits -> float32 is
 * exact. */
uint16_t ap_f32_to_f16(float f);
float ap_f16_to_f32(uint16_t h);
uint16_t ap_f32_to_bf16(float f);
float ap_bf16_to_f32(uint16_t h);
/* Element i of a buffer of type dt as a double (16-bit floats widened
 * exactly, bool 0 or 1); 0 for a type without a size. */
double ap_elem_get(const void *data, ap_dtype dt, int64_t i);
/* Stores v as element i of a buffer of type dt: floats rounded to the
 * type (16-bit ones through float32), integers truncated toward zero and
 * saturated to the type, bool v != 0. */
void ap_elem_set(void *data, ap_dtype dt, int64_t i, double v);
/* Element count, or -1 when it exceeds AP_MAX_ELEMENTS or a dim is < 0. */
int64_t ap_tensor_numel(const ap_tensor *t);
/* True when tensor t of g (t >= 0) is a constant of one element with its
 * data (at least one element's bytes), the value in *v (ap_elem_get):
 * the scalar operands the lowering reads off a graph (an epilogue's
 * alpha, a safe softmax's clamp). */
bool ap_tensor_scalar(const ap_graph *g, int t, double *v);
/* True when two shapes are the same: equal ranks (0..AP_MAX_RANK) and
 * equal dims, position by position (rank_a dims in dims_a, rank_b in
 * dims_b; dtypes are not compared).  No broadcasting: [1,4] is not [4]. */
bool ap_dims_equal(int rank_a, const int64_t *dims_a, int rank_b, const int64_t *dims_b);

__ap_give ap_graph *ap_graph_new(const char *name);
ap_graph *ap_graph_free(__ap_take ap_graph *g);   /* accepts NULL, returns NULL */
__ap_give ap_graph *ap_graph_copy(__ap_keep const ap_graph *g);
/* Appends a tensor; returns its index or a negative AP_E* code.  `data` is
 * copied (CONST only). */
int ap_graph_add_tensor(ap_graph *g, const char *name, ap_dtype dt, int rank,
			const int64_t *dims, ap_tensor_kind kind,
			const void *data, size_t nbytes);
/* Appends a node with no attributes; returns its index or a negative code.
 * Sets the producer of every output tensor. */
int ap_graph_add_node(ap_graph *g, const char *name, ap_op op,
		      int n_inputs, const int *inputs,
		      int n_outputs, const int *outputs);
int ap_node_set_int(ap_graph *g, int n, const char *attr, int64_t v);
int ap_node_set_float(ap_graph *g, int n, const char *attr, double v);
int ap_node_set_string(ap_graph *g, int n, const char *attr, const char *v);
int ap_node_set_ints(ap_graph *g, int n, const char *attr, const int64_t *v, int count);
int ap_node_set_floats(ap_graph *g, int n, const char *attr, const double *v, int count);
/* Attribute look-ups; return NULL / `dflt` when absent. */
const ap_attr *ap_node_attr(const ap_node *node, const char *attr);
int64_t ap_node_int(const ap_node *node, const char *attr, int64_t dflt);
/* Element i of an INTS attribute (strides, pads, kernel_shape ...), or
 * `dflt` when the attribute is absent, of another type, or shorter. */
int64_t ap_node_attr_at(const ap_node *node, const char *attr, int i, int64_t dflt);
double ap_node_float(const ap_node *node, const char *attr, double dflt);
const char *ap_node_string(const ap_node *node, const char *attr, const char *dflt);
/* Index of the tensor named `name`, or -1. */
int ap_graph_find_tensor(const ap_graph *g, const char *name);
/* Appends tensor t to the graph inputs (binding order) / outputs.  The
 * tensor's kind is not checked here (ap_graph_validate does).  0,
 * AP_EINVAL (t out of range) or AP_ENOMEM; the graph is unchanged on error. */
int ap_graph_add_input(ap_graph *g, int t);
int ap_graph_add_output(ap_graph *g, int t);
/* Infers the dtype and shape of every output tensor of node n from its
 * inputs' tensors and its normalised attributes (ops.def) and writes them
 * into those tensors, so a graph can be built without spelling out each
 * shape.  For the ops whose output shape is carried by the output tensor
 * (Reshape, Expand, Tile, Slice, Split) the tensor must already hold it:
 * it is checked and only the dtype is set.  Indices must be in range.
 * Returns 0, or as ap_op_check (AP_ESHAPE, AP_EINVAL, AP_EUNSUPPORTED,
 * AP_ENOMEM) naming the node; the tensors are unchanged on error. */
int ap_graph_infer_node(ap_graph *g, int n, ap_error *err);

/* Checks the whole graph and sorts its nodes topologically: every index in
 * range, each VALUE tensor produced exactly once, INPUT/PARAM/CONST never
 * produced, no cycle, every dim >= 0 and every element count within
 * AP_MAX_ELEMENTS, CONST sizes match, every node passes ap_op_check, and
 * outputs are listed.  Returns 0 or AP_EINVAL / AP_ESHAPE / AP_ETOOLARGE /
 * AP_EUNSUPPORTED, with `err` naming the node or tensor. */
int ap_graph_validate(ap_graph *g, ap_error *err);

/* Canonical SHA-256 of the graph: independent of node order, tensor order
 * and every name: tensors are identified by their producer's structure,
 * inputs by position, params by (name-free) position among params sorted
 * by first use.  CONST data is hashed by value.  `out` receives 32 bytes.
 * Requires a validated graph.  Returns 0, or AP_ENOMEM (then `out` is all
 * zero and must not be used as a key). */
int ap_graph_hash(const ap_graph *g, uint8_t out[32]);
/* As ap_graph_hash, with the name of every tensor and node hashed too: two
 * graphs hash alike only when a bundle compiled for one serves the other
 * (bundles bind params and inputs by name and list node names).  This is
 * what cache keys use.  0 or AP_ENOMEM. */
int ap_graph_hash_named(const ap_graph *g, uint8_t out[32]);
/* As ap_graph_hash, but a CONST's values count only when a kernel bakes
 * them into its source -- at most `bake_max` elements (server/lower's
 * AP_CONST_BAKE_MAX), or all elements equal --; larger ones, read from a
 * buffer, count by dtype and shape: two micro-graphs that differ only in
 * such values (the biases of two layers) hash alike, as their kernels are
 * the same.  What tuning signatures use.  0 or AP_ENOMEM. */
int ap_graph_hash_kernel(const ap_graph *g, int64_t bake_max, uint8_t out[32]);

/* ---- protobuf (graph_pb.c) ---------------------------------------------- */

struct Apollo__Graph;
/* Converts an apollo.Graph into a graph; checks every index and length
 * before allocating.  Does not validate (call ap_graph_validate).  Returns
 * NULL with `err` set (AP_EINVAL, AP_EUNSUPPORTED for an unknown op_type,
 * AP_ETOOLARGE, AP_ENOMEM). */
__ap_give ap_graph *ap_graph_from_pb(__ap_keep const struct Apollo__Graph *pb, ap_error *err);
/* Builds an apollo.Graph; free with ap_graph_pb_free. NULL on ENOMEM. */
__ap_give struct Apollo__Graph *ap_graph_to_pb(__ap_keep const ap_graph *g);
void ap_graph_pb_free(__ap_take struct Apollo__Graph *pb);

/* ---- host tensors and parameter data (tensor.c) ------------------------ */

/* A tensor with its data on the host, e.g. decoded from an ONNX
 * TensorProto .pb file or held by the client for a PARAM. */
typedef struct ap_host_tensor {
	char *name;
	ap_dtype dtype;
	int rank;
	int64_t dims[AP_MAX_RANK];
	void *data;       /* row-major, nbytes long, owned */
	size_t nbytes;
} ap_host_tensor;

ap_host_tensor *ap_host_tensor_free(__ap_take ap_host_tensor *t);
/* Decodes one serialized onnx.TensorProto (raw_data or typed fields;
 * float32, float64, int32, int64, uint8, int8, bool).  NULL with `err` on
 * bad bytes or unsupported dtype. */
__ap_give ap_host_tensor *ap_onnx_tensor_decode(const uint8_t *buf, size_t len, ap_error *err);

/* Parameter store: name -> host data for every PARAM of an imported graph
 * (initializers and large Constant nodes).  Owned by the client side. */
typedef struct ap_params {
	int n;
	ap_host_tensor **items;
} ap_params;
ap_params *ap_params_free(__ap_take ap_params *p);
const ap_host_tensor *ap_params_find(const ap_params *p, const char *name);

/* ---- ONNX import (onnx_import.c) ---------------------------------------- */

/* Imports a serialized ONNX ModelProto (IR 3-13, opsets 6-25).
 * `bindings` (n_bindings, may be 0) give, by graph-input name or, when the
 * name matches none, by position among the non-initializer inputs:
 * the concrete shape of an input with symbolic dims (data may be NULL;
 * a binding of dtype AP_DT_UNDEF with nbytes 0, ap_shape_binding_parse,
 * gives the shape alone and must name an input),
 * or the value of an integer input that must be a compile-time constant
 * (Reshape shape, Slice starts, axes, Gather indices...), which then
 * becomes a CONST (or a PARAM with data in *params when large) instead of
 * a graph input.
 * On success returns the validated graph and, when `params` is not NULL,
 * the data of every PARAM tensor.  With `params` NULL the import reads
 * the model's structure only (ap_onnx_skeleton): the data of a
 * floating-point tensor larger than AP_CONST_MAX_BYTES (a weight) is never
 * read, decoded nor copied, and its PARAM comes from its dims and dtype --
 * the same graph as with the data (weights are never folded into).  Errors: AP_EMESSAGE (bytes that do not
 * decode), AP_EUNSUPPORTED (op/dtype/opset), AP_EINVAL, AP_ESHAPE,
 * AP_ETOOLARGE, with `err` naming the ONNX node.  A tensor whose data is
 * in an external file is refused when its data is needed (AP_EUNSUPPORTED:
 * no model folder; ap_onnx_import_dir with the folder reads it). */
__ap_give ap_graph *ap_onnx_import(const uint8_t *buf, size_t len,
				   const ap_host_tensor *const *bindings, int n_bindings,
				   __ap_give ap_params **params, ap_error *err);

/* The most bytes of external data (ONNX IR: TensorProto.external_data) one
 * import reads, all tensors together: the same limit as the model file
 * itself (apollo-client's MAX_MODEL_BYTES, 2 GiB). */
#define AP_ONNX_EXTERNAL_MAX_BYTES ((uint64_t)2 << 30)

/* ap_onnx_import for a model whose tensors may keep their data in files
 * beside it: ONNX external data (onnx/onnx.proto, TensorProto fields 13
 * external_data and 14 data_location; docs/ExternalData.md of the ONNX
 * IR spec): a tensor with data_location EXTERNAL, or with external_data
 * entries, has its raw little-endian bytes (as raw_data holds them) in
 * the file `location` (a path relative to the model's folder) from byte
 * `offset` (default 0) for `length` bytes (default: to the end of the
 * file); "checksum" is not verified; other keys are ignored.
 *
 * `model_dir` (borrowed, may be NULL) is the folder of the model file,
 * whose path `location` is taken relative to: "." for a model in the
 * current folder.  NULL when the model has no folder (the daemon's
 * import of a model sent over the socket): then a tensor whose data is
 * needed is refused (weights with external data must be bound by the
 * client).  Everything else is as ap_onnx_import (bindings, params and
 * their ownership: *params and the graph are the caller's).
 *
 * With `params` NULL (structure only) a floating-point tensor larger than
 * AP_CONST_MAX_BYTES (a weight) is never read: its PARAM comes from its
 * dims and data_type, and its file is never opened (it may be missing).
 * The data of smaller tensors and of integer and bool ones is read when
 * the import uses it (shapes, indices, folded constants), as it is for
 * data inside the model, so that a model with external data imports to
 * the graph its inline twin imports to.
 *
 * Before a byte is allocated or read, a tensor's data is checked: the
 * location must be relative, without ".." components, and its real path
 * (symbolic links resolved) must be under the real path of `model_dir`;
 * the file must be a regular file; offset + length must be within its
 * size; length must equal the tensor's element count times its dtype's
 * size; and the bytes read by the whole import at most
 * AP_ONNX_EXTERNAL_MAX_BYTES.
 *
 * Errors, besides ap_onnx_import's, each naming the tensor and the file:
 * AP_EINVAL (no location, an absolute location or one with "..", one that
 * leaves the folder through a link, a malformed offset or length, a
 * length that disagrees with the dims, data past the end of the file),
 * AP_EUNSUPPORTED (the data is needed and `model_dir` is NULL), AP_EIO
 * (the file cannot be opened, is not a regular file, or cannot be read),
 * AP_ETOOLARGE (over AP_ONNX_EXTERNAL_MAX_BYTES), AP_ENOMEM. */
__ap_give ap_graph *ap_onnx_import_dir(const uint8_t *buf, size_t len, const char *model_dir,
				       const ap_host_tensor *const *bindings, int n_bindings,
				       __ap_give ap_params **params, ap_error *err);

/* The files that hold the external data of the ONNX model buf[0..len)
 * (every tensor with external data: initializers, tensor attributes, in
 * subgraphs too), for copying the model with its data: each distinct
 * `location` once, in the order met, checked as ap_onnx_import_dir checks
 * it before reading (relative, no "..", its real path inside the real
 * path of `model_dir`, a regular file).  0 with *locations (as the model
 * writes them) and *paths (their real paths), both n entries, malloc'd
 * arrays of malloc'd strings (the caller frees each, then the arrays),
 * *n may be 0; or AP_EMESSAGE (not a ModelProto), AP_EINVAL (no location,
 * an absolute one, one with "..", one leading outside the folder),
 * AP_EIO (a file missing or not a regular file), AP_ENOMEM, `err` naming
 * the tensor and the file.  Nothing is read but the model's structure. */
int ap_onnx_external_files(const uint8_t *buf, size_t len, const char *model_dir,
			   __ap_give char ***locations, __ap_give char ***paths, int *n,
			   ap_error *err);

/* Parses a shape binding "NAME=DIMS" (DIMS: positive integers joined by
 * 'x', e.g. "input=1x3x224x224"; "NAME=" alone is a scalar) into a
 * binding without data: *out (the caller's; ap_host_tensor_free) has the
 * name, the dims, dtype AP_DT_UNDEF, data NULL and nbytes 0.  Given to
 * ap_onnx_import(_dir), such a binding gives the shape of the graph input
 * of that name (its dtype is the model's): its name must be one of the
 * graph's inputs, its rank and every fixed dimension the model's.
 * Errors: AP_EINVAL (no '=', an empty or over-long name, a dim that is
 * not a decimal integer, zero or negative, more than AP_MAX_RANK dims),
 * AP_ETOOLARGE (a dim or the element count over AP_MAX_ELEMENTS),
 * AP_ENOMEM; `err` quotes the text. */
int ap_shape_binding_parse(const char *spec, __ap_give ap_host_tensor **out, ap_error *err);

/* The serialized ModelProto in `len` bytes at `buf` without the data of
 * its floating-point tensors larger than AP_CONST_MAX_BYTES (by dims and
 * data_type: initializers, Constant values, tensor attributes, in
 * subgraphs too; integer and bool tensors keep theirs),
 * every other byte as it was: 0 with *out (malloc'd, at most `len` bytes)
 * and *out_len; AP_EMESSAGE (not the wire format, or nested over 64
 * deep), AP_EINVAL (a large tensor's data does not match its dims, by
 * length), AP_ENOMEM; `err` names the tensor.  A tensor with external
 * data (ap_onnx_import_dir) is kept as it is: its file is not looked at.  The data's bytes are skipped, never read (see
 * onnx_skeleton.c). */
int ap_onnx_skeleton(const uint8_t *buf, size_t len, __ap_give uint8_t **out, size_t *out_len,
		     ap_error *err);

/* ---- hashing (hash.c) ---------------------------------------------------- */

/* SHA-256 (OpenSSL libcrypto) of `len` bytes into `out`. */
void ap_sha256(const void *buf, size_t len, uint8_t out[32]);
/* Incremental SHA-256. */
typedef struct ap_sha256_ctx ap_sha256_ctx;
__ap_give ap_sha256_ctx *ap_sha256_new(void);
void ap_sha256_update(ap_sha256_ctx *c, const void *buf, size_t len);
/* Writes the digest and frees `c`. */
void ap_sha256_final(__ap_take ap_sha256_ctx *c, uint8_t out[32]);
/* 64 lowercase hex chars + NUL. */
void ap_hex(const uint8_t *in, size_t n, char *out);
/* HMAC-SHA256 of the concatenated parts (n of them) with `key`: 0 or
 * AP_ENOMEM; see hash.c. */
int ap_hmac_sha256(const void *key, size_t key_len, const void *const *parts,
		   const size_t *lens, int n, uint8_t out[32]);
/* `n` random bytes (OS CSPRNG): 0 or AP_EIO. */
int ap_random_bytes(uint8_t *buf, size_t n);
/* Constant-time equality of n bytes. */
bool ap_mem_equal_ct(const void *a, const void *b, size_t n);

#endif
