/* partition.h -- APOLLO's partition phase (MLSys 2022, section 3): opening
 * compound ops (expand.c), then sub-graphs and micro-graphs (partition.c).
 *
 * ap_partition_expand turns a validated graph into a graph of primitives:
 * each op with an entry in the expansion registry (Softmax, LayerNorm,
 * BatchNorm, Gemm, ReduceMean, Gelu, Mish, ...) is either opened into a
 * small sub-graph of elementwise, broadcast, reduction, transpose and
 * matmul nodes, or kept whole; the choice is made per op and recorded.
 * Every node made from an original node carries that node's name (names
 * are then not unique), so a kernel can list the ONNX nodes it fused.
 * Tensor indices of the original graph are kept; new tensors are appended.
 *
 * ap_partition_build groups the nodes of a primitive graph into
 * micro-graphs (one kernel each) inside sub-graphs (regions between opaque
 * ops).  The partition is explicit data -- groups with their member nodes,
 * kind, written and read tensors, sub-graph, and for every edge between two
 * groups the reason that kept them apart -- so it can be dumped, explained
 * and refined (ap_partition_cut, the upward feedback of lowering).
 */
#ifndef AP_PARTITION_H
#define AP_PARTITION_H

#include <stdio.h>

#include "../../common/graph.h"

/* How much the partitioner may fuse; numbered as apollo.FusionLevel. */
typedef enum ap_fuse_level {
	AP_FUSE_DEFAULT = 0,   /* the default: apollo */
	AP_FUSE_NONE = 1,      /* one kernel per primitive */
	AP_FUSE_RULES = 2,     /* rules (1)-(5): elementwise, broadcast, reduction */
	AP_FUSE_APOLLO = 3,    /* every rule, injective joins, recompute, Layers II-III */
} ap_fuse_level;

/* Fusion layers (APOLLO section 4), as bits of ap_mgraph.layers and
 * ap_launch.layers. */
#define AP_LAYER_I 1u    /* polyhedral loop fusion inside the micro-graph */
#define AP_LAYER_II 2u   /* memory stitching: reductions with their consumers */
#define AP_LAYER_III 4u  /* parallelism stitching: independent kernels, one launch */

/* "none", "rules", "apollo" ("apollo" for AP_FUSE_DEFAULT). */
const char *ap_fuse_level_name(ap_fuse_level level);

/* ---- expand.c ------------------------------------------------------------- */

typedef struct ap_expand_options {
	int n_keep_whole;
	char *const *keep_whole;        /* op types never to open ("Softmax", ...) */
	bool open_all;                  /* open every op that has an expansion, the
					   elementwise activations too (by default
					   those stay whole: the lowering computes
					   them natively, as exactly and as fused) */
} ap_expand_options;

/* One registry decision: original node `node` (index in the graph given to
 * ap_partition_expand) of op `op` was opened into `n_primitives` nodes, or
 * kept whole (then `n_primitives` counts the nodes of its sealed group:
 * the primitives the lowering computes it with, all in one kernel). */
typedef struct ap_expand_choice {
	int node;
	ap_op op;
	bool opened;
	int n_primitives;
} ap_expand_choice;

typedef struct ap_expand_choices {
	int n;
	ap_expand_choice *items;
} ap_expand_choices;

/* True when the registry has an expansion for `op`. */
bool ap_partition_has_expansion(ap_op op);

/* Returns a new graph in which the ops of `g` that have an expansion are
 * opened into primitives (see expand.c for each rule) or kept whole, every
 * other node copied as it is.  An op is kept whole when it is listed in
 * opt->keep_whole or when it is an elementwise activation and !open_all;
 * a compound op kept whole is still written as its primitives (the lowering
 * has no other form for it) but they carry the attribute "_whole" (an INT,
 * the same for all of them) and ap_partition_build seals them into one
 * group of kind AP_GROUP_WHOLE.  `opt` may be NULL (defaults).  `g` must be
 * validated (topologically sorted, normalised attributes).  The result
 * keeps g's tensors at the same indices, g's inputs and outputs, and is
 * topologically sorted.  When `choices` is not NULL it receives one entry
 * per node of `g` with an expansion (free with ap_expand_choices_clear).
 * NULL with `err` set: AP_ENOMEM, AP_EUNSUPPORTED (a compound op in a form
 * not handled, naming the node). */
__ap_give ap_graph *ap_partition_expand(__ap_keep const ap_graph *g, const ap_expand_options *opt,
					ap_expand_choices *choices, ap_error *err);
void ap_expand_choices_clear(ap_expand_choices *c);

/* Internal (partition.c uses it to clone nodes): appends a copy of `node`
 * with the given inputs and outputs and all its attributes to `g`.
 * Returns the node index or a negative AP_E* code. */
int ap__partition_copy_node(ap_graph *g, const ap_node *node, const int *inputs,
			    const int *outputs);

/* ---- partition.c ---------------------------------------------------------- */

/* Group kinds: APOLLO's classes of micro-graphs, named after the op that
 * defines the group's iteration space. */
typedef enum ap_group_kind {
	AP_GROUP_ELEMWISE = 0,   /* elementwise chain, one iteration space */
	AP_GROUP_BROADCAST = 1,  /* elementwise + broadcast ops */
	AP_GROUP_REDUCTION = 2,  /* producers + one reduction that ends the group */
	AP_GROUP_OPAQUE = 3,     /* one opaque op (LRN, ...): a sub-graph boundary */
	AP_GROUP_INJECTIVE = 4,  /* slice, concat, gather, pad, tile, split, expand
				    (+ elementwise producers) */
	AP_GROUP_TRANSPOSE = 5,  /* elementwise/broadcast + transpose (rule 6) */
	AP_GROUP_MATMUL = 6,     /* a matmul with its prologue and epilogue */
	AP_GROUP_CONV = 7,       /* a convolution with its prologue and epilogue */
	AP_GROUP_WHOLE = 8,      /* a compound op kept whole (keep_whole) */
	AP_GROUP_STITCHED = 9,   /* reductions stitched with their consumers
				    (Layer II; never made by the partitioner) */
	AP_GROUP_ATTENTION = 10, /* QK^T -> softmax -> PV stitched into one
				    (Layer II; never made by the partitioner) */
	AP_GROUP_WINDOW = 11,    /* a pooling window (MaxPool, AveragePool, or a
				    global pooling reduction over a product's
				    output: ap_node_is_window) with its producers
				    and elementwise consumers, at level apollo;
				    scheduled by Layer I (server/fuse/layer1.c),
				    which stages the pooled tensor on chip */
} ap_group_kind;
#define AP_GROUP_KIND_COUNT 12

/* Why two groups joined by a producer -> consumer edge were not merged. */
typedef enum ap_boundary_reason {
	AP_WHY_LEVEL = 0,        /* the fusion level has no rule for it */
	AP_WHY_OPAQUE = 1,       /* an opaque op */
	AP_WHY_WHOLE = 2,        /* a compound op kept whole */
	AP_WHY_HINT = 3,         /* a fusion barrier named by the user */
	AP_WHY_RULE = 4,         /* no aggregation rule fuses these kinds */
	AP_WHY_SHAPE = 5,        /* the merged group would write two shapes */
	AP_WHY_RECOMPUTE = 6,    /* fusing would recompute too much / save no bytes */
	AP_WHY_SIZE = 7,         /* the group size cap */
	AP_WHY_CYCLE = 8,        /* merging would make the group graph cyclic */
	AP_WHY_REFUSED = 9,      /* lowering refused the merged group */
	AP_WHY_STITCH = 10,      /* Layer II could not stitch them (a row does
				    not fit on chip, ...) */
} ap_boundary_reason;
#define AP_WHY_COUNT 11

typedef struct ap_group {
	ap_group_kind kind;
	int root;                /* node that defines the iteration space (the
				    reduction, matmul, conv, opaque op, or the
				    last node) */
	int subgraph;            /* index into ap_partition.subgraphs */
	int n_nodes;
	int *nodes;              /* members, topological order */
	int n_views;
	int *views;              /* nodes read through, absorbed as index remaps:
				    views (Reshape, Identity) and Expands of a
				    constant */
	int n_outputs;
	int *outputs;            /* tensors the group writes: read by another
				    group or listed among the graph outputs */
	int n_inputs;
	int *inputs;             /* tensors it reads from memory (INPUT, PARAM or
				    written by an earlier group); CONST excluded */
	int n_refusals;
	int *refusals;           /* lineage of feedback splits (indices into
				    ap_partition.refusals), outermost first */
} ap_group;

/* One producer -> consumer edge between two groups, by node: `tensor`
 * (written by `producer`, a member of one group) is read, possibly through
 * views, by `consumer`, a member of another. */
typedef struct ap_boundary {
	int producer, consumer;  /* node indices */
	int tensor;
	ap_boundary_reason reason;
	char *detail;            /* one sentence for people */
} ap_boundary;

/* A region between opaque ops: groups connected by edges that do not pass
 * through an opaque op (an opaque group is a sub-graph of its own).  Two
 * sub-graphs with no path between them may run in parallel. */
typedef struct ap_subgraph {
	int n_deps;
	int *deps;               /* sub-graphs it reads from (indices, ascending) */
	int wave;                /* 0 for sources, else 1 + the largest wave of a
				    dependency: sub-graphs of one wave are
				    independent */
} ap_subgraph;

typedef struct ap_partition_priv ap_partition_priv;

typedef struct ap_partition {
	const ap_graph *g;       /* the primitive graph the groups refer to: the
				    one given to ap_partition_build, or (when
				    producers were duplicated) a rewritten copy
				    the partition owns; tensor indices agree */
	ap_fuse_level level;
	int n_groups;
	ap_group *groups;        /* topological order: producers first */
	int *group_of;           /* per node of g: its group, -1 for nodes read
				    through (see views) and dead nodes */
	int n_subgraphs;
	ap_subgraph *subgraphs;
	int n_boundaries;
	ap_boundary *boundaries; /* one per (producer node, consumer node,
				    tensor) edge between two groups */
	int n_refusals;
	char **refusals;         /* why lowering refused a group (feedback) */
	int n_recomputed;        /* nodes duplicated into consumers (recompute) */
	ap_partition_priv *priv;
} ap_partition;

typedef struct ap_partition_options {
	ap_fuse_level level;       /* AP_FUSE_DEFAULT = AP_FUSE_APOLLO */
	unsigned max_group_nodes;    /* size cap, member nodes per group;
					0 = AP_PARTITION_MAX_GROUP_NODES */
	unsigned max_recompute;      /* cap on the evaluations per element that a
					prologue or a duplicated producer adds;
					0 = AP_PARTITION_MAX_RECOMPUTE */
	int n_barriers;
	char *const *barriers;       /* node names that must start a new kernel */
	const struct ap_target_info *target;  /* the compile target: whether a
					product pays inside a pooling window's
					Layer I kernel (ap_cost_staged_product_pays);
					NULL: never */
	bool no_layer1;              /* no pooling window joins a group (Layer I off) */
} ap_partition_options;

#define AP_PARTITION_MAX_GROUP_NODES 64
#define AP_PARTITION_MAX_RECOMPUTE 256

/* Groups the live nodes of the primitive graph `g` (see
 * ap_partition_expand) into micro-graphs by APOLLO's aggregation rules,
 * producer kind x consumer kind -> group kind:
 *   (1) elementwise + elementwise -> elementwise
 *   (2) broadcast + elementwise   -> broadcast   (either order)
 *   (3) broadcast + broadcast     -> broadcast
 *   (4) elementwise + reduction   -> reduction
 *   (5) broadcast + reduction     -> reduction
 *   (6) elementwise/broadcast + transpose -> transpose,
 *       matmul + elementwise/broadcast -> matmul (epilogue),
 *       elementwise/broadcast + matmul -> matmul (prologue),
 *       conv + elementwise/broadcast -> conv, elementwise/broadcast + conv -> conv;
 *   injective ops (slice, concat, gather, pad, tile, split, transpose) join
 *   the group they feed, as index maps.
 * Level AP_FUSE_NONE makes one group per primitive, AP_FUSE_RULES uses
 * (1)-(5) only (XLA's and TVM's default), AP_FUSE_APOLLO everything.  At
 * every level a Transpose made by opening a Gemm (transA/transB) and read
 * only by its MatMul stays with it: it is the MatMul's operand layout.
 * A reduction ends its group.  Merges are tried for every producer ->
 * consumer edge, consumers in topological order, until none applies; a
 * merge is made only if
 *   - neither side is opaque or a compound op kept whole, and the consumer
 *     node is not a fusion barrier (opt->barriers);
 *   - the merged group writes tensors of one shape (a reduction group: only
 *     the reduction's result);
 *   - the result of a matmul or conv is evaluated once per element (no
 *     broadcast of it inside the group), and a prologue adds at most
 *     opt->max_recompute evaluations per element of a primitive;
 *   - the group stays within opt->max_group_nodes members;
 *   - the group graph stays acyclic: no path leads from the producer group
 *     to the consumer group through a third group (reachability, by a
 *     depth-first search bounded by a topological order of the groups that
 *     each merge updates locally, after Pearce and Kelly, JEA 2006).
 * Then (level apollo) a cheap producer group (elementwise, broadcast,
 * injective; no reduction, matmul or conv) read by consumers it may not
 * join -- because its results are read elsewhere -- is duplicated into
 * those consumers when the modelled global-memory bytes go down
 * (recompute), and the grouping is redone, until nothing changes.
 * Views (Reshape, Identity) and Expands of a constant are index remaps
 * absorbed by their readers; a view that is a graph output becomes a copy
 * group.  Nodes whose outputs nobody needs are dropped.  Sub-graphs are
 * the connected regions between opaque ops.  Every edge between two
 * groups gets a boundary record with its reason.
 * `g` is borrowed and must outlive the partition; `opt` may be NULL.
 * NULL with `err`: AP_ENOMEM, AP_EINTERNAL. */
__ap_give ap_partition *ap_partition_build(__ap_keep const ap_graph *g,
					   const ap_partition_options *opt, ap_error *err);
ap_partition *ap_partition_free(__ap_take ap_partition *p);  /* accepts NULL */

/* Upward feedback: a layer below (lowering, the backend) could not handle
 * group `gi` (which has at least two members) for the reason `why`.
 * Splits it where the refusal says: the members in `cut` (n_cut program
 * node indices) are separated from the others, each maximal run of
 * members in topological order that is wholly inside or wholly outside
 * the cut becoming a group of its own (so the groups stay acyclic and in
 * topological order: the pieces take gi, gi + 1, ...; later groups move
 * up).  With n_cut == 0 (a refusal that names no place, such as a size
 * limit) the members are cut in two halves.  Every edge between two
 * pieces gets a boundary with reason AP_WHY_REFUSED and detail "refused by
 * WHO: WHY" (`who` names the layer that refused: "lowering", "the
 * backend"; NULL = "lowering").  Returns the number of pieces (>= 2), or
 * AP_EINVAL (gi out of range, a single member, or a cut that leaves one
 * piece), AP_ENOMEM. */
int ap_partition_cut(ap_partition *p, int gi, const int *cut, int n_cut, const char *who,
		     const char *why);

/* Readers of program tensor t: the nodes (of p->g, not read-through
 * views) that read it, directly or through views; *n gets the count. */
const int *ap_partition_readers(const ap_partition *p, int t, int *n);

/* Is node n of g the window op of a window micro-graph (Layer I)?  A
 * MaxPool or AveragePool, or a global pooling written as a reduction:
 * ReduceSum, ReduceMax or ReduceMin over exactly the spatial axes 2..r-1
 * of an NCHW-like input of rank r >= 3 (what GlobalAveragePool and
 * GlobalMaxPool import as, and a framework's mean over H and W).  A
 * pooling always starts a window group; a global-pooling reduction
 * becomes one only when it joins a product's group (check_merge). */
bool ap_node_is_window(const ap_graph *g, const ap_node *n);
/* Shared memory one block of a Layer I kernel stages at most (bytes): small
 * enough for several blocks per SM. */
#define AP_WINDOW_STAGE_BYTES (16 * 1024)

/* "elementwise", "broadcast", "reduction", "opaque", "injective",
 * "transpose", "matmul", "conv", "whole". */
const char *ap_group_kind_name(ap_group_kind kind);
/* Short key of a reason, as in apollo.Boundary.reason: "level", "opaque",
 * "keep-whole", "hint", "rule", "shape", "recompute", "size-cap",
 * "cycle", "refused", "stitch". */
const char *ap_boundary_reason_key(ap_boundary_reason r);

/* Writes the partition as text, one line per group then one per boundary:
 *   group 3 reduction sub=0 root=ReduceSum(sm) nodes=[Sub(sm) Exp(sm) ReduceSum(sm)] views=[]
 *     out=[s:float32[2,1]] in=[x:float32[2,5], m:float32[2,1]]
 *   edge 2 -> 3 m: rule: a reduction ends its micro-graph
 * (a group line is one line; wrapped here).  Returns 0 or AP_EIO. */
int ap_partition_dump(const ap_partition *p, FILE *f);
/* The same as one JSON object:
 *   {"level":"apollo","groups":[{"kind":..,"subgraph":..,"root":..,
 *    "nodes":[..ONNX names..],"ops":[..],"outputs":[..],"inputs":[..]}],
 *    "boundaries":[{"producer":g,"consumer":g,"tensor":..,"reason":..,
 *    "detail":..}],"subgraphs":[{"wave":..,"deps":[..]}]}
 * Returns 0 or AP_EIO. */
int ap_partition_dump_json(const ap_partition *p, FILE *f);

#endif
