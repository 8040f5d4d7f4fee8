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

#include "../../common/graph.h"

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
	char **nodes;            /* names of the graph nodes fused into it */
	uint64_t global_bytes;   /* modelled traffic: bytes of every distinct
				    global buffer read plus every one written */
} ap_kernel_src;

typedef struct ap_launch {
	int kernel;              /* index into kernels */
	int n_args;
	int *args;               /* buffer index per kernel param */
} ap_launch;

typedef struct ap_program {
	int n_kernels;
	ap_kernel_src *kernels;
	int n_launches;
	ap_launch *launches;     /* run in order */
	int n_buffers;
	ap_buffer *buffers;
	uint64_t workspace_bytes;
	unsigned eager_kernels;  /* one per imported node, views free */
	uint64_t global_bytes, eager_bytes, min_bytes;
	double partition_ms, codegen_ms;
} ap_program;

typedef struct ap_build_options {
	unsigned max_block_threads;  /* 0 = default (256) */
} ap_build_options;

/* Partitions a validated graph into fusion groups (APOLLO's rules, paper
 * section 3), lowers each group to one kernel through the kernel IR and
 * prints it for CUDA and for the host, then lays out the launch plan and
 * workspace.  Every graph output is written by some launch.  Returns NULL
 * with `err` set: AP_EUNSUPPORTED (an op or dtype lowering cannot handle,
 * naming the node), AP_ENOMEM, AP_EINTERNAL. */
__ap_give ap_program *ap_program_build(__ap_keep const ap_graph *g,
				       const ap_build_options *opt, ap_error *err);
ap_program *ap_program_free(__ap_take ap_program *p);  /* accepts NULL */

#endif
