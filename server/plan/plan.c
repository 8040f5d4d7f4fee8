/* plan.c -- the plan stage (see plan.h) and the explain report of a
 * program (program.h).
 *
 * Buffers: every graph input (kind INPUT, by position), every graph output
 * (OUTPUT, by position), every PARAM tensor a kernel reads (PARAM, by
 * name), and every other tensor a kernel writes or reads (INTERMEDIATE).
 * Intermediates are placed in one workspace at 256-byte aligned offsets,
 * reusing space by liveness: a buffer is live from the launch that writes
 * it to the last launch that reads it, and is placed at the lowest offset
 * that overlaps no buffer live at the same time (first fit, in order of
 * definition; only buffers still live are compared, so the cost is the
 * number of buffers times the number live at once).
 *
 * Memory (bytes of one run of the plan): the runtime allocates the
 * workspace whole for the run, so the device bytes held while the plan
 * runs are the same at every launch: peak_bytes = input_bytes +
 * output_bytes + const_bytes + workspace_bytes.  The layout above already
 * reuses the workspace by liveness, so the workspace is what the
 * intermediates live at once need plus first fit's gaps; a per-launch sum
 * of live intermediates would leave those gaps out, though the runtime
 * holds them.  Outputs are the OUTPUT buffers (a graph output that is
 * also an input is one INPUT buffer, counted once); a training forward's
 * outputs include the tensors it saves for the backward.  Parameters are
 * not counted: the caller binds its weights where they already are.
 *
 * Traffic model (bytes): a launch's global_bytes is what the driver
 * modelled (each tensor it reads -- its parts' inputs and the constants
 * it reads from a buffer -- the elements its parts touch, summed over the
 * parts and at most the tensor's size; each tensor it writes, once), else
 * the size of every distinct buffer it binds; the program's is the sum
 * over its launches.  eager_bytes sums, over the imported graph's
 * non-view nodes (before expansion), the bytes of their distinct
 * non-constant inputs (the part a Slice or Gather selects) and outputs
 * (an op-by-op runtime).  min_bytes is the floor: each graph input,
 * parameter and constant a launch reads, the elements the program
 * graph's readers touch of it (ap_cost_touched), and each graph output a
 * launch writes, once.  Every reader of a tensor is in some launch's
 * parts, so the launches' bytes add up to at least the floor:
 * global_bytes >= min_bytes on every graph; an input no kernel reads
 * (unused, or an output passed through) costs nothing.
 *
 * Explain data: each launch lists its parts (micro-graphs) with the
 * imported node names they compute, their kinds and sub-graphs; each edge
 * between two partition groups in two different launches becomes one
 * boundary per (producer launch, consumer launch, tensor) with the
 * partitioner's (or a fusion layer's) reason.
 */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORKSPACE_ALIGN 256

static uint64_t tensor_bytes(const ap_tensor *t)
{
	int64_t n = ap_tensor_numel(t);

	return n > 0 ? (uint64_t)n * ap_dtype_size(t->dtype) : 0;
}

static void free_names(char **names, int n)
{
	for (int i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

void ap__kernel_src_clear(ap_kernel_src *k)
{
	free(k->name);
	free(k->src);
	free(k->emitter);
	for (int i = 0; i < k->n_params; i++)
		free(k->params[i].name);
	free(k->params);
	free_names(k->nodes, k->n_nodes);
	memset(k, 0, sizeof(*k));
}

void ap__launch_clear(ap_launch *l)
{
	free(l->args);
	free_names(l->nodes, l->n_nodes);
	for (int i = 0; i < l->n_parts; i++) {
		free_names(l->parts[i].nodes, l->parts[i].n_nodes);
		free(l->parts[i].detail);
		free(l->parts[i].schedule);
		free(l->parts[i].layer1);
	}
	free(l->parts);
	free(l->library);
	memset(l, 0, sizeof(*l));
}

ap_program *ap_program_free(__ap_take ap_program *p)
{
	if (!p)
		return NULL;
	for (int i = 0; i < p->n_kernels; i++)
		ap__kernel_src_clear(&p->kernels[i]);
	free(p->kernels);
	for (int i = 0; i < p->n_launches; i++)
		ap__launch_clear(&p->launches[i]);
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
	for (int i = 0; i < p->n_buffers; i++) {
		free(p->buffers[i].name);
		free(p->buffers[i].data);
	}
	free(p->buffers);
	free(p);
	return NULL;
}

/* ---- buffers -------------------------------------------------------------------- */

typedef struct builder {
	const ap_graph *g;
	ap_program *prog;
	int *buf_of;                 /* per tensor of g: buffer index or -1 */
	int cap_buffers;
} builder;

static int add_buffer(builder *b, int t, ap_buffer_kind kind, int index)
{
	const ap_tensor *x = &b->g->tensors[t];
	ap_program *p = b->prog;
	ap_buffer *bf;

	if (p->n_buffers == b->cap_buffers) {
		int ncap = b->cap_buffers ? 2 * b->cap_buffers : 16;
		ap_buffer *nb = realloc(p->buffers, (size_t)ncap * sizeof(*nb));

		if (!nb)
			return AP_ENOMEM;
		p->buffers = nb;
		b->cap_buffers = ncap;
	}
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
	if (kind == AP_BUF_CONST) {
		/* the bundle carries it: every client runs the kernels unchanged */
		if (!x->data || x->nbytes < bf->nbytes)
			return AP_EINVAL;
		bf->data = malloc(bf->nbytes ? (size_t)bf->nbytes : 1);
		if (!bf->data) {
			free(bf->name);
			return AP_ENOMEM;
		}
		memcpy(bf->data, x->data, (size_t)bf->nbytes);
	}
	b->buf_of[t] = p->n_buffers;
	return p->n_buffers++;
}

/* Buffer of tensor t, created on first use: PARAM for a weight, CONST for
 * a constant a kernel reads from memory (its bytes travel in the bundle),
 * else INTERMEDIATE. */
static int buffer_for(builder *b, int t)
{
	ap_tensor_kind kind = b->g->tensors[t].kind;

	if (b->buf_of[t] >= 0)
		return b->buf_of[t];
	return add_buffer(b, t, kind == AP_TENSOR_PARAM ? AP_BUF_PARAM
				: kind == AP_TENSOR_CONST ? AP_BUF_CONST : AP_BUF_INTERMEDIATE, -1);
}

/* A stretch of the workspace live from launch def to launch last: an
 * intermediate buffer (buf >= 0), or the scratch a library call needs
 * during its launch only (buf = -1 - the launch's index). */
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

static int cmp_off(const void *a, const void *b)
{
	const interval *const *x = a, *const *y = b;

	return ((*x)->off > (*y)->off) - ((*x)->off < (*y)->off);
}

/* First-fit placement of intermediates by liveness over the launches,
 * and of each library call's scratch (ap_kir_library.workspace_bytes) as
 * a stretch live during its own launch: launches run one after another
 * on one stream, so the calls share one region that no intermediate their
 * launch binds overlaps. */
static int layout_workspace(ap_program *p)
{
	size_t cap = (size_t)p->n_buffers + (size_t)p->n_launches + 1;
	interval *iv = calloc(cap, sizeof(*iv));
	interval **live = calloc(cap, sizeof(*live));
	int *slot = malloc(((size_t)p->n_buffers + 1) * sizeof(int));
	int n = 0, n_live = 0;
	uint64_t top = 0;

	if (!iv || !live || !slot) {
		free(iv);
		free(live);
		free(slot);
		return AP_ENOMEM;
	}
	for (int bi = 0; bi < p->n_buffers; bi++) {
		slot[bi] = -1;
		if (p->buffers[bi].kind != AP_BUF_INTERMEDIATE)
			continue;
		slot[bi] = n;
		iv[n].buf = bi;
		iv[n].def = p->n_launches;
		iv[n].last = -1;
		iv[n].size = (p->buffers[bi].nbytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN *
			     WORKSPACE_ALIGN;
		n++;
	}
	/* liveness in one pass over the launches' arguments */
	for (int l = 0; l < p->n_launches; l++) {
		const ap_launch *ln = &p->launches[l];
		const ap_kernel_src *ks = &p->kernels[ln->kernel];

		for (int a = 0; a < ln->n_args; a++) {
			int s = slot[ln->args[a]];

			if (s < 0)
				continue;
			if (ks->params[a].written && l < iv[s].def)
				iv[s].def = l;
			if (l > iv[s].last)
				iv[s].last = l;
		}
	}
	for (int i = 0; i < n; i++)
		if (iv[i].def > iv[i].last)
			iv[i].def = iv[i].last;
	for (int l = 0; l < p->n_launches; l++) {
		const ap_kir_library *lib = p->launches[l].library;

		if (!lib || lib->workspace_bytes <= 0)
			continue;
		iv[n].buf = -1 - l;
		iv[n].def = iv[n].last = l;
		iv[n].size = ((uint64_t)lib->workspace_bytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN *
			     WORKSPACE_ALIGN;
		n++;
	}
	qsort(iv, (size_t)n, sizeof(*iv), cmp_def);
	for (int i = 0; i < n; i++) {
		uint64_t off = 0;
		int k = 0;

		/* intervals placed earlier that ended before this one starts end
		 * before every later one starts too (definitions ascend) */
		for (int j = 0; j < n_live; j++)
			if (live[j]->last >= iv[i].def)
				live[k++] = live[j];
		n_live = k;
		qsort(live, (size_t)n_live, sizeof(*live), cmp_off);
		/* lowest gap between live intervals (ordered by offset) that fits */
		for (int j = 0; j < n_live; j++) {
			if (off + iv[i].size <= live[j]->off)
				break;
			if (live[j]->off + live[j]->size > off)
				off = live[j]->off + live[j]->size;
		}
		iv[i].off = off;
		if (iv[i].buf >= 0)
			p->buffers[iv[i].buf].offset = off;
		else
			p->launches[-1 - iv[i].buf].library->workspace_offset = (int64_t)off;
		if (off + iv[i].size > top)
			top = off + iv[i].size;
		live[n_live++] = &iv[i];
	}
	p->workspace_bytes = top;
	free(iv);
	free(live);
	free(slot);
	return 0;
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* input_bytes, output_bytes, const_bytes and peak_bytes (see the top). */
static void memory_model(ap_program *p)
{
	p->input_bytes = p->output_bytes = p->const_bytes = 0;
	for (int i = 0; i < p->n_buffers; i++) {
		const ap_buffer *bf = &p->buffers[i];

		if (bf->kind == AP_BUF_INPUT)
			p->input_bytes = add_sat(p->input_bytes, bf->nbytes);
		else if (bf->kind == AP_BUF_OUTPUT)
			p->output_bytes = add_sat(p->output_bytes, bf->nbytes);
		else if (bf->kind == AP_BUF_CONST)
			p->const_bytes = add_sat(p->const_bytes, bf->nbytes);
	}
	p->peak_bytes = add_sat(add_sat(p->input_bytes, p->output_bytes),
				add_sat(p->const_bytes, p->workspace_bytes));
}

/* eager_bytes of `g` (before expansion); global_bytes summed over the
 * launches; min_bytes, the floor (floor_bytes), as given. */
static void traffic_model(const ap_graph *g, uint64_t min_bytes, ap_program *p)
{
	unsigned eager = 0;
	uint64_t eb = 0;

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
			if (t < 0 || seen || g->tensors[t].kind == AP_TENSOR_CONST)
				continue;
			if ((node->op == AP_OP_SLICE || node->op == AP_OP_GATHER) && i == 0 &&
			    node->outputs[0] >= 0 &&
			    tensor_bytes(&g->tensors[node->outputs[0]]) < tensor_bytes(&g->tensors[t]))
				eb += tensor_bytes(&g->tensors[node->outputs[0]]);
			else
				eb += tensor_bytes(&g->tensors[t]);
		}
		for (int i = 0; i < node->n_outputs; i++)
			if (node->outputs[i] >= 0)
				eb += tensor_bytes(&g->tensors[node->outputs[i]]);
	}
	p->eager_kernels = g->eager_kernels ? g->eager_kernels : eager;
	p->eager_bytes = eb;
	p->min_bytes = min_bytes;
	p->global_bytes = 0;
	for (int i = 0; i < p->n_launches; i++)
		p->global_bytes += p->launches[i].global_bytes;
}

/* The floor of the program's traffic into *out (bytes): every graph
 * input, parameter and constant buffer some launch reads, the elements
 * pg's readers touch of it (ap_cost_touched); every graph output some
 * launch writes, whole; each buffer once.  p's launch arguments are
 * buffers by now; buf_of: per tensor of pg, its buffer or -1.  0, or
 * AP_ENOMEM. */
static int floor_bytes(const ap_program *p, const ap_graph *pg, const int *buf_of, uint64_t *out)
{
	unsigned char *use = calloc((size_t)p->n_buffers + 1, 1);   /* 1 read, 2 written, 4 counted */
	double sum = 0;

	if (!use)
		return AP_ENOMEM;
	for (int l = 0; l < p->n_launches; l++) {
		const ap_launch *ln = &p->launches[l];

		for (int a = 0; a < ln->n_args; a++)
			use[ln->args[a]] |= p->kernels[ln->kernel].params[a].written ? 2 : 1;
	}
	for (int t = 0; t < pg->n_tensors; t++) {
		int bi = buf_of[t];
		double whole, touched;

		if (bi < 0 || p->buffers[bi].kind == AP_BUF_INTERMEDIATE || (use[bi] & 4) || !use[bi])
			continue;
		use[bi] |= 4;
		whole = (double)p->buffers[bi].nbytes;
		touched = ap_cost_touched(pg, t) * (double)ap_dtype_size(pg->tensors[t].dtype);
		sum += (use[bi] & 2) || touched > whole ? whole : touched;
	}
	free(use);
	*out = (uint64_t)sum;
	return 0;
}

int ap__plan_buffers(ap_program *p, const ap_graph *pg, const ap_graph *orig, ap_error *err)
{
	builder b;
	int *stamp = NULL;           /* per tensor: 1 + the last launch that counted it */
	bool *kernel_done = NULL;
	uint64_t min_bytes = 0;
	int rc = AP_ENOMEM;

	memset(&b, 0, sizeof(b));
	b.g = pg;
	b.prog = p;
	b.buf_of = malloc(((size_t)pg->n_tensors + 1) * sizeof(int));
	stamp = calloc((size_t)pg->n_tensors + 1, sizeof(int));
	kernel_done = calloc((size_t)p->n_kernels + 1, sizeof(bool));
	if (!b.buf_of || !stamp || !kernel_done)
		goto out;
	for (int t = 0; t < pg->n_tensors; t++)
		b.buf_of[t] = -1;
	for (int i = 0; i < pg->n_inputs; i++) {
		int t = pg->inputs[i];

		if (t >= 0 && t < pg->n_tensors && add_buffer(&b, t, AP_BUF_INPUT, i) < 0)
			goto out;
	}
	for (int i = 0; i < pg->n_outputs; i++) {
		int t = pg->outputs[i];

		if (t >= 0 && t < pg->n_tensors && b.buf_of[t] < 0 &&
		    add_buffer(&b, t, AP_BUF_OUTPUT, i) < 0)
			goto out;
	}
	for (int l = 0; l < p->n_launches; l++) {
		ap_launch *ln = &p->launches[l];
		ap_kernel_src *ks = &p->kernels[ln->kernel];
		uint64_t whole = 0;

		for (int a = 0; a < ln->n_args; a++) {
			int t = ln->args[a], bi = buffer_for(&b, t);

			if (bi < 0)
				goto out;
			ln->args[a] = bi;
			if (stamp[t] != l + 1)
				whole += p->buffers[bi].nbytes;
			stamp[t] = l + 1;
		}
		/* the driver's model (elements touched) when it gave one, else
		 * every bound buffer whole */
		if (!ln->global_bytes)
			ln->global_bytes = whole;
		if (!kernel_done[ln->kernel]) {
			ks->global_bytes = ln->global_bytes;
			kernel_done[ln->kernel] = true;
		}
	}
	if (layout_workspace(p) < 0)
		goto out;
	memory_model(p);
	if (floor_bytes(p, pg, b.buf_of, &min_bytes) < 0)
		goto out;
	traffic_model(orig, min_bytes, p);
	rc = 0;
out:
	free(b.buf_of);
	free(stamp);
	free(kernel_done);
	if (rc)
		return ap_error_set(err, rc, NULL, NULL, "out of memory laying out buffers");
	return 0;
}

/* ---- explain data ---------------------------------------------------------------- */

typedef struct bkey {
	int producer, consumer, part_boundary;
	const char *tensor;
} bkey;

static int cmp_bkey(const void *a, const void *b)
{
	const bkey *x = a, *y = b;
	int c;

	if (x->producer != y->producer)
		return (x->producer > y->producer) - (x->producer < y->producer);
	if (x->consumer != y->consumer)
		return (x->consumer > y->consumer) - (x->consumer < y->consumer);
	c = strcmp(x->tensor, y->tensor);
	if (c)
		return c;
	return (x->part_boundary > y->part_boundary) - (x->part_boundary < y->part_boundary);
}

/* One boundary per (producer launch, consumer launch, tensor name), the
 * partition's first (in its order) for each: sorted, then de-duplicated. */
static int fill_boundaries(ap_program *prog, const ap_partition *part, const int *launch_of)
{
	bkey *keys = calloc((size_t)part->n_boundaries + 1, sizeof(*keys));
	int n = 0;

	prog->boundaries = calloc((size_t)part->n_boundaries + 1, sizeof(ap_program_boundary));
	if (!keys || !prog->boundaries) {
		free(keys);
		return AP_ENOMEM;
	}
	for (int i = 0; i < part->n_boundaries; i++) {
		const ap_boundary *bd = &part->boundaries[i];
		int gp = part->group_of[bd->producer], gc = part->group_of[bd->consumer];
		int lp = gp >= 0 ? launch_of[gp] : -1, lc = gc >= 0 ? launch_of[gc] : -1;

		if (lp < 0 || lc < 0 || lp == lc)
			continue;
		keys[n].producer = lp;
		keys[n].consumer = lc;
		keys[n].tensor = part->g->tensors[bd->tensor].name;
		keys[n].part_boundary = i;
		n++;
	}
	qsort(keys, (size_t)n, sizeof(*keys), cmp_bkey);
	for (int i = 0; i < n; i++) {
		const ap_boundary *bd;
		ap_program_boundary *pb;

		if (i > 0 && keys[i].producer == keys[i - 1].producer &&
		    keys[i].consumer == keys[i - 1].consumer &&
		    strcmp(keys[i].tensor, keys[i - 1].tensor) == 0)
			continue;
		bd = &part->boundaries[keys[i].part_boundary];
		pb = &prog->boundaries[prog->n_boundaries++];
		pb->producer = keys[i].producer;
		pb->consumer = keys[i].consumer;
		pb->tensor = ap_strdup(keys[i].tensor);
		pb->reason = ap_boundary_reason_key(bd->reason);
		pb->detail = ap_strdup(bd->detail);
		if (!pb->tensor || !pb->detail) {
			free(keys);
			return AP_ENOMEM;
		}
	}
	free(keys);
	return 0;
}

int ap__plan_explain(ap_program *prog, const ap_partition *part, const ap_graph *orig,
		     const ap_expand_choices *choices, const int *launch_of)
{
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
		if (sg->n_deps > 0)
			memcpy(prog->subgraphs[s].deps, sg->deps, (size_t)sg->n_deps * sizeof(int));
		prog->subgraphs[s].n_deps = sg->n_deps;
	}
	for (int i = 0; i < choices->n; i++) {
		const ap_expand_choice *ch = &choices->items[i];
		ap_program_op *op = &prog->ops[prog->n_ops++];

		op->node = ap_strdup(orig->nodes[ch->node].name);
		op->op = ap_op_name(ch->op);
		op->opened = ch->opened;
		op->n_primitives = ch->n_primitives;
		if (!op->node)
			return AP_ENOMEM;
	}
	return fill_boundaries(prog, part, launch_of);
}

/* ---- explain ------------------------------------------------------------------ */

/* "II", "II+III", ... ("" for none) into buf. */
static const char *layer_names(unsigned layers, char *buf, size_t cap)
{
	static const char *const names[] = {"I", "II", "III"};
	size_t len = 0;

	buf[0] = 0;
	for (int i = 0; i < 3; i++)
		if (layers & (1u << i))
			len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? "+" : "", names[i]);
	return buf;
}

static void json_layers(FILE *f, unsigned layers)
{
	static const char *const names[] = {"I", "II", "III"};
	bool first = true;

	fputc('[', f);
	for (int i = 0; i < 3; i++)
		if (layers & (1u << i)) {
			fprintf(f, "%s\"%s\"", first ? "" : ",", names[i]);
			first = false;
		}
	fputc(']', f);
}

static void json_names(FILE *f, char *const *names, int n)
{
	fputc('[', f);
	for (int i = 0; i < n; i++) {
		fprintf(f, "%s", i ? "," : "");
		ap__json_string(f, names[i]);
	}
	fputc(']', f);
}

int ap_program_explain(const ap_program *p, FILE *f, bool json)
{
	char lb[32];

	if (!json) {
		fprintf(f, "fusion %s: %d launches of %d kernels, %u eager\n",
			ap_fuse_level_name(p->fusion), p->n_launches, p->n_kernels, p->eager_kernels);
		for (int l = 0; l < p->n_launches; l++) {
			const ap_launch *ln = &p->launches[l];

			fprintf(f, "launch %d %s sub=%d kernel=%s bytes=%llu", l,
				ln->category ? ln->category : "?", ln->subgraph, p->kernels[ln->kernel].name,
				(unsigned long long)ln->global_bytes);
			if (ln->layers)
				fprintf(f, " layers=%s", layer_names(ln->layers, lb, sizeof(lb)));
			fprintf(f, " nodes=[");
			for (int i = 0; i < ln->n_nodes; i++)
				fprintf(f, "%s%s", i ? " " : "", ln->nodes[i]);
			fprintf(f, "]\n");
			if (ln->n_parts > 1)
				fprintf(f, "  stitched: Layer III launches %d independent micro-graphs together, "
					"blocks split by blockIdx ranges\n", ln->n_parts);
			for (int j = 0; j < ln->n_parts; j++) {
				const ap_launch_part *pt = &ln->parts[j];

				if (ln->n_parts > 1) {
					fprintf(f, "  part %d %s blocks=[%u,%u) nodes=[", j, pt->category,
						pt->block_begin, pt->block_begin + pt->blocks);
					for (int i = 0; i < pt->n_nodes; i++)
						fprintf(f, "%s%s", i ? " " : "", pt->nodes[i]);
					fprintf(f, "]\n");
				}
				if (pt->detail && pt->detail[0])
					fprintf(f, "  %s%s\n", ln->n_parts > 1 ? "  " : "", pt->detail);
				if (pt->emitter)
					fprintf(f, "  %semitter %s: %s\n", ln->n_parts > 1 ? "  " : "", pt->emitter,
						pt->schedule ? pt->schedule : "");
			}
		}
		for (int i = 0; i < p->n_boundaries; i++) {
			const ap_program_boundary *b = &p->boundaries[i];

			fprintf(f, "boundary %d -> %d %s: %s\n", b->producer, b->consumer, b->tensor, b->detail);
		}
		fprintf(f, "layers I %u II %u III %u\n", p->layer_count[0], p->layer_count[1],
			p->layer_count[2]);
		fprintf(f, "global_bytes %llu eager_bytes %llu min_bytes %llu\n",
			(unsigned long long)p->global_bytes, (unsigned long long)p->eager_bytes,
			(unsigned long long)p->min_bytes);
		fprintf(f, "peak_bytes %llu input_bytes %llu output_bytes %llu const_bytes %llu "
			   "workspace_bytes %llu\n", (unsigned long long)p->peak_bytes,
			(unsigned long long)p->input_bytes, (unsigned long long)p->output_bytes,
			(unsigned long long)p->const_bytes, (unsigned long long)p->workspace_bytes);
		return ferror(f) ? AP_EIO : 0;
	}
	fprintf(f, "{\"fusion\":\"%s\",\"launches\":[", ap_fuse_level_name(p->fusion));
	for (int l = 0; l < p->n_launches; l++) {
		const ap_launch *ln = &p->launches[l];

		fprintf(f, "%s{\"kernel\":", l ? "," : "");
		ap__json_string(f, p->kernels[ln->kernel].name);
		fprintf(f, ",\"category\":\"%s\",\"subgraph\":%d,\"global_bytes\":%llu,\"nodes\":",
			ln->category ? ln->category : "?", ln->subgraph, (unsigned long long)ln->global_bytes);
		json_names(f, ln->nodes, ln->n_nodes);
		fprintf(f, ",\"layers\":");
		json_layers(f, ln->layers);
		fprintf(f, ",\"parts\":[");
		for (int j = 0; j < ln->n_parts; j++) {
			const ap_launch_part *pt = &ln->parts[j];

			fprintf(f, "%s{\"category\":\"%s\",\"block_begin\":%u,\"blocks\":%u,\"nodes\":",
				j ? "," : "", pt->category, pt->block_begin, pt->blocks);
			json_names(f, pt->nodes, pt->n_nodes);
			fprintf(f, ",\"layers\":");
			json_layers(f, pt->layers);
			fprintf(f, ",\"detail\":");
			ap__json_string(f, pt->detail);
			fprintf(f, ",\"emitter\":");
			ap__json_string(f, pt->emitter ? pt->emitter : "");
			fprintf(f, ",\"schedule\":");
			ap__json_string(f, pt->schedule ? pt->schedule : "");
			fprintf(f, "}");
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
		   "\"global_bytes\":%llu,\"eager_bytes\":%llu,\"min_bytes\":%llu,"
		   "\"peak_bytes\":%llu,\"input_bytes\":%llu,\"output_bytes\":%llu,"
		   "\"const_bytes\":%llu,\"workspace_bytes\":%llu,"
		   "\"layers\":{\"I\":%u,\"II\":%u,\"III\":%u}}}\n",
		p->n_launches, p->n_kernels, p->eager_kernels, (unsigned long long)p->global_bytes,
		(unsigned long long)p->eager_bytes, (unsigned long long)p->min_bytes,
		(unsigned long long)p->peak_bytes, (unsigned long long)p->input_bytes,
		(unsigned long long)p->output_bytes, (unsigned long long)p->const_bytes,
		(unsigned long long)p->workspace_bytes, p->layer_count[0], p->layer_count[1],
		p->layer_count[2]);
	return ferror(f) ? AP_EIO : 0;
}
