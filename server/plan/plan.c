/* plan.c -- the compiler core's driver: graph in, ap_program out (see
 * program.h).
 *
 *   expand (compound ops opened or kept whole, per op)
 *   -> partition (sub-graphs, micro-graphs, boundary reasons)
 *   -> per group: lower to kernel IR -> print CUDA C and host C -> offer
 *      the kernel to the backend hook (opt->accept_kernel); when lowering
 *      or the backend refuses a fused group, the partitioner splits it and
 *      the halves are lowered instead (upward feedback)
 *   -> buffers, launch plan, workspace layout, explain data.
 *
 * Kernels are named after their content (root op and a hash of both
 * printed sources), so a kernel that two graphs share has one name and one
 * cache entry; within a program, groups that lower to the same kernel
 * share one ap_kernel_src and differ only in their launches' arguments.
 *
 * Buffers: every graph input (kind INPUT, by position), every graph output
 * (OUTPUT, by position), every PARAM tensor a kernel reads (PARAM, by
 * name), and every other tensor a kernel writes (INTERMEDIATE).  Launches
 * run the groups in the partition's topological order; a group whose
 * outputs are all empty needs no launch.  Intermediates are placed in one
 * workspace at 256-byte aligned offsets, reusing space by liveness: a
 * buffer is live from the launch that writes it to the last launch that
 * reads it, and is placed at the lowest offset that overlaps no buffer
 * live at the same time (first fit, in order of definition).
 *
 * Traffic model (bytes): a launch's global_bytes is the size of every
 * distinct buffer it binds (each read once, each written once), and the
 * program's the sum over its launches; eager_bytes sums, over the imported
 * graph's non-view nodes (before expansion), the sizes of their distinct
 * non-constant inputs and outputs (an op-by-op runtime); min_bytes is the
 * graph's inputs, parameters and outputs, each touched once.
 *
 * Explain data: each launch lists the imported node names of its group
 * (members and absorbed views), its kind and sub-graph; each edge between
 * two groups that both have a launch becomes one boundary per (producer
 * launch, consumer launch, tensor) with the partitioner's reason.
 */
#include "program.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lower/lower.h"
#include "../partition/partition.h"

#define WORKSPACE_ALIGN 256
#define REFUSED 1   /* internal: opt->accept_kernel refused a kernel */

static uint64_t tensor_bytes(const ap_tensor *t)
{
	int64_t n = ap_tensor_numel(t);

	return n > 0 ? (uint64_t)n * ap_dtype_size(t->dtype) : 0;
}

const char *ap_fuse_level_name(ap_fuse_level level)
{
	switch (level) {
	case AP_FUSE_NONE: return "none";
	case AP_FUSE_RULES: return "rules";
	default: return "apollo";
	}
}

static void kernel_clear(ap_kernel_src *k)
{
	free(k->name);
	free(k->cuda_src);
	free(k->host_src);
	for (int i = 0; i < k->n_params; i++)
		free(k->params[i].name);
	free(k->params);
	for (int i = 0; i < k->n_nodes; i++)
		free(k->nodes[i]);
	free(k->nodes);
}

ap_program *ap_program_free(__ap_take ap_program *p)
{
	if (!p)
		return NULL;
	for (int i = 0; i < p->n_kernels; i++)
		kernel_clear(&p->kernels[i]);
	free(p->kernels);
	for (int i = 0; i < p->n_launches; i++) {
		free(p->launches[i].args);
		for (int j = 0; j < p->launches[i].n_nodes; j++)
			free(p->launches[i].nodes[j]);
		free(p->launches[i].nodes);
	}
	free(p->launches);
	for (int i = 0; i < p->n_boundaries; i++) {
		free(p->boundaries[i].tensor);
		free(p->boundaries[i].detail);
	}
	free(p->boundaries);
	for (int i = 0; i < p->n_subgraphs; i++)
		free(p->subgraphs[i].deps);
	free(p->subgraphs);
	for (int i = 0; i < p->n_ops; i++)
		free(p->ops[i].node);
	free(p->ops);
	for (int i = 0; i < p->n_buffers; i++)
		free(p->buffers[i].name);
	free(p->buffers);
	free(p);
	return NULL;
}

typedef struct builder {
	const ap_graph *g;           /* the expanded graph */
	ap_program *prog;
	int *buf_of;                 /* per tensor of g: buffer index or -1 */
	int *tensor_of;              /* per buffer: its tensor of g */
	int cap_buffers;
	ap_error *err;
} builder;

static int add_buffer(builder *b, int t, ap_buffer_kind kind, int index)
{
	const ap_tensor *x = &b->g->tensors[t];
	ap_program *p = b->prog;
	ap_buffer *bf;

	if (p->n_buffers == b->cap_buffers) {
		int ncap = b->cap_buffers ? 2 * b->cap_buffers : 16;
		ap_buffer *nb = realloc(p->buffers, (size_t)ncap * sizeof(*nb));
		int *nt;

		if (!nb)
			return AP_ENOMEM;
		p->buffers = nb;
		nt = realloc(b->tensor_of, (size_t)ncap * sizeof(int));
		if (!nt)
			return AP_ENOMEM;
		b->tensor_of = nt;
		b->cap_buffers = ncap;
	}
	b->tensor_of[p->n_buffers] = t;
	bf = &p->buffers[p->n_buffers];
	memset(bf, 0, sizeof(*bf));
	bf->name = ap_strdup(x->name);
	if (!bf->name)
		return AP_ENOMEM;
	bf->kind = kind;
	bf->dtype = x->dtype;
	bf->rank = x->rank;
	for (int i = 0; i < x->rank; i++)
		bf->dims[i] = x->dims[i];
	bf->nbytes = tensor_bytes(x);
	bf->index = index;
	return p->n_buffers++;
}

/* Buffer of tensor t, created on first use (PARAM or INTERMEDIATE). */
static int buffer_for(builder *b, int t)
{
	int idx;

	if (b->buf_of[t] >= 0)
		return b->buf_of[t];
	idx = add_buffer(b, t, b->g->tensors[t].kind == AP_TENSOR_PARAM ? AP_BUF_PARAM
									 : AP_BUF_INTERMEDIATE, -1);
	if (idx >= 0)
		b->buf_of[t] = idx;
	return idx;
}

/* ---- name sets: (owner, name) -> value, open addressing ------------------------ */

/* Kernels by name, and the node names of a list, without a scan of all
 * entries per lookup.  Names are borrowed (they belong to the lists or
 * kernels); `owner` tells lists apart. */
typedef struct name_entry {
	const char *name;            /* NULL: a free slot */
	int owner, value;
} name_entry;

typedef struct name_set {
	name_entry *slots;
	size_t cap, n;               /* cap: a power of two, over twice n */
} name_set;

/* FNV-1a (Fowler, Noll, Vo) over the owner's bytes, then the name's. */
static size_t name_hash(int owner, const char *name, size_t cap)
{
	uint64_t h = 14695981039346656037ull;
	unsigned o = (unsigned)owner;

	for (int i = 0; i < 4; i++, o >>= 8)
		h = (h ^ (o & 0xff)) * 1099511628211ull;
	for (const unsigned char *c = (const unsigned char *)name; *c; c++)
		h = (h ^ *c) * 1099511628211ull;
	return (size_t)h & (cap - 1);
}

static name_entry *name_find(const name_set *s, int owner, const char *name)
{
	size_t i;

	if (s->cap == 0)
		return NULL;
	for (i = name_hash(owner, name, s->cap); s->slots[i].name; i = (i + 1) & (s->cap - 1))
		if (s->slots[i].owner == owner && strcmp(s->slots[i].name, name) == 0)
			return &s->slots[i];
	return NULL;
}

/* Adds (owner, name) -> value; the pair must not be in the set yet. */
static int name_put(name_set *s, int owner, const char *name, int value)
{
	size_t i;

	if (2 * (s->n + 1) >= s->cap) {
		name_set grown = {NULL, s->cap ? 2 * s->cap : 64, 0};

		grown.slots = calloc(grown.cap, sizeof(name_entry));
		if (!grown.slots)
			return AP_ENOMEM;
		for (size_t j = 0; j < s->cap; j++)
			if (s->slots[j].name)
				name_put(&grown, s->slots[j].owner, s->slots[j].name, s->slots[j].value);
		free(s->slots);
		*s = grown;
	}
	for (i = name_hash(owner, name, s->cap); s->slots[i].name; i = (i + 1) & (s->cap - 1))
		;
	s->slots[i].name = name;
	s->slots[i].owner = owner;
	s->slots[i].value = value;
	s->n++;
	return 0;
}

/* Adds name to a list of strings (*cap slots, grown by doubling) unless
 * `seen` has it under `owner`. */
static int add_name(char ***list, int *n, int *cap, const char *name, name_set *seen, int owner)
{
	if (name_find(seen, owner, name))
		return 0;
	if (*n == *cap) {
		int ncap = *cap ? 2 * *cap : 8;
		char **p = realloc(*list, (size_t)ncap * sizeof(char *));

		if (!p)
			return AP_ENOMEM;
		*list = p;
		*cap = ncap;
	}
	(*list)[*n] = ap_strdup(name);
	if (!(*list)[*n])
		return AP_ENOMEM;
	(*n)++;
	return name_put(seen, owner, (*list)[*n - 1], 0);
}

/* Binds every parameter of kernel k to its buffer for launch `ln`. */
static int fill_launch(builder *b, const ap_kir_kernel *k, ap_launch *ln, int kernel_index)
{
	ln->args = calloc((size_t)k->n_params + 1, sizeof(int));
	if (!ln->args)
		return AP_ENOMEM;
	ln->kernel = kernel_index;
	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];
		int bi;

		if (a->space != AP_KIR_GLOBAL || a->param < 0 || a->param >= k->n_params)
			continue;
		bi = buffer_for(b, a->tensor);
		if (bi < 0)
			return bi;
		ln->args[a->param] = bi;
	}
	ln->n_args = k->n_params;
	return 0;
}

/* Fills an empty list with the names of a group's nodes (members and
 * absorbed views, in graph order), each once. */
static int add_group_nodes(builder *b, const ap_group *grp, char ***list, int *n)
{
	name_set seen = {NULL, 0, 0};
	int i = 0, j = 0, rc = 0, cap = *n;

	/* both lists are ascending: merge them */
	while (rc == 0 && (i < grp->n_nodes || j < grp->n_views)) {
		int m;

		if (j >= grp->n_views || (i < grp->n_nodes && grp->nodes[i] < grp->views[j]))
			m = grp->nodes[i++];
		else
			m = grp->views[j++];
		rc = add_name(list, n, &cap, b->g->nodes[m].name, &seen, 0);
	}
	free(seen.slots);
	return rc;
}

/* Each kernel's node names: those of its first group (there since the
 * kernel was made), then those of every launch of it, in launch order,
 * each once. */
static int kernel_nodes(ap_program *prog)
{
	name_set seen = {NULL, 0, 0};
	int *cap = malloc(((size_t)prog->n_kernels + 1) * sizeof(int));   /* per kernel: slots */
	int rc = cap ? 0 : AP_ENOMEM;

	for (int ki = 0; ki < prog->n_kernels && rc == 0; ki++) {
		cap[ki] = prog->kernels[ki].n_nodes;
		for (int i = 0; i < prog->kernels[ki].n_nodes && rc == 0; i++)
			if (!name_find(&seen, ki, prog->kernels[ki].nodes[i]))
				rc = name_put(&seen, ki, prog->kernels[ki].nodes[i], 0);
	}
	for (int l = 0; l < prog->n_launches && rc == 0; l++) {
		const ap_launch *ln = &prog->launches[l];
		ap_kernel_src *ks = &prog->kernels[ln->kernel];

		for (int i = 0; i < ln->n_nodes && rc == 0; i++)
			rc = add_name(&ks->nodes, &ks->n_nodes, &cap[ln->kernel], ln->nodes[i], &seen,
				      ln->kernel);
	}
	free(seen.slots);
	free(cap);
	return rc;
}

static int fill_kernel(builder *b, const ap_kir_kernel *k, ap_kernel_src *ks, const ap_launch *ln)
{
	const ap_graph *g = b->g;
	ap_error perr;

	ks->name = ap_strdup(k->name);
	ks->cuda_src = ap_kir_print(k, AP_KIR_CUDA, &perr);
	if (ks->cuda_src)
		ks->host_src = ap_kir_print(k, AP_KIR_HOST, &perr);
	if (!ks->cuda_src || !ks->host_src) {
		if (b->err)
			*b->err = perr;
		return perr.code;
	}
	for (int i = 0; i < 3; i++) {
		ks->grid[i] = k->grid[i];
		ks->block[i] = k->block[i];
	}
	ks->smem_bytes = k->smem_bytes;
	ks->params = calloc((size_t)k->n_params + 1, sizeof(ap_kernel_param));
	if (!ks->name || !ks->params)
		return AP_ENOMEM;
	ks->n_params = k->n_params;
	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];

		if (a->space != AP_KIR_GLOBAL || a->param < 0 || a->param >= k->n_params)
			continue;
		ks->params[a->param].name = ap_strdup(g->tensors[a->tensor].name);
		if (!ks->params[a->param].name)
			return AP_ENOMEM;
		ks->params[a->param].dtype = a->type;
		ks->params[a->param].written = a->written;
		ks->global_bytes += b->prog->buffers[ln->args[a->param]].nbytes;
	}
	return 0;
}

/* Names kernel k after its content: "ap_<root op>_<16 hex digits of the
 * SHA-256 of both printed sources>", so that the same kernel gets the same
 * name (and cache key) in every graph.  0, or an error code. */
static int name_by_content(builder *b, ap_kir_kernel *k, const char *op)
{
	ap_error perr;
	char *cuda = ap_kir_print(k, AP_KIR_CUDA, &perr), *host = NULL;
	ap_sha256_ctx *h;
	uint8_t d[32];
	char hex[65], name[96];

	if (cuda)
		host = ap_kir_print(k, AP_KIR_HOST, &perr);
	if (!cuda || !host) {
		free(cuda);
		if (b->err)
			*b->err = perr;
		return perr.code;
	}
	h = ap_sha256_new();
	if (!h) {
		free(cuda);
		free(host);
		return AP_ENOMEM;
	}
	ap_sha256_update(h, cuda, strlen(cuda) + 1);
	ap_sha256_update(h, host, strlen(host) + 1);
	ap_sha256_final(h, d);
	ap_hex(d, 8, hex);
	free(cuda);
	free(host);
	snprintf(name, sizeof(name), "ap_%s_%s", op, hex);
	return ap_kir_kernel_rename(k, name);
}

typedef struct interval {
	int buf;
	int def, last;
	uint64_t off, size;
} interval;

static int cmp_def(const void *a, const void *b)
{
	const interval *x = a, *y = b;

	if (x->def != y->def)
		return (x->def > y->def) - (x->def < y->def);
	return (x->buf > y->buf) - (x->buf < y->buf);
}

/* First-fit placement of intermediates by liveness over the launches.
 * Intervals are placed in order of definition, so one that ended before
 * the current one starts can never overlap a later one either: only the
 * intervals still live (`active`, in placement order) are looked at. */
static int layout_workspace(ap_program *p)
{
	interval *iv = calloc((size_t)p->n_buffers + 1, sizeof(*iv));
	int *iv_of = malloc(((size_t)p->n_buffers + 1) * sizeof(int));   /* per buffer */
	int *active = malloc(((size_t)p->n_buffers + 1) * sizeof(int));
	int n = 0, n_active = 0;
	uint64_t top = 0;

	if (!iv || !iv_of || !active) {
		free(iv);
		free(iv_of);
		free(active);
		return AP_ENOMEM;
	}
	for (int bi = 0; bi < p->n_buffers; bi++) {
		iv_of[bi] = -1;
		if (p->buffers[bi].kind != AP_BUF_INTERMEDIATE)
			continue;
		iv[n].buf = bi;
		iv[n].def = p->n_launches;
		iv[n].last = -1;
		iv[n].size = (p->buffers[bi].nbytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN *
			     WORKSPACE_ALIGN;
		iv_of[bi] = n++;
	}
	for (int l = 0; l < p->n_launches; l++) {
		const ap_launch *ln = &p->launches[l];
		const ap_kernel_src *ks = &p->kernels[ln->kernel];

		for (int a = 0; a < ln->n_args; a++) {
			interval *v = iv_of[ln->args[a]] >= 0 ? &iv[iv_of[ln->args[a]]] : NULL;

			if (!v)
				continue;
			if (ks->params[a].written && l < v->def)
				v->def = l;
			if (l > v->last)
				v->last = l;
		}
	}
	for (int i = 0; i < n; i++)
		if (iv[i].def > iv[i].last)
			iv[i].def = iv[i].last;
	qsort(iv, (size_t)n, sizeof(*iv), cmp_def);
	for (int i = 0; i < n; i++) {
		uint64_t off = 0;
		bool moved = true;
		int k = 0;

		/* drop the intervals that ended before this one starts */
		for (int a = 0; a < n_active; a++)
			if (iv[active[a]].last >= iv[i].def)
				active[k++] = active[a];
		n_active = k;
		/* lowest offset clear of every placed interval live at the same time */
		while (moved) {
			moved = false;
			for (int a = 0; a < n_active; a++) {
				const interval *v = &iv[active[a]];

				if (off < v->off + v->size && v->off < off + iv[i].size) {
					off = v->off + v->size;
					moved = true;
				}
			}
		}
		iv[i].off = off;
		p->buffers[iv[i].buf].offset = off;
		if (off + iv[i].size > top)
			top = off + iv[i].size;
		active[n_active++] = i;
	}
	p->workspace_bytes = top;
	free(iv);
	free(iv_of);
	free(active);
	return 0;
}

/* eager_bytes and min_bytes; global_bytes summed over the launches. */
static void traffic_model(const ap_graph *g, ap_program *p)
{
	unsigned eager = 0;
	uint64_t eb = 0, mb = 0;

	for (int n = 0; n < g->n_nodes; n++) {
		const ap_node *node = &g->nodes[n];

		if (ap_op_is_view(node->op))
			continue;
		eager++;
		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i];
			bool seen = false;

			for (int j = 0; j < i; j++)
				if (node->inputs[j] == t)
					seen = true;
			if (t >= 0 && !seen && g->tensors[t].kind != AP_TENSOR_CONST)
				eb += tensor_bytes(&g->tensors[t]);
		}
		for (int i = 0; i < node->n_outputs; i++)
			if (node->outputs[i] >= 0)
				eb += tensor_bytes(&g->tensors[node->outputs[i]]);
	}
	for (int i = 0; i < p->n_buffers; i++)
		if (p->buffers[i].kind != AP_BUF_INTERMEDIATE)
			mb += p->buffers[i].nbytes;
	p->eager_kernels = g->eager_kernels ? g->eager_kernels : eager;
	p->eager_bytes = eb;
	p->min_bytes = mb;
	p->global_bytes = 0;
	for (int i = 0; i < p->n_launches; i++)
		p->global_bytes += p->launches[i].global_bytes;
}

static bool group_is_empty(const ap_graph *g, const ap_group *grp)
{
	for (int i = 0; i < grp->n_outputs; i++)
		if (ap_tensor_numel(&g->tensors[grp->outputs[i]]) != 0)
			return false;
	return true;
}

/* Upward feedback test hook (ap_build_options.refuse_*): the reason to
 * refuse group gi, or NULL. */
static const char *hook_refuses(const ap_partition *part, int gi, const ap_build_options *opt,
				char *buf, size_t cap)
{
	const ap_group *grp = &part->groups[gi];

	if (!opt)
		return NULL;
	if (opt->refuse_group_nodes && (unsigned)grp->n_nodes > opt->refuse_group_nodes) {
		snprintf(buf, cap, "test hook: groups of more than %u nodes are refused",
			 opt->refuse_group_nodes);
		return buf;
	}
	if (opt->refuse_op && grp->n_nodes >= 2) {
		for (int i = 0; i < grp->n_nodes; i++) {
			if (strcmp(ap_op_name(part->g->nodes[grp->nodes[i]].op), opt->refuse_op) == 0) {
				snprintf(buf, cap, "test hook: a fused group holding %s is refused",
					 opt->refuse_op);
				return buf;
			}
		}
	}
	return NULL;
}

/* One partition boundary as a candidate program boundary. */
typedef struct launch_edge {
	int producer, consumer;      /* launches */
	const char *tensor;
	int index;                   /* in part->boundaries */
} launch_edge;

static int cmp_launch_edge(const void *a, const void *b)
{
	const launch_edge *x = a, *y = b;
	int c;

	if (x->producer != y->producer)
		return (x->producer > y->producer) - (x->producer < y->producer);
	if (x->consumer != y->consumer)
		return (x->consumer > y->consumer) - (x->consumer < y->consumer);
	if ((c = strcmp(x->tensor, y->tensor)) != 0)
		return c;
	return (x->index > y->index) - (x->index < y->index);
}

/* The partition's boundaries between two launches, one per (producer
 * launch, consumer launch, tensor): the first of each in the partition's
 * order (repeats found by sorting). */
static int fill_boundaries(builder *b, const ap_partition *part, const int *launch_of)
{
	ap_program *prog = b->prog;
	launch_edge *e = malloc(((size_t)part->n_boundaries + 1) * sizeof(*e));
	bool *keep = calloc((size_t)part->n_boundaries + 1, sizeof(bool));
	int ne = 0, rc = AP_ENOMEM;

	prog->boundaries = calloc((size_t)part->n_boundaries + 1, sizeof(ap_program_boundary));
	if (!prog->boundaries || !e || !keep)
		goto out;
	for (int i = 0; i < part->n_boundaries; i++) {
		const ap_boundary *bd = &part->boundaries[i];
		int gp = part->group_of[bd->producer], gc = part->group_of[bd->consumer];
		int lp = gp >= 0 ? launch_of[gp] : -1, lc = gc >= 0 ? launch_of[gc] : -1;

		if (lp < 0 || lc < 0 || lp == lc)
			continue;
		e[ne].producer = lp;
		e[ne].consumer = lc;
		e[ne].tensor = part->g->tensors[bd->tensor].name;
		e[ne++].index = i;
	}
	qsort(e, (size_t)ne, sizeof(*e), cmp_launch_edge);
	for (int j = 0; j < ne; j++)
		if (j == 0 || e[j].producer != e[j - 1].producer || e[j].consumer != e[j - 1].consumer ||
		    strcmp(e[j].tensor, e[j - 1].tensor) != 0)
			keep[e[j].index] = true;
	for (int i = 0; i < part->n_boundaries; i++) {
		const ap_boundary *bd = &part->boundaries[i];
		ap_program_boundary *pb;

		if (!keep[i])
			continue;
		pb = &prog->boundaries[prog->n_boundaries++];
		pb->producer = launch_of[part->group_of[bd->producer]];
		pb->consumer = launch_of[part->group_of[bd->consumer]];
		pb->tensor = ap_strdup(part->g->tensors[bd->tensor].name);
		pb->reason = ap_boundary_reason_key(bd->reason);
		pb->detail = ap_strdup(bd->detail);
		if (!pb->tensor || !pb->detail)
			goto out;
	}
	rc = 0;
out:
	free(e);
	free(keep);
	return rc;
}

static int fill_explain(builder *b, const ap_graph *g, const ap_partition *part,
			const ap_expand_choices *choices, const int *launch_of)
{
	ap_program *prog = b->prog;

	prog->n_recomputed = part->n_recomputed;
	prog->fusion = part->level;
	prog->subgraphs = calloc((size_t)part->n_subgraphs + 1, sizeof(ap_program_subgraph));
	prog->ops = calloc((size_t)choices->n + 1, sizeof(ap_program_op));
	if (!prog->subgraphs || !prog->ops)
		return AP_ENOMEM;
	prog->n_subgraphs = part->n_subgraphs;
	for (int s = 0; s < part->n_subgraphs; s++) {
		const ap_subgraph *sg = &part->subgraphs[s];

		prog->subgraphs[s].wave = sg->wave;
		prog->subgraphs[s].deps = malloc(((size_t)sg->n_deps + 1) * sizeof(int));
		if (!prog->subgraphs[s].deps)
			return AP_ENOMEM;
		memcpy(prog->subgraphs[s].deps, sg->deps, (size_t)sg->n_deps * sizeof(int));
		prog->subgraphs[s].n_deps = sg->n_deps;
	}
	for (int i = 0; i < choices->n; i++) {
		const ap_expand_choice *ch = &choices->items[i];
		ap_program_op *op = &prog->ops[prog->n_ops++];

		op->node = ap_strdup(g->nodes[ch->node].name);
		op->op = ap_op_name(ch->op);
		op->opened = ch->opened;
		op->n_primitives = ch->n_primitives;
		if (!op->node)
			return AP_ENOMEM;
	}
	return fill_boundaries(b, part, launch_of);
}

__ap_give ap_program *ap_program_build(__ap_keep const ap_graph *g,
				       const ap_build_options *opt, ap_error *err)
{
	double t0 = ap_now_ms(), t1;
	ap_graph *eg = NULL;
	const ap_graph *pg;
	ap_partition *part = NULL;
	ap_program *prog = NULL;
	builder b;
	ap_lower_options lopt = {opt ? opt->max_block_threads : 0};
	ap_expand_options xopt = {0};
	ap_partition_options popt = {0};
	ap_expand_choices choices = {0};
	int *launch_of = NULL, cap_launches = 0, nb0;
	int rc = 0;
	char hook[160], refusal[sizeof(((ap_error *)0)->msg) + 160];
	double hook_ms = 0;   /* in opt->accept_kernel: the backend's time */
	name_set kernel_of = {NULL, 0, 0};   /* kept kernels by name */

	memset(&b, 0, sizeof(b));
	b.err = err;
	if (opt) {
		xopt.n_keep_whole = opt->n_keep_whole;
		xopt.keep_whole = opt->keep_whole;
		xopt.open_all = opt->open_all;
		popt.level = opt->fusion;
		popt.max_group_nodes = opt->max_group_nodes;
		popt.max_recompute = opt->max_recompute;
		popt.n_barriers = opt->n_fusion_barriers;
		popt.barriers = opt->fusion_barriers;
	}
	eg = ap_partition_expand(g, &xopt, &choices, err);
	if (!eg)
		return NULL;
	part = ap_partition_build(eg, &popt, err);
	if (!part)
		goto fail;
	pg = part->g;
	t1 = ap_now_ms();
	prog = calloc(1, sizeof(*prog));
	b.buf_of = malloc(((size_t)pg->n_tensors + 1) * sizeof(int));
	if (!prog || !b.buf_of)
		goto nomem;
	prog->partition_ms = t1 - t0;
	b.g = pg;
	b.prog = prog;
	for (int t = 0; t < pg->n_tensors; t++)
		b.buf_of[t] = -1;
	for (int i = 0; i < pg->n_inputs; i++) {
		int t = pg->inputs[i], bi;

		if (t < 0 || t >= pg->n_tensors)
			continue;
		bi = add_buffer(&b, t, AP_BUF_INPUT, i);
		if (bi < 0)
			goto nomem;
		b.buf_of[t] = bi;
	}
	for (int i = 0; i < pg->n_outputs; i++) {
		int t = pg->outputs[i], bi;

		if (t < 0 || t >= pg->n_tensors || b.buf_of[t] >= 0)
			continue;
		bi = add_buffer(&b, t, AP_BUF_OUTPUT, i);
		if (bi < 0)
			goto nomem;
		b.buf_of[t] = bi;
	}
	for (int gi = 0; gi < part->n_groups;) {
		const ap_group *grp = &part->groups[gi];
		const char *op = ap_op_name(pg->nodes[grp->root].op), *why;
		ap_kir_kernel *k = NULL;
		ap_launch *ln;
		ap_error lerr;
		int ki;

		if (part->n_groups > cap_launches) {
			int ncap = part->n_groups + 16;
			ap_kernel_src *nk = realloc(prog->kernels, (size_t)ncap * sizeof(*nk));
			ap_launch *nl;
			int *nlo;

			if (!nk)
				goto nomem;
			prog->kernels = nk;
			nl = realloc(prog->launches, (size_t)ncap * sizeof(*nl));
			if (!nl)
				goto nomem;
			prog->launches = nl;
			nlo = realloc(launch_of, (size_t)ncap * sizeof(int));
			if (!nlo)
				goto nomem;
			launch_of = nlo;
			memset(prog->kernels + cap_launches, 0, (size_t)(ncap - cap_launches) * sizeof(*nk));
			memset(prog->launches + cap_launches, 0, (size_t)(ncap - cap_launches) * sizeof(*nl));
			cap_launches = ncap;
		}
		launch_of[gi] = -1;
		if (group_is_empty(pg, grp)) {
			gi++;
			continue;
		}
		ap_error_clear(&lerr);
		why = hook_refuses(part, gi, opt, hook, sizeof(hook));
		if (!why) {
			k = ap_lower_group(part, gi, "apollo_kernel", &lopt, &lerr);
			rc = k ? name_by_content(&(builder){.err = &lerr}, k, op) : lerr.code;
			if (rc < 0 && rc != AP_ENOMEM)
				why = lerr.msg;
		}
		if (why) {
			/* upward feedback: split the fused group and lower the halves */
			ap_kir_kernel_free(k);
			if (grp->n_nodes < 2) {
				if (err)
					*err = lerr;
				goto fail;
			}
			rc = ap_partition_split(part, gi, "lowering", why);
			if (rc < 0)
				goto nomem;
			prog->n_refused++;
			continue;
		}
		if (rc == AP_ENOMEM) {
			ap_kir_kernel_free(k);
			goto nomem;
		}
		ln = &prog->launches[prog->n_launches];
		/* the same kernel twice in one program is one kernel, launched twice */
		{
			const name_entry *e = name_find(&kernel_of, 0, k->name);

			ki = e ? e->value : prog->n_kernels;
		}
		nb0 = prog->n_buffers;
		rc = fill_launch(&b, k, ln, ki);
		if (rc == 0 && ki == prog->n_kernels) {
			/* a new kernel: built in place, kept only once the backend
			 * hook accepts it */
			ap_kernel_src *ks = &prog->kernels[ki];

			rc = fill_kernel(&b, k, ks, ln);
			ks->n_members = grp->n_nodes;
			if (rc == 0)
				rc = add_group_nodes(&b, grp, &ks->nodes, &ks->n_nodes);
			if (rc == 0 && opt && opt->accept_kernel) {
				double th = ap_now_ms();

				ap_error_clear(&lerr);
				rc = opt->accept_kernel(ks, opt->accept_user, &lerr);
				hook_ms += ap_now_ms() - th;
				if (rc != 0 && rc != AP_ENOMEM) {
					if (!lerr.msg[0])
						snprintf(lerr.msg, sizeof(lerr.msg), "no reason given");
					snprintf(refusal, sizeof(refusal), "kernel %s: %s",
						 ks->name, lerr.msg);
					rc = REFUSED;
				}
			}
			if (rc == 0)
				rc = name_put(&kernel_of, 0, ks->name, ki);
			if (rc == 0) {
				prog->n_kernels++;
			} else {
				kernel_clear(ks);
				memset(ks, 0, sizeof(*ks));
			}
		}
		if (rc == 0) {
			launch_of[gi] = prog->n_launches;
			prog->n_launches++;
			ln->category = ap_group_kind_name(grp->kind);
			ln->subgraph = grp->subgraph;
			for (int a = 0; a < ln->n_args; a++) {
				bool seen = false;

				for (int a2 = 0; a2 < a; a2++)
					if (ln->args[a2] == ln->args[a])
						seen = true;
				if (!seen)
					ln->global_bytes += prog->buffers[ln->args[a]].nbytes;
			}
			rc = add_group_nodes(&b, grp, &ln->nodes, &ln->n_nodes);
		} else {
			free(ln->args);
			memset(ln, 0, sizeof(*ln));
		}
		ap_kir_kernel_free(k);
		if (rc == REFUSED) {
			/* upward feedback from the backend: forget the buffers this
			 * group created, then split it (or fail a single node) */
			while (prog->n_buffers > nb0) {
				int bi = --prog->n_buffers;

				b.buf_of[b.tensor_of[bi]] = -1;
				free(prog->buffers[bi].name);
			}
			if (grp->n_nodes < 2) {
				ap_error_set(err, AP_ECOMPILE, pg->nodes[grp->root].name, NULL, "%s",
					     refusal);
				goto fail;
			}
			if (ap_partition_split(part, gi, "the backend", refusal) < 0)
				goto nomem;
			prog->n_refused++;
			continue;
		}
		if (rc == AP_ENOMEM)
			goto nomem;
		if (rc < 0)
			goto fail;
		gi++;
	}
	if (kernel_nodes(prog) < 0 || layout_workspace(prog) < 0)
		goto nomem;
	traffic_model(g, prog);
	if (fill_explain(&b, g, part, &choices, launch_of) < 0)
		goto nomem;
	prog->codegen_ms = ap_now_ms() - t1 - hook_ms;
	free(kernel_of.slots);
	free(launch_of);
	free(b.buf_of);
	free(b.tensor_of);
	ap_expand_choices_clear(&choices);
	ap_partition_free(part);
	ap_graph_free(eg);
	return prog;
nomem:
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory building the program");
fail:
	free(kernel_of.slots);
	free(launch_of);
	free(b.buf_of);
	free(b.tensor_of);
	ap_expand_choices_clear(&choices);
	ap_partition_free(part);
	ap_graph_free(eg);
	return ap_program_free(prog);
}

/* ---- explain ------------------------------------------------------------------ */

int ap_program_explain(const ap_program *p, FILE *f, bool json)
{
	if (!json) {
		fprintf(f, "fusion %s: %d launches of %d kernels, %u eager\n",
			ap_fuse_level_name(p->fusion), p->n_launches, p->n_kernels, p->eager_kernels);
		for (int l = 0; l < p->n_launches; l++) {
			const ap_launch *ln = &p->launches[l];

			fprintf(f, "launch %d %s sub=%d kernel=%s bytes=%llu nodes=[", l,
				ln->category ? ln->category : "?", ln->subgraph, p->kernels[ln->kernel].name,
				(unsigned long long)ln->global_bytes);
			for (int i = 0; i < ln->n_nodes; i++)
				fprintf(f, "%s%s", i ? " " : "", ln->nodes[i]);
			fprintf(f, "]\n");
		}
		for (int i = 0; i < p->n_boundaries; i++) {
			const ap_program_boundary *b = &p->boundaries[i];

			fprintf(f, "boundary %d -> %d %s: %s\n", b->producer, b->consumer, b->tensor, b->detail);
		}
		fprintf(f, "global_bytes %llu eager_bytes %llu min_bytes %llu\n",
			(unsigned long long)p->global_bytes, (unsigned long long)p->eager_bytes,
			(unsigned long long)p->min_bytes);
		return ferror(f) ? AP_EIO : 0;
	}
	fprintf(f, "{\"fusion\":\"%s\",\"launches\":[", ap_fuse_level_name(p->fusion));
	for (int l = 0; l < p->n_launches; l++) {
		const ap_launch *ln = &p->launches[l];

		fprintf(f, "%s{\"kernel\":", l ? "," : "");
		ap__json_string(f, p->kernels[ln->kernel].name);
		fprintf(f, ",\"category\":\"%s\",\"subgraph\":%d,\"global_bytes\":%llu,\"nodes\":[",
			ln->category ? ln->category : "?", ln->subgraph, (unsigned long long)ln->global_bytes);
		for (int i = 0; i < ln->n_nodes; i++) {
			fprintf(f, "%s", i ? "," : "");
			ap__json_string(f, ln->nodes[i]);
		}
		fprintf(f, "]}");
	}
	fprintf(f, "],\"boundaries\":[");
	for (int i = 0; i < p->n_boundaries; i++) {
		const ap_program_boundary *b = &p->boundaries[i];

		fprintf(f, "%s{\"producer\":%d,\"consumer\":%d,\"tensor\":", i ? "," : "", b->producer,
			b->consumer);
		ap__json_string(f, b->tensor);
		fprintf(f, ",\"reason\":\"%s\",\"detail\":", b->reason);
		ap__json_string(f, b->detail);
		fprintf(f, "}");
	}
	fprintf(f, "],\"stats\":{\"kernels\":%d,\"distinct_kernels\":%d,\"eager_kernels\":%u,"
		   "\"global_bytes\":%llu,\"eager_bytes\":%llu,\"min_bytes\":%llu}}\n",
		p->n_launches, p->n_kernels, p->eager_kernels, (unsigned long long)p->global_bytes,
		(unsigned long long)p->eager_bytes, (unsigned long long)p->min_bytes);
	return ferror(f) ? AP_EIO : 0;
}
