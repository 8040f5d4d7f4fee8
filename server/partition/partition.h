/* partition.h -- opening compound ops (expand.c) and grouping the primitive
 * graph into fusion groups (partition.c), APOLLO's first layer (MLSys 2022,
 * section 3).
 *
 * ap_partition_expand turns a validated graph into a graph of primitives:
 * every AP_CAT_COMPOUND op (ReduceMean, ReduceL2, Softmax, LayerNorm,
 * BatchNorm, Gemm, ...) becomes a small sub-graph of elementwise,
 * broadcast, reduction, transpose and matmul nodes.  Every node made from
 * an original node carries that node's name (names are then not unique),
 * so a kernel can list the ONNX nodes it fused.  Tensor indices of the
 * original graph are kept; new tensors are appended.
 *
 * ap_partition_build groups the nodes of a primitive graph.  The partition
 * is explicit data (groups with their member nodes, kind, outputs and
 * inputs) so it can be dumped, explained and refined by later layers.
 */
#ifndef AP_PARTITION_H
#define AP_PARTITION_H

#include <stdio.h>

#include "../../common/graph.h"

/* ---- expand.c ------------------------------------------------------------- */

/* Returns a new graph in which every compound op of `g` is opened into
 * primitives (see expand.c for each rule), other nodes copied as they are.
 * `g` must be validated (topologically sorted, normalised attributes).
 * The result keeps g's tensors at the same indices, g's inputs and outputs,
 * and is topologically sorted.  NULL with `err` set: AP_ENOMEM,
 * AP_EUNSUPPORTED (a compound op in a form not handled, naming the node). */
__ap_give ap_graph *ap_partition_expand(__ap_keep const ap_graph *g, ap_error *err);

/* ---- partition.c ---------------------------------------------------------- */

typedef enum ap_group_kind {
	AP_GROUP_ELEMWISE = 0,   /* elementwise chain, one iteration space */
	AP_GROUP_BROADCAST = 1,  /* elementwise + broadcast ops */
	AP_GROUP_REDUCTION = 2,  /* producers + one reduction that ends the group */
	AP_GROUP_SINGLE = 3,     /* one op with its own kernel (matmul, conv, pool,
				    transpose, concat, gather, ...) */
} ap_group_kind;

typedef struct ap_group {
	ap_group_kind kind;
	int root;                /* node that defines the iteration space (the
				    reduction, the single op, or the last node) */
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
} ap_group;

typedef struct ap_partition {
	const ap_graph *g;       /* borrowed: the primitive graph */
	int n_groups;
	ap_group *groups;        /* topological order: producers first */
	int *group_of;           /* per node: its group, -1 for nodes read
				    through (see views) and dead nodes */
} ap_partition;

/* Groups the live nodes of the primitive graph `g` (no compound ops; see
 * ap_partition_expand) by APOLLO's aggregation rules, producer kind x
 * consumer kind -> group kind:
 *   (1) elementwise + elementwise -> elementwise
 *   (2) broadcast + elementwise   -> broadcast   (either order)
 *   (3) broadcast + broadcast     -> broadcast
 *   (4) elementwise + reduction   -> reduction
 *   (5) broadcast + reduction     -> reduction
 * A merge is made only if the group graph stays acyclic (no path from the
 * producer group to the consumer group through a third group) and every
 * tensor the merged group must write has the iteration space's shape (for
 * a reduction group: only the reduction's output is written).  A reduction
 * ends its group.  Views (Reshape, Identity) and Expands of a constant are
 * index remaps absorbed by their readers; a view that is a graph output
 * becomes a copy group.  A
 * Transpose read only by one MatMul is absorbed into it.  Every other op is
 * a group of its own.  Nodes whose outputs nobody needs are dropped.
 * `g` is borrowed and must outlive the partition.  NULL with `err`:
 * AP_ENOMEM, AP_EINTERNAL. */
__ap_give ap_partition *ap_partition_build(__ap_keep const ap_graph *g, ap_error *err);
ap_partition *ap_partition_free(__ap_take ap_partition *p);  /* accepts NULL */

/* "elementwise", "broadcast", "reduction", "single". */
const char *ap_group_kind_name(ap_group_kind kind);

/* Writes one line per group:
 *   group 3 reduction root=ReduceSum nodes=[Sub Exp ReduceSum] views=[]
 *     out=[s:float32[2,1]] in=[x:float32[2,5], m:float32[2,1]]
 * Returns 0 or AP_EIO. */
int ap_partition_dump(const ap_partition *p, FILE *f);

#endif
