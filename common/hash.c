/* hash.c -- SHA-256 through OpenSSL's EVP interface, hex printing, and the
 * few other things Apollo takes from libcrypto: HMAC-SHA256, random bytes
 * and a constant-time comparison (the TCP handshake, common/frame.h).
 *
 * Everything Apollo hashes (canonical graphs, cache keys, kernel blobs) goes
 * through these few functions, so the digest algorithm is chosen in one
 * place.  EVP contexts are per call, so the functions are thread-safe.
 */
#include "graph.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
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

/* HMAC-SHA256 (RFC 2104) with `key` over the concatenation of the `n`
 * byte strings parts[i] (lens[i] bytes each), into `out` (32 bytes).
 * 0, or AP_ENOMEM (OpenSSL failed; `out` is then all zero and must not be
 * compared with anything). */
int ap_hmac_sha256(const void *key, size_t key_len, const void *const *parts,
		   const size_t *lens, int n, uint8_t out[32])
{
	uint8_t *msg;
	size_t total = 0, off = 0;
	unsigned int olen = 32;
	int rc = 0;

	memset(out, 0, 32);
	for (int i = 0; i < n; i++)
		total += lens[i];
	msg = malloc(total ? total : 1);
	if (!msg)
		return AP_ENOMEM;
	for (int i = 0; i < n; i++) {
		if (lens[i])
			memcpy(msg + off, parts[i], lens[i]);
		off += lens[i];
	}
	if (!HMAC(EVP_sha256(), key, (int)key_len, msg, total, out, &olen)) {
		memset(out, 0, 32);
		rc = AP_ENOMEM;
	}
	free(msg);
	return rc;
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
