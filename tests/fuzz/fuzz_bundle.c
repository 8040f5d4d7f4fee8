/* fuzz_bundle.c -- libFuzzer harness: a bundle as the client and the
 * runtime read it (apollo-client submit -o / check, libapollo-client):
 * ap_bundle_unpack, every accessor, the JSON and text reports (with
 * --explain), and ap_runtime_check, everything ap_runtime_new verifies
 * before it loads a kernel, blob digests included.  Nothing is loaded: a
 * self-consistent bundle is native code by design (and libFuzzer, which
 * watches memcmp, soon learns to write the digest of a mutated blob). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "client/apollo.h"
#include "client/runtime.h"
#include "client/tool.h"

static FILE *sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ap_error err;
	ap_bundle *b = ap_bundle_unpack(data, size, &err);
	ap_report_info info = { .model = "fuzz", .explain = true };

	if (!b)
		return 0;
	if (!sink)
		sink = fopen("/dev/null", "w");
	for (int k = 0; k < ap_bundle_n_kernels(b); k++) {
		ap_bundle_kernel kk;
		ap_bundle_param p;

		if (ap_bundle_kernel_get(b, k, &kk) == 0)
			for (int i = 0; i < kk.n_params; i++)
				ap_bundle_kernel_param(b, k, i, &p);
	}
	for (int i = 0; i < ap_bundle_n_buffers(b); i++) {
		ap_bundle_buffer bf;
		ap_bundle_buffer_get(b, i, &bf);
	}
	ap_report_json(sink, b, &info);
	ap_report_text(sink, b, &info);
	(void)ap_runtime_check(b, &err);
	ap_bundle_free(b);
	return 0;
}
