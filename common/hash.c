/* hash.c -- SHA-256 through OpenSSL's EVP interface, and hex printing.
 *
 * Everything Apollo hashes (canonical graphs, cache keys, kernel blobs) goes
 * through these few functions, so the digest algorithm is chosen in one
 * place.  EVP contexts are per call, so the functions are thread-safe.
 */
#include "graph.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

struct ap_sha256_ctx {
	EVP_MD_CTX *md;
};

/* SHA-256 of `len` bytes of `buf` (FIPS 180-4) into `out` (32 bytes).  On
 * the (practically impossible) failure of OpenSSL, `out` is all zero. */
void ap_sha256(const void *buf, size_t len, uint8_t out[32])
{
	unsigned int n = 32;

	if (!EVP_Digest(buf, len, out, &n, EVP_sha256(), NULL))
		memset(out, 0, 32);
}

/* A new incremental SHA-256 context, or NULL on ENOMEM.  Finish it with
 * ap_sha256_final, which frees it. */
__ap_give ap_sha256_ctx *ap_sha256_new(void)
{
	ap_sha256_ctx *c = malloc(sizeof(*c));

	if (!c)
		return NULL;
	c->md = EVP_MD_CTX_new();
	if (!c->md || !EVP_DigestInit_ex(c->md, EVP_sha256(), NULL)) {
		EVP_MD_CTX_free(c->md);
		free(c);
		return NULL;
	}
	return c;
}

/* Adds `len` bytes; a NULL context is ignored (the final digest of a NULL
 * context is all zero). */
void ap_sha256_update(ap_sha256_ctx *c, const void *buf, size_t len)
{
	if (c && len > 0)
		EVP_DigestUpdate(c->md, buf, len);
}

void ap_sha256_final(__ap_take ap_sha256_ctx *c, uint8_t out[32])
{
	unsigned int n = 32;

	if (!c) {
		memset(out, 0, 32);
		return;
	}
	if (!EVP_DigestFinal_ex(c->md, out, &n))
		memset(out, 0, 32);
	EVP_MD_CTX_free(c->md);
	free(c);
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
