/* fuzz_compile.c -- libFuzzer harness: the compile job up to the kernel IR.
 * The input is one Envelope payload; a CompileRequest (a Graph, or an ONNX
 * model with bindings, as `apollo-client submit --daemon-import` sends it)
 * goes through ap_compile_run exactly as on a worker thread: target and
 * options, bindings, graph decoding or the daemon-side ONNX import,
 * validation, keys, then ap_program_build (expansion, partition, lowering
 * to the kernel IR, both printers, plan).  The compiler is created with
 * stop_before_backend, so no C compiler or NVRTC runs, and without a
 * cache. */
#include <stdint.h>
#include <stdlib.h>

#include "common/pb_budget.h"
#include "proto/apollo.pb-c.h"
#include "server/cache/cache.h"
#include "server/compile/compile.h"
#include "server/config.h"

static ap_compiler *compiler;
static ap_cache *cache;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ap_pb_budget b;
	Apollo__Envelope *env;

	if (!compiler) {
		ap_compiler_options o = { .threads = 1, .stop_before_backend = true };
		ap_error err;

		ap_log_set_level(AP_LOG_ERROR);
		ap_cache_open("off", &cache, &err);
		compiler = ap_compiler_new(cache, &o);
		if (!compiler)
			abort();
	}
	ap_pb_budget_init(&b, ap_pb_decode_limit(size, 16, (size_t)4 << 20));
	env = apollo__envelope__unpack(&b.allocator, size, data);
	if (env && env->msg_case == APOLLO__ENVELOPE__MSG_COMPILE) {
		Apollo__CompileResponse *r = ap_compile_run(compiler, env->compile);
		if (!r)
			abort();   /* only when out of memory */
		ap_compile_response_free(r);
	}
	apollo__envelope__free_unpacked(env, NULL);
	return 0;
}
