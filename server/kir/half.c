/* half.c -- float32 <-> float16 (IEEE 754 binary16) and float32 <->
 * bfloat16 conversions, bit-exact, by integer bit manipulation (no
 * _Float16, no FPU rounding mode).
 *
 * Each conversion exists twice: as C functions used while building the IR
 * (constants rounded to the type, constant data) and as the text the host
 * printer puts into a kernel's prelude.  The two copies sit next to each
 * other below and must stay identical; check_kir compares them on every
 * 16-bit pattern and on a sweep of float32 patterns.
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
#include "kir_internal.h"

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

float ap_kir_f16_to_f32(uint16_t h)
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

uint16_t ap_kir_f32_to_f16(float f)
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

float ap_kir_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t ap_kir_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)            /* NaN: stays a quiet NaN */
		return (uint16_t)((u >> 16) | 0x40u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The same four functions as host C text (unsigned int is 32 bits on every
 * host Apollo targets; a union reinterprets, as C11 allows). */
const char ap__kir_host_f16_src[] =
	"static inline float ap_f16_to_f32(unsigned short h)\n"
	"{\n"
	"\tunion { unsigned int u; float f; } c;\n"
	"\tunsigned int e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n"
	"\n"
	"\tif (e == 0x1fu) {\n"
	"\t\tc.u = 0x7f800000u | (m << 13);\n"
	"\t} else if (e) {\n"
	"\t\tc.u = ((e + 112u) << 23) | (m << 13);\n"
	"\t} else if (m) {\n"
	"\t\te = 113u;\n"
	"\t\twhile (!(m & 0x400u)) {\n"
	"\t\t\tm <<= 1;\n"
	"\t\t\te--;\n"
	"\t\t}\n"
	"\t\tc.u = (e << 23) | ((m & 0x3ffu) << 13);\n"
	"\t} else {\n"
	"\t\tc.u = 0;\n"
	"\t}\n"
	"\tc.u |= (unsigned int)(h & 0x8000u) << 16;\n"
	"\treturn c.f;\n"
	"}\n"
	"static inline unsigned short ap_f32_to_f16(float f)\n"
	"{\n"
	"\tunion { unsigned int u; float f; } c;\n"
	"\tunsigned int sign, x, m, shift, rem, half;\n"
	"\n"
	"\tc.f = f;\n"
	"\tsign = (c.u >> 16) & 0x8000u;\n"
	"\tx = c.u & 0x7fffffffu;\n"
	"\tif (x > 0x7f800000u)\n"
	"\t\treturn (unsigned short)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));\n"
	"\tif (x >= 0x477ff000u)\n"
	"\t\treturn (unsigned short)(sign | 0x7c00u);\n"
	"\tif (x >= 0x38800000u) {\n"
	"\t\tx -= 0x38000000u;\n"
	"\t\treturn (unsigned short)(sign | ((x + 0xfffu + ((x >> 13) & 1u)) >> 13));\n"
	"\t}\n"
	"\tif (x <= 0x33000000u)\n"
	"\t\treturn (unsigned short)sign;\n"
	"\tshift = 126u - (x >> 23);\n"
	"\tm = (x & 0x7fffffu) | 0x800000u;\n"
	"\trem = m & ((1u << shift) - 1u);\n"
	"\thalf = 1u << (shift - 1u);\n"
	"\tm >>= shift;\n"
	"\tif (rem > half || (rem == half && (m & 1u)))\n"
	"\t\tm++;\n"
	"\treturn (unsigned short)(sign | m);\n"
	"}\n";

const char ap__kir_host_bf16_src[] =
	"static inline float ap_bf16_to_f32(unsigned short h)\n"
	"{\n"
	"\tunion { unsigned int u; float f; } c;\n"
	"\n"
	"\tc.u = (unsigned int)h << 16;\n"
	"\treturn c.f;\n"
	"}\n"
	"static inline unsigned short ap_f32_to_bf16(float f)\n"
	"{\n"
	"\tunion { unsigned int u; float f; } c;\n"
	"\n"
	"\tc.f = f;\n"
	"\tif ((c.u & 0x7fffffffu) > 0x7f800000u)\n"
	"\t\treturn (unsigned short)((c.u >> 16) | 0x40u);\n"
	"\treturn (unsigned short)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);\n"
	"}\n";

uint32_t ap_kir_tf32_bits(uint32_t u)
{
	if ((u & 0x7f800000u) == 0x7f800000u)
		return (u & 0x007fffffu) ? 0x7fffffffu : u;   /* NaN canonical, infinities kept */
	return (u + 0x1000u) & 0xffffe000u;                   /* half a TF32 ulp, then truncate */
}

const char ap__kir_host_tf32_src[] =
	"static inline float ap_tf32f(float f)\n"
	"{\n"
	"\tunion { unsigned int u; float f; } c;\n"
	"\n"
	"\tc.f = f;\n"
	"\tif ((c.u & 0x7f800000u) == 0x7f800000u)\n"
	"\t\tc.u = (c.u & 0x007fffffu) ? 0x7fffffffu : c.u;\n"
	"\telse\n"
	"\t\tc.u = (c.u + 0x1000u) & 0xffffe000u;\n"
	"\treturn c.f;\n"
	"}\n"
	"static inline float ap_tf32_trunc(float f)\n"
	"{\n"
	"\tunion { unsigned int u; float f; } c;\n"
	"\n"
	"\tc.f = f;\n"
	"\tif ((c.u & 0x7f800000u) != 0x7f800000u)\n"
	"\t\tc.u &= 0xffffe000u;\n"
	"\treturn c.f;\n"
	"}\n";

bool ap_kir_is_float_type(ap_dtype t)
{
	return t == AP_DT_F32 || t == AP_DT_F64 || t == AP_DT_F16 || t == AP_DT_BF16;
}

bool ap__kir_is_half(ap_dtype t)
{
	return t == AP_DT_F16 || t == AP_DT_BF16;
}

uint16_t ap__kir_half_bits(ap_dtype t, double v)
{
	return t == AP_DT_BF16 ? ap_kir_f32_to_bf16((float)v) : ap_kir_f32_to_f16((float)v);
}
