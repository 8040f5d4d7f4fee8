/* estimate.c -- what compiling a request will cost in memory, judged from
 * the request before anything is built (see ap_compile_estimate in
 * compile.h).
 *
 * Approach: a sum over the graph of fixed costs per node, per tensor and
 * per byte of constant data and attributes, with the node's cost by the
 * category of its op.  The costs are the compiler's measured working set
 * at its worst shape: the partitioner lowers every candidate kernel before
 * horizontal fusion merges them, so a fan-out of N independent nodes holds
 * N kernels' IR at once (daemon VmHWM, issue 29: 10^4 parallel Relu
 * nodes +150 MiB, 15 KiB a node; 2000 parallel MatMuls +74 MiB, 37 KiB a
 * node; a chain of 10^5 Relu nodes, fused as it goes, only 2.3 KiB a
 * node).  Compound ops (LayerNormalization, Softmax, BatchNorm, ...) open
 * into up to a dozen primitives.  So the estimate is an upper bound for
 * real graphs and several times the need of long fused chains.
 *
 * An ONNX model is not decoded here: its top-level nodes (op_type and
 * outputs) and graph inputs are counted by walking the wire format
 * (common/pb_wire.h), and its bytes count as constant data (Constant
 * nodes are copied by the importer).  Nothing here allocates.
 */
#include "compile.h"

#include <string.h>

#include "../../common/graph.h"
#include "../../common/pb_wire.h"
#include "proto/apollo.pb-c.h"

#define NODE_BYTES ((uint64_t)16 << 10)        /* elementwise, movement, reduction */
#define CONTRACTION_BYTES ((uint64_t)64 << 10) /* MatMul, Gemm, Conv: tiled emitters */
#define COMPOUND_BYTES ((uint64_t)192 << 10)   /* opened into up to ~12 primitives */
#define TENSOR_BYTES ((uint64_t)1 << 10)
#define DATA_FACTOR 2                          /* constant bytes: decoded, then the graph's copy */
#define ATTR_ELEM_BYTES 16                     /* an INTS / FLOATS element, decoded and copied */

/* The cost of one node of op `name`; *last / *last_cost remember the
 * previous op (graphs repeat ops, and the op table is searched by name). */
static uint64_t node_bytes(const char *name, size_t len, const char **last, size_t *last_len,
			   uint64_t *last_cost)
{
	char buf[64];
	int op;

	if (*last && *last_len == len && !memcmp(*last, name, len))
		return *last_cost;
	if (len >= sizeof(buf)) {
		op = -1;
	} else {
		memcpy(buf, name, len);
		buf[len] = '\0';
		op = ap_op_lookup(buf);
	}
	*last = name;
	*last_len = len;
	switch (op < 0 ? AP_CAT_OPAQUE : ap_op_category_of((ap_op)op)) {
	case AP_CAT_MATMUL:
	case AP_CAT_CONV:
		return *last_cost = CONTRACTION_BYTES;
	case AP_CAT_COMPOUND:
		return *last_cost = COMPOUND_BYTES;
	default:
		return *last_cost = NODE_BYTES;
	}
}

static void graph_cost(const Apollo__Graph *g, ap_compile_cost *out)
{
	const char *last = NULL;
	size_t last_len = 0;
	uint64_t last_cost = 0, attr = 0, text = 0;

	out->nodes = g->n_nodes;
	out->tensors = g->n_tensors;
	for (size_t i = 0; i < g->n_tensors; i++)
		out->data_bytes += g->tensors[i]->data.len;
	for (size_t i = 0; i < g->n_nodes; i++) {
		const Apollo__Node *n = g->nodes[i];
		const char *op = n->op_type ? n->op_type : "";

		out->bytes += node_bytes(op, strlen(op), &last, &last_len, &last_cost);
		for (size_t a = 0; a < n->n_attrs; a++) {
			attr += n->attrs[a]->n_ints + n->attrs[a]->n_floats;
			text += n->attrs[a]->s ? strlen(n->attrs[a]->s) : 0;
		}
	}
	out->bytes += out->tensors * TENSOR_BYTES + out->data_bytes * DATA_FACTOR +
		      attr * ATTR_ELEM_BYTES + text * DATA_FACTOR;
}

/* ONNX: ModelProto.graph (7) -> GraphProto.node (1) { output (2), op_type
 * (4) } and GraphProto.input (11), from the wire.  Bytes that do not walk
 * stop the count (the importer will refuse them). */
static void onnx_cost(const uint8_t *p, size_t n, ap_compile_cost *out)
{
	const char *last = NULL;
	size_t last_len = 0;
	uint64_t last_cost = 0;
	const uint8_t *graph;
	size_t glen;
	ap_pbw r, nr;
	ap_pbw_field f, nf;

	out->data_bytes = n;
	out->bytes = n * DATA_FACTOR;
	if (ap_pbw_single_field(p, n, 7, &graph, &glen) != 1)
		return;
	ap_pbw_init(&r, graph, glen);
	while (ap_pbw_next(&r, &f) == 1) {
		const uint8_t *op = NULL;
		size_t op_len = 0;

		if (f.wire != 2)
			continue;
		if (f.number == 11) {
			out->tensors++;
			continue;
		}
		if (f.number != 1)
			continue;
		out->nodes++;
		ap_pbw_init(&nr, f.data, f.len);
		while (ap_pbw_next(&nr, &nf) == 1) {
			if (nf.wire == 2 && nf.number == 2)
				out->tensors++;
			else if (nf.wire == 2 && nf.number == 4)
				op = nf.data, op_len = nf.len;
		}
		out->bytes += node_bytes(op ? (const char *)op : "", op_len, &last, &last_len,
					 &last_cost);
	}
	out->bytes += out->tensors * TENSOR_BYTES;
}

void ap_compile_estimate(const Apollo__CompileRequest *req, ap_compile_cost *out)
{
	memset(out, 0, sizeof(*out));
	if (req->source_case == APOLLO__COMPILE_REQUEST__SOURCE_GRAPH && req->graph)
		graph_cost(req->graph, out);
	else if (req->source_case == APOLLO__COMPILE_REQUEST__SOURCE_ONNX_MODEL)
		onnx_cost(req->onnx_model.data, req->onnx_model.len, out);
}
