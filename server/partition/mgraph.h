/* mgraph.h -- micro-graphs: the unit of piecewise compilation (APOLLO,
 * MLSys 2022, section 4: "each micro-graph is compiled on its own, layer by
 * layer").
 *
 * An ap_mgraph is self-contained: it owns a small ap_graph holding its
 * nodes (the members the partitioner grouped, plus the views and constant
 * fills it reads through) and every tensor they touch, so that a fusion
 * layer or an emitter can work on it without the partition, on any worker
 * thread.  Inside that graph:
 *   - a tensor produced by one of its nodes is computed by the kernel;
 *     those listed in g->outputs (is_output) are also written to memory,
 *     because another micro-graph or the caller reads them;
 *   - a tensor with no producer is read from memory (g->inputs lists the
 *     non-constant ones, in the program graph's order), except CONST
 *     tensors, which are baked into the kernel.
 * tensor_of[] maps every tensor back to the program graph (the partition's
 * primitive graph), which is how a kernel's parameters are bound to
 * buffers.  Node names are the imported (ONNX) names, for the explain
 * report.
 */
#ifndef AP_MGRAPH_H
#define AP_MGRAPH_H

#include "partition.h"

typedef struct ap_mgraph {
	ap_graph *g;             /* owned; topologically sorted */
	int *tensor_of;          /* per tensor of g: program-graph tensor index */
	int *node_of;            /* per node of g: program-graph node index */
	bool *member;            /* per node of g: a member (else a view or
				    constant fill read through) */
	ap_group_kind kind;      /* APOLLO's class of the micro-graph */
	int root;                /* node of g that defines the iteration space */
	int n_members;           /* nodes of g that are members (views and fills
				    read through are not) */
	int n_groups;
	int *groups;             /* partition groups it covers, ascending: one,
				    or several once Layer II stitched them */
	unsigned layers;         /* AP_LAYER_* bits: layers that changed it */
	char *detail;            /* what a layer did to it, one sentence for the
				    explain report ("" when nothing) */
} ap_mgraph;

/* Builds the micro-graph of nodes `nodes[0..n)` of the program graph `pg`
 * (ascending indices, so topologically sorted), where member[i] says
 * whether nodes[i] is a member (false: a view or constant fill read
 * through).  `outputs` (n_outputs program tensors) are the tensors it
 * writes, in that order.  `kind` and `root` (a program node among
 * `nodes`) describe it; `groups` (n_groups) the partition groups it
 * covers.  Returns NULL with `err` set: AP_ENOMEM, AP_EINTERNAL (an
 * output not produced by one of the nodes, a root not among them). */
__ap_give ap_mgraph *ap_mgraph_extract(__ap_keep const ap_graph *pg, const int *nodes,
				       const bool *member, int n, const int *outputs,
				       int n_outputs, ap_group_kind kind, int root,
				       const int *groups, int n_groups, ap_error *err);

/* The micro-graph of group `gi` of partition `p` (members and absorbed
 * views, written tensors as the partition lists them).  NULL with `err`:
 * AP_ENOMEM, AP_EINVAL (gi out of range). */
__ap_give ap_mgraph *ap_mgraph_of_group(__ap_keep const ap_partition *p, int gi, ap_error *err);

ap_mgraph *ap_mgraph_free(__ap_take ap_mgraph *m);   /* accepts NULL */

/* Names of the imported nodes it computes, each once, in graph order, into
 * a malloc'd array of borrowed strings (valid while `m` lives); *n gets the
 * count.  NULL on ENOMEM (or when m has no nodes, with *n = 0). */
__ap_give const char **ap_mgraph_node_names(__ap_keep const ap_mgraph *m, int *n);

#endif
