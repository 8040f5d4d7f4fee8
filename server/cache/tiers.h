/* tiers.h -- the cache tiers read through and written through, once
 * (issue 28, item 3): the local cache L1 (cache.h, an SQLite file with its
 * memory tier of verified blobs, hot.h) and the shared cache L2 (redis.h),
 * for the four kinds of entries apollod keeps.
 *
 * The policy, for every kind:
 *   get  look in L1; on a miss (or when the caller turns L1's value down)
 *        look in L2, unless the caller asked for L1 only or there is no
 *        L2; a signed entry found there is checked by its kind's decoder
 *        (its format, digests; a refusal is a miss, counted, and nothing is
 *        copied), then copied into L1 when the kind's policy says so, and
 *        counted as an L2 hit;
 *   put  write L1 (when the kind's policy writes it there), then L2;
 *        L2 is fail-open: its failures cost the sharing, never the caller.
 * What differs between kinds is data (ap_tier_policy: which tiers it lives
 * in, whether a remote hit is copied into L1) and its codec: how its value
 * is read from and written to L1's tables, and what its L2 entry holds.
 * The codecs of bundles (actions), kernels and blobs are here, those of
 * tuning records in server/tune/records.c (ap_tiers_get/ap_tiers_put with
 * an ap_tier_codec).
 *
 * Entries in L2 (redis.h's kinds):
 *   action  'a' under the request's or graph's key: the stripped bundle,
 *           then each distinct kernel blob it names, once;
 *   kernel  'k' under the kernel key: the 32-byte digest of its blob;
 *   blob    'b' under its SHA-256: its bytes (verified against the digest
 *           on every read);
 *   tuning  't' under tune/records.c's key: the record's six parts.
 *
 * The counters (ap_tiers_get_counts) are this layer's own, per kind; the
 * daemon's metrics of answers by tier are counted by the compile job
 * (compile.h's counters) and Redis's by redis.c, as before.
 *
 * Thread safety: every function may be called from any thread at once (the
 * cache and the Redis client are; the counters are atomic).
 */
#ifndef AP_CACHE_TIERS_H
#define AP_CACHE_TIERS_H

#include "../../common/base.h"
#include "cache.h"
#include "redis.h"

typedef struct ap_tiers ap_tiers;

typedef enum ap_tier_kind {
	AP_TIER_ACTION = 0,   /* request/graph key -> stripped bundle (+ its blobs in L2) */
	AP_TIER_KERNEL = 1,   /* kernel key -> its blob's digest (and the blob) */
	AP_TIER_BLOB = 2,     /* digest -> bytes */
	AP_TIER_TUNING = 3,   /* tuning record key -> record (server/tune/records.h) */
	AP_TIER_KINDS = 4,
} ap_tier_kind;

/* Where a get found its value: the numbers of apollo.CacheTier. */
enum { AP_TIER_MISS = 0, AP_TIER_L1 = 1, AP_TIER_L2 = 2 };

/* Flags of a get or a put. */
enum {
	AP_TIERS_L1_ONLY = 1,   /* do not ask or write L2 */
	AP_TIERS_L2_ONLY = 2,   /* do not ask or write L1 (a put: publish only) */
};

/* A kind's policy, as data. */
typedef struct ap_tier_policy {
	const char *name;      /* "action", "kernel", "blob", "tuning" */
	int redis_kind;        /* AP_REDIS_ACTION, ... */
	bool get_l1;           /* a get looks in L1 */
	bool put_l1;           /* a put writes L1 (a blob: no, L1 stores it with
				  the kernel or action that names it) */
	bool copy_l2_hit;      /* a value found in L2 is copied into L1 */
} ap_tier_policy;

/* The policy of `kind` (a static table; NULL for a kind out of range). */
const ap_tier_policy *ap_tiers_policy(ap_tier_kind kind);

/* The tiers over `cache` (L1; may be NULL or off: every L1 read a miss)
 * and `redis` (L2; NULL: none), both borrowed: they must outlive the
 * tiers.  NULL when out of memory. */
__ap_give ap_tiers *ap_tiers_new(__ap_keep ap_cache *cache, __ap_keep ap_redis *redis);
/* Frees the tiers (not the cache or the client).  Accepts NULL, returns
 * NULL. */
ap_tiers *ap_tiers_free(__ap_take ap_tiers *t);
/* The tiers' L1 and L2, as given to ap_tiers_new. */
ap_cache *ap_tiers_cache(const ap_tiers *t);
ap_redis *ap_tiers_redis(const ap_tiers *t);

/* Counts since ap_tiers_new, of one kind. */
typedef struct ap_tiers_counts {
	uint64_t l1_hits, l2_hits, misses;   /* gets by outcome */
	uint64_t refused;     /* L2 entries (signed) the kind's decoder turned down:
				 malformed, a blob not matching its digest, stale;
				 each also a miss.  Entries whose signature fails
				 never get here: redis.c counts those
				 (verify_failures) */
	uint64_t copied;      /* L2 hits copied into L1 */
	uint64_t puts;        /* puts (L1, L2 or both) */
} ap_tiers_counts;
void ap_tiers_get_counts(const ap_tiers *t, ap_tier_kind kind, ap_tiers_counts *out);

/* ---- the generic read-through, for codecs outside cache/ ------------------- */

/* A kind's codec for one get or put; `user` is the caller's (the key of
 * L1's row, the value being read or written).  Any member may be NULL:
 * that tier is then not read (or not written).
 *   l1_get     1 with the value in `user`, 0 for a miss, negative for an
 *              L1 error (returned by ap_tiers_get as it is; L2 not asked);
 *   l2_decode  true when the verified entry `e` is a well-formed value
 *              (stored in `user`; `e` is read only, and freed after
 *              l1_put's copy, so the value may point into it until then),
 *              false to refuse it (logged by the codec);
 *   l1_put     writes the value in `user` to L1 (an L2 hit's copy, or a
 *              put): 0 or a negative AP_E* code (cache.h). */
typedef struct ap_tier_codec {
	int (*l1_get)(void *user, ap_cache *c);
	bool (*l2_decode)(void *user, const ap_redis_entry *e);
	int (*l1_put)(void *user, ap_cache *c);
} ap_tier_codec;

/* Reads the value of `kind` named `key` (its 32-byte key in L2) through
 * the tiers, by the policy above and `flags`.  Returns AP_TIER_L1 or
 * AP_TIER_L2 (the value is in `user`; an L2 value was copied into L1 when
 * the policy says so), AP_TIER_MISS (also for a NULL `t` or a kind out of
 * range), or a negative L1 error from io->l1_get (L2 then not asked). */
int ap_tiers_get(ap_tiers *t, ap_tier_kind kind, const uint8_t key[32], unsigned flags,
		 const ap_tier_codec *io, void *user);
/* Writes a value of `kind` named `key` through: L1 by io->l1_put (when
 * the policy writes L1 and `flags` allow), then L2, the `n` parts
 * (parts[i], lens[i] bytes: borrowed; AP_TIERS_L1_ONLY or no L2: not
 * written).  Returns L1's result: 0 (also when L1 was not written) or its
 * negative AP_E* code; AP_EINVAL when `t` is NULL or `kind` out of range
 * (nothing written).  L2's failures are counted by redis.c, not
 * returned. */
int ap_tiers_put(ap_tiers *t, ap_tier_kind kind, const uint8_t key[32], unsigned flags,
		 const ap_tier_codec *io, void *user, int n, const uint8_t *const *parts,
		 const size_t *lens);

/* ---- kernels and blobs ------------------------------------------------------ */

/* Kernel `key` through the tiers: from L1 (the key's row and its blob,
 * verified), else from L2 (its entry names the blob's digest; the blob is
 * taken from L1 by that digest, else from L2 and checked against it),
 * then copied into L1 (the key and the blob, one transaction).  Returns
 * AP_TIER_L1 or AP_TIER_L2 with *data (malloc'd, the caller frees), *len
 * (bytes) and digest set, or AP_TIER_MISS (also out of memory; an entry
 * that does not decode or a blob that does not match its digest is
 * refused, logged and counted). */
int ap_tiers_kernel_get(ap_tiers *t, const uint8_t key[32], unsigned flags,
			__ap_give uint8_t **data, size_t *len, uint8_t digest[32]);
/* Stores kernel `key` -> the blob `data` (len bytes, whose SHA-256 the
 * caller computed: `digest`, trusted): in L1 the key and the blob (stored
 * once per digest), in L2 the key -> digest (the blob itself:
 * ap_tiers_blob_put).  Returns L1's result, 0 or negative (cache.h). */
int ap_tiers_kernel_put(ap_tiers *t, const uint8_t key[32], unsigned flags,
			const uint8_t *data, size_t len, const uint8_t digest[32]);
/* The blob whose SHA-256 is `digest`: from L1 (verified), else from L2,
 * checked against the digest (a mismatch is refused, logged, counted).
 * Not copied into L1 by itself (the kernel or action naming it stores it
 * with its row).  AP_TIER_L1 or AP_TIER_L2 with *data (malloc'd, caller
 * frees) and *len; AP_TIER_MISS. */
int ap_tiers_blob_get(ap_tiers *t, const uint8_t digest[32], unsigned flags,
		      __ap_give uint8_t **data, size_t *len);
/* Publishes the blob `data` (len bytes, SHA-256 `digest`, trusted) to L2
 * under its digest, once per backend run (every kernel of a program
 * shares it); L1 gets it with its kernel (ap_tiers_kernel_put).  0, or a
 * negative code when nothing was written (no L2 is 0). */
int ap_tiers_blob_put(ap_tiers *t, const uint8_t *data, size_t len, const uint8_t digest[32]);

/* ---- actions (bundles) ------------------------------------------------------ */

/* A stored bundle as a get presents it to its caller's check. */
typedef struct ap_tier_action {
	const uint8_t *bundle;     /* the stripped bundle (protobuf), borrowed */
	size_t len;                /* its bytes */
	/* from L2 only (from L1, n_blobs is 0: the blobs are in L1, by digest):
	 * the blobs that travel with it, each with its SHA-256 (computed once
	 * here); the check sets keep[i] for each blob one of its kernels names,
	 * and only those are copied into L1 */
	int n_blobs;
	const uint8_t *const *blob;
	const size_t *blob_len;
	const uint8_t (*digest)[32];
	bool *keep;
} ap_tier_action;

/* The caller's check of a stored bundle found in `tier` (AP_TIER_L1 or
 * AP_TIER_L2): true to take it (the caller keeps what it decoded in
 * `user`), false to turn it down -- from L1, the lookup goes on to L2;
 * from L2, it is refused (counted) and nothing is copied. */
typedef bool (*ap_tier_action_check)(void *user, int tier, const ap_tier_action *a);

/* The bundle stored under `key`, through the tiers: L1's value
 * (ap_cache_get), else L2's entry (unless AP_TIERS_L1_ONLY), each
 * shown to `check`.  An L2 entry that check takes is copied into L1: the
 * blobs it keeps (with their digests, not hashed again), then the bundle
 * under `key`; *copied (may be NULL) says whether the bundle's row was
 * stored.  Returns AP_TIER_L1, AP_TIER_L2 or AP_TIER_MISS. */
int ap_tiers_action_get(ap_tiers *t, const uint8_t key[32], unsigned flags,
			ap_tier_action_check check, void *user, bool *copied);
/* The warm path's read: the stripped bundle stored under `key` in L1
 * alone, by reference (ap_cache_get_ref: no copy when the memory tier
 * holds it).  AP_TIER_L1 with *out (a reference the caller releases,
 * ap_blob_release) and counted as an L1 hit, or AP_TIER_MISS, not counted
 * (the caller goes on to ap_tiers_action_get, which counts). */
int ap_tiers_action_ref(ap_tiers *t, const uint8_t key[32], __ap_give ap_blob **out);
/* Stores the stripped bundle `bundle` (len bytes) under `key`: in L1 (its
 * blobs are in L1 already, stored with their kernels), and in L2 with the
 * n_blobs distinct blobs it names (blob[i], blob_len[i] bytes; borrowed),
 * unless AP_TIERS_L1_ONLY.  Returns L1's result, 0 or negative
 * (cache.h); with AP_TIERS_L2_ONLY, 0. */
int ap_tiers_action_put(ap_tiers *t, const uint8_t key[32], unsigned flags,
			const uint8_t *bundle, size_t len, int n_blobs,
			const uint8_t *const *blob, const size_t *blob_len);

#endif
