/* pb_wire.h -- reading the protobuf wire format by hand, for the few places
 * that must look at serialized bytes without decoding them into messages:
 * the daemon finding the CompileRequest inside an Envelope (its digest
 * names a request for the warm path, server/compile), and the client
 * reading an ONNX model's structure without touching its weights
 * (onnx_skeleton.c).
 *
 * Wire format (protobuf encoding spec): a message is a sequence of fields,
 * each a varint tag (field number << 3 | wire type) and a value: varint
 * (0), 64-bit (1), length-delimited (2: varint length, then the bytes),
 * 32-bit (5).  Groups (3, 4) are refused.  Every length is checked against
 * the bytes left before it is used; nothing here allocates.
 */
#ifndef AP_PB_WIRE_H
#define AP_PB_WIRE_H

#include "base.h"

typedef struct ap_pbw {
	const uint8_t *p, *end;
} ap_pbw;

typedef struct ap_pbw_field {
	uint32_t number;
	int wire;                 /* 0, 1, 2 or 5 */
	uint64_t varint;          /* wire 0: the value */
	const uint8_t *start;     /* the whole field: tag, length and value */
	const uint8_t *data;      /* wire 2: the bytes; wire 1/5: the 8 / 4 bytes */
	size_t len;               /* wire 2: their count; 1: 8; 5: 4; 0: 0 */
	const uint8_t *end;       /* one past the field */
} ap_pbw_field;

static inline void ap_pbw_init(ap_pbw *r, const uint8_t *p, size_t n)
{
	r->p = p;
	r->end = p + n;
}

/* Reads the next field: 1 and *f, 0 at the end of the bytes, AP_EMESSAGE
 * for bytes that are not the wire format (a truncated varint or value, a
 * length past the end, field number 0, a group or unknown wire type). */
int ap_pbw_next(ap_pbw *r, ap_pbw_field *f);

/* Finds field `number` of the message in `n` bytes at `p` when it occurs
 * exactly once and length-delimited: 1 with *val and *len (borrowed);
 * 0 when it is absent, repeated (a parser would merge the occurrences, so
 * the bytes of one would not be the message), of another wire type, or
 * the bytes do not walk. */
int ap_pbw_single_field(const uint8_t *p, size_t n, uint32_t number, const uint8_t **val,
			size_t *len);

/* Appends a varint to `out` (at least 10 bytes free); returns its length. */
size_t ap_pbw_put_varint(uint8_t *out, uint64_t v);

#endif
