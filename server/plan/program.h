/* program.h -- the compiled form of a graph before any backend runs:
 * kernels as source text for both printers, the launch plan, and the
 * buffers with the workspace layout.  This is what the compiler core
 * (partition -> lower -> kir -> plan) hands to the compile job, which runs
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
 *          -shared -fPIC -lm`.
 */
#ifndef AP_PROGRAM_H
#define AP_PROGRAM_H

#include <stdio.h>

#include "../../common/graph.h"

/* How much the partitioner may fuse; numbered as apollo.FusionLevel. */
typedef enum ap_fuse_level {
	AP_FUSE_DEFAULT = 0,   /* the default: apollo */
	AP_FUSE_NONE = 1,      /* one kernel per primitive */
	AP_FUSE_RULES = 2,     /* rules (1)-(5): elementwise, broadcast, reduction */
	AP_FUSE_APOLLO = 3,    /* every rule, injective joins, recompute */
} ap_fuse_level;

typedef enum ap_buffer_kind {
	AP_BUF_INPUT = 0,
	AP_BUF_OUTPUT = 1,
	AP_BUF_PARAM = 2,
	AP_BUF_INTERMEDIATE = 3,
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
} ap_buffer;

typedef struct ap_kernel_param {
	char *name;
	ap_dtype dtype;
	bool written;
} ap_kernel_param;

typedef struct ap_kernel_src {
	char *name;              /* entry point, unique within the program */
	char *cuda_src;          /* complete CUDA C translation unit */
	char *host_src;          /* complete C11 translation unit */
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
	int n_members;           /* member (primitive) nodes of the group it was
				    first lowered from, views not counted: 1 =
				    not fused, so a refusal cannot split it */
} ap_kernel_src;

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
				    "opaque", "whole"); static string */
	int subgraph;            /* index into ap_program.subgraphs */
	uint64_t global_bytes;   /* this launch's modelled traffic (bytes) */
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
	 *   min_bytes    -> Stats.min_bytes: graph inputs, parameters and
	 *     outputs, each touched once (the floor). */
	uint64_t global_bytes, eager_bytes, min_bytes;
	double partition_ms, codegen_ms;
	/* --explain */
	ap_fuse_level fusion;  /* the level used (never DEFAULT) */
	int n_boundaries;
	ap_program_boundary *boundaries;
	int n_subgraphs;
	ap_program_subgraph *subgraphs;
	int n_ops;
	ap_program_op *ops;      /* one per imported node the registry could open */
	int n_recomputed;        /* primitive nodes duplicated into consumers */
	int n_refused;           /* groups lowering refused and the partitioner split */
} ap_program;

typedef struct ap_build_options {
	unsigned max_block_threads;  /* 0 = default (256) */
	/* partition (CompileOptions.fusion, fusion_barriers, keep_whole): */
	ap_fuse_level fusion;      /* 0 = AP_FUSE_DEFAULT (apollo) */
	int n_fusion_barriers;
	char *const *fusion_barriers;  /* node names that start a new kernel */
	int n_keep_whole;
	char *const *keep_whole;             /* op types never to open */
	unsigned max_group_nodes;    /* size cap (member nodes); 0 = default (64) */
	unsigned max_recompute;      /* recompute cap; 0 = default (256) */
	/* test hooks (upward feedback): lowering refuses any group of more than
	 * refuse_group_nodes members (0 = off), and any group of two or more
	 * members holding an op of type refuse_op (NULL = off) */
	unsigned refuse_group_nodes;
	const char *refuse_op;
	bool open_all;               /* tests: open elementwise activations too */
	/* Backend hook (upward feedback from the layer below the printers):
	 * called by ap_program_build for every distinct kernel it is about to
	 * keep, with `k` complete (sources, params, grid/block, and `nodes`:
	 * the node names of the group being lowered) and borrowed for the call
	 * only.  Returns 0 to accept it; AP_ENOMEM to fail the build
	 * (AP_ENOMEM); any other non-zero value refuses it, with the reason in
	 * `why->msg`.  A refused kernel of a fused group (two or more member
	 * nodes) splits that group (ap_partition_split, boundary reason
	 * "refused", detail naming the reason) and its halves are lowered and
	 * offered again; a refused single-node kernel fails the build with
	 * AP_ECOMPILE naming the node.  A kernel shared by content is offered
	 * once.  Called on the thread running ap_program_build (a daemon
	 * worker), never concurrently within one build.  NULL = every kernel
	 * accepted.  Time spent in the hook is not counted in codegen_ms. */
	int (*accept_kernel)(const ap_kernel_src *k, void *user, ap_error *why);
	void *accept_user;           /* passed to accept_kernel, borrowed */
} ap_build_options;

/* Opens compound ops (keep_whole aside), partitions the primitive graph
 * into micro-graphs at the chosen fusion level (APOLLO's rules, paper
 * section 3), lowers each group to one kernel through the kernel IR and
 * prints it for CUDA and for the host, then lays out the launch plan and
 * workspace.  When lowering refuses a fused group, the group is split and
 * lowered again (upward feedback): fusion never fails a request; the same
 * holds for a kernel opt->accept_kernel (the backend) refuses.  Every
 * graph output is written by some launch.  `opt` may be NULL.  Returns
 * NULL with `err` set: AP_EUNSUPPORTED (an op or dtype lowering cannot
 * handle even alone, naming the node), AP_ECOMPILE (accept_kernel refused
 * a single-node kernel: its message, naming the node), AP_ENOMEM,
 * AP_EINTERNAL. */
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
 * "eager_kernels":..,"global_bytes":..,"eager_bytes":..,"min_bytes":..}}.
 * Returns 0 or AP_EIO. */
int ap_program_explain(const ap_program *p, FILE *f, bool json);

/* "none", "rules", "apollo" ("apollo" for AP_FUSE_DEFAULT). */
const char *ap_fuse_level_name(ap_fuse_level level);

#endif
