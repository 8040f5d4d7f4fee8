/* hot.h -- the memory tier of the local cache (internal to server/cache):
 * blobs read from the SQLite file and verified there, kept in memory by
 * digest, least recently used first out, up to a byte budget.
 *
 * Process memory is not something another program can alter, so a blob
 * verified once when it came from the file is served from here without
 * reading or hashing it again; the file itself is still verified on every
 * read (cache.h).  Content-addressed: an entry is valid for as long as the
 * process lives, whatever other daemons do to the file.
 *
 * Thread safety: every function may be called from any thread; one mutex.
 */
#ifndef AP_CACHE_HOT_H
#define AP_CACHE_HOT_H

#include "../../common/base.h"

typedef struct ap_hot ap_hot;

/* A tier of at most `max_bytes` bytes of blob data (entries' bookkeeping
 * not counted); 0 gives a tier that keeps nothing.  NULL on ENOMEM. */
__ap_give ap_hot *ap_hot_new(uint64_t max_bytes);
ap_hot *ap_hot_free(__ap_take ap_hot *h);   /* accepts NULL, returns NULL */

/* A copy of the blob named `digest`: 1 with *data (malloc'd, caller frees;
 * never NULL, even for 0 bytes) and *len, and *last_touch the time (s)
 * last recorded with ap_hot_touched; 0 when absent (or out of memory). */
int ap_hot_get(ap_hot *h, const uint8_t digest[32], __ap_give uint8_t **data, size_t *len,
	       int64_t *last_touch);
/* Records that the file's row for `digest` was marked used at `now`. */
void ap_hot_touched(ap_hot *h, const uint8_t digest[32], int64_t now);
/* Keeps a copy of `len` bytes whose SHA-256 the caller has verified to be
 * `digest`, touched at `now`, evicting the least recently used entries to
 * stay within the budget (a blob larger than the budget is not kept). */
void ap_hot_put(ap_hot *h, const uint8_t digest[32], const uint8_t *data, size_t len,
		int64_t now);

typedef struct ap_hot_counts {
	uint64_t blobs, bytes;        /* held now */
	uint64_t hits, misses;        /* ap_hot_get results since creation */
} ap_hot_counts;
void ap_hot_get_counts(ap_hot *h, ap_hot_counts *out);

#endif
