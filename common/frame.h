/* frame.h -- framing on the Apollo socket and where the socket lives.
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
 * if set and non-empty, else /tmp/apollod-<uid>.sock.  Writes at most `cap`
 * bytes including the NUL; returns 0 or AP_ETOOLARGE when it does not fit
 * (a Unix socket path holds at most 107 bytes). */
int ap_default_socket_path(char *buf, size_t cap);

#endif
