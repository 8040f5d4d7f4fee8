/* kir.h -- Apollo's kernel IR: one small structured IR for every kernel,
 * with two printers (CUDA C for NVRTC, plain C11 for the host).
 *
 * A kernel is
 *   - arrays: global parameters (buffers bound by the launch plan), static
 *     and dynamic shared memory, per-thread register arrays, and constant
 *     data baked into the source (small CONST tensors);
 *   - a fixed launch shape: grid[3] blocks of block[3] threads, plus the
 *     dynamic shared memory it needs (bytes);
 *   - a body: a list of statements every thread runs (SPMD, as in CUDA).
 *
 * Statements: `for` (lower bound, exclusive upper bound, positive constant
 * step, an optional unroll hint; bounds are expressions of enclosing loop
 * variables, block and thread indices and constants), `if`/`else`, `let`
 * (declares a scalar register, optionally with a value), `assign` (to a
 * register), `store` (to an array element), `barrier` (__syncthreads),
 * warp shuffles (`shfl`, CUDA's __shfl_*_sync), the warp and warpgroup
 * matrix statements (ldmatrix, mma.sync; wgmma with its fence, commit and
 * wait, and the async-proxy fence: sm_90a), vector loads and stores of
 * 2, 4 or 8 consecutive elements (`vload`, `vstore`: one 4, 8 or 16-byte
 * access on the GPU) and comments.  This is the shape of isl's AST (for /
 * if / block / user nodes), so a polyhedral schedule can later be printed
 * into it one node for one statement.
 *
 * Expressions are trees of typed nodes: integer and floating constants,
 * variables, block/thread indices, unary and binary operators (C's, plus
 * min/max, bitwise operators, shifts and isl's floor division), select,
 * math calls, casts and loads.  Scalar types are ap_dtype values (bool is
 * one byte in memory, 0 or 1).  Builders fold integer constants (x+0, x*1,
 * 2*3) so that index arithmetic stays readable.
 *
 * float16 and bfloat16 (AP_DT_F16, AP_DT_BF16; IEEE 754 binary16 and
 * Google's bfloat16) are storage types: every operation on them (arithmetic,
 * math call, comparison) is computed in float32 and its result rounded to
 * the type, round to nearest even; casts to and from every other type go
 * through float32 (so f64 -> f16 rounds twice, f64 -> f32 -> f16).  For + -
 * * / this is bit-exact with the GPU's native half arithmetic, as float32
 * has more than twice the precision (CUDA: __float2half_rn(__half2float(a)
 * OP __half2float(b))).  Constants of these types hold the value rounded to
 * the type; in memory (arrays, constant data) they are the 16-bit patterns.
 *
 * Memory: every node of a kernel lives in the kernel's arena and is freed
 * with it.  Builders never fail loudly: an allocation failure returns NULL,
 * every builder given a NULL operand returns NULL, statement builders
 * ignore NULL, and the kernel remembers the failure (ap_kir_failed), which
 * the caller checks once at the end -- isl's convention of propagating
 * NULL.  A statement builder given arguments it cannot accept (a step <= 0,
 * a bad shuffle or vector width) marks the kernel failed too.
 *
 * The host printer follows the ABI of server/plan/program.h: the blocks in
 * [block_begin, block_end) become a loop, threads become a loop, and each
 * collective -- a barrier or a shuffle -- splits the thread loop into
 * phases (a shuffle is two loops: every thread's value, then every
 * thread's result by CUDA's lane rules).  Statements that contain a
 * collective must be uniform over the threads of a block (loop bounds and
 * conditions may use block indices, but not thread indices or registers
 * that differ between threads), as CUDA itself requires.  Registers
 * declared directly in a statement list that contains a collective live
 * across phases and get one slot per thread.
 *
 * Utilities (visit.c, clone.c, verify.c): a visitor over statements and
 * expressions, deep copy of one kernel's body into another with block /
 * thread indices and arrays substituted (to stitch kernels into one
 * launch), and a verifier of the IR's rules.
 */
#ifndef AP_KIR_H
#define AP_KIR_H

#include "common/tmap.h"
#include "../../common/graph.h"

typedef enum ap_kir_space {
	AP_KIR_GLOBAL = 0,     /* kernel parameter: a buffer in global memory */
	AP_KIR_SHARED = 1,     /* static __shared__ array, one per block */
	AP_KIR_SHARED_DYN = 2, /* slice of the dynamic shared memory */
	AP_KIR_LOCAL = 3,      /* per-thread register array */
	AP_KIR_CONST = 4,      /* constant data baked into the source */
} ap_kir_space;

typedef struct ap_kir_array {
	int id;
	char *name;
	ap_dtype type;
	ap_kir_space space;
	int64_t size;          /* elements (GLOBAL: of its tensor, what the kernel
				  may touch, set by the lowering; 0 = not known) */
	int param;             /* GLOBAL: position in the parameter list; else -1 */
	bool written;          /* GLOBAL: the kernel stores to it */
	int tensor;            /* GLOBAL: graph tensor bound to it (-1 if none) */
	uint64_t offset;       /* SHARED_DYN: byte offset in dynamic shared memory */
	unsigned align;        /* SHARED_DYN: the offset's alignment in bytes (16,
				  or up to 1024 for a swizzled wgmma operand:
				  ap_kir_shared_dyn_aligned) */
	bool mbar;             /* SHARED: an array of mbarriers (ap_kir_mbarriers) */
	ap_tmap_desc *tmap;    /* GLOBAL: also passed as this tiled tensor map
				  (ap_kir_tensor_map; owned by the arena) */
	bool scratch;          /* LOCAL: no value lives across a barrier or other
				  collective (each use is preceded by a store in
				  the same stretch between collectives); the
				  host then keeps it per thread loop, not in
				  per-thread slots */
	void *data;            /* CONST: `size` elements, row-major, owned by the arena */
} ap_kir_array;

typedef struct ap_kir_var {
	int id;
	ap_dtype type;
	char name[24];
} ap_kir_var;

typedef enum ap_kir_expr_kind {
	AP_KIR_E_INT,      /* ival */
	AP_KIR_E_FLOAT,    /* fval */
	AP_KIR_E_VAR,      /* var */
	AP_KIR_E_INDEX,    /* op: an ap_kir_index */
	AP_KIR_E_UNARY,    /* op: an ap_kir_unop; a */
	AP_KIR_E_BINARY,   /* op: an ap_kir_binop; a, b */
	AP_KIR_E_SELECT,   /* a ? b : c */
	AP_KIR_E_CALL,     /* op: an ap_kir_fn; a (, b) */
	AP_KIR_E_CAST,     /* (type)a */
	AP_KIR_E_LOAD,     /* arr[a]; with c (a SHARED / SHARED_DYN array of a
			      cluster kernel): arr[a] in the shared memory of
			      the cluster's block of rank c (distributed
			      shared memory: mapa + ld.shared::cluster) */
} ap_kir_expr_kind;

typedef enum ap_kir_index {
	AP_KIR_BLOCK_X, AP_KIR_BLOCK_Y, AP_KIR_BLOCK_Z,
	AP_KIR_THREAD_X, AP_KIR_THREAD_Y, AP_KIR_THREAD_Z,
	/* kernels with thread-block clusters (cluster > 1; sm_90, PTX ISA
	 * "Cluster of Cooperative Thread Arrays"): the cluster's index along
	 * x (blockIdx.x / cluster) and the block's rank in it (%cluster_ctarank:
	 * blockIdx.x % cluster).  Such kernels use these instead of BLOCK_X,
	 * and the rank only where a thread index could stand (the host runs
	 * a cluster's blocks as one wide block, see ap_kir_kernel.cluster). */
	AP_KIR_CLUSTER_X, AP_KIR_CLUSTER_RANK,
} ap_kir_index;

typedef enum ap_kir_unop {
	AP_KIR_NEG,        /* -a */
	AP_KIR_LNOT,       /* !a (bool result) */
} ap_kir_unop;

typedef enum ap_kir_binop {
	AP_KIR_ADD, AP_KIR_SUB, AP_KIR_MUL, AP_KIR_DIV,
	AP_KIR_REM,        /* C %, integers only */
	AP_KIR_LT, AP_KIR_LE, AP_KIR_GT, AP_KIR_GE, AP_KIR_EQ, AP_KIR_NE,  /* bool */
	AP_KIR_LAND, AP_KIR_LOR,                                           /* bool */
	AP_KIR_MIN, AP_KIR_MAX,  /* integers: a < b ? a : b (no NaN rules) */
	/* integers only, on the type's two's complement bits (lane and tile
	 * arithmetic, isl's AST) */
	AP_KIR_AND, AP_KIR_OR, AP_KIR_XOR,
	AP_KIR_SHL,        /* a << b, 0 <= b < bits of the type; wraps to the type */
	AP_KIR_SHR,        /* a >> b, 0 <= b < bits; arithmetic for signed types */
	AP_KIR_FLOORDIV,   /* floor(a / b), b != 0 of any sign: isl's fdiv_q */
} ap_kir_binop;

typedef enum ap_kir_fn {
	/* float (f32 spells expf, f64 exp): one argument */
	AP_KIR_EXP, AP_KIR_LOG, AP_KIR_SQRT, AP_KIR_TANH, AP_KIR_ERF,
	AP_KIR_FLOOR, AP_KIR_CEIL, AP_KIR_FABS, AP_KIR_LOG1P, AP_KIR_EXPM1,
	AP_KIR_ROUND,      /* rint: round half to even */
	AP_KIR_SIN, AP_KIR_COS,
	AP_KIR_EX2_APPROX, /* float32 only: 2^x as PTX ex2.approx.ftz.f32 -- one
			      special-function instruction, relative error
			      about 2^-22 (PTX ISA, "ex2"), subnormal inputs
			      and results flushed to zero; the host: exp2f with
			      the same flushes */
	AP_KIR_TF32,       /* float32 only: rounded to TF32 (10 mantissa bits),
			      to nearest, ties away from zero -- PTX's
			      cvt.rna.tf32.f32; NaN and infinities kept */
	/* two arguments */
	AP_KIR_POW, AP_KIR_FMAX, AP_KIR_FMIN, AP_KIR_FMOD,
	AP_KIR_FN_COUNT
} ap_kir_fn;

typedef struct ap_kir_expr ap_kir_expr;
struct ap_kir_expr {
	ap_kir_expr_kind kind;
	ap_dtype type;
	int op;
	int64_t ival;
	double fval;
	ap_kir_var *var;
	ap_kir_array *arr;
	ap_kir_expr *a, *b, *c;
};

typedef enum ap_kir_stmt_kind {
	AP_KIR_S_FOR,      /* for (var = lo; var < hi; var += step) body */
	AP_KIR_S_IF,       /* if (cond) body else orelse */
	AP_KIR_S_LET,      /* declare var (= value, may be NULL) */
	AP_KIR_S_ASSIGN,   /* var = value */
	AP_KIR_S_STORE,    /* arr[index] = value */
	AP_KIR_S_BARRIER,  /* __syncthreads() */
	AP_KIR_S_COMMENT,  /* text */
	AP_KIR_S_SHFL,     /* var = __shfl_<shfl>_sync(mask, value, lane, width) */
	AP_KIR_S_VLOAD,    /* declares vars[i] = arr[index + i], i < width */
	AP_KIR_S_VSTORE,   /* arr[index + i] = values[i], i < width */
	AP_KIR_S_CP_ASYNC, /* arr[index + i] = cond ? src[src_index + i] : 0, i < width,
			      asynchronously (cp.async) */
	AP_KIR_S_CP_COMMIT,/* cp.async.commit_group */
	AP_KIR_S_CP_WAIT,  /* cp.async.wait_group step */
	AP_KIR_S_LDMATRIX, /* warp: ldmatrix.sync.aligned.m8n8.x<width>[.trans] */
	AP_KIR_S_MMA,      /* warp: mma.sync.aligned (ap_kir_mma_kind) */
	AP_KIR_S_CLUSTER_BARRIER, /* every thread of the cluster (barrier.cluster
				     arrive.release + wait.acquire): shared memory
				     written before it is visible to the
				     cluster's blocks after it */
	AP_KIR_S_WGMMA,    /* warpgroup: wgmma.mma_async (ap_kir_wgmma) */
	AP_KIR_S_WGMMA_FENCE,  /* warpgroup: wgmma.fence (registers of arr) */
	AP_KIR_S_WGMMA_COMMIT, /* warpgroup: wgmma.commit_group */
	AP_KIR_S_WGMMA_WAIT,   /* warpgroup: wgmma.wait_group step (registers of arr) */
	AP_KIR_S_FENCE_ASYNC,  /* fence.proxy.async.shared::cta */
	AP_KIR_S_MBAR_INIT,    /* mbarrier.init arr[index], value (expected arrivals) */
	AP_KIR_S_MBAR_ARRIVE,  /* mbarrier.arrive arr[index] (value: expect_tx bytes, or NULL) */
	AP_KIR_S_MBAR_WAIT,    /* until mbarrier.try_wait.parity arr[index], value succeeds */
	AP_KIR_S_BULK_COPY,    /* cp.async.bulk arr[index..] <- src[src_index..], width
				  bytes, completing on bar[bar_index] */
	AP_KIR_S_TMA_LOAD,     /* cp.async.bulk.tensor: the box of src's tensor map at
				  values[0 .. width-1] -> arr[index..], completing on
				  bar[bar_index] */
	AP_KIR_S_ROLES,        /* warp specialisation: body holds ARM statements only */
	AP_KIR_S_ARM,          /* threads [arm_lo, arm_hi) run body (ap_kir_arm) */
} ap_kir_stmt_kind;

/* The warp-level matrix multiply-accumulates of PTX (ISA, "Warp-level
 * matrix instructions: mma"), D = A * B + C with A row-major and B
 * column-major, C and D float32, each operand a fragment spread over the
 * 32 lanes of a warp by the ISA's layouts (g = lane / 4, t = lane % 4):
 *   m16n8k16 (A, B float16 or bfloat16): A 16x16, 8 elements per lane:
 *     a0,a1 = A[g][2t, 2t+1], a2,a3 = A[g+8][2t, 2t+1],
 *     a4,a5 = A[g][2t+8, 2t+9], a6,a7 = A[g+8][2t+8, 2t+9];
 *     B 16x8, 4 per lane: b0,b1 = B[2t, 2t+1][g], b2,b3 = B[2t+8, 2t+9][g];
 *   m16n8k8 (A, B float32 arrays holding TF32 values): A 16x8, 4 per lane:
 *     a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4];
 *     B 8x8, 2 per lane: b0 = B[t][g], b1 = B[t+4][g];
 *   C and D 16x8, 4 per lane: c0,c1 = C[g][2t, 2t+1], c2,c3 = C[g+8][2t, 2t+1]. */
typedef enum ap_kir_mma_kind {
	AP_KIR_MMA_F16_16816 = 0,
	AP_KIR_MMA_BF16_16816 = 1,
	AP_KIR_MMA_TF32_1688 = 2,
} ap_kir_mma_kind;

/* The warpgroup-level matrix multiply-accumulates of PTX (ISA 8.0+,
 * sm_90a; "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
 * Instructions"), D = A * B + D of shape m64nNk16 (16-bit inputs) or
 * m64nNk8 (TF32) with A and B in shared
 * memory, each described by a matrix descriptor, and D float32 in the
 * registers of the warpgroup's 128 threads (4 consecutive warps, the
 * first a multiple of 4): warp w (of the warpgroup), lane l (g = l / 4,
 * t = l % 4) holds N / 2 elements, element i at row 16 w + g + 8 ((i / 2)
 * % 2), column 8 (i / 4) + 2 t + i % 2 (ISA figure "WGMMA .m64nNk16
 * register fragment layout for accumulator matrix D"). */
typedef enum ap_kir_wgmma_kind {
	AP_KIR_WGMMA_F16 = 0,      /* .f32.f16.f16, m64nNk16 */
	AP_KIR_WGMMA_BF16 = 1,     /* .f32.bf16.bf16, m64nNk16 */
	AP_KIR_WGMMA_TF32 = 2,     /* .f32.tf32.tf32, m64nNk8: float32 arrays whose
				      values the tensor cores read as TF32 (the 13
				      low mantissa bits dropped); both operands
				      K-major in shared memory (the ISA has no
				      transpose for .tf32) */
} ap_kir_wgmma_kind;

/* The element type of a wgmma kind's A and B (float16, bfloat16, or
 * float32 for TF32) and its K (16, or 8 for TF32). */
ap_dtype ap_kir_wgmma_type(ap_kir_wgmma_kind kind);
int ap_kir_wgmma_k(ap_kir_wgmma_kind kind);

/* Where a wgmma operand lies in shared memory (PTX ISA, "Shared Memory
 * Matrix Layout", its canonical layouts in CuTe's notation with T = 16
 * bytes / element size).  Without swizzling (swizzle 0):
 *   K-major (imm-trans 0):  ((8,m),(T,2k)) : ((1T,SBO),(1,LBO)) -- core
 *     matrices of 8 rows (M or N) of 16 bytes (T elements along K), the
 *     next 8 rows SBO bytes on, the next T elements of K LBO bytes on;
 *   MN-major (imm-trans 1): ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO)) --
 *     core matrices of 8 rows (K) of 16 bytes (T elements along M or
 *     N), the next T of M or N SBO bytes on, the next 8 of K LBO on.
 * With a swizzle of W = 32, 64 or 128 bytes (X = W / 16 chunks of 16
 * bytes a row), atoms of 8 rows of W bytes:
 *   K-major:  ((8,m),(T,2k)) : ((XT,SBO),(1,T)) -- a row of an atom holds
 *     X T elements of K, the next 8 rows SBO bytes on; LBO is not used
 *     (a wgmma's 16 elements of K lie in one atom row; the next atom
 *     along K is reached by the start address);
 *   MN-major: ((T,X,m),(8,k)) : ((1,T,LBO),(XT,SBO)) -- a row of an atom
 *     holds X T elements of M or N (one k), the next X T of M or N LBO
 *     bytes on, the next 8 of K SBO bytes on;
 * then the byte address a is swizzled, a ^ (((a >> 7) & (X - 1)) << 4)
 * (CuTe's Swizzle<log2 X, 4, 3>: the 16-byte chunk within a 128-byte
 * span XOR-ed with the span's index), on the shared-memory address, so
 * a swizzled operand's array must start on the pattern's repeat, 8 W
 * bytes (ap_kir_shared_dyn_aligned).  lbo and sbo are bytes, multiples
 * of 16, below 2^18. */
typedef struct ap_kir_wg_layout {
	bool mn_major;
	int lbo, sbo;
	int swizzle;   /* 0, 32, 64 or 128 bytes */
} ap_kir_wg_layout;

/* The swizzle (128, 64 or 32 bytes; 0 when none fits) for a wgmma operand
 * tile whose contiguous coordinate spans `extent` bytes and whose
 * descriptors start every `start` bytes along it (the warpgroups' or the
 * k16 steps' starts): the widest whose atom row, that many bytes, divides
 * both, so that every descriptor's start is an atom's row 0 (PTX ISA,
 * "Shared Memory Matrix Layout"; CUTLASS picks its sm90 atoms the same
 * way).  Wider is better: the 16-byte chunks a warp's copies write along
 * the coordinate spread over more banks. */
int ap_kir_wg_swizzle_fit(int64_t extent, int64_t start);

/* The four warp shuffles of the CUDA C Programming Guide ("Warp Shuffle
 * Functions"): the `lane` operand is laneMask, delta, delta and srcLane. */
typedef enum ap_kir_shfl_kind {
	AP_KIR_SHFL_XOR,   /* __shfl_xor_sync */
	AP_KIR_SHFL_DOWN,  /* __shfl_down_sync */
	AP_KIR_SHFL_UP,    /* __shfl_up_sync */
	AP_KIR_SHFL_IDX,   /* __shfl_sync */
} ap_kir_shfl_kind;

typedef struct ap_kir_stmt ap_kir_stmt;

/* A statement list. */
typedef struct ap_kir_block {
	ap_kir_stmt *first, *last;
} ap_kir_block;

struct ap_kir_stmt {
	ap_kir_stmt_kind kind;
	ap_kir_stmt *next;
	ap_kir_var *var;          /* FOR, LET, ASSIGN, SHFL (destination) */
	ap_kir_expr *lo, *hi;     /* FOR */
	int64_t step;             /* FOR, > 0 */
	int unroll;               /* FOR: 0 no hint, -1 unroll fully, N > 0 by N */
	ap_kir_expr *cond;        /* IF */
	ap_kir_array *arr;        /* STORE, VLOAD, VSTORE */
	ap_kir_expr *index;       /* STORE, VLOAD, VSTORE (first element) */
	ap_kir_expr *value;       /* LET, ASSIGN, STORE, SHFL */
	ap_kir_block body;        /* FOR, IF (then) */
	ap_kir_block orelse;      /* IF */
	char *text;               /* COMMENT */
	int shfl;                 /* SHFL: an ap_kir_shfl_kind */
	ap_kir_expr *lane;        /* SHFL: laneMask, delta or srcLane (integer) */
	int width;                /* SHFL: segment width (power of 2 in [1, 32]);
				     VLOAD, VSTORE: elements (2, 4, 8) */
	ap_kir_var **vars;        /* VLOAD: `width` registers it declares */
	ap_kir_expr **values;     /* VSTORE: `width` values */
	ap_kir_array *src;        /* CP_ASYNC (GLOBAL), LDMATRIX (shared) */
	ap_kir_expr *src_index;   /* CP_ASYNC: first element; LDMATRIX: this
				     lane's row (first element) */
	bool trans;               /* LDMATRIX: .trans */
	int mma;                  /* MMA: an ap_kir_mma_kind */
	ap_kir_array *frag[4];    /* MMA: D, A, B, C (LOCAL arrays); WGMMA: D, A, B
				     (A, B shared); WGMMA_FENCE / _WAIT: frag[0]
				     the accumulators (whole array) */
	ap_kir_expr *frag_off[4]; /* MMA: first element of each fragment; WGMMA:
				     D's first element, A's and B's first (the
				     descriptors' start addresses) */
	ap_kir_wg_layout wg[2];   /* WGMMA: A's and B's layouts (width: N) */
	ap_kir_array *bar;        /* BULK_COPY: the mbarrier array ... */
	ap_kir_expr *bar_index;   /* ... and the barrier it completes on */
	unsigned arm_lo, arm_hi;  /* ARM: its threads (block-linear thread index) */
	unsigned arm_grain;       /* ARM: threads of each group that runs on its own
				     (a warp or a warpgroup: the host runs each as
				     a coroutine of its own) */
	int maxnreg;              /* ARM: setmaxnreg.inc to it (> 0), .dec to -it
				     (< 0), none (0) */
};

typedef struct ap_kir_arena ap_kir_arena;

/* A library call that computes the same product as the kernel it is
 * attached to (issue 25; apollo.LibraryCall, whose fields and units these
 * are): the GEMM emitter sets it on a CUDA kernel whose schedule has
 * lib=1, the bundle carries it on the kernel's launch, and a runtime with
 * cuBLASLt runs the call instead of the kernel.  Row-major, elements. */
typedef struct ap_kir_library {
	int op;                   /* apollo.LibraryOp: 1 = cuBLASLt matmul */
	ap_dtype a_type, b_type, c_type, d_type, bias_type;
	int compute;              /* apollo.LibraryCompute: 0 f32, 1 f32 with TF32 */
	int64_t m, n, k, batch;
	int64_t stride_a, stride_b, stride_c, stride_d;
	int64_t lda, ldb, ldc, ldd;
	bool trans_a, trans_b;
	int epilogue;             /* apollo.LibraryEpilogue (cublasLtEpilogue_t numbers) */
	float alpha, beta;
	int a, b, c, d, bias;     /* the kernel's params; -1: none */
	int64_t workspace_bytes;  /* scratch the call may use (bytes; 0: none) ... */
	int64_t workspace_offset; /* ... at this offset of the workspace (the plan places it) */
	double library_us;        /* the cost model's time of the call, microseconds */
	double kernel_us;         /* ... and of the kernel under the same other knobs */
} ap_kir_library;

typedef struct ap_kir_kernel {
	char *name;               /* entry point */
	unsigned grid[3], block[3];
	unsigned smem_bytes;      /* dynamic shared memory (bytes), grows with ap_kir_shared_dyn;
				     includes smem_align - 16 bytes of slack when
				     smem_align > 16 */
	unsigned smem_align;      /* the largest alignment of a SHARED_DYN array
				     (0 or 16: none beyond the default) */
	unsigned cluster;         /* blocks per thread-block cluster along x (grid[0] a
				     multiple of it; CUDA: __cluster_dims__, sm_90
				     and later); 1 = no cluster.  The host runs the
				     blocks of a cluster together, as one block of
				     cluster x block threads with one copy of each
				     shared array per rank (program.h's ABI then
				     runs the cluster whose first block lies in
				     [block_begin, block_end)) */
	ap_dtype index_type;      /* AP_DT_I64 (default) or AP_DT_I32: the type of
				     block/thread indices and ap_kir_idx constants */
	int n_arrays, cap_arrays;
	ap_kir_array **arrays;    /* in creation order */
	int n_params;             /* GLOBAL arrays; their `param` is 0..n_params-1 */
	int n_vars;
	ap_kir_block body;
	ap_kir_arena *arena;
	bool failed;              /* an allocation failed somewhere */
	ap_kir_library *library;  /* NULL, or the call standing for it (malloc'd, owned) */
} ap_kir_kernel;

typedef enum ap_kir_target {
	AP_KIR_CUDA = 0,
	AP_KIR_HOST = 1,
	AP_KIR_HOST_CHECK = 2,   /* the host C, every shared and global access,
				    cp.async and barrier through the checker
				    (common/hostcheck.h) */
} ap_kir_target;

/* ---- kernels (kir.c) ----------------------------------------------------- */

/* New empty kernel named `name` (a C identifier) with grid and block 1x1x1.
 * NULL on ENOMEM. */
__ap_give ap_kir_kernel *ap_kir_kernel_new(const char *name);
ap_kir_kernel *ap_kir_kernel_free(__ap_take ap_kir_kernel *k);  /* accepts NULL */
/* True once any allocation of `k` failed (the IR is then incomplete). */
bool ap_kir_failed(const ap_kir_kernel *k);
/* Renames the kernel (a C identifier); constant arrays are printed
 * prefixed by the kernel's name, so they follow.  0 or AP_ENOMEM. */
int ap_kir_kernel_rename(ap_kir_kernel *k, const char *name);
/* Total threads per block (block[0]*block[1]*block[2]). */
unsigned ap_kir_block_threads(const ap_kir_kernel *k);
/* Bytes of shared memory one block of k takes: its static arrays in
 * declaration order, each starting 16-byte aligned (the alignment the CUDA
 * printer may give an array, __align__(16), and that ptxas then pads to),
 * then the dynamic shared memory (itself 16-byte aligned).  An upper bound
 * of what ptxas reports, for every budget (the verifier, Layer III's merge
 * cap): without the padding, a kernel near a limit passed the budget and
 * failed in ptxas. */
uint64_t ap_kir_shared_bytes(const ap_kir_kernel *k);

/* Arrays.  `name` must be a C identifier unique in the kernel. */
/* Next global parameter (param index = number of params so far). */
ap_kir_array *ap_kir_param(ap_kir_kernel *k, const char *name, ap_dtype type,
			   bool written, int tensor);
ap_kir_array *ap_kir_shared(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size);
/* Places the array at the next 16-byte aligned offset of the dynamic shared
 * memory and grows k->smem_bytes. */
ap_kir_array *ap_kir_shared_dyn(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size);
/* The same at the next offset that is a multiple of `align` bytes (a power
 * of two in [16, 1024]): a swizzled wgmma operand must start on its
 * swizzle pattern's repeat (PTX ISA, "Matrix Descriptor Format": the base
 * offset is 0 when the pattern starts on a 1024-, 512- or 256-byte
 * boundary for the 128-, 64- and 32-byte swizzles).  The CUDA printer
 * aligns the dynamic shared memory's start at run time (the driver
 * promises 16 bytes), so k->smem_bytes gains align - 16 bytes of slack
 * once.  NULL (k failed) on a bad alignment or ENOMEM. */
ap_kir_array *ap_kir_shared_dyn_aligned(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size,
					unsigned align);
/* Bytes of dynamic shared memory that n arrays of bytes[i] bytes take
 * when declared in this order with ap_kir_shared_dyn_aligned(align[i])
 * (0 stands for 16) into a kernel holding none yet: each on the next
 * multiple of its alignment, then the run-time alignment's slack (the
 * largest alignment - 16) -- what the kernel's smem_bytes will be, for
 * an emitter sizing its tiles before it builds them.  Arrays declared
 * afterwards with ap_kir_shared_dyn add to it. */
size_t ap_kir_shared_dyn_bytes(int n, const size_t *bytes, const unsigned *align);
ap_kir_array *ap_kir_local(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size);
/* A LOCAL array marked scratch (see ap_kir_array.scratch): the caller
 * promises that every element read was stored earlier in the same
 * stretch of statements between collectives.  Not for ldmatrix / mma
 * fragments (those read other lanes' registers). */
ap_kir_array *ap_kir_local_scratch(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size);
/* `data`: size elements of `type` (copied).  size must be >= 1.  Printed
 * as NAME_<name>, NAME being the kernel's, so kernels can share a
 * translation unit. */
ap_kir_array *ap_kir_const_array(ap_kir_kernel *k, const char *name, ap_dtype type,
				 int64_t size, const void *data);
/* A fresh scalar variable named `prefix` followed by a number. */
ap_kir_var *ap_kir_var_new(ap_kir_kernel *k, ap_dtype type, const char *prefix);

/* Expressions (NULL operands give NULL). */
ap_kir_expr *ap_kir_int(ap_kir_kernel *k, ap_dtype type, int64_t v);
ap_kir_expr *ap_kir_i64(ap_kir_kernel *k, int64_t v);
/* An integer constant of the kernel's index type. */
ap_kir_expr *ap_kir_idx(ap_kir_kernel *k, int64_t v);
/* A floating constant of `type`: v rounded to the type (F16 and BF16: to
 * float32, then round to nearest even to the type). */
ap_kir_expr *ap_kir_float(ap_kir_kernel *k, ap_dtype type, double v);
/* A constant of `type` holding v (float types exact, integer types
 * truncated, bool v != 0). */
ap_kir_expr *ap_kir_const(ap_kir_kernel *k, ap_dtype type, double v);
ap_kir_expr *ap_kir_ref(ap_kir_kernel *k, ap_kir_var *v);
/* blockIdx / threadIdx component, of the kernel's index type. */
ap_kir_expr *ap_kir_index_of(ap_kir_kernel *k, ap_kir_index which);
ap_kir_expr *ap_kir_unary(ap_kir_kernel *k, ap_kir_unop op, ap_kir_expr *a);
/* Operands must have the same type (the result's, or bool for
 * comparisons and logic); AND .. FLOORDIV take integers only.  Integer
 * constants are folded (not SHL / SHR by a count outside [0, bits), nor
 * divisions by zero), as are x+0, x*1, x*0, x/1, x%1, x|0, x^0, x<<0,
 * x>>0 and floordiv(x, 1). */
ap_kir_expr *ap_kir_binary(ap_kir_kernel *k, ap_kir_binop op, ap_kir_expr *a, ap_kir_expr *b);
ap_kir_expr *ap_kir_select(ap_kir_kernel *k, ap_kir_expr *c, ap_kir_expr *a, ap_kir_expr *b);
/* Math call; b is NULL for one-argument functions.  Type is a's. */
ap_kir_expr *ap_kir_call(ap_kir_kernel *k, ap_kir_fn fn, ap_kir_expr *a, ap_kir_expr *b);
/* Conversion; identity when a already has `type`.  To bool: a != 0.
 * To and from F16 / BF16 through float32 (see the file comment). */
ap_kir_expr *ap_kir_cast(ap_kir_kernel *k, ap_dtype type, ap_kir_expr *a);
ap_kir_expr *ap_kir_load(ap_kir_kernel *k, ap_kir_array *arr, ap_kir_expr *index);

/* Shorthands for index arithmetic (constants take a's type). */
ap_kir_expr *ap_kir_add(ap_kir_kernel *k, ap_kir_expr *a, ap_kir_expr *b);
/* arr[index] read from the shared memory of the block of rank `rank` of
 * this block's cluster (an integer expression in [0, k->cluster)); arr a
 * SHARED or SHARED_DYN float32 / float64 array.  Written before a cluster
 * barrier, read after it. */
ap_kir_expr *ap_kir_load_remote(ap_kir_kernel *k, ap_kir_array *arr, ap_kir_expr *index, ap_kir_expr *rank);
ap_kir_expr *ap_kir_mul(ap_kir_kernel *k, ap_kir_expr *a, ap_kir_expr *b);
ap_kir_expr *ap_kir_addi(ap_kir_kernel *k, ap_kir_expr *a, int64_t b);
ap_kir_expr *ap_kir_muli(ap_kir_kernel *k, ap_kir_expr *a, int64_t b);

/* True when `e` is an integer constant (its value in *v when v != NULL). */
bool ap_kir_is_int(const ap_kir_expr *e, int64_t *v);
/* Structural equality (same variables, arrays, constants, operators). */
bool ap_kir_expr_equal(const ap_kir_expr *a, const ap_kir_expr *b);

/* Statements, appended to `b`.  Each returns the new statement (NULL on
 * failure). */
/* for (var = lo; var < hi; var += step): fill ->body. */
ap_kir_stmt *ap_kir_for(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var,
			ap_kir_expr *lo, ap_kir_expr *hi, int64_t step);
/* The same loop with an unroll hint: 0 none, -1 unroll fully, N > 0 unroll
 * by N (CUDA prints `#pragma unroll` / `#pragma unroll N` before the loop,
 * the host printer nothing: a hint never changes what the loop computes).
 * unroll < -1 fails. */
ap_kir_stmt *ap_kir_for_unroll(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var,
			       ap_kir_expr *lo, ap_kir_expr *hi, int64_t step, int unroll);
/* if (cond): fill ->body and ->orelse. */
ap_kir_stmt *ap_kir_if(ap_kir_kernel *k, ap_kir_block *b, ap_kir_expr *cond);
/* Declares var, with an initial value unless `value` is NULL. */
ap_kir_stmt *ap_kir_let(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var, ap_kir_expr *value);
ap_kir_stmt *ap_kir_assign(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var, ap_kir_expr *value);
ap_kir_stmt *ap_kir_store(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *arr,
			  ap_kir_expr *index, ap_kir_expr *value);
ap_kir_stmt *ap_kir_barrier(ap_kir_kernel *k, ap_kir_block *b);
/* Barrier of every thread of the cluster (uniform control flow, as a
 * barrier); also a barrier of the block. */
ap_kir_stmt *ap_kir_cluster_barrier(ap_kir_kernel *k, ap_kir_block *b);
/* Warp shuffle: dst = CUDA's __shfl_xor_sync / __shfl_down_sync /
 * __shfl_up_sync / __shfl_sync (mask, value, lane, width), semantics as in
 * the CUDA C Programming Guide, section "Warp Shuffle Functions", and, for
 * the corner cases, PTX's `shfl.sync` pseudocode (PTX ISA):
 *   - warps are the groups of 32 consecutive linear thread ids
 *     x + bx * (y + by * z); a warp splits into segments of `width` lanes;
 *   - `lane` (an integer expression, evaluated by each thread; only its
 *     low 5 bits count) is laneMask for XOR (source lane ^ laneMask; a
 *     source in a later segment gives the caller's own value), delta for
 *     DOWN (own value when lane % width + delta >= width) and UP (own value
 *     when lane % width < delta), srcLane for IDX (source = the caller's
 *     segment start + srcLane % width);
 *   - a source lane beyond the block's last thread (a partial last warp)
 *     gives the caller's own value.
 * `width` is a power of 2 in [1, 32].  `dst` is a register of value's type
 * declared earlier (ap_kir_let(k, b, dst, NULL)) and must not appear in
 * `value`.  The mask is 0xffffffff when the block's thread count is a
 * multiple of 32, else (1 << threads) - 1 for blocks of fewer than 32
 * threads (other counts are refused by ap_kir_verify).  Like a barrier, a
 * shuffle must be reached by every thread of the block: only in
 * block-uniform control flow.  Fails (NULL, kernel failed) on a NULL
 * operand, a bad width or kind, a non-integer lane or a type mismatch. */
ap_kir_stmt *ap_kir_shfl(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *dst,
			 ap_kir_shfl_kind kind, ap_kir_expr *value, ap_kir_expr *lane,
			 unsigned width);
/* True when `width` elements of `type` make one vector access: width 2, 4
 * or 8 (8 for 2-byte types only) and width * size 4, 8 or 16 bytes. */
bool ap_kir_vector_ok(ap_dtype type, int width);
/* Vector load: declares the `width` registers dst[0..width-1] (fresh
 * variables of arr's type, like ap_kir_let) and sets dst[i] = arr[index +
 * i].  Vector store: arr[index + i] = values[i] (values of arr's type, all
 * evaluated before any element is stored).  The caller guarantees that
 * `index` (elements) is a multiple of `width` and that the array's storage
 * is 16-byte aligned (GLOBAL buffers and dynamic shared memory are; the
 * printers align static shared, local and constant arrays that a vector
 * access uses).  CUDA prints one access through the matching vector type
 * (float2/float4, double2, int2/int4, longlong2, char4/uchar4, __half2 /
 * __nv_bfloat162 for two 16-bit elements, uint2/uint4 holding 4 or 8 of
 * them); the host prints scalar accesses.  Fails (NULL, kernel failed) on
 * a NULL operand, a width refused by ap_kir_vector_ok or a type mismatch;
 * `dst` / `values` hold `width` entries, copied. */
ap_kir_stmt *ap_kir_vload(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *arr,
			  ap_kir_expr *index, int width, ap_kir_var *const *dst);
ap_kir_stmt *ap_kir_vstore(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *arr,
			   ap_kir_expr *index, int width, ap_kir_expr *const *values);
/* Asynchronous copy (PTX cp.async, sm_80 and later): arr[index + i] =
 * src[src_index + i] for i < width when `cond` holds (NULL: always), else
 * arr[index + i] = 0 (the src-size 0 form: nothing is read).  arr is a
 * SHARED or SHARED_DYN array, src a GLOBAL one of the same type; width *
 * element size is 4, 8 or 16 bytes and both indices are multiples of
 * width (the caller guarantees it for non-constant ones).  The copy is
 * complete for the issuing thread after a later ap_kir_cp_wait that
 * covers its group, and visible to the block after a barrier that
 * follows.  The host copies at once (a correct program cannot tell).
 * Fails on a NULL operand, a bad width, or arrays of the wrong spaces or
 * types. */
ap_kir_stmt *ap_kir_cp_async(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *arr,
			     ap_kir_expr *index, ap_kir_array *src, ap_kir_expr *src_index,
			     int width, ap_kir_expr *cond);
/* cp.async.commit_group: the thread's copies issued since the last commit
 * form one group. */
ap_kir_stmt *ap_kir_cp_commit(ap_kir_kernel *k, ap_kir_block *b);
/* cp.async.wait_group n: waits until at most n of the thread's groups are
 * still pending (n >= 0). */
ap_kir_stmt *ap_kir_cp_wait(ap_kir_kernel *k, ap_kir_block *b, int n);
/* Warp-collective matrix load (PTX ldmatrix.sync.aligned.m8n8.x<num>
 * [.trans].shared.b16): `num` (1, 2, 4) 8x8 matrices of 16-bit elements,
 * each row 16 contiguous bytes of the shared array `src`.  Lane j*8 + r
 * gives, in `row` (an element index into src, 16-byte aligned), the
 * address of row r of matrix j.  Each lane l receives, of matrix j, the
 * two elements at row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 -- with
 * `trans`, the elements at rows 2 (l % 4) and 2 (l % 4) + 1, column l / 4
 * -- into dst[off + 2j] and dst[off + 2j + 1].  For 32-bit element types
 * (float32 holding TF32 values; not with `trans`) a row is 4 elements and
 * lane l receives the one at row l / 4, column l % 4 into dst[off + j].
 * dst is a LOCAL array of src's type.  Every lane of every warp of the
 * block takes part (block-uniform control flow, whole warps).  Fails on a
 * NULL operand, a bad num, spaces or types, or `trans` on 32-bit
 * elements. */
ap_kir_stmt *ap_kir_ldmatrix(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *dst,
			     ap_kir_expr *off, ap_kir_array *src, ap_kir_expr *row, int num,
			     bool trans);
/* Warp-collective D = A * B + C (ap_kir_mma_kind gives the shape, types
 * and fragment layouts): each fragment is a LOCAL array and the index of
 * its first element in it (d, a, b, c and their offsets); D may be C (the
 * same array and offset).  Every lane of every warp of the block takes
 * part.  float16 / bfloat16 products are exact in float32; the host sums
 * them in order of k, the tensor core in an order of its own (results may
 * differ by float32 rounding).  Fails on a NULL operand, a bad kind or
 * fragment types (A and B of the kind's input type, C and D float32). */
ap_kir_stmt *ap_kir_mma(ap_kir_kernel *k, ap_kir_block *b, ap_kir_mma_kind kind,
			ap_kir_array *d, ap_kir_expr *d_off, ap_kir_array *a, ap_kir_expr *a_off,
			ap_kir_array *bb, ap_kir_expr *b_off, ap_kir_array *c, ap_kir_expr *c_off);
/* Warpgroup-collective D = A * B + D, wgmma.mma_async.sync.aligned.
 * m64nNk16.f32.{f16,bf16} or m64nNk8.f32.tf32.tf32 (ap_kir_wgmma_kind;
 * K below is the kind's): D is the LOCAL float32
 * array d from element d_off (N / 2 of a thread, in the layout of
 * ap_kir_wgmma_kind's comment); A (64 x K) starts at element a_start of
 * the shared array a and lies as layout la says, B (K x N) at b_start
 * of bb as lb says (ap_kir_wg_layout; each start 16-byte aligned).  N is
 * a multiple of 8 in [8, 256].  Every thread of every warpgroup of the
 * block takes part (block-uniform control flow, blocks of whole
 * warpgroups); the start expressions may differ between warpgroups and
 * must not within one.  A may instead be a LOCAL array of the kind's
 * type (the RS form, 16-bit kinds: A from registers, 8 elements a thread from a_start,
 * in the layout of mma.sync m16n8k16's A per warp, warp w of the
 * warpgroup holding rows 16 w..; la is then ignored).  TF32 operands are
 * K-major (la, lb not mn_major) and read truncated to TF32, as the
 * tensor cores read float32 bits (the host: ap_tf32_trunc).  Asynchronous: the product is in D after a
 * wgmma_wait that covers its commit group, and the shared tiles may not
 * be written before then; shared memory written by ordinary stores or
 * cp.async before it must be fenced (ap_kir_fence_proxy_async) by each
 * writing thread, then a barrier.  The host computes at once (products
 * exact in float32, summed in order of k after D), reading A and B
 * through the descriptors it encodes, as the ISA defines them.  Fails on
 * a NULL operand, a bad kind or N, spaces or types, or a bad layout
 * (an MN-major or register A operand of TF32 included). */
ap_kir_stmt *ap_kir_wgmma(ap_kir_kernel *k, ap_kir_block *b, ap_kir_wgmma_kind kind, int n,
			  ap_kir_array *d, ap_kir_expr *d_off, ap_kir_array *a, ap_kir_expr *a_start,
			  ap_kir_wg_layout la, ap_kir_array *bb, ap_kir_expr *b_start,
			  ap_kir_wg_layout lb);
/* wgmma.fence.sync.aligned before the first wgmma that touches the
 * accumulators `acc` (their registers fenced too); wgmma.commit_group;
 * wgmma.wait_group n (n >= 0) then `acc`'s registers fenced, so no read
 * of them moves above it.  Warpgroup-collective, block-uniform. */
ap_kir_stmt *ap_kir_wgmma_fence(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *acc);
ap_kir_stmt *ap_kir_wgmma_commit(ap_kir_kernel *k, ap_kir_block *b);
ap_kir_stmt *ap_kir_wgmma_wait(ap_kir_kernel *k, ap_kir_block *b, int n, ap_kir_array *acc);
/* fence.proxy.async.shared::cta: the thread's shared-memory writes so far
 * are visible to the async proxy (wgmma's operand reads) after the next
 * barrier.  The host: nothing to do. */
ap_kir_stmt *ap_kir_fence_proxy_async(ap_kir_kernel *k, ap_kir_block *b);

/* ---- mbarriers and bulk copies (sm_90; PTX ISA, "Parallel Synchronization
 * and Communication Instructions: mbarrier" and "cp.async.bulk") ----------
 *
 * An mbarrier counts, per phase, the arrivals still expected and the
 * bytes of asynchronous copies still to land (tx-count); when both reach
 * zero the phase completes, the phase number advances and the expected
 * arrivals are restored.  A wait names the parity of the phase it waits
 * for: it returns once the phase of that parity has completed (the
 * barrier's current phase has the other parity).  These are per-thread
 * instructions: the emitter puts those one thread issues (init, an
 * arrive with its tx bytes, a bulk copy) under an IF on the thread index.
 * A wait by every thread of the block is block-collective here (uniform
 * control flow: the host runs it between phases); the generic-proxy
 * ordering of other threads' ordinary stores still needs a barrier (the
 * checker counts no mbarrier as ordering them).  The host copies at
 * once; its checking mode keeps the copy's bytes pending until a wait on
 * the phase the copy completes, and reports reads before it, deadlocks
 * (a wait whose phase nothing can complete) and protocol errors. */

/* n (1..64) mbarriers, a SHARED array of 8-byte objects that only the
 * statements below may touch.  NULL (k failed) on a bad n or ENOMEM. */
ap_kir_array *ap_kir_mbarriers(ap_kir_kernel *k, const char *name, int n);
/* mbarrier.init.shared::cta.b64 bar[index], count: phase 0, `count`
 * (1 .. 2^20 - 1) arrivals expected per phase, tx-count 0.  Other threads
 * may use it after a barrier; the async proxy (bulk copies) after
 * ap_kir_fence_proxy_async by the initialising thread and then a
 * barrier (the CUDA guide's TMA example).  Fails on NULL operands, an
 * array not from ap_kir_mbarriers, a constant count out of range. */
ap_kir_stmt *ap_kir_mbar_init(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *bar, ap_kir_expr *index,
			      ap_kir_expr *count);
/* mbarrier.arrive[.expect_tx].shared::cta.b64 bar[index] (, tx): with tx
 * (integer bytes, may be NULL) the phase first expects tx more bytes of
 * asynchronous copies, then the thread arrives once. */
ap_kir_stmt *ap_kir_mbar_arrive(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *bar, ap_kir_expr *index,
				ap_kir_expr *tx);
/* Until mbarrier.try_wait.parity.shared::cta.b64 bar[index], parity
 * succeeds: the phase of that parity (0 or 1, an integer expression) has
 * completed, and the bytes bulk copies delivered in it are visible to
 * the thread.  Block-collective on the host (see above). */
ap_kir_stmt *ap_kir_mbar_wait(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *bar, ap_kir_expr *index,
			      ap_kir_expr *parity);
/* mbarrier.arrive on bar[index] by the first thread of every group of
 * `group` threads (an IF on threadIdx.x % group == 0 in b): a
 * warpgroup's release of a stage (group 128), the barrier's count being
 * the groups that arrive.  NULL on failure. */
ap_kir_stmt *ap_kir_mbar_arrive_each(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *bar, ap_kir_expr *index,
				     int64_t group);
/* cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes:
 * `bytes` (a multiple of 16, > 0) contiguous bytes from the GLOBAL array
 * src at element src_index to the SHARED / SHARED_DYN array dst at
 * element index (both addresses 16-byte aligned; checked at run time),
 * asynchronously; on landing they count down bar[bar_index]'s tx-count.
 * Fails on NULL operands, spaces, a type mismatch, bad bytes or a bar
 * array not from ap_kir_mbarriers. */
ap_kir_stmt *ap_kir_bulk_copy(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *dst, ap_kir_expr *index,
			      ap_kir_array *src, ap_kir_expr *src_index, int bytes, ap_kir_array *bar,
			      ap_kir_expr *bar_index);
/* Passes the GLOBAL array buf to the kernel also as a tiled tensor map
 * (Hopper's TMA; common/tmap.h) described by d -- its dims, strides,
 * box, element strides and swizzle fixed when the kernel is built; the
 * runtime encodes it with buf's address (cuTensorMapEncodeTiled).  The
 * map's element type must be buf's (float16, bfloat16, float32, int32,
 * float64, int64, uint8).  CUDA: one more kernel parameter per map, after
 * the arrays' (`const __grid_constant__ ap_tmap NAME_tmap`, in the order
 * of the arrays); the host needs none (the description is compiled in).
 * Returns 0, or -1 (k failed) for a non-GLOBAL buf, a second map on it,
 * a type mismatch or a description ap_tmap_check refuses. */
int ap_kir_tensor_map(ap_kir_kernel *k, ap_kir_array *buf, const ap_tmap_desc *d);
/* cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::
 * complete_tx::bytes: the box of buf's tensor map (ap_kir_tensor_map) at
 * element coordinates coords[0 .. rank-1] (integer expressions, innermost
 * first, may be negative or past the end: those elements are filled) into
 * the SHARED_DYN array dst of buf's type from element index, dense and
 * swizzled by the map's mode (ap_tmap_load); dst must be aligned to the
 * swizzle's repeat (8 x its span; 128 bytes without swizzle).  On landing
 * the box's bytes (ap_tmap_box_bytes) count down bar[bar_index]'s
 * tx-count.  A per-thread instruction, like ap_kir_bulk_copy.  Fails on
 * NULL operands, a buf without a map, or spaces and types that do not
 * fit. */
ap_kir_stmt *ap_kir_tma_load(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *dst, ap_kir_expr *index,
			     ap_kir_array *buf, ap_kir_expr *const *coords, ap_kir_array *bar,
			     ap_kir_expr *bar_index);

/* Warp specialisation (docs/hopper-pipeline.md, section 1.2): a ROLES
 * statement whose arms (ap_kir_arm) split the block's threads into
 * disjoint ranges, each running its own code -- a producer warpgroup
 * issuing TMA loads, consumer warpgroups computing -- synchronised only by
 * mbarriers (no __syncthreads inside; the statements after ROLES need a
 * barrier to see the arms' shared writes).  CUDA prints an if / else if
 * chain on the thread index of the warp's first lane, broadcast by
 * __shfl_sync (warp-uniform to ptxas, which otherwise takes an arm for a
 * divergent path and serialises its wgmma: info C7520); the host runs every group of arm_grain threads of
 * an arm as a stackless coroutine that yields at each mbarrier wait whose
 * phase is not complete (print.c, print_roles_host), so a wait on an
 * arrival another arm makes later cannot hang.  The block must be 1-D.
 * NULL on failure (k failed). */
ap_kir_stmt *ap_kir_roles(ap_kir_kernel *k, ap_kir_block *b);
/* An arm of `roles` (from ap_kir_roles): threads [lo, hi) of the block,
 * in groups of `grain` threads (32: warps, 128: warpgroups) that each run
 * the body independently (on the GPU they are not synchronised with each
 * other: an arm of two consumer warpgroups arrives twice on a barrier it
 * releases); lo, hi multiples of grain, lo < hi.  maxnreg: the
 * setmaxnreg.inc (> 0) or .dec (< 0) register count the arm's
 * warpgroups ask for first (PTX ISA "setmaxnreg": a multiple of 8 in
 * [24, 256], whole warpgroups), 0 for none.  Fill ->body.  Fails (k
 * failed, NULL) on a `roles` that is not a ROLES statement or bad
 * bounds; the verifier's rule role checks the rest. */
ap_kir_stmt *ap_kir_arm(ap_kir_kernel *k, ap_kir_stmt *roles, unsigned lo, unsigned hi, unsigned grain,
			int maxnreg);

/* Elements per lane of the fragments of `kind`: A, B and C/D. */
void ap_kir_mma_frag_sizes(ap_kir_mma_kind kind, int *a, int *b, int *c);
ap_kir_stmt *ap_kir_comment(ap_kir_kernel *k, ap_kir_block *b, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Declares a fresh register of `type` initialised to `value` and returns a
 * reference to it (a LET plus a REF): how lowering names a value once. */
ap_kir_expr *ap_kir_bind(ap_kir_kernel *k, ap_kir_block *b, ap_dtype type,
			 const char *prefix, ap_kir_expr *value);

/* ---- float16 / bfloat16 (half.c) ----------------------------------------- */

/* Bit-exact conversions between float32 and the 16-bit float types, the
 * same functions the host printer emits.  f32 -> f16: IEEE 754 binary16,
 * round to nearest even, subnormals, overflow to +-infinity (from 65520
 * on), NaN kept a quiet NaN (top payload bits kept).  f32 -> bf16: the top
 * 16 bits, round to nearest even, NaN kept a quiet NaN.  f16 / bf16 -> f32
 * are exact. */
bool ap_kir_is_float_type(ap_dtype t);   /* F32, F64, F16, BF16 */
uint16_t ap_kir_f32_to_f16(float f);
float ap_kir_f16_to_f32(uint16_t h);
uint16_t ap_kir_f32_to_bf16(float f);
float ap_kir_bf16_to_f32(uint16_t h);
/* The float32 bit pattern u rounded to TF32 as PTX cvt.rna.tf32.f32 does
 * (AP_KIR_TF32): to nearest, ties away from zero, 13 low bits zero;
 * infinities kept, NaN the canonical 0x7fffffff. */
uint32_t ap_kir_tf32_bits(uint32_t u);

/* ---- utilities (visit.c, clone.c, verify.c) ------------------------------ */

/* Callbacks of ap_kir_visit; either may be NULL.  A non-zero return stops
 * the walk, and ap_kir_visit returns it. */
typedef struct ap_kir_visitor {
	/* every statement, in program order (pre-order); depth 0 for the
	 * kernel's body, +1 inside each for / if */
	int (*stmt)(const ap_kir_stmt *s, int depth, void *user);
	/* every expression node of statement `s`, children before parents
	 * (post-order), operands in field order (lo, hi; cond; index, value;
	 * value, lane; values[0..]); a node shared by two trees is visited
	 * once per occurrence */
	int (*expr)(const ap_kir_expr *e, const ap_kir_stmt *s, void *user);
} ap_kir_visitor;

/* Walks `k`'s body: each statement's callback, then its expressions, then
 * the statements nested in it (for body; if body, then else branch).
 * Returns 0 or the first non-zero callback result. */
int ap_kir_visit(const ap_kir_kernel *k, const ap_kir_visitor *v, void *user);
/* The same walk over the statements [first, end) of one statement list
 * (end NULL: to its end) and everything nested in them; depths count from
 * 0 there. */
int ap_kir_visit_range(const ap_kir_stmt *first, const ap_kir_stmt *end, const ap_kir_visitor *v,
		       void *user);

/* What ap_kir_clone_into replaces.  `arrays` is indexed by the source
 * array's id (src->n_arrays entries, owned by the caller; NULL = all
 * cloned, no mapping returned). */
typedef struct ap_kir_subst {
	ap_kir_expr *index[6];   /* replacement per ap_kir_index (built in dst),
				    NULL = keep */
	ap_kir_array **arrays;   /* per src array id: the dst array to use;
				    NULL entries are cloned and filled in */
	const char *prefix;      /* prefix for names of cloned arrays and vars
				    (NULL = "") */
} ap_kir_subst;

/* Deep-copies src's body to the end of `into` (a statement list of dst),
 * for stitching several kernels into one launch whose blocks are split by
 * block index ranges.  Every variable gets a fresh one in dst (named
 * prefix + its name's letters).  Every block / thread index becomes
 * s->index[which] when set (converted to the index's type in src if dst's
 * index type differs); one whose extent in src is 1 becomes the constant 0
 * (the printers print it so, and dst's extent may be larger); others stay
 * indices of dst.  Every array becomes s->arrays[id]; each NULL entry is
 * created in dst (name prefix + name) and written back: GLOBAL arrays as
 * new parameters of dst (same type, written, tensor), appended in src's
 * parameter order; SHARED, LOCAL and CONST (data copied) as new arrays of
 * the same size; SHARED_DYN at dst's next dynamic offset (dst->smem_bytes
 * grows).  The launch shape of dst is the caller's business.  Expression
 * DAGs stay DAGs.  src is not modified.  Returns 0, or AP_ENOMEM (dst is
 * then marked failed; also when dst had failed before, or src had). */
int ap_kir_clone_into(ap_kir_kernel *dst, ap_kir_block *into, const ap_kir_kernel *src,
		      ap_kir_subst *s);
/* Copies one expression into dst with s's index and array substitutions;
 * variables are kept (the same ap_kir_var), so this substitutes within
 * one kernel (dst == the kernel of e) or copies variable-free
 * expressions.  s may be NULL (plain copy).  NULL on ENOMEM. */
ap_kir_expr *ap_kir_expr_clone(ap_kir_kernel *dst, const ap_kir_expr *e,
			       const ap_kir_subst *s);

/* Limits of the device a kernel is checked against. */
typedef struct ap_kir_limits {
	unsigned max_threads;       /* per block */
	unsigned max_shared_bytes;  /* static + dynamic shared memory per block */
} ap_kir_limits;

/* Checks `k` against the IR's rules; `lim` NULL means 1024 threads and
 * 48 KiB of shared memory (CUDA's default without opt-in).  Returns 0, or
 * AP_EINTERNAL with err->msg "kernel NAME: rule RULE: what" for the first
 * violation, RULE being one of
 *   scope     a variable used, assigned or shuffled into outside the scope
 *             of its declaration (LET earlier in the same or an enclosing
 *             list, FOR variable of an enclosing loop, VLOAD registers), or
 *             declared twice;
 *   types     binary operands of different types, AND .. FLOORDIV / REM on
 *             floats, a result type that does not follow (bool for
 *             comparisons and logic), select branches of different types,
 *             math calls on non-floats, an assigned / stored / shuffled
 *             value of another type than its destination;
 *   select    a select condition that is not bool;
 *   loop      a loop variable that is not an integer, bounds of another
 *             type than the variable, step <= 0, unroll < -1;
 *   const     a store into a CONST array;
 *   bounds    a constant index outside a LOCAL, SHARED, SHARED_DYN or
 *             CONST array (vector accesses: any element);
 *   uniform   a barrier or shuffle under control flow that is not
 *             block-uniform: conditions and loop bounds may use constants,
 *             block indices and uniform registers (loop variables of
 *             uniform loops; registers only ever given uniform values in
 *             uniform context), loads of SHARED, SHARED_DYN and CONST
 *             arrays at uniform indices; never thread indices;
 *   launch    a grid or block extent of 0, or more threads per block than
 *             lim->max_threads;
 *   shared    static shared arrays plus smem_bytes above
 *             lim->max_shared_bytes;
 *   vector    a vector access refused by ap_kir_vector_ok, or a constant
 *             index that is not a multiple of the width;
 *   shuffle   a width that is not a power of 2 in [1, 32], a non-integer
 *             lane, the destination used in the value, or a block of more
 *             than 32 threads that is not a multiple of 32;
 *   async     cp.async between arrays of the wrong spaces, of a size that
 *             is not 4, 8 or 16 bytes, at a constant index that is not a
 *             multiple of its width; a negative wait_group count;
 *   matrix    ldmatrix or mma fragments that are not register arrays,
 *             an ldmatrix without a shared source or of another count
 *             than 1, 2, 4; an mma kind out of range;
 *   warp      ldmatrix or mma in a block that is not whole warps (they
 *             also count as collectives for the uniform rule);
 *   warpgroup wgmma and its fence, commit and wait in a block that is not
 *             whole warpgroups (128 threads), or under thread-dependent
 *             control flow; a wgmma N or layout out of range.
 *   mbarrier  an mbarrier statement on an array not from ap_kir_mbarriers,
 *             an mbarrier array touched by any other statement or load,
 *             an init count out of 1 .. 2^20 - 1, a missing count or
 *             parity, a bulk copy that is not global to a shared array of
 *             its type or not a positive multiple of 16 bytes (a wait
 *             under thread-dependent control flow breaks rule uniform).
 *   tma       a TMA load whose source has no tensor map, or whose
 *             destination is not a dynamic shared array of its type
 *             aligned to the map's swizzle repeat (or 128 bytes), or does
 *             not hold the box.
 *   wgmma_regs a register array a wgmma writes (its accumulators) or reads
 *             (an A fragment in registers) touched by any other statement
 *             while that wgmma is in flight: after the wgmma and before a
 *             wgmma.wait_group that covers its commit group (PTX ISA,
 *             "Asynchronous Warpgroup Level Matrix Multiply-Accumulate":
 *             accessing those registers before the wait is undefined).  A
 *             later wgmma on the same accumulators, and the fence and
 *             wait naming them, are not accesses.  The host runs each
 *             wgmma at issue and cannot see such a read; this rule does,
 *             statically: loops are walked twice (what is in flight at
 *             the end of a pass stays so at the start of the next) and
 *             both arms of an if are joined, each commit group aligned on
 *             the newest;
 *   role      ROLES (ap_kir_roles) under thread-dependent control flow,
 *             inside an arm, twice in a kernel, in a kernel with clusters
 *             or a block that is not 1-D, without arms or
 *             holding anything but arms; arms outside the block or
 *             overlapping; a setmaxnreg count that is not a multiple of 8
 *             in [24, 256] or on an arm not of whole warpgroups; inside
 *             an arm: a block or cluster barrier (the arms meet only on
 *             mbarriers), wgmma in an arm not of whole warpgroups
 *             (shuffles, ldmatrix and mma.sync run on whole warps, which
 *             an arm's groups are).
 * Also AP_ENOMEM (out of memory) and AP_EINTERNAL for a kernel whose
 * construction failed. */
int ap_kir_verify(const ap_kir_kernel *k, const ap_kir_limits *lim, ap_error *err);

/* ---- printers (print.c) -------------------------------------------------- */

/* Prints `k` as one complete translation unit for `target`:
 *   AP_KIR_CUDA: extern "C" __global__ void NAME(T0 *__restrict__ p0, ...)
 *     for NVRTC (C++17 hex float literals; no #include, except
 *     <cuda_fp16.h> / <cuda_bf16.h> in a kernel that uses F16 / BF16,
 *     which NVRTC finds through the -I option of backend/nvrtc.c; those
 *     types are __half / __nv_bfloat16, constant data of them unsigned
 *     short bit patterns);
 *   AP_KIR_HOST: void NAME(void *const *args, unsigned block_begin,
 *     unsigned block_end), C11 with <math.h>, as program.h specifies;
 *     F16 / BF16 values are unsigned short bit patterns, converted by the
 *     static inline functions of ap_kir_f32_to_f16 & co. that the prelude
 *     defines when the kernel uses the type.
 * Returns a malloc'd string, or NULL on ENOMEM, on a kernel whose
 * construction failed, or when a barrier or shuffle sits in non-uniform
 * control flow the host printer cannot split (err says which). */
/*   AP_KIR_HOST_CHECK: the host C of AP_KIR_HOST in the checking mode:
 *     the kernel calls the checker through the exported pointer
 *     ap_check_rt (common/hostcheck.h) for every shared and global access
 *     made by a thread (rd/wr, with the access's bytes and alignment: a
 *     vector's size, 16 for an ldmatrix row), every cp.async (async: the
 *     destination pending until the issuing thread's wait_group covers
 *     it), commit_group and wait_group, and every barrier (0: the block,
 *     1: the cluster); with region() calls naming each parameter and
 *     shared array (per block of a cluster) at entry. */
__ap_give char *ap_kir_print(const ap_kir_kernel *k, ap_kir_target target, ap_error *err);

/* ap_kir_print with `flags`, a set of AP_KIR_PRINT_*:
 *   AP_KIR_PRINT_BASELINE (host targets): every kernel built for the
 *     baseline ISA only, without the x86-64-v3 clone a register-tiled
 *     kernel gets (print.c, AP_HOST_ISA) -- for kernels of an emulated GPU
 *     target ("host:sm_XX"), run on the host to check the GPU's kernels,
 *     not for speed: GCC compiles a cloned function twice.
 * Same returns and errors as ap_kir_print (flags 0: the same text). */
#define AP_KIR_PRINT_BASELINE 1u
__ap_give char *ap_kir_print_with(const ap_kir_kernel *k, ap_kir_target target, unsigned flags,
				  ap_error *err);

/* C type name of a scalar type ("float", "long long", "unsigned char");
 * "unsigned short" (the bit pattern, the host's type) for F16 and BF16. */
const char *ap_kir_ctype(ap_dtype t);

#endif
