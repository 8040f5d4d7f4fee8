/* check_flight.c -- single-flight (server/compile/flight.c) and the
 * compile job's use of it (server/compile/compile.c): a flight's outcome
 * reaches every follower, an error too, a follower's deadline ends its
 * wait; eight threads compiling one cold graph at once compile its
 * kernels once and get the same bundle; two graphs that differ only in
 * names, compiled at once, compile their shared kernels once; a request
 * seen before is answered through the request memo, a warm answer holding
 * each blob once, by reference, its frame spliced from the stored bytes
 * byte for byte. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/apollo.h"
#include "common/graph.h"
#include "server/cache/cache.h"
#include "server/compile/compile.h"
#include "server/compile/flight.h"
#include "server/config.h"
#include "proto/apollo.pb-c.h"

static char dir[64];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/apollo-flight-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	ap_log_set_level(AP_LOG_ERROR);
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
}

/* ---- the table ----------------------------------------------------------- */

struct follower {
	pthread_t th;
	ap_flights *t;
	ap_flight *f;
	double deadline;
	int got, rc;
	uint8_t *data;
	size_t len;
	ap_error err;
};

static void *follower_main(void *arg)
{
	struct follower *w = arg;

	w->got = ap_flight_wait(w->t, w->f, w->deadline, &w->rc, &w->err, &w->data, &w->len);
	return NULL;
}

START_TEST(outcome_reaches_every_follower)
{
	ap_flights *t = ap_flights_new();
	struct follower w[4];
	ap_flight *lead = NULL;
	ap_flight_counts n;
	uint8_t key[32];
	char *bytes = strdup("the bundle");

	ap_sha256("k", 1, key);
	ck_assert_int_eq(ap_flight_join(t, key, &lead), AP_FLIGHT_LEAD);
	for (int i = 0; i < 4; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].t = t;
		w[i].deadline = ap_now_ms() + 10000;
		ck_assert_int_eq(ap_flight_join(t, key, &w[i].f), AP_FLIGHT_FOLLOW);
		pthread_create(&w[i].th, NULL, follower_main, &w[i]);
	}
	usleep(20000);
	ap_flights_get_counts(t, &n);
	ck_assert_uint_eq(n.led, 1);
	ck_assert_uint_eq(n.waiting, 4);
	ap_flight_finish(t, lead, 0, NULL, (uint8_t *)bytes, 10);
	for (int i = 0; i < 4; i++) {
		pthread_join(w[i].th, NULL);
		ck_assert_int_eq(w[i].got, 1);
		ck_assert_int_eq(w[i].rc, 0);
		ck_assert_uint_eq(w[i].len, 10);
		ck_assert_int_eq(memcmp(w[i].data, "the bundle", 10), 0);
		free(w[i].data);
	}
	/* the flight left the table: the next caller leads a new one */
	ck_assert_int_eq(ap_flight_join(t, key, &lead), AP_FLIGHT_LEAD);
	ap_flight_finish(t, lead, 0, NULL, NULL, 0);
	ap_flights_get_counts(t, &n);
	ck_assert_uint_eq(n.led, 2);
	ck_assert_uint_eq(n.followed, 4);
	ck_assert_uint_eq(n.waiting, 0);
	ap_flights_free(t);
}
END_TEST

START_TEST(error_and_deadline)
{
	ap_flights *t = ap_flights_new();
	struct follower w[2];
	ap_flight *lead = NULL;
	ap_flight_counts n;
	ap_error e;
	uint8_t key[32];
	double t0;

	ap_sha256("k", 1, key);
	ck_assert_int_eq(ap_flight_join(t, key, &lead), AP_FLIGHT_LEAD);
	for (int i = 0; i < 2; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].t = t;
		/* the first gives up after 50 ms, the second waits */
		w[i].deadline = ap_now_ms() + (i == 0 ? 50 : 10000);
		ck_assert_int_eq(ap_flight_join(t, key, &w[i].f), AP_FLIGHT_FOLLOW);
	}
	t0 = ap_now_ms();
	pthread_create(&w[0].th, NULL, follower_main, &w[0]);
	pthread_join(w[0].th, NULL);
	ck_assert_int_eq(w[0].got, 0);
	ck_assert_double_ge(ap_now_ms() - t0, 45);
	pthread_create(&w[1].th, NULL, follower_main, &w[1]);
	ap_flight_finish(t, lead, ap_error_set(&e, AP_ECOMPILE, "n1", NULL, "does not compile"), &e,
			 NULL, 0);
	pthread_join(w[1].th, NULL);
	ck_assert_int_eq(w[1].got, 1);
	ck_assert_int_eq(w[1].rc, AP_ECOMPILE);
	ck_assert_str_eq(w[1].err.msg, "does not compile");
	ck_assert_str_eq(w[1].err.node, "n1");
	ck_assert_ptr_null(w[1].data);
	ap_flights_get_counts(t, &n);
	ck_assert_uint_eq(n.timeouts, 1);
	ck_assert_uint_eq(n.followed, 1);
	ap_flights_free(t);
}
END_TEST

/* ---- the compile job --------------------------------------------------------- */

static Apollo__Graph *model_pb(const char *rel, const char *rename_suffix)
{
	const char *td = getenv("APOLLO_TESTDATA");
	char path[1024];
	FILE *f;
	uint8_t *buf;
	long n;
	ap_graph *g;
	ap_error err;
	Apollo__Graph *pb;

	snprintf(path, sizeof(path), "%s/%s/model.onnx", td && *td ? td : "../shared/testdata", rel);
	f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "no test data %s (set APOLLO_TESTDATA)", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n);
	ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	g = ap_onnx_import(buf, (size_t)n, NULL, 0, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	free(buf);
	if (rename_suffix) {   /* other names, the same computation */
		for (int i = 0; i < g->n_tensors; i++) {
			char *nm = malloc(strlen(g->tensors[i].name) + strlen(rename_suffix) + 1);

			strcpy(nm, g->tensors[i].name);
			strcat(nm, rename_suffix);
			free(g->tensors[i].name);
			g->tensors[i].name = nm;
		}
	}
	pb = ap_graph_to_pb(g);
	ap_graph_free(g);
	ck_assert_ptr_nonnull(pb);
	return pb;
}

struct submitter {
	pthread_t th;
	ap_compiler *c;
	Apollo__Graph *g;
	pthread_barrier_t *start;
	Apollo__CompileResponse *r;
};

static void *submit_main(void *arg)
{
	struct submitter *s = arg;
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;

	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = s->g;
	req.target = "cpu";
	pthread_barrier_wait(s->start);
	s->r = ap_compile_run(s->c, &req);
	return NULL;
}

/* A bundle as text: kernels (name, digest) and the plan, not the stats. */
static char *bundle_text(const Apollo__CompileResponse *r)
{
	char *t = calloc(1, 1 << 16), hex[65];
	size_t used = 0;
	const Apollo__Bundle *b;

	ck_assert_ptr_nonnull(r);
	ck_assert_msg(r->result_case == APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE, "%s",
		      r->result_case == APOLLO__COMPILE_RESPONSE__RESULT_ERROR ? r->error->message : "?");
	b = r->bundle;
	for (size_t k = 0; k < b->n_kernels; k++) {
		ck_assert_uint_eq(b->kernels[k]->digest.len, 32);
		ck_assert_ptr_nonnull(ap_bundle_pb_kernel_blob(b, k));   /* own or shared */
		ck_assert_uint_gt(ap_bundle_pb_kernel_blob(b, k)->len, 0);
		ap_hex(b->kernels[k]->digest.data, 32, hex);
		used += (size_t)snprintf(t + used, (1 << 16) - used, "%s %s\n", b->kernels[k]->name, hex);
	}
	for (size_t l = 0; l < b->n_plan; l++) {
		used += (size_t)snprintf(t + used, (1 << 16) - used, "launch %u:", b->plan[l]->kernel);
		for (size_t a = 0; a < b->plan[l]->n_args; a++)
			used += (size_t)snprintf(t + used, (1 << 16) - used, " %u", b->plan[l]->args[a]);
		used += (size_t)snprintf(t + used, (1 << 16) - used, "\n");
	}
	return t;
}

static ap_compiler *compiler(ap_cache **cache, unsigned threads)
{
	char path[128];
	ap_compiler_options co = { .threads = threads };
	ap_compiler *c;
	ap_error err;

	snprintf(path, sizeof(path), "%s/cache.db", dir);
	ck_assert_int_eq(ap_cache_open(path, cache, &err), 0);
	c = ap_compiler_new(*cache, &co);
	ck_assert_ptr_nonnull(c);
	return c;
}

/* Eight requests for one cold graph at once: one compile of each kernel,
 * one bundle for all. */
START_TEST(eight_identical_requests)
{
	ap_cache *cache;
	ap_compiler *c = compiler(&cache, 2);
	Apollo__Graph *g = model_pb("models/mlp_gelu_ln", NULL);
	struct submitter s[8];
	pthread_barrier_t start;
	ap_compile_counters n;
	char *first = NULL;
	unsigned distinct = 0;

	pthread_barrier_init(&start, NULL, 8);
	for (int i = 0; i < 8; i++) {
		s[i] = (struct submitter){ .c = c, .g = g, .start = &start };
		pthread_create(&s[i].th, NULL, submit_main, &s[i]);
	}
	for (int i = 0; i < 8; i++) {
		char *t;

		pthread_join(s[i].th, NULL);
		t = bundle_text(s[i].r);
		if (!first) {
			first = t;
			distinct = (unsigned)s[i].r->bundle->n_kernels;
		} else {
			ck_assert_str_eq(t, first);
			free(t);
		}
		ap_compile_response_free(s[i].r);
	}
	ap_compiler_get_counters(c, &n);
	ck_assert_uint_gt(distinct, 0);
	ck_assert_uint_eq(n.kernels_compiled, distinct);
	ck_assert_uint_eq(n.tier[APOLLO__CACHE_TIER__CACHE_COMPILED], 1);
	ck_assert_uint_eq(n.tier[APOLLO__CACHE_TIER__CACHE_SHARED] + n.tier[APOLLO__CACHE_TIER__CACHE_L1],
			  7);
	ck_assert_uint_gt(n.tier[APOLLO__CACHE_TIER__CACHE_SHARED], 0);   /* they overlapped */
	printf("eight_identical_requests: %u kernels compiled once; %llu answers shared, %llu "
	       "from L1\n", distinct, (unsigned long long)n.tier[APOLLO__CACHE_TIER__CACHE_SHARED],
	       (unsigned long long)n.tier[APOLLO__CACHE_TIER__CACHE_L1]);
	free(first);
	pthread_barrier_destroy(&start);
	ap_graph_pb_free(g);
	ap_compiler_free(c);
	ap_cache_free(cache);
}
END_TEST

/* Two graphs that differ only in names (two cache entries) share every
 * kernel: compiled at once, each kernel is compiled once. */
START_TEST(kernels_shared_across_graphs)
{
	ap_cache *cache;
	ap_compiler *c = compiler(&cache, 2);
	Apollo__Graph *g[2] = { model_pb("models/mlp_gelu_ln", NULL),
				model_pb("models/mlp_gelu_ln", "_renamed") };
	struct submitter s[2];
	pthread_barrier_t start;
	ap_compile_counters n;
	unsigned distinct = 0;

	pthread_barrier_init(&start, NULL, 2);
	for (int i = 0; i < 2; i++) {
		s[i] = (struct submitter){ .c = c, .g = g[i], .start = &start };
		pthread_create(&s[i].th, NULL, submit_main, &s[i]);
	}
	for (int i = 0; i < 2; i++) {
		pthread_join(s[i].th, NULL);
		free(bundle_text(s[i].r));
		ck_assert(!s[i].r->bundle->stats->cache_hit);   /* two entries, both compiled */
		distinct = (unsigned)s[i].r->bundle->n_kernels;
		ap_compile_response_free(s[i].r);
	}
	ap_compiler_get_counters(c, &n);
	ck_assert_uint_eq(n.tier[APOLLO__CACHE_TIER__CACHE_COMPILED], 2);
	ck_assert_uint_eq(n.kernels_compiled, distinct);
	ck_assert_uint_eq(n.kernel_tier[APOLLO__CACHE_TIER__CACHE_COMPILED], distinct);
	ck_assert_uint_eq(n.kernel_tier[APOLLO__CACHE_TIER__CACHE_SHARED] +
			  n.kernel_tier[APOLLO__CACHE_TIER__CACHE_L1], distinct);
	printf("kernels_shared_across_graphs: %u kernels; the second graph took %llu from a flight, "
	       "%llu from L1\n", distinct,
	       (unsigned long long)n.kernel_tier[APOLLO__CACHE_TIER__CACHE_SHARED],
	       (unsigned long long)n.kernel_tier[APOLLO__CACHE_TIER__CACHE_L1]);
	pthread_barrier_destroy(&start);
	ap_graph_pb_free(g[0]);
	ap_graph_pb_free(g[1]);
	ap_compiler_free(c);
	ap_cache_free(cache);
}
END_TEST

/* A request whose digest was seen is answered without its graph; the memo
 * is keyed by the digest alone, so another digest misses it. */
START_TEST(request_memo)
{
	ap_cache *cache;
	ap_compiler *c = compiler(&cache, 1);
	Apollo__Graph *g = model_pb("models/mlp_gelu_ln", NULL);
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__CompileResponse *r;
	ap_compile_counters n;
	uint8_t d[32], d2[32];
	char *ref, *t;

	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = g;
	req.target = "cpu";
	ap_sha256("request bytes", 13, d);
	ap_sha256("other bytes", 11, d2);
	r = ap_compile_run_digest(c, &req, d);
	ref = bundle_text(r);
	ap_compile_response_free(r);
	r = ap_compile_run_digest(c, &req, d);      /* the memo answers */
	t = bundle_text(r);
	ck_assert_str_eq(t, ref);
	ck_assert(r->bundle->stats->cache_hit);
	ck_assert_int_eq(r->bundle->stats->cache_tier, APOLLO__CACHE_TIER__CACHE_L1);
	free(t);
	ap_compile_response_free(r);
	ap_compiler_get_counters(c, &n);
	ck_assert_uint_eq(n.memo_hits, 1);
	/* the memo never answers for a request it did not see: without the
	 * graph this one would fail, with it it is a plain L1 hit */
	req.graph = NULL;
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE__NOT_SET;
	r = ap_compile_run_digest(c, &req, d2);
	ck_assert_int_eq(r->result_case, APOLLO__COMPILE_RESPONSE__RESULT_ERROR);
	ap_compile_response_free(r);
	ap_compiler_get_counters(c, &n);
	ck_assert_uint_eq(n.memo_hits, 1);
	ck_assert_uint_eq(n.errors_by_code[-AP_EMESSAGE], 1);
	free(ref);
	ap_graph_pb_free(g);
	ap_compiler_free(c);
	ap_cache_free(cache);
}
END_TEST

/* The frame of an Envelope {id, compiled = r}, packed as apollod sends
 * it (malloc'd, *len bytes). */
static uint8_t *frame_of(Apollo__CompileResponse *r, uint64_t id, size_t *len)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	uint8_t *f;

	env.id = id;
	env.msg_case = APOLLO__ENVELOPE__MSG_COMPILED;
	env.compiled = r;
	*len = 4 + apollo__envelope__get_packed_size(&env);
	f = malloc(*len);
	ck_assert_ptr_nonnull(f);
	f[0] = (uint8_t)((*len - 4) >> 24);
	f[1] = (uint8_t)((*len - 4) >> 16);
	f[2] = (uint8_t)((*len - 4) >> 8);
	f[3] = (uint8_t)(*len - 4);
	apollo__envelope__pack(&env, f + 4);
	return f;
}

/* Stores n blobs of `size` bytes and reads each back once (through the
 * memory tier, which keeps what fits and evicts the rest). */
static void read_through(ap_cache *cache, int n, size_t size)
{
	uint8_t *buf = malloc(size), d[32];

	ck_assert_ptr_nonnull(buf);
	for (int i = 0; i < n; i++) {
		ap_blob *x = NULL;

		memset(buf, i + 1, size);
		ck_assert_int_eq(ap_cache_blob_put(cache, buf, size, d), 0);
		ck_assert_int_eq(ap_cache_blob_ref(cache, d, &x), 1);
		ap_blob_release(x);
	}
	free(buf);
}

/* Issue 26, item 2: kernels compiled as one program share one blob, and a
 * warm answer holds it once.  With one compile worker all of
 * mlp_gelu_ln's kernels are one program: the warm bundle carries the blob
 * in its first kernel only (the others blob_of 1), that blob is the
 * memory tier's (pointer identity) and no blob was made or copied to
 * answer; the spliced frame (ap_compile_run_frame) is byte for byte the
 * decoded answer packed, and both are the cold answer's bundle (stats
 * aside); a warm answer still held while the memory tier evicts its blob
 * packs to the same bytes. */
START_TEST(warm_answer_holds_one_copy)
{
	ap_cache *cache;
	ap_compiler *c = compiler(&cache, 1);
	Apollo__Graph *g = model_pb("models/mlp_gelu_ln", NULL);
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__CompileResponse *cold, *warm, *held;
	Apollo__Envelope *spliced;
	Apollo__Stats *cold_stats;
	ap_blob_counts b0, b1;
	ap_blob *tier = NULL;
	uint8_t d[32], *f1, *f2, *f3;
	size_t n1, n2, n3;
	bool bundle = false;

	ap_cache_set_limits(cache, 0, 1 << 20);
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = g;
	req.target = "cpu";
	ap_sha256("request bytes", 13, d);
	cold = ap_compile_run_digest(c, &req, d);
	free(bundle_text(cold));
	ck_assert_uint_gt(cold->bundle->n_kernels, 2);
	warm = ap_compile_run_digest(c, &req, d);   /* the blob into the tier */
	ap_compile_response_free(warm);

	ap__blob_get_counts(&b0);
	warm = ap_compile_run_digest(c, &req, d);
	ap__blob_get_counts(&b1);
	ck_assert(warm->bundle->stats->cache_hit);
	ck_assert_uint_eq(b1.made, b0.made);                 /* nothing copied */
	ck_assert_uint_eq(b1.bytes_copied, b0.bytes_copied);
	ck_assert_uint_gt(warm->bundle->kernels[0]->blob.len, 0);
	ck_assert_uint_eq(warm->bundle->kernels[0]->blob_of, 0);
	for (size_t k = 1; k < warm->bundle->n_kernels; k++) {
		ck_assert_uint_eq(warm->bundle->kernels[k]->blob.len, 0);
		ck_assert_uint_eq(warm->bundle->kernels[k]->blob_of, 1);
	}
	ck_assert_int_eq(ap_cache_blob_ref(cache, warm->bundle->kernels[0]->digest.data, &tier), 1);
	ck_assert_ptr_eq(ap_blob_data(tier), warm->bundle->kernels[0]->blob.data);
	ap_blob_release(tier);

	/* the spliced frame: the same bytes, its stats' times aside */
	f1 = ap_compile_run_frame(c, &req, d, NULL, 77, &n1, &bundle);
	ap__blob_get_counts(&b0);
	ck_assert_uint_eq(b0.made, b1.made);
	ck_assert_ptr_nonnull(f1);
	ck_assert(bundle);
	spliced = apollo__envelope__unpack(NULL, n1 - 4, f1 + 4);
	ck_assert_ptr_nonnull(spliced);
	ck_assert_uint_eq(spliced->id, 77);
	warm->bundle->stats->cache_ms = spliced->compiled->bundle->stats->cache_ms;
	warm->bundle->stats->compile_ms = spliced->compiled->bundle->stats->compile_ms;
	f2 = frame_of(warm, 77, &n2);
	ck_assert_uint_eq(n1, n2);
	ck_assert_int_eq(memcmp(f1, f2, n1), 0);
	/* the cold answer's bundle with the warm stats: the same bytes again */
	cold_stats = cold->bundle->stats;
	cold->bundle->stats = warm->bundle->stats;
	f3 = frame_of(cold, 77, &n3);
	cold->bundle->stats = cold_stats;
	ck_assert_uint_eq(n3, n2);
	ck_assert_int_eq(memcmp(f3, f2, n2), 0);
	free(f3);

	/* held across eviction: 2 MiB of other blobs read through the 1 MiB
	 * tier take its entry, the answer's reference keeps the blob whole,
	 * and giving the answer back frees it (the last reference) */
	held = warm;
	ck_assert_uint_lt(held->bundle->kernels[0]->blob.len, 1 << 19);
	read_through(cache, 64, 32768);
	f3 = frame_of(held, 77, &n3);
	ck_assert_uint_eq(n3, n2);
	ck_assert_int_eq(memcmp(f3, f2, n2), 0);
	free(f3);
	ap__blob_get_counts(&b0);
	ap_compile_response_free(held);
	ap__blob_get_counts(&b1);
	ck_assert_uint_eq(b1.alive + 1, b0.alive);
	apollo__envelope__free_unpacked(spliced, NULL);
	free(f1);
	free(f2);
	ap_compile_response_free(cold);
	ap_graph_pb_free(g);
	ap_compiler_free(c);
	ap_cache_free(cache);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("flight");
	TCase *tc = tcase_create("flight");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, outcome_reaches_every_follower);
	tcase_add_test(tc, error_and_deadline);
	tcase_add_test(tc, eight_identical_requests);
	tcase_add_test(tc, kernels_shared_across_graphs);
	tcase_add_test(tc, request_memo);
	tcase_add_test(tc, warm_answer_holds_one_copy);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
