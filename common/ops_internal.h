/* ops_internal.h -- shape inference and reference evaluation of single
 * normalised nodes, shared by ops.c, validate.c and the ONNX importer,
 * with the small helpers those files share; not part of the public API.
 * Both work on a node that need not be part of a graph (the importer
 * infers and folds nodes before adding them). */
#ifndef AP_OPS_INTERNAL_H
#define AP_OPS_INTERNAL_H

#include "graph.h"

/* Dtype and static shape of one tensor. */
typedef struct ap_shape {
	ap_dtype dtype;
	int rank;
	int64_t dims[AP_MAX_RANK];
} ap_shape;

/* True for ops whose output shape is not a function of the inputs and the
 * attributes but is carried by the output tensor (Reshape, Expand, Tile,
 * Slice, Split): ap__op_infer checks it instead of computing it. */
bool ap__op_shape_given(ap_op op);

/* Infers the outputs of `node` (its op and normalised attributes; its
 * inputs/outputs index arrays are not read).  in[i] describes input i
 * (NULL: optional input left out), n_in inputs; out[k] receives output k's
 * dtype and shape (for ap__op_shape_given ops it must hold the expected
 * shape on entry, which is checked and its dtype set).  in_names may be
 * NULL; they name tensors in errors.  Returns 0, AP_ESHAPE (inputs that do
 * not fit), AP_EINVAL (bad arity or attribute) or AP_EUNSUPPORTED (dtype). */
int ap__op_infer(const ap_node *node, const ap_shape *const *in, int n_in,
		 ap_shape *out, int n_out, const char *const *in_names, ap_error *err);

/* Evaluates `node` on host data: in[i] (NULL: left out), out[k] already
 * allocated with the inferred dtype/shape (ap__op_infer) and zeroed.
 * Computes float ops in double precision and rounds once.  Returns 0 or
 * AP_EUNSUPPORTED for an op or dtype the evaluator does not implement
 * (convolutions, pools, normalisations), AP_EINVAL for bad data (an index
 * out of range). */
int ap__op_eval(const ap_node *node, const ap_host_tensor *const *in, int n_in,
		ap_host_tensor *const *out, int n_out, ap_error *err);

/* Element count of a shape, -1 when a dim is negative or it exceeds
 * AP_MAX_ELEMENTS (tensor.c). */
int64_t ap__shape_numel(int rank, const int64_t *dims);

/* numpy (multidirectional) broadcast of a and b into r; AP_ESHAPE when the
 * shapes do not broadcast. */
int ap__broadcast(const ap_shape *a, const ap_shape *b, ap_shape *r);

/* 64-bit FNV-1a-style hash of the NUL-terminated string `s` (not NULL):
 * per byte, xor then multiply by the FNV prime 1099511628211 (Fowler, Noll,
 * Vo), starting from the offset basis 14695981039346656037.  For the
 * open-addressing name
 * tables of validate.c, where it is defined, and the ONNX importer; not
 * for anything that must resist collisions (cache keys use SHA-256). */
uint64_t ap__fnv1a(const char *s);

#endif
