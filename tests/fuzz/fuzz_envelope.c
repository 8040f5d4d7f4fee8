/* fuzz_envelope.c -- libFuzzer harness: the bytes a client sends, as the
 * daemon reads them.  The input is a stream of frames (4-byte big-endian
 * length + payload, common/frame.h), each checked against a 1 MiB limit
 * and decoded as an apollo.Envelope within the daemon's decode budget;
 * a CompileRequest's Graph goes through ap_graph_from_pb, ap_graph_validate
 * and the cache key (ap_graph_hash_named, ap_compile_graph_key).
 *
 * Property (round trip): a graph that validates, encoded again with
 * ap_graph_to_pb, packed, unpacked and validated again, gives the same
 * structural hash and the same cache key.  A difference aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/frame.h"
#include "common/graph.h"
#include "common/pb_budget.h"
#include "proto/apollo.pb-c.h"
#include "server/compile/compile.h"

#define MAX_FRAME ((uint32_t)1 << 20)

static void key_of(const ap_graph *g, const Apollo__CompileRequest *req, uint8_t h[32],
		   uint8_t key[32])
{
	uint8_t named[32];

	if (ap_graph_hash(g, h) || ap_graph_hash_named(g, named)) {
		memset(key, 0, 32);
		return;
	}
	if (ap_compile_graph_key(named, "cpu", 3, req->options, "fuzz", key))
		memset(key, 0, 32);
}

static void one_graph(const Apollo__CompileRequest *req)
{
	ap_error err;
	ap_graph *g = ap_graph_from_pb(req->graph, &err), *g2;
	Apollo__Graph *pb, *back;
	uint8_t h1[32], k1[32], h2[32], k2[32], *buf;
	size_t len;

	if (!g)
		return;
	if (ap_graph_validate(g, &err)) {
		ap_graph_free(g);
		return;
	}
	key_of(g, req, h1, k1);
	pb = ap_graph_to_pb(g);
	if (!pb) {
		ap_graph_free(g);
		return;
	}
	len = apollo__graph__get_packed_size(pb);
	buf = malloc(len ? len : 1);
	apollo__graph__pack(pb, buf);
	ap_graph_pb_free(pb);
	back = apollo__graph__unpack(NULL, len, buf);
	free(buf);
	if (!back)
		abort();   /* what we packed must decode */
	g2 = ap_graph_from_pb(back, &err);
	apollo__graph__free_unpacked(back, NULL);
	if (!g2 || ap_graph_validate(g2, &err))
		abort();   /* a valid graph re-encoded must stay valid */
	key_of(g2, req, h2, k2);
	if (memcmp(h1, h2, 32) || memcmp(k1, k2, 32))
		abort();   /* ... and keep its hash and cache key */
	ap_graph_free(g2);
	ap_graph_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	while (size >= AP_FRAME_HEADER_BYTES) {
		uint32_t len = ap_frame_get_len(data);
		ap_pb_budget b;
		Apollo__Envelope *env;

		if (ap_frame_check_len(len, MAX_FRAME, NULL))
			return 0;
		data += AP_FRAME_HEADER_BYTES;
		size -= AP_FRAME_HEADER_BYTES;
		if (len > size)
			return 0;   /* truncated */
		ap_pb_budget_init(&b, ap_pb_decode_limit(len, 16, (size_t)4 << 20));
		env = apollo__envelope__unpack(&b.allocator, len, data);
		if (env && env->msg_case == APOLLO__ENVELOPE__MSG_COMPILE &&
		    env->compile->source_case == APOLLO__COMPILE_REQUEST__SOURCE_GRAPH)
			one_graph(env->compile);
		apollo__envelope__free_unpacked(env, NULL);
		data += len;
		size -= len;
	}
	return 0;
}
