/* hot.c -- the memory tier of the local cache (see hot.h).
 *
 * Approach: a chained hash table on the digest's first 8 bytes (digests
 * are uniformly spread already) and one doubly linked list in order of
 * use, most recent at the head.  Each entry holds one reference to an
 * immutable blob (blob.h).  A get moves its entry to the head and takes
 * another reference under the mutex -- no copy: kernels compiled as one
 * program share one blob, and a warm answer names it once, whatever the
 * number of kernels; a put evicts from the tail until the new blob fits,
 * each evicted entry giving back only its own reference.  The table
 * doubles when it holds more entries than buckets.
 */
#include "hot.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct hot_entry {
	const uint8_t *digest;             /* the blob's */
	ap_blob *blob;                     /* the tier's reference */
	size_t len;
	int64_t touched;
	struct hot_entry *chain;           /* next in the bucket */
	struct hot_entry *newer, *older;   /* the use order */
};

struct ap_hot {
	pthread_mutex_t mu;
	uint64_t max_bytes, bytes, hits, misses;
	size_t n, n_buckets;
	struct hot_entry **buckets;
	struct hot_entry *newest, *oldest;
};

static size_t bucket_of(const ap_hot *h, const uint8_t digest[32])
{
	uint64_t x;

	memcpy(&x, digest, sizeof(x));
	return (size_t)(x & (h->n_buckets - 1));
}

ap_hot *ap_hot_new(uint64_t max_bytes)
{
	ap_hot *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	h->n_buckets = 64;
	h->buckets = calloc(h->n_buckets, sizeof(*h->buckets));
	if (!h->buckets) {
		free(h);
		return NULL;
	}
	h->max_bytes = max_bytes;
	pthread_mutex_init(&h->mu, NULL);
	return h;
}

ap_hot *ap_hot_free(ap_hot *h)
{
	if (!h)
		return NULL;
	for (struct hot_entry *e = h->newest, *next; e; e = next) {
		next = e->older;
		ap_blob_release(e->blob);
		free(e);
	}
	free(h->buckets);
	pthread_mutex_destroy(&h->mu);
	free(h);
	return NULL;
}

/* Under mu: the entry for `digest`, or NULL. */
static struct hot_entry *find(ap_hot *h, const uint8_t digest[32])
{
	for (struct hot_entry *e = h->buckets[bucket_of(h, digest)]; e; e = e->chain)
		if (!memcmp(e->digest, digest, 32))
			return e;
	return NULL;
}

static void unlink_use(ap_hot *h, struct hot_entry *e)
{
	if (e->newer)
		e->newer->older = e->older;
	else
		h->newest = e->older;
	if (e->older)
		e->older->newer = e->newer;
	else
		h->oldest = e->newer;
	e->newer = e->older = NULL;
}

static void link_newest(ap_hot *h, struct hot_entry *e)
{
	e->older = h->newest;
	e->newer = NULL;
	if (h->newest)
		h->newest->newer = e;
	h->newest = e;
	if (!h->oldest)
		h->oldest = e;
}

/* Under mu: removes and frees `e`. */
static void drop(ap_hot *h, struct hot_entry *e)
{
	struct hot_entry **pp = &h->buckets[bucket_of(h, e->digest)];

	while (*pp != e)
		pp = &(*pp)->chain;
	*pp = e->chain;
	unlink_use(h, e);
	h->bytes -= e->len;
	h->n--;
	ap_blob_release(e->blob);
	free(e);
}

/* Under mu: doubles the table (nothing happens when out of memory). */
static void grow(ap_hot *h)
{
	size_t nb = h->n_buckets * 2;
	struct hot_entry **b = calloc(nb, sizeof(*b));

	if (!b)
		return;
	for (size_t i = 0; i < h->n_buckets; i++) {
		for (struct hot_entry *e = h->buckets[i], *next; e; e = next) {
			uint64_t x;

			next = e->chain;
			memcpy(&x, e->digest, sizeof(x));
			e->chain = b[x & (nb - 1)];
			b[x & (nb - 1)] = e;
		}
	}
	free(h->buckets);
	h->buckets = b;
	h->n_buckets = nb;
}

int ap_hot_ref(ap_hot *h, const uint8_t digest[32], ap_blob **out, int64_t *last_touch)
{
	struct hot_entry *e;

	if (!h)
		return 0;
	pthread_mutex_lock(&h->mu);
	e = find(h, digest);
	if (e) {
		*out = ap_blob_retain(e->blob);
		*last_touch = e->touched;
		unlink_use(h, e);
		link_newest(h, e);
		h->hits++;
	} else {
		h->misses++;
	}
	pthread_mutex_unlock(&h->mu);
	return e != NULL;
}

void ap_hot_touched(ap_hot *h, const uint8_t digest[32], int64_t now)
{
	struct hot_entry *e;

	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	e = find(h, digest);
	if (e)
		e->touched = now;
	pthread_mutex_unlock(&h->mu);
}

void ap_hot_put(ap_hot *h, ap_blob *b, int64_t now)
{
	struct hot_entry *e;
	size_t len = ap_blob_len(b);

	if (!h || len > h->max_bytes)
		return;
	e = calloc(1, sizeof(*e));
	if (!e)
		return;
	e->digest = ap_blob_digest(b);
	e->len = len;
	e->touched = now;
	pthread_mutex_lock(&h->mu);
	if (find(h, e->digest)) {   /* another thread was first */
		pthread_mutex_unlock(&h->mu);
		free(e);
		return;
	}
	e->blob = ap_blob_retain(b);
	while (h->oldest && h->bytes + len > h->max_bytes)
		drop(h, h->oldest);
	if (h->n >= h->n_buckets)
		grow(h);
	e->chain = h->buckets[bucket_of(h, e->digest)];
	h->buckets[bucket_of(h, e->digest)] = e;
	link_newest(h, e);
	h->bytes += len;
	h->n++;
	pthread_mutex_unlock(&h->mu);
}

void ap_hot_get_counts(ap_hot *h, ap_hot_counts *out)
{
	memset(out, 0, sizeof(*out));
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	out->blobs = h->n;
	out->bytes = h->bytes;
	out->hits = h->hits;
	out->misses = h->misses;
	pthread_mutex_unlock(&h->mu);
}
