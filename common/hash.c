/* hash.c -- SHA-256 through OpenSSL's EVP interface, hex printing, and the
 * few other things Apollo takes from libcrypto: HMAC-SHA256, random bytes
 * and a constant-time comparison (the TCP handshake, common/frame.h; the
 * signed entries of the shared cache, server/cache/l2.c).
 *
 * Everything Apollo hashes (canonical graphs, cache keys, kernel blobs) goes
 * through these few functions, so the digest algorithm is chosen in one
 * place.
 *
 * Speed (issue 10): a warm request hashes a graph of a few hundred nodes
 * into thousands of small digests (graph_hash.c), each fed 8 bytes at a
 * time.  Naming the digest with EVP_sha256() makes every EVP_DigestInit
 * fetch the algorithm again from the provider (a lock and a property
 * query: 40% of a warm request), and a fresh EVP_MD_CTX per digest adds
 * allocations.  So: the algorithm is fetched once (EVP_MD_fetch, kept for
 * the process), each thread keeps its finished contexts in a small spare
 * list (a pthread key, freed when the thread ends) and re-initialises them
 * (EVP_DigestInit_ex2 with the same algorithm is a reset), and updates
 * smaller than the context's buffer are collected there and handed to
 * OpenSSL in one call.  All of it is per thread: the functions stay
 * thread-safe without a lock.
 */
#include "graph.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SPARE_MAX 4          /* finished contexts a thread keeps */
#define SMALL_UPDATE 128     /* updates up to this size are collected */

struct ap_sha256_ctx {
	EVP_MD_CTX *md;
	size_t n;                /* bytes waiting in buf */
	uint8_t buf[2 * SMALL_UPDATE];
	ap_sha256_ctx *next;     /* in its thread's spare list */
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256_md;    /* fetched once; NULL: EVP_sha256() */
static pthread_key_t spare_key;
static bool have_key;

/* The spare list of a thread that ends. */
static void free_spares(void *head)
{
	for (ap_sha256_ctx *c = head, *next; c; c = next) {
		next = c->next;
		EVP_MD_CTX_free(c->md);
		free(c);
	}
}

static void init_once(void)
{
	sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
	have_key = pthread_key_create(&spare_key, free_spares) == 0;
}

static const EVP_MD *md_sha256(void)
{
	pthread_once(&once, init_once);
	return sha256_md ? sha256_md : EVP_sha256();
}

/* A context ready for updates: a spare one reset, or a new one.  NULL on
 * ENOMEM or when OpenSSL fails. */
static ap_sha256_ctx *ctx_take(void)
{
	const EVP_MD *md = md_sha256();
	ap_sha256_ctx *c = have_key ? pthread_getspecific(spare_key) : NULL;

	if (c) {
		pthread_setspecific(spare_key, c->next);
	} else {
		c = malloc(sizeof(*c));
		if (!c)
			return NULL;
		c->md = EVP_MD_CTX_new();
		if (!c->md) {
			free(c);
			return NULL;
		}
	}
	c->n = 0;
	c->next = NULL;
	if (!EVP_DigestInit_ex2(c->md, md, NULL)) {
		EVP_MD_CTX_free(c->md);
		free(c);
		return NULL;
	}
	return c;
}

/* Puts a finished context on the thread's spare list (or frees it). */
static void ctx_give_back(ap_sha256_ctx *c)
{
	ap_sha256_ctx *head = have_key ? pthread_getspecific(spare_key) : NULL;
	int n = 0;

	for (ap_sha256_ctx *p = head; p; p = p->next)
		n++;
	if (have_key && n < SPARE_MAX) {
		c->next = head;
		if (pthread_setspecific(spare_key, c) == 0)
			return;
	}
	EVP_MD_CTX_free(c->md);
	free(c);
}

static void ctx_flush(ap_sha256_ctx *c)
{
	if (c->n) {
		EVP_DigestUpdate(c->md, c->buf, c->n);
		c->n = 0;
	}
}

/* Finishes `c` into `out` (all zero on OpenSSL's failure); gives it back. */
static void ctx_finish(ap_sha256_ctx *c, uint8_t out[32])
{
	unsigned int n = 32;

	ctx_flush(c);
	if (!EVP_DigestFinal_ex(c->md, out, &n))
		memset(out, 0, 32);
	ctx_give_back(c);
}

/* SHA-256 of `len` bytes of `buf` (FIPS 180-4) into `out` (32 bytes).  On
 * the (practically impossible) failure of OpenSSL, `out` is all zero. */
void ap_sha256(const void *buf, size_t len, uint8_t out[32])
{
	ap_sha256_ctx *c = ctx_take();

	if (!c) {
		unsigned int n = 32;

		if (!EVP_Digest(buf, len, out, &n, md_sha256(), NULL))
			memset(out, 0, 32);
		return;
	}
	if (len)
		EVP_DigestUpdate(c->md, buf, len);
	ctx_finish(c, out);
}

/* A new incremental SHA-256 context, or NULL on ENOMEM.  Finish it with
 * ap_sha256_final, which frees it (to the thread's spares). */
__ap_give ap_sha256_ctx *ap_sha256_new(void)
{
	return ctx_take();
}

/* Adds `len` bytes; a NULL context is ignored (the final digest of a NULL
 * context is all zero). */
void ap_sha256_update(ap_sha256_ctx *c, const void *buf, size_t len)
{
	if (!c || len == 0)
		return;
	if (len <= SMALL_UPDATE) {
		if (c->n + len > sizeof(c->buf))
			ctx_flush(c);
		memcpy(c->buf + c->n, buf, len);
		c->n += len;
		return;
	}
	ctx_flush(c);
	EVP_DigestUpdate(c->md, buf, len);
}

void ap_sha256_final(__ap_take ap_sha256_ctx *c, uint8_t out[32])
{
	if (!c) {
		memset(out, 0, 32);
		return;
	}
	ctx_finish(c, out);
}

/* Writes 2*n lowercase hex digits and a NUL into `out` (2*n+1 bytes). */
void ap_hex(const uint8_t *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

/* HMAC-SHA256 (RFC 2104, with SHA-256's 64-byte block) with `key` over
 * the concatenation of the `n` byte strings parts[i] (lens[i] bytes each),
 * into `out` (32 bytes): H((K ^ opad) || H((K ^ ipad) || message)), K the
 * key zero-padded to a block (hashed first when longer).  Built on the
 * contexts above, so it allocates nothing once a thread has spares.
 * 0, or AP_ENOMEM (no context; `out` is then all zero and must not be
 * compared with anything).  RFC 4231's test vectors: tests/check_graph.c. */
int ap_hmac_sha256(const void *key, size_t key_len, const void *const *parts,
		   const size_t *lens, int n, uint8_t out[32])
{
	uint8_t k[64], pad[64], inner[32];
	ap_sha256_ctx *c;

	memset(out, 0, 32);
	memset(k, 0, sizeof(k));
	if (key_len > sizeof(k))
		ap_sha256(key, key_len, k);
	else if (key_len)
		memcpy(k, key, key_len);
	c = ctx_take();
	if (!c)
		return AP_ENOMEM;
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x36;
	ap_sha256_update(c, pad, 64);
	for (int i = 0; i < n; i++)
		ap_sha256_update(c, parts[i], lens[i]);
	ctx_finish(c, inner);
	c = ctx_take();
	if (!c)
		return AP_ENOMEM;
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x5c;
	ap_sha256_update(c, pad, 64);
	ap_sha256_update(c, inner, 32);
	ctx_finish(c, out);
	OPENSSL_cleanse(k, sizeof(k));
	OPENSSL_cleanse(pad, sizeof(pad));
	return 0;
}

/* `n` bytes from the operating system's CSPRNG (through OpenSSL).  0, or
 * AP_EIO when none could be had. */
int ap_random_bytes(uint8_t *buf, size_t n)
{
	return RAND_bytes(buf, (int)n) == 1 ? 0 : AP_EIO;
}

/* True when the `n` bytes at a and b are equal; the time taken does not
 * depend on where they differ. */
bool ap_mem_equal_ct(const void *a, const void *b, size_t n)
{
	return CRYPTO_memcmp(a, b, n) == 0;
}
