/* blob.c -- immutable blobs shared by reference (see blob.h).
 *
 * Approach: one allocation per blob, the header (reference count, length,
 * digest) followed by the bytes, so a blob costs one malloc and one copy.
 * The count is atomic; the release that takes it to zero frees the blob
 * (acquire-release ordering, so that every holder's reads come before the
 * free).  Three process-wide counters serve the tests.
 */
#include "blob.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct ap_blob {
	atomic_uint_fast64_t refs;
	size_t len;
	uint8_t digest[32];
	uint8_t data[];
};

static atomic_uint_fast64_t n_made, n_bytes, n_alive;

ap_blob *ap_blob_new(const uint8_t *data, size_t len, const uint8_t digest[32])
{
	ap_blob *b;

	if (len > SIZE_MAX - sizeof(*b) - 1)
		return NULL;
	b = malloc(sizeof(*b) + (len ? len : 1));
	if (!b)
		return NULL;
	atomic_init(&b->refs, 1);
	b->len = len;
	memcpy(b->digest, digest, 32);
	if (len)
		memcpy(b->data, data, len);
	atomic_fetch_add_explicit(&n_made, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&n_bytes, len, memory_order_relaxed);
	atomic_fetch_add_explicit(&n_alive, 1, memory_order_relaxed);
	return b;
}

ap_blob *ap_blob_retain(ap_blob *b)
{
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	return b;
}

ap_blob *ap_blob_release(ap_blob *b)
{
	if (b && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
		atomic_fetch_sub_explicit(&n_alive, 1, memory_order_relaxed);
		free(b);
	}
	return NULL;
}

const uint8_t *ap_blob_data(const ap_blob *b)
{
	return b->data;
}

size_t ap_blob_len(const ap_blob *b)
{
	return b->len;
}

const uint8_t *ap_blob_digest(const ap_blob *b)
{
	return b->digest;
}

void ap__blob_get_counts(ap_blob_counts *out)
{
	out->made = atomic_load(&n_made);
	out->bytes_copied = atomic_load(&n_bytes);
	out->alive = atomic_load(&n_alive);
}
