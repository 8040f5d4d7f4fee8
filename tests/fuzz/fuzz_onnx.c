/* fuzz_onnx.c -- libFuzzer harness: ap_onnx_import as the client calls it
 * (apollo-client submit / check): the bytes as an ONNX ModelProto, with
 * the parameter store; when a graph comes out it must validate and hash,
 * and every PARAM must have its data in the store. */
#include <stdint.h>
#include <stdlib.h>

#include "common/graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ap_params *params = NULL;
	ap_error err;
	ap_graph *g = ap_onnx_import(data, size, NULL, 0, &params, &err);
	uint8_t h[32];

	if (g) {
		if (ap_graph_validate(g, &err) || ap_graph_hash_named(g, h))
			abort();   /* the importer returns validated graphs */
		for (int t = 0; t < g->n_tensors; t++)
			if (g->tensors[t].kind == AP_TENSOR_PARAM &&
			    !ap_params_find(params, g->tensors[t].name))
				abort();
	}
	ap_graph_free(g);
	ap_params_free(params);
	return 0;
}
