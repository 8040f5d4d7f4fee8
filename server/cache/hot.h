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
 * Entries are immutable blobs shared by reference (blob.h): a get hands
 * out a reference, not a copy, and eviction gives back only the tier's own
 * reference, so a blob a reply still holds outlives its entry.
 *
 * Thread safety: every function may be called from any thread; one mutex.
 */
#ifndef AP_CACHE_HOT_H
#define AP_CACHE_HOT_H

#include "../../common/base.h"
#include "blob.h"

typedef struct ap_hot ap_hot;

/* A tier of at most `max_bytes` bytes of blob data (entries' bookkeeping
 * not counted); 0 gives a tier that keeps nothing.  NULL on ENOMEM. */
__ap_give ap_hot *ap_hot_new(uint64_t max_bytes);
/* Gives back the tier's references (blobs others hold stay).  Accepts
 * NULL, returns NULL. */
ap_hot *ap_hot_free(__ap_take ap_hot *h);

/* The blob named `digest`: 1 with *out a new reference to it (the caller
 * releases it; nothing is copied) and *last_touch the time (s) last
 * recorded with ap_hot_touched; 0 when absent (h NULL too). */
int ap_hot_ref(ap_hot *h, const uint8_t digest[32], __ap_give ap_blob **out,
	       int64_t *last_touch);
/* Records that the file's row for `digest` was marked used at `now`. */
void ap_hot_touched(ap_hot *h, const uint8_t digest[32], int64_t now);
/* Keeps a reference to `b` (borrowed: the caller's stays the caller's),
 * whose bytes the caller has verified against its digest, touched at
 * `now`, evicting the least recently used entries to stay within the
 * budget (a blob larger than the budget is not kept; a digest already
 * held keeps its entry). */
void ap_hot_put(ap_hot *h, __ap_keep ap_blob *b, int64_t now);

typedef struct ap_hot_counts {
	uint64_t blobs, bytes;        /* held now */
	uint64_t hits, misses;        /* ap_hot_ref results since creation */
} ap_hot_counts;
void ap_hot_get_counts(ap_hot *h, ap_hot_counts *out);

#endif
