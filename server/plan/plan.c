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

/* Adds name to a list of strings unless present. */
static int add_name(char ***list, int *n, const char *name)
{
	char **p;

	for (int i = 0; i < *n; i++)
		if (strcmp((*list)[i], name) == 0)
			return 0;
	p = realloc(*list, (size_t)(*n + 1) * sizeof(char *));
	if (!p)
		return AP_ENOMEM;
	*list = p;
	p[*n] = ap_strdup(name);
	if (!p[*n])
		return AP_ENOMEM;
	(*n)++;
	return 0;
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

/* Adds the names of a group's nodes (members and absorbed views, in graph
 * order) to a list of names. */
static int add_group_nodes(builder *b, const ap_group *grp, char ***list, int *n)
{
	int i = 0, j = 0;

	/* both lists are ascending: merge them */
	while (i < grp->n_nodes || j < grp->n_views) {
		int m;

		if (j >= grp->n_views || (i < grp->n_nodes && grp->nodes[i] < grp->views[j]))
			m = grp->nodes[i++];
		else
			m = grp->views[j++];
		if (add_name(list, n, b->g->nodes[m].name) < 0)
			return AP_ENOMEM;
	}
	return 0;
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

/* First-fit placement of intermediates by liveness over the launches. */
static int layout_workspace(ap_program *p)
{
	interval *iv = calloc((size_t)p->n_buffers + 1, sizeof(*iv));
	int n = 0;
	uint64_t top = 0;

	if (!iv)
		return AP_ENOMEM;
	for (int bi = 0; bi < p->n_buffers; bi++) {
		if (p->buffers[bi].kind != AP_BUF_INTERMEDIATE)
			continue;
		iv[n].buf = bi;
		iv[n].def = p->n_launches;
		iv[n].last = -1;
		iv[n].size = (p->buffers[bi].nbytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN *
			     WORKSPACE_ALIGN;
		for (int l = 0; l < p->n_launches; l++) {
			const ap_launch *ln = &p->launches[l];
			const ap_kernel_src *ks = &p->kernels[ln->kernel];

			for (int a = 0; a < ln->n_args; a++) {
				if (ln->args[a] != bi)
					continue;
				if (ks->params[a].written && l < iv[n].def)
					iv[n].def = l;
				if (l > iv[n].last)
					iv[n].last = l;
			}
		}
		if (iv[n].def > iv[n].last)
			iv[n].def = iv[n].last;
		n++;
	}
	qsort(iv, (size_t)n, sizeof(*iv), cmp_def);
	for (int i = 0; i < n; i++) {
		uint64_t off = 0;
		bool moved = true;

		/* lowest offset clear of every placed interval live at the same time */
		while (moved) {
			moved = false;
			for (int j = 0; j < i; j++) {
				if (iv[j].last < iv[i].def || iv[j].def > iv[i].last)
					continue;
				if (off < iv[j].off + iv[j].size && iv[j].off < off + iv[i].size) {
					off = iv[j].off + iv[j].size;
					moved = true;
				}
			}
		}
		iv[i].off = off;
		p->buffers[iv[i].buf].offset = off;
		if (off + iv[i].size > top)
			top = off + iv[i].size;
	}
	p->workspace_bytes = top;
	free(iv);
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

/* Launch of group gi's boundary edges, deduplicated by launch pair and
 * tensor. */
static int fill_boundaries(builder *b, const ap_partition *part, const int *launch_of)
{
	ap_program *prog = b->prog;

	prog->boundaries = calloc((size_t)part->n_boundaries + 1, sizeof(ap_program_boundary));
	if (!prog->boundaries)
		return AP_ENOMEM;
	for (int i = 0; i < part->n_boundaries; i++) {
		const ap_boundary *bd = &part->boundaries[i];
		int gp = part->group_of[bd->producer], gc = part->group_of[bd->consumer];
		int lp = gp >= 0 ? launch_of[gp] : -1, lc = gc >= 0 ? launch_of[gc] : -1;
		const char *tn = part->g->tensors[bd->tensor].name;
		ap_program_boundary *pb;
		bool dup = false;

		if (lp < 0 || lc < 0 || lp == lc)
			continue;
		for (int j = 0; j < prog->n_boundaries && !dup; j++)
			if (prog->boundaries[j].producer == lp && prog->boundaries[j].consumer == lc &&
			    strcmp(prog->boundaries[j].tensor, tn) == 0)
				dup = true;
		if (dup)
			continue;
		pb = &prog->boundaries[prog->n_boundaries++];
		pb->producer = lp;
		pb->consumer = lc;
		pb->tensor = ap_strdup(tn);
		pb->reason = ap_boundary_reason_key(bd->reason);
		pb->detail = ap_strdup(bd->detail);
		if (!pb->tensor || !pb->detail)
			return AP_ENOMEM;
	}
	return 0;
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
		if (sg->n_deps > 0)
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
		for (ki = 0; ki < prog->n_kernels; ki++)
			if (strcmp(prog->kernels[ki].name, k->name) == 0)
				break;
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
			if (rc == 0)
				rc = add_group_nodes(&b, grp, &prog->kernels[ki].nodes,
						     &prog->kernels[ki].n_nodes);
		} else {
			free(ln->args);
			memset(ln, 0, sizeof(*ln));
		}
		ap_kir_kernel_free(k);
		if (rc == REFUSED) {
			/* upward feedback from the backend: forget the buffers this
			 * group created, then split it (or fail a single node) */
			for (int t = 0; t < pg->n_tensors; t++)
				if (b.buf_of[t] >= nb0)
					b.buf_of[t] = -1;
			while (prog->n_buffers > nb0)
				free(prog->buffers[--prog->n_buffers].name);
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
	if (layout_workspace(prog) < 0)
		goto nomem;
	traffic_model(g, prog);
	if (fill_explain(&b, g, part, &choices, launch_of) < 0)
		goto nomem;
	prog->codegen_ms = ap_now_ms() - t1 - hook_ms;
	free(launch_of);
	free(b.buf_of);
	ap_expand_choices_clear(&choices);
	ap_partition_free(part);
	ap_graph_free(eg);
	return prog;
nomem:
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory building the program");
fail:
	free(launch_of);
	free(b.buf_of);
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
