/* fuse.h -- APOLLO's fusion layers over micro-graphs (MLSys 2022,
 * section 4).
 *
 *   Layer I   polyhedral loop fusion inside one micro-graph, with isl
 *             (layer1.c, the only file that includes it): a window
 *             micro-graph's pooled tensor gets a statement of its own, and
 *             the loop nests are fused at the tile level with the tensor's
 *             footprint staged in shared memory.
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

/* ---- Layer I (layer1.c) ------------------------------------------------------------ */

/* isl operations one plan or one emission may spend
 * (isl_ctx_set_max_operations); beyond, Layer I refuses the micro-graph. */
#define AP_LAYER1_MAX_OPERATIONS 4000000

/* A Layer I plan for one micro-graph: its polyhedral model (domains,
 * accesses) and chosen schedule tree as isl text, tile and thread grid,
 * the staged box.  Plain data: usable on any thread. */
typedef struct ap_layer1 ap_layer1;
struct ap_sched;

/* Plans micro-graph m (kind AP_GROUP_WINDOW) for target t with blocks of
 * at most max_threads threads (0: 256): builds the model (statements
 * S_fill for the pooled tensor P and S_out for the window's output space;
 * domains from the static shapes; the read relation from the value
 * builder's index expressions, see layer1.c), a tile of the output whose
 * footprint in P has the least recomputation within the shared-memory
 * budget, the footprint's box by isl_set_get_simple_fixed_box_hull, the
 * schedule tree, and checks it legal by isl's dataflow analysis (method:
 * APOLLO section 4.1; PPCG's tiling and shared-memory promotion, Verdoolaege
 * et al., TACO 2013).  `tile` (may be NULL: the default rule) is a
 * configuration of ap_fuse_layer1_emitter's space (th x tw, or planes),
 * taken when its box fits; the tuner searches that space.  Returns 1 with *out (free with ap_fuse_layer1_free),
 * 0 when Layer I does not apply or refuses (`why`, `cap` bytes, says why:
 * nothing to stage, a non-affine read, no fixed box, isl's operation bound,
 * an illegal schedule), or AP_ENOMEM. */
int ap_fuse_layer1_plan(__ap_keep const ap_mgraph *m, __ap_keep const ap_target_info *t,
			unsigned max_threads, __ap_keep const struct ap_sched *tile, ap_layer1 **out,
			char *why, size_t cap);
/* The kernel of plan l for m (the plan's schedule parsed again on this
 * thread, checked legal, isl's AST converted to kernel IR one node for one
 * node), named `name`, verified (ap_kir_verify).  NULL with `err`:
 * AP_EUNSUPPORTED (the schedule does not parse or is illegal -- the message
 * says which dependence rule failed -- or isl's AST has a form the
 * converter does not take), AP_EINTERNAL (the verifier refused the kernel),
 * AP_ENOMEM. */
__ap_give ap_kir_kernel *ap_fuse_layer1_emit(__ap_keep const ap_mgraph *m, __ap_keep const ap_layer1 *l,
					     __ap_keep const ap_target_info *t, const char *name,
					     ap_error *err);
/* Modelled evaluations of the staged tensor per element (>= 1: the halo
 * of overlapping tiles). */
double ap_fuse_layer1_recompute(__ap_keep const ap_layer1 *l);
/* Milliseconds the plan spent (isl included). */
double ap_fuse_layer1_ms(__ap_keep const ap_layer1 *l);
/* The plan as text: tile, threads, recompute, then isl's forms of the
 * domain, reads, writes and schedule tree, one "key: value" per line.
 * Malloc'd; NULL on ENOMEM. */
__ap_give char *ap_fuse_layer1_text(__ap_keep const ap_layer1 *l);
/* A plan for m whose schedule is the "schedule:" line of `text` (as
 * ap_fuse_layer1_text writes it; PPCG's --load-schedule): the model is
 * built again and the schedule is checked when the kernel is emitted.
 * 1 with *out, 0 with why (Layer I does not apply to m, no schedule line),
 * AP_ENOMEM. */
int ap_fuse_layer1_load(__ap_keep const ap_mgraph *m, __ap_keep const ap_target_info *t,
			const char *text, ap_layer1 **out, char *why, size_t cap);
/* The schedule tree's text (borrowed), and a replacement for it (copied;
 * 0 or AP_ENOMEM). */
const char *ap_fuse_layer1_schedule(__ap_keep const ap_layer1 *l);
int ap_fuse_layer1_set_schedule(ap_layer1 *l, const char *schedule);
ap_layer1 *ap_fuse_layer1_free(__ap_take ap_layer1 *l);   /* accepts NULL */
/* Whether Layer I is wanted for m: a window micro-graph that computes the
 * tensor its pooling reads (else the pooling reads memory and the
 * pointwise emitter builds it). */
bool ap_fuse_layer1_wanted(__ap_keep const ap_mgraph *m);
/* The name of m's pooling node ("" when none), for the driver's cut. */
const char *ap_fuse_layer1_window_name(__ap_keep const ap_mgraph *m);
/* Does plan l pay by the cost model?  A product (convolution, matmul)
 * computed inside the window's kernel is weighed by
 * ap_cost_staged_product_pays with the plan's own recomputation; anything
 * else always pays (it only saves the pooled tensor's write and read).
 * True, or false with why. */
bool ap_fuse_layer1_pays(__ap_keep const ap_mgraph *m, __ap_keep const ap_layer1 *l,
			 __ap_keep const ap_target_info *t, char *why, size_t cap);
/* "tile=1x1x8x32 box=... threads=32x8" (malloc'd; NULL on ENOMEM). */
__ap_give char *ap_fuse_layer1_describe(__ap_keep const ap_layer1 *l);

struct ap_emitter;
/* The emitter record of Layer I's launches (name "layer1"), whose space is
 * the plan's tile: knobs "th" and "tw" (rows and columns of the two
 * innermost output dimensions a block computes: powers of two and the
 * whole extent) or, for a global-pooling window, "planes" (channels
 * staged at once); `choose` is the plan's rule, `valid` the staged box
 * within the shared-memory budget, `traffic` the micro-graph's with its
 * arithmetic times the tile's recompute ratio, a block per tile, and
 * `emit` the kernel of the configuration's plan (the binding's, see
 * ap_fuse_layer1_plan_bound, or one made then; the kernel as
 * ap_fuse_layer1_emit builds it, ap_lower adding the header and
 * parameter extents every emitter's kernel has).  Its binding (ap_bind)
 * is the window analysis, no isl: 1 for a window micro-graph Layer I
 * applies to.  The tuner (server/tune) searches it like an emitter's; it
 * is not in the registry (the driver binds it where Layer I is wanted and
 * the cost model says it pays).
 * host_rule_only: the host keeps the rule. */
extern const struct ap_emitter ap_fuse_layer1_emitter;

struct ap_bound;
/* Plans the micro-graph b binds to Layer I (ap_bind with
 * ap_fuse_layer1_emitter) with its tile *s (no knobs: the rule's), as
 * ap_fuse_layer1_plan does, and keeps the plan in the binding, where the
 * emitter's resolve, traffic and emit read it for that tile (the kernel
 * ap_lower builds on b is the plan's).  1 with *s set to the plan's tile
 * (the rule's, or *s's when its box fits), 0 with `why` (Layer I refuses:
 * see ap_fuse_layer1_plan; or b is not Layer I's), AP_ENOMEM. */
int ap_fuse_layer1_plan_bound(struct ap_bound *b, unsigned max_threads, struct ap_sched *s, char *why,
			      size_t cap);
/* The plan kept in b (borrowed; NULL: none, or b is not Layer I's). */
const ap_layer1 *ap_fuse_layer1_bound_plan(const struct ap_bound *b);

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
