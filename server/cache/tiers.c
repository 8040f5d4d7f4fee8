/* tiers.c -- the read-through and write-through of the cache tiers
 * (tiers.h): one engine (ap_tiers_get, ap_tiers_put) driven by each kind's
 * policy (the table below) and codec; the codecs of actions, kernels and
 * blobs, whose formats are the cache's.
 */
#include "tiers.h"

#include "../../common/graph.h"
#include "../config.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct counts {
	atomic_uint_fast64_t l1_hits, l2_hits, misses, refused, copied, puts;
};

struct ap_tiers {
	ap_cache *cache;
	ap_redis *redis;
	struct counts n[AP_TIER_KINDS];
};

static const ap_tier_policy policies[AP_TIER_KINDS] = {
	[AP_TIER_ACTION] = { "action", AP_REDIS_ACTION, true, true, true },
	[AP_TIER_KERNEL] = { "kernel", AP_REDIS_KERNEL, true, true, true },
	/* a blob's L1 row is written with the kernel's or action's that names
	 * it (one transaction, or the action's copy), never alone */
	[AP_TIER_BLOB] = { "blob", AP_REDIS_BLOB, true, false, false },
	[AP_TIER_TUNING] = { "tuning", AP_REDIS_TUNING, true, true, true },
};

const ap_tier_policy *ap_tiers_policy(ap_tier_kind kind)
{
	return (unsigned)kind < AP_TIER_KINDS ? &policies[kind] : NULL;
}

ap_tiers *ap_tiers_new(ap_cache *cache, ap_redis *redis)
{
	ap_tiers *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->cache = cache;
	t->redis = redis;
	return t;
}

ap_tiers *ap_tiers_free(ap_tiers *t)
{
	free(t);
	return NULL;
}

ap_cache *ap_tiers_cache(const ap_tiers *t)
{
	return t ? t->cache : NULL;
}

ap_redis *ap_tiers_redis(const ap_tiers *t)
{
	return t ? t->redis : NULL;
}

void ap_tiers_get_counts(const ap_tiers *t, ap_tier_kind kind, ap_tiers_counts *out)
{
	const struct counts *n;

	memset(out, 0, sizeof(*out));
	if (!t || (unsigned)kind >= AP_TIER_KINDS)
		return;
	n = &t->n[kind];
	out->l1_hits = atomic_load(&n->l1_hits);
	out->l2_hits = atomic_load(&n->l2_hits);
	out->misses = atomic_load(&n->misses);
	out->refused = atomic_load(&n->refused);
	out->copied = atomic_load(&n->copied);
	out->puts = atomic_load(&n->puts);
}

/* ---- the engine ------------------------------------------------------------- */

int ap_tiers_get(ap_tiers *t, ap_tier_kind kind, const uint8_t key[32], unsigned flags,
		 const ap_tier_codec *io, void *user)
{
	const ap_tier_policy *p = ap_tiers_policy(kind);
	struct counts *n;
	ap_redis_entry e;
	bool ok;
	int rc;

	if (!t || !p)
		return AP_TIER_MISS;
	n = &t->n[kind];
	if (p->get_l1 && io->l1_get && !(flags & AP_TIERS_L2_ONLY)) {
		rc = io->l1_get(user, t->cache);
		if (rc < 0)
			return rc;
		if (rc == 1) {
			atomic_fetch_add(&n->l1_hits, 1);
			return AP_TIER_L1;
		}
	}
	if (!t->redis || !io->l2_decode || (flags & AP_TIERS_L1_ONLY) ||
	    ap_redis_get(t->redis, p->redis_kind, key, &e) != 1) {
		atomic_fetch_add(&n->misses, 1);
		return AP_TIER_MISS;
	}
	/* the decoder may keep views into e until the copy: cleared after */
	ok = io->l2_decode(user, &e);
	if (ok && p->copy_l2_hit && io->l1_put && io->l1_put(user, t->cache) == 0)
		atomic_fetch_add(&n->copied, 1);
	ap_redis_entry_clear(&e);
	if (!ok) {
		atomic_fetch_add(&n->refused, 1);
		atomic_fetch_add(&n->misses, 1);
		return AP_TIER_MISS;
	}
	atomic_fetch_add(&n->l2_hits, 1);
	return AP_TIER_L2;
}

int ap_tiers_put(ap_tiers *t, ap_tier_kind kind, const uint8_t key[32], unsigned flags,
		 const ap_tier_codec *io, void *user, int n, const uint8_t *const *parts,
		 const size_t *lens)
{
	const ap_tier_policy *p = ap_tiers_policy(kind);
	int rc = 0;

	if (!t || !p)
		return AP_EINVAL;
	atomic_fetch_add(&t->n[kind].puts, 1);
	if (p->put_l1 && io && io->l1_put && !(flags & AP_TIERS_L2_ONLY))
		rc = io->l1_put(user, t->cache);
	if (t->redis && n > 0 && !(flags & AP_TIERS_L1_ONLY))
		ap_redis_put(t->redis, p->redis_kind, key, n, parts, lens);
	return rc;
}

/* ---- blobs ---------------------------------------------------------------------- */

struct blob_io {
	const uint8_t *digest;
	uint8_t *data;
	size_t len;
};

static int blob_l1_get(void *user, ap_cache *c)
{
	struct blob_io *b = user;

	return ap_cache_blob_get(c, b->digest, &b->data, &b->len) == 1;
}

/* One part, whose SHA-256 is the digest asked for. */
static bool blob_decode(void *user, const ap_redis_entry *e)
{
	struct blob_io *b = user;
	uint8_t d[32];

	if (e->n != 1 || !(b->data = malloc(e->part_len[0] ? e->part_len[0] : 1)))
		return false;
	memcpy(b->data, e->part[0], e->part_len[0]);
	b->len = e->part_len[0];
	ap_sha256(b->data, b->len, d);
	if (memcmp(d, b->digest, 32)) {
		ap_log(AP_LOG_WARN, "shared cache: a signed blob does not match its digest; not "
		       "served");
		free(b->data);
		b->data = NULL;
		return false;
	}
	return true;
}

static const ap_tier_codec blob_codec = { blob_l1_get, blob_decode, NULL };

int ap_tiers_blob_get(ap_tiers *t, const uint8_t digest[32], unsigned flags, uint8_t **data,
		      size_t *len)
{
	struct blob_io b = { digest, NULL, 0 };
	int tier = ap_tiers_get(t, AP_TIER_BLOB, digest, flags, &blob_codec, &b);

	if (tier <= 0)
		return AP_TIER_MISS;
	*data = b.data;
	*len = b.len;
	return tier;
}

int ap_tiers_blob_put(ap_tiers *t, const uint8_t *data, size_t len, const uint8_t digest[32])
{
	const uint8_t *parts[1] = { data };
	size_t lens[1] = { len };

	return ap_tiers_put(t, AP_TIER_BLOB, digest, 0, NULL, NULL, 1, parts, lens);
}

/* ---- kernels -------------------------------------------------------------------- */

struct kernel_io {
	ap_tiers *t;
	const uint8_t *key;
	unsigned flags;
	uint8_t *data;
	size_t len;
	uint8_t digest[32];
};

static int kernel_l1_get(void *user, ap_cache *c)
{
	struct kernel_io *k = user;

	return ap_cache_kernel_get(c, k->key, &k->data, &k->len, k->digest) == 1;
}

/* One part, the blob's digest; then the blob itself, from L1 or L2. */
static bool kernel_decode(void *user, const ap_redis_entry *e)
{
	struct kernel_io *k = user;

	if (e->n != 1 || e->part_len[0] != 32)
		return false;
	memcpy(k->digest, e->part[0], 32);
	return ap_tiers_blob_get(k->t, k->digest, k->flags, &k->data, &k->len) != AP_TIER_MISS;
}

static int kernel_l1_put(void *user, ap_cache *c)
{
	struct kernel_io *k = user;

	return ap_cache_kernel_put_known(c, k->key, k->data, k->len, k->digest);
}

static const ap_tier_codec kernel_codec = { kernel_l1_get, kernel_decode, kernel_l1_put };

int ap_tiers_kernel_get(ap_tiers *t, const uint8_t key[32], unsigned flags, uint8_t **data,
			size_t *len, uint8_t digest[32])
{
	struct kernel_io k = { .t = t, .key = key, .flags = flags };
	int tier = ap_tiers_get(t, AP_TIER_KERNEL, key, flags, &kernel_codec, &k);

	if (tier <= 0) {
		free(k.data);
		return AP_TIER_MISS;
	}
	*data = k.data;
	*len = k.len;
	memcpy(digest, k.digest, 32);
	return tier;
}

int ap_tiers_kernel_put(ap_tiers *t, const uint8_t key[32], unsigned flags, const uint8_t *data,
			size_t len, const uint8_t digest[32])
{
	struct kernel_io k = { .t = t, .key = key, .data = (uint8_t *)data, .len = len };
	const uint8_t *parts[1] = { digest };
	size_t lens[1] = { 32 };

	memcpy(k.digest, digest, 32);
	return ap_tiers_put(t, AP_TIER_KERNEL, key, flags, &kernel_codec, &k, 1, parts, lens);
}

/* ---- actions -------------------------------------------------------------------- */

struct action_io {
	const uint8_t *key;
	ap_tier_action_check check;
	void *user;
	ap_tier_action a;            /* the L2 entry's view while it is decoded */
	uint8_t (*dg)[32];           /* ... its blobs' digests, and which to keep */
	bool *keep;
	const uint8_t *bundle;       /* a put's, or the accepted L2 entry's (borrowed) */
	size_t len;
	bool copied;
};

static int action_l1_get(void *user, ap_cache *c)
{
	struct action_io *io = user;
	ap_tier_action a = { 0 };
	uint8_t *val = NULL;
	bool ok;

	if (ap_cache_get(c, io->key, &val, &a.len) != 1)
		return 0;
	a.bundle = val;
	ok = io->check(io->user, AP_TIER_L1, &a);
	free(val);
	return ok;
}

/* Stores the blobs the check kept (with their digests), then the bundle
 * under the key. */
static int action_l1_put(void *user, ap_cache *c)
{
	struct action_io *io = user;
	int rc;

	for (int i = 0; i < io->a.n_blobs; i++)
		if (io->a.keep[i])
			ap_cache_blob_put_known(c, io->a.blob[i], io->a.blob_len[i], io->a.digest[i]);
	rc = ap_cache_put(c, io->key, io->bundle, io->len);
	io->copied = rc == 0;
	return rc;
}

/* The stripped bundle, then the distinct blobs, each hashed once; the
 * caller's check matches them to its kernels and keeps those they name.
 * The views stay into `e` until action_l1_put has copied them. */
static bool action_decode(void *user, const ap_redis_entry *e)
{
	struct action_io *io = user;

	if (e->n < 1)
		return false;
	io->dg = calloc((size_t)e->n, 32);
	io->keep = calloc((size_t)e->n, sizeof(*io->keep));
	if (!io->dg || !io->keep)
		return false;
	for (int p = 1; p < e->n; p++)
		ap_sha256(e->part[p], e->part_len[p], io->dg[p - 1]);
	io->a = (ap_tier_action){ e->part[0], e->part_len[0], e->n - 1, e->part + 1,
				  e->part_len + 1, (const uint8_t (*)[32])io->dg, io->keep };
	io->bundle = e->part[0];
	io->len = e->part_len[0];
	return io->check(io->user, AP_TIER_L2, &io->a);
}

int ap_tiers_action_get(ap_tiers *t, const uint8_t key[32], unsigned flags,
			ap_tier_action_check check, void *user, bool *copied)
{
	static const ap_tier_codec codec = { action_l1_get, action_decode, action_l1_put };
	struct action_io io = { .key = key, .check = check, .user = user };
	int tier = ap_tiers_get(t, AP_TIER_ACTION, key, flags, &codec, &io);

	free(io.dg);
	free(io.keep);
	if (copied)
		*copied = io.copied;
	return tier;
}

int ap_tiers_action_ref(ap_tiers *t, const uint8_t key[32], ap_blob **out)
{
	if (!t || ap_cache_get_ref(t->cache, key, out) != 1)
		return AP_TIER_MISS;
	atomic_fetch_add(&t->n[AP_TIER_ACTION].l1_hits, 1);
	return AP_TIER_L1;
}

int ap_tiers_action_put(ap_tiers *t, const uint8_t key[32], unsigned flags, const uint8_t *bundle,
			size_t len, int n_blobs, const uint8_t *const *blob, const size_t *blob_len)
{
	static const ap_tier_codec codec = { NULL, NULL, action_l1_put };
	struct action_io io = { .key = key, .bundle = bundle, .len = len };
	const uint8_t **parts = NULL;
	size_t *lens = NULL;
	int n = 0, rc;

	if (!(flags & AP_TIERS_L1_ONLY) && ap_tiers_redis(t)) {
		parts = calloc((size_t)n_blobs + 1, sizeof(*parts));
		lens = calloc((size_t)n_blobs + 1, sizeof(*lens));
		if (parts && lens && n_blobs >= 0 && n_blobs < INT_MAX) {
			parts[0] = bundle;
			lens[0] = len;
			for (int i = 0; i < n_blobs; i++) {
				parts[i + 1] = blob[i];
				lens[i + 1] = blob_len[i];
			}
			n = n_blobs + 1;
		}
	}
	rc = ap_tiers_put(t, AP_TIER_ACTION, key, flags, &codec, &io, n, parts, lens);
	free(parts);
	free(lens);
	return rc;
}
