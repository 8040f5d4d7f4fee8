/* cost.h -- Apollo's one cost model, used by the partitioner (merge and
 * recompute decisions), the fusion layers (does a row fit on chip, does a
 * horizontal merge pay), the emitters (their default configurations) and,
 * later, the tuner.
 *
 * Three parts:
 *   - the target's limits and speeds by architecture (ap_target_info);
 *   - the evaluation model of the value builder (server/lower/value.c):
 *     how many times a kernel made of a set of nodes evaluates the
 *     elements of each tensor, when producers are inlined into their
 *     consumers' index expressions (ap_cost_evals);
 *   - the time of one launch from the traffic and work an emitter reports
 *     for a configuration (ap_traffic -> ap_cost_time_us): a roofline
 *     (bytes over DRAM bandwidth, arithmetic over throughput) stretched
 *     when the grid fills only part of the machine, plus a launch overhead,
 *     as in XLA's GpuPerformanceModel and APOLLO's section 5.
 */
#ifndef AP_COST_H
#define AP_COST_H

#include "../../common/graph.h"

/* A compile target's limits and speeds.  For the host ("cpu"), blocks run
 * on worker threads: sm_count is the number of threads a launch may use,
 * the shared-memory limits are those the host printer allows. */
typedef struct ap_target_info {
	bool gpu;
	int arch;                        /* 80 for sm_80/compute_80; 0 for the host */
	unsigned sm_count;               /* streaming multiprocessors (host: threads) */
	unsigned warp;                   /* threads per warp (32) */
	unsigned max_threads_per_block;  /* 1024 */
	unsigned ws_threads;             /* threads a warp-specialised kernel's producer
					    warpgroup may add on top of max_threads_per_block
					    (the pipeline: 128 under its default cap, which
					    bounds the compute threads; 0 under a request's
					    own cap or from ap_cost_target) */
	unsigned max_threads_per_sm;     /* resident threads per SM */
	unsigned max_blocks_per_sm;      /* resident blocks per SM */
	unsigned shared_per_block;       /* bytes a block may use without opt-in (48 KiB) */
	unsigned shared_optin_per_block; /* bytes a block may use with the opt-in
					    (cuFuncSetAttribute), >= shared_per_block */
	unsigned shared_per_sm;          /* bytes of shared memory per SM */
	unsigned regs_per_sm;            /* 32-bit registers per SM */
	double dram_gbps;                /* DRAM bandwidth, GB/s */
	double l2_gbps;                  /* L2 (host: last-level cache) bandwidth, GB/s: what
					    tiles re-reading an operand draw on */
	double shared_gbps;              /* shared-memory (host: L1) bandwidth of the whole
					    chip, GB/s: SMs x 128 bytes per clock x clock */
	double gflops;                   /* FP32 throughput (no tensor cores), GFLOP/s */
	double direct_gflops;            /* what a direct product loop without a register tile
					    (Layer I's window kernels) reaches, GFLOP/s: gflops on
					    GPUs (the halo stands for the loss there); measured
					    on the host, where the GEMM emitter's register tiles
					    vectorise and a direct loop does not */
	double tc_gflops;                /* dense float16 tensor-core throughput with float32
					    accumulation, GFLOP/s (0: none usable) */
	double tf32_gflops;              /* dense TF32 tensor-core throughput (0: none) */
	bool wgmma;                      /* sm_90a (the arch-specific target, "a"): Hopper's
					    warpgroup MMA (wgmma) may be used; its kernels load
					    on compute capability 9.0 only */
	bool allow_tf32;                 /* the request's numerics: float32 products may run
					    on TF32 tensor cores (off by default, as in PyTorch) */
	bool tma;                        /* the request asks for wgmma tiles filled by TMA
					    where they can be (the GEMM's tma=1: its default
					    rule then, and priced; off: unvalidated) */
	bool unvalidated;                /* the request asks for every form not yet run on a
					    GPU wherever it fits (with tma; the attention
					    forward's overlap=1): the default rules take
					    them and the cost model prices them */
	double launch_us;                /* fixed cost of one launch, microseconds */
} ap_target_info;

/* Fills `out` for a target name: "cpu", "sm_XX[a]" or "compute_XX[a]", or
 * "host:sm_XX[a]" (the GPU's figures: its kernels emulated on the host)
 * (sm_75, 80, 86, 87, 89, 90, 100, 120 are known; another GPU architecture
 * gets the figures of the nearest known one below it).  Figures are the
 * vendors' published ones for the usual part of each architecture (A100
 * for sm_80, H100 SXM for sm_90, ...).  Returns 0, or AP_EUNSUPPORTED for
 * a name that is none of those. */
int ap_cost_target(const char *target, ap_target_info *out);

/* ---- the value builder's evaluation model ----------------------------------- */

/* Scratch for ap_cost_evals over one graph (arrays sized to it). */
typedef struct ap_cost_evals_ctx ap_cost_evals_ctx;

/* source_of(t, user): the tensor in memory behind t (t itself unless t is
 * made by a view the kernel reads through); written(t, user): whether the
 * kernel writes t (it is needed outside the node set). */
typedef struct ap_cost_graph_view {
	int (*source_of)(int t, void *user);
	bool (*written)(int t, void *user);
	void *user;
} ap_cost_graph_view;

__ap_give ap_cost_evals_ctx *ap_cost_evals_new(__ap_keep const ap_graph *g);
ap_cost_evals_ctx *ap_cost_evals_free(__ap_take ap_cost_evals_ctx *c);  /* accepts NULL */

/* Evaluation counts for a kernel made of `nodes` (n node indices of g,
 * ascending): E(t), how many times the kernel evaluates elements of tensor
 * t, for every tensor read or made by the nodes.  Each written element is
 * evaluated once; every reader in the set adds what it evaluates times the
 * elements it reads per output element (K for a matmul operand, the
 * reduced count for a reduction, the window for a convolution, one for
 * elementwise ops and index maps); readers at the very index of their
 * output element share one evaluation (the builder remembers values per
 * index), others add their own.  Results stay in `c` until the next call
 * (ap_cost_eval_of).  Linear in the nodes' inputs and outputs. */
void ap_cost_evals(ap_cost_evals_ctx *c, const int *nodes, int n, const ap_cost_graph_view *gv);
/* E(t) from the last ap_cost_evals (0 for tensors it did not touch). */
double ap_cost_eval_of(const ap_cost_evals_ctx *c, int t);

/* Elements of input i that one output element of node n reads (the
 * evaluation model's per-reader factor). */
double ap_cost_reads_per_element(const ap_graph *g, const ap_node *n, int i);

/* Elements of tensor t that the nodes of g reading it touch: a Slice or a
 * Gather reads only what it selects (its output's element count), a view
 * passes on what its own readers touch (all of its elements when its
 * result is an output of g: it is copied), every other reader reads t
 * whole; the sum over the readers, never more than t has (so the
 * elements a set of readers touches are at most the sum of what its parts
 * touch).  For modelled bytes: a kernel reading the Q part
 * of a fused QKV buffer moves a third of it.  Linear in g's nodes. */
double ap_cost_touched(const ap_graph *g, int t);

/* ---- launches ------------------------------------------------------------------ */

/* What one launch moves and computes, as an emitter reports it for one
 * configuration (bytes are modelled DRAM traffic: each distinct buffer
 * read once and written once unless the emitter knows better). */
typedef struct ap_traffic {
	double bytes_read, bytes_written;
	double flops;          /* arithmetic operations, recomputation included */
	unsigned blocks;       /* grid size (all dimensions multiplied) */
	unsigned threads;      /* per block */
	unsigned shared_bytes; /* per block, static and dynamic */
	bool uncoalesced;      /* some global access strides across a warp */
	bool tensor_cores;     /* the arithmetic runs on tensor cores (mma.sync) */
	bool tf32;             /* ... at the TF32 rate (ap_target_info.tf32_gflops):
				  ap_cost_schedule_us's peak */
	/* What only a configuration changes (0 where an emitter does not
	 * model it; ap_cost_schedule_us reads them, ap_cost_time_us does not): */
	double tile_bytes;     /* global loads the blocks issue, re-reads of an
				  operand by every block row / column included
				  (served by L2 beyond the DRAM bytes) */
	double shared_read;    /* bytes read from shared memory (or registers
				  refilled) to feed the arithmetic */
	unsigned regs;         /* 32-bit registers per thread: the emitter's
				  estimate, or ptxas's count once compiled */
	double alu_fraction;   /* of the arithmetic peak the inner loop can reach
				  (host: the SIMD lanes a row of the register
				  tile fills); 0 = all of it */
	double loop_fraction;  /* of a block's time its overlapped main loop
				  fills (copies, shared-memory reads and
				  arithmetic at once); the rest -- a pipeline's
				  fill, a cluster's reduction -- is added in
				  series: the work divided by it; 0 = all */
	double inflight_bytes; /* bytes of global memory one block keeps in flight
				  by asynchronous copies (the cp.async / TMA
				  stages ahead of the one computed on): where
				  the resident blocks' together cover one
				  microsecond of the SM's share of DRAM
				  bandwidth, few resident threads do not
				  starve DRAM; 0 = none (synchronous loads) */
	bool library;          /* a library call computes the launch (issue 25):
				  the figures are the library's, and ptxas's
				  of the kernel beside it do not apply */
	bool unvalidated;      /* the kernel's form has not run on a device yet
				  (the GEMM's tma=1, attention's overlap=1 until
				  the device kit checks them: docs/limits.md): no
				  modelled time (INFINITY), so that neither the
				  default rule nor a search chooses it; a tuning
				  record can.  Emitters leave it false where the
				  request asks for such forms (tma, unvalidated) */
} ap_traffic;

/* Modelled time of one launch in microseconds: launch_us plus
 * max(bytes / bandwidth, flops / throughput) -- the tensor-core
 * throughput for a launch that uses tensor cores -- divided by the fraction of
 * the SMs the grid occupies when it has fewer blocks than SMs, doubled for
 * uncoalesced access. */
double ap_cost_time_us(const ap_traffic *t, const ap_target_info *ti);

/* The time of one launch under configuration t, for ranking the
 * configurations of one kernel (the tuner, server/tune/tune.h): the
 * roofline of ap_cost_time_us over four resources -- DRAM bytes, L2 bytes
 * (tile_bytes), shared-memory bytes (shared_read), arithmetic -- then
 *   - occupancy: blocks one SM holds at once (threads, shared memory and
 *     regs x threads against the SM's register file), and memory time
 *     stretched when fewer than half the SM's threads are resident (too
 *     few loads in flight to cover DRAM latency) unless the resident
 *     blocks' asynchronous copies (inflight_bytes) cover a microsecond of
 *     the SM's DRAM bandwidth (Little's law: about twice DRAM's latency);
 *   - waves: the grid runs in ceil(blocks / (SMs x blocks per SM)) waves
 *     (host: worker threads x 1, a thread runs one block at a time),
 *     the last one partly empty (the tail effect), and a grid smaller than
 *     the SM count uses that fraction of the machine;
 *   - work outside a block's overlapped main loop (loop_fraction: a
 *     split-K block's pipeline fill and cluster reduction) in series;
 * plus launch_us.  Microseconds; a configuration whose block does not fit
 * an SM (0 blocks per SM), that needs more than 255 registers per thread
 * (it would spill) or whose form is `unvalidated` costs INFINITY.  The method is the roofline with
 * an occupancy and wave correction of XLA's GpuPerformanceModel and of
 * APOLLO's section 5 cost model. */
double ap_cost_schedule_us(const ap_traffic *t, const ap_target_info *ti);

/* As ap_cost_blocks_per_sm, also limited by the register file: `regs`
 * 32-bit registers per thread (0: not limiting), allocated per warp in
 * units of 256. */
unsigned ap_cost_blocks_per_sm_regs(const ap_target_info *ti, unsigned threads,
				    unsigned shared_bytes, unsigned regs);

/* ---- GEMM tiles ---------------------------------------------------------------- */

/* A tile configuration of the GEMM emitter (server/lower/gemm.c): block
 * tile bm x bn, K step bk, pipeline stages; SIMT: a tm x tn register tile
 * per thread; tensor cores: tm x tn warps per block. */
typedef struct ap_cost_gemm_tile {
	int bm, bn, bk, tm, tn, stages;
} ap_cost_gemm_tile;

/* The default tile for `batch` products of M x K by K x N of elem_bytes
 * elements on t, on tensor cores or not: the largest block tile whose
 * grid still fills the target's SMs (or worker threads), no larger than
 * the problem needs; a K step that keeps a stage's tiles small; three
 * stages where cp.async exists, else two.  The partitioner's evaluation
 * model reads the same rule (a prologue of A is evaluated once per block
 * column, ceil(N / bn) times per element). */
void ap_cost_gemm_default(const ap_target_info *t, int64_t batch, int64_t M, int64_t N, int64_t K,
			  size_t elem_bytes, bool tensor_cores, ap_cost_gemm_tile *out);

/* Layer I's question for a pooling window over product node n of g (a
 * Conv, or a MatMul/Gemm): does computing its output P inside the pooling
 * kernel -- tile by tile into shared memory, `halo` evaluations per
 * element (>= 1), on the SIMT units with a direct loop -- beat two
 * kernels, the product on its tiled emitter (tensor cores when t has them
 * for P's dtype: 16-bit, or float32 with allow_tf32) writing P and the
 * pooling reading it back?  Per element of P, with k multiply-adds (a
 * Conv: input channels per group times the kernel window; a matmul: the
 * second operand's rows): fused 2 k halo / direct_gflops against
 * 2 k / (product throughput) + 2 bytes(P's dtype) / bandwidth (the
 * roofline of ap_cost_time_us; APOLLO section 4.1 weighs recomputation
 * against memory traffic the same way).  *k_macs receives k, 0 for a node
 * this does not size (another op, a ConvTranspose, missing operands), for
 * which the answer is false. */
bool ap_cost_staged_product_pays(const ap_target_info *t, const ap_graph *g, const ap_node *n,
				 double halo, double *k_macs);

/* Blocks of `threads` threads using `shared_bytes` each that one SM holds
 * at once (>= 1 when the block fits at all, 0 when it does not). */
unsigned ap_cost_blocks_per_sm(const ap_target_info *ti, unsigned threads, unsigned shared_bytes);

#endif
