/* half.c -- float32 <-> float16 (IEEE 754 binary16) and float32 <->
 * bfloat16 conversions, bit-exact, by integer bit manipulation (no
 * _Float16, no FPU rounding mode), for everything that holds 16-bit float
 * data: the importer, constant folding, the lowering's constants, the
 * client's comparisons.  The kernel IR's host printer emits the same
 * functions as C text (server/kir/half.c), checked against these.
 *
 * binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits; largest finite
 * 65504, smallest normal 2^-14, smallest subnormal 2^-24.  float32 -> f16
 * rounds to nearest, ties to even: a float32 of at least 65520 (halfway
 * between 65504 and 2^16) becomes infinity, one of at most 2^-25 (half the
 * smallest subnormal, a tie that goes to the even 0) a signed zero.  NaN
 * stays a quiet NaN with the top fraction bits kept.  bfloat16 is the top
 * half of a float32: rounding adds 0x7fff plus the kept LSB (ties to even),
 * which carries into the exponent and overflows to infinity as it should;
 * NaN is kept quiet by setting the top fraction bit.
 */
#include "graph.h"

#include <string.h>

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float ap_f16_to_f32(uint16_t h)
{
	uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;

	if (e == 0x1fu) {
		u = 0x7f800000u | (m << 13);            /* infinity, NaN (payload kept) */
	} else if (e) {
		u = ((e + 112u) << 23) | (m << 13);     /* rebias 15 -> 127 */
	} else if (m) {
		e = 113u;                               /* subnormal m * 2^-24: normalise */
		while (!(m & 0x400u)) {
			m <<= 1;
			e--;
		}
		u = (e << 23) | ((m & 0x3ffu) << 13);
	} else {
		u = 0;
	}
	return bits_f32(u | (uint32_t)(h & 0x8000u) << 16);
}

uint16_t ap_f32_to_f16(float f)
{
	uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, x = u & 0x7fffffffu;
	uint32_t m, shift, rem, half;

	if (x > 0x7f800000u)                            /* NaN: quiet, top payload bits */
		return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
	if (x >= 0x477ff000u)                           /* >= 65520: infinity */
		return (uint16_t)(sign | 0x7c00u);
	if (x >= 0x38800000u) {                         /* normal: rebias, round to even */
		x -= 0x38000000u;
		return (uint16_t)(sign | ((x + 0xfffu + ((x >> 13) & 1u)) >> 13));
	}
	if (x <= 0x33000000u)                           /* <= 2^-25: signed zero */
		return (uint16_t)sign;
	shift = 126u - (x >> 23);                       /* subnormal m * 2^-24, shift 14..24 */
	m = (x & 0x7fffffu) | 0x800000u;
	rem = m & ((1u << shift) - 1u);
	half = 1u << (shift - 1u);
	m >>= shift;
	if (rem > half || (rem == half && (m & 1u)))
		m++;
	return (uint16_t)(sign | m);
}

float ap_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t ap_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)            /* NaN: stays a quiet NaN */
		return (uint16_t)((u >> 16) | 0x40u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

bool ap_dtype_is_floating(ap_dtype dt)
{
	return dt == AP_DT_F32 || dt == AP_DT_F64 || dt == AP_DT_F16 || dt == AP_DT_BF16;
}

double ap_elem_get(const void *data, ap_dtype dt, int64_t i)
{
	const unsigned char *p = data;

	switch (dt) {
	case AP_DT_F32: { float v; memcpy(&v, p + i * 4, 4); return v; }
	case AP_DT_F64: { double v; memcpy(&v, p + i * 8, 8); return v; }
	case AP_DT_F16: { uint16_t h; memcpy(&h, p + i * 2, 2); return ap_f16_to_f32(h); }
	case AP_DT_BF16: { uint16_t h; memcpy(&h, p + i * 2, 2); return ap_bf16_to_f32(h); }
	case AP_DT_I64: { int64_t v; memcpy(&v, p + i * 8, 8); return (double)v; }
	case AP_DT_I32: { int32_t v; memcpy(&v, p + i * 4, 4); return v; }
	case AP_DT_I8: return ((const int8_t *)data)[i];
	case AP_DT_U8: return p[i];
	case AP_DT_BOOL: return p[i] != 0;
	default: return 0;
	}
}

void ap_elem_set(void *data, ap_dtype dt, int64_t i, double v)
{
	unsigned char *p = data;

	switch (dt) {
	case AP_DT_F32: { float f = (float)v; memcpy(p + i * 4, &f, 4); break; }
	case AP_DT_F64: memcpy(p + i * 8, &v, 8); break;
	case AP_DT_F16: { uint16_t h = ap_f32_to_f16((float)v); memcpy(p + i * 2, &h, 2); break; }
	case AP_DT_BF16: { uint16_t h = ap_f32_to_bf16((float)v); memcpy(p + i * 2, &h, 2); break; }
	case AP_DT_I64: { int64_t x = ap_f64_to_i64(v); memcpy(p + i * 8, &x, 8); break; }
	case AP_DT_I32: {
		int64_t x = ap_f64_to_i64(v);
		int32_t y = x > INT32_MAX ? INT32_MAX : x < INT32_MIN ? INT32_MIN : (int32_t)x;

		memcpy(p + i * 4, &y, 4);
		break;
	}
	case AP_DT_I8: { int64_t x = ap_f64_to_i64(v); ((int8_t *)data)[i] = (int8_t)(x > 127 ? 127 : x < -128 ? -128 : x); break; }
	case AP_DT_U8: { int64_t x = ap_f64_to_i64(v); p[i] = (unsigned char)(x > 255 ? 255 : x < 0 ? 0 : x); break; }
	case AP_DT_BOOL: p[i] = v != 0; break;
	default: break;
	}
}
