/* half.c -- float32 <-> float16 (IEEE 754 binary16) and float32 <->
 * bfloat16 conversions, bit-exact, by integer bit manipulation (no
 * _Float16, no FPU rounding mode).
 *
 * Each conversion exists twice: as C functions (common/half.c, used while
 * building the IR: constants rounded to the type, constant data) and as
 * the text the host printer puts into a kernel's prelude (below).  The
 * two must stay identical; check_kir compares them on every 16-bit pattern
 * and on a sweep of float32 patterns.
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

float ap_kir_f16_to_f32(uint16_t h)
{
	return ap_f16_to_f32(h);
}

uint16_t ap_kir_f32_to_f16(float f)
{
	return ap_f32_to_f16(f);
}

float ap_kir_bf16_to_f32(uint16_t h)
{
	return ap_bf16_to_f32(h);
}

uint16_t ap_kir_f32_to_bf16(float f)
{
	return ap_f32_to_bf16(f);
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

const char ap__kir_host_ex2_src[] =
	"static inline float ap_ex2f(float x)\n"
	"{\n"
	"\tfloat r;\n"
	"\n"
	"\tif (fabsf(x) < 0x1p-126f)\n"
	"\t\treturn 1.0f;\n"
	"\tr = exp2f(x);\n"
	"\treturn r < 0x1p-126f ? 0.0f : r;\n"
	"}\n";

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

/* The wgmma matrix descriptor (PTX ISA, "Matrix Descriptor Format"):
 * bits 0-13 the start address, 16-29 the leading dimension byte offset,
 * 32-45 the stride dimension byte offset, each encoded (x & 0x3FFFF) >> 4;
 * bits 49-51 the base offset (0: Apollo's swizzled arrays start on the
 * pattern's repeat); bits 62-63 the swizzling mode (0 none, 1 128-byte,
 * 2 64-byte, 3 32-byte; ap_wg_desc takes the swizzle in bytes).
 * ap_wg_addr decodes one and gives the byte address of element (r, k) --
 * r along M (A) or N (B), k along K -- by the ISA's canonical layouts
 * (kir.h, ap_kir_wg_layout), T = 16 / es elements in 16 bytes, W the
 * swizzle's bytes and X = W / 16:
 *   none, K-major  ((8,m),(T,2k)):((1T,SBO),(1,LBO)):
 *     (r % 8) 16 + (r / 8) SBO + (k % T) es + (k / T) LBO;
 *   none, MN-major ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)):
 *     (r % T) es + (r / T) SBO + (k % 8) 16 + (k / 8) LBO;
 *   W, K-major     ((8,m),(T,2k)):((XT,SBO),(1,T)):
 *     (r % 8) W + (r / 8) SBO + (k % T) es + (k / T) 16;
 *   W, MN-major    ((T,X,m),(8,k)):((1,T,LBO),(XT,SBO)):
 *     (r % T) es + (r / T % X) 16 + (r / (X T)) LBO + (k % 8) W + (k / 8) SBO;
 * the start added, then swizzled: a ^ (((a >> 7) & (X - 1)) << 4).  On
 * the host the start address is the byte offset into the operand's
 * shared array, which the device's array base (aligned to the repeat)
 * leaves unchanged in the swizzle's bits. */
const char ap__kir_host_wgmma_src[] =
	"static inline unsigned long long ap_wg_desc(unsigned long long a, unsigned lbo, unsigned sbo, "
	"unsigned sw)\n"
	"{\n"
	"\treturn ((a & 0x3FFFFull) >> 4) | ((unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16) |\n"
	"\t       ((unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32) |\n"
	"\t       ((unsigned long long)(sw == 128u ? 1u : sw == 64u ? 2u : sw == 32u ? 3u : 0u) << 62);\n"
	"}\n"
	"static inline unsigned long long ap_wg_addr(unsigned long long d, int mn_major, unsigned r, "
	"unsigned k, unsigned es)\n"
	"{\n"
	"\tconst unsigned long long start = (d & 0x3FFFull) << 4, lbo = ((d >> 16) & 0x3FFFull) << 4,\n"
	"\t\t\t\t sbo = ((d >> 32) & 0x3FFFull) << 4;\n"
	"\tconst unsigned T = 16u / es, mode = (unsigned)(d >> 62);\n"
	"\tconst unsigned W = mode == 1u ? 128u : mode == 2u ? 64u : mode == 3u ? 32u : 0u, X = W / 16u;\n"
	"\tunsigned long long a;\n"
	"\n"
	"\tif (!W && !mn_major)\n"
	"\t\treturn start + (r % 8u) * 16u + (r / 8u) * sbo + (k % T) * es + (k / T) * lbo;\n"
	"\tif (!W)\n"
	"\t\treturn start + (r % T) * es + (r / T) * sbo + (k % 8u) * 16u + (k / 8u) * lbo;\n"
	"\tif (!mn_major)\n"
	"\t\ta = start + (r % 8u) * W + (r / 8u) * sbo + (k % T) * es + (k / T) * 16u;\n"
	"\telse\n"
	"\t\ta = start + (r % T) * es + (r / T % X) * 16u + (r / (X * T)) * lbo + (k % 8u) * W + (k / 8u) * sbo;\n"
	"\treturn a ^ (((a >> 7) & (X - 1u)) << 4);\n"
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

const char ap__kir_host_tmap_src[] =
	"typedef struct ap_tmap_h {\n"
	"\tunsigned es; int rank; unsigned span; int nan;\n"
	"\tunsigned long long dims[5], strides[4]; unsigned box[5], estr[5];\n"
	"} ap_tmap_h;\n"
	"static void ap_tmap_host_load(const ap_tmap_h *d, const void *g, const long long *co, void *dst,\n"
	"\t\t\t      const void *(*rd)(void *, const void *, unsigned, unsigned, unsigned), void *ck,\n"
	"\t\t\t      unsigned t)\n"
	"{\n"
	"\tunsigned long long n[5] = { 1, 1, 1, 1, 1 }, idx[5] = { 0 }, total = 1;\n"
	"\tunsigned char fill[8] = { 0 };\n"
	"\n"
	"\tif (d->nan) {\n"
	"\t\tmemset(fill, 0xff, d->es);\n"
	"\t\tfill[d->es - 1] = 0x7f;\n"
	"\t}\n"
	"\tfor (int i = 0; i < d->rank; i++) {\n"
	"\t\tn[i] = i == 0 ? d->box[0] : (d->box[i] + d->estr[i] - 1) / d->estr[i];\n"
	"\t\ttotal *= n[i];\n"
	"\t}\n"
	"\tfor (unsigned long long e = 0; e < total; e++) {\n"
	"\t\tunsigned long long o = e * d->es, off = 0;\n"
	"\t\tint in = 1;\n"
	"\n"
	"\t\tfor (int i = 0; i < d->rank; i++) {\n"
	"\t\t\tlong long c = co[i] + (long long)(idx[i] * (i == 0 ? 1u : d->estr[i]));\n"
	"\n"
	"\t\t\tif (c < 0 || (unsigned long long)c >= d->dims[i])\n"
	"\t\t\t\tin = 0;\n"
	"\t\t\telse\n"
	"\t\t\t\toff += i == 0 ? (unsigned long long)c * d->es : (unsigned long long)c * d->strides[i - 1];\n"
	"\t\t}\n"
	"\t\tif (d->span)\n"
	"\t\t\to ^= ((o >> 7) & (d->span / 16 - 1)) << 4;\n"
	"\t\tif (in && rd)\n"
	"\t\t\trd(ck, (const char *)g + off, d->es, t, d->es);\n"
	"\t\tmemcpy((char *)dst + o, in ? (const char *)g + off : (const char *)fill, d->es);\n"
	"\t\tfor (int i = 0; i < d->rank && ++idx[i] == n[i]; i++)\n"
	"\t\t\tidx[i] = 0;\n"
	"\t}\n"
	"}\n";

/* The host's plain mbarrier (a kernel with ROLES, print.c): the phases
 * completed, the arrivals still expected in the current one and per
 * phase, the tx-count (PTX ISA, "mbarrier": a phase completes when both
 * its pending arrivals and its tx-count are zero; try_wait.parity P
 * succeeds once the phase of parity P has completed, i.e. the current
 * phase's parity is not P).  The host's copies land at issue
 * (ap_mbh_land), so a copy issued before its expect_tx leaves the
 * tx-count negative until the arrive -- as the ISA allows.  ap_host_fault
 * is the exported flag a deadlock sets (program.h). */
const char ap__kir_host_mbar_src[] =
	"typedef struct ap_mbh { unsigned long long phase; long long pending, expected, tx; } ap_mbh;\n"
	"int ap_host_fault;\n"
	"static void ap_mbh_test(ap_mbh *m)\n"
	"{\n"
	"\tif (m->pending <= 0 && m->tx == 0) {\n"
	"\t\tm->phase++;\n"
	"\t\tm->pending = m->expected;\n"
	"\t}\n"
	"}\n"
	"static void ap_mbh_init(ap_mbh *m, long long n) { m->phase = 0; m->pending = m->expected = n; m->tx = 0; }\n"
	"static void ap_mbh_arrive(ap_mbh *m, long long tx) { m->tx += tx; m->pending--; ap_mbh_test(m); }\n"
	"static void ap_mbh_land(ap_mbh *m, long long bytes) { m->tx -= bytes; ap_mbh_test(m); }\n"
	"static int ap_mbh_ready(const ap_mbh *m, unsigned parity) { return (unsigned)(m->phase & 1u) != (parity & 1u); }\n";
