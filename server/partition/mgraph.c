/* mgraph.c -- extracting self-contained micro-graphs (see mgraph.h).
 *
 * Extraction copies the chosen nodes of the program graph, in their
 * (topological) order, into a fresh ap_graph, creating each tensor they
 * touch on first use: CONST tensors with their bytes, tensors produced by
 * a chosen node as values, every other tensor as an input of the
 * micro-graph (kind kept: INPUT, PARAM, or VALUE for an intermediate
 * another micro-graph writes).  Work and memory are linear in the size of
 * the chosen nodes, not of the program graph: program tensors are mapped
 * to local ones through a small open-addressing table.
 */
#include "mgraph.h"

#include <stdlib.h>
#include <string.h>

ap_mgraph *ap_mgraph_free(ap_mgraph *m)
{
	if (!m)
		return NULL;
	ap_graph_free(m->g);
	free(m->tensor_of);
	free(m->node_of);
	free(m->member);
	free(m->groups);
	free(m->detail);
	free(m);
	return NULL;
}

/* A map from program tensors to (local index, produced here), open
 * addressing with linear probing, sized to twice the tensors the chosen
 * nodes name. */
typedef struct tmap {
	int cap;                /* a power of two */
	int *key;               /* program tensor, -1 = empty */
	int *local;             /* local index, -1 = not created yet */
	bool *produced;
} tmap;

static int tmap_init(tmap *m, int n)
{
	m->cap = 16;
	while (m->cap < 2 * n)
		m->cap *= 2;
	m->key = malloc((size_t)m->cap * sizeof(int));
	m->local = malloc((size_t)m->cap * sizeof(int));
	m->produced = calloc((size_t)m->cap, sizeof(bool));
	if (!m->key || !m->local || !m->produced)
		return AP_ENOMEM;
	for (int i = 0; i < m->cap; i++)
		m->key[i] = m->local[i] = -1;
	return 0;
}

static void tmap_free(tmap *m)
{
	free(m->key);
	free(m->local);
	free(m->produced);
}

/* The slot of program tensor t (t >= 0), inserted when absent. */
static int tmap_slot(tmap *m, int t)
{
	unsigned h = (unsigned)t * 2654435761u;
	int i = (int)(h & (unsigned)(m->cap - 1));

	while (m->key[i] != -1 && m->key[i] != t)
		i = (i + 1) & (m->cap - 1);
	m->key[i] = t;
	return i;
}

typedef struct xctx {
	const ap_graph *pg;
	ap_mgraph *m;
	tmap map;
	int cap_tensors;
} xctx;

/* The local tensor for program tensor t, created on first use. */
static int local_tensor(xctx *x, int t)
{
	const ap_tensor *pt;
	ap_tensor_kind kind;
	int idx, slot;

	if (t < 0)
		return -1;
	slot = tmap_slot(&x->map, t);
	if (x->map.local[slot] >= 0)
		return x->map.local[slot];
	pt = &x->pg->tensors[t];
	kind = pt->kind;
	if (x->map.produced[slot])
		kind = AP_TENSOR_VALUE;
	else if (kind == AP_TENSOR_VALUE)
		kind = AP_TENSOR_INPUT;   /* written by another micro-graph */
	idx = ap_graph_add_tensor(x->m->g, pt->name, pt->dtype, pt->rank, pt->dims, kind,
				  kind == AP_TENSOR_CONST ? pt->data : NULL,
				  kind == AP_TENSOR_CONST ? pt->nbytes : 0);
	if (idx < 0)
		return idx;
	if (idx >= x->cap_tensors) {
		int ncap = x->cap_tensors ? 2 * x->cap_tensors : 16;
		int *p;

		while (ncap <= idx)
			ncap *= 2;
		p = realloc(x->m->tensor_of, (size_t)ncap * sizeof(int));
		if (!p)
			return AP_ENOMEM;
		x->m->tensor_of = p;
		x->cap_tensors = ncap;
	}
	x->m->tensor_of[idx] = t;
	x->map.local[slot] = idx;
	return idx;
}

/* g->inputs ordered by program tensor index (insertion sort: few). */
static void sort_by_program_order(ap_mgraph *m)
{
	int *a = m->g->inputs;

	for (int i = 1; i < m->g->n_inputs; i++) {
		int v = a[i], j = i - 1;

		while (j >= 0 && m->tensor_of[a[j]] > m->tensor_of[v]) {
			a[j + 1] = a[j];
			j--;
		}
		a[j + 1] = v;
	}
}

static int append_int(int **arr, int *n, int v)
{
	int *p = realloc(*arr, (size_t)(*n + 1) * sizeof(int));

	if (!p)
		return AP_ENOMEM;
	p[(*n)++] = v;
	*arr = p;
	return 0;
}

__ap_give ap_mgraph *ap_mgraph_extract(const ap_graph *pg, const int *nodes, const bool *member,
				       int n, const int *outputs, int n_outputs, ap_group_kind kind,
				       int root, const int *groups, int n_groups, ap_error *err)
{
	xctx x;
	ap_mgraph *m = calloc(1, sizeof(*m));
	int *ins = NULL, *outs = NULL, max_io = 1, n_refs = 0;

	memset(&x, 0, sizeof(x));
	for (int i = 0; i < n; i++)
		n_refs += pg->nodes[nodes[i]].n_inputs + pg->nodes[nodes[i]].n_outputs;
	if (!m || tmap_init(&x.map, n_refs) < 0)
		goto nomem;
	m->root = -1;
	m->kind = kind;
	m->g = ap_graph_new(pg->nodes[root].name);
	m->node_of = malloc(((size_t)n + 1) * sizeof(int));
	m->member = malloc(((size_t)n + 1) * sizeof(bool));
	m->groups = malloc(((size_t)n_groups + 1) * sizeof(int));
	m->detail = ap_strdup("");
	if (!m->g || !m->node_of || !m->member || !m->groups || !m->detail)
		goto nomem;
	memcpy(m->groups, groups, (size_t)n_groups * sizeof(int));
	m->n_groups = n_groups;
	x.pg = pg;
	x.m = m;
	for (int i = 0; i < n; i++) {
		const ap_node *node = &pg->nodes[nodes[i]];

		for (int o = 0; o < node->n_outputs; o++)
			if (node->outputs[o] >= 0)
				x.map.produced[tmap_slot(&x.map, node->outputs[o])] = true;
		if (node->n_inputs > max_io)
			max_io = node->n_inputs;
		if (node->n_outputs > max_io)
			max_io = node->n_outputs;
	}
	ins = malloc((size_t)max_io * sizeof(int));
	outs = malloc((size_t)max_io * sizeof(int));
	if (!ins || !outs)
		goto nomem;
	for (int i = 0; i < n; i++) {
		const ap_node *node = &pg->nodes[nodes[i]];
		int ln;

		for (int j = 0; j < node->n_inputs; j++)
			if ((ins[j] = local_tensor(&x, node->inputs[j])) < -1)
				goto nomem;
		for (int j = 0; j < node->n_outputs; j++)
			if ((outs[j] = local_tensor(&x, node->outputs[j])) < -1)
				goto nomem;
		ln = ap__partition_copy_node(m->g, node, ins, outs);
		if (ln < 0)
			goto nomem;
		m->node_of[ln] = nodes[i];
		m->member[ln] = member[i];
		if (member[i])
			m->n_members++;
		if (nodes[i] == root)
			m->root = ln;
	}
	if (m->root < 0) {
		ap_error_set(err, AP_EINTERNAL, pg->nodes[root].name, NULL,
			     "micro-graph: its root is not among its nodes");
		return ap_mgraph_free(m);
	}
	for (int i = 0; i < n_outputs; i++) {
		int t = outputs[i], slot = t >= 0 && t < pg->n_tensors ? tmap_slot(&x.map, t) : -1;

		if (slot < 0 || !x.map.produced[slot] || x.map.local[slot] < 0) {
			ap_error_set(err, AP_EINTERNAL, NULL, t >= 0 && t < pg->n_tensors ?
				     pg->tensors[t].name : NULL,
				     "micro-graph: a written tensor is not made by its nodes");
			return ap_mgraph_free(m);
		}
		t = x.map.local[slot];
		m->g->tensors[t].is_output = true;
		if (append_int(&m->g->outputs, &m->g->n_outputs, t) < 0)
			goto nomem;
	}
	/* inputs: tensors read from memory, in program order */
	for (int lt = 0; lt < m->g->n_tensors; lt++) {
		const ap_tensor *x0 = &m->g->tensors[lt];

		if (x0->kind == AP_TENSOR_VALUE || x0->kind == AP_TENSOR_CONST)
			continue;
		if (append_int(&m->g->inputs, &m->g->n_inputs, lt) < 0)
			goto nomem;
	}
	sort_by_program_order(m);
	tmap_free(&x.map);
	free(ins);
	free(outs);
	return m;
nomem:
	tmap_free(&x.map);
	free(ins);
	free(outs);
	ap_mgraph_free(m);
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory extracting a micro-graph");
	return NULL;
}

__ap_give ap_mgraph *ap_mgraph_of_group(const ap_partition *p, int gi, ap_error *err)
{
	const ap_group *grp;
	int n, i = 0, j = 0, k = 0;
	int *nodes;
	bool *member;
	ap_mgraph *m;

	if (gi < 0 || gi >= p->n_groups) {
		ap_error_set(err, AP_EINVAL, NULL, NULL, "no group %d", gi);
		return NULL;
	}
	grp = &p->groups[gi];
	n = grp->n_nodes + grp->n_views;
	nodes = malloc(((size_t)n + 1) * sizeof(int));
	member = malloc(((size_t)n + 1) * sizeof(bool));
	if (!nodes || !member) {
		free(nodes);
		free(member);
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory extracting a micro-graph");
		return NULL;
	}
	/* members and views are both ascending: merge them */
	while (i < grp->n_nodes || j < grp->n_views) {
		if (j >= grp->n_views || (i < grp->n_nodes && grp->nodes[i] < grp->views[j])) {
			member[k] = true;
			nodes[k++] = grp->nodes[i++];
		} else {
			member[k] = false;
			nodes[k++] = grp->views[j++];
		}
	}
	m = ap_mgraph_extract(p->g, nodes, member, n, grp->outputs, grp->n_outputs, grp->kind,
			      grp->root, &gi, 1, err);
	free(nodes);
	free(member);
	return m;
}

__ap_give const char **ap_mgraph_node_names(const ap_mgraph *m, int *n)
{
	const char **names = malloc(((size_t)m->g->n_nodes + 1) * sizeof(char *));

	*n = 0;
	if (!names)
		return NULL;
	for (int i = 0; i < m->g->n_nodes; i++) {
		const char *s = m->g->nodes[i].name;
		bool seen = false;

		/* linear search: a micro-graph is small (the size cap) */
		for (int j = *n - 1; j >= 0 && !seen; j--)
			if (strcmp(names[j], s) == 0)
				seen = true;
		if (!seen)
			names[(*n)++] = s;
	}
	return names;
}
