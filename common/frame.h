/* frame.h -- framing on the Apollo socket, where the socket lives, and the
 * token handshake of TCP connections.
 *
 * Each message is a 4-byte big-endian length followed by that many bytes of
 * one serialized apollo.Envelope (proto/apollo.proto).  A receiver checks
 * the length against its configured maximum before allocating anything; a
 * zero length is invalid.
 */
#ifndef AP_FRAME_H
#define AP_FRAME_H

#include "base.h"

#define AP_FRAME_HEADER_BYTES 4
/* Default largest frame payload, bytes (apollod --max-frame-bytes). */
#define AP_FRAME_DEFAULT_MAX ((uint32_t)64 << 20)

/* Payload length encoded in a 4-byte big-endian header. */
uint32_t ap_frame_get_len(const uint8_t hdr[AP_FRAME_HEADER_BYTES]);
void ap_frame_put_len(uint8_t hdr[AP_FRAME_HEADER_BYTES], uint32_t len);
/* 0 when 1 <= len <= max; else AP_EFRAME (len 0) or AP_ETOOLARGE (over
 * max), with `err` saying which and the numbers. */
int ap_frame_check_len(uint32_t len, uint32_t max, ap_error *err);

/* The socket path a client or daemon uses when none is given: $APOLLO_SOCKET
 * if set and non-empty; else $XDG_RUNTIME_DIR/apollod.sock when that is an
 * absolute path (the per-user 0700 directory of systemd-logind); else
 * /tmp/apollod-<euid>/apollod.sock, a private directory apollod creates
 * with mode 0700 (never a file directly in world-writable /tmp, where
 * another user could create it first).  Writes at most `cap` bytes
 * including the NUL; returns 0 or AP_ETOOLARGE when it does not fit (a
 * Unix socket path holds at most 107 bytes). */
int ap_default_socket_path(char *buf, size_t cap);

/* Checks, and creates when missing (mode 0700), the directory that will
 * hold the daemon's socket `path`: it must belong to this user (euid) or
 * root, and must not be writable by others unless sticky (like /tmp); a
 * directory named apollod-<euid> (the default's) must be this user's own
 * and private (no group or other permission bits), since its name is
 * guessable.  Returns 0, or AP_EIO with `err` saying who owns what and why
 * that is refused.  Issue 11: another local user must not be able to
 * plant or replace the socket. */
int ap_socket_dir_check(const char *path, ap_error *err);

/* ---- the TCP handshake ----------------------------------------------------
 * A TCP client and the daemon prove to each other that they know the
 * shared token without sending it (HMAC-SHA256, RFC 2104, keyed with the
 * token's bytes):
 *   client -> Hello { auth_nonce = Nc }                       (32 random bytes)
 *   daemon -> HelloReply { auth_nonce = Ns,
 *                          auth_proof = HMAC(token, "apollod server" Nc Ns) }
 *   client checks the proof (else: not our daemon), then
 *   client -> Hello { auth_proof = HMAC(token, "apollo client" Ns Nc) }
 *   daemon checks it (else: closes), then -> the full HelloReply.
 * Proofs are compared in constant time; fresh nonces on both sides keep a
 * recorded exchange from being replayed, and the two labels keep one
 * side's proof from serving as the other's. */
#define AP_AUTH_NONCE_BYTES 32
#define AP_AUTH_PROOF_BYTES 32
typedef enum ap_auth_role { AP_AUTH_SERVER, AP_AUTH_CLIENT } ap_auth_role;
/* The proof `role` sends for the nonces (client's nc, daemon's ns): 0 or
 * AP_ENOMEM. */
int ap_auth_proof(const char *token, ap_auth_role role, const uint8_t nc[AP_AUTH_NONCE_BYTES],
		  const uint8_t ns[AP_AUTH_NONCE_BYTES], uint8_t out[AP_AUTH_PROOF_BYTES]);
/* True when `got` (got_len bytes) is the proof `role` must send (false
 * when it cannot be computed). */
bool ap_auth_check(const char *token, ap_auth_role role, const uint8_t nc[AP_AUTH_NONCE_BYTES],
		   const uint8_t ns[AP_AUTH_NONCE_BYTES], const uint8_t *got, size_t got_len);

#endif
