/* compile.c -- the compile job (see compile.h): request -> graph -> cache
 * -> program -> backend -> bundle.  Its parts: keys and targets (keys.c),
 * the kernels' parallel compile and backend refusals (kernels.c), the reply
 * bundle (bundle.c), the tuning hooks and reports (tuning.c; the records
 * themselves: server/tune/records.h); the shared state in
 * compile_internal.h.
 *
 * Approach: the job is a straight line; each step either fills the next
 * structure or stops with an ap_error, which becomes the reply's Error.
 * Every protobuf message of the reply is allocated with malloc, field by
 * field, exactly as protobuf-c's unpacker would, so one call to
 * apollo__compile_response__free_unpacked() frees a fresh reply and a reply
 * rebuilt from the cache alike.
 *
 * Cache tiers (issue 10): L1 is the SQLite file (cache.h), L2 the shared
 * Redis (redis.h), read and written through cache/tiers.h (the policy,
 * once for bundles, kernels, blobs and tuning records; this file gives it
 * the bundle's check, from_cache and from_l2).  A request looks in L1,
 * then L2; an L2 hit (the
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
 * Cluster leases (lease.h, issue 26 item 1): a request flight's leader
 * that misses L1 once more claims the graph key's lease in Redis before
 * compiling (claim_lease): held by another daemon, it waits for that
 * daemon's entry in L2 (tier L2) within the same bound as a follower,
 * taking the lease over when its holder lapses; holding it, it compiles
 * and releases it after store_compiled wrote L2 (or on failure), in
 * run()'s epilogue.  So a cold graph submitted to every node at once is
 * compiled by one; its kernels have leases of their own (kernels.c), so
 * that two cold graphs sharing a kernel compile it once.  Test hooks:
 * $APOLLO_TEST_LEASE_HOLD_MS=MS (read once, when the compiler is created)
 * sleeps that long after taking a request's lease, before compiling, so
 * that a test can kill the holder mid-compile;
 * $APOLLO_TEST_KERNEL_LEASE_HOLD_MS=MS the same after a request took its
 * kernels' leases, before compiling them.
 *
 * Warm path: the daemon remembers, for the digest of a request's bytes
 * (net.c), the graph key it computed (a direct-mapped table of MEMO_SLOTS
 * entries, last writer wins).  A request seen before goes straight to the
 * cache tiers with that key; only a miss decodes, validates and hashes its
 * graph.  The key is a function of the request bytes and this build, so
 * the memo needs no invalidation.
 */
#include "compile_internal.h"

#include "../../common/frame.h"

const double ap_compile_bucket_s[AP_COMPILE_BUCKETS] = {
	0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
};

const char *const ap_stage_names[AP_STAGES] = {
	"import", "partition", "layer1", "tuning", "codegen", "backend", "cache",
};

const double ap_stage_bucket_s[AP_STAGE_BUCKETS] = { 0.001, 0.01, 0.1, 1, 10 };

/* ---- set-up -------------------------------------------------------------- */

/* "cc <$APOLLO_CC>[ (no clones)]: <first line of its --version>" or
 * "...: unknown". */
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
	snprintf(buf, cap, "cc %s%s: %s", cc, ap_hostcc_clones() ? "" : " (no clones)", line[0] ? line : "unknown");
}

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
	const char *hold = getenv("APOLLO_TEST_LEASE_HOLD_MS");
	const char *khold = getenv("APOLLO_TEST_KERNEL_LEASE_HOLD_MS");
	const char *nv;

	if (!c)
		return NULL;
	c->cache = cache;
	c->redis = opt ? opt->redis : NULL;
	c->tiers = ap_tiers_new(cache, c->redis);
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
	if (hold && *hold)
		c->lease_hold_ms = (unsigned)strtoul(hold, NULL, 10);
	if (khold && *khold)
		c->klease_hold_ms = (unsigned)strtoul(khold, NULL, 10);
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
	if (!c->helpers || !c->memo || !c->devices || !c->tiers ||
	    (!(opt && opt->no_flight) && (!c->flights || !c->kflights)))
		return ap_compiler_free(c);
	for (unsigned t = 1; t < c->threads; t++) {
		if (pthread_create(&c->helpers[c->n_helpers], NULL, ap__compile_helper_main, c))
			break;   /* fewer helpers: slower, still correct */
		c->n_helpers++;
	}
	if (c->redis && c->flights && opt && opt->lease_ms &&
	    !(c->leases = ap_leases_new(c->redis, opt->lease_ms < 3 ? 3 : opt->lease_ms)))
		ap_log(AP_LOG_WARN, "no cluster leases (out of memory or threads): every daemon "
		       "compiles a cold graph it is asked for");
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
	ap_leases_free(c->leases);
	pthread_cond_destroy(&c->work);
	pthread_mutex_destroy(&c->mu);
	ap_flights_free(c->flights);
	ap_flights_free(c->kflights);
	free(c->memo);
	free(c->devices);
	ap_tiers_free(c->tiers);
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
	out->tune_capped = atomic_load(&m->tune_capped);
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
	ap_leases_get_counts(m->leases, AP_REDIS_ACTION, &out->lease);
	ap_leases_get_counts(m->leases, AP_REDIS_KERNEL, &out->kernel_lease);
	pthread_mutex_lock(&m->hist_mu);
	memcpy(out->compile_hist, m->hist, sizeof(out->compile_hist));
	out->compile_sum_s = m->hist_sum;
	memcpy(out->stage_hist, m->stage_hist, sizeof(out->stage_hist));
	memcpy(out->stage_sum_s, m->stage_sum, sizeof(out->stage_sum_s));
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

ap_tiers *ap_compiler_tiers(const ap_compiler *c)
{
	return c ? c->tiers : NULL;
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

static void memo_put(ap_compiler *c, const uint8_t digest[32], const uint8_t key[32],
		     const ap_compile_admit *admit)
{
	struct memo_slot *m = memo_slot(c, digest);

	pthread_mutex_lock(&c->memo_mu);
	m->used = true;
	memcpy(m->digest, digest, 32);
	memcpy(m->key, key, 32);
	m->has_admit = admit != NULL;
	if (admit)
		m->admit = *admit;
	pthread_mutex_unlock(&c->memo_mu);
}

bool ap_compile_memo_admit(ap_compiler *c, const uint8_t digest[32], ap_compile_admit *out)
{
	struct memo_slot *m = memo_slot(c, digest);
	bool found;

	pthread_mutex_lock(&c->memo_mu);
	found = m->used && m->has_admit && !memcmp(m->digest, digest, 32);
	if (found)
		*out = m->admit;
	pthread_mutex_unlock(&c->memo_mu);
	return found;
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
	struct blob_ref *refs;     /* the blobs a bundle from L1 borrows (from_cache) */
	size_t n_refs;
	const ap_compile_admit *admit;   /* how net.c admitted it (memo_put); NULL */
	bool want_frame;           /* ap_compile_run_frame: a warm answer may be spliced */
	uint64_t frame_id;         /* ... the Envelope's id */
	uint8_t *frame;            /* ... the spliced answer (warm_frame), or NULL */
	size_t frame_len;
	double warm_t0;            /* when warm_frame's lookup began */
	struct ap__progress *progress;   /* its stage events; NULL: none */
};

/* What ap_compile_run_as hands out: the response first (its address is the
 * reply's), then the blobs its bundle borrows from the memory tier, given
 * back by ap_compile_response_free. */
struct reply {
	Apollo__CompileResponse resp;
	struct blob_ref *refs;
	size_t n_refs;
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
			    ap_tune_records_local(c->tiers, p->tune_signature.data, r->target, r->device,
						  &rec) == 1 &&
			    strcmp(rec.config, p->schedule ? p->schedule : ""))
				return true;
		}
	return false;
}

/* Rebuilds a reply from a stored (stripped) bundle: each distinct blob is
 * fetched by digest once, verified, and lent to the bundle by reference
 * (ap_cache_blob_ref: no copy; the references go to r->refs), and every
 * later kernel naming the same digest points at the first one that
 * carries it (Kernel.blob_of, ap__compile_blob_owner), as share_blobs
 * would make it.  So a warm answer's blobs are copied once, into the
 * reply's frame, whatever the number of kernels sharing a program's blob
 * (issue 26, item 2).  NULL when anything is missing. */
static Apollo__Bundle *from_cache(ap_compiler *c, struct request *r, const uint8_t *val,
				  size_t len)
{
	Apollo__Bundle *b = apollo__bundle__unpack(NULL, len, val);
	struct blob_ref *refs;
	size_t n = 0;

	if (!b)
		return NULL;
	refs = malloc((b->n_kernels ? b->n_kernels : 1) * sizeof(*refs));
	if (!refs)
		return ap__compile_bundle_free(b);
	for (size_t i = 0; i < b->n_kernels; i++) {
		Apollo__Kernel *k = b->kernels[i];
		ap_blob *blob = NULL;

		free(k->blob.data);   /* stored stripped: nothing */
		k->blob.data = NULL;
		k->blob.len = 0;
		k->blob_of = 0;
		if (k->digest.len != 32)
			return ap__compile_bundle_release(b, refs, n);
		if ((k->blob_of = ap__compile_blob_owner(b, i)))
			continue;
		if (ap_cache_blob_ref(c->cache, k->digest.data, &blob) != 1)
			return ap__compile_bundle_release(b, refs, n);
		k->blob.data = (uint8_t *)ap_blob_data(blob);
		k->blob.len = ap_blob_len(blob);
		refs[n].kernel = i;
		refs[n++].blob = blob;
	}
	if (!b->stats) {
		b->stats = malloc(sizeof(*b->stats));
		if (!b->stats)
			return ap__compile_bundle_release(b, refs, n);
		apollo__stats__init(b->stats);
	}
	r->refs = refs;
	r->n_refs = n;
	return b;
}

/* Gives a bundle from the cache (its blobs borrowed: r->refs) copies of
 * its own, so that it is freed as any bundle (ap_compiler_compile_bundle's
 * callers).  0, or AP_ENOMEM with the bundle freed.  The references are
 * given back either way. */
static int own_blobs(struct request *r, Apollo__Bundle **b)
{
	bool oom = false;

	for (size_t i = 0; i < r->n_refs; i++) {
		Apollo__Kernel *k = (*b)->kernels[r->refs[i].kernel];
		uint8_t *copy = oom ? NULL : malloc(k->blob.len ? k->blob.len : 1);

		if (copy && k->blob.len)
			memcpy(copy, k->blob.data, k->blob.len);
		oom = !copy;
		k->blob.data = copy;
		if (!copy)
			k->blob.len = 0;
		ap_blob_release(r->refs[i].blob);
	}
	free(r->refs);
	r->refs = NULL;
	r->n_refs = 0;
	if (oom)
		*b = ap__compile_bundle_free(*b);
	return oom ? AP_ENOMEM : 0;
}

/* An L2 action entry (the stripped bundle, then the distinct blobs its
 * kernels name, each hashed once by the tiers) as a bundle: every kernel
 * given a copy of the blob matching its digest, which the tiers then copy
 * into L1 (a->keep) with the bundle under the key.  NULL when anything
 * does not fit (refused: a miss, nothing copied). */
static Apollo__Bundle *from_l2(ap_compiler *c, const struct request *r, const ap_tier_action *a)
{
	Apollo__Bundle *b = apollo__bundle__unpack(NULL, a->len, a->bundle);

	if (!b || (size_t)a->n_blobs > b->n_kernels || (a->n_blobs == 0 && b->n_kernels > 0))
		return ap__compile_bundle_free(b);
	if (stale_tuning(c, r, b))
		return ap__compile_bundle_free(b);   /* built before this device's measured records */
	for (size_t i = 0; i < b->n_kernels; i++) {
		Apollo__Kernel *k = b->kernels[i];
		uint8_t *copy;
		int p = 0;

		/* a blob already carried by an earlier kernel: named, not copied */
		free(k->blob.data);
		k->blob.data = NULL;
		k->blob.len = 0;
		k->blob_of = 0;
		if ((k->blob_of = ap__compile_blob_owner(b, i)))
			continue;
		while (p < a->n_blobs && (k->digest.len != 32 || memcmp(a->digest[p], k->digest.data, 32)))
			p++;
		if (p == a->n_blobs) {
			ap_log(AP_LOG_WARN, "shared cache: kernel %zu of a signed bundle has no blob "
			       "matching its digest; not served", i);
			return ap__compile_bundle_free(b);
		}
		copy = malloc(a->blob_len[p] ? a->blob_len[p] : 1);
		if (!copy)
			return ap__compile_bundle_free(b);
		memcpy(copy, a->blob[p], a->blob_len[p]);
		k->blob.data = copy;
		k->blob.len = a->blob_len[p];
		a->keep[p] = true;
	}
	if (!b->stats) {
		b->stats = malloc(sizeof(*b->stats));
		if (!b->stats)
			return ap__compile_bundle_free(b);
		apollo__stats__init(b->stats);
	}
	return b;
}

/* A lookup's bundle (ap_tiers_action_get's check). */
struct found {
	ap_compiler *c;
	struct request *r;
	Apollo__Bundle *b;
};

/* Takes a stored bundle: from L1 (from_cache) or from L2 (from_l2). */
static bool take_bundle(void *user, int tier, const ap_tier_action *a)
{
	struct found *f = user;

	f->b = tier == AP_TIER_L1 ? from_cache(f->c, f->r, a->bundle, a->len)
				  : from_l2(f->c, f->r, a);
	return f->b != NULL;
}

/* Sets a cached bundle's stats for this request (a hit from `tier`). */
static void set_hit_stats(Apollo__Stats *st, const struct request *r, int tier)
{
	st->cache_hit = 1;
	st->cache_tier = (Apollo__CacheTier)tier;
	st->kernels_compiled = 0;
	st->kernels_remote = 0;
	st->kernels_shared = 0;
	st->import_ms = r->import_ms;
	st->partition_ms = 0;
	st->codegen_ms = 0;
	st->layer1_ms = 0;
	st->backend_ms = 0;
	st->cache_ms = r->cache_ms;
	st->compile_ms = ap_now_ms() - r->t0;
}

static void hit_stats(Apollo__Bundle *b, const struct request *r, int tier)
{
	set_hit_stats(b->stats, r, tier);
}

/* ap__compile_warm_frame's stats: an L1 hit's, the lookup's time (its
 * blobs' included) in cache_ms. */
static void warm_stats(Apollo__Stats *st, void *user)
{
	struct request *r = user;

	r->cache_ms += ap_now_ms() - r->warm_t0;
	set_hit_stats(st, r, APOLLO__CACHE_TIER__CACHE_L1);
}

/* The warm path's answer as a frame (ap_compile_run_frame): the bundle
 * stored under `key` in L1, taken by reference, its bytes spliced with
 * the blobs and this request's stats (ap__compile_warm_frame) -- the same
 * bytes as packing the bundle lookup() would give, without decoding it.
 * True with r->frame set; false when L1 has no bundle under `key` or its
 * bytes do not splice (then the decoding path answers). */
static bool warm_frame(ap_compiler *c, struct request *r, const uint8_t key[32])
{
	ap_blob *val = NULL;

	r->warm_t0 = ap_now_ms();
	if (ap_tiers_action_ref(c->tiers, key, &val) != AP_TIER_L1)
		return false;
	r->frame = ap__compile_warm_frame(c->cache, ap_blob_data(val), ap_blob_len(val),
					  r->frame_id, warm_stats, r, &r->frame_len);
	ap_blob_release(val);
	return r->frame != NULL;
}

/* Looks `key` up in L1, then (with `l2`) in L2 (cache/tiers.h: an L2 hit
 * is copied into L1, and its tuned kernels noted); on a hit returns the
 * bundle with this request's stats. */
static Apollo__Bundle *lookup(ap_compiler *c, struct request *r, const uint8_t key[32], bool l2)
{
	double t = ap_now_ms();
	struct found f = { c, r, NULL };
	bool copied = false;
	int tier;

	if (!r->use_cache)
		return NULL;
	tier = ap_tiers_action_get(c->tiers, key, l2 ? 0 : AP_TIERS_L1_ONLY, take_bundle, &f,
				   &copied);
	if (tier == AP_TIER_L2 && copied)
		note_tuned(c, r, key, f.b);
	r->cache_ms += ap_now_ms() - t;
	if (f.b)
		hit_stats(f.b, r, tier);
	return f.b;
}

/* Stores the stripped bundle `val` (len bytes) of compiled bundle b under
 * `key` through the tiers (L1; with `l2`, L2 too, with each distinct blob
 * of its kernels once: kernels compiled as one program share one, and
 * from_l2 matches them to kernels by digest).  L1's result: 0 or
 * negative. */
static int store_bundle(ap_compiler *c, const uint8_t key[32], const Apollo__Bundle *b,
			const uint8_t *val, size_t len, bool l2)
{
	const uint8_t **blobs = NULL;
	size_t *lens = NULL;
	int n = 0, rc;

	if (l2 && c->redis) {
		if (b->n_kernels < INT_MAX) {
			blobs = calloc(b->n_kernels + 1, sizeof(*blobs));
			lens = calloc(b->n_kernels + 1, sizeof(*lens));
		}
		for (size_t i = 0; blobs && lens && i < b->n_kernels; i++) {
			bool seen = false;

			for (size_t j = 0; j < i && !seen; j++)
				seen = !memcmp(b->kernels[j]->digest.data, b->kernels[i]->digest.data, 32);
			if (seen)
				continue;
			blobs[n] = b->kernels[i]->blob.data;
			lens[n++] = b->kernels[i]->blob.len;
		}
		if (!blobs || !lens)   /* out of memory: L1 only, as the sharing fails open */
			l2 = false;
	}
	rc = ap_tiers_action_put(c->tiers, key, l2 ? 0 : AP_TIERS_L1_ONLY, val, len, n, blobs, lens);
	free(blobs);
	free(lens);
	return rc;
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
		*out = ap__compile_bundle_free(*out);
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
		.tma = o && o->tma,
		.unvalidated = o && o->unvalidated,
		.no_layer1 = o && o->no_layer1,
		.host_check = o && o->host_check,
	};
	*tu = (struct tune_user){c, target, r_device, o && o->tune_variant};
	*th = (ap_tune_hooks){
		.target = target,
		.budget_evals = c->tune_budget_evals,
		.budget_ms = c->tune_budget_ms,
		.variant = o ? o->tune_variant : 0,
		.lookup = use_cache ? ap__compile_tune_lookup : NULL,
		.store = use_cache ? ap__compile_tune_store : NULL,
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

/* The request's target checked; for a GPU target, the NVRTC whose output
 * the client's driver loads (ap_nvrtc_pick) and the device's id, noted as
 * one this client named.  Fills r->gpu, output, target, driver, nvrtc,
 * device.  0, or AP_EUNSUPPORTED (no NVRTC, none the driver loads, an
 * unknown target), AP_EINVAL (a bad device name) with `err` set. */
static int resolve_target(ap_compiler *c, struct request *r, ap_error *err)
{
	const Apollo__CompileRequest *req = r->req;
	ap_error why;
	int rc;

	rc = ap_compile_parse_target(req->target, req->output, &r->gpu, &r->output, err);
	if (rc)
		return rc;
	r->target = req->target && *req->target ? req->target : "cpu";
	if (!r->gpu)
		return 0;
	if (ap_nvrtc_load(&why))
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "target %.32s needs NVRTC: %.440s", r->target, why.msg);
	/* driver negotiation: the newest NVRTC whose output the client's
	 * driver loads (backend.h, ap_nvrtc_pick) */
	r->driver = req->device ? req->device->driver_version : 0;
	r->nvrtc = ap_nvrtc_pick(r->driver, r->output == APOLLO__OUTPUT_KIND__OUTPUT_CUBIN, &why);
	if (r->nvrtc < 0)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL, "target %.32s: %.440s",
				    r->target, why.msg);
	/* The GPU the bundle will run on: its measured tuning records apply,
	 * so it is part of the keys (a host target ignores it). */
	if (req->device && req->device->name && *req->device->name) {
		rc = ap_compile_device_id(req->device->name, req->device->sm_count, r->device,
					  sizeof(r->device), &why);
		if (rc)
			return ap_error_set(err, rc, NULL, NULL, "request device: %s", why.msg);
		if (r->client)
			ap__compile_device_note(c, r->device, r->client);
	}
	return 0;
}

/* The identity that graph and request keys name (bid, cap bytes: the
 * backend, this build, the driver's major, the device) and the request's
 * kernel batch (kb: target, backend, cache use, flight deadline).  Graph
 * and request keys name this build (see build_identity); kernel keys do
 * not: they hash the kernel source itself.  Tuning records are not in the
 * keys: a record that changes retires the bundles holding its kernel
 * (ap_cache_bundle_tuned). */
static void request_identity(ap_compiler *c, struct request *r, struct kernel_batch *kb,
			     char *bid, size_t cap)
{
	const Apollo__CompileRequest *req = r->req;

	backend_id(c, r, kb->backend, sizeof(kb->backend));
	snprintf(bid, cap, "%s | %s", kb->backend, c->build_id);
	if (r->driver)   /* the driver's major: bundles for two drivers kept apart */
		snprintf(bid + strlen(bid), cap - strlen(bid), " | driver %u", r->driver / 1000);
	if (r->device[0])
		snprintf(bid + strlen(bid), cap - strlen(bid), " | device %s", r->device);
	r->use_cache = ap_cache_enabled(c->cache) && !(req->options && req->options->no_cache);
	kb->c = c;
	kb->nvrtc = r->nvrtc;
	kb->target = r->target;
	kb->gpu = r->gpu;
	kb->output = r->output;
	r->mbt = req->options ? req->options->max_block_threads : 0;
	kb->use_cache = r->use_cache;
	kb->deadline = r->t0 + c->flight_wait_ms;
	kb->cancel = r->cancel;
	kb->progress = r->progress;
}

/* Builds the program of graph `g` (partition, fusion, tuning, lowering)
 * and compiles its kernels: optimistically all in parallel with no backend
 * hook, and again with the hook when the backend refused one (upward
 * feedback, kernels.c).  0 with *progp and *blobsp (one blob per kernel;
 * the caller frees both, also on error), *compiled (backend compiles) and
 * *backend_ms; or the error with `err` set (the builder's, the backend's
 * AP_ECOMPILE for a single-node kernel, AP_EBUSY when cancelled, AP_ENOMEM,
 * AP_EINTERNAL for the test hook stop_before_backend). */
static int compile_program(ap_compiler *c, struct request *r, const ap_graph *g,
			   struct kernel_batch *kb, ap_program **progp, struct kblob **blobsp,
			   unsigned *compiled, double *backend_ms, ap_error *err)
{
	ap_build_options bo;
	ap_tune_hooks th;
	struct tune_user tu;
	ap_task_pool pool = { .run = ap__compile_run_tasks, .pool = c };
	double t;
	int rc;

	if ((rc = build_options(c, r->req, r->target, r->device, r->use_cache, &pool, &bo, &th, &tu,
				err)))
		return rc;
	if (r->progress && r->progress->to) {
		bo.stage_begin = ap__progress_stage;
		bo.stage_user = r->progress;
	}
	*progp = ap_program_build(g, &bo, err);
	if (!*progp)
		return err->code ? err->code : AP_EINTERNAL;
	if (c->stop_before_backend)
		return ap_error_set(err, AP_EINTERNAL, NULL, NULL, "stopped before the backend");
	if (r->cancel && atomic_load(r->cancel))
		return ap_error_set(err, AP_EBUSY, NULL, NULL, "cancelled: apollod is stopping");
	t = ap_now_ms();
	*blobsp = calloc((size_t)(*progp)->n_kernels + 1, sizeof(**blobsp));
	if (!*blobsp)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	rc = ap__compile_kernels(c, kb, *progp, *blobsp, err);
	*backend_ms = ap_now_ms() - t;
	if (rc == AP_ECOMPILE)
		/* Upward feedback: the backend rejected a kernel.  Build again,
		 * the backend judging each kernel (rejected ones refused, so
		 * their fused groups are split), then take the blobs from the
		 * memo: every kernel is compiled once. */
		return ap__compile_rebuild_refused(c, g, &bo, kb, progp, blobsp, compiled, backend_ms,
						   err);
	if (rc)
		return rc;
	for (int i = 0; i < (*progp)->n_kernels; i++)
		*compiled += (*blobsp)[i].compiled;
	return 0;
}

/* Fills a freshly compiled bundle's stats from its program, graph and
 * request, and adds the tuning counts to the compiler's. */
static void compiled_stats(ap_compiler *c, const struct request *r, const ap_graph *g,
			   const ap_program *prog, double backend_ms, unsigned compiled,
			   Apollo__Bundle *b)
{
	Apollo__Stats *st = b->stats;

	st->kernels = (uint32_t)prog->n_launches;
	st->distinct_kernels = (uint32_t)prog->n_kernels;
	st->layer1_changed = prog->layer_count[0];
	st->layer2_stitched = prog->layer_count[1];
	st->layer3_merged = prog->layer_count[2];
	st->eager_kernels = prog->eager_kernels ? prog->eager_kernels : g->eager_kernels;
	st->nodes = (uint32_t)g->n_nodes;
	st->global_bytes = prog->global_bytes;
	st->eager_bytes = prog->eager_bytes;
	st->min_bytes = prog->min_bytes;
	st->peak_bytes = prog->peak_bytes;
	st->input_bytes = prog->input_bytes;
	st->output_bytes = prog->output_bytes;
	st->const_bytes = prog->const_bytes;
	st->import_ms = r->import_ms;
	st->partition_ms = prog->partition_ms;
	st->codegen_ms = prog->codegen_ms;
	st->layer1_ms = prog->layer1_ms;
	st->tune_hits = prog->tune_hits;
	st->tune_measured = prog->tune_measured;
	st->tune_searched = prog->tune_searched;
	st->tune_tried = prog->tune_tried;
	st->tune_ms = prog->tune_ms;
	st->tune_capped = prog->tune_capped;
	atomic_fetch_add(&c->tune_hits, prog->tune_hits);
	atomic_fetch_add(&c->tune_measured, prog->tune_measured);
	atomic_fetch_add(&c->tune_searched, prog->tune_searched);
	atomic_fetch_add(&c->tune_tried, prog->tune_tried);
	atomic_fetch_add(&c->tune_capped, prog->tune_capped);
	atomic_fetch_add(&c->tune_us, (uint64_t)(prog->tune_ms * 1000));
	st->backend_ms = backend_ms;
	st->kernels_compiled = compiled;
	st->kernels_remote = r->kernel_tier[APOLLO__CACHE_TIER__CACHE_L2];
	st->kernels_shared = r->kernel_tier[APOLLO__CACHE_TIER__CACHE_SHARED];
	st->cache_hit = 0;
	st->cache_tier = APOLLO__CACHE_TIER__CACHE_COMPILED;
}

/* Stores a compiled bundle under its graph key (and its ONNX request key,
 * rkey when not NULL) in L1 and L2, unless the tuning time limit cut a
 * search short (then the bundle depends on the machine's load: answered,
 * not kept).  Failures to store are the cache's to log; the reply stands. */
static void store_compiled(ap_compiler *c, struct request *r, const uint8_t gkey[32],
			   const uint8_t *rkey, Apollo__Bundle *b, unsigned tune_capped,
			   double tune_ms)
{
	size_t len = 0;
	uint8_t *val;
	double t;

	if (tune_capped)
		/* the search budget is counted in evaluations, so that the
		 * bundle does not depend on the machine's load; this one's
		 * does: answered, not kept */
		ap_log(AP_LOG_WARN, "tuning: the time limit (tune_budget_ms = %.0f) cut %u kernel "
		       "searches short after %.1f ms; the bundle is not cached", c->tune_budget_ms,
		       tune_capped, tune_ms);
	if (!r->use_cache || tune_capped)   /* no_cache: neither read nor write */
		return;
	t = ap_now_ms();
	b->stats->cache_ms = r->cache_ms;
	b->stats->compile_ms = ap_now_ms() - r->t0;
	val = ap__compile_pack_stripped(b, &len);
	if (val) {
		if (store_bundle(c, gkey, b, val, len, true) == 0)
			note_tuned(c, r, gkey, b);
		if (rkey && store_bundle(c, rkey, b, val, len, false) == 0)
			note_tuned(c, r, rkey, b);
	}
	free(val);
	r->cache_ms += ap_now_ms() - t;
}

/* A cached bundle found by graph key answers an ONNX request: stored under
 * its request key too, so that the next one skips the import. */
static void store_request_key(ap_compiler *c, const struct request *r, const uint8_t rkey[32],
			      Apollo__Bundle *b)
{
	size_t len = 0;
	uint8_t *val = ap__compile_pack_stripped(b, &len);
	double t = ap_now_ms();

	if (val && store_bundle(c, rkey, b, val, len, false) == 0)
		note_tuned(c, r, rkey, b);
	free(val);
	b->stats->cache_ms += ap_now_ms() - t;
}

/* claim_lease's probe of L2 while it waits: the bundle, when found. */
struct l2_probe {
	ap_compiler *c;
	struct request *r;
	const uint8_t *key;
	Apollo__Bundle *b;
};

static bool l2_found(void *user)
{
	struct l2_probe *p = user;

	p->b = lookup(p->c, p->r, p->key, true);
	return p->b != NULL;
}

/* The cluster lease of a request this daemon leads (lease.h): > 0 when
 * *out answers (another daemon's entry, from L2), 0 to compile (*lease:
 * held, to be released once the bundle is stored; or NULL: alone). */
static int claim_lease(ap_compiler *c, struct request *r, const uint8_t gkey[32],
		       ap_lease **lease, Apollo__Bundle **out)
{
	struct l2_probe p = { c, r, gkey, NULL };
	int st;

	if (!c->leases)
		return 0;
	st = ap_lease_claim(c->leases, AP_REDIS_ACTION, gkey, r->t0 + c->flight_wait_ms, r->cancel, l2_found, &p,
			    lease);
	if (st == AP_LEASE_FOUND) {
		*out = p.b;
		return 1;
	}
	if (st == AP_LEASE_HOLD)
		ap_lease_sleep(c->lease_hold_ms);   /* test hook: the holder killed mid-compile */
	return 0;
}

/* Single-flight: waits for an identical request compiling now, or leads
 * (*flight: the flight this request must publish to) and then claims the
 * cluster lease (*lease, claim_lease).  > 0 when *out answers (the
 * flight's bundle, one a flight stored between our miss and our join, or
 * another daemon's from L2), 0 to compile (leading, or alone: no cache,
 * no flights, or a follower whose wait ran out), < 0 an error with `err`
 * set. */
static int join_flight(ap_compiler *c, struct request *r, const uint8_t gkey[32],
		       ap_flight **flight, ap_lease **lease, Apollo__Bundle **out, ap_error *err)
{
	int role;

	if (!r->use_cache || !c->flights)
		return 0;
	role = ap_flight_join(c->flights, gkey, flight);
	if (role == AP_FLIGHT_FOLLOW) {
		int rc = follow(c, r, *flight, out, err);

		*flight = NULL;
		return rc;
	}
	if (role != AP_FLIGHT_LEAD)
		return 0;
	if ((*out = lookup(c, r, gkey, false)))
		return 1;
	return claim_lease(c, r, gkey, lease, out);
}

/* The job proper, in its steps: target, identity, the warm path (request
 * memo), the ONNX request key, the graph and its key, the cache tiers, the
 * single flight, the program and its kernels, the bundle, the store.  0
 * and *out, or an error code with `err` set. */
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
	ap_lease *lease = NULL;       /* the cluster lease it holds */
	char bid[400];
	double t, backend_ms = 0;
	unsigned compiled = 0;
	struct kernel_batch kb = { 0 };
	int rc;

	if ((rc = resolve_target(c, r, err)))
		return rc;
	request_identity(c, r, &kb, bid, sizeof(bid));

	/* Warm path: a request seen before names its key; no graph needed;
	 * from L1, the answer is spliced from the stored bytes when the
	 * caller takes a frame. */
	if (r->use_cache && r->digest && memo_get(c, r->digest, gkey) &&
	    ((r->want_frame && warm_frame(c, r, gkey)) || (*out = lookup(c, r, gkey, true)))) {
		atomic_fetch_add(&c->memo_hits, 1);
		return 0;
	}

	t = ap_now_ms();
	if (req->source_case == APOLLO__COMPILE_REQUEST__SOURCE_ONNX_MODEL) {
		if (ap__compile_onnx_request_key(req, r->target, r->output, bid, rkey))
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		have_rkey = true;
		if ((*out = lookup(c, r, rkey, false)))
			return 0;
	}
	ap__progress(r->progress, "import", 0, 0);
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
		memo_put(c, r->digest, gkey, r->admit);
	if ((b = lookup(c, r, gkey, true))) {
		if (have_rkey)
			store_request_key(c, r, rkey, b);
		*out = b;
		rc = 0;
		goto done;
	}

	if ((rc = join_flight(c, r, gkey, &flight, &lease, out, err))) {
		rc = rc > 0 ? 0 : rc;
		goto done;
	}

	rc = compile_program(c, r, g, &kb, &prog, &blobs, &compiled, &backend_ms, err);
	if (rc)
		goto done;
	atomic_fetch_add(&c->kernels_compiled, compiled);
	for (int i = 0; i < prog->n_kernels; i++)
		r->kernel_tier[blobs[i].tier & 3]++;

	b = ap__compile_build_bundle(prog, blobs, r->target, r->output, graph_hash, &oom);
	if (oom || !b) {
		b = ap__compile_bundle_free(b);
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory building the bundle");
		goto done;
	}
	compiled_stats(c, r, g, prog, backend_ms, compiled, b);
	if (r->use_cache && !prog->tune_capped)
		ap__progress(r->progress, "cache", 0, 0);
	store_compiled(c, r, gkey, have_rkey ? rkey : NULL, b, prog->tune_capped, prog->tune_ms);
	b->stats->cache_ms = r->cache_ms;
	b->stats->compile_ms = ap_now_ms() - r->t0;
	*out = b;
	rc = 0;
done:
	ap_lease_release(c->leases, lease);   /* after store_compiled wrote L2 */
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

/* Counts a warm answer spliced from L1 (warm_frame). */
static void count_warm(ap_compiler *c)
{
	atomic_fetch_add(&c->hits, 1);
	atomic_fetch_add(&c->tier[APOLLO__CACHE_TIER__CACHE_L1], 1);
}

/* Adds a compiled request's stage times (st, ms) to the stage histograms;
 * c->hist_mu held. */
static void count_stages(ap_compiler *c, const Apollo__Stats *st)
{
	const double ms[AP_STAGES] = { st->import_ms, st->partition_ms, st->layer1_ms, st->tune_ms,
				       st->codegen_ms, st->backend_ms, st->cache_ms };

	for (int s = 0; s < AP_STAGES; s++) {
		double sec = ms[s] / 1e3;
		int k = 0;

		while (k < AP_STAGE_BUCKETS && sec > ap_stage_bucket_s[k])
			k++;
		c->stage_hist[s][k]++;
		c->stage_sum[s] += sec;
	}
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
	count_stages(c, b->stats);
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
	ap_task_pool pool = { .run = ap__compile_run_tasks, .pool = c };
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
	if (own_blobs(&r, out))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory copying blobs");
	share_blobs(*out);
	return 0;
}


Apollo__CompileResponse *ap_compile_run_digest(ap_compiler *c, const Apollo__CompileRequest *req,
					       const uint8_t *digest)
{
	return ap_compile_run_as(c, req, digest, NULL);
}

/* Runs request r and answers: the response (NULL when out of memory), or,
 * for a warm answer spliced as a frame, NULL with r->frame set. */
static Apollo__CompileResponse *respond(ap_compiler *c, struct request *r)
{
	const Apollo__CompileRequest *req = r->req;
	struct reply *reply = malloc(sizeof(*reply));
	Apollo__CompileResponse *resp = reply ? &reply->resp : NULL;
	Apollo__Bundle *b = NULL;
	ap_error err;
	int rc;

	if (!resp)
		return NULL;
	apollo__compile_response__init(resp);
	reply->refs = NULL;
	reply->n_refs = 0;
	ap_error_clear(&err);
	atomic_fetch_add(&c->requests, 1);
	if (c->delay_ms) {
		struct timespec ts = { c->delay_ms / 1000, (long)(c->delay_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	rc = run(c, r, &b, &err);
	if (rc == 0 && !b && r->frame) {
		free(reply);
		count_warm(c);
		return NULL;
	}
	count_answer(c, r, b, rc ? rc : b ? 0 : AP_EINTERNAL);
	if (rc == 0 && b) {
		/* kernels searched just now: their candidates are refined and
		 * timed in the background (autotune.h) */
		if (c->autotune && r->gpu && !b->stats->cache_hit && b->stats->tune_searched &&
		    !(req->options && req->options->tune_variant))
			ap_autotune_submit(c->autotune, req);
		share_blobs(b);
		resp->result_case = APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE;
		resp->bundle = b;
		reply->refs = r->refs;
		reply->n_refs = r->n_refs;
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

Apollo__CompileResponse *ap_compile_run_as(ap_compiler *c, const Apollo__CompileRequest *req,
					   const uint8_t *digest, const char *client)
{
	struct request r = { .req = req, .digest = digest, .client = client, .t0 = ap_now_ms() };

	return respond(c, &r);
}

uint8_t *ap_compile_run_frame(ap_compiler *c, const Apollo__CompileRequest *req,
			      const uint8_t *digest, const char *client, uint64_t id, size_t *len,
			      bool *bundle)
{
	return ap_compile_run_frame_admitted(c, req, digest, client, NULL, id, len, bundle);
}

uint8_t *ap_compile_warm_frame(ap_compiler *c, const Apollo__CompileRequest *req,
			       const uint8_t digest[32], const char *client, uint64_t id,
			       size_t *len)
{
	struct request r = { .req = req, .digest = digest, .client = client, .t0 = ap_now_ms(),
			     .want_frame = true, .frame_id = id };
	struct kernel_batch kb = { 0 };
	uint8_t gkey[32];
	char bid[400];
	ap_error err;

	if (resolve_target(c, &r, &err))
		return NULL;
	request_identity(c, &r, &kb, bid, sizeof(bid));
	if (!r.use_cache || !memo_get(c, digest, gkey) || !warm_frame(c, &r, gkey))
		return NULL;
	atomic_fetch_add(&c->requests, 1);
	atomic_fetch_add(&c->memo_hits, 1);
	count_warm(c);
	if (c->delay_ms) {
		struct timespec ts = { c->delay_ms / 1000, (long)(c->delay_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	*len = r.frame_len;
	return r.frame;
}

uint8_t *ap_compile_run_frame_admitted(ap_compiler *c, const Apollo__CompileRequest *req,
				       const uint8_t *digest, const char *client,
				       const ap_compile_admit *admit, uint64_t id, size_t *len,
				       bool *bundle)
{
	return ap_compile_run_frame_progress(c, req, digest, client, admit, NULL, id, len, bundle);
}

uint8_t *ap_compile_run_frame_progress(ap_compiler *c, const Apollo__CompileRequest *req,
				       const uint8_t *digest, const char *client,
				       const ap_compile_admit *admit,
				       const ap_compile_progress *progress, uint64_t id,
				       size_t *len, bool *bundle)
{
	struct ap__progress pr;
	struct request r = { .req = req, .digest = digest, .client = client, .t0 = ap_now_ms(),
			     .want_frame = true, .frame_id = id, .admit = admit, .progress = &pr };
	Apollo__CompileResponse *resp;
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	uint8_t *f = NULL;
	size_t n;

	ap__progress_init(&pr, progress, progress && progress->t0 > 0 ? progress->t0 : r.t0);
	resp = respond(c, &r);
	ap__progress_fini(&pr);

	if (r.frame) {
		*len = r.frame_len;
		*bundle = true;
		return r.frame;
	}
	if (!resp)
		return NULL;
	*bundle = resp->result_case == APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE;
	env.id = id;
	env.msg_case = APOLLO__ENVELOPE__MSG_COMPILED;
	env.compiled = resp;
	n = apollo__envelope__get_packed_size(&env);
	if (n <= UINT32_MAX && (f = malloc(AP_FRAME_HEADER_BYTES + n))) {
		ap_frame_put_len(f, (uint32_t)n);
		apollo__envelope__pack(&env, f + AP_FRAME_HEADER_BYTES);
		*len = AP_FRAME_HEADER_BYTES + n;
	}
	ap_compile_response_free(resp);
	return f;
}

void ap_compile_response_free(Apollo__CompileResponse *r)
{
	struct reply *reply = (struct reply *)r;

	if (!r)
		return;
	if (reply->refs && r->result_case == APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE) {
		ap__compile_bundle_release(r->bundle, reply->refs, reply->n_refs);
		r->bundle = NULL;
		r->result_case = APOLLO__COMPILE_RESPONSE__RESULT__NOT_SET;
	}
	apollo__compile_response__free_unpacked(r, NULL);
}
