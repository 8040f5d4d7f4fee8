/* onnx_import.c -- placeholder until the importer lands. */
#include "onnx_internal.h"

__ap_give ap_graph *ap_onnx_import(const uint8_t *buf, size_t len,
				   const ap_host_tensor *const *bindings, int n_bindings,
				   __ap_give ap_params **params, ap_error *err)
{
	if (params)
		*params = NULL;
	ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL, "ONNX import not yet implemented");
	return NULL;
}
