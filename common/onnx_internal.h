/* onnx_internal.h -- helpers shared by the ONNX files of common/ (tensor.c,
 * onnx_import.c, onnx_fold.c); not part of the public API. */
#ifndef AP_ONNX_INTERNAL_H
#define AP_ONNX_INTERNAL_H

#include "ops_internal.h"
#include "proto/onnx.pb-c.h"

/* Converts a decoded onnx.TensorProto into a host tensor (copying its data).
 * Errors as ap_onnx_tensor_decode; `what` names the tensor in messages
 * when the proto has no name. */
__ap_give ap_host_tensor *ap__onnx_tensor_from_proto(const Onnx__TensorProto *tp,
						   const char *what, ap_error *err);

/* Whether a TensorProto keeps its data in an external file (data_location
 * EXTERNAL, or external_data entries). */
bool ap__onnx_is_external(const Onnx__TensorProto *tp);

/* The data of a tensor kept in an external file (onnx_external.c), read
 * from `model_dir` (NULL: refused) after the checks ap_onnx_import_dir
 * lists; *total counts the bytes read so far by this import and grows by
 * the tensor's.  Errors as ap_onnx_import_dir's, in `err` naming the
 * tensor (`what` when the proto has no name) and the file. */
__ap_give ap_host_tensor *ap__onnx_external_load(const Onnx__TensorProto *tp, const char *what,
						 const char *model_dir, uint64_t *total,
						 ap_error *err);

/* A host tensor of the given dtype and shape with zeroed data (numel 0:
 * data NULL).  NULL on ENOMEM or bad shape (checked: rank, dims >= 0,
 * element count within AP_MAX_ELEMENTS). */
__ap_give ap_host_tensor *ap__host_tensor_new(const char *name, ap_dtype dt, int rank,
					     const int64_t *dims);


#endif
