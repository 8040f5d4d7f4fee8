/* program.h -- the compiled form of a graph before any backend runs:
 * kernels as source text for the requested target, the launch plan, and
 * the buffers with the workspace layout.  This is what the compiler core
 * (server/driver/pipeline.c: expand -> partition -> Layers I, II ->
 * emit -> Layer III -> print -> plan) hands to the compile job, which runs
 * NVRTC or the host C compiler on each kernel's source and assembles the
 * apollo.Bundle.
 *
 * Kernel ABI, shared by both printers:
 *   CUDA:  extern "C" __global__ void NAME(T0 *p0, T1 *p1, ...)
 *          launched with `grid` x `block` threads and `smem_bytes` of
 *          dynamic shared memory; p_i is bound to the buffer given by the
 *          launch's args[i].
 *   host:  void NAME(void *const *args, unsigned block_begin, unsigned block_end)
 *          runs the blocks whose linear index (x + gx*(y + gy*z)) lies in
 *          [block_begin, block_end); args[i] points at the buffer of param i.
 *          Blocks are independent, so a runtime may split the range over
 *          threads.  Exported from a shared object built with `cc -O2
 *          -shared -fPIC -lm`.  An object holding a kernel with
 *          warp-specialised arms (ROLES) also exports `int ap_host_fault`,
 *          set (never cleared) by a kernel whose arms deadlock -- an
 *          mbarrier wait nothing left can complete; the kernel then returns
 *          at once.  The runtime reads and clears it after each launch and
 *          fails the run.
 */
#ifndef AP_PROGRAM_H
#define AP_PROGRAM_H

#include "../../common/tmap.h"
#include <stdio.h>

#include "../../common/graph.h"
#include "../cost/cost.h"
#include "../kir/kir.h"
#include "../partition/partition.h"

#define AP_PIPELINE_STAGES 9

typedef enum ap_buffer_kind {
	AP_BUF_INPUT = 0,
	AP_BUF_OUTPUT = 1,
	AP_BUF_PARAM = 2,
	AP_BUF_INTERMEDIATE = 3,
	AP_BUF_CONST = 4,        /* a CONST tensor read from memory: `data` travels in the bundle */
} ap_buffer_kind;            /* numbered as apollo.BufferKind */

typedef struct ap_buffer {
	char *name;              /* graph tensor name */
	ap_buffer_kind kind;
	ap_dtype dtype;
	int rank;
	int64_t dims[AP_MAX_RANK];
	uint64_t nbytes;
	uint64_t offset;         /* INTERMEDIATE: byte offset in the workspace (256-aligned) */
	int index;               /* INPUT/OUTPUT: position among graph inputs/outputs; else -1 */
	uint8_t *data;           /* CONST: a copy of the tensor's nbytes bytes (owned); else NULL */
} ap_buffer;

typedef struct ap_kernel_param {
	char *name;
	ap_dtype dtype;
	bool written;
	bool has_tmap;           /* the kernel also takes a tensor map of this
				    param's buffer (ap_kir_tensor_map): one more
				    CUDA parameter after all pointers, in param
				    order, encoded by the runtime */
	ap_tmap_desc tmap;       /* ... described so */
} ap_kernel_param;

typedef struct ap_kernel_src {
	char *name;              /* entry point, unique within the program */
	char *src;               /* the complete translation unit for the
				    program's target: CUDA C (NVRTC) or C11
				    (host); printed once */
	unsigned grid[3], block[3];
	unsigned smem_bytes;     /* dynamic shared memory, bytes */
	int n_params;
	ap_kernel_param *params;
	int n_nodes;
	char **nodes;            /* names of the graph nodes fused into it, over
				    every launch of it (a kernel is shared by
				    content: see ap_launch.nodes for one launch) */
	uint64_t global_bytes;   /* modelled traffic of one launch: bytes of every
				    distinct global buffer read plus every one
				    written */
	int n_members;           /* member (primitive) nodes of the micro-graphs
				    it was first built from, views not counted:
				    1 = not fused, so a refusal cannot split it */
	char *emitter;           /* the emitter(s) and configuration that built
				    it ("row_reduce block=256") */
} ap_kernel_src;

/* One micro-graph of a launch.  A launch covers one micro-graph, or
 * several when Layer III (parallelism stitching) merged independent ones:
 * each then owns a range of the kernel's blocks. */
typedef struct ap_launch_part {
	const char *category;    /* the micro-graph's kind, static */
	int n_nodes;
	char **nodes;            /* imported (ONNX) node names it computes */
	int subgraph;            /* index into ap_program.subgraphs */
	unsigned block_begin;    /* its blocks: [block_begin, block_begin + blocks) */
	unsigned blocks;
	unsigned layers;         /* AP_LAYER_* bits (partition/mgraph.h): the
				    fusion layers that built it */
	char *detail;            /* what those layers did, one sentence ("" if
				    nothing) */
	const char *emitter;     /* the emitter that built it (static; NULL when
				    it launches nothing) */
	char *schedule;          /* its configuration, "knob=value ..." (owned) */
	double recompute;        /* modelled evaluations per element of the
				    intermediates it computes (the most
				    recomputed one; 1 = each once; 0 = not
				    modelled: products on tiles) */
	char *layer1;            /* Layer I's plan as text (domain, accesses,
				    schedule tree; ap_fuse_layer1_text), NULL
				    when Layer I did not schedule it (owned) */
	bool tuned;              /* a tuning record or search chose `schedule`: */
	uint8_t tune_sig[32];    /* its signature (ap_tune_signature) */
	ap_traffic traffic;      /* what the cost model expects of `schedule`
				    (the emitter's ap_traffic; zero when it
				    launches nothing): the background tuner
				    re-prices it with ptxas's figures */
} ap_launch_part;

typedef struct ap_launch {
	int kernel;              /* index into kernels */
	int n_args;
	int *args;               /* buffer index per kernel param */
	/* --explain data (Bundle.plan[i], apollo.Launch): */
	int n_nodes;
	char **nodes;            /* -> Launch.nodes: the imported (ONNX) node names
				    this launch computes, in graph order, each once
				    (nodes duplicated into several launches --
				    recompute -- appear in each) */
	const char *category;    /* -> Launch.category: the micro-graph's kind
				    ("elementwise", "broadcast", "reduction",
				    "injective", "transpose", "matmul", "conv",
				    "opaque", "whole", "stitched"), or
				    "parallel" when Layer III merged several;
				    static string */
	int subgraph;            /* index into ap_program.subgraphs (the first
				    part's) */
	uint64_t global_bytes;   /* this launch's modelled traffic (bytes) */
	unsigned layers;         /* AP_LAYER_* bits over its parts, plus
				    AP_LAYER_III when it has several */
	int n_parts;
	ap_launch_part *parts;   /* -> Launch.parts, in block order */
	ap_kir_library *library; /* -> Launch.library: a library call computes
				    this launch's product (its params are
				    the launch's args); NULL: none (owned) */
	int library_choice;      /* what chose it: an ap_tune_kind (0 the default
				    rule's cost-model comparison, 1 a search under
				    the cost model, 2 a record of one, 3 a
				    measured record) */
} ap_launch;

/* Why two launches were not fused (-> apollo.Boundary, Bundle.boundaries):
 * one per (producer launch, consumer launch, tensor). */
typedef struct ap_program_boundary {
	int producer;            /* -> Boundary.producer: launch index */
	int consumer;            /* -> Boundary.consumer: launch index */
	char *tensor;            /* -> Boundary.tensor: the tensor crossing */
	const char *reason;      /* -> Boundary.reason: short key, static:
				    "level", "opaque", "keep-whole", "hint",
				    "rule", "shape", "recompute", "size-cap",
				    "cycle", "refused" (never "unknown") */
	char *detail;            /* -> Boundary.detail: one sentence */
} ap_program_boundary;

/* A region between opaque ops (APOLLO's sub-graph): its launches may run
 * as soon as the sub-graphs in deps are done; sub-graphs of one wave are
 * independent of each other. */
typedef struct ap_program_subgraph {
	int n_deps;
	int *deps;               /* sub-graph indices, ascending */
	int wave;
} ap_program_subgraph;

/* The expansion registry's choice for one imported node. */
typedef struct ap_program_op {
	char *node;              /* imported (ONNX) node name */
	const char *op;          /* op type, static ("Softmax") */
	bool opened;             /* opened into primitives (else kept whole) */
	int n_primitives;        /* nodes it became */
} ap_program_op;

typedef struct ap_program {
	ap_kir_target target;    /* what every kernel's src is written for */
	int n_kernels;           /* -> Stats.distinct_kernels */
	ap_kernel_src *kernels;
	int n_launches;          /* -> Stats.kernels (launches, to compare with
				    eager_kernels) */
	ap_launch *launches;     /* run in order */
	int n_buffers;
	ap_buffer *buffers;
	uint64_t workspace_bytes;
	unsigned eager_kernels;  /* -> Stats.eager_kernels: one per imported node,
				    views free */
	/* Measured fusion quality (bytes of modelled global-memory traffic):
	 *   global_bytes -> Stats.global_bytes: sum over launches of each
	 *     launch's distinct buffers, read or written;
	 *   eager_bytes  -> Stats.eager_bytes: the same for one kernel per node
	 *     of the imported graph before expansion (views free, constants
	 *     baked in);
	 *   min_bytes    -> Stats.min_bytes: the floor, never above
	 *     global_bytes: graph inputs, parameters and constants a launch
	 *     reads, the elements the graph's readers touch of each (a slice
	 *     or gather its part only), and outputs a launch writes, once. */
	uint64_t global_bytes, eager_bytes, min_bytes;
	/* Device memory of one run of the plan (bytes; plan.c says why):
	 *   input_bytes  -> Stats.input_bytes: the INPUT buffers;
	 *   output_bytes -> Stats.output_bytes: the OUTPUT buffers (a graph
	 *     output that is an input is counted with the inputs); a training
	 *     forward's outputs include the tensors saved for its backward;
	 *   const_bytes  -> Stats.const_bytes: the CONST buffers the bundle
	 *     carries, which the runtime allocates;
	 *   peak_bytes   -> Stats.peak_bytes: the most device bytes held at
	 *     once while the plan runs, input + output + const +
	 *     workspace_bytes (the runtime holds the whole workspace, laid out
	 *     by liveness, for the run).  Parameters are not counted.
	 * Each sum stops at UINT64_MAX. */
	uint64_t input_bytes, output_bytes, const_bytes, peak_bytes;
	double partition_ms, codegen_ms;
	double layer1_ms;        /* Layer I (isl): plans and its kernels' emission, in codegen_ms */
	/* tuning (ap_build_options.tune), over the kernels of the last round:
	 * configurations from records (measured among them), kernels
	 * searched, configurations evaluated, search time (in codegen_ms);
	 * kernels whose search the wall-time safety limit (ap_tune_hooks.
	 * budget_ms) cut short or skipped: then the bundle depends on the
	 * machine's load */
	unsigned tune_hits, tune_measured, tune_searched, tune_tried, tune_capped;
	double tune_ms;
	/* --explain */
	ap_fuse_level fusion;  /* the level used (never DEFAULT) */
	int n_boundaries;
	ap_program_boundary *boundaries;
	int n_subgraphs;
	ap_program_subgraph *subgraphs;
	int n_ops;
	ap_program_op *ops;      /* one per imported node the registry could open */
	int n_recomputed;        /* primitive nodes duplicated into consumers */
	int n_refused;           /* refusals the pipeline acted on (splits,
				    stitches and merges undone) */
	unsigned layer_count[3]; /* micro-graphs changed by Layer I, II, III
				    (-> Stats.layer_*) */
	double stage_ms[AP_PIPELINE_STAGES];  /* ms per stage (ap_pipeline_stage_name) */
} ap_program;

/* Test hooks of the upward feedback (tests only; the daemon never sets
 * them): lowering refuses any micro-graph of more than refuse_group_nodes
 * members (0 = off), and any of two or more members holding an op of type
 * refuse_op (NULL = off). */
typedef struct ap_build_hooks {
	unsigned refuse_group_nodes;
	const char *refuse_op;
	bool open_all;               /* open elementwise activations too */
	double direct_gflops;        /* > 0: the cost model's figure for a direct
					product loop (ap_target_info.direct_gflops),
					so that tests build Layer I's product-in-window
					kernels on the host, where the measured figure
					keeps products out of windows */
} ap_build_hooks;

/* Runs fn(0..n-1, arg) on a pool of threads and returns when all are done
 * (the daemon's compile helpers); NULL = one after another. */
typedef struct ap_task_pool {
	void (*run)(void *pool, int n, void (*fn)(int i, void *arg), void *arg);
	void *pool;
} ap_task_pool;

typedef struct ap_build_options {
	const char *target;          /* "cpu" (default), "sm_90", "compute_80", ...:
					the printer (CUDA C or host C) and the cost
					model's figures; "host:sm_90": lowered for
					sm_90, printed as host C (the emulated GPU) */
	bool host_check;             /* host C in the checking mode
					(AP_KIR_HOST_CHECK; CompileOptions.host_check) */
	unsigned max_block_threads;  /* 0 = default (256) */
	bool allow_tf32;             /* float32 products may run on TF32 tensor
					cores (CompileOptions.allow_tf32; off by
					default, as in PyTorch) */
	bool tma;                    /* sm_90a GEMM tiles by TMA where they can
					(CompileOptions.tma; ap_target_info.tma) */
	bool unvalidated;            /* the forms not yet run on a GPU wherever they
					fit (CompileOptions.unvalidated; implies tma;
					ap_target_info.unvalidated) */
	/* partition (CompileOptions.fusion, fusion_barriers, keep_whole): */
	ap_fuse_level fusion;      /* 0 = AP_FUSE_DEFAULT (apollo) */
	int n_fusion_barriers;
	char *const *fusion_barriers;  /* node names that start a new kernel */
	int n_keep_whole;
	char *const *keep_whole;             /* op types never to open */
	unsigned max_group_nodes;    /* size cap (member nodes); 0 = default (64) */
	unsigned max_recompute;      /* recompute cap; 0 = default (256) */
	bool no_layer1;              /* Layer I off: pooling windows stay kernels of
					their own (this starting point, for
					benchmarks and tests) */
	const struct ap_tune_hooks *tune;  /* tuning (server/tune/tune.h): records
					      and a search budget; NULL = every
					      kernel on its default rule */
	const ap_build_hooks *hooks; /* tests only; NULL in the daemon */
	const ap_task_pool *pool;    /* per-micro-graph stages run as tasks on it */
	/* Backend hook (upward feedback from the layer below the printers):
	 * called by ap_program_build for every distinct kernel it is about to
	 * keep, with `k` complete (source, params, grid/block, and `nodes`:
	 * the node names of the micro-graphs it covers) and borrowed for the
	 * call only.  Returns 0 to accept it; AP_ENOMEM to fail the build
	 * (AP_ENOMEM); any other non-zero value refuses it, with the reason in
	 * `why->msg`.  A refused kernel is taken apart where its fusion was
	 * made: a Layer III launch into its parts, a Layer II stitched kernel
	 * into its micro-graphs, a fused micro-graph by the partitioner
	 * (boundary reason "refused", detail naming the reason); the pieces
	 * are built and offered again.  A refused single-node kernel fails the
	 * build with AP_ECOMPILE naming the node.  A kernel shared by content
	 * is offered once.  Called on the thread running ap_program_build,
	 * never concurrently within one build.  NULL = every kernel accepted.
	 * Time spent in the hook is not counted in codegen_ms. */
	int (*accept_kernel)(const ap_kernel_src *k, void *user, ap_error *why);
	void *accept_user;           /* passed to accept_kernel, borrowed */
	/* Developers' view of the pipeline: after the stage this names
	 * (ap_pipeline_stage_name: "expand", "partition", "micro-graphs",
	 * "layer I", "layer II", "emit", "layer III", "print", "plan"), each
	 * round writes what the stage left, one line per item, to dump_file
	 * (NULL: stderr; borrowed).  NULL: no dump.  An unknown name fails the
	 * build with AP_EINVAL.  apollo-kernels --dump-after. */
	const char *dump_after;
	FILE *dump_file;
	/* Progress (issue 26, item 4): called as each stage begins, with its
	 * name (ap_pipeline_stage_name's, a static string), on the thread
	 * running ap_program_build; a round the refusals repeat calls it
	 * again.  NULL: not called. */
	void (*stage_begin)(void *user, const char *stage);
	void *stage_user;            /* passed to stage_begin, borrowed */
} ap_build_options;

/* The compiler core (server/driver/pipeline.c), APOLLO's method end to
 * end: opens compound ops (keep_whole aside), partitions the primitive
 * graph into micro-graphs at the chosen fusion level (paper section 3),
 * then, at level apollo, Layer II stitches reductions with their consumers
 * (section 4.2); each micro-graph is lowered to one kernel through an
 * emitter of the schedule layer; Layer III merges independent kernels into
 * one launch (section 4.3); each kernel is printed once for opt->target;
 * then the launch plan and workspace are laid out.  When a layer below
 * refuses what a layer above fused, the fusion is undone where the
 * refusal says and the pieces are built again (upward feedback): fusion
 * never fails a request; the same holds for a kernel opt->accept_kernel
 * (the backend) refuses.  Every graph output is written by some launch.
 * `opt` may be NULL.  Returns NULL with `err` set: AP_EUNSUPPORTED (an op
 * or dtype lowering cannot handle even alone, naming the node; an unknown
 * target), AP_ECOMPILE (accept_kernel refused a single-node kernel: its
 * message, naming the node), AP_EINVAL (dump_after names no stage),
 * AP_ENOMEM, AP_EINTERNAL. */
__ap_give ap_program *ap_program_build(__ap_keep const ap_graph *g,
				       const ap_build_options *opt, ap_error *err);
ap_program *ap_program_free(__ap_take ap_program *p);  /* accepts NULL */

/* The --explain report of a program: per launch its kernel, category,
 * sub-graph, bytes and member nodes, then every boundary with its reason,
 * then the totals.  Text:
 *   launch 3 reduction sub=0 kernel=ap_ReduceSum_... bytes=1024 nodes=[a b]
 *   boundary 2 -> 3 t: rule: a reduction ends its micro-graph
 *   kernels 5 (distinct 4) eager 9 global_bytes ... eager_bytes ... min_bytes ...
 * JSON (json = true): {"fusion":"apollo","launches":[{"kernel":..,
 * "category":..,"subgraph":..,"global_bytes":..,"nodes":[..]}],
 * "boundaries":[{"producer":..,"consumer":..,"tensor":..,"reason":..,
 * "detail":..}],"stats":{"kernels":..,"distinct_kernels":..,
 * "eager_kernels":..,"global_bytes":..,"eager_bytes":..,"min_bytes":..,
 * "peak_bytes":..,"input_bytes":..,"output_bytes":..,"const_bytes":..,
 * "workspace_bytes":..,"layers":{..}}}; the text ends with a line
 *   peak_bytes ... input_bytes ... output_bytes ... const_bytes ... workspace_bytes ...
 * (ap_program's memory figures, bytes).
 * Returns 0 or AP_EIO. */
int ap_program_explain(const ap_program *p, FILE *f, bool json);

/* Names of the pipeline's stages, in order ("expand", "partition",
 * "micro-graphs", "layer I", "layer II", "emit", "layer III", "print",
 * "plan"); NULL past the last.  ap_program.stage_ms is indexed alike. */
const char *ap_pipeline_stage_name(int i);

#endif
