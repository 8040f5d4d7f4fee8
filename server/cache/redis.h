/* redis.h -- apollod's shared cache (L2) in Redis, through hiredis.
 *
 * Several daemons (one per GPU node) point at one Redis and share what each
 * compiles: the compile job looks in the local SQLite cache (L1) first,
 * then here, then compiles; an entry found here is copied into L1; a new
 * entry is written to both (server/cache/tiers.h, for every kind).
 *
 * Entries: a value is a list of parts (an action: the stripped bundle and
 * then each distinct kernel blob it names, once; a kernel: the digest of
 * its blob; a blob: its bytes, keyed by their SHA-256 -- kernels compiled
 * as one program share one blob), stored under
 *   NAMESPACE:s<schema>.<format>:<kind>:<hex of the 32-byte key>
 * (kind 'a' action, 'k' kernel, 'b' blob, 't' tuning record; schema = apollo.SchemaVersion, format =
 * this file's value format), with a TTL, and signed: HMAC-SHA256 under a
 * key derived from the cluster secret, over the Redis key and the value.
 * Every read verifies the signature (constant time) before looking at any
 * other byte; an entry that fails is a miss, logged and counted, never
 * served and never copied anywhere.  Lengths inside a verified value are
 * still checked against the value's size.  A reply larger than
 * max_value_bytes is refused while it arrives, before it is buffered; so
 * is any reply, of whatever shape, whose parts together pass
 * max_value_bytes + 64 KiB or which holds more than 1,024 elements (issue
 * 29, item 7): a refused reply is a miss (or a failed write), a failure
 * for the breaker, and the end of its connection.
 *
 * Fail-open: Redis is optional.  Connections have a connect and a command
 * timeout; a failure (refused, timed out, dropped, an error reply) costs
 * that request the lookup or the write, nothing else.  After
 * breaker_failures failures in a row the circuit breaker opens: for
 * breaker_open_ms nothing is sent (lookups are misses at once); then one
 * request tries (half-open): success closes the breaker, failure opens it
 * again.  Every state change is logged.
 *
 * Thread safety: every function may be called from any thread at once; a
 * pool of connections (one per calling thread at a time) and the breaker
 * sit behind one mutex.  Calls block for at most about the timeouts.  The
 * process must ignore SIGPIPE (apollod does, net.c): a write to a Redis
 * that went away is then an error, not the end of the process.
 */
#ifndef AP_CACHE_REDIS_H
#define AP_CACHE_REDIS_H

#include "../../common/base.h"

typedef struct ap_redis ap_redis;

typedef struct ap_redis_options {
	const char *addr;              /* "HOST:PORT", "[IPv6]:PORT" or "unix:PATH" */
	const uint8_t *secret;         /* the cluster secret (>= 16 bytes) */
	size_t secret_len;
	const char *password;          /* AUTH after connecting; NULL or "" = none */
	const char *ns;                /* key namespace; NULL = "apollo" */
	unsigned ttl_s;                /* 0: no expiry */
	unsigned connect_timeout_ms, timeout_ms;
	unsigned breaker_failures;     /* failures in a row that open the breaker */
	unsigned breaker_open_ms;
	size_t max_value_bytes;
} ap_redis_options;

/* Checks the options and creates the client; no connection is made yet
 * (the first call connects).  0 and *out; AP_EINVAL (an address that is
 * not one of the forms, a secret shorter than 16 bytes, a namespace with
 * ':' or spaces), AP_ENOMEM, with `err` saying why. */
int ap_redis_new(const ap_redis_options *o, __ap_give ap_redis **out, ap_error *err);
/* Closes every connection and frees.  Accepts NULL, returns NULL. */
ap_redis *ap_redis_free(__ap_take ap_redis *r);

/* Reads a secret or password file: its bytes without one trailing newline
 * (\n or \r\n).  The file must be a regular file of at most 4 KiB, and,
 * with `private_only`, a secret by common/trust.h's rule: owned by this
 * user or root, neither readable nor writable by others nor writable by
 * its group, in directories that only this user or root can write.  0 with *out (malloc'd) and *len; AP_EIO (cannot
 * read it, or its permissions), AP_EINVAL (empty), AP_ENOMEM. */
int ap_redis_read_secret_file(const char *path, bool private_only, __ap_give uint8_t **out,
			      size_t *len, ap_error *err);

/* One connection attempt and a PING, for the start-up log: 0 or AP_EIO
 * with `err`.  Counts like any call (a failure may open the breaker). */
int ap_redis_ping(ap_redis *r, ap_error *err);

enum { AP_REDIS_ACTION = 'a', AP_REDIS_KERNEL = 'k', AP_REDIS_BLOB = 'b', AP_REDIS_TUNING = 't' };

/* A verified entry: `n` parts, each a borrowed view into `buf`. */
typedef struct ap_redis_entry {
	uint8_t *buf;
	size_t buf_len;
	int n;
	const uint8_t **part;
	size_t *part_len;
} ap_redis_entry;
void ap_redis_entry_clear(ap_redis_entry *e);   /* frees and zeroes */

/* Looks `key` of `kind` up: 1 with *e filled (verified; clear it with
 * ap_redis_entry_clear), 0 on a miss -- absent, the breaker open, any
 * failure, a signature or format that does not verify (logged), a value
 * over max_value_bytes.  Never an error: Redis only costs speed. */
int ap_redis_get(ap_redis *r, int kind, const uint8_t key[32], ap_redis_entry *e);
/* Signs and writes the `n` parts (parts[i], lens[i] bytes) under `key` of
 * `kind`, with the TTL.  0, or AP_EBUSY (breaker open, nothing sent),
 * AP_ETOOLARGE (over max_value_bytes, nothing sent), AP_EIO (failed),
 * AP_ENOMEM. */
int ap_redis_put(ap_redis *r, int kind, const uint8_t key[32], int n,
		 const uint8_t *const *parts, const size_t *lens);

/* The key string of an entry, for tests and logs ("apollo:s2.1:a:<hex>");
 * at most `cap` bytes with the NUL. */
void ap_redis_key_string(const ap_redis *r, int kind, const uint8_t key[32], char *buf,
			 size_t cap);

/* ---- leases (issue 26, item 1) ---------------------------------------------------
 *
 * A lease says "a daemon of the cluster is compiling this key now", so
 * that the others wait for its entry instead of compiling the same cold
 * graph each (server/compile/lease.h does the waiting and the renewals).
 * It is a plain string, the holder's token (AP_REDIS_TOKEN_CHARS hex
 * characters of 16 random bytes), under
 *   NAMESPACE:s<schema>.<format>:lease:<kind>:<hex of the 32-byte key>
 * with a lifetime in milliseconds (PX).  Unsigned: a lease only ever
 * delays a compile (at most the waiter's own bound), it is never served;
 * it cannot be taken for an entry, whose keys have four parts and a
 * one-letter kind where a lease key has "lease".  Taking is SET NX PX;
 * renewing and releasing compare the token first, in one Lua script each
 * (EVAL, one key), so that only the holder extends or deletes its lease
 * and a lease that lapsed and was taken by another daemon is left alone.
 * The calls count for the breaker like any other, and each returns
 * AP_EBUSY at once while it is open. */
#define AP_REDIS_TOKEN_CHARS 32

typedef struct ap_redis_lease {
	int kind;                                 /* AP_REDIS_ACTION, ... */
	uint8_t key[32];
	char token[AP_REDIS_TOKEN_CHARS + 1];     /* hex, NUL-terminated */
} ap_redis_lease;

/* Tries to take the lease of `key` of `kind` for `ttl_ms` (> 0) with a
 * fresh random token, written to *l with kind and key whatever the
 * outcome (so that a caller can recognise its own token when a lost reply
 * made it look refused; `key` may be l->key itself).  1: taken; 0: another holds it; AP_EBUSY (breaker open,
 * nothing sent), AP_EIO (failed, or no random bytes), AP_EINVAL (ttl_ms
 * 0). */
int ap_redis_lease_take(ap_redis *r, int kind, const uint8_t key[32], unsigned ttl_ms,
			ap_redis_lease *l);
/* Who holds the lease of `key` of `kind`: 1 with its token in `token`
 * ("" when the value is not a token of ours: written by something else),
 * 0 when nobody does; AP_EBUSY, AP_EIO as above. */
int ap_redis_lease_holder(ap_redis *r, int kind, const uint8_t key[32],
			  char token[AP_REDIS_TOKEN_CHARS + 1]);
/* Extends lease *l to `ttl_ms` from now if its token still holds it
 * (PEXPIRE under the compare).  1: renewed; 0: not ours any more (it
 * lapsed, and maybe another daemon took it); AP_EBUSY, AP_EIO,
 * AP_EINVAL (ttl_ms 0). */
int ap_redis_lease_renew(ap_redis *r, const ap_redis_lease *l, unsigned ttl_ms);
/* Deletes lease *l if its token still holds it.  1: released; 0: not
 * ours (lapsed; another holder's lease is left alone); AP_EBUSY, AP_EIO. */
int ap_redis_lease_release(ap_redis *r, const ap_redis_lease *l);
/* The key string of a lease ("apollo:s5.1:lease:a:<hex>"), at most `cap`
 * bytes with the NUL. */
void ap_redis_lease_key_string(const ap_redis *r, int kind, const uint8_t key[32], char *buf,
			       size_t cap);

typedef enum ap_redis_state {
	AP_REDIS_CLOSED = 0,      /* calls go to Redis */
	AP_REDIS_OPEN = 1,        /* nothing is sent */
	AP_REDIS_HALF_OPEN = 2,   /* one call is trying */
} ap_redis_state;

/* Totals since creation, bytes are values' sizes. */
typedef struct ap_redis_counts {
	ap_redis_state state;
	uint64_t gets, hits, misses;
	uint64_t puts, put_failures;
	uint64_t failures;          /* calls that failed (each counts toward the breaker) */
	uint64_t verify_failures;   /* entries that did not verify */
	uint64_t refused;           /* replies refused for their size (also failures) */
	uint64_t skipped;           /* calls not made: breaker open */
	uint64_t opens;             /* times the breaker opened */
	uint64_t bytes_read, bytes_written;
} ap_redis_counts;
void ap_redis_get_counts(ap_redis *r, ap_redis_counts *out);
const char *ap_redis_state_name(ap_redis_state s);   /* "closed", "open", "half-open" */

#endif
