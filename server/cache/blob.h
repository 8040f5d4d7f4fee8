/* blob.h -- an immutable blob shared by reference (issue 26, item 2): the
 * memory tier's entries (hot.h) and the warm answers that carry them
 * (server/compile), so that a blob is copied once -- into the reply's
 * frame -- however many kernels of a bundle name it.
 *
 * A blob is made once, its bytes copied in and never changed afterwards,
 * with one reference: its maker's.  Every holder takes a reference of its
 * own (ap_blob_retain) and gives it back (ap_blob_release); the last one
 * frees the blob.  So the memory tier may evict an entry while a reply
 * still reads its bytes: the tier's reference goes, the reply's stays.
 *
 * Thread safety: references are counted atomically and the bytes are
 * read-only, so any number of threads may hold and read one blob; a
 * reference itself (the pointer one holder owns) is that holder's.
 */
#ifndef AP_CACHE_BLOB_H
#define AP_CACHE_BLOB_H

#include "../../common/base.h"

typedef struct ap_blob ap_blob;

/* A new blob holding a copy of the `len` bytes at `data` (may be NULL when
 * len is 0), named by `digest` (32 bytes: their SHA-256, which the caller
 * has computed or is about to verify; not checked here), with one
 * reference, the caller's.  NULL when out of memory. */
__ap_give ap_blob *ap_blob_new(const uint8_t *data, size_t len, const uint8_t digest[32]);
/* Takes another reference to `b` (not NULL) and returns b. */
__ap_give ap_blob *ap_blob_retain(__ap_keep ap_blob *b);
/* Gives back one reference; the last frees the blob.  Accepts NULL,
 * returns NULL. */
ap_blob *ap_blob_release(__ap_take ap_blob *b);

/* The bytes (never NULL, also for 0 bytes; valid while a reference is
 * held), their length in bytes, and the digest the blob was made with. */
const uint8_t *ap_blob_data(const ap_blob *b);
size_t ap_blob_len(const ap_blob *b);
const uint8_t *ap_blob_digest(const ap_blob *b);

/* Tests only: blobs made (ap_blob_new) and bytes copied into them since
 * the process started, and blobs alive now, all threads together. */
typedef struct ap_blob_counts {
	uint64_t made, bytes_copied, alive;
} ap_blob_counts;
void ap__blob_get_counts(ap_blob_counts *out);

#endif
