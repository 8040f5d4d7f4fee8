/* validate.c -- ap_graph_validate: the one gate every graph passes, whether
 * it came off the wire (apollo.Graph), out of the ONNX importer or from a
 * test.  Nothing downstream re-checks what is checked here.
 *
 * Order of the checks, cheapest and most basic first, so that each later
 * check may rely on the earlier ones:
 *   1. tensors: rank, dtype, kind, dims >= 0, element count within
 *      AP_MAX_ELEMENTS, CONST data size, unique names;
 *   2. nodes: known op, every index in range, unique names, each output a
 *      VALUE tensor produced by this node only;
 *   3. every VALUE tensor has its producer; graph inputs are exactly the
 *      INPUT tensors; outputs are VALUE tensors, listed once;
 *   4. topological sort by depth-first search over producers (iterative,
 *      so a long chain cannot overflow a worker's stack), keeping the given
 *      order where it is already valid; a node met again while still on the
 *      search path is on a cycle and is named;
 *   5. ap_op_check on every node, in topological order.
 * On success the nodes are permuted into that order and every tensor's
 * producer and is_output are set.  On error the graph is left unchanged.
 */
#include "ops_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- a small set of strings (open addressing, FNV-1a) -------------------- */

typedef struct name_set {
	const char **slots;
	size_t cap;
} name_set;

/* FNV-1a-style string hash (see ops_internal.h). */
uint64_t ap__fnv1a(const char *s)
{
	uint64_t h = 14695981039346656037ull;

	while (*s)
		h = (h ^ (uint8_t)*s++) * 1099511628211ull;
	return h;
}

static int set_init(name_set *s, size_t n)
{
	s->cap = 16;
	while (s->cap < 2 * n + 16)
		s->cap *= 2;
	s->slots = calloc(s->cap, sizeof(*s->slots));
	return s->slots ? 0 : AP_ENOMEM;
}

/* Inserts `name`; returns 1 when it was already there. */
static int set_add(name_set *s, const char *name)
{
	size_t i = (size_t)ap__fnv1a(name) & (s->cap - 1);

	while (s->slots[i]) {
		if (strcmp(s->slots[i], name) == 0)
			return 1;
		i = (i + 1) & (s->cap - 1);
	}
	s->slots[i] = name;
	return 0;
}

static bool dtype_ok(ap_dtype dt)
{
	return dt == AP_DT_F32 || dt == AP_DT_F64 || dt == AP_DT_F16 || dt == AP_DT_BF16 ||
	       dt == AP_DT_I32 || dt == AP_DT_I64 || dt == AP_DT_BOOL;
}

static int check_tensors(const ap_graph *g, ap_error *err)
{
	name_set names;
	int rc = 0;

	if (set_init(&names, (size_t)g->n_tensors) < 0)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (int i = 0; i < g->n_tensors && rc == 0; i++) {
		const ap_tensor *t = &g->tensors[i];
		const char *name = t->name ? t->name : "";

		if (t->rank < 0 || t->rank > AP_MAX_RANK) {
			rc = ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
					  "tensor '%s' has rank %d (0..%d supported)", name, t->rank,
					  AP_MAX_RANK);
			break;
		}
		for (int d = 0; d < t->rank; d++)
			if (t->dims[d] < 0) {
				rc = ap_error_set(err, AP_ETOOLARGE, NULL, name,
						  "tensor '%s' has negative dimension %lld (dim %d)",
						  name, (long long)t->dims[d], d);
				break;
			}
		if (rc)
			break;
		if (ap_tensor_numel(t) < 0) {
			rc = ap_error_set(err, AP_ETOOLARGE, NULL, name,
					  "tensor '%s' has more than %lld elements", name,
					  (long long)AP_MAX_ELEMENTS);
			break;
		}
		if (!dtype_ok(t->dtype)) {
			rc = ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
					  "tensor '%s' has dtype %s (float32, float64, int32, int64, bool supported)",
					  name, ap_dtype_name(t->dtype));
			break;
		}
		if ((int)t->kind < AP_TENSOR_VALUE || t->kind > AP_TENSOR_CONST) {
			rc = ap_error_set(err, AP_EINVAL, NULL, name, "tensor '%s' has kind %d",
					  name, (int)t->kind);
			break;
		}
		if (t->kind == AP_TENSOR_CONST) {
			size_t want = (size_t)ap_tensor_numel(t) * ap_dtype_size(t->dtype);

			if (t->nbytes != want || (want > 0 && !t->data)) {
				rc = ap_error_set(err, AP_EINVAL, NULL, name,
						  "constant '%s' carries %zu bytes, its shape needs %zu",
						  name, t->data ? t->nbytes : 0, want);
				break;
			}
		}
		if (t->kind == AP_TENSOR_PARAM && !name[0]) {
			rc = ap_error_set(err, AP_EINVAL, NULL, NULL,
					  "parameter tensor %d has no name to bind it by", i);
			break;
		}
		if (name[0] && set_add(&names, name)) {
			rc = ap_error_set(err, AP_EINVAL, NULL, name, "two tensors are named '%s'", name);
			break;
		}
	}
	free(names.slots);
	return rc;
}

/* Checks the nodes' indices and fills producer[] (tensor -> node). */
static int check_nodes(const ap_graph *g, int *producer, ap_error *err)
{
	name_set names;
	int rc = 0;

	if (set_init(&names, (size_t)g->n_nodes) < 0)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (int t = 0; t < g->n_tensors; t++)
		producer[t] = -1;
	for (int n = 0; n < g->n_nodes && rc == 0; n++) {
		const ap_node *node = &g->nodes[n];
		const char *name = node->name ? node->name : "";

		if ((int)node->op < 0 || node->op >= AP_OP_COUNT) {
			rc = ap_error_set(err, AP_EUNSUPPORTED, name, NULL, "node '%s' has unknown op %d",
					  name, (int)node->op);
			break;
		}
		if (name[0] && set_add(&names, name)) {
			rc = ap_error_set(err, AP_EINVAL, name, NULL, "two nodes are named '%s'", name);
			break;
		}
		if (node->n_inputs < 0 || node->n_outputs < 0 ||
		    (node->n_inputs > 0 && !node->inputs) || (node->n_outputs > 0 && !node->outputs)) {
			rc = ap_error_set(err, AP_EINVAL, name, NULL, "node '%s' has bad input/output lists",
					  name);
			break;
		}
		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i];

			if (t < -1 || t >= g->n_tensors) {
				rc = ap_error_set(err, AP_EINVAL, name, NULL,
						  "node '%s' input %d refers to tensor %d, which does not exist (%d tensors)",
						  name, i, t, g->n_tensors);
				break;
			}
		}
		for (int k = 0; k < node->n_outputs && rc == 0; k++) {
			int t = node->outputs[k];

			if (t == -1)
				continue;
			if (t < -1 || t >= g->n_tensors) {
				rc = ap_error_set(err, AP_EINVAL, name, NULL,
						  "node '%s' output %d refers to tensor %d, which does not exist (%d tensors)",
						  name, k, t, g->n_tensors);
				break;
			}
			if (g->tensors[t].kind != AP_TENSOR_VALUE) {
				rc = ap_error_set(err, AP_EINVAL, name, g->tensors[t].name,
						  "node '%s' writes '%s', which is an input, parameter or constant",
						  name, g->tensors[t].name);
				break;
			}
			if (producer[t] >= 0) {
				rc = ap_error_set(err, AP_EINVAL, name, g->tensors[t].name,
						  "tensor '%s' is produced twice (by '%s' and by '%s')",
						  g->tensors[t].name, g->nodes[producer[t]].name, name);
				break;
			}
			producer[t] = n;
		}
	}
	free(names.slots);
	return rc;
}

static int check_io(const ap_graph *g, const int *producer, ap_error *err)
{
	char *listed = calloc((size_t)g->n_tensors + 1, 1);
	int rc = 0;

	if (!listed)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	/* every consumed or output VALUE tensor must be produced */
	for (int n = 0; n < g->n_nodes && rc == 0; n++) {
		const ap_node *node = &g->nodes[n];

		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i];

			if (t >= 0 && g->tensors[t].kind == AP_TENSOR_VALUE && producer[t] < 0) {
				rc = ap_error_set(err, AP_EINVAL, node->name, g->tensors[t].name,
						  "node '%s' reads '%s', which no node produces",
						  node->name, g->tensors[t].name);
				break;
			}
		}
	}
	for (int t = 0; t < g->n_tensors && rc == 0; t++)
		if (g->tensors[t].kind == AP_TENSOR_VALUE && producer[t] < 0)
			rc = ap_error_set(err, AP_EINVAL, NULL, g->tensors[t].name,
					  "tensor '%s' is a value that no node produces",
					  g->tensors[t].name);
	if (rc)
		goto done;
	if (g->n_inputs < 0 || (g->n_inputs > 0 && !g->inputs) || g->n_outputs < 0 ||
	    (g->n_outputs > 0 && !g->outputs)) {
		rc = ap_error_set(err, AP_EINVAL, NULL, NULL, "bad input/output lists");
		goto done;
	}
	for (int i = 0; i < g->n_inputs; i++) {
		int t = g->inputs[i];

		if (t < 0 || t >= g->n_tensors) {
			rc = ap_error_set(err, AP_EINVAL, NULL, NULL,
					  "graph input %d refers to tensor %d, which does not exist", i, t);
			goto done;
		}
		if (g->tensors[t].kind != AP_TENSOR_INPUT || listed[t]) {
			rc = ap_error_set(err, AP_EINVAL, NULL, g->tensors[t].name,
					  "graph input %d ('%s') is not an input tensor or is listed twice",
					  i, g->tensors[t].name);
			goto done;
		}
		listed[t] = 1;
	}
	for (int t = 0; t < g->n_tensors; t++)
		if (g->tensors[t].kind == AP_TENSOR_INPUT && !listed[t]) {
			rc = ap_error_set(err, AP_EINVAL, NULL, g->tensors[t].name,
					  "input tensor '%s' is not listed among the graph inputs",
					  g->tensors[t].name);
			goto done;
		}
	if (g->n_outputs == 0) {
		rc = ap_error_set(err, AP_EINVAL, NULL, NULL, "the graph has no outputs");
		goto done;
	}
	for (int i = 0; i < g->n_outputs; i++) {
		int t = g->outputs[i];

		if (t < 0 || t >= g->n_tensors) {
			rc = ap_error_set(err, AP_EINVAL, NULL, NULL,
					  "graph output %d refers to tensor %d, which does not exist", i, t);
			goto done;
		}
		if (g->tensors[t].kind != AP_TENSOR_VALUE || listed[t] == 2) {
			rc = ap_error_set(err, AP_EINVAL, NULL, g->tensors[t].name,
					  "graph output %d ('%s') must be a value produced by a node, listed once",
					  i, g->tensors[t].name);
			goto done;
		}
		listed[t] = 2;
	}
done:
	free(listed);
	return rc;
}

/* Depth-first topological sort; order[] receives node indices. */
static int topo_sort(const ap_graph *g, const int *producer, int *order, ap_error *err)
{
	char *color = calloc((size_t)g->n_nodes + 1, 1);
	int *stack = malloc(((size_t)g->n_nodes + 1) * sizeof(int));
	int *slot = malloc(((size_t)g->n_nodes + 1) * sizeof(int));
	int n_order = 0, rc = 0;

	if (!color || !stack || !slot) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto done;
	}
	for (int root = 0; root < g->n_nodes && rc == 0; root++) {
		int sp = 0;

		if (color[root])
			continue;
		stack[sp] = root;
		slot[sp++] = 0;
		color[root] = 1;
		while (sp > 0) {
			int v = stack[sp - 1];
			const ap_node *node = &g->nodes[v];

			if (slot[sp - 1] < node->n_inputs) {
				int t = node->inputs[slot[sp - 1]++], p;

				if (t < 0 || (p = producer[t]) < 0 || color[p] == 2)
					continue;
				if (color[p] == 1) {
					rc = ap_error_set(err, AP_EINVAL, g->nodes[p].name,
							  g->tensors[t].name,
							  "cycle: node '%s' depends on its own output '%s'",
							  g->nodes[p].name, g->tensors[t].name);
					break;
				}
				color[p] = 1;
				stack[sp] = p;
				slot[sp++] = 0;
				continue;
			}
			color[v] = 2;
			order[n_order++] = v;
			sp--;
		}
	}
done:
	free(color);
	free(stack);
	free(slot);
	return rc;
}

int ap_graph_validate(ap_graph *g, ap_error *err)
{
	int *producer = NULL, *order = NULL, *newidx = NULL;
	ap_node *nodes = NULL;
	int rc;

	if (!g)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "no graph");
	if (g->n_tensors < 0 || g->n_nodes < 0 || (g->n_tensors > 0 && !g->tensors) ||
	    (g->n_nodes > 0 && !g->nodes))
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "bad tensor/node arrays");
	rc = check_tensors(g, err);
	if (rc)
		return rc;
	producer = malloc(((size_t)g->n_tensors + 1) * sizeof(int));
	order = malloc(((size_t)g->n_nodes + 1) * sizeof(int));
	newidx = malloc(((size_t)g->n_nodes + 1) * sizeof(int));
	nodes = malloc(((size_t)g->n_nodes + 1) * sizeof(ap_node));
	if (!producer || !order || !newidx || !nodes) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto done;
	}
	rc = check_nodes(g, producer, err);
	if (!rc)
		rc = check_io(g, producer, err);
	if (!rc)
		rc = topo_sort(g, producer, order, err);
	for (int i = 0; !rc && i < g->n_nodes; i++) {
		/* producers must be right for ap_op_check's callers */
		rc = ap_op_check(g, order[i], err);
	}
	if (rc)
		goto done;
	for (int i = 0; i < g->n_nodes; i++) {
		nodes[i] = g->nodes[order[i]];
		newidx[order[i]] = i;
	}
	memcpy(g->nodes, nodes, (size_t)g->n_nodes * sizeof(ap_node));
	for (int t = 0; t < g->n_tensors; t++) {
		g->tensors[t].producer = producer[t] >= 0 ? newidx[producer[t]] : -1;
		g->tensors[t].is_output = false;
	}
	for (int i = 0; i < g->n_outputs; i++)
		g->tensors[g->outputs[i]].is_output = true;
done:
	free(producer);
	free(order);
	free(newidx);
	free(nodes);
	return rc;
}
