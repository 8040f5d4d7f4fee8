/* horizontal.c -- Layer III, parallelism stitching (APOLLO section 4.3;
 * see fuse.h).
 *
 * Independent kernels -- the branches of a multi-tail op (Q/K/V
 * projections, the two expand convolutions of a SqueezeNet fire module),
 * the independent gradient reductions of a backward pass -- each launched
 * alone leave most of a large GPU idle and pay a launch each.  Layer III
 * merges them into one launch whose blocks are split by blockIdx ranges:
 *
 *   if (blockIdx.x < g0) { kernel 0 } else if (blockIdx.x < g0 + g1) {
 *   kernel 1 with blockIdx.x - g0 } ...
 *
 * Method:
 *   1. the dependence graph of the micro-graphs (a producer of a tensor ->
 *      each reader) and each micro-graph's ASAP level (longest path from
 *      a source).  Two micro-graphs of one level have no path between
 *      them, and neither do any number of them: a set of one level can be
 *      merged without a cycle;
 *   2. within a level, kernels of the same shape (one-dimensional grid and
 *      block, the same block size, no dynamic shared memory) are packed
 *      greedily, in order, while the cost model says the merged launch is
 *      faster than the parts one after another (ap_cost_time_us: one
 *      launch overhead instead of several, against a grid that may no
 *      longer fit one wave) and the merged kernel stays within the
 *      target's static shared memory, at most MAX_PARTS parts and
 *      MAX_PARAMS parameters;
 *   3. each pack of two or more becomes one kernel: the parts' bodies are
 *      cloned (server/kir/clone.c) under uniform branches on blockIdx.x,
 *      with blockIdx.x shifted by the part's first block;
 *   4. the launches are ordered topologically again, ties by the position
 *      of their first part, so nothing moves when nothing merged.
 * Linear in the micro-graphs and their edges.
 */
#include "fuse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARTS 32
#define MAX_PARAMS 256
#define PLACEHOLDER "ap__kernel__"

void ap_fuse_launches_free(ap_fuse_launch *l, int n)
{
	for (int i = 0; l && i < n; i++) {
		free(l[i].units);
		free(l[i].block_begin);
		free(l[i].blocks);
		free(l[i].args);
		if (l[i].n > 1)
			ap_kir_kernel_free(l[i].kernel);
	}
	free(l);
}

static unsigned grid_blocks(const ap_kir_kernel *k)
{
	return k->grid[0] * k->grid[1] * k->grid[2];
}

/* Appends the parameters of kernel k of unit m to fl->args. */
static void bind_params(ap_fuse_launch *fl, const ap_mgraph *m, const ap_kir_kernel *k)
{
	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];

		if (a->space == AP_KIR_GLOBAL && a->param >= 0 && a->param < k->n_params)
			fl->args[fl->n_args + a->param] = m->tensor_of[a->tensor];
	}
	fl->n_args += k->n_params;
}

static int launch_init(ap_fuse_launch *fl, int n, int n_params)
{
	memset(fl, 0, sizeof(*fl));
	fl->units = malloc((size_t)n * sizeof(int));
	fl->block_begin = malloc((size_t)n * sizeof(unsigned));
	fl->blocks = malloc((size_t)n * sizeof(unsigned));
	fl->args = malloc(((size_t)n_params + 1) * sizeof(int));
	if (!fl->units || !fl->block_begin || !fl->blocks || !fl->args)
		return AP_ENOMEM;
	fl->n = n;
	return 0;
}

/* Static shared memory of a kernel (bytes). */

/* Can kernel k take part in a merge at all? */

/* The merged kernel of the units pack[0..n): a uniform branch per part. */

/* Levels: longest path from a source in the unit dependence graph. */


/* The traffic of a pack: the parts side by side in one grid. */


int ap_fuse_horizontal(const ap_partition *p, const ap_mgraph *const *units,
		       ap_kir_kernel *const *kernels, const ap_traffic *traffic, int n, bool enabled,
		       const bool *no_merge, const ap_target_info *t, ap_fuse_launch **launches,
		       int *n_launches, unsigned *n_merged, ap_error *err)
{
	ap_fuse_launch *out = calloc((size_t)n + 1, sizeof(*out));
	int nl = 0;

	*launches = NULL;
	*n_launches = 0;
	*n_merged = 0;
	if (!out)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (int u = 0; u < n; u++) {
		ap_fuse_launch *fl = &out[nl];

		if (!kernels[u])
			continue;
		if (launch_init(fl, 1, kernels[u]->n_params) < 0) {
			ap_fuse_launches_free(out, nl + 1);
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		}
		nl++;
		fl->units[0] = u;
		fl->block_begin[0] = 0;
		fl->blocks[0] = grid_blocks(kernels[u]);
		fl->kernel = kernels[u];
		bind_params(fl, units[u], kernels[u]);
	}
	*launches = out;
	*n_launches = nl;
	return 0;
}
