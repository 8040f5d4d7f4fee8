/* kir_internal.h -- what the files of server/kir/ share and nobody else
 * needs: the arena allocator, raw node constructors, and the host C text
 * of the float16 / bfloat16 conversions. */
#ifndef AP_KIR_INTERNAL_H
#define AP_KIR_INTERNAL_H

#include "kir.h"

/* n zeroed bytes from k's arena (16-byte aligned); NULL (and k->failed)
 * on ENOMEM or when k already failed. */
void *ap__kir_alloc(ap_kir_kernel *k, size_t n);
char *ap__kir_strdup(ap_kir_kernel *k, const char *s);
/* A node of `kind` and `type`, every other field zero. */
ap_kir_expr *ap__kir_expr_new(ap_kir_kernel *k, ap_kir_expr_kind kind, ap_dtype type);
/* A statement of `kind` appended to b, every other field zero. */
ap_kir_stmt *ap__kir_stmt_append(ap_kir_kernel *k, ap_kir_block *b, ap_kir_stmt_kind kind);

/* The type of the A and B fragments of an ap_kir_mma_kind. */
ap_dtype ap__kir_mma_in_type(int kind);
/* True for AP_DT_F16 and AP_DT_BF16. */
bool ap__kir_is_half(ap_dtype t);
/* The bit pattern of a 16-bit float value (already rounded to the type). */
uint16_t ap__kir_half_bits(ap_dtype t, double v);

/* Host C text of ap_f16_to_f32 / ap_f32_to_f16 and of ap_bf16_to_f32 /
 * ap_f32_to_bf16 (static inline, C11, no _Float16): half.c keeps them
 * next to the C functions they copy. */
extern const char ap__kir_host_f16_src[];
extern const char ap__kir_host_bf16_src[];
/* Host C text of ap_tf32f (AP_KIR_TF32) and ap_tf32_trunc (how the tensor
 * core reads a TF32 operand: the 13 low mantissa bits dropped). */
extern const char ap__kir_host_tf32_src[];
/* Host C text of ap_ex2f (AP_KIR_EX2_APPROX): exp2f with ex2.approx.ftz's
 * flushes -- a subnormal input is 0 (2^0 = 1), a subnormal result 0. */
extern const char ap__kir_host_ex2_src[];
/* Host C text of ap_wg_desc / ap_wg_addr: the wgmma matrix descriptor's
 * encoding and its decoding into element addresses (half.c). */
extern const char ap__kir_host_wgmma_src[];
/* Host C text of ap_tmap_host_load: common/tmap.c's ap_tmap_load (the
 * TMA tile load) over a compiled-in description, optionally telling the
 * checker of each element read (half.c; check_kir compares the two). */
extern const char ap__kir_host_tmap_src[];
extern const char ap__kir_host_mbar_src[];

#endif
