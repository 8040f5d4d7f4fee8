/* graph_hash.c -- ap_graph_hash: the canonical SHA-256 of a graph, "the
 * same computation"; ap_graph_hash_named: the same with every tensor and
 * node name in it, the part of every cache key that says "the same
 * bundle" (a bundle binds params and inputs by name and names nodes in its
 * plan: two graphs may share a bundle only when those names agree).
 *
 * A Merkle hash over the graph's structure, with no name in it:
 *   - a node hashes its op, its attributes (sorted by name, so their order
 *     does not matter) and the hashes of its input tensors, in slot order;
 *   - a VALUE tensor hashes its producer's hash, its output slot, dtype and
 *     shape; an INPUT its position among the graph inputs, dtype and shape;
 *     a CONST its dtype, shape and bytes; a PARAM its dtype, shape and its
 *     rank among the params sorted by first use (below);
 *   - the graph hashes its input and output tensors in order, then the
 *     sorted multiset of all node hashes (so dead nodes count too).
 * Node order and tensor order never enter, and neither do names -- unless
 * `named`: then every tensor's hash and every node's hash also holds its
 * name, and params that tie on structure are ranked by name.
 * ap_graph_hash_kernel hashes a CONST's bytes only when a kernel bakes it
 * in (small or uniform), else its dtype and shape, and ranks INPUTs by
 * first use like params (an extracted micro-graph lists its inputs in
 * whatever order its producers came, so the same kernel of two layers
 * would differ): "the same kernel".
 *
 * "First use" of a param must itself be free of order and names: pass 1
 * hashes with all params anonymous (dtype and shape only) and gives each
 * param the smallest (consumer hash, slot) over its uses; params sorted by
 * that key get their rank, and pass 2 hashes again with the ranks.  Two
 * params that tie are used in structurally identical places, so swapping
 * them gives an isomorphic graph.
 *
 * Requires a validated graph (nodes topologically ordered).
 */
#include "graph.h"

#include <stdlib.h>
#include <string.h>

typedef struct hbuf {
	uint8_t h[32];
} hbuf;

static void put_i64(ap_sha256_ctx *c, int64_t v)
{
	uint8_t b[8];

	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)v >> (8 * i));
	ap_sha256_update(c, b, 8);
}

static void put_f64(ap_sha256_ctx *c, double v)
{
	uint64_t u;

	memcpy(&u, &v, 8);
	put_i64(c, (int64_t)u);
}

static void put_str(ap_sha256_ctx *c, const char *s)
{
	size_t n = s ? strlen(s) : 0;

	put_i64(c, (int64_t)n);
	ap_sha256_update(c, s, n);
}

static void put_shape(ap_sha256_ctx *c, const ap_tensor *t)
{
	put_i64(c, t->dtype);
	put_i64(c, t->rank);
	for (int i = 0; i < t->rank; i++)
		put_i64(c, t->dims[i]);
}

static int cmp_attr(const void *a, const void *b)
{
	const ap_attr *x = *(const ap_attr *const *)a, *y = *(const ap_attr *const *)b;

	return strcmp(x->name ? x->name : "", y->name ? y->name : "");
}

static void put_attr(ap_sha256_ctx *c, const ap_attr *a)
{
	put_str(c, a->name);
	put_i64(c, a->type);
	switch (a->type) {
	case AP_ATTR_INT: put_i64(c, a->i); break;
	case AP_ATTR_FLOAT: put_f64(c, a->f); break;
	case AP_ATTR_STRING: put_str(c, a->s); break;
	case AP_ATTR_INTS:
		put_i64(c, a->n_ints);
		for (int i = 0; i < a->n_ints; i++)
			put_i64(c, a->ints[i]);
		break;
	case AP_ATTR_FLOATS:
		put_i64(c, a->n_floats);
		for (int i = 0; i < a->n_floats; i++)
			put_f64(c, a->floats[i]);
		break;
	}
}

/* Whether a kernel bakes CONST t into its source: at most bake_max
 * elements, or every element the same (a scalar then). */
static bool baked(const ap_tensor *t, int64_t bake_max)
{
	size_t es = ap_dtype_size(t->dtype);
	const uint8_t *d = t->data;

	if (ap_tensor_numel(t) <= bake_max || !es || !d)
		return true;
	for (size_t off = es; off + es <= t->nbytes; off += es)
		if (memcmp(d, d + off, es))
			return false;
	return true;
}

/* Hash of every tensor and node; param_rank[t] = rank of PARAM t or -1;
 * with `named` the names too. */
static int hash_pass(const ap_graph *g, bool named, int64_t bake_max, const int *input_pos,
		     const int *param_rank, hbuf *th, hbuf *nh, const ap_attr **scratch)
{
	static const hbuf zero;

	for (int t = 0; t < g->n_tensors; t++) {
		const ap_tensor *ten = &g->tensors[t];
		ap_sha256_ctx *c;

		th[t] = zero;
		if (ten->kind == AP_TENSOR_VALUE)
			continue;
		c = ap_sha256_new();
		if (!c)
			return AP_ENOMEM;
		switch (ten->kind) {
		case AP_TENSOR_INPUT:
			put_str(c, "input");
			put_i64(c, input_pos[t]);
			put_shape(c, ten);
			break;
		case AP_TENSOR_CONST:
			if (bake_max >= 0 && !baked(ten, bake_max)) {
				/* a kernel reads it from a buffer: its values do not
				 * change the kernel */
				put_str(c, "const buffer");
				put_shape(c, ten);
				break;
			}
			put_str(c, "const");
			put_shape(c, ten);
			put_i64(c, (int64_t)ten->nbytes);
			ap_sha256_update(c, ten->data, ten->nbytes);
			break;
		default:
			put_str(c, "param");
			put_i64(c, param_rank[t]);
			put_shape(c, ten);
			break;
		}
		if (named)
			put_str(c, ten->name);
		ap_sha256_final(c, th[t].h);
	}
	for (int n = 0; n < g->n_nodes; n++) {
		const ap_node *node = &g->nodes[n];
		ap_sha256_ctx *c = ap_sha256_new();

		if (!c)
			return AP_ENOMEM;
		put_str(c, "node");
		put_str(c, ap_op_name(node->op));
		if (named)
			put_str(c, node->name);
		for (int a = 0; a < node->n_attrs; a++)
			scratch[a] = &node->attrs[a];
		qsort(scratch, (size_t)node->n_attrs, sizeof(*scratch), cmp_attr);
		put_i64(c, node->n_attrs);
		for (int a = 0; a < node->n_attrs; a++)
			put_attr(c, scratch[a]);
		put_i64(c, node->n_inputs);
		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i];

			put_i64(c, t >= 0);
			if (t >= 0 && t < g->n_tensors)
				ap_sha256_update(c, th[t].h, 32);
		}
		put_i64(c, node->n_outputs);
		for (int k = 0; k < node->n_outputs; k++)
			put_i64(c, node->outputs[k] >= 0);
		ap_sha256_final(c, nh[n].h);
		for (int k = 0; k < node->n_outputs; k++) {
			int t = node->outputs[k];

			if (t < 0 || t >= g->n_tensors)
				continue;
			c = ap_sha256_new();
			if (!c)
				return AP_ENOMEM;
			put_str(c, "value");
			ap_sha256_update(c, nh[n].h, 32);
			put_i64(c, k);
			put_shape(c, &g->tensors[t]);
			if (named)
				put_str(c, g->tensors[t].name);
			ap_sha256_final(c, th[t].h);
		}
	}
	return 0;
}

typedef struct param_key {
	int tensor;
	uint8_t key[33];   /* consumer hash + slot (0xff... when unused) */
	uint8_t self[32];  /* the param's own anonymous hash */
	const char *name;  /* named hashes: breaks ties; else NULL */
} param_key;

static int cmp_param(const void *a, const void *b)
{
	const param_key *x = a, *y = b;
	int r = memcmp(x->key, y->key, sizeof(x->key));

	if (!r)
		r = memcmp(x->self, y->self, sizeof(x->self));
	if (!r && x->name && y->name)
		r = strcmp(x->name, y->name);
	return r;
}

static int cmp_hbuf(const void *a, const void *b)
{
	return memcmp(a, b, 32);
}

/* Ranks the tensors of `kind` by first use: the smallest (consumer node
 * hash, slot) over their uses in pass 1's hashes, then their own hash
 * (then their name when `named`); rank[t] gets each one's rank.  Returns
 * how many there are.  pk has room for every tensor. */
static int rank_by_first_use(const ap_graph *g, ap_tensor_kind kind, bool named, const hbuf *th,
			     const hbuf *nh, param_key *pk, int *rank)
{
	int n = 0;

	for (int t = 0; t < g->n_tensors; t++) {
		if (g->tensors[t].kind != kind)
			continue;
		pk[n].tensor = t;
		memset(pk[n].key, 0xff, sizeof(pk[n].key));
		memcpy(pk[n].self, th[t].h, 32);
		pk[n].name = named ? (g->tensors[t].name ? g->tensors[t].name : "") : NULL;
		rank[t] = n++;
	}
	for (int nd = 0; nd < g->n_nodes; nd++) {
		const ap_node *node = &g->nodes[nd];

		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i];
			uint8_t key[33];
			param_key *p;

			if (t < 0 || t >= g->n_tensors || g->tensors[t].kind != kind)
				continue;
			p = &pk[rank[t]];
			memcpy(key, nh[nd].h, 32);
			key[32] = (uint8_t)(i < 255 ? i : 255);
			if (memcmp(key, p->key, sizeof(key)) < 0)
				memcpy(p->key, key, sizeof(key));
		}
	}
	qsort(pk, (size_t)n, sizeof(*pk), cmp_param);
	for (int r = 0; r < n; r++)
		rank[pk[r].tensor] = r;
	return n;
}

static int graph_hash(const ap_graph *g, bool named, int64_t bake_max, uint8_t out[32])
{
	int *input_pos = calloc((size_t)g->n_tensors + 1, sizeof(int));
	int *param_rank = calloc((size_t)g->n_tensors + 1, sizeof(int));
	hbuf *th = calloc((size_t)g->n_tensors + 1, sizeof(hbuf));
	hbuf *nh = calloc((size_t)g->n_nodes + 1, sizeof(hbuf));
	param_key *pk = calloc((size_t)g->n_tensors + 1, sizeof(param_key));
	int max_attrs = 1, n_params = 0;
	bool kernel = bake_max >= 0 && !named;   /* inputs by first use, not position */
	const ap_attr **scratch;
	ap_sha256_ctx *c;
	int rc = AP_ENOMEM;

	for (int n = 0; n < g->n_nodes; n++)
		if (g->nodes[n].n_attrs > max_attrs)
			max_attrs = g->nodes[n].n_attrs;
	scratch = calloc((size_t)max_attrs, sizeof(*scratch));
	memset(out, 0, 32);
	if (!input_pos || !param_rank || !th || !nh || !pk || !scratch)
		goto done;
	for (int t = 0; t < g->n_tensors; t++) {
		input_pos[t] = -1;
		param_rank[t] = -1;
	}
	for (int i = 0; i < g->n_inputs; i++)
		if (!kernel && g->inputs[i] >= 0 && g->inputs[i] < g->n_tensors)
			input_pos[g->inputs[i]] = i;

	/* pass 1: anonymous params (and, for a kernel, inputs); rank them by
	 * first use */
	if (hash_pass(g, named, bake_max, input_pos, param_rank, th, nh, scratch) < 0)
		goto done;
	n_params = rank_by_first_use(g, AP_TENSOR_PARAM, named, th, nh, pk, param_rank);
	if (kernel)
		rank_by_first_use(g, AP_TENSOR_INPUT, false, th, nh, pk, input_pos);

	/* pass 2: with the ranks */
	if (hash_pass(g, named, bake_max, input_pos, param_rank, th, nh, scratch) < 0)
		goto done;
	c = ap_sha256_new();
	if (!c)
		goto done;
	put_str(c, named ? "apollo-graph-named-v1" : bake_max >= 0 ? "apollo-graph-kernel-v1"
							      : "apollo-graph-v1");
	put_i64(c, g->n_inputs);
	if (kernel) {
		/* each input's hash holds its rank: sorted, their order is gone */
		int n = 0;

		for (int i = 0; i < g->n_inputs; i++)
			if (g->inputs[i] >= 0 && g->inputs[i] < g->n_tensors)
				memcpy(pk[n++].key, th[g->inputs[i]].h, 32);
		for (int i = 0; i < n; i++)
			for (int j = i + 1; j < n; j++)
				if (memcmp(pk[j].key, pk[i].key, 32) < 0) {
					param_key tmp = pk[i];
					pk[i] = pk[j];
					pk[j] = tmp;
				}
		for (int i = 0; i < n; i++)
			ap_sha256_update(c, pk[i].key, 32);
	} else {
		for (int i = 0; i < g->n_inputs; i++)
			if (g->inputs[i] >= 0 && g->inputs[i] < g->n_tensors)
				ap_sha256_update(c, th[g->inputs[i]].h, 32);
	}
	put_i64(c, g->n_outputs);
	for (int i = 0; i < g->n_outputs; i++)
		if (g->outputs[i] >= 0 && g->outputs[i] < g->n_tensors)
			ap_sha256_update(c, th[g->outputs[i]].h, 32);
	put_i64(c, n_params);
	qsort(nh, (size_t)g->n_nodes, sizeof(hbuf), cmp_hbuf);
	put_i64(c, g->n_nodes);
	for (int n = 0; n < g->n_nodes; n++)
		ap_sha256_update(c, nh[n].h, 32);
	ap_sha256_final(c, out);
	rc = 0;
done:
	free(input_pos);
	free(param_rank);
	free(th);
	free(nh);
	free(pk);
	free(scratch);
	return rc;
}

int ap_graph_hash(const ap_graph *g, uint8_t out[32])
{
	return graph_hash(g, false, -1, out);
}

int ap_graph_hash_named(const ap_graph *g, uint8_t out[32])
{
	return graph_hash(g, true, -1, out);
}

int ap_graph_hash_kernel(const ap_graph *g, int64_t bake_max, uint8_t out[32])
{
	return graph_hash(g, false, bake_max < 0 ? 0 : bake_max, out);
}
