/* pb_wire.c -- the protobuf wire format read by hand (see pb_wire.h).
 *
 * Approach: one function reads one field and checks every length against
 * the end of the buffer before moving; the others are loops over it.
 */
#include "pb_wire.h"

/* Reads a varint of at most 10 bytes; false when truncated or too long. */
static bool get_varint(ap_pbw *r, uint64_t *out)
{
	uint64_t v = 0;

	for (int shift = 0; shift < 70; shift += 7) {
		uint8_t b;

		if (r->p >= r->end)
			return false;
		b = *r->p++;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*out = v;
			return true;
		}
	}
	return false;
}

int ap_pbw_next(ap_pbw *r, ap_pbw_field *f)
{
	uint64_t tag, n;
	size_t left;

	if (r->p >= r->end)
		return 0;
	f->start = r->p;
	f->varint = 0;
	f->data = NULL;
	f->len = 0;
	if (!get_varint(r, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff)
		return AP_EMESSAGE;
	f->number = (uint32_t)(tag >> 3);
	f->wire = (int)(tag & 7);
	switch (f->wire) {
	case 0:
		if (!get_varint(r, &f->varint))
			return AP_EMESSAGE;
		break;
	case 1:
	case 5:
		n = f->wire == 1 ? 8 : 4;
		if ((size_t)(r->end - r->p) < n)
			return AP_EMESSAGE;
		f->data = r->p;
		f->len = (size_t)n;
		r->p += n;
		break;
	case 2:
		if (!get_varint(r, &n))
			return AP_EMESSAGE;
		left = (size_t)(r->end - r->p);
		if (n > left)
			return AP_EMESSAGE;
		f->data = r->p;
		f->len = (size_t)n;
		r->p += n;
		break;
	default:
		return AP_EMESSAGE;
	}
	f->end = r->p;
	return 1;
}

int ap_pbw_single_field(const uint8_t *p, size_t n, uint32_t number, const uint8_t **val,
			size_t *len)
{
	ap_pbw r;
	ap_pbw_field f;
	int rc, seen = 0;

	ap_pbw_init(&r, p, n);
	while ((rc = ap_pbw_next(&r, &f)) == 1) {
		if (f.number != number)
			continue;
		if (f.wire != 2 || ++seen > 1)
			return 0;
		*val = f.data;
		*len = f.len;
	}
	return rc == 0 && seen == 1;
}

size_t ap_pbw_put_varint(uint8_t *out, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		out[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	out[n++] = (uint8_t)v;
	return n;
}
