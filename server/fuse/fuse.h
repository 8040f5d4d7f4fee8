/* fuse.h -- APOLLO's fusion layers over micro-graphs (MLSys 2022,
 * section 4).
 *
 *   Layer I   (a later issue) polyhedral loop fusion inside one
 *             micro-graph, with isl; the only folder that will include it.
 *   Layer II  memory stitching (stitch.c): a reduction micro-graph is
 *             stitched with the micro-graphs that consume its result (and
 *             other reductions over the same rows) into one micro-graph of
 *             kind "stitched", which the stitched-reduction emitter turns
 *             into one kernel keeping each row on chip.
 *   Layer III parallelism stitching (horizontal.c): independent kernels
 *             become one launch whose blocks are split by blockIdx ranges.
 *
 * Each layer takes micro-graphs and returns micro-graphs (or launches of
 * them); decisions use the cost model (server/cost), and a decision a
 * lower layer refuses is undone through the per-group flags the driver
 * passes back in (no_stitch, no_merge).
 */
#ifndef AP_FUSE_H
#define AP_FUSE_H

#include "../cost/cost.h"
#include "../kir/kir.h"
#include "../partition/mgraph.h"

/* ---- Layer II (stitch.c) ---------------------------------------------------------- */

/* Memory stitching.  (*ms)[0..*n) are the micro-graphs of the partition's
 * groups, in group order (ms[i] covers group i).  A reduction micro-graph
 * is merged with every consumer micro-graph that reads its rows at the
 * element or the row they were reduced from -- elementwise and broadcast
 * consumers, and other reductions over the same rows (LayerNorm's mean
 * and variance, Softmax's max and sum) -- when the result stays acyclic,
 * no group involved has no_stitch set, and a row fits on chip for target
 * t (the row of every reduced tensor held in registers or shared memory,
 * by the cost model's limits).  A stitched micro-graph replaces its parts
 * (which are freed) at the position of its first part, with kind
 * AP_GROUP_STITCHED, layers |= AP_LAYER_II and a detail sentence; the
 * array shrinks (*n) and stays in topological order.  Where a stitch was
 * considered and refused because a row does not fit, the partition's
 * boundary records between the two groups get reason AP_WHY_STITCH and a
 * detail saying so (`p` is updated for the explain report only).
 * *n_stitched receives the number of micro-graphs Layer II changed (the
 * stitched ones made).  0, or AP_ENOMEM with `err` set. */
int ap_fuse_stitch(ap_partition *p, ap_mgraph ***ms, int *n, const bool *no_stitch,
		   const ap_target_info *t, unsigned *n_stitched, ap_error *err);

/* ---- Layer III (horizontal.c) ------------------------------------------------------ */

/* One launch: the micro-graphs it runs and its kernel. */
typedef struct ap_fuse_launch {
	int n;                   /* micro-graphs (units) in it, >= 1 */
	int *units;              /* their indices, in block order */
	unsigned *block_begin;   /* per unit: first block of its range */
	unsigned *blocks;        /* per unit: its blocks */
	ap_kir_kernel *kernel;   /* the unit's kernel (n == 1, borrowed) or the
				    merged one (n > 1, owned) */
	int n_args;
	int *args;               /* per kernel parameter: the program-graph
				    tensor bound to it */
} ap_fuse_launch;

/* Parallelism stitching.  units[0..n) are micro-graphs in topological
 * order with their kernels (NULL: nothing to launch) and modelled traffic.
 * When `enabled`, independent kernels (no path between their micro-graphs
 * in the dependence graph) of compatible shape (one-dimensional grids,
 * the same block size) are merged into one launch while the cost model
 * says the merged launch is faster than the parts launched one after
 * another (ap_cost_time_us: the launch overhead saved against a grid that
 * no longer fits one wave), none of their groups has no_merge set, and
 * the merged kernel stays within the target's shared-memory and
 * parameter limits.  Returns the launches in an order where every
 * producer runs before its consumers, in *launches / *n_launches (free
 * with ap_fuse_launches_free); *n_merged receives the number of
 * micro-graphs that went into merged launches.  0, or AP_ENOMEM. */
int ap_fuse_horizontal(const ap_partition *p, const ap_mgraph *const *units,
		       ap_kir_kernel *const *kernels, const ap_traffic *traffic, int n, bool enabled,
		       const bool *no_merge, const ap_target_info *t, ap_fuse_launch **launches,
		       int *n_launches, unsigned *n_merged, ap_error *err);
void ap_fuse_launches_free(ap_fuse_launch *l, int n);

/* ---- shared (order.c) ------------------------------------------------------------- */

/* Topological order of a graph of n nodes given as CSR (off[n + 1], adj:
 * edges u -> adj[off[u] .. off[u + 1])), ties broken by the smallest
 * key[] (Kahn's algorithm, A. B. Kahn, CACM 1962): order[0..n) receives
 * the nodes.  0, AP_EINTERNAL (a cycle), AP_ENOMEM. */
int ap__fuse_toposort(int n, const int *off, const int *adj, const int *key, int *order);

#endif
