/* fuzz_onnx.c -- libFuzzer harness: ap_onnx_import as the client calls it.
 * With the parameter store (apollo-client run / check): when a graph comes
 * out it must validate and hash, and every PARAM must have its data in the
 * store.  From the structure alone (apollo-client submit: ap_onnx_skeleton
 * first): the same bytes must give the same graph, or fail where the full
 * import fails, and the skeleton is never longer than the model. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ap_params *params = NULL;
	ap_error err;
	ap_graph *g = ap_onnx_import(data, size, NULL, 0, &params, &err);
	ap_graph *s = ap_onnx_import(data, size, NULL, 0, NULL, &err);
	uint8_t h[32], hs[32], *sk = NULL;
	size_t sl = 0;

	if (ap_onnx_skeleton(data, size, &sk, &sl, &err) == 0 && sl > size)
		abort();
	free(sk);
	if (g) {
		if (ap_graph_validate(g, &err) || ap_graph_hash_named(g, h))
			abort();   /* the importer returns validated graphs */
		for (int t = 0; t < g->n_tensors; t++)
			if (g->tensors[t].kind == AP_TENSOR_PARAM &&
			    !ap_params_find(params, g->tensors[t].name))
				abort();
		/* out of memory aside, the structure alone gives the same graph */
		if (s && (ap_graph_hash_named(s, hs) || memcmp(h, hs, sizeof(h))))
			abort();
	}
	ap_graph_free(s);
	ap_graph_free(g);
	ap_params_free(params);
	return 0;
}
