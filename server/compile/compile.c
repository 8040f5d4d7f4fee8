/* compile.c -- the compile job (see compile.h): request -> graph -> cache
 * -> program -> backend -> bundle.
 *
 * Approach: the job is a straight line; each step either fills the next
 * structure or stops with an ap_error, which becomes the reply's Error.
 * Every protobuf message of the reply is allocated with malloc, field by
 * field, exactly as protobuf-c's unpacker would, so one call to
 * apollo__compile_response__free_unpacked() frees a fresh reply and a reply
 * rebuilt from the cache alike.
 *
 * Cache keys hash inputs only (DESIGN.md): NVRTC output is not
 * reproducible, so a key never depends on a compiled byte.  The stored
 * bundle has its kernel blobs replaced by their digests; blobs live once in
 * the content-addressed table, shared by every bundle and kernel key that
 * names them, and are verified on every read.
 *
 * Kernels of one request are compiled in parallel, and in few programs:
 * NVRTC and cc cost tens of milliseconds per program before the first
 * kernel (headers, start-up), and the kernels of one program are
 * independent.  The compiler owns `threads - 1` helper threads, started
 * once; a request first looks up every kernel (caches, flights), then
 * deals the kernels it must compile to one translation unit per worker
 * (the printers guard what kernels share), runs one backend compile per
 * group -- its worker and the helpers each taking groups, so it never
 * waits on helpers busy elsewhere -- and gives every kernel of a group the
 * group's blob, found by entry name.  A blob is stored once
 * (content-addressed in L1; by digest in L2) and carried once per bundle
 * (Kernel.blob_of).  A group the backend rejects is compiled kernel by
 * kernel, so the rejection names its kernel.
 *
 * Backend refusals (upward feedback, issue 3): a kernel NVRTC or cc
 * rejects (AP_ECOMPILE) does not fail the request.  The parallel round
 * still compiles every other kernel; then the program is built again with
 * a backend hook (ap_build_options.accept_kernel) that answers from the
 * blobs of that round by kernel name and compiles only new kernels (the
 * halves of split groups), so a fused group the backend rejects is split
 * and no kernel is compiled twice.  Only a single-node kernel that does
 * not compile fails the request.  Test hook:
 * $APOLLO_TEST_REFUSE_KERNEL_NODES=N (read once, when the compiler is
 * created) makes the backend reject every kernel of more than N member
 * nodes (an #error line after its source: NVRTC or cc rejects it, and the
 * program it is in, for real), as $APOLLO_TEST_COMPILE_DELAY_MS=MS delays
 * every request.
 *
 * Cache tiers (issue 10): L1 is the SQLite file (cache.h), L2 the shared
 * Redis (redis.h).  A request looks in L1, then L2; an L2 hit (the
 * stripped bundle and its blobs, signed; every blob checked against the
 * digest its kernel names, once) is copied into L1 with those digests, so
 * nothing is hashed twice.  A bundle compiled here goes to L1 and, with
 * its blobs, to L2; each kernel compiled here goes to both too.  Kernels
 * look in L1, then L2, before compiling.
 *
 * Single-flight (flight.h): after missing both tiers a request joins the
 * flight of its graph key.  The leader looks in L1 once more (a flight may
 * have finished between its miss and its join), compiles, stores, and
 * publishes the whole bundle packed; followers unpack their own copy
 * (cache_tier SHARED).  A follower whose wait (flight_wait_ms from its
 * arrival) runs out compiles by itself.  Kernels have flights of their own
 * by kernel key, so two different graphs needing one missing kernel
 * compile it once; a kernel flight publishes the digest and the blob.
 * no_cache requests take part in neither.
 *
 * Warm path: the daemon remembers, for the digest of a request's bytes
 * (net.c), the graph key it computed (a direct-mapped table of MEMO_SLOTS
 * entries, last writer wins).  A request seen before goes straight to the
 * cache tiers with that key; only a miss decodes, validates and hashes its
 * graph.  The key is a function of the request bytes and this build, so
 * the memo needs no invalidation.
 */
#include "compile.h"
#include "autotune.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../common/graph.h"
#include "../backend/backend.h"
#include "../cache/redis.h"
#include "../config.h"
#include "../plan/program.h"
#include "../tune/tune.h"
#include "flight.h"
#include "proto/apollo.pb-c.h"

struct task_batch;

#define MEMO_SLOTS 4096
#define DEVICES_SEEN 256     /* (device, client) pairs remembered for reports */
#define TRUSTED_REPORTER "apollod"   /* the background tuner's reports */

/* A device a client named in a CompileRequest (DeviceInfo): only such a
 * device can be the subject of that client's tuning reports. */
struct device_seen {
	char device[160];        /* "NAME|SMS" */
	char client[64];         /* "uid:N", "tcp:ADDR" */
	double last_ms;          /* 0: unused */
};
#define DEFAULT_FLIGHT_WAIT_MS 600000

/* Request digest -> graph key (see the file comment). */
struct memo_slot {
	bool used;
	uint8_t digest[32], key[32];
};

const double ap_compile_bucket_s[AP_COMPILE_BUCKETS] = {
	0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
};

struct ap_compiler {
	ap_cache *cache;
	unsigned threads;
	/* Helper threads for the kernels of a request (see compile_kernels). */
	pthread_mutex_t mu;
	pthread_cond_t work;
	struct task_batch *queue;     /* batches with tasks not yet taken */
	bool stop;
	unsigned n_helpers;
	pthread_t *helpers;
	unsigned delay_ms;       /* $APOLLO_TEST_COMPILE_DELAY_MS: tests only */
	bool stop_before_backend;   /* tests and fuzzing only (compile.h) */
	unsigned refuse_nodes;   /* $APOLLO_TEST_REFUSE_KERNEL_NODES: tests only */
	char cc_id[256];
	char nvrtc_id[64];
	char build_id[64];       /* "apollod 0.1.0 exe <sha256 prefix>" */
	ap_redis *redis;         /* L2; NULL: none */
	ap_flights *flights;     /* requests by graph key; NULL: no single-flight */
	ap_flights *kflights;    /* kernels by kernel key */
	unsigned flight_wait_ms;
	unsigned tune_budget_evals;   /* per request; 0: no search */
	double tune_budget_ms;   /* per request, the safety limit; 0: none */
	ap_autotune *autotune;   /* the background tuner; NULL: none */
	pthread_mutex_t memo_mu;
	struct memo_slot *memo;  /* MEMO_SLOTS */
	atomic_uint_fast64_t requests, errors, hits, misses, kernels_compiled, memo_hits;
	atomic_uint_fast64_t tier[4], kernel_tier[4], errors_by_code[16];
	atomic_uint_fast64_t tune_hits, tune_measured, tune_searched, tune_tried, tune_us;
	atomic_uint_fast64_t tune_reports, tune_measurements, tune_records, tune_pending;
	char tune_reporters[256];   /* who may send tuning reports (compile.h) */
	pthread_mutex_t devices_mu;
	struct device_seen *devices;   /* DEVICES_SEEN: GPUs clients named, newest kept */
	pthread_mutex_t hist_mu;
	uint64_t hist[AP_COMPILE_BUCKETS + 1];
	double hist_sum;
};

/* ---- set-up -------------------------------------------------------------- */

/* "cc <first line of `$APOLLO_CC --version`>", or "cc unknown". */
static void host_cc_identity(char *buf, size_t cap)
{
	const char *cc = getenv("APOLLO_CC");
	char cmd[512], line[200] = "";
	FILE *p;

	if (!cc || !*cc)
		cc = "cc";
	snprintf(cmd, sizeof(cmd), "%s --version 2>/dev/null", cc);
	p = popen(cmd, "r");
	if (p) {
		if (!fgets(line, sizeof(line), p))
			line[0] = '\0';
		while (fgetc(p) != EOF)
			;
		pclose(p);
	}
	line[strcspn(line, "\r\n")] = '\0';
	snprintf(buf, cap, "cc %s: %s", cc, line[0] ? line : "unknown");
}

static void *helper_main(void *arg);

/* Identifies this very build: AP_VERSION and a hash of the executable, so
 * that a rebuilt daemon never answers with bundles an older build made
 * (during development AP_VERSION stays the same across changes). */
static void build_identity(char *buf, size_t cap)
{
	FILE *f = fopen("/proc/self/exe", "rb");
	ap_sha256_ctx *h = f ? ap_sha256_new() : NULL;
	char hex[65] = "unknown";

	if (h) {
		uint8_t chunk[65536], d[32];
		size_t n;

		while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
			ap_sha256_update(h, chunk, n);
		ap_sha256_final(h, d);
		ap_hex(d, 8, hex);
	}
	if (f)
		fclose(f);
	snprintf(buf, cap, "apollod %s exe %s", AP_VERSION, hex);
}

ap_compiler *ap_compiler_new(ap_cache *cache, const ap_compiler_options *opt)
{
	ap_compiler *c = calloc(1, sizeof(*c));
	const char *delay = getenv("APOLLO_TEST_COMPILE_DELAY_MS");
	const char *refuse = getenv("APOLLO_TEST_REFUSE_KERNEL_NODES");
	const char *nv;

	if (!c)
		return NULL;
	c->cache = cache;
	c->redis = opt ? opt->redis : NULL;
	c->flight_wait_ms = opt && opt->flight_wait_ms ? opt->flight_wait_ms : DEFAULT_FLIGHT_WAIT_MS;
	c->tune_budget_evals = !opt || !opt->tune_budget_evals ? AP_TUNE_BUDGET_EVALS
			       : opt->tune_budget_evals < 0 ? 0
			       : opt->tune_budget_evals > UINT_MAX ? UINT_MAX
			       : (unsigned)opt->tune_budget_evals;
	c->tune_budget_ms = !opt || !opt->tune_budget_ms ? AP_TUNE_BUDGET_MS
			    : opt->tune_budget_ms < 0 ? 0 : opt->tune_budget_ms;
	pthread_mutex_init(&c->memo_mu, NULL);
	pthread_mutex_init(&c->hist_mu, NULL);
	pthread_mutex_init(&c->devices_mu, NULL);
	c->memo = calloc(MEMO_SLOTS, sizeof(*c->memo));
	c->devices = calloc(DEVICES_SEEN, sizeof(*c->devices));
	snprintf(c->tune_reporters, sizeof(c->tune_reporters), "%s",
		 opt && opt->tune_reporters && *opt->tune_reporters ? opt->tune_reporters : "any");
	if (!(opt && opt->no_flight)) {
		c->flights = ap_flights_new();
		c->kflights = ap_flights_new();
	}
	c->threads = opt && opt->threads ? opt->threads : 1;
	c->stop_before_backend = opt && opt->stop_before_backend;
	if (c->threads > 256)
		c->threads = 256;
	if (delay && *delay)
		c->delay_ms = (unsigned)strtoul(delay, NULL, 10);
	if (refuse && *refuse)
		c->refuse_nodes = (unsigned)strtoul(refuse, NULL, 10);
	host_cc_identity(c->cc_id, sizeof(c->cc_id));
	build_identity(c->build_id, sizeof(c->build_id));
	nv = ap_nvrtc_version();
	snprintf(c->nvrtc_id, sizeof(c->nvrtc_id), "nvrtc %s", nv ? nv : "none");
	/* libcrypto initialises itself on first use and keeps that thread's
	 * state until exit: let that be this (long-lived) thread. */
	{
		uint8_t d[32];
		ap_sha256("", 0, d);
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->work, NULL);
	c->helpers = calloc(c->threads, sizeof(pthread_t));
	if (!c->helpers || !c->memo || !c->devices ||
	    (!(opt && opt->no_flight) && (!c->flights || !c->kflights)))
		return ap_compiler_free(c);
	for (unsigned t = 1; t < c->threads; t++) {
		if (pthread_create(&c->helpers[c->n_helpers], NULL, helper_main, c))
			break;   /* fewer helpers: slower, still correct */
		c->n_helpers++;
	}
	if (opt && (opt->autotune.refine || opt->autotune.measure) &&
	    !(c->autotune = ap_autotune_new(c, &opt->autotune)))
		ap_log(AP_LOG_WARN, "no background tuner: searched kernels keep the model's records");
	return c;
}

ap_compiler *ap_compiler_free(ap_compiler *c)
{
	if (!c)
		return NULL;
	c->autotune = ap_autotune_free(c->autotune);   /* it compiles through c */
	pthread_mutex_lock(&c->mu);
	c->stop = true;
	pthread_cond_broadcast(&c->work);
	pthread_mutex_unlock(&c->mu);
	for (unsigned t = 0; t < c->n_helpers; t++)
		pthread_join(c->helpers[t], NULL);
	free(c->helpers);
	pthread_cond_destroy(&c->work);
	pthread_mutex_destroy(&c->mu);
	ap_flights_free(c->flights);
	ap_flights_free(c->kflights);
	free(c->memo);
	free(c->devices);
	pthread_mutex_destroy(&c->devices_mu);
	pthread_mutex_destroy(&c->memo_mu);
	pthread_mutex_destroy(&c->hist_mu);
	free(c);
	return NULL;
}

const char *ap_compiler_backend_id(const ap_compiler *c, bool gpu)
{
	return gpu ? c->nvrtc_id : c->cc_id;
}

void ap_compiler_get_counters(const ap_compiler *c, ap_compile_counters *out)
{
	ap_compiler *m = (ap_compiler *)c;

	memset(out, 0, sizeof(*out));
	if (!c)
		return;
	out->requests = atomic_load(&m->requests);
	out->errors = atomic_load(&m->errors);
	out->cache_hits = atomic_load(&m->hits);
	out->cache_misses = atomic_load(&m->misses);
	out->kernels_compiled = atomic_load(&m->kernels_compiled);
	out->memo_hits = atomic_load(&m->memo_hits);
	out->tune_hits = atomic_load(&m->tune_hits);
	out->tune_measured = atomic_load(&m->tune_measured);
	out->tune_searched = atomic_load(&m->tune_searched);
	out->tune_tried = atomic_load(&m->tune_tried);
	out->tune_s = (double)atomic_load(&m->tune_us) / 1e6;
	out->tune_reports = atomic_load(&m->tune_reports);
	out->tune_measurements = atomic_load(&m->tune_measurements);
	out->tune_records = atomic_load(&m->tune_records);
	out->tune_pending = atomic_load(&m->tune_pending);
	for (int i = 0; i < 4; i++) {
		out->tier[i] = atomic_load(&m->tier[i]);
		out->kernel_tier[i] = atomic_load(&m->kernel_tier[i]);
	}
	for (int i = 0; i < 16; i++)
		out->errors_by_code[i] = atomic_load(&m->errors_by_code[i]);
	if (m->autotune)
		ap_autotune_get_counters(m->autotune, &out->autotune);
	for (int i = 0; i < 2; i++) {
		ap_flight_counts f;

		ap_flights_get_counts(i ? m->kflights : m->flights, &f);
		out->flight_timeouts += f.timeouts;
		out->flight_waiting += f.waiting;
	}
	pthread_mutex_lock(&m->hist_mu);
	memcpy(out->compile_hist, m->hist, sizeof(out->compile_hist));
	out->compile_sum_s = m->hist_sum;
	pthread_mutex_unlock(&m->hist_mu);
}

struct ap_redis *ap_compiler_redis(const ap_compiler *c)
{
	return c ? c->redis : NULL;
}

ap_cache *ap_compiler_cache(const ap_compiler *c)
{
	return c ? c->cache : NULL;
}

ap_autotune *ap_compiler_autotune(const ap_compiler *c)
{
	return c ? c->autotune : NULL;
}

/* ---- the request memo ------------------------------------------------------ */

static struct memo_slot *memo_slot(ap_compiler *c, const uint8_t digest[32])
{
	uint32_t i;

	memcpy(&i, digest, sizeof(i));
	return &c->memo[i % MEMO_SLOTS];
}

/* The graph key remembered for a request digest: true and key[] set. */
static bool memo_get(ap_compiler *c, const uint8_t digest[32], uint8_t key[32])
{
	struct memo_slot *m = memo_slot(c, digest);
	bool found;

	pthread_mutex_lock(&c->memo_mu);
	found = m->used && !memcmp(m->digest, digest, 32);
	if (found)
		memcpy(key, m->key, 32);
	pthread_mutex_unlock(&c->memo_mu);
	return found;
}

static void memo_put(ap_compiler *c, const uint8_t digest[32], const uint8_t key[32])
{
	struct memo_slot *m = memo_slot(c, digest);

	pthread_mutex_lock(&c->memo_mu);
	m->used = true;
	memcpy(m->digest, digest, 32);
	memcpy(m->key, key, 32);
	pthread_mutex_unlock(&c->memo_mu);
}

/* ---- tuning records (server/tune/tune.h) ----------------------------------- */

/* ap_tune_hooks.user of one request. */
struct tune_user {
	ap_compiler *c;
	const char *target;
	const char *device;      /* the request's device id ("NAME|SMS"), "" for none */
	bool variant;            /* the model's record (its candidates) */
};

/* Tuning records in the shared cache: kind 't', keyed by SHA-256 over
 * (signature, target, measured or not, and a measured record's device):
 * one model record per kernel and target, one measured record per kernel,
 * target and device (agreed on by two clients of some node, or measured by
 * a node's own tuner).  The value's parts: emitter, config, method, device,
 * candidates, then "sms modelled_us measured_us tried" as text. */
static void tuning_l2_key(const uint8_t sig[32], const char *target, const char *device,
			  uint8_t key[32])
{
	ap_sha256_ctx *h = ap_sha256_new();
	static const char tag[] = "apollo tuning record v2";

	if (!h) {
		memset(key, 0, 32);   /* never read: the put and get below fail first */
		return;
	}
	ap_sha256_update(h, tag, sizeof(tag));
	ap_sha256_update(h, sig, 32);
	ap_sha256_update(h, target, strlen(target) + 1);
	ap_sha256_update(h, device && *device ? "m" : "c", 1);
	if (device && *device)
		ap_sha256_update(h, device, strlen(device) + 1);
	ap_sha256_final(h, key);
}

void ap_compiler_tuning_publish(ap_compiler *c, const uint8_t sig[32], const char *target,
				const ap_tune_record *r)
{
	char nums[128];
	const uint8_t *parts[6];
	size_t lens[6];
	uint8_t key[32];

	if (!c->redis)
		return;
	snprintf(nums, sizeof(nums), "%u %.17g %.17g %u", r->sms, r->modelled_us, r->measured_us,
		 r->tried);
	parts[0] = (const uint8_t *)r->emitter;
	parts[1] = (const uint8_t *)r->config;
	parts[2] = (const uint8_t *)r->method;
	parts[3] = (const uint8_t *)r->device;
	parts[4] = (const uint8_t *)r->candidates;
	parts[5] = (const uint8_t *)nums;
	for (int i = 0; i < 6; i++)
		lens[i] = strnlen((const char *)parts[i], 1024);
	tuning_l2_key(sig, target, r->measured_us >= 0 ? r->device : NULL, key);
	ap_redis_put(c->redis, AP_REDIS_TUNING, key, 6, parts, lens);
}

/* Whether s is min..max bytes of printable ASCII. */
static bool printable(const char *s, size_t min, size_t max)
{
	size_t n = 0;

	for (; s && s[n]; n++)
		if ((unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e || n >= max)
			return false;
	return s && n >= min;
}

/* Copies part i of e into dst (cap bytes) when it is printable text that
 * fits (no NUL inside: printable() would stop there). */
static bool l2_text(const ap_redis_entry *e, int i, char *dst, size_t cap)
{
	if (e->part_len[i] >= cap || memchr(e->part[i], 0, e->part_len[i]))
		return false;
	memcpy(dst, e->part[i], e->part_len[i]);
	dst[e->part_len[i]] = '\0';
	return printable(dst, 0, cap - 1);
}

/* The shared cache's record of (sig, target): `device`'s measured one, or
 * (device NULL) the model's: 1 with *out (its strings checked printable
 * and in bounds, its numbers finite, a measured one's device the one asked
 * for; the config is parsed again by the tuner), 0 when absent or
 * malformed. */
static int tuning_l2_get(ap_compiler *c, const uint8_t sig[32], const char *target,
			 const char *device, ap_tune_record *out)
{
	ap_redis_entry e = {0};
	uint8_t key[32];
	char nums[128];
	bool measured = device != NULL;
	int ok;

	tuning_l2_key(sig, target, device, key);
	if (ap_redis_get(c->redis, AP_REDIS_TUNING, key, &e) != 1)
		return 0;
	memset(out, 0, sizeof(*out));
	ok = e.n == 6 && l2_text(&e, 0, out->emitter, sizeof(out->emitter)) &&
	     l2_text(&e, 1, out->config, sizeof(out->config)) &&
	     l2_text(&e, 2, out->method, sizeof(out->method)) &&
	     l2_text(&e, 3, out->device, sizeof(out->device)) &&
	     l2_text(&e, 4, out->candidates, sizeof(out->candidates)) &&
	     l2_text(&e, 5, nums, sizeof(nums)) &&
	     sscanf(nums, "%u %lf %lf %u", &out->sms, &out->modelled_us, &out->measured_us,
		    &out->tried) == 4 &&
	     isfinite(out->modelled_us) && isfinite(out->measured_us) &&
	     (out->measured_us >= 0) == measured && (!measured || !strcmp(out->device, device));
	ap_redis_entry_clear(&e);
	if (!ok)
		ap_log(AP_LOG_WARN, "shared cache: a malformed tuning record, ignored");
	return ok;
}

/* A record for a request: its device's measured record (local, else the
 * shared cache's, copied locally), else the model's (local, else shared);
 * a request naming no device, and a tune_variant build (which times the
 * model's candidates), use the model's only.  Measured records of other
 * devices never apply. */
static int tune_lookup(void *user, const uint8_t sig[32], ap_tune_record *rec)
{
	struct tune_user *u = user;
	bool device = !u->variant && u->device[0];
	ap_tune_record l2;
	int rc = device ? ap_cache_tuning_get(u->c->cache, sig, u->target, u->device, rec) : 0;

	if (rc < 0)
		return rc;
	if (rc == 0 && device && u->c->redis &&
	    tuning_l2_get(u->c, sig, u->target, u->device, &l2)) {
		ap_cache_tuning_put(u->c->cache, sig, u->target, &l2);
		*rec = l2;
		return 1;
	}
	if (rc == 1)
		return 1;
	rc = ap_cache_tuning_get(u->c->cache, sig, u->target, "", rec);
	if (rc == 0 && u->c->redis && tuning_l2_get(u->c, sig, u->target, NULL, &l2)) {
		ap_cache_tuning_put(u->c->cache, sig, u->target, &l2);
		*rec = l2;
		return 1;
	}
	return rc;
}

static void tune_store(void *user, const uint8_t sig[32], const ap_tune_record *rec)
{
	struct tune_user *u = user;

	ap_cache_tuning_put(u->c->cache, sig, u->target, rec);
	ap_compiler_tuning_publish(u->c, sig, u->target, rec);
}

/* Measurement indices ordered by signature, then time. */
static int cmp_measurement(const void *a, const void *b, void *arg)
{
	Apollo__TuneMeasurement *const *ms = arg;
	const Apollo__TuneMeasurement *x = ms[*(const int *)a], *y = ms[*(const int *)b];
	int c = memcmp(x->signature.data, y->signature.data, 32);

	if (c)
		return c;
	return (x->time_us > y->time_us) - (x->time_us < y->time_us);
}

/* ---- devices and reporters ----------------------------------------------- */

int ap_compile_device_id(const char *name, unsigned sms, char *id, size_t cap, ap_error *err)
{
	if (!printable(name, 1, 127))
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "the device name must be 1 to 127 printable ASCII characters");
	if (sms < 1 || sms > 1024)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "sm_count %u is not in 1..1024", sms);
	if ((size_t)snprintf(id, cap, "%s|%u", name, sms) >= cap)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "the device name is too long");
	return 0;
}

/* Remembers that `client` named `device` (newest kept: the oldest of
 * DEVICES_SEEN entries gives way). */
static void device_note(ap_compiler *c, const char *device, const char *client)
{
	struct device_seen *d = NULL;
	double now = ap_now_ms();

	pthread_mutex_lock(&c->devices_mu);
	for (int i = 0; i < DEVICES_SEEN && !d; i++)
		if (c->devices[i].last_ms > 0 && !strcmp(c->devices[i].device, device) &&
		    !strcmp(c->devices[i].client, client))
			d = &c->devices[i];
	for (int i = 0; i < DEVICES_SEEN && !d; i++)
		if (c->devices[i].last_ms == 0)
			d = &c->devices[i];
	if (!d) {
		d = &c->devices[0];
		for (int i = 1; i < DEVICES_SEEN; i++)
			if (c->devices[i].last_ms < d->last_ms)
				d = &c->devices[i];
	}
	snprintf(d->device, sizeof(d->device), "%s", device);
	snprintf(d->client, sizeof(d->client), "%s", client);
	d->last_ms = now;
	pthread_mutex_unlock(&c->devices_mu);
}

static bool device_named(ap_compiler *c, const char *device, const char *client)
{
	bool found = false;

	pthread_mutex_lock(&c->devices_mu);
	for (int i = 0; i < DEVICES_SEEN && !found; i++)
		found = c->devices[i].last_ms > 0 && !strcmp(c->devices[i].device, device) &&
			!strcmp(c->devices[i].client, client);
	pthread_mutex_unlock(&c->devices_mu);
	return found;
}

/* Whether `client` may report under the tune_reporters list: "any", or
 * comma-separated uids and the word "tcp" (every TCP client). */
static bool reporter_allowed(const char *list, const char *client)
{
	char copy[256], *save = NULL;

	if (!strcmp(client, TRUSTED_REPORTER) || !strcmp(list, "any"))
		return true;
	snprintf(copy, sizeof(copy), "%s", list);
	for (char *t = strtok_r(copy, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
		if (!strcmp(t, "tcp") && !strncmp(client, "tcp:", 4))
			return true;
		if (!strncmp(client, "uid:", 4) && !strcmp(t, client + 4))
			return true;
	}
	return false;
}

/* Checks one report's header and measurements (every one before any is
 * stored); fills model[i] with the model's record of measurement i. */
static int report_check(ap_compiler *c, const Apollo__TuneReport *rep, ap_tune_record *model,
			ap_error *err)
{
	size_t n = rep->n_measurements;
	char hex[17];

	for (size_t i = 0; i < n; i++) {
		const Apollo__TuneMeasurement *m = rep->measurements[i];
		const char *why = NULL;
		int found;

		if (m->signature.len != 32)
			why = "its signature is not 32 bytes";
		else if (!printable(m->schedule, 1, sizeof(model->config) - 1))
			why = "its schedule is not 1 to 255 printable ASCII characters";
		else if (!isfinite(m->time_us) || m->time_us <= 0 || m->time_us >= 1e7)
			why = "its time is not in (0, 1e7) microseconds";
		else if (m->runs < 1)
			why = "it names no timed run";
		if (why)
			return ap_error_set(err, AP_EINVAL, NULL, NULL, "tuning report: measurement %zu: %s",
					    i, why);
		ap_hex(m->signature.data, 8, hex);
		found = ap_cache_tuning_get(c->cache, m->signature.data, rep->target, "", &model[i]);
		if (found < 0)
			return ap_error_set(err, AP_EIO, NULL, NULL,
					    "tuning report: the tuning records cannot be read");
		if (found == 0)
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "tuning report: measurement %zu: kernel %s has no tuning record "
					    "for %s (compile with tune_variant first)", i, hex, rep->target);
		if (!ap_tune_is_candidate(&model[i], m->schedule))
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "tuning report: measurement %zu: '%.200s' is not a candidate of "
					    "kernel %s on %s", i, m->schedule, hex, rep->target);
	}
	return 0;
}

int ap_compiler_tune_report(ap_compiler *c, const char *client, const Apollo__TuneReport *rep,
			    unsigned *records, unsigned *pending, uint64_t *generation, ap_error *err)
{
	size_t n = rep->n_measurements;
	ap_tune_record *recs = NULL, *model = NULL;
	ap_cache_report *rows = NULL;
	uint8_t (*sigs)[32] = NULL;
	int *order = NULL, n_recs = 0, rc = 0;
	char device[160];
	bool gpu;
	int out_kind;

	*records = 0;
	*pending = 0;
	*generation = 0;
	if (!ap_cache_enabled(c->cache))
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "tuning report: this daemon runs without a cache, so it keeps no "
				    "tuning records");
	if (!reporter_allowed(c->tune_reporters, client))
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "tuning report: client %s may not report (tune_reporters = %s)",
				    client, c->tune_reporters);
	if (!rep->target || !*rep->target || strlen(rep->target) > 31 ||
	    ap_compile_parse_target(rep->target, 0, &gpu, &out_kind, err) < 0)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "tuning report: target '%.32s' is not a target this daemon compiles for",
				    rep->target ? rep->target : "");
	if (!gpu)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "tuning report: target %s is refused: host kernels are tuned by the "
				    "cost model alone", rep->target);
	{
		ap_error why;

		if ((rc = ap_compile_device_id(rep->device, rep->sm_count, device, sizeof(device),
					       &why)))
			return ap_error_set(err, rc, NULL, NULL, "tuning report: %s", why.msg);
	}
	if (strcmp(client, TRUSTED_REPORTER) && !device_named(c, device, client))
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "tuning report: device '%.127s' (%u SMs) was not named by this client "
				    "(%s) in a compile request: report from the GPU the bundles ran on "
				    "(CompileRequest.device)", rep->device, rep->sm_count, client);
	if (n < 1 || n > AP_TUNE_REPORT_MAX)
		return ap_error_set(err, n ? AP_ETOOLARGE : AP_EINVAL, NULL, NULL,
				    "tuning report: %zu measurements (1 to %d accepted)", n,
				    AP_TUNE_REPORT_MAX);
	model = calloc(n, sizeof(*model));
	order = calloc(n, sizeof(*order));
	rows = calloc(n, sizeof(*rows));
	recs = calloc(n, sizeof(*recs));
	sigs = calloc(n, sizeof(*sigs));
	if (!model || !order || !rows || !recs || !sigs) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto out;
	}
	if ((rc = report_check(c, rep, model, err)))
		goto out;
	for (size_t i = 0; i < n; i++) {
		order[i] = (int)i;
		rows[i] = (ap_cache_report){ rep->measurements[i]->signature.data,
					     rep->measurements[i]->schedule,
					     rep->measurements[i]->time_us };
	}
	if (ap_cache_report_put(c->cache, rep->target, device, client, rows, (int)n) < 0) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "tuning report: it could not be stored");
		goto out;
	}
	/* per kernel: the schedule the clients agree on becomes the device's
	 * measured record when it differs from the one it has */
	qsort_r(order, n, sizeof(*order), cmp_measurement, rep->measurements);
	for (size_t i = 0; i < n;) {
		const Apollo__TuneMeasurement *m = rep->measurements[order[i]];
		const ap_tune_record *mr = &model[order[i]];
		ap_tune_record *r = &recs[n_recs], had;
		char agreed[256];
		double median = 0;
		unsigned clients = 0;
		size_t j = i;
		int a;

		while (j < n && !memcmp(rep->measurements[order[j]]->signature.data,
					m->signature.data, 32))
			j++;
		i = j;
		a = ap_cache_report_agreed(c->cache, m->signature.data, rep->target, device,
					   TRUSTED_REPORTER, agreed, sizeof(agreed), &median, &clients);
		if (a < 0) {
			rc = ap_error_set(err, AP_EIO, NULL, NULL,
					  "tuning report: the reports cannot be read");
			goto out;
		}
		if (a == 0) {
			(*pending)++;
			continue;
		}
		if (ap_cache_tuning_get(c->cache, m->signature.data, rep->target, device, &had) == 1 &&
		    !strcmp(had.config, agreed))
			continue;   /* the same choice: nothing retires */
		*r = *mr;
		snprintf(r->config, sizeof(r->config), "%s", agreed);
		snprintf(r->method, sizeof(r->method), "measured");
		snprintf(r->device, sizeof(r->device), "%s", device);
		r->sms = rep->sm_count;
		r->measured_us = median;
		/* the model's time is known for its own choice only */
		r->modelled_us = strcmp(mr->config, agreed) ? 0 : mr->modelled_us;
		r->tried = clients;
		memcpy(sigs[n_recs++], m->signature.data, 32);
	}
	if (n_recs && ap_cache_tuning_put_many(c->cache, (const uint8_t (*)[32])sigs, rep->target,
					       recs, n_recs, false) < 0) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL,
				  "tuning report: the measured records could not be stored");
		goto out;
	}
	for (int i = 0; i < n_recs; i++)
		ap_compiler_tuning_publish(c, sigs[i], rep->target, &recs[i]);
	*records = (unsigned)n_recs;
	*generation = ap_cache_tuning_generation(c->cache);
	atomic_fetch_add(&c->tune_reports, 1);
	atomic_fetch_add(&c->tune_measurements, n);
	atomic_fetch_add(&c->tune_records, (uint64_t)n_recs);
	atomic_fetch_add(&c->tune_pending, *pending);
out:
	free(model);
	free(order);
	free(rows);
	free(recs);
	free(sigs);
	return rc;
}

/* ---- keys ---------------------------------------------------------------- */

/* Adds one field as (tag, NUL, 8-byte little-endian length, bytes), so that
 * no two different field lists hash the same byte string. */
static void key_field(ap_sha256_ctx *h, const char *tag, const void *data, size_t len)
{
	uint8_t n[8];

	for (int i = 0; i < 8; i++)
		n[i] = (uint8_t)((uint64_t)len >> (8 * i));
	ap_sha256_update(h, tag, strlen(tag) + 1);
	ap_sha256_update(h, n, 8);
	if (len)
		ap_sha256_update(h, data, len);
}

static void key_str(ap_sha256_ctx *h, const char *tag, const char *s)
{
	key_field(h, tag, s ? s : "", s ? strlen(s) : 0);
}

static void key_uint(ap_sha256_ctx *h, const char *tag, uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
	key_str(h, tag, buf);
}

/* The fields every key shares; `kind` tells the key families apart. */
static void key_common(ap_sha256_ctx *h, const char *kind, const char *target, int output,
		       const char *backend_id)
{
	key_str(h, "kind", kind);
	key_str(h, "target", target);
	key_uint(h, "output", (uint64_t)output);
	key_str(h, "backend", backend_id);
	key_str(h, "apollo", AP_VERSION);
	key_uint(h, "schema", APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A list of strings as a set: sorted, so that order does not matter. */
static void key_str_set(ap_sha256_ctx *h, const char *tag, char **v, size_t n)
{
	char **sorted = n ? malloc(n * sizeof(*sorted)) : NULL;

	key_uint(h, tag, n);
	if (n && !sorted) {
		/* Out of memory: hash in the given order (at worst a miss). */
		for (size_t i = 0; i < n; i++)
			key_str(h, tag, v[i]);
		return;
	}
	if (n) {
		memcpy(sorted, v, n * sizeof(*sorted));
		qsort(sorted, n, sizeof(*sorted), cmp_str);
	}
	for (size_t i = 0; i < n; i++)
		key_str(h, tag, sorted[i]);
	free(sorted);
}

/* Every option that can change the answer; no_cache cannot. */
static void key_options(ap_sha256_ctx *h, const Apollo__CompileOptions *opt)
{
	key_str(h, "namespace", opt ? opt->cache_namespace : "");
	key_uint(h, "max_block_threads", opt ? opt->max_block_threads : 0);
	key_uint(h, "fusion", opt ? (uint64_t)opt->fusion : 0);
	key_str_set(h, "fusion_barrier", opt ? opt->fusion_barriers : NULL,
		    opt ? opt->n_fusion_barriers : 0);
	key_str_set(h, "keep_whole", opt ? opt->keep_whole : NULL, opt ? opt->n_keep_whole : 0);
	if (opt && opt->allow_tf32)   /* only when set: earlier keys stay what they were */
		key_uint(h, "allow_tf32", 1);
	if (opt && opt->no_layer1)
		key_uint(h, "no_layer1", 1);
	if (opt && opt->no_tune)
		key_uint(h, "no_tune", 1);
	if (opt && opt->tune_variant)
		key_uint(h, "tune_variant", opt->tune_variant);
	if (opt && opt->host_check)
		key_uint(h, "host_check", 1);
}

/* A key can only be had whole: without a hash context it would be all
 * zero, and every request that ran out of memory there would share one
 * cache entry. */
int ap_compile_graph_key(const uint8_t graph_hash[32], const char *target, int output,
			 const struct Apollo__CompileOptions *opt, const char *backend_id,
			 uint8_t key[32])
{
	ap_sha256_ctx *h = ap_sha256_new();

	if (!h)
		return AP_ENOMEM;
	key_common(h, "graph", target, output, backend_id);
	key_field(h, "graph_hash", graph_hash, 32);
	key_options(h, opt);
	ap_sha256_final(h, key);
	return 0;
}

int ap_compile_kernel_key(const char *src, const char *entry, const char *target, int output,
			  const char *backend_id, uint8_t key[32])
{
	ap_sha256_ctx *h = ap_sha256_new();

	if (!h)
		return AP_ENOMEM;
	key_common(h, "kernel", target, output, backend_id);
	key_str(h, "source", src);
	key_str(h, "entry", entry);
	ap_sha256_final(h, key);
	return 0;
}

/* Key of an ONNX request, before import: the model bytes and bindings as
 * sent, so that a warm ONNX submit skips the import too.  0 or AP_ENOMEM. */
static int onnx_request_key(const Apollo__CompileRequest *req, const char *target, int output,
			    const char *backend_id, uint8_t key[32])
{
	ap_sha256_ctx *h = ap_sha256_new();

	if (!h)
		return AP_ENOMEM;
	key_common(h, "onnx", target, output, backend_id);
	key_field(h, "model", req->onnx_model.data, req->onnx_model.len);
	key_uint(h, "bindings", req->n_bindings);
	for (size_t i = 0; i < req->n_bindings; i++) {
		const Apollo__Tensor *t = req->bindings[i];
		key_str(h, "name", t->name);
		key_uint(h, "dtype", (uint64_t)t->dtype);
		key_uint(h, "rank", t->n_dims);
		for (size_t d = 0; d < t->n_dims; d++)
			key_uint(h, "dim", (uint64_t)t->dims[d]);
		key_field(h, "data", t->data.data, t->data.len);
	}
	key_options(h, req->options);
	ap_sha256_final(h, key);
	return 0;
}

/* ---- targets ------------------------------------------------------------- */

/* Matches PREFIX followed by 2-3 digits and at most one lowercase letter. */
static bool arch_like(const char *t, const char *prefix)
{
	size_t n = strlen(prefix), d = 0;

	if (strncmp(t, prefix, n))
		return false;
	t += n;
	while (t[d] >= '0' && t[d] <= '9')
		d++;
	if (d < 2 || d > 3)
		return false;
	t += d;
	return !*t || (*t >= 'a' && *t <= 'z' && !t[1]);
}

int ap_compile_parse_target(const char *target, int output, bool *gpu, int *resolved,
			    ap_error *err)
{
	const char *t = target && *target ? target : "cpu";

	if (output < APOLLO__OUTPUT_KIND__OUTPUT_DEFAULT || output > APOLLO__OUTPUT_KIND__OUTPUT_SO)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL, "unknown output kind %d", output);
	if (!strcmp(t, "cpu")) {
		*gpu = false;
		if (output != APOLLO__OUTPUT_KIND__OUTPUT_DEFAULT && output != APOLLO__OUTPUT_KIND__OUTPUT_SO)
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target cpu produces a host shared object, not %s",
					    output == APOLLO__OUTPUT_KIND__OUTPUT_PTX ? "PTX" : "cubin");
		*resolved = APOLLO__OUTPUT_KIND__OUTPUT_SO;
		return 0;
	}
	if (!strncmp(t, "host:", 5) && (arch_like(t + 5, "sm_") || arch_like(t + 5, "compute_"))) {
		/* the GPU's kernels run on the host: lowered for it, host C */
		*gpu = false;
		if (output != APOLLO__OUTPUT_KIND__OUTPUT_DEFAULT && output != APOLLO__OUTPUT_KIND__OUTPUT_SO)
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target %s runs on the host: a shared object, not %s", t,
					    output == APOLLO__OUTPUT_KIND__OUTPUT_PTX ? "PTX" : "cubin");
		*resolved = APOLLO__OUTPUT_KIND__OUTPUT_SO;
		return 0;
	}
	if (arch_like(t, "sm_")) {
		*gpu = true;
		if (output == APOLLO__OUTPUT_KIND__OUTPUT_SO)
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target %s produces PTX or cubin, not a host shared object", t);
		*resolved = output == APOLLO__OUTPUT_KIND__OUTPUT_PTX ? APOLLO__OUTPUT_KIND__OUTPUT_PTX
								      : APOLLO__OUTPUT_KIND__OUTPUT_CUBIN;
		return 0;
	}
	if (arch_like(t, "compute_")) {
		*gpu = true;
		if (output == APOLLO__OUTPUT_KIND__OUTPUT_CUBIN || output == APOLLO__OUTPUT_KIND__OUTPUT_SO)
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target %s is a virtual architecture: PTX only (cubin needs sm_%s)",
					    t, t + 8);
		*resolved = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
		return 0;
	}
	return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
			    "unknown target '%.64s': expected cpu, sm_XX (e.g. sm_90, sm_90a), compute_XX "
			    "or host:sm_XX (emulated on the host)",
			    t);
}

/* ---- protobuf building ---------------------------------------------------- */

/* Allocation helpers that record a failure in *oom instead of returning it,
 * so the builder below reads straight and checks once. */
static void *xcalloc(size_t n, size_t size, bool *oom)
{
	void *p = calloc(n ? n : 1, size);

	if (!p)
		*oom = true;
	return p;
}

static char *xstrdup(const char *s, bool *oom)
{
	char *p = ap_strdup(s);

	if (!p)
		*oom = true;
	return p;
}

static void *xmemdup(const void *src, size_t n, bool *oom)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		*oom = true;
	else if (n)
		memcpy(p, src, n);
	return p;
}

/* The names ("I", "II", "III") of the fusion layers in `layers`
 * (AP_LAYER_* bits), malloc'd; *n gets the count. */
static char **layer_names(unsigned layers, size_t *n, bool *oom)
{
	static const char *const names[] = {"I", "II", "III"};
	char **v = xcalloc(3, sizeof(char *), oom);

	*n = 0;
	for (int i = 0; v && i < 3; i++)
		if (layers & (1u << i)) {
			v[*n] = xstrdup(names[i], oom);
			if (!v[*n])
				break;
			(*n)++;
		}
	return v;
}

/* A compiled kernel blob, before it goes into the bundle. */
struct kblob {
	uint8_t *data;
	size_t len;
	uint8_t digest[32];
	bool compiled;        /* by the backend (else from a cache or a flight) */
	int tier;             /* where it came from: apollo.CacheTier */
	int rc;
	ap_error err;
};

/* Builds the bundle from the program and the blobs (taken: every
 * blobs[i].data is owned by the bundle, or freed, afterwards). */
static Apollo__Bundle *build_bundle(const ap_program *p, struct kblob *blobs, const char *target,
				    int output, const uint8_t graph_hash[32], bool *oom)
{
	Apollo__Bundle *b = xcalloc(1, sizeof(*b), oom);
	int i;

	if (!b) {
		for (i = 0; i < p->n_kernels; i++)
			free(blobs[i].data), blobs[i].data = NULL;
		return NULL;
	}
	apollo__bundle__init(b);
	b->target = xstrdup(target, oom);
	b->format = (Apollo__OutputKind)output;
	b->kernels = xcalloc((size_t)p->n_kernels, sizeof(*b->kernels), oom);
	for (i = 0; b->kernels && i < p->n_kernels; i++) {
		const ap_kernel_src *ks = &p->kernels[i];
		Apollo__Kernel *k = xcalloc(1, sizeof(*k), oom);

		if (!k)
			break;
		apollo__kernel__init(k);
		b->kernels[i] = k;
		b->n_kernels = (size_t)i + 1;
		k->name = xstrdup(ks->name, oom);
		k->target = xstrdup(target, oom);
		k->format = (Apollo__OutputKind)output;
		k->blob.data = blobs[i].data;
		k->blob.len = blobs[i].len;
		blobs[i].data = NULL;
		k->digest.data = xmemdup(blobs[i].digest, 32, oom);
		k->digest.len = k->digest.data ? 32 : 0;
		k->grid = xcalloc(3, sizeof(uint32_t), oom);
		k->block = xcalloc(3, sizeof(uint32_t), oom);
		if (k->grid && k->block) {
			k->n_grid = k->n_block = 3;
			for (int d = 0; d < 3; d++) {
				k->grid[d] = ks->grid[d];
				k->block[d] = ks->block[d];
			}
		}
		k->dynamic_shared_bytes = ks->smem_bytes;
		k->params = xcalloc((size_t)ks->n_params, sizeof(*k->params), oom);
		for (int a = 0; k->params && a < ks->n_params; a++) {
			Apollo__KernelParam *kp = xcalloc(1, sizeof(*kp), oom);
			if (!kp)
				break;
			apollo__kernel_param__init(kp);
			k->params[a] = kp;
			k->n_params = (size_t)a + 1;
			kp->name = xstrdup(ks->params[a].name, oom);
			kp->dtype = (Apollo__DataType)ks->params[a].dtype;
			kp->written = ks->params[a].written;
		}
		k->nodes = xcalloc((size_t)ks->n_nodes, sizeof(char *), oom);
		for (int a = 0; k->nodes && a < ks->n_nodes; a++) {
			k->nodes[a] = xstrdup(ks->nodes[a], oom);
			if (!k->nodes[a])
				break;
			k->n_nodes = (size_t)a + 1;
		}
	}
	for (; i < p->n_kernels; i++)
		free(blobs[i].data), blobs[i].data = NULL;

	b->plan = xcalloc((size_t)p->n_launches, sizeof(*b->plan), oom);
	for (i = 0; b->plan && i < p->n_launches; i++) {
		const ap_launch *l = &p->launches[i];
		Apollo__Launch *pl = xcalloc(1, sizeof(*pl), oom);
		if (!pl)
			break;
		apollo__launch__init(pl);
		b->plan[i] = pl;
		b->n_plan = (size_t)i + 1;
		pl->kernel = (uint32_t)l->kernel;
		pl->args = xcalloc((size_t)l->n_args, sizeof(uint32_t), oom);
		pl->arg_bytes = xcalloc((size_t)l->n_args, sizeof(uint64_t), oom);
		if (pl->args && pl->arg_bytes) {
			/* each kernel parameter addresses its tensor whole: what the
			 * kernel may touch is that buffer's bytes (the runtime checks
			 * every bound buffer against it) */
			pl->n_args = pl->n_arg_bytes = (size_t)l->n_args;
			for (int a = 0; a < l->n_args; a++) {
				pl->args[a] = (uint32_t)l->args[a];
				pl->arg_bytes[a] = p->buffers[l->args[a]].nbytes;
			}
		}
		/* The imported nodes this launch computes and its micro-graph's
		 * kind (a kernel may be shared by several launches). */
		pl->nodes = xcalloc((size_t)l->n_nodes, sizeof(char *), oom);
		for (int a = 0; pl->nodes && a < l->n_nodes; a++) {
			pl->nodes[a] = xstrdup(l->nodes[a], oom);
			if (!pl->nodes[a])
				break;
			pl->n_nodes = (size_t)a + 1;
		}
		if (l->category)
			pl->category = xstrdup(l->category, oom);
		pl->global_bytes = l->global_bytes;
		pl->layers = layer_names(l->layers, &pl->n_layers, oom);
		pl->parts = xcalloc((size_t)l->n_parts, sizeof(*pl->parts), oom);
		for (int j = 0; pl->parts && j < l->n_parts; j++) {
			const ap_launch_part *pt = &l->parts[j];
			Apollo__LaunchPart *pp = xcalloc(1, sizeof(*pp), oom);

			if (!pp)
				break;
			apollo__launch_part__init(pp);
			pl->parts[j] = pp;
			pl->n_parts = (size_t)j + 1;
			pp->category = xstrdup(pt->category ? pt->category : "", oom);
			pp->block_begin = pt->block_begin;
			pp->blocks = pt->blocks;
			pp->detail = xstrdup(pt->detail ? pt->detail : "", oom);
			pp->emitter = xstrdup(pt->emitter ? pt->emitter : "", oom);
			pp->schedule = xstrdup(pt->schedule ? pt->schedule : "", oom);
			pp->recompute_ratio = pt->recompute;
			pp->layer1_schedule = xstrdup(pt->layer1 ? pt->layer1 : "", oom);
			if (pt->tuned) {
				pp->tune_signature.data = xmemdup(pt->tune_sig, 32, oom);
				pp->tune_signature.len = pp->tune_signature.data ? 32 : 0;
			}
			pp->layers = layer_names(pt->layers, &pp->n_layers, oom);
			pp->nodes = xcalloc((size_t)pt->n_nodes, sizeof(char *), oom);
			for (int a = 0; pp->nodes && a < pt->n_nodes; a++) {
				pp->nodes[a] = xstrdup(pt->nodes[a], oom);
				if (!pp->nodes[a])
					break;
				pp->n_nodes = (size_t)a + 1;
			}
		}
	}

	/* Why launches were not fused: the --explain report. */
	b->boundaries = xcalloc((size_t)p->n_boundaries, sizeof(*b->boundaries), oom);
	for (i = 0; b->boundaries && i < p->n_boundaries; i++) {
		const ap_program_boundary *pb = &p->boundaries[i];
		Apollo__Boundary *bd = xcalloc(1, sizeof(*bd), oom);
		if (!bd)
			break;
		apollo__boundary__init(bd);
		b->boundaries[i] = bd;
		b->n_boundaries = (size_t)i + 1;
		bd->producer = (uint32_t)pb->producer;
		bd->consumer = (uint32_t)pb->consumer;
		bd->tensor = xstrdup(pb->tensor ? pb->tensor : "", oom);
		bd->reason = xstrdup(pb->reason ? pb->reason : "", oom);
		bd->detail = xstrdup(pb->detail ? pb->detail : "", oom);
	}

	b->buffers = xcalloc((size_t)p->n_buffers, sizeof(*b->buffers), oom);
	for (i = 0; b->buffers && i < p->n_buffers; i++) {
		const ap_buffer *bs = &p->buffers[i];
		Apollo__Buffer *bb = xcalloc(1, sizeof(*bb), oom);
		if (!bb)
			break;
		apollo__buffer__init(bb);
		b->buffers[i] = bb;
		b->n_buffers = (size_t)i + 1;
		bb->name = xstrdup(bs->name, oom);
		bb->kind = (Apollo__BufferKind)bs->kind;
		bb->dtype = (Apollo__DataType)bs->dtype;
		bb->dims = xcalloc((size_t)bs->rank, sizeof(int64_t), oom);
		if (bb->dims) {
			bb->n_dims = (size_t)bs->rank;
			memcpy(bb->dims, bs->dims, (size_t)bs->rank * sizeof(int64_t));
		}
		bb->bytes = bs->nbytes;
		bb->offset = bs->offset;
		bb->index = bs->index;
		if (bs->kind == AP_BUF_CONST && bs->data) {
			bb->data.data = xmemdup(bs->data, (size_t)bs->nbytes, oom);
			bb->data.len = bb->data.data ? (size_t)bs->nbytes : 0;
		}
	}
	b->workspace_bytes = p->workspace_bytes;
	b->graph_hash.data = xmemdup(graph_hash, 32, oom);
	b->graph_hash.len = b->graph_hash.data ? 32 : 0;
	b->stats = xcalloc(1, sizeof(*b->stats), oom);
	if (b->stats)
		apollo__stats__init(b->stats);
	return b;
}

static Apollo__Bundle *bundle_free(Apollo__Bundle *b)
{
	if (b)
		apollo__bundle__free_unpacked(b, NULL);
	return NULL;
}

/* Serializes `b` with every kernel blob left out (digests kept): what the
 * action cache stores.  NULL when out of memory. */
static uint8_t *pack_stripped(Apollo__Bundle *b, size_t *len)
{
	ProtobufCBinaryData *saved = calloc(b->n_kernels ? b->n_kernels : 1, sizeof(*saved));
	uint8_t *out = NULL;

	if (!saved)
		return NULL;
	for (size_t i = 0; i < b->n_kernels; i++) {
		saved[i] = b->kernels[i]->blob;
		b->kernels[i]->blob.data = NULL;
		b->kernels[i]->blob.len = 0;
	}
	*len = apollo__bundle__get_packed_size(b);
	out = malloc(*len ? *len : 1);
	if (out)
		apollo__bundle__pack(b, out);
	for (size_t i = 0; i < b->n_kernels; i++)
		b->kernels[i]->blob = saved[i];
	free(saved);
	return out;
}

/* ---- kernels -------------------------------------------------------------- */

/* One request's kernel compiles: target and blobs, shared by the worker
 * that owns the request and the helper threads (through a task_batch);
 * each blobs[i] is written only by the thread that runs task i. */
struct kernel_batch {
	ap_compiler *c;
	const ap_program *p;
	const char *target;
	bool gpu, use_cache;
	int nvrtc;                   /* GPU: the NVRTC compiling it (ap_nvrtc_pick) */
	char backend[64];            /* its identity in kernel keys ("nvrtc 12.9", "cc ...") */
	int output;
	double deadline;             /* ap_now_ms(): a kernel flight's wait ends */
	const atomic_bool *cancel;   /* set: compile no more kernels (the background
					tuner stopping); NULL: never */
	struct kblob *blobs;
	/* grouped compiles (compile_kernels): per kernel its key, what the
	 * probe found, its flight; the groups of misses, one program each */
	uint8_t (*keys)[32];
	enum { K_DONE, K_COMPILE, K_FOLLOW } *state;
	ap_flight **flight;
	int *group_of, n_groups;
};

/* Kernel `key` from L1, else from L2 (its blob's digest, then the blob
 * from L1 by that digest or from L2, verified; then copied into L1): true
 * with out's blob, digest and tier. */
static bool kernel_cached(const struct kernel_batch *kb, const uint8_t key[32], struct kblob *out)
{
	ap_compiler *c = kb->c;
	ap_redis_entry e;
	uint8_t d[32];

	if (ap_cache_kernel_get(c->cache, key, &out->data, &out->len, out->digest) == 1) {
		out->tier = APOLLO__CACHE_TIER__CACHE_L1;
		return true;
	}
	if (!c->redis || ap_redis_get(c->redis, AP_REDIS_KERNEL, key, &e) != 1)
		return false;
	if (e.n != 1 || e.part_len[0] != 32) {
		ap_redis_entry_clear(&e);
		return false;
	}
	memcpy(out->digest, e.part[0], 32);
	ap_redis_entry_clear(&e);
	if (ap_cache_blob_get(c->cache, out->digest, &out->data, &out->len) != 1) {
		if (ap_redis_get(c->redis, AP_REDIS_BLOB, out->digest, &e) != 1)
			return false;
		if (e.n == 1 && (out->data = malloc(e.part_len[0] ? e.part_len[0] : 1))) {
			memcpy(out->data, e.part[0], e.part_len[0]);
			out->len = e.part_len[0];
		}
		ap_redis_entry_clear(&e);
		if (!out->data)
			return false;
		ap_sha256(out->data, out->len, d);
		if (memcmp(d, out->digest, 32)) {
			ap_log(AP_LOG_WARN, "shared cache: a signed blob does not match its digest; not "
			       "served");
			free(out->data), out->data = NULL;
			return false;
		}
	}
	ap_cache_kernel_put_known(c->cache, key, out->data, out->len, out->digest);
	out->tier = APOLLO__CACHE_TIER__CACHE_L2;
	return true;
}

/* Runs the backend on translation unit `src` (file name `file`) into
 * `out`: its blob and digest, or rc and err. */
static void backend_run(const struct kernel_batch *kb, const char *src, const char *file,
			struct kblob *out)
{
	if (kb->gpu)
		out->rc = ap_nvrtc_compile_with(kb->nvrtc, src, file, kb->target,
						kb->output == APOLLO__OUTPUT_KIND__OUTPUT_CUBIN, NULL, 0,
						&out->data, &out->len, NULL, &out->err);
	else
		out->rc = ap_hostcc_compile(src, &out->data, &out->len, &out->err);
	if (out->rc)
		return;
	out->compiled = true;
	out->tier = APOLLO__CACHE_TIER__CACHE_COMPILED;
	ap_sha256(out->data, out->len, out->digest);
}

/* Stores the blob of `out` in L2 by its digest (once per backend run:
 * every kernel of a program shares it). */
static void blob_store(const struct kernel_batch *kb, const struct kblob *out)
{
	if (kb->use_cache && kb->c->redis) {
		const uint8_t *parts[1] = { out->data };
		size_t lens[1] = { out->len };

		ap_redis_put(kb->c->redis, AP_REDIS_BLOB, out->digest, 1, parts, lens);
	}
}

/* Stores kernel `key` -> out's blob in L1 (content-addressed: a blob
 * several kernels share is stored once) and key -> its digest in L2 (the
 * blob itself: blob_store). */
static void kernel_store(const struct kernel_batch *kb, const uint8_t key[32], const struct kblob *out)
{
	if (kb->use_cache) {
		const uint8_t *parts[1] = { out->digest };
		size_t lens[1] = { 32 };

		ap_cache_kernel_put_known(kb->c->cache, key, out->data, out->len, out->digest);
		if (kb->c->redis)
			ap_redis_put(kb->c->redis, AP_REDIS_KERNEL, key, 1, parts, lens);
	}
}

/* One translation unit of kernels ks[0..n) (the printers guard what
 * kernels share, so sources concatenate), malloc'd; NULL when out of
 * memory.  The test hook $APOLLO_TEST_REFUSE_KERNEL_NODES=N adds, after
 * every kernel of more than N member nodes (ap_kernel_src.n_members), an
 * #error line: the backend itself rejects it and the program it is in. */
static char *program_src(const struct kernel_batch *kb, const ap_kernel_src *const *ks, int n)
{
	char *src = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&src, &len);

	if (!f)
		return NULL;
	for (int i = 0; i < n; i++) {
		fprintf(f, "%s\n", ks[i]->src);
		if (kb->c->refuse_nodes && ks[i]->n_members > 0 &&
		    (unsigned)ks[i]->n_members > kb->c->refuse_nodes)
			fprintf(f, "#error \"test hook APOLLO_TEST_REFUSE_KERNEL_NODES=%u: a kernel of %d "
				"member nodes does not compile\"\n", kb->c->refuse_nodes, ks[i]->n_members);
	}
	if (ferror(f)) {
		fclose(f);
		free(src);
		return NULL;
	}
	fclose(f);
	return src;
}

/* Whether kb's request was cancelled: then out gets AP_EBUSY and no
 * backend runs (a kernel flight it leads publishes that error). */
static bool cancelled(const struct kernel_batch *kb, struct kblob *out)
{
	if (!kb->cancel || !atomic_load(kb->cancel))
		return false;
	out->rc = ap_error_set(&out->err, AP_EBUSY, NULL, NULL,
			       "cancelled: apollod is stopping");
	return true;
}

/* Runs the backend on kernel `ks` alone into `out` and stores the blob. */
static void kernel_backend(const struct kernel_batch *kb, const ap_kernel_src *ks,
			   const uint8_t key[32], struct kblob *out)
{
	char file[160];
	char *src;

	if (cancelled(kb, out))
		return;
	if (!(src = program_src(kb, &ks, 1))) {
		out->rc = ap_error_set(&out->err, AP_ENOMEM, NULL, NULL, "out of memory");
		return;
	}
	snprintf(file, sizeof(file), "%s.cu", ks->name);
	backend_run(kb, src, file, out);
	free(src);
	if (out->rc) {
		if (!out->err.node[0] && ks->n_nodes > 0)
			snprintf(out->err.node, sizeof(out->err.node), "%s", ks->nodes[0]);
		return;
	}
	blob_store(kb, out);
	kernel_store(kb, key, out);
}

/* A kernel flight's leader publishes `out`: its digest and blob, or its
 * error. */
static void kernel_publish(ap_compiler *c, ap_flight *f, const struct kblob *out)
{
	uint8_t *bytes = out->rc ? NULL : malloc(32 + out->len);

	if (!out->rc && !bytes) {
		ap_error e;

		ap_flight_finish(c->kflights, f, ap_error_set(&e, AP_ENOMEM, NULL, NULL, "out of memory"),
				 &e, NULL, 0);
		return;
	}
	if (bytes) {
		memcpy(bytes, out->digest, 32);
		memcpy(bytes + 32, out->data, out->len);
	}
	ap_flight_finish(c->kflights, f, out->rc, &out->err, bytes, 32 + out->len);
}

/* A follower of a kernel flight: true when the leader's outcome (blob or
 * error) is now out's; false when the wait ran out (compile alone). */
static bool kernel_follow(const struct kernel_batch *kb, ap_flight *f, struct kblob *out)
{
	uint8_t *bytes = NULL;
	size_t len = 0;
	int rc = 0;

	if (!ap_flight_wait(kb->c->kflights, f, kb->deadline, &rc, &out->err, &bytes, &len))
		return false;
	if (rc || len < 32) {
		out->rc = rc ? rc : ap_error_set(&out->err, AP_EINTERNAL, NULL, NULL,
						 "a kernel flight published nothing");
		free(bytes);
		return true;
	}
	memcpy(out->digest, bytes, 32);
	memmove(bytes, bytes + 32, len - 32);
	out->data = bytes;
	out->len = len - 32;
	out->tier = APOLLO__CACHE_TIER__CACHE_SHARED;
	return true;
}

/* What must happen to a kernel before it can be compiled: its source
 * checked, its key made, L1 and L2 asked, its flight joined.  K_DONE:
 * `out` holds the blob (from L1, L2) or the failure; K_FOLLOW: another
 * request compiles it, *f is the flight to wait on; K_COMPILE: this
 * request compiles it, leading flight *f (NULL: none). */
static int kernel_probe(const struct kernel_batch *kb, const ap_kernel_src *ks, uint8_t key[32],
			struct kblob *out, ap_flight **f)
{
	const char *src = ks->src;
	const char *bid = kb->backend;

	*f = NULL;
	ap_error_clear(&out->err);
	if (!src) {
		out->rc = ap_error_set(&out->err, AP_EINTERNAL, ks->n_nodes ? ks->nodes[0] : NULL, NULL,
				       "kernel %s has no %s source", ks->name, kb->gpu ? "CUDA" : "host");
		return K_DONE;
	}
	if (ap_compile_kernel_key(src, ks->name, kb->target, kb->output, bid, key)) {
		out->rc = ap_error_set(&out->err, AP_ENOMEM, NULL, NULL, "out of memory");
		return K_DONE;
	}
	if (kb->use_cache && kernel_cached(kb, key, out))
		return K_DONE;
	if (kb->use_cache && kb->c->kflights) {
		int role = ap_flight_join(kb->c->kflights, key, f);

		if (role == AP_FLIGHT_FOLLOW)
			return K_FOLLOW;
		if (role == AP_FLIGHT_LEAD &&
		    ap_cache_kernel_get(kb->c->cache, key, &out->data, &out->len, out->digest) == 1) {
			/* a flight stored it between our miss and our join */
			out->tier = APOLLO__CACHE_TIER__CACHE_L1;
			kernel_publish(kb->c, *f, out);
			*f = NULL;
			return K_DONE;
		}
		if (role != AP_FLIGHT_LEAD)
			*f = NULL;
	}
	return K_COMPILE;
}

/* One kernel alone into `out` (the rebuild after a refusal asks kernel by
 * kernel): probe, then its flight's outcome or the backend. */
static void compile_kernel(const struct kernel_batch *kb, const ap_kernel_src *ks, struct kblob *out)
{
	uint8_t key[32];
	ap_flight *f = NULL;
	int st = kernel_probe(kb, ks, key, out, &f);

	if (st == K_FOLLOW && kernel_follow(kb, f, out))
		return;
	if (st == K_DONE)
		return;
	kernel_backend(kb, ks, key, out);
	if (f)
		kernel_publish(kb->c, f, out);
}

static void probe_task(int i, void *arg)
{
	struct kernel_batch *kb = arg;
	struct kblob *b = &kb->blobs[i];

	kb->state[i] = kernel_probe(kb, &kb->p->kernels[i], kb->keys[i], b, &kb->flight[i]);
}

/* Group g of the kernels this request compiles: one translation unit
 * (the printers guard what kernels share, so sources concatenate), one
 * backend run -- NVRTC's and the host compiler's fixed cost once per
 * worker, not per kernel (issue: cold compiles at the NVRTC floor).  Each
 * kernel gets the whole blob (stored once, content-addressed; the bundle
 * carries it once, Kernel.blob_of) and finds its entry by name.  When the
 * backend rejects the group, each kernel is compiled alone, so the
 * rejection names its kernel (the driver's refusal feedback). */
static void group_task(int g, void *arg)
{
	struct kernel_batch *kb = arg;
	const ap_program *p = kb->p;
	const ap_kernel_src **ks = malloc(((size_t)p->n_kernels + 1) * sizeof(*ks));
	struct kblob whole;
	int n = 0, first = -1;
	char *src = NULL, file[48];

	memset(&whole, 0, sizeof(whole));
	for (int i = 0; ks && i < p->n_kernels; i++)
		if (kb->state[i] == K_COMPILE && kb->group_of[i] == g) {
			first = first < 0 ? i : first;
			ks[n++] = &p->kernels[i];
		}
	/* compiled even when the request has failed already: this request
	 * leads these kernels' flights, and a follower elsewhere must get
	 * the kernel, not this request's failure */
	if (n == 1) {
		kernel_backend(kb, ks[0], kb->keys[first], &kb->blobs[first]);
	} else if (cancelled(kb, &whole)) {
		;
	} else if (!ks || !(src = program_src(kb, ks, n))) {
		whole.rc = ap_error_set(&whole.err, AP_ENOMEM, NULL, NULL, "out of memory");
	} else {
		snprintf(file, sizeof(file), "apollo_group%d.cu", g);
		backend_run(kb, src, file, &whole);
		free(src);
		if (whole.rc == 0)
			blob_store(kb, &whole);
	}
	free(ks);
	for (int i = 0; i < p->n_kernels; i++) {
		struct kblob *out = &kb->blobs[i];

		if (kb->state[i] != K_COMPILE || kb->group_of[i] != g)
			continue;
		if (n > 1 || whole.rc) {
			if (whole.rc == AP_ECOMPILE) {
				kernel_backend(kb, &p->kernels[i], kb->keys[i], out);
			} else if (whole.rc) {
				out->rc = whole.rc;
				out->err = whole.err;
			} else if (!(out->data = malloc(whole.len ? whole.len : 1))) {
				out->rc = ap_error_set(&out->err, AP_ENOMEM, NULL, NULL, "out of memory");
			} else {
				memcpy(out->data, whole.data, whole.len);
				out->len = whole.len;
				memcpy(out->digest, whole.digest, 32);
				out->compiled = true;
				out->tier = APOLLO__CACHE_TIER__CACHE_COMPILED;
				kernel_store(kb, kb->keys[i], out);
			}
		}
		if (kb->flight[i]) {
			kernel_publish(kb->c, kb->flight[i], out);
			kb->flight[i] = NULL;
		}
	}
	free(whole.data);
}

/* A kernel another request compiles: its outcome, or, when the wait runs
 * out, a compile of its own. */
static void follow_task(int i, void *arg)
{
	struct kernel_batch *kb = arg;
	struct kblob *out = &kb->blobs[i];

	if (kb->state[i] != K_FOLLOW)
		return;
	if (!kernel_follow(kb, kb->flight[i], out))
		kernel_backend(kb, &kb->p->kernels[i], kb->keys[i], out);
	kb->flight[i] = NULL;
}

/* ---- the task pool: the request's worker and the helper threads ----------- */

/* n independent tasks fn(0..n-1, arg) of one request.  `next`, `done` and
 * the queue links are under the compiler's mutex. */
struct task_batch {
	int n, next, done;
	void (*fn)(int i, void *arg);
	void *arg;
	struct task_batch *queue_next;
	pthread_cond_t finished;
};

/* Removes `tb` from the queue of batches with tasks left (under c->mu). */
static void dequeue(ap_compiler *c, struct task_batch *tb)
{
	struct task_batch **pp = &c->queue;

	while (*pp && *pp != tb)
		pp = &(*pp)->queue_next;
	if (*pp)
		*pp = tb->queue_next;
}

/* Takes the next task of `tb` (under c->mu); -1 when none is left.  A
 * batch with nothing left to hand out leaves the queue. */
static int take_index(ap_compiler *c, struct task_batch *tb)
{
	int i;

	if (tb->next >= tb->n) {
		dequeue(c, tb);
		return -1;
	}
	i = tb->next++;
	if (tb->next == tb->n)
		dequeue(c, tb);
	return i;
}

/* Runs task i of `tb` outside the lock and records it (takes c->mu). */
static void run_index(ap_compiler *c, struct task_batch *tb, int i)
{
	pthread_mutex_unlock(&c->mu);
	tb->fn(i, tb->arg);
	pthread_mutex_lock(&c->mu);
	tb->done++;
	if (tb->done == tb->n)
		pthread_cond_signal(&tb->finished);
}

/* Helper thread: serves the queue of batches until the compiler is freed.
 * Helpers live as long as the compiler, so per-thread library state
 * (OpenSSL's error queue, NVRTC's) is set up once, not per request. */
static void *helper_main(void *arg)
{
	ap_compiler *c = arg;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct task_batch *tb;
		int i;

		while (!c->stop && !c->queue)
			pthread_cond_wait(&c->work, &c->mu);
		if (c->stop)
			break;
		tb = c->queue;
		i = take_index(c, tb);
		if (i >= 0)
			run_index(c, tb, i);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* Runs fn(0..n-1, arg) with the helpers' help, the calling worker taking
 * its share, and returns when every task is done (ap_task_pool.run). */
static void run_tasks(void *pool, int n, void (*fn)(int i, void *arg), void *arg)
{
	ap_compiler *c = pool;
	struct task_batch tb = {.n = n, .fn = fn, .arg = arg};
	int i;

	if (n <= 0)
		return;
	pthread_cond_init(&tb.finished, NULL);
	pthread_mutex_lock(&c->mu);
	if (c->n_helpers > 0 && n > 1) {
		struct task_batch **pp = &c->queue;

		while (*pp)
			pp = &(*pp)->queue_next;
		*pp = &tb;
		pthread_cond_broadcast(&c->work);
	}
	while ((i = take_index(c, &tb)) >= 0)
		run_index(c, &tb, i);
	while (tb.done < tb.n)
		pthread_cond_wait(&tb.finished, &c->mu);
	pthread_mutex_unlock(&c->mu);
	pthread_cond_destroy(&tb.finished);
}

/* Compiles (or fetches) every kernel of `p` on the task pool: first each
 * kernel's key, caches and flight (probe_task); then the kernels this
 * request compiles, dealt in program order to one group per worker (the
 * request's worker and the helpers) as cards are dealt, one backend run per
 * group (group_task) -- a program repeats its kinds of kernel layer after
 * layer, so dealing spreads each kind evenly; balancing by source bytes
 * was measured worse (bench/compile.sh: prenorm_layer_train 1.21x the
 * NVRTC floor against 1.02x), since NVRTC's time is not proportional to a
 * source's length; last the
 * kernels another request was compiling (follow_task) -- after this
 * request has published its own, so two requests waiting on each other's
 * flights never both wait.  0, or the first failure's code with `err`
 * copied from it, a failure other than AP_ECOMPILE first: after an
 * AP_ECOMPILE every kernel has still been tried. */
static int compile_kernels(ap_compiler *c, struct kernel_batch *kb, const ap_program *p,
			   struct kblob *blobs, ap_error *err)
{
	int i, n = p->n_kernels, rc = 0, workers = (int)c->n_helpers + 1, n_miss = 0;

	kb->p = p;
	kb->blobs = blobs;
	kb->keys = calloc((size_t)n + 1, sizeof(*kb->keys));
	kb->state = calloc((size_t)n + 1, sizeof(*kb->state));
	kb->flight = calloc((size_t)n + 1, sizeof(*kb->flight));
	kb->group_of = calloc((size_t)n + 1, sizeof(*kb->group_of));
	if (!kb->keys || !kb->state || !kb->flight || !kb->group_of) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto out;
	}
	/* a cancellable request (the background tuner's) compiles one kernel
	 * per program: each backend run is short, and the cancellation is
	 * seen between two of them */
	if (kb->cancel)
		workers = n > 0 ? n : 1;
	run_tasks(c, n, probe_task, kb);
	for (i = 0; i < n; i++)
		if (kb->state[i] == K_COMPILE)
			kb->group_of[i] = n_miss++ % workers;
	kb->n_groups = n_miss < workers ? n_miss : workers;
	run_tasks(c, kb->n_groups, group_task, kb);
	run_tasks(c, n, follow_task, kb);
	for (i = 0; i < n; i++) {
		if (blobs[i].rc && blobs[i].rc != AP_ECOMPILE) {
			*err = blobs[i].err;
			rc = blobs[i].rc;
			goto out;
		}
	}
	for (i = 0; i < n; i++) {
		if (blobs[i].rc) {
			*err = blobs[i].err;
			rc = blobs[i].rc;
			goto out;
		}
	}
out:
	free(kb->keys);
	free(kb->state);
	free(kb->flight);
	free(kb->group_of);
	kb->keys = NULL;
	kb->state = NULL;
	kb->flight = NULL;
	kb->group_of = NULL;
	return rc;
}

/* ---- backend refusals (upward feedback) ------------------------------------ */

/* Every kernel one request has offered the backend, by name (a kernel's
 * name hashes its sources, so one name is one source), with its result:
 * the blob, or the backend's error.  Owned by the request's worker. */
struct kmemo {
	struct kernel_batch *kb;     /* target, output, cache use; kb->p unused */
	int n, cap;
	char **names;
	struct kblob *blobs;
	double ms;                   /* time spent compiling in accept_kernel */
};

static void kmemo_clear(struct kmemo *m)
{
	for (int i = 0; i < m->n; i++) {
		free(m->names[i]);
		free(m->blobs[i].data);
	}
	free(m->names);
	free(m->blobs);
	memset(m, 0, sizeof(*m));
}

static int kmemo_find(const struct kmemo *m, const char *name)
{
	for (int i = 0; i < m->n; i++)
		if (strcmp(m->names[i], name) == 0)
			return i;
	return -1;
}

/* Appends (name, *b), taking b's data; 0 or AP_ENOMEM (b's data freed). */
static int kmemo_add(struct kmemo *m, const char *name, struct kblob *b)
{
	char *nm = strdup(name);

	if (m->n == m->cap) {
		int ncap = m->cap ? 2 * m->cap : 16;
		char **nn = realloc(m->names, (size_t)ncap * sizeof(*nn));
		struct kblob *nb = nn ? realloc(m->blobs, (size_t)ncap * sizeof(*nb)) : NULL;

		if (nn)
			m->names = nn;
		if (nb)
			m->blobs = nb;
		if (!nn || !nb) {
			free(nm);
			free(b->data), b->data = NULL;
			return AP_ENOMEM;
		}
		m->cap = ncap;
	}
	if (!nm) {
		free(b->data), b->data = NULL;
		return AP_ENOMEM;
	}
	m->names[m->n] = nm;
	m->blobs[m->n++] = *b;
	b->data = NULL;
	return 0;
}

/* ap_build_options.accept_kernel: the backend's verdict on kernel k, from
 * the memo or compiled now (through the kernel cache) and remembered, so
 * that a kernel is compiled once per request.  0, AP_ENOMEM, or the
 * backend's error code with its message in `why`. */
static int on_accept_kernel(const ap_kernel_src *k, void *user, ap_error *why)
{
	struct kmemo *m = user;
	int i = kmemo_find(m, k->name);
	struct kblob b;

	if (i < 0) {
		double t = ap_now_ms();

		memset(&b, 0, sizeof(b));
		compile_kernel(m->kb, k, &b);
		m->ms += ap_now_ms() - t;
		if (kmemo_add(m, k->name, &b) < 0)
			return AP_ENOMEM;
		i = m->n - 1;
	}
	if (m->blobs[i].rc && why)
		*why = m->blobs[i].err;
	return m->blobs[i].rc;
}

/* ---- the job --------------------------------------------------------------- */

struct request {
	const Apollo__CompileRequest *req;
	const uint8_t *digest;     /* of the request's bytes; NULL: unknown */
	unsigned driver;           /* GPU: the client's CUDA driver (DeviceInfo); 0: not said */
	int nvrtc;                 /* GPU: the NVRTC its output comes from (ap_nvrtc_pick) */
	const char *client;        /* "uid:N", "tcp:ADDR"; NULL: in-process */
	const atomic_bool *cancel; /* the background tuner's stop; NULL: none */
	char device[160];          /* GPU targets: the device's id "NAME|SMS", or "" */
	const char *target;
	bool gpu, use_cache;
	int output;
	unsigned mbt;
	double t0, import_ms, cache_ms;
	unsigned kernel_tier[4];   /* of a compiled request's kernels */
};

/* The distinct tuning signatures of a bundle's launch parts (malloc'd,
 * *n of them; NULL with *n 0 when there are none or memory is short). */
static uint8_t (*tuned_sigs(const Apollo__Bundle *b, int *n))[32]
{
	uint8_t (*sigs)[32] = NULL;
	size_t parts = 0;

	*n = 0;
	for (size_t i = 0; i < b->n_plan; i++)
		parts += b->plan[i]->n_parts;
	if (!parts || !(sigs = calloc(parts, 32)))
		return NULL;
	for (size_t i = 0; i < b->n_plan; i++)
		for (size_t j = 0; j < b->plan[i]->n_parts; j++) {
			const ProtobufCBinaryData *t = &b->plan[i]->parts[j]->tune_signature;
			bool seen = false;

			if (t->len != 32)
				continue;
			for (int k = 0; k < *n && !seen; k++)
				seen = !memcmp(sigs[k], t->data, 32);
			if (!seen)
				memcpy(sigs[(*n)++], t->data, 32);
		}
	return sigs;
}

/* Notes which tuned kernels the bundle stored under `key` holds, so that a
 * new record for one of them retires it (ap_cache_bundle_tuned). */
static void note_tuned(ap_compiler *c, const struct request *r, const uint8_t key[32],
		       const Apollo__Bundle *b)
{
	int n = 0;
	uint8_t (*sigs)[32] = tuned_sigs(b, &n);

	if (n)
		ap_cache_bundle_tuned(c->cache, key, r->target, r->device,
				      (const uint8_t (*)[32])sigs, n);
	free(sigs);
}

/* Whether a bundle from another node is stale here: one of its tuned
 * kernels has, for this request's device, a measured record that chose
 * another schedule than the bundle's. */
static bool stale_tuning(ap_compiler *c, const struct request *r, const Apollo__Bundle *b)
{
	if (!r->device[0])
		return false;
	for (size_t i = 0; i < b->n_plan; i++)
		for (size_t j = 0; j < b->plan[i]->n_parts; j++) {
			const Apollo__LaunchPart *p = b->plan[i]->parts[j];
			ap_tune_record rec;

			if (p->tune_signature.len == 32 &&
			    ap_cache_tuning_get(c->cache, p->tune_signature.data, r->target, r->device,
						&rec) == 1 &&
			    strcmp(rec.config, p->schedule ? p->schedule : ""))
				return true;
		}
	return false;
}

/* Rebuilds a reply from a stored (stripped) bundle: every kernel blob is
 * fetched by digest and verified.  NULL when anything is missing. */
static Apollo__Bundle *from_cache(ap_compiler *c, const uint8_t *val, size_t len)
{
	Apollo__Bundle *b = apollo__bundle__unpack(NULL, len, val);

	if (!b)
		return NULL;
	for (size_t i = 0; i < b->n_kernels; i++) {
		Apollo__Kernel *k = b->kernels[i];
		uint8_t *data = NULL;
		size_t n = 0;

		if (k->digest.len != 32 || ap_cache_blob_get(c->cache, k->digest.data, &data, &n) != 1)
			return bundle_free(b);
		free(k->blob.data);
		k->blob.data = data;
		k->blob.len = n;
	}
	if (!b->stats) {
		b->stats = malloc(sizeof(*b->stats));
		if (!b->stats)
			return bundle_free(b);
		apollo__stats__init(b->stats);
	}
	return b;
}

/* An L2 action entry (the stripped bundle, then one blob per kernel in
 * order) as a bundle: every blob checked once against its kernel's digest,
 * then stored in L1 with that digest, and the action under `key`.  NULL
 * when anything does not fit (a miss). */
static Apollo__Bundle *from_l2(ap_compiler *c, const struct request *r, const uint8_t key[32],
			       const ap_redis_entry *e)
{
	Apollo__Bundle *b;

	if (e->n < 1)
		return NULL;
	b = apollo__bundle__unpack(NULL, e->part_len[0], e->part[0]);
	if (!b || (size_t)(e->n - 1) > b->n_kernels || (e->n == 1 && b->n_kernels > 0))
		return bundle_free(b);
	if (stale_tuning(c, r, b))
		return bundle_free(b);   /* built before this device's measured records */
	{
		/* the distinct blobs, each verified once; kernels find theirs by digest */
		uint8_t (*dg)[32] = calloc((size_t)e->n, 32);

		if (!dg)
			return bundle_free(b);
		for (int p = 1; p < e->n; p++)
			ap_sha256(e->part[p], e->part_len[p], dg[p]);
		for (size_t i = 0; i < b->n_kernels; i++) {
			Apollo__Kernel *k = b->kernels[i];
			uint8_t *copy;
			int p = 1;

			while (p < e->n && (k->digest.len != 32 || memcmp(dg[p], k->digest.data, 32)))
				p++;
			if (p == e->n) {
				ap_log(AP_LOG_WARN, "shared cache: kernel %zu of a signed bundle has no blob "
				       "matching its digest; not served", i);
				free(dg);
				return bundle_free(b);
			}
			copy = malloc(e->part_len[p] ? e->part_len[p] : 1);
			if (!copy) {
				free(dg);
				return bundle_free(b);
			}
			memcpy(copy, e->part[p], e->part_len[p]);
			free(k->blob.data);
			k->blob.data = copy;
			k->blob.len = e->part_len[p];
			ap_cache_blob_put_known(c->cache, copy, k->blob.len, dg[p]);
		}
		free(dg);
	}
	if (ap_cache_put(c->cache, key, e->part[0], e->part_len[0]) == 0)
		note_tuned(c, r, key, b);
	if (!b->stats) {
		b->stats = malloc(sizeof(*b->stats));
		if (!b->stats)
			return bundle_free(b);
		apollo__stats__init(b->stats);
	}
	return b;
}

/* Sets a cached bundle's stats for this request (a hit from `tier`). */
static void hit_stats(Apollo__Bundle *b, const struct request *r, int tier)
{
	b->stats->cache_hit = 1;
	b->stats->cache_tier = (Apollo__CacheTier)tier;
	b->stats->kernels_compiled = 0;
	b->stats->kernels_remote = 0;
	b->stats->kernels_shared = 0;
	b->stats->import_ms = r->import_ms;
	b->stats->partition_ms = 0;
	b->stats->codegen_ms = 0;
	b->stats->layer1_ms = 0;
	b->stats->backend_ms = 0;
	b->stats->cache_ms = r->cache_ms;
	b->stats->compile_ms = ap_now_ms() - r->t0;
}

/* Looks `key` up in L1, then (with `l2`) in L2; on a hit returns the
 * bundle with this request's stats. */
static Apollo__Bundle *lookup(ap_compiler *c, struct request *r, const uint8_t key[32], bool l2)
{
	double t = ap_now_ms();
	uint8_t *val = NULL;
	size_t len = 0;
	Apollo__Bundle *b = NULL;
	int tier = APOLLO__CACHE_TIER__CACHE_L1;

	if (!r->use_cache)
		return NULL;
	if (ap_cache_get(c->cache, key, &val, &len) == 1) {
		b = from_cache(c, val, len);
		free(val);
	}
	if (!b && l2 && c->redis) {
		ap_redis_entry e;

		if (ap_redis_get(c->redis, AP_REDIS_ACTION, key, &e) == 1) {
			b = from_l2(c, r, key, &e);
			tier = APOLLO__CACHE_TIER__CACHE_L2;
			ap_redis_entry_clear(&e);
		}
	}
	r->cache_ms += ap_now_ms() - t;
	if (b)
		hit_stats(b, r, tier);
	return b;
}

/* Writes a bundle compiled here to L2: the stripped bundle `val` and the
 * blob of every kernel. */
static void store_l2(ap_compiler *c, const uint8_t key[32], const Apollo__Bundle *b,
		     const uint8_t *val, size_t len)
{
	const uint8_t **parts = calloc(b->n_kernels + 1, sizeof(*parts));
	size_t *lens = calloc(b->n_kernels + 1, sizeof(*lens));

	if (parts && lens && b->n_kernels < INT_MAX) {
		int n = 1;

		parts[0] = val;
		lens[0] = len;
		/* each distinct blob once (kernels compiled as one program
		 * share one); from_l2 matches them to kernels by digest */
		for (size_t i = 0; i < b->n_kernels; i++) {
			bool seen = false;

			for (size_t j = 0; j < i && !seen; j++)
				seen = !memcmp(b->kernels[j]->digest.data, b->kernels[i]->digest.data, 32);
			if (seen)
				continue;
			parts[n] = b->kernels[i]->blob.data;
			lens[n++] = b->kernels[i]->blob.len;
		}
		ap_redis_put(c->redis, AP_REDIS_ACTION, key, n, parts, lens);
	}
	free(parts);
	free(lens);
}

/* A follower of a request flight: 1 with *out (the leader's bundle,
 * unpacked for us) or a negative rc (the leader's error, in `err`); 0
 * when the wait ran out (compile alone). */
static int follow(ap_compiler *c, struct request *r, ap_flight *f, Apollo__Bundle **out,
		  ap_error *err)
{
	uint8_t *bytes = NULL;
	size_t len = 0;
	int rc = 0;
	double t = ap_now_ms();

	if (!ap_flight_wait(c->flights, f, r->t0 + c->flight_wait_ms, &rc, err, &bytes, &len)) {
		ap_log(AP_LOG_INFO, "an identical request did not finish within %u ms: compiling "
		       "this one too", c->flight_wait_ms);
		return 0;
	}
	r->cache_ms += ap_now_ms() - t;
	if (rc)
		return rc;
	*out = apollo__bundle__unpack(NULL, len, bytes);
	free(bytes);
	if (!*out || !(*out)->stats) {
		*out = bundle_free(*out);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory unpacking a bundle");
	}
	hit_stats(*out, r, APOLLO__CACHE_TIER__CACHE_SHARED);
	return 1;
}

/* The leader of a request flight publishes its outcome (the bundle
 * packed, or its error) and leaves. */
static void publish(ap_compiler *c, ap_flight *f, int rc, const ap_error *err,
		    const Apollo__Bundle *b)
{
	uint8_t *bytes = NULL;
	size_t len = 0;

	if (!rc && b) {
		len = apollo__bundle__get_packed_size(b);
		bytes = malloc(len ? len : 1);
		if (bytes)
			apollo__bundle__pack(b, bytes);
		else
			rc = AP_ENOMEM;
	}
	if (!rc && !b)
		rc = AP_EINTERNAL;
	ap_flight_finish(c->flights, f, rc, err, bytes, len);
}

/* Converts the request's bindings for ap_onnx_import (borrowing their
 * data).  0 or AP_E* naming the binding. */
static int convert_bindings(const Apollo__CompileRequest *req, ap_host_tensor *hts,
			    const ap_host_tensor **ptrs, ap_error *err)
{
	for (size_t i = 0; i < req->n_bindings; i++) {
		const Apollo__Tensor *t = req->bindings[i];
		ap_host_tensor *h = &hts[i];

		if (t->n_dims > AP_MAX_RANK)
			return ap_error_set(err, AP_ETOOLARGE, NULL, t->name,
					    "binding '%.100s' has rank %zu, at most %d supported", t->name,
					    t->n_dims, AP_MAX_RANK);
		memset(h, 0, sizeof(*h));
		h->name = t->name;
		h->dtype = (ap_dtype)t->dtype;
		h->rank = (int)t->n_dims;
		for (size_t d = 0; d < t->n_dims; d++) {
			if (t->dims[d] < 0)
				return ap_error_set(err, AP_EINVAL, NULL, t->name,
						    "binding '%.100s' has a negative dimension", t->name);
			h->dims[d] = t->dims[d];
		}
		if (t->data.len) {
			size_t es = ap_dtype_size(h->dtype);
			ap_tensor tmp;
			int64_t numel;

			memset(&tmp, 0, sizeof(tmp));
			tmp.rank = h->rank;
			memcpy(tmp.dims, h->dims, sizeof(tmp.dims));
			numel = ap_tensor_numel(&tmp);
			if (!es || numel < 0 || (uint64_t)numel * es != t->data.len)
				return ap_error_set(err, AP_ESHAPE, NULL, t->name,
						    "binding '%.100s' carries %zu bytes of data, its shape and "
						    "dtype need %lld", t->name, t->data.len,
						    numel < 0 || !es ? -1LL : (long long)((uint64_t)numel * es));
		}
		h->data = t->data.data;
		h->nbytes = t->data.len;
		ptrs[i] = h;
	}
	return 0;
}

/* After the parallel compile of *progp rejected a kernel (AP_ECOMPILE):
 * remembers every blob by kernel name, builds the program again with
 * on_accept_kernel as the backend hook, and replaces *progp and *blobsp
 * by the new program and its blobs.  *compiled counts the backend compiles
 * of both rounds, *backend_ms adds the hook's compile time.  0, or an
 * error with `err` set (AP_ECOMPILE when a single-node kernel does not
 * compile, from ap_program_build). */
static int rebuild_refused(ap_compiler *c, const ap_graph *g, ap_build_options *bo,
			   struct kernel_batch *kb, ap_program **progp, struct kblob **blobsp,
			   unsigned *compiled, double *backend_ms, ap_error *err)
{
	ap_program *prog = *progp;
	struct kblob *blobs = *blobsp;
	struct kmemo m;
	int rc = 0, n = prog->n_kernels;

	memset(&m, 0, sizeof(m));
	m.kb = kb;
	kb->p = NULL;
	for (int i = 0; i < n && rc == 0; i++)
		rc = kmemo_add(&m, prog->kernels[i].name, &blobs[i]);
	for (int i = 0; i < n; i++)
		free(blobs[i].data);
	free(blobs);
	*blobsp = NULL;
	*progp = ap_program_free(prog);
	if (rc) {
		kmemo_clear(&m);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	bo->accept_kernel = on_accept_kernel;
	bo->accept_user = &m;
	ap_error_clear(err);
	prog = ap_program_build(g, bo, err);
	bo->accept_kernel = NULL;
	bo->accept_user = NULL;
	*backend_ms += m.ms;
	for (int i = 0; i < m.n; i++)
		*compiled += m.blobs[i].compiled;
	if (!prog) {
		kmemo_clear(&m);
		return err->code ? err->code : AP_EINTERNAL;
	}
	*progp = prog;
	blobs = calloc((size_t)prog->n_kernels + 1, sizeof(*blobs));
	if (!blobs) {
		kmemo_clear(&m);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	*blobsp = blobs;
	for (int i = 0; i < prog->n_kernels; i++) {
		int j = kmemo_find(&m, prog->kernels[i].name);

		/* every kept kernel was offered to on_accept_kernel and accepted */
		if (j < 0 || m.blobs[j].rc || !m.blobs[j].data) {
			kmemo_clear(&m);
			return ap_error_set(err, AP_EINTERNAL, NULL, NULL,
					    "kernel %s was kept without the backend's blob",
					    prog->kernels[i].name);
		}
		blobs[i] = m.blobs[j];
		m.blobs[j].data = NULL;
	}
	kmemo_clear(&m);
	return 0;
}

/* The job proper: 0 and *out, or an error code with `err` set. */
/* The graph a request carries: decoded and validated, or imported from
 * its ONNX model with its bindings.  0 with *g (caller frees), or the
 * error (AP_EINVAL, AP_EMESSAGE, AP_ENOMEM, the importer's). */
static int request_graph(const Apollo__CompileRequest *req, ap_graph **g, ap_error *err)
{
	ap_host_tensor *hts;
	const ap_host_tensor **ptrs;
	int rc;

	*g = NULL;
	switch (req->source_case) {
	case APOLLO__COMPILE_REQUEST__SOURCE_GRAPH:
		if (!(*g = ap_graph_from_pb(req->graph, err)))
			return err->code ? err->code : AP_EINVAL;
		if ((rc = ap_graph_validate(*g, err))) {
			*g = ap_graph_free(*g);
			return rc;
		}
		return 0;
	case APOLLO__COMPILE_REQUEST__SOURCE_ONNX_MODEL:
		hts = calloc(req->n_bindings + 1, sizeof(*hts));
		ptrs = calloc(req->n_bindings + 1, sizeof(*ptrs));
		if (!hts || !ptrs) {
			free(hts);
			free(ptrs);
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		}
		rc = convert_bindings(req, hts, ptrs, err);
		if (!rc && !(*g = ap_onnx_import(req->onnx_model.data, req->onnx_model.len, ptrs,
						 (int)req->n_bindings, NULL, err)))
			rc = err->code ? err->code : AP_EINVAL;
		free(hts);
		free(ptrs);
		return rc;
	default:
		return ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				    "CompileRequest carries neither a graph nor an onnx_model");
	}
}

/* A request's build options and tuning hooks (tuning records are read
 * and written with the cache, not with no_cache).  0, or AP_EUNSUPPORTED
 * for a tune_variant past the candidates or an unknown fusion level. */
static int build_options(ap_compiler *c, const Apollo__CompileRequest *req, const char *target,
			 const char *r_device, bool use_cache, ap_task_pool *pool,
			 ap_build_options *bo, ap_tune_hooks *th, struct tune_user *tu, ap_error *err)
{
	const Apollo__CompileOptions *o = req->options;

	*bo = (ap_build_options){
		.target = target,
		.pool = pool,
		.max_block_threads = o ? o->max_block_threads : 0,
		.fusion = o ? (ap_fuse_level)o->fusion : AP_FUSE_DEFAULT,
		.n_fusion_barriers = o ? (int)o->n_fusion_barriers : 0,
		.fusion_barriers = o ? o->fusion_barriers : NULL,
		.n_keep_whole = o ? (int)o->n_keep_whole : 0,
		.keep_whole = o ? o->keep_whole : NULL,
		.allow_tf32 = o && o->allow_tf32,
		.no_layer1 = o && o->no_layer1,
		.host_check = o && o->host_check,
	};
	*tu = (struct tune_user){c, target, r_device, o && o->tune_variant};
	*th = (ap_tune_hooks){
		.target = target,
		.budget_evals = c->tune_budget_evals,
		.budget_ms = c->tune_budget_ms,
		.variant = o ? o->tune_variant : 0,
		.lookup = use_cache ? tune_lookup : NULL,
		.store = use_cache ? tune_store : NULL,
		.user = tu,
	};
	if (!(o && o->no_tune))
		bo->tune = th;
	if (th->variant > AP_TUNE_TOP)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "tune_variant %u: candidates are numbered 1 to %d", th->variant,
				    AP_TUNE_TOP);
	if (bo->fusion > AP_FUSE_APOLLO)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "unknown fusion level %d (none=1, rules=2, apollo=3)", (int)bo->fusion);
	return 0;
}

/* The backend that compiles request r's kernels, as keys name it: "nvrtc
 * 12.9" for the NVRTC driver negotiation picked (the newest: c->nvrtc_id),
 * the host C compiler's identity for host targets. */
static void backend_id(const ap_compiler *c, const struct request *r, char *buf, size_t cap)
{
	const char *v = r->gpu ? ap_nvrtc_version_of(r->nvrtc) : NULL;

	if (r->gpu && r->nvrtc > 0 && v)
		snprintf(buf, cap, "nvrtc %s", v);
	else
		snprintf(buf, cap, "%s", ap_compiler_backend_id(c, r->gpu));
}

static int run(ap_compiler *c, struct request *r, Apollo__Bundle **out, ap_error *err)
{
	const Apollo__CompileRequest *req = r->req;
	ap_graph *g = NULL;
	ap_program *prog = NULL;
	struct kblob *blobs = NULL;
	Apollo__Bundle *b = NULL;
	uint8_t graph_hash[32], named_hash[32], gkey[32], rkey[32];
	bool have_rkey = false, oom = false;
	ap_flight *flight = NULL;     /* the request flight this request leads */
	char bid[400];
	double t, backend_ms;
	unsigned compiled = 0;
	ap_build_options bo;
	ap_tune_hooks th;
	struct tune_user tu;
	ap_task_pool pool;
	struct kernel_batch kb = { 0 };
	int rc;

	rc = ap_compile_parse_target(req->target, req->output, &r->gpu, &r->output, err);
	if (rc)
		return rc;
	r->target = req->target && *req->target ? req->target : "cpu";
	if (r->gpu) {
		ap_error why;
		if (ap_nvrtc_load(&why))
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target %.32s needs NVRTC: %.440s", r->target, why.msg);
		/* driver negotiation: the newest NVRTC whose output the client's
		 * driver loads (backend.h, ap_nvrtc_pick) */
		r->driver = req->device ? req->device->driver_version : 0;
		r->nvrtc = ap_nvrtc_pick(r->driver, r->output == APOLLO__OUTPUT_KIND__OUTPUT_CUBIN,
					 &why);
		if (r->nvrtc < 0)
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL, "target %.32s: %.440s",
					    r->target, why.msg);
	}
	/* The GPU the bundle will run on: its measured tuning records apply,
	 * so it is part of the keys (a host target ignores it). */
	if (r->gpu && req->device && req->device->name && *req->device->name) {
		ap_error why;

		rc = ap_compile_device_id(req->device->name, req->device->sm_count, r->device,
					  sizeof(r->device), &why);
		if (rc)
			return ap_error_set(err, rc, NULL, NULL, "request device: %s", why.msg);
		if (r->client)
			device_note(c, r->device, r->client);
	}
	/* Graph and request keys also name this build (see build_identity);
	 * kernel keys do not: they hash the kernel source itself.  Tuning
	 * records are not in the keys: a record that changes retires the
	 * bundles holding its kernel (ap_cache_bundle_tuned). */
	backend_id(c, r, kb.backend, sizeof(kb.backend));
	snprintf(bid, sizeof(bid), "%s | %s", kb.backend, c->build_id);
	if (r->driver)   /* the driver's major: bundles for two drivers kept apart */
		snprintf(bid + strlen(bid), sizeof(bid) - strlen(bid), " | driver %u", r->driver / 1000);
	if (r->device[0])
		snprintf(bid + strlen(bid), sizeof(bid) - strlen(bid), " | device %s", r->device);
	r->use_cache = ap_cache_enabled(c->cache) && !(req->options && req->options->no_cache);
	kb.c = c;
	kb.nvrtc = r->nvrtc;
	kb.target = r->target;
	kb.gpu = r->gpu;
	kb.output = r->output;
	r->mbt = req->options ? req->options->max_block_threads : 0;
	kb.use_cache = r->use_cache;
	kb.deadline = r->t0 + c->flight_wait_ms;
	kb.cancel = r->cancel;

	/* Warm path: a request seen before names its key; no graph needed. */
	if (r->use_cache && r->digest && memo_get(c, r->digest, gkey) &&
	    (*out = lookup(c, r, gkey, true))) {
		atomic_fetch_add(&c->memo_hits, 1);
		return 0;
	}

	t = ap_now_ms();
	if (req->source_case == APOLLO__COMPILE_REQUEST__SOURCE_ONNX_MODEL) {
		if (onnx_request_key(req, r->target, r->output, bid, rkey))
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		have_rkey = true;
		if ((*out = lookup(c, r, rkey, false)))
			return 0;
	}
	if ((rc = request_graph(req, &g, err)))
		return rc;
	r->import_ms = ap_now_ms() - t;

	/* The key hashes names too: the bundle binds params by name. */
	if (ap_graph_hash(g, graph_hash) || ap_graph_hash_named(g, named_hash) ||
	    ap_compile_graph_key(named_hash, r->target, r->output, req->options, bid, gkey)) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory hashing the graph");
		goto done;
	}
	if (r->use_cache && r->digest)
		memo_put(c, r->digest, gkey);
	if ((b = lookup(c, r, gkey, true))) {
		if (have_rkey) {
			size_t len = 0;
			uint8_t *val = pack_stripped(b, &len);
			t = ap_now_ms();
			if (val && ap_cache_put(c->cache, rkey, val, len) == 0)
				note_tuned(c, r, rkey, b);
			free(val);
			b->stats->cache_ms += ap_now_ms() - t;
		}
		*out = b;
		rc = 0;
		goto done;
	}

	/* Single-flight: wait for an identical request compiling now, or lead. */
	if (r->use_cache && c->flights) {
		int role = ap_flight_join(c->flights, gkey, &flight);

		if (role == AP_FLIGHT_FOLLOW) {
			rc = follow(c, r, flight, out, err);
			flight = NULL;
			if (rc) {
				rc = rc > 0 ? 0 : rc;
				goto done;
			}
		} else if (role == AP_FLIGHT_LEAD && (*out = lookup(c, r, gkey, false))) {
			rc = 0;   /* a flight stored it between our miss and our join */
			goto done;
		}
	}

	pool.run = run_tasks;
	pool.pool = c;
	if ((rc = build_options(c, req, r->target, r->device, r->use_cache, &pool, &bo, &th, &tu,
				err)))
		goto done;
	/* Optimistic: build with no backend hook and compile every kernel in
	 * parallel; the backend rejects a kernel almost never. */
	prog = ap_program_build(g, &bo, err);
	if (!prog) {
		rc = err->code ? err->code : AP_EINTERNAL;
		goto done;
	}
	if (c->stop_before_backend) {
		rc = ap_error_set(err, AP_EINTERNAL, NULL, NULL, "stopped before the backend");
		goto done;
	}
	if (r->cancel && atomic_load(r->cancel)) {
		rc = ap_error_set(err, AP_EBUSY, NULL, NULL, "cancelled: apollod is stopping");
		goto done;
	}

	t = ap_now_ms();
	blobs = calloc((size_t)prog->n_kernels + 1, sizeof(*blobs));
	if (!blobs) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto done;
	}
	rc = compile_kernels(c, &kb, prog, blobs, err);
	backend_ms = ap_now_ms() - t;
	if (rc == AP_ECOMPILE) {
		/* Upward feedback: the backend rejected a kernel.  Build again,
		 * the backend judging each kernel (rejected ones refused, so
		 * their fused groups are split), then take the blobs from the
		 * memo: every kernel is compiled once. */
		rc = rebuild_refused(c, g, &bo, &kb, &prog, &blobs, &compiled, &backend_ms, err);
		if (rc)
			goto done;
	} else if (rc) {
		goto done;
	} else {
		for (int i = 0; i < prog->n_kernels; i++)
			compiled += blobs[i].compiled;
	}
	atomic_fetch_add(&c->kernels_compiled, compiled);
	for (int i = 0; i < prog->n_kernels; i++)
		r->kernel_tier[blobs[i].tier & 3]++;

	b = build_bundle(prog, blobs, r->target, r->output, graph_hash, &oom);
	if (oom || !b) {
		b = bundle_free(b);
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory building the bundle");
		goto done;
	}
	b->stats->kernels = (uint32_t)prog->n_launches;
	b->stats->distinct_kernels = (uint32_t)prog->n_kernels;
	b->stats->layer1_changed = prog->layer_count[0];
	b->stats->layer2_stitched = prog->layer_count[1];
	b->stats->layer3_merged = prog->layer_count[2];
	b->stats->eager_kernels = prog->eager_kernels ? prog->eager_kernels : g->eager_kernels;
	b->stats->nodes = (uint32_t)g->n_nodes;
	b->stats->global_bytes = prog->global_bytes;
	b->stats->eager_bytes = prog->eager_bytes;
	b->stats->min_bytes = prog->min_bytes;
	b->stats->import_ms = r->import_ms;
	b->stats->partition_ms = prog->partition_ms;
	b->stats->codegen_ms = prog->codegen_ms;
	b->stats->layer1_ms = prog->layer1_ms;
	b->stats->tune_hits = prog->tune_hits;
	b->stats->tune_measured = prog->tune_measured;
	b->stats->tune_searched = prog->tune_searched;
	b->stats->tune_tried = prog->tune_tried;
	b->stats->tune_ms = prog->tune_ms;
	b->stats->tune_capped = prog->tune_capped;
	atomic_fetch_add(&c->tune_hits, prog->tune_hits);
	atomic_fetch_add(&c->tune_measured, prog->tune_measured);
	atomic_fetch_add(&c->tune_searched, prog->tune_searched);
	atomic_fetch_add(&c->tune_tried, prog->tune_tried);
	atomic_fetch_add(&c->tune_us, (uint64_t)(prog->tune_ms * 1000));
	b->stats->backend_ms = backend_ms;
	b->stats->kernels_compiled = compiled;
	b->stats->kernels_remote = r->kernel_tier[APOLLO__CACHE_TIER__CACHE_L2];
	b->stats->kernels_shared = r->kernel_tier[APOLLO__CACHE_TIER__CACHE_SHARED];
	b->stats->cache_hit = 0;
	b->stats->cache_tier = APOLLO__CACHE_TIER__CACHE_COMPILED;

	if (prog->tune_capped)
		/* the search budget is counted in evaluations, so that the
		 * bundle does not depend on the machine's load; this one's
		 * does: answered, not kept */
		ap_log(AP_LOG_WARN, "tuning: the time limit (tune_budget_ms = %.0f) cut %u kernel "
		       "searches short after %.1f ms; the bundle is not cached", c->tune_budget_ms,
		       prog->tune_capped, prog->tune_ms);
	if (r->use_cache && !prog->tune_capped) {   /* no_cache: neither read nor write */
		size_t len = 0;
		uint8_t *val;

		t = ap_now_ms();
		b->stats->cache_ms = r->cache_ms;
		b->stats->compile_ms = ap_now_ms() - r->t0;
		val = pack_stripped(b, &len);
		if (val) {
			if (ap_cache_put(c->cache, gkey, val, len) == 0)
				note_tuned(c, r, gkey, b);
			if (have_rkey && ap_cache_put(c->cache, rkey, val, len) == 0)
				note_tuned(c, r, rkey, b);
			if (c->redis)
				store_l2(c, gkey, b, val, len);
		}
		free(val);
		r->cache_ms += ap_now_ms() - t;
	}
	b->stats->cache_ms = r->cache_ms;
	b->stats->compile_ms = ap_now_ms() - r->t0;
	*out = b;
	rc = 0;
done:
	if (flight)
		publish(c, flight, rc, err, rc ? NULL : *out);
	if (blobs && prog)
		for (int i = 0; i < prog->n_kernels; i++)
			free(blobs[i].data);
	free(blobs);
	ap_program_free(prog);
	ap_graph_free(g);
	return rc;
}

Apollo__CompileResponse *ap_compile_run(ap_compiler *c, const Apollo__CompileRequest *req)
{
	return ap_compile_run_digest(c, req, NULL);
}

/* Counts an answer: its tier and kernels, or its error code. */
static void count_answer(ap_compiler *c, const struct request *r, const Apollo__Bundle *b, int rc)
{
	int tier;

	if (rc || !b) {
		atomic_fetch_add(&c->errors, 1);
		if (rc < 0 && rc > -16)
			atomic_fetch_add(&c->errors_by_code[-rc], 1);
		return;
	}
	tier = b->stats->cache_hit ? (int)b->stats->cache_tier & 3 : APOLLO__CACHE_TIER__CACHE_COMPILED;
	atomic_fetch_add(b->stats->cache_hit ? &c->hits : &c->misses, 1);
	atomic_fetch_add(&c->tier[tier], 1);
	if (tier != APOLLO__CACHE_TIER__CACHE_COMPILED)
		return;
	for (int i = 0; i < 4; i++)
		atomic_fetch_add(&c->kernel_tier[i], r->kernel_tier[i]);
	pthread_mutex_lock(&c->hist_mu);
	{
		double sec = b->stats->compile_ms / 1e3;
		int k = 0;

		while (k < AP_COMPILE_BUCKETS && sec > ap_compile_bucket_s[k])
			k++;
		c->hist[k]++;
		c->hist_sum += sec;
	}
	pthread_mutex_unlock(&c->hist_mu);
}

/* Kernels whose blobs are the same bytes (compiled as one program, or
 * fetched so) carry them once: each later one keeps its digest and points
 * at the first (Kernel.blob_of), its own copy freed. */
static void share_blobs(Apollo__Bundle *b)
{
	for (size_t k = 1; k < b->n_kernels; k++) {
		Apollo__Kernel *kk = b->kernels[k];

		for (size_t j = 0; j < k; j++) {
			const Apollo__Kernel *o = b->kernels[j];

			if (o->blob_of || o->digest.len != 32 || kk->digest.len != 32 ||
			    memcmp(o->digest.data, kk->digest.data, 32) || o->blob.len != kk->blob.len)
				continue;
			free(kk->blob.data);
			kk->blob.data = NULL;
			kk->blob.len = 0;
			kk->blob_of = (uint32_t)j + 1;
			break;
		}
	}
}

int ap_compiler_build_program(ap_compiler *c, const Apollo__CompileRequest *req, ap_graph **g,
			      ap_program **prog, ap_error *err)
{
	ap_build_options bo;
	ap_tune_hooks th;
	struct tune_user tu;
	ap_task_pool pool = { .run = run_tasks, .pool = c };
	bool gpu;
	int output, rc;
	const char *target = req->target && *req->target ? req->target : "cpu";
	char device[160] = "";

	*g = NULL;
	*prog = NULL;
	if ((rc = ap_compile_parse_target(req->target, req->output, &gpu, &output, err)))
		goto fail;
	if (gpu && req->device && req->device->name && *req->device->name &&
	    (rc = ap_compile_device_id(req->device->name, req->device->sm_count, device,
				       sizeof(device), err)))
		goto fail;
	if ((rc = request_graph(req, g, err)) ||
	    (rc = build_options(c, req, target, device, ap_cache_enabled(c->cache), &pool, &bo,
				&th, &tu, err)))
		goto fail;
	if ((*prog = ap_program_build(*g, &bo, err)))
		return 0;
	rc = err->code ? err->code : AP_EINTERNAL;
fail:
	*g = ap_graph_free(*g);
	return rc;
}

int ap_compiler_compile_bundle(ap_compiler *c, const Apollo__CompileRequest *req,
			       const atomic_bool *cancel, Apollo__Bundle **out, ap_error *err)
{
	struct request r = { .req = req, .cancel = cancel, .t0 = ap_now_ms() };
	int rc;

	*out = NULL;
	if ((rc = run(c, &r, out, err)))
		return rc;
	if (!*out)
		return ap_error_set(err, AP_EINTERNAL, NULL, NULL, "no bundle and no error");
	share_blobs(*out);
	return 0;
}


Apollo__CompileResponse *ap_compile_run_digest(ap_compiler *c, const Apollo__CompileRequest *req,
					       const uint8_t *digest)
{
	return ap_compile_run_as(c, req, digest, NULL);
}

Apollo__CompileResponse *ap_compile_run_as(ap_compiler *c, const Apollo__CompileRequest *req,
					   const uint8_t *digest, const char *client)
{
	struct request r = { .req = req, .digest = digest, .client = client, .t0 = ap_now_ms() };
	Apollo__CompileResponse *resp = malloc(sizeof(*resp));
	Apollo__Bundle *b = NULL;
	ap_error err;
	int rc;

	if (!resp)
		return NULL;
	apollo__compile_response__init(resp);
	ap_error_clear(&err);
	atomic_fetch_add(&c->requests, 1);
	if (c->delay_ms) {
		struct timespec ts = { c->delay_ms / 1000, (long)(c->delay_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	rc = run(c, &r, &b, &err);
	count_answer(c, &r, b, rc ? rc : b ? 0 : AP_EINTERNAL);
	if (rc == 0 && b) {
		/* kernels searched just now: their candidates are refined and
		 * timed in the background (autotune.h) */
		if (c->autotune && r.gpu && !b->stats->cache_hit && b->stats->tune_searched &&
		    !(req->options && req->options->tune_variant))
			ap_autotune_submit(c->autotune, req);
		share_blobs(b);
		resp->result_case = APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE;
		resp->bundle = b;
		ap_log(AP_LOG_DEBUG, "compiled %zu kernels for %s in %.1f ms%s", b->n_kernels,
		       b->target, b->stats->compile_ms, b->stats->cache_hit ? " (cache hit)" : "");
		return resp;
	}
	if (!rc)
		rc = ap_error_set(&err, AP_EINTERNAL, NULL, NULL, "no bundle and no error");
	{
		Apollo__Error *e = malloc(sizeof(*e));
		if (!e) {
			free(resp);
			return NULL;
		}
		apollo__error__init(e);
		e->code = (Apollo__ErrorCode)ap_error_wire_code(rc);
		e->message = strdup(err.msg[0] ? err.msg : ap_error_name(rc));
		e->node = strdup(err.node);
		e->tensor = strdup(err.tensor);
		resp->result_case = APOLLO__COMPILE_RESPONSE__RESULT_ERROR;
		resp->error = e;
		if (!e->message || !e->node || !e->tensor) {
			ap_compile_response_free(resp);
			return NULL;
		}
	}
	ap_log(AP_LOG_INFO, "compile request failed (%s): %s%s%s", ap_error_name(rc), err.msg,
	       err.node[0] ? " at node " : "", err.node);
	return resp;
}

void ap_compile_response_free(Apollo__CompileResponse *r)
{
	if (r)
		apollo__compile_response__free_unpacked(r, NULL);
}
