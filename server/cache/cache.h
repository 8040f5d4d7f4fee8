/* cache.h -- apollod's local cache (L1): an SQLite file.
 *
 * Three tables, Bazel-style:
 *   blobs    digest -> bytes   content-addressed (SHA-256 of the bytes);
 *                              every read re-hashes the bytes, and a row
 *                              whose bytes do not match is deleted and
 *                              reported as a miss: a corrupted blob is never
 *                              returned.
 *   actions  key -> digest     request/graph key -> the digest of a stored
 *                              bundle (kernel blobs stripped to digests).
 *   kernels  key -> digest     kernel key -> the digest of its compiled blob,
 *                              so a kernel shared by two graphs is compiled
 *                              and stored once.
 * Keys are 32-byte SHA-256 values computed by the caller over the INPUTS of
 * a compilation only (server/compile).
 *
 * Failure never fails a request: a cache that cannot be opened, or whose
 * file gives an I/O or corruption error, turns itself off (one warning in
 * the log) and from then on every lookup is a miss and every store a no-op.
 * A file that is not a database or is corrupt is moved aside at the next
 * open (PATH.corrupt-TIME) and replaced by a new cache.
 * A write that loses a lock race (SQLITE_BUSY after busy_timeout) is only
 * skipped.
 *
 * No room is not a failure of the cache (issue 29, item 6): a write the
 * file system refuses for space (disk full, ENOSPC; the file-size limit,
 * EFBIG -- the process must ignore SIGXFSZ, as apollod does; a quota,
 * EDQUOT) makes the cache *degraded*, with one warning: lookups go on,
 * writes are skipped (AP_EBUSY) until a retry 1 s later, the wait doubling
 * with every retry that fails up to 60 s, and the first write that
 * succeeds ends the degraded state (another warning).  What was stored
 * before stays, intact (SQLite rolls the failed write back).
 *
 * Size limit and memory tier (issue 10, ap_cache_set_limits): blobs carry
 * the time they were last used; past max_bytes the least recently used go,
 * with the rows that name them (cache.c).  Blobs read and verified once are
 * kept in memory (hot.h) and served from there.
 *
 * Thread safety: all functions may be called from any number of threads at
 * once.  The cache keeps a pool of SQLite connections (one per concurrently
 * calling thread) behind a mutex; the file is in WAL mode, writes use
 * BEGIN IMMEDIATE, and several daemons may share one file.
 */
#ifndef AP_CACHE_H
#define AP_CACHE_H

#include "../../common/base.h"
#include "blob.h"

typedef struct ap_cache ap_cache;

/* The default cache file: $XDG_CACHE_HOME/apollo/cache.db, else
 * $HOME/.cache/apollo/cache.db.  Returns 0, or AP_ETOOLARGE when it does
 * not fit in `cap` bytes, AP_EIO when neither variable is set. */
int ap_cache_default_path(char *buf, size_t cap);

/* Whether the cache at `path` ("" or NULL: the default; "off": nothing to
 * check) may be opened: the database and SQLite's -wal / -shm / -journal
 * files beside it, where present, belong to this user or root and are
 * writable by nobody else, and so is the directory holding them, by
 * common/trust.h's rule (a database another user can write is a way to
 * plant a host shared object in a bundle).  apollod refuses to start when
 * it fails; ap_cache_open checks it again before every connection it opens
 * (a failure then turns the cache off).  0 or AP_EIO with `err` naming the
 * path and the reason. */
int ap_cache_check_path(const char *path, ap_error *err);

/* Opens (creating the file and its directories, mode 0700) the cache at
 * `path` ("" or NULL: ap_cache_default_path; "off": a cache that is off
 * from the start, with no warning).  A file that is not an SQLite
 * database, is corrupt, or was marked corrupt at run time (PATH.corrupt)
 * is renamed PATH.corrupt-TIME (its -wal too) and a new cache created in
 * its place, with a warning.  Always sets *out to a usable cache unless
 * out of memory.  Returns 0; AP_EIO when the file cannot be opened or set
 * up (*out is then a cache that is off, `err` says why); AP_ENOMEM (*out
 * NULL). */
int ap_cache_open(const char *path, __ap_give ap_cache **out, ap_error *err);
/* Closes every connection.  Accepts NULL, returns NULL. */
ap_cache *ap_cache_free(__ap_take ap_cache *c);

/* False once the cache is off (opening failed, I/O error, "off").  A
 * degraded cache (no room, see above) is still enabled. */
bool ap_cache_enabled(const ap_cache *c);
/* The file in use ("" when off from the start). */
const char *ap_cache_path(const ap_cache *c);

/* Looks up `key` in the action cache and returns the stored value, its
 * blob verified: 1 with *val (malloc'd, caller frees) and *len set, or 0
 * on a miss (also when the cache is off or failed). */
int ap_cache_get(ap_cache *c, const uint8_t key[32], __ap_give uint8_t **val, size_t *len);
/* As ap_cache_get, the value by reference (ap_cache_blob_ref: the caller
 * releases *out; no copy when the memory tier holds it): 1 or 0. */
int ap_cache_get_ref(ap_cache *c, const uint8_t key[32], __ap_give ap_blob **out);
/* Stores `val` as a blob and points `key` at it, in one transaction
 * (replacing an older value).  Returns 0, or a negative AP_E* code when
 * nothing was stored: AP_EIO (cache off, an I/O error, no room), AP_EBUSY
 * (a lost lock race; degraded and before the retry time).  The other
 * writes below return the same codes. */
int ap_cache_put(ap_cache *c, const uint8_t key[32], const uint8_t *val, size_t len);

/* Content-addressed blobs.  blob_get: 1 with a copy of the bytes whose
 * SHA-256 is `digest`, else 0 (a row that fails verification is deleted).
 * blob_put: stores the bytes (once per digest), writes their digest to
 * `digest` (may be NULL) even when it stores nothing; 0 or negative. */
int ap_cache_blob_get(ap_cache *c, const uint8_t digest[32], __ap_give uint8_t **data,
		      size_t *len);
int ap_cache_blob_put(ap_cache *c, const uint8_t *data, size_t len, uint8_t digest[32]);
/* A blob by reference (issue 26, item 2): 1 with *out a new reference to
 * the verified blob whose SHA-256 is `digest` (blob.h: the caller releases
 * it with ap_blob_release; its bytes stay valid until then, even when the
 * memory tier evicts it), else 0 (a miss, the cache off, out of memory; a
 * row that fails verification is deleted).  A blob in the memory tier is
 * handed out without a copy, so every caller asking for one digest shares
 * one blob; one read from the file is copied once, into the blob the tier
 * keeps (when it fits). */
int ap_cache_blob_ref(ap_cache *c, const uint8_t digest[32], __ap_give ap_blob **out);
/* As ap_cache_blob_put for bytes whose SHA-256 the caller computed (or
 * verified) moments ago: `digest` is trusted, the bytes are not hashed
 * again.  0 or negative. */
int ap_cache_blob_put_known(ap_cache *c, const uint8_t *data, size_t len,
			    const uint8_t digest[32]);

/* Kernel cache: `key` (hash of the kernel's inputs) -> compiled blob.
 * kernel_get: 1 with the verified blob (and its digest when `digest` is not
 * NULL), else 0.  kernel_put: stores the blob and the key, one
 * transaction; 0 or negative. */
int ap_cache_kernel_get(ap_cache *c, const uint8_t key[32], __ap_give uint8_t **data,
			size_t *len, uint8_t digest[32]);
int ap_cache_kernel_put(ap_cache *c, const uint8_t key[32], const uint8_t *data, size_t len,
			uint8_t digest[32]);
/* As ap_cache_kernel_put with the blob's SHA-256 known to the caller
 * (trusted, not computed again).  0 or negative. */
int ap_cache_kernel_put_known(ap_cache *c, const uint8_t key[32], const uint8_t *data,
			      size_t len, const uint8_t digest[32]);

/* ---- tuning records (server/tune/tune.h) ------------------------------------- */

/* One tuning result of a kernel signature (ap_tune_signature) on a target. */
typedef struct ap_tune_record {
	char emitter[32];          /* the emitter whose space `config` is a point of */
	char config[256];          /* "knob=value ..." (ap_sched_describe) */
	char method[16];           /* "exhaustive", "annealing", "measured" */
	char device[160];          /* measured: the device id "NAME|SMS"; "" for the model's */
	unsigned sms;              /* measured: its SM count; 0 for the model's */
	double modelled_us;        /* the cost model's time of `config` */
	double measured_us;        /* < 0: not measured */
	unsigned tried;            /* configurations evaluated (measured: timed) */
	char candidates[1024];     /* the model's record: the configurations offered
				      for measurement, ';'-separated */
} ap_tune_record;

/* Looks up the record of `sig` for `target`: with device NULL, a measured
 * record (the newest) before the model's; with device "", the model's
 * only; else that device's measured record.  1 with *out set, 0 when
 * there is none (also when the cache is off), negative on an SQLite
 * error.  Strings are untrusted: callers parse `config` again. */
int ap_cache_tuning_get(ap_cache *c, const uint8_t sig[32], const char *target,
			const char *device, ap_tune_record *out);
/* Stores r for (sig, target, r's device when measured_us >= 0, else ""),
 * replacing the record it had; a measured record also retires the bundles
 * holding kernel `sig` for that device (ap_cache_bundle_tuned) and advances
 * the tuning generation.  0 or negative (off, busy, I/O). */
int ap_cache_tuning_put(ap_cache *c, const uint8_t sig[32], const char *target,
			const ap_tune_record *r);
/* As ap_cache_tuning_put for n records in one transaction: all stored or
 * none; measured records retire the bundles holding their kernels for their
 * device, and with `advance` (model records whose choice changed: the
 * background tuner's refinement) the bundles holding those kernels for any
 * device retire; then the tuning generation advances once.  Measured
 * records are bounded by AP_CACHE_MEASURED_MAX (oldest out). */
int ap_cache_tuning_put_many(ap_cache *c, const uint8_t (*sigs)[32], const char *target,
			     const ap_tune_record *recs, int n, bool advance);
/* How many times measured records were stored or the background tuner
 * changed a model record's choice in this file (reported in TuneReply).
 * Not part of any key: a change retires only the bundles holding the
 * kernels it concerns (ap_cache_bundle_tuned).  0 when the cache is off. */
uint64_t ap_cache_tuning_generation(ap_cache *c);

/* Bounds on what clients can make the tuning tables hold; the oldest rows
 * go first. */
#define AP_CACHE_REPORTS_MAX 65536   /* rows of tune_reports */
#define AP_CACHE_MEASURED_MAX 65536  /* measured records (all devices) */

/* Notes that the bundle cached under `key` holds the tuned kernels `sigs`
 * (n, 32 bytes each), built for `target` on `device` ("" or NULL: no
 * device named).  A later ap_cache_tuning_put_many that stores a measured
 * record of one of them for that device, or changes the model's choice
 * (`advance`), deletes the bundle (a miss: it is compiled again with the
 * new record); other bundles stay.  0, or negative (off, busy, I/O). */
int ap_cache_bundle_tuned(ap_cache *c, const uint8_t key[32], const char *target,
			  const char *device, const uint8_t (*sigs)[32], int n);

/* One measurement of a client's tuning report. */
typedef struct ap_cache_report {
	const uint8_t *sig;        /* 32 bytes: the kernel's tuning signature */
	const char *schedule;      /* the candidate timed (printable, < 256 bytes) */
	double time_us;            /* its median time, microseconds */
} ap_cache_report;

/* Stores the measurements of client `reporter` ("uid:N", "tcp:ADDR",
 * "apollod") for `target` on `device` (its id, "NAME|SMS"), replacing that
 * client's earlier time of the same kernel and schedule; the table keeps
 * at most AP_CACHE_REPORTS_MAX rows.  All rows or none.  0 or negative. */
int ap_cache_report_put(ap_cache *c, const char *target, const char *device,
			const char *reporter, const ap_cache_report *rows, int n);

/* The schedule the reports agree on for kernel `sig` on (`target`,
 * `device`): among the schedules timed by at least two distinct clients, or
 * by client `trusted` (the daemon's own tuner; may be NULL), the one whose
 * median time is smallest.  1 with `schedule` (cap bytes), *median_us and
 * *reporters set; 0 when no schedule has agreement yet (or the cache is
 * off); negative on an SQLite error.  At most 4096 rows are read. */
int ap_cache_report_agreed(ap_cache *c, const uint8_t sig[32], const char *target,
			   const char *device, const char *trusted, char *schedule, size_t cap,
			   double *median_us, unsigned *reporters);

/* Limits, in bytes: `max_bytes` of blob data in the file (0: no limit;
 * when over it, least recently used blobs are evicted with the action and
 * kernel rows naming them, down to 90%, at once and after every write),
 * and `memory_bytes` of verified blobs kept in memory (0: none; set once,
 * later calls do not resize it).  A fresh cache has neither. */
void ap_cache_set_limits(ap_cache *c, uint64_t max_bytes, uint64_t memory_bytes);

/* Entry counts for the Stats reply, kept in memory (counted at open,
 * updated on every insert and delete by this process, and counted again
 * whenever eviction runs or a write found no room): action entries, kernel
 * entries, blobs and the sum of blob sizes in bytes; the limit, what it
 * evicted, the memory tier; the degraded state (no room). */
typedef struct ap_cache_counts {
	uint64_t actions, kernels, blobs, blob_bytes;
	uint64_t tuning;                        /* tuning records */
	uint64_t max_bytes;                     /* the limit (0: none) */
	uint64_t evicted_blobs, evicted_bytes;  /* by the limit, since open */
	uint64_t memory_blobs, memory_bytes;    /* in the memory tier now */
	uint64_t memory_hits;                   /* blob reads it answered */
	uint64_t retired;                       /* bundles retired by tuning changes */
	bool degraded;                          /* no room: writes skipped, retried */
	uint64_t skipped_writes;                /* writes skipped while degraded */
	uint64_t space_failures;                /* writes the file system refused for space */
} ap_cache_counts;
void ap_cache_get_counts(const ap_cache *c, ap_cache_counts *out);

/* Tests only: makes the cache's clock (seconds, for least-recently-used
 * order and the degraded state's retries) read `now`; 0 gives the real
 * clock back. */
void ap__cache_set_time(ap_cache *c, int64_t now);

/* Tests only: overwrites the bytes stored for `digest` with `data`, keeping
 * the digest, to simulate a corrupted row.  Returns 0 or negative. */
int ap__cache_blob_overwrite(ap_cache *c, const uint8_t digest[32], const uint8_t *data,
			     size_t len);

#endif
