/* fuzz_tensor.c -- libFuzzer harness: one ONNX TensorProto
 * (ap_onnx_tensor_decode: the input_K.pb / output_K.pb files, initializers,
 * Constant values).  A decoded tensor's buffer must be exactly
 * numel x dtype size. */
#include <stdint.h>
#include <stdlib.h>

#include "common/graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ap_error err;
	ap_host_tensor *t = ap_onnx_tensor_decode(data, size, &err);

	if (t) {
		ap_tensor shape = { .rank = t->rank };
		int64_t n;

		for (int i = 0; i < t->rank; i++)
			shape.dims[i] = t->dims[i];
		n = ap_tensor_numel(&shape);
		if (n < 0 || (size_t)n * ap_dtype_size(t->dtype) != t->nbytes)
			abort();
		if (t->nbytes)
			((volatile uint8_t *)t->data)[t->nbytes - 1] ^= 0;   /* all of it is there */
	}
	ap_host_tensor_free(t);
	return 0;
}
