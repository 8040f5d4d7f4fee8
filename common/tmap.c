/* tmap.c -- tiled tensor maps: the driver's rules and the host tile load
 * (see tmap.h). */
#include "tmap.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

size_t ap_tmap_elem_bytes(int dtype)
{
	switch (dtype) {
	case AP_TMAP_UINT8:
		return 1;
	case AP_TMAP_UINT16:
	case AP_TMAP_FLOAT16:
	case AP_TMAP_BFLOAT16:
		return 2;
	case AP_TMAP_UINT32:
	case AP_TMAP_INT32:
	case AP_TMAP_FLOAT32:
	case AP_TMAP_FLOAT32_FTZ:
	case AP_TMAP_TFLOAT32:
	case AP_TMAP_TFLOAT32_FTZ:
		return 4;
	case AP_TMAP_UINT64:
	case AP_TMAP_INT64:
	case AP_TMAP_FLOAT64:
		return 8;
	default:
		return 0;
	}
}

int ap_tmap_dtype_of(int dt)
{
	switch (dt) {
	case 1:
		return AP_TMAP_FLOAT32;
	case 2:
		return AP_TMAP_UINT8;
	case 6:
		return AP_TMAP_INT32;
	case 7:
		return AP_TMAP_INT64;
	case 10:
		return AP_TMAP_FLOAT16;
	case 11:
		return AP_TMAP_FLOAT64;
	case 16:
		return AP_TMAP_BFLOAT16;
	default:
		return -1;
	}
}

unsigned ap_tmap_swizzle_span(int swizzle)
{
	switch (swizzle) {
	case AP_TMAP_SWIZZLE_32B:
		return 32;
	case AP_TMAP_SWIZZLE_64B:
		return 64;
	case AP_TMAP_SWIZZLE_128B:
		return 128;
	default:
		return 0;
	}
}

int ap_tmap_swizzle_of(unsigned bytes)
{
	return bytes == 128 ? AP_TMAP_SWIZZLE_128B : bytes == 64 ? AP_TMAP_SWIZZLE_64B
	       : bytes == 32 ? AP_TMAP_SWIZZLE_32B : AP_TMAP_SWIZZLE_NONE;
}

static int refuse(char *why, size_t cap, const char *fmt, ...)
{
	va_list ap;

	if (why && cap) {
		va_start(ap, fmt);
		vsnprintf(why, cap, fmt, ap);
		va_end(ap);
	}
	return -1;
}

static bool is_float(int dtype)
{
	return dtype >= AP_TMAP_FLOAT16 && dtype <= AP_TMAP_TFLOAT32_FTZ;
}

int ap_tmap_check(const ap_tmap_desc *d, const void *global, char *why, size_t cap)
{
	size_t es = d ? ap_tmap_elem_bytes(d->dtype) : 0;
	unsigned span, row, salign;

	if (!d)
		return refuse(why, cap, "no tensor map description");
	if (!es)
		return refuse(why, cap, "data type %d: not a CUtensorMapDataType", d->dtype);
	if (d->interleave < AP_TMAP_INTERLEAVE_NONE || d->interleave > AP_TMAP_INTERLEAVE_32B)
		return refuse(why, cap, "interleave %d: NONE, 16B or 32B", d->interleave);
	if (d->swizzle < AP_TMAP_SWIZZLE_NONE || d->swizzle > AP_TMAP_SWIZZLE_128B)
		return refuse(why, cap, "swizzle %d: NONE, 32B, 64B or 128B", d->swizzle);
	if (d->l2 < AP_TMAP_L2_NONE || d->l2 > AP_TMAP_L2_256B)
		return refuse(why, cap, "L2 promotion %d: NONE, 64B, 128B or 256B", d->l2);
	if (d->oob != AP_TMAP_OOB_ZERO && d->oob != AP_TMAP_OOB_NAN)
		return refuse(why, cap, "OOB fill %d: NONE or NAN_REQUEST_ZERO_FMA", d->oob);
	if (d->rank < 1 || d->rank > AP_TMAP_MAX_RANK)
		return refuse(why, cap, "rank %d: 1 to 5", d->rank);
	if (d->interleave != AP_TMAP_INTERLEAVE_NONE && d->rank < 3)
		return refuse(why, cap, "rank %d: at least 3 with interleave", d->rank);
	salign = d->interleave == AP_TMAP_INTERLEAVE_32B ? 32 : 16;
	if (global && (uintptr_t)global % salign)
		return refuse(why, cap, "global address %p: aligned to %u bytes", global, salign);
	for (int i = 0; i < d->rank; i++) {
		if (d->dims[i] < 1 || d->dims[i] > (1ull << 32))
			return refuse(why, cap, "dims[%d] = %llu: 1 to 2^32", i, (unsigned long long)d->dims[i]);
		if (d->box[i] < 1 || d->box[i] > 256)
			return refuse(why, cap, "box[%d] = %u: 1 to 256", i, d->box[i]);
		if (d->estrides[i] < 1 || d->estrides[i] > 8)
			return refuse(why, cap, "element strides[%d] = %u: 1 to 8", i, d->estrides[i]);
	}
	for (int i = 0; i + 1 < d->rank; i++)
		if (d->strides[i] % salign || d->strides[i] >= (1ull << 40))
			return refuse(why, cap, "strides[%d] = %llu: a multiple of %u bytes below 2^40", i,
				      (unsigned long long)d->strides[i], salign);
	if (d->interleave == AP_TMAP_INTERLEAVE_NONE && (d->box[0] * es) % 16)
		return refuse(why, cap, "box[0] = %u elements of %zu bytes: a multiple of 16 bytes", d->box[0], es);
	if (d->interleave == AP_TMAP_INTERLEAVE_32B && d->swizzle != AP_TMAP_SWIZZLE_32B)
		return refuse(why, cap, "32-byte interleave needs the 32-byte swizzle");
	span = ap_tmap_swizzle_span(d->swizzle);
	row = d->interleave == AP_TMAP_INTERLEAVE_NONE ? d->box[0] * (unsigned)es
		: d->interleave == AP_TMAP_INTERLEAVE_16B ? 16 : 32;
	if (span && row > span)
		return refuse(why, cap, "a box row of %u bytes: at most the %u-byte swizzle's span", row, span);
	if (d->oob == AP_TMAP_OOB_NAN && !is_float(d->dtype))
		return refuse(why, cap, "the NaN OOB fill needs a floating-point type (data type %d)", d->dtype);
	return 0;
}

/* Elements a load takes along dimension i. */
static uint64_t loaded(const ap_tmap_desc *d, int i)
{
	if (i == 0 && d->interleave == AP_TMAP_INTERLEAVE_NONE)
		return d->box[0];
	return (d->box[i] + d->estrides[i] - 1) / d->estrides[i];
}

size_t ap_tmap_box_bytes(const ap_tmap_desc *d)
{
	size_t n = ap_tmap_elem_bytes(d->dtype);

	for (int i = 0; i < d->rank; i++)
		n *= (size_t)loaded(d, i);
	return n;
}

long long ap_tmap_load(const ap_tmap_desc *d, const void *global, const int32_t *coords, void *dst,
		       size_t dst_bytes, char *why, size_t cap)
{
	size_t es, bytes, need;
	unsigned span, align;
	uint64_t n[AP_TMAP_MAX_RANK] = { 1, 1, 1, 1, 1 }, idx[AP_TMAP_MAX_RANK] = { 0 };
	uint8_t fill[8];
	const uint8_t *g = global;
	uint8_t *s = dst;

	if (ap_tmap_check(d, global, why, cap))
		return -1;
	if (d->interleave != AP_TMAP_INTERLEAVE_NONE)
		return refuse(why, cap, "interleaved tensor maps are not emulated on the host");
	es = ap_tmap_elem_bytes(d->dtype);
	bytes = ap_tmap_box_bytes(d);
	span = ap_tmap_swizzle_span(d->swizzle);
	align = span ? 8 * span : 128;
	/* a swizzle moves chunks within their 128-byte stretch: the last
	 * stretch is written whole */
	need = span ? (bytes + 127) / 128 * 128 : bytes;
	if (!dst || need > dst_bytes)
		return refuse(why, cap, "the box's %zu bytes (%zu swizzled) do not fit the destination's %zu",
			      bytes, need, dst_bytes);
	if ((uintptr_t)dst % align)
		return refuse(why, cap, "destination %p: aligned to %u bytes", dst, align);
	/* the fill: zero, or the all-ones quiet NaN of the element's width */
	memset(fill, 0, sizeof(fill));
	if (d->oob == AP_TMAP_OOB_NAN) {
		memset(fill, 0xff, es);
		fill[es - 1] = 0x7f;   /* little endian: the sign bit cleared */
	}
	for (int i = 0; i < d->rank; i++)
		n[i] = loaded(d, i);
	for (size_t e = 0; e < bytes / es; e++) {
		size_t o = e * es;
		bool inside = true;
		uint64_t off = 0;

		/* idx: the element's index in the loaded box, dimension 0 fastest */
		for (int i = 0; i < d->rank; i++) {
			uint64_t step = i == 0 ? 1 : d->estrides[i];
			int64_t c = (int64_t)coords[i] + (int64_t)(idx[i] * step);

			if (c < 0 || (uint64_t)c >= d->dims[i])
				inside = false;
			else
				off += i == 0 ? (uint64_t)c * es : (uint64_t)c * d->strides[i - 1];
		}
		if (span)
			o ^= ((o >> 7) & (span / 16 - 1)) << 4;
		memcpy(s + o, inside ? g + off : fill, es);
		for (int i = 0; i < d->rank && ++idx[i] == n[i]; i++)
			idx[i] = 0;
	}
	return (long long)bytes;
}
