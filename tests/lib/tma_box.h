/* tma_box.h -- a hand-built TMA kernel shared by the tests that run it:
 * check_hostcheck (the host, plain and checked) and check_runtime (a GPU,
 * through the runtime and the driver's tensor maps).
 *
 * The kernel: 4 blocks of 128 threads, each loading one 64 x 16 box of a
 * 104 x 70 float16 tensor g with the 128-byte swizzle at coordinates
 * across the tensor's edges (TMA_BOX_X0(b), TMA_BOX_Y0(b): -8 or 48 along
 * x, -3 or 57 along y), waiting on its mbarrier (unless `wait` is false,
 * the bug), and copying the shared box into out[b * 1024 ..] as it lies
 * (swizzled): what common/tmap.c's ap_tmap_load gives for the same
 * coordinates.
 */
#ifndef AP_TESTS_TMA_BOX_H
#define AP_TESTS_TMA_BOX_H

#include <check.h>
#include <stdbool.h>

#include "common/tmap.h"
#include "server/kir/kir.h"

#define TMA_BOX_X0(b) (((b) % 2) * 56 - 8)
#define TMA_BOX_Y0(b) (((b) / 2) * 60 - 3)
#define TMA_BOX_G_ELEMS (104 * 70)
#define TMA_BOX_OUT_ELEMS (4 * 1024)

static inline ap_kir_kernel *tma_box_kernel(bool wait)
{
	ap_kir_kernel *k = ap_kir_kernel_new("tma_box");
	ap_kir_array *g, *out, *box, *bars;
	ap_kir_expr *tid, *blk, *zero, *co[2];
	ap_kir_var *j;
	ap_kir_stmt *s;
	ap_tmap_desc d = { .dtype = AP_TMAP_FLOAT16, .rank = 2, .dims = { 104, 70 }, .strides = { 208 },
			   .box = { 64, 16 }, .estrides = { 1, 1 }, .swizzle = AP_TMAP_SWIZZLE_128B };

	k->grid[0] = 4;
	k->block[0] = 128;
	g = ap_kir_param(k, "g", AP_DT_F16, false, -1);
	out = ap_kir_param(k, "out", AP_DT_F16, true, -1);
	g->size = 104 * 70;
	out->size = 4 * 1024;
	ck_assert_int_eq(ap_kir_tensor_map(k, g, &d), 0);
	box = ap_kir_shared_dyn_aligned(k, "box", AP_DT_F16, 1024, 1024);
	bars = ap_kir_mbarriers(k, "bars", 1);
	tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	blk = ap_kir_index_of(k, AP_KIR_BLOCK_X);
	zero = ap_kir_idx(k, 0);
	co[0] = ap_kir_addi(k, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, blk, ap_kir_idx(k, 2)), 56), -8);
	co[1] = ap_kir_addi(k, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, blk, ap_kir_idx(k, 2)), 60), -3);
	s = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_EQ, tid, zero));
	ap_kir_mbar_init(k, &s->body, bars, zero, ap_kir_int(k, AP_DT_I32, 1));
	ap_kir_fence_proxy_async(k, &s->body);
	ap_kir_barrier(k, &k->body);
	s = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_EQ, tid, zero));
	ap_kir_mbar_arrive(k, &s->body, bars, zero, ap_kir_int(k, AP_DT_I32, 2048));
	ck_assert_ptr_nonnull(ap_kir_tma_load(k, &s->body, box, zero, g, co, bars, zero));
	if (wait)
		ap_kir_mbar_wait(k, &k->body, bars, zero, zero);
	j = ap_kir_var_new(k, zero->type, "j");
	s = ap_kir_for(k, &k->body, j, ap_kir_idx(k, 0), ap_kir_idx(k, 8), 1);
	ap_kir_store(k, &s->body, out, ap_kir_add(k, ap_kir_muli(k, blk, 1024), ap_kir_add(k, ap_kir_muli(k, tid, 8),
		     ap_kir_ref(k, j))), ap_kir_load(k, box, ap_kir_add(k, ap_kir_muli(k, tid, 8), ap_kir_ref(k, j))));
	ck_assert_msg(!ap_kir_failed(k), "tma_box failed to build");
	return k;
}

#endif
