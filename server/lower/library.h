/* library.h -- whether a library can compute a GEMM micro-graph, and its
 * call (issue 25): today cuBLASLt's matmul, as apollo.LibraryCall
 * describes it (kir.h's ap_kir_library).  The GEMM emitter (gemm.c)
 * describes its analysed product here, offers a knob "lib" (0, 1) where
 * the library can express it on a CUDA target, prices lib=1 with
 * ap__library_traffic and attaches the call to the kernel it builds for
 * lib=1 (the same Apollo kernel as lib=0 under the other knobs: the host
 * target and a runtime without cuBLASLt run it).
 */
#ifndef AP_LOWER_LIBRARY_H
#define AP_LOWER_LIBRARY_H

#include "emitters.h"

/* Numbered as apollo.LibraryOp and apollo.LibraryEpilogue (whose
 * numbers are cuBLASLt's cublasLtEpilogue_t). */
enum {
	AP_LIB_MATMUL = 1,
	AP_LIB_EPI_NONE = 1,
	AP_LIB_EPI_RELU = 2,
	AP_LIB_EPI_BIAS = 4,
	AP_LIB_EPI_BIAS_RELU = 6,
	AP_LIB_EPI_GELU = 32,        /* the tanh approximation */
	AP_LIB_EPI_BIAS_GELU = 36,
};

/* One operand of the product as the GEMM emitter analysed it: element
 * (outer, k) of batch b at s_base + outer * s_outer + k * s_k + b *
 * s_batch of tensor `leaf` (a buffer of the micro-graph; outer is M for A,
 * N for B).  plain: read through views and transposes only (no prologue,
 * no gather); batch_ok: its batch dims collapse to the one stride s_batch
 * (0: broadcast). */
typedef struct ap_lib_operand {
	bool plain, batch_ok;
	int leaf;
	int64_t s_base, s_outer, s_k, s_batch;
} ap_lib_operand;

/* The product: y (the MatMul's output in m->g) = A (batch x M x K) times
 * B (batch x K x N), elements of in_t. */
typedef struct ap_lib_gemm {
	int node, y;
	ap_dtype in_t;
	int64_t batch, M, N, K;
	ap_lib_operand a, b;
} ap_lib_gemm;

/* Whether cuBLASLt can compute micro-graph m (whose product is `gm`) on
 * target t, and its call: a CUDA target (not the host); A and B plain,
 * unit-stride along one of their dims, from offset 0, batch strides
 * single; float16, bfloat16 or float (float with TF32 where the request
 * allows it); the epilogue D = act(alpha * (A B) + beta * C + bias) as
 * cuBLASLt computes it: from y, a Mul by a constant scalar (alpha), Adds
 * of a bias vector of N elements and of a residual C of y's shape (buffers
 * of y's type; beta = 1), then an activation the nodes compute from that
 * value and scalar constants alone that is the identity, ReLU or GELU's
 * tanh approximation (read as a function and compared at every 1/16 from -8 to 8 within
 * the rounding of its constants; erf's GELU is refused), its result the
 * micro-graph's only output and nothing else computed.  The call asks for
 * cuBLAS's recommended workspace (32 MiB from sm_90, 4 MiB before), placed
 * by the plan.  1 with *out filled (params -1: the caller binds them), 0
 * with the reason in why, AP_ENOMEM. */
int ap__library_express(const ap_mgraph *m, const ap_target_info *t, const ap_lib_gemm *gm,
			ap_kir_library *out, char *why, size_t cap);

/* What the cost model should expect of the call (ap_cost_schedule_us
 * reads it): the operands (the residual C too when beta != 0) read once
 * and D written once from DRAM, A re-read per 256-column and B per
 * 128-row block tile from L2 (cuBLASLt's usual 128 x 256 tiles on
 * sm_80/sm_90), one 384-thread block of 168
 * registers a thread per SM in waves over those tiles, and the arithmetic at
 * AP_LIBRARY_EFFICIENCY of the target's peak (tensor cores for 16-bit
 * types and TF32, the FP32 units otherwise). */
void ap__library_traffic(const ap_kir_library *lib, const ap_target_info *t, ap_traffic *out);

/* The fraction of the tensor-core (or FP32) peak the library's matmul
 * reaches on large products: cuBLAS at about 790 of the H100 SXM's 989
 * dense bfloat16 TFLOP/s (NVIDIA's published cuBLAS 12 figures, the
 * figure issue 25 quotes; the A100's 312 gives about 0.8 as well). */
#define AP_LIBRARY_EFFICIENCY 0.8

/* Binds lib's a, b, c, d and bias to the params of kernel k that hold
 * m->g tensors a_t, b_t, d_t, bias_t (-1: none) and c_t (-1: none).
 * false when one of them has no param (a constant baked into the kernel):
 * then no call. */
bool ap__library_bind(ap_kir_library *lib, const ap_kir_kernel *k, int a_t, int b_t, int d_t,
		      int bias_t, int c_t);

/* The tensors of m->g the call reads and writes (after ap__library_express
 * accepted m): D, the bias and the residual C (-1: none). */
void ap__library_tensors(const ap_mgraph *m, const ap_lib_gemm *gm, int *d_t, int *bias_t,
			 int *c_t);

#endif
