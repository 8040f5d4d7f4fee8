/* pipeline.c -- the compiler core: ap_program_build (program.h), APOLLO's
 * method as a list of named stages.
 *
 *   expand        compound ops opened into primitives, or kept whole
 *   partition     sub-graphs and micro-graphs by the aggregation rules
 *   micro-graphs  one self-contained ap_mgraph per partition group (tasks)
 *   layer I       polyhedral loop fusion inside a micro-graph with isl
 *                 (server/fuse/layer1.c; window micro-graphs)
 *   layer II      memory stitching: reductions with their consumers
 *   emit          each micro-graph lowered by its emitter to kernel IR (tasks)
 *   layer III     parallelism stitching: independent kernels, one launch
 *   print         each launch's kernel printed once for the target, named by
 *                 content, offered to the backend hook
 *   plan          buffers, workspace, traffic, explain data
 *
 * Per-micro-graph stages run as one task per micro-graph on the caller's
 * pool (ap_build_options.pool); the layers meet only at their boundaries
 * (piecewise compilation, APOLLO section 4).
 *
 * Upward feedback: a refusal from a lower layer -- the emitter, a test
 * hook, the backend -- is a record (which micro-graph or launch, why, and
 * where to cut) that the driver turns into a change of an upper layer's
 * decision: a Layer III merge is forbidden, a Layer II stitch is undone, or
 * the partitioner cuts the group where the refusal says (the node that
 * failed; the anchor of a fused matmul or reduction; halves for a size
 * limit).  Then the stages from "micro-graphs" on run again.  A refusal of
 * a single node is an error: nothing is left to undo.
 */
#include "../plan/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fuse/fuse.h"
#include "../lower/lower.h"
#include "../partition/mgraph.h"
#include "../tune/tune.h"
#include "../config.h"

#include <stdatomic.h>

#define MAX_ROUNDS 4096
#define PLACEHOLDER "ap__kernel__"

enum {
	ST_EXPAND, ST_PARTITION, ST_MGRAPHS, ST_LAYER1, ST_LAYER2, ST_EMIT, ST_LAYER3, ST_PRINT, ST_PLAN,
};

static const char *const stage_names[AP_PIPELINE_STAGES] = {
	"expand", "partition", "micro-graphs", "layer I", "layer II", "emit", "layer III", "print",
	"plan",
};

#define STAGE_LIST \
	"expand, partition, micro-graphs, layer I, layer II, emit, layer III, print, plan"

/* True when `name` is one of stage_names. */
static bool stage_known(const char *name)
{
	for (int i = 0; i < AP_PIPELINE_STAGES; i++)
		if (!strcmp(name, stage_names[i]))
			return true;
	return false;
}

/* Tells opt->stage_begin (when set) that stage `id` begins. */
static void stage_begin(const ap_build_options *opt, int id)
{
	if (opt->stage_begin)
		opt->stage_begin(opt->stage_user, stage_names[id]);
}

const char *ap_pipeline_stage_name(int i)
{
	return i >= 0 && i < AP_PIPELINE_STAGES ? stage_names[i] : NULL;
}

typedef struct name_index name_index;

/* One micro-graph on its way through the stages of a round. */
typedef struct unit {
	ap_mgraph *m;
	ap_kir_kernel *k;            /* after emit (NULL: nothing to launch) */
	ap_bound b;                  /* its emitter's binding: Layer I's where it planned
					the micro-graph (the plan kept in it), else the
					registry's first (emit); ap_unbind */
	ap_sched sched;
	char l1_why[300];            /* why Layer I refused a micro-graph it was wanted for */
	double l1_ms;                /* Layer I's emission time */
	ap_traffic traffic;
	ap_tune_kind tuned;          /* how its configuration was found */
	uint8_t tune_sig[32];        /* tuned != AP_TUNE_DEFAULT: its signature */
	unsigned tune_tried;
	double tune_ms;
	bool tune_capped;            /* the safety limit cut its search short */
	ap_error err;                /* emit's failure */
	int rc;
} unit;

/* Layer I's plan of unit u (NULL: an emitter of the registry builds it). */
static const ap_layer1 *l1_of(const unit *u)
{
	return ap_fuse_layer1_bound_plan(&u->b);
}

/* What a lower layer refused, and where to undo fusion. */
typedef struct refusal {
	const char *who;             /* "lowering", "the backend" */
	char why[sizeof(((ap_error *)0)->msg) + 200];
	int unit;                    /* the refused unit (or the first part of a launch) */
	int launch;                  /* the refused launch (backend), else -1 */
	bool by_size;                /* a size limit: cut in halves */
	char node[128];              /* the node named by the refusal, "" if none */
	const char *op;              /* cut every member of this op type (test hook) */
} refusal;

typedef struct pipe {
	const ap_graph *g;           /* the request's graph */
	const ap_build_options *opt;
	ap_build_options dflt;
	ap_target_info ti;
	ap_kir_target print_target;
	unsigned print_flags;        /* AP_KIR_PRINT_*: BASELINE for an emulated GPU target */
	ap_graph *eg;
	ap_partition *part;
	ap_expand_choices choices;
	ap_program *prog;
	ap_error *err;
	/* one round */
	unit *units;
	int n_units;
	int *launch_of_unit;         /* per unit: its launch */
	ap_fuse_launch *launches;    /* Layer III's grouping of units */
	int n_launches;
	/* decisions undone by refusals, per partition group */
	bool *no_stitch;
	bool *no_merge;
	double hook_ms;
	atomic_uint_fast64_t tune_used_us;   /* search time spent by this build
						(the safety limit's count only) */
	unsigned tune_share;         /* evaluations each unit's search may make
					(ap_tune_share of this round's partition) */
	name_index *kernel_names;    /* per kernel of the program: its names' index */
	int cap_kernel_names;
} pipe;

/* ---- tasks ---------------------------------------------------------------------- */

static void run_tasks(pipe *P, int n, void (*fn)(int i, void *arg), void *arg)
{
	const ap_task_pool *pool = P->opt->pool;

	if (pool && pool->run && n > 1) {
		pool->run(pool->pool, n, fn, arg);
		return;
	}
	for (int i = 0; i < n; i++)
		fn(i, arg);
}

/* ---- a round ---------------------------------------------------------------------- */

static void units_clear(pipe *P)
{
	for (int i = 0; i < P->n_units; i++) {
		ap_mgraph_free(P->units[i].m);
		ap_kir_kernel_free(P->units[i].k);
		ap_unbind(&P->units[i].b);
	}
	free(P->units);
	P->units = NULL;
	P->n_units = 0;
	free(P->launch_of_unit);
	P->launch_of_unit = NULL;
	ap_fuse_launches_free(P->launches, P->n_launches);
	P->launches = NULL;
	P->n_launches = 0;
}

static void extract_task(int i, void *arg)
{
	pipe *P = arg;
	unit *u = &P->units[i];

	ap_error_clear(&u->err);
	u->m = ap_mgraph_of_group(P->part, i, &u->err);
	u->rc = u->m ? 0 : (u->err.code ? u->err.code : AP_ENOMEM);
}

static bool mgraph_is_empty(const ap_mgraph *m)
{
	for (int i = 0; i < m->g->n_outputs; i++)
		if (ap_tensor_numel(&m->g->tensors[m->g->outputs[i]]) != 0)
			return false;
	return true;
}

/* The test hooks' verdict on unit u (NULL: accepted). */
static const char *hook_refuses(const pipe *P, const unit *u, char *buf, size_t cap,
				const char **op)
{
	const ap_build_hooks *h = P->opt->hooks;
	const ap_graph *g = u->m->g;

	*op = NULL;
	if (!h)
		return NULL;
	if (h->refuse_group_nodes && (unsigned)u->m->n_members > h->refuse_group_nodes) {
		snprintf(buf, cap, "test hook: groups of more than %u nodes are refused",
			 h->refuse_group_nodes);
		return buf;
	}
	if (h->refuse_op && u->m->n_members >= 2) {
		for (int i = 0; i < g->n_nodes; i++) {
			if (strcmp(ap_op_name(g->nodes[i].op), h->refuse_op) == 0) {
				snprintf(buf, cap, "test hook: a fused group holding %s is refused",
					 h->refuse_op);
				*op = h->refuse_op;
				return buf;
			}
		}
	}
	return NULL;
}

/* Tuning of unit u on the emitter b binds (a no-op without P->opt->tune): u->sched
 * from a record, a search of the round's share of evaluations (the same
 * whatever the tasks' order: the budget is not time), or the rule;
 * u->tuned says which.  The build's wall-time safety limit (h->budget_ms,
 * summed over the tasks) may cut a search short: u->tune_capped.  0, or
 * u->rc set (AP_ENOMEM). */
static int tune_unit(pipe *P, unit *u, const ap_bound *b)
{
	const ap_tune_hooks *h = P->opt->tune;
	ap_tune_outcome to;
	double left = 0;

	u->tuned = AP_TUNE_DEFAULT;
	u->tune_tried = 0;
	u->tune_ms = 0;
	u->tune_capped = false;
	if (!h)
		return 0;
	if (h->budget_ms > 0) {
		left = h->budget_ms - (double)atomic_load(&P->tune_used_us) / 1000;
		if (left <= 0)
			left = -1;   /* spent */
	}
	if (ap_tune_unit(h, b, P->opt->max_block_threads, P->tune_share, left, &u->sched, &to,
			 &u->err) < 0)
		return u->rc = u->err.code ? u->err.code : AP_ENOMEM;
	atomic_fetch_add(&P->tune_used_us, (uint64_t)(to.ms * 1000));
	if (to.capped) {
		const ap_graph *g = u->m->g;
		char hex[17];

		ap_hex(to.sig, 8, hex);
		ap_log(AP_LOG_WARN, "tuning: the time limit (tune_budget_ms = %.0f) cut short the "
		       "search of the %s kernel at node %s (signature %s...) after %u of %u "
		       "evaluations: not kept as a record", h->budget_ms, b->em->name,
		       u->m->root >= 0 && u->m->root < g->n_nodes ? g->nodes[u->m->root].name : "?",
		       hex, to.tried, P->tune_share);
	}
	u->tuned = to.kind;
	memcpy(u->tune_sig, to.sig, sizeof(u->tune_sig));
	u->tune_tried = to.tried;
	u->tune_ms = to.ms;
	u->tune_capped = to.capped;
	return 0;
}

/* Layer I for unit i: a plan for a window micro-graph whose pooled tensor
 * it computes; u->l1_why when Layer I was wanted and refused (the driver
 * then cuts the window out of the group), u->rc on ENOMEM. */
static void layer1_task(int i, void *arg)
{
	pipe *P = arg;
	unit *u = &P->units[i];
	ap_sched tile;
	int rc;

	u->l1_why[0] = 0;
	u->rc = 0;
	if (!ap_fuse_layer1_wanted(u->m) || mgraph_is_empty(u->m))
		return;
	/* a window analysis that refuses says why (u->l1_why) */
	if ((rc = ap_bind(&ap_fuse_layer1_emitter, u->m, &P->ti, &u->b, u->l1_why, sizeof(u->l1_why))) <= 0) {
		if (rc < 0)
			u->rc = ap_error_set(&u->err, AP_ENOMEM, NULL, NULL, "out of memory in Layer I");
		return;
	}
	/* the tile is a tuner's knob: a record, a search, or the rule */
	if (tune_unit(P, u, &u->b) < 0) {
		ap_unbind(&u->b);
		return;
	}
	tile = u->tuned != AP_TUNE_DEFAULT ? u->sched : (ap_sched){&ap_fuse_layer1_emitter, 0, {0}};
	rc = ap_fuse_layer1_plan_bound(&u->b, P->opt->max_block_threads, &tile, u->l1_why, sizeof(u->l1_why));
	if (rc < 0)
		u->rc = ap_error_set(&u->err, AP_ENOMEM, NULL, NULL, "out of memory in Layer I");
	if (rc <= 0 || !ap_fuse_layer1_pays(u->m, l1_of(u), &P->ti, u->l1_why, sizeof(u->l1_why))) {
		ap_unbind(&u->b);
		return;
	}
	/* the plan's tile: the configuration ap_lower builds on the binding */
	if (u->tuned == AP_TUNE_DEFAULT)
		u->sched = tile;
}

static void emit_task(int i, void *arg)
{
	pipe *P = arg;
	unit *u = &P->units[i];
	ap_lower_options lo = {P->opt->max_block_threads, NULL, true};
	bool layer1;
	double t0;

	ap_error_clear(&u->err);
	u->rc = 0;
	if (mgraph_is_empty(u->m))
		return;
	/* its binding: Layer I's with its plan (layer1_task), else the
	 * registry's first */
	if (!u->b.em && ap_bind_first(u->m, &P->ti, &u->b, &u->err) < 0) {
		u->rc = u->err.code ? u->err.code : AP_ENOMEM;
		return;
	}
	layer1 = l1_of(u) != NULL;
	if (layer1) {
		lo.sched = &u->sched;   /* the plan's tile */
	} else if (P->opt->tune) {
		if (tune_unit(P, u, &u->b) < 0)
			return;
		lo.sched = &u->sched;
	} else {
		u->tuned = AP_TUNE_DEFAULT;
	}
	t0 = ap_now_ms();
	u->k = ap_lower(&u->b, PLACEHOLDER, &lo, &u->sched, &u->err);
	if (layer1)
		u->l1_ms = ap_now_ms() - t0;
	if (!u->k && lo.sched && !layer1 && u->err.code == AP_EUNSUPPORTED) {
		/* a tuned configuration the emitter refused after all (a record
		 * of an older build): the default rule, never a fusion undone */
		lo.sched = NULL;
		u->tuned = AP_TUNE_DEFAULT;
		ap_error_clear(&u->err);
		u->k = ap_lower(&u->b, PLACEHOLDER, &lo, &u->sched, &u->err);
	}
	if (!u->k) {
		u->rc = u->err.code ? u->err.code : AP_ENOMEM;
		return;
	}
	memset(&u->traffic, 0, sizeof(u->traffic));
	if (ap_traffic_of(&u->b, &u->sched, &u->traffic) < 0) {
		u->k = ap_kir_kernel_free(u->k);
		u->rc = ap_error_set(&u->err, AP_ENOMEM, NULL, NULL, "out of memory modelling a kernel");
	}
}

/* ---- refusals ---------------------------------------------------------------------- */

/* Program nodes of group gi that the refusal names. */
static int cut_nodes(const pipe *P, int gi, const refusal *r, int *cut)
{
	const ap_group *grp = &P->part->groups[gi];
	const ap_graph *g = P->part->g;
	int n = 0;

	if (r->by_size)
		return 0;
	for (int i = 0; i < grp->n_nodes; i++) {
		const ap_node *node = &g->nodes[grp->nodes[i]];

		if ((r->op && strcmp(ap_op_name(node->op), r->op) == 0) ||
		    (!r->op && r->node[0] && strcmp(node->name, r->node) == 0))
			cut[n++] = grp->nodes[i];
	}
	if (n == 0 && !r->op) {
		/* no node named: separate the anchor (the matmul, convolution or
		 * reduction) from its prologue and epilogue */
		ap_op_category cat = ap_op_category_of(g->nodes[grp->root].op);

		if (cat == AP_CAT_MATMUL || cat == AP_CAT_CONV || cat == AP_CAT_REDUCTION)
			cut[n++] = grp->root;
	}
	return n;
}

/* Applies refusal r: undoes the fusion it concerns.  0 when something was
 * undone (build again), or an error with P->err set. */
static int apply_refusal(pipe *P, const refusal *r, const ap_error *cause)
{
	const unit *u = &P->units[r->unit];
	const ap_mgraph *m = u->m;
	int gi, n_cut, rc, *cut;

	if (r->launch >= 0 && P->launches[r->launch].n > 1) {
		/* a Layer III merge: its parts go back to launches of their own */
		const ap_fuse_launch *fl = &P->launches[r->launch];

		for (int j = 0; j < fl->n; j++) {
			const ap_mgraph *pm = P->units[fl->units[j]].m;

			for (int q = 0; q < pm->n_groups; q++)
				P->no_merge[pm->groups[q]] = true;
		}
		return 0;
	}
	if (m->n_groups > 1) {
		/* a Layer II stitch: its micro-graphs are lowered apart */
		for (int q = 0; q < m->n_groups; q++)
			P->no_stitch[m->groups[q]] = true;
		return 0;
	}
	gi = m->groups[0];
	if (P->part->groups[gi].n_nodes < 2) {
		if (cause)
			*P->err = *cause;
		else
			ap_error_set(P->err, AP_ECOMPILE, P->part->g->nodes[P->part->groups[gi].root].name,
				     NULL, "%s", r->why);
		return P->err->code ? P->err->code : AP_EINTERNAL;
	}
	cut = malloc(((size_t)P->part->groups[gi].n_nodes + 1) * sizeof(int));
	if (!cut)
		return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
	n_cut = cut_nodes(P, gi, r, cut);
	rc = ap_partition_cut(P->part, gi, cut, n_cut, r->who, r->why);
	if (rc == AP_EINVAL && n_cut > 0)   /* the cut named every member: halves */
		rc = ap_partition_cut(P->part, gi, cut, 0, r->who, r->why);
	free(cut);
	if (rc < 0)
		return ap_error_set(P->err, rc, NULL, NULL, "cannot split a refused micro-graph (%s)",
				    ap_error_name(rc));
	/* the pieces are new groups: forget per-group decisions past gi */
	{
		int k = rc;
		bool *ns = realloc(P->no_stitch, (size_t)(P->part->n_groups + 1) * sizeof(bool));
		bool *nm = ns ? realloc(P->no_merge, (size_t)(P->part->n_groups + 1) * sizeof(bool)) : NULL;

		if (ns)
			P->no_stitch = ns;
		if (nm)
			P->no_merge = nm;
		if (!ns || !nm)
			return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
		memmove(P->no_stitch + gi + k, P->no_stitch + gi + 1,
			(size_t)(P->part->n_groups - gi - k) * sizeof(bool));
		memmove(P->no_merge + gi + k, P->no_merge + gi + 1,
			(size_t)(P->part->n_groups - gi - k) * sizeof(bool));
		for (int j = 0; j < k; j++)
			P->no_stitch[gi + j] = P->no_merge[gi + j] = false;
	}
	P->prog->n_refused++;
	return 0;
}

/* ---- print ----------------------------------------------------------------------- */

/* Replaces every PLACEHOLDER in src by name; NULL on ENOMEM (src freed). */
static char *rename_text(char *src, const char *name)
{
	size_t pl = strlen(PLACEHOLDER), nl = strlen(name), n = 0, len;
	char *out, *w;
	const char *r, *hit;

	for (r = src; (hit = strstr(r, PLACEHOLDER)); r = hit + pl)
		n++;
	len = strlen(src) + n * nl + 1;
	out = malloc(len);
	if (!out) {
		free(src);
		return NULL;
	}
	for (r = src, w = out; (hit = strstr(r, PLACEHOLDER)); r = hit + pl) {
		memcpy(w, r, (size_t)(hit - r));
		w += hit - r;
		memcpy(w, name, nl);
		w += nl;
	}
	strcpy(w, r);
	free(src);
	return out;
}

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

static int add_mgraph_names(const ap_mgraph *m, char ***list, int *n)
{
	int cnt;
	const char **names = ap_mgraph_node_names(m, &cnt);

	if (!names && cnt)
		return AP_ENOMEM;
	for (int i = 0; i < cnt; i++)
		if (add_name(list, n, names[i]) < 0) {
			free(names);
			return AP_ENOMEM;
		}
	free(names);
	return 0;
}

/* A kernel's node names, over every launch of it, can run to thousands
 * (a kernel every layer of a deep model shares): they are added through a
 * hash index of the list (open addressing over positions, FNV-1a), and the
 * list grows by doubling. */
struct name_index {
	int cap_list;
	int cap;                 /* slots, a power of two; 0 = none yet */
	int *pos;                /* list position + 1, 0 = empty */
};

static unsigned name_hash(const char *s)
{
	unsigned h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

static int index_grow(name_index *ix, char **list, int n)
{
	int cap = ix->cap ? 2 * ix->cap : 64;
	int *pos = calloc((size_t)cap, sizeof(int));

	if (!pos)
		return AP_ENOMEM;
	for (int i = 0; i < n; i++) {
		unsigned s = name_hash(list[i]) & (unsigned)(cap - 1);

		while (pos[s])
			s = (s + 1) & (unsigned)(cap - 1);
		pos[s] = i + 1;
	}
	free(ix->pos);
	ix->pos = pos;
	ix->cap = cap;
	return 0;
}

static int add_name_indexed(char ***list, int *n, name_index *ix, const char *name)
{
	unsigned s;

	if (2 * (*n + 1) > ix->cap && index_grow(ix, *list, *n) < 0)
		return AP_ENOMEM;
	for (s = name_hash(name) & (unsigned)(ix->cap - 1); ix->pos[s];
	     s = (s + 1) & (unsigned)(ix->cap - 1))
		if (strcmp((*list)[ix->pos[s] - 1], name) == 0)
			return 0;
	if (*n == ix->cap_list) {
		int ncap = ix->cap_list ? 2 * ix->cap_list : 16;
		char **p = realloc(*list, (size_t)ncap * sizeof(char *));

		if (!p)
			return AP_ENOMEM;
		*list = p;
		ix->cap_list = ncap;
	}
	(*list)[*n] = ap_strdup(name);
	if (!(*list)[*n])
		return AP_ENOMEM;
	ix->pos[s] = ++(*n);
	return 0;
}

static int add_kernel_names(pipe *P, int ki, const ap_mgraph *m)
{
	ap_kernel_src *ks = &P->prog->kernels[ki];
	int cnt;
	const char **names = ap_mgraph_node_names(m, &cnt);

	if (!names && cnt)
		return AP_ENOMEM;
	for (int i = 0; i < cnt; i++)
		if (add_name_indexed(&ks->nodes, &ks->n_nodes, &P->kernel_names[ki], names[i]) < 0) {
			free(names);
			return AP_ENOMEM;
		}
	free(names);
	return 0;
}

/* Fills kernel source ks from kernel k of launch fl (printed `src`, named
 * `name`). */
static int fill_kernel(pipe *P, const ap_fuse_launch *fl, const ap_kir_kernel *k, char *src,
		       const char *name, ap_kernel_src *ks)
{
	char emitters[256] = "";
	size_t len = 0;

	memset(ks, 0, sizeof(*ks));
	ks->src = src;
	ks->name = ap_strdup(name);
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
		ks->params[a->param].dtype = a->type;
		ks->params[a->param].written = a->written;
		if (a->tmap) {
			ks->params[a->param].has_tmap = true;
			ks->params[a->param].tmap = *a->tmap;
		}
	}
	for (int j = 0; j < fl->n; j++) {
		const unit *u = &P->units[fl->units[j]];

		ks->n_members += u->m->n_members;
		if (add_kernel_names(P, (int)(ks - P->prog->kernels), u->m) < 0)
			return AP_ENOMEM;
		if (len + 40 < sizeof(emitters))
			len += (size_t)snprintf(emitters + len, sizeof(emitters) - len, "%s%s",
						j ? " + " : "", u->sched.em->name);
	}
	/* parameter names: the program tensors bound at the first launch */
	for (int i = 0; i < ks->n_params; i++) {
		ks->params[i].name = ap_strdup(P->part->g->tensors[fl->args[i]].name);
		if (!ks->params[i].name)
			return AP_ENOMEM;
	}
	ks->emitter = ap_strdup(emitters);
	return ks->emitter ? 0 : AP_ENOMEM;
}

/* Prints the kernel of launch li, names it by content, finds or adds it
 * among the program's kernels (offering a new one to the backend hook).
 * Returns the kernel index, AP_ENOMEM / another error with P->err set, or
 * 1 + INT_MAX... (refused: *r filled, returns REFUSED). */
#define REFUSED (-1000)

static int print_launch(pipe *P, int li, refusal *r)
{
	ap_fuse_launch *fl = &P->launches[li];
	const ap_kir_kernel *k = fl->kernel;
	const ap_mgraph *m0 = P->units[fl->units[0]].m;
	ap_error perr;
	char *src, name[96], hex[65];
	uint8_t d[32];
	int ki, rc;

	src = ap_kir_print_with(k, P->print_target, P->print_flags, &perr);
	if (!src) {
		*P->err = perr;
		return perr.code ? perr.code : AP_ENOMEM;
	}
	ap_sha256(src, strlen(src), d);
	ap_hex(d, 8, hex);
	snprintf(name, sizeof(name), "ap_%s_%s",
		 fl->n > 1 ? "Parallel" : ap_op_name(m0->g->nodes[m0->root].op), hex);
	/* the same kernel twice in one program is one kernel, launched twice;
	 * its node list covers every launch of it */
	for (ki = 0; ki < P->prog->n_kernels; ki++)
		if (strcmp(P->prog->kernels[ki].name, name) == 0) {
			ap_kernel_src *ks = &P->prog->kernels[ki];

			free(src);
			(void)ks;
			for (int j = 0; j < fl->n; j++)
				if (add_kernel_names(P, ki, P->units[fl->units[j]].m) < 0)
					return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
			return ki;
		}
	src = rename_text(src, name);
	if (!src)
		return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory printing kernels");
	{
		ap_kernel_src *nk = realloc(P->prog->kernels,
					    (size_t)(P->prog->n_kernels + 1) * sizeof(*nk));

		if (!nk) {
			free(src);
			return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
		}
		P->prog->kernels = nk;
	}
	ki = P->prog->n_kernels;
	if (ki >= P->cap_kernel_names) {
		int ncap = P->cap_kernel_names ? 2 * P->cap_kernel_names : 16;
		name_index *ni = realloc(P->kernel_names, (size_t)ncap * sizeof(*ni));

		if (!ni) {
			free(src);
			return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
		}
		memset(ni + P->cap_kernel_names, 0, (size_t)(ncap - P->cap_kernel_names) * sizeof(*ni));
		P->kernel_names = ni;
		P->cap_kernel_names = ncap;
	}
	free(P->kernel_names[ki].pos);
	memset(&P->kernel_names[ki], 0, sizeof(P->kernel_names[ki]));
	rc = fill_kernel(P, fl, k, src, name, &P->prog->kernels[ki]);
	if (rc == 0 && P->opt->accept_kernel) {
		double th = ap_now_ms();
		ap_error why;

		ap_error_clear(&why);
		rc = P->opt->accept_kernel(&P->prog->kernels[ki], P->opt->accept_user, &why);
		P->hook_ms += ap_now_ms() - th;
		if (rc != 0 && rc != AP_ENOMEM) {
			r->who = "the backend";
			snprintf(r->why, sizeof(r->why), "kernel %s: %s", name,
				 why.msg[0] ? why.msg : "no reason given");
			r->unit = fl->units[0];
			r->launch = li;
			ap__kernel_src_clear(&P->prog->kernels[ki]);
			return REFUSED;
		}
	}
	if (rc) {
		ap__kernel_src_clear(&P->prog->kernels[ki]);
		return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	P->prog->n_kernels++;
	return ki;
}

/* Modelled bytes of a launch (the cost model's, server/cost): every
 * program tensor its parts read -- their inputs, and the constants the
 * kernel reads from a buffer (its arguments) -- with the elements the
 * parts touch of it (ap_cost_touched: a slice moves its part only),
 * summed over the parts and never more than the tensor has, plus every
 * tensor it writes, once.  A Layer III part runs its own blocks and loads
 * its own operands: two parts reading one tensor whole (squeezenet's
 * expand 1x1 and 3x3 on the squeeze output) count it once, as the cache
 * serves the second within the launch; two reading different slices
 * move both.  So the bytes of the launches reading a tensor add up to at
 * least what the program graph's readers touch of it: the floor
 * min_bytes (plan.c) stays below global_bytes.  0 when out of memory
 * (the plan then counts the launch's buffers whole). */
static uint64_t launch_bytes(const pipe *P, const ap_fuse_launch *fl)
{
	int cap = 0, n = 0;
	struct { int t; double bytes, whole; } *seen = NULL;
	double total = 0;

	for (int j = 0; j < fl->n; j++)
		cap += P->units[fl->units[j]].m->g->n_tensors;
	seen = malloc(((size_t)cap + 1) * sizeof(*seen));
	if (!seen)
		return 0;
	for (int j = 0; j < fl->n; j++) {
		const ap_mgraph *m = P->units[fl->units[j]].m;
		const ap_graph *g = m->g;

		for (int lt = 0; lt < g->n_tensors; lt++) {
			const ap_tensor *x = &g->tensors[lt];
			bool in = x->producer < 0 && x->kind != AP_TENSOR_CONST, bound = false;
			double elems, whole = ap_tensor_numel(x) > 0 ? (double)ap_tensor_numel(x) : 0;
			int k;

			/* a constant counts when the kernel reads it from memory */
			for (int a = 0; x->producer < 0 && x->kind == AP_TENSOR_CONST && a < fl->n_args; a++)
				bound = bound || fl->args[a] == m->tensor_of[lt];
			if (!in && !bound && !x->is_output)
				continue;
			elems = x->is_output ? whole : ap_cost_touched(g, lt);
			whole *= (double)ap_dtype_size(x->dtype);
			for (k = 0; k < n && seen[k].t != m->tensor_of[lt]; k++)
				;
			if (k == n) {
				seen[n].t = m->tensor_of[lt];
				seen[n].bytes = 0;
				seen[n++].whole = whole;
			}
			seen[k].bytes += elems * (double)ap_dtype_size(x->dtype);
		}
	}
	for (int k = 0; k < n; k++)
		total += seen[k].bytes < seen[k].whole ? seen[k].bytes : seen[k].whole;
	free(seen);
	return (uint64_t)total;
}

/* The launch for Layer III group li, kernel ki. */
static int add_launch(pipe *P, int li, int ki)
{
	const ap_fuse_launch *fl = &P->launches[li];
	ap_program *prog = P->prog;
	ap_launch *ln;

	{
		ap_launch *nl = realloc(prog->launches, (size_t)(prog->n_launches + 1) * sizeof(*nl));

		if (!nl)
			return AP_ENOMEM;
		prog->launches = nl;
	}
	ln = &prog->launches[prog->n_launches++];
	memset(ln, 0, sizeof(*ln));
	ln->kernel = ki;
	ln->n_args = prog->kernels[ki].n_params;
	ln->args = malloc(((size_t)ln->n_args + 1) * sizeof(int));
	ln->parts = calloc((size_t)fl->n, sizeof(ap_launch_part));
	if (!ln->args || !ln->parts)
		return AP_ENOMEM;
	memcpy(ln->args, fl->args, (size_t)ln->n_args * sizeof(int));   /* tensors, for now */
	ln->n_parts = fl->n;
	for (int j = 0; j < fl->n; j++) {
		const unit *u = &P->units[fl->units[j]];
		ap_launch_part *pt = &ln->parts[j];

		pt->category = ap_group_kind_name(u->m->kind);
		pt->subgraph = P->part->groups[u->m->groups[0]].subgraph;
		pt->block_begin = fl->block_begin[j];
		pt->blocks = fl->blocks[j];
		pt->layers = u->m->layers;
		pt->detail = ap_strdup(u->m->detail);
		if (u->k && l1_of(u)) {
			pt->emitter = ap_fuse_layer1_emitter.name;
			pt->recompute = ap_fuse_layer1_recompute(l1_of(u));
			/* a tuned tile is named by its knobs, as its record's
			 * candidates are (what a measurement names) */
			pt->schedule = u->tuned != AP_TUNE_DEFAULT
					       ? ap_sched_describe(&u->b, &u->sched)
					       : ap_fuse_layer1_describe(l1_of(u));
			if (!pt->schedule || !(pt->layer1 = ap_fuse_layer1_text(l1_of(u))))
				return AP_ENOMEM;
			pt->tuned = u->tuned != AP_TUNE_DEFAULT;
			memcpy(pt->tune_sig, u->tune_sig, sizeof(pt->tune_sig));
			pt->traffic = u->traffic;
		} else if (u->k && u->sched.em) {
			pt->emitter = u->sched.em->name;
			pt->recompute = !strcmp(u->sched.em->name, "gemm") ||
						!strcmp(u->sched.em->name, "attention") ? 0
					: u->b.em->recompute ? u->b.em->recompute(&u->b)
					: ap_lower_recompute(u->m);
			if (!(pt->schedule = ap_sched_describe(&u->b, &u->sched)))
				return AP_ENOMEM;
			pt->tuned = u->tuned != AP_TUNE_DEFAULT;
			memcpy(pt->tune_sig, u->tune_sig, sizeof(pt->tune_sig));
			pt->traffic = u->traffic;
		}
		if (!pt->detail || add_mgraph_names(u->m, &pt->nodes, &pt->n_nodes) < 0 ||
		    add_mgraph_names(u->m, &ln->nodes, &ln->n_nodes) < 0)
			return AP_ENOMEM;
		ln->layers |= u->m->layers;
	}
	/* a library call stands for one micro-graph's kernel, never for a
	 * launch Layer III merged */
	if (fl->n == 1 && fl->kernel && fl->kernel->library) {
		if (!(ln->library = malloc(sizeof(*ln->library))))
			return AP_ENOMEM;
		*ln->library = *fl->kernel->library;
		ln->library_choice = (int)P->units[fl->units[0]].tuned;
	}
	ln->global_bytes = launch_bytes(P, fl);
	ln->category = fl->n > 1 ? "parallel" : ln->parts[0].category;
	ln->subgraph = ln->parts[0].subgraph;
	if (fl->n > 1)
		ln->layers |= AP_LAYER_III;
	return 0;
}

static void kernel_names_free(pipe *P)
{
	for (int i = 0; i < P->cap_kernel_names; i++)
		free(P->kernel_names[i].pos);
	free(P->kernel_names);
	P->kernel_names = NULL;
	P->cap_kernel_names = 0;
}

/* Resets the program's kernels and launches (a round that is redone). */
static void program_reset(ap_program *prog)
{
	for (int i = 0; i < prog->n_kernels; i++)
		ap__kernel_src_clear(&prog->kernels[i]);
	for (int i = 0; i < prog->n_launches; i++)
		ap__launch_clear(&prog->launches[i]);
	prog->n_kernels = 0;
	prog->n_launches = 0;
}

/* ---- the dump after a stage (ap_build_options.dump_after) ---------------------------- */

/* Writes the state a stage left, one line per item, to the dump file:
 * after expand the primitive graph's nodes; after partition its groups;
 * after micro-graphs, layer I, layer II and emit the round's units (their
 * kind, groups, layers, member nodes, and once emitted their kernel);
 * after layer III the launches' units; after print the program's
 * launches; after plan its buffers.  Nothing when dump_after names
 * another stage (or none).  Each round writes its own dump. */
static void dump_stage(pipe *P, int id)
{
	const char *after = P->opt->dump_after;
	FILE *f = P->opt->dump_file ? P->opt->dump_file : stderr;
	const ap_program *prog = P->prog;

	if (!after || strcmp(after, stage_names[id]))
		return;
	fprintf(f, "== after %s\n", stage_names[id]);
	if (id == ST_EXPAND)
		for (int i = 0; i < P->eg->n_nodes; i++)
			fprintf(f, "node %d: %s %s\n", i, ap_op_name(P->eg->nodes[i].op),
				P->eg->nodes[i].name);
	if (id == ST_PARTITION)
		for (int gi = 0; gi < P->part->n_groups; gi++) {
			const ap_group *gr = &P->part->groups[gi];

			fprintf(f, "group %d: %s, subgraph %d:", gi, ap_group_kind_name(gr->kind),
				gr->subgraph);
			for (int j = 0; j < gr->n_nodes; j++)
				fprintf(f, " %s", P->part->g->nodes[gr->nodes[j]].name);
			fputc('\n', f);
		}
	if (id >= ST_MGRAPHS && id <= ST_EMIT)
		for (int i = 0; i < P->n_units; i++) {
			const unit *u = &P->units[i];
			const ap_mgraph *m = u->m;

			fprintf(f, "unit %d: %s, groups", i, ap_group_kind_name(m->kind));
			for (int q = 0; q < m->n_groups; q++)
				fprintf(f, "%s%d", q ? "," : " ", m->groups[q]);
			fprintf(f, ", layers%s%s%s%s", m->layers ? "" : " none",
				m->layers & AP_LAYER_I ? " I" : "", m->layers & AP_LAYER_II ? " II" : "",
				m->layers & AP_LAYER_III ? " III" : "");
			if (u->k)   /* named by content when printed */
				fprintf(f, ", kernel grid %ux%ux%u block %ux%ux%u", u->k->grid[0], u->k->grid[1], u->k->grid[2], u->k->block[0],
					u->k->block[1], u->k->block[2]);
			fputc(':', f);
			for (int j = 0; j < m->g->n_nodes; j++)
				if (m->member[j])
					fprintf(f, " %s", m->g->nodes[j].name);
			fputc('\n', f);
		}
	if (id == ST_LAYER3)
		for (int li = 0; li < P->n_launches; li++) {
			fprintf(f, "launch %d: units", li);
			for (int j = 0; j < P->launches[li].n; j++)
				fprintf(f, " %d", P->launches[li].units[j]);
			fputc('\n', f);
		}
	if (id == ST_PRINT)
		for (int li = 0; li < prog->n_launches; li++) {
			const ap_kernel_src *k = &prog->kernels[prog->launches[li].kernel];

			fprintf(f, "launch %d: %s grid %ux%ux%u block %ux%ux%u, %d nodes\n", li, k->name,
				k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2],
				prog->launches[li].n_nodes);
		}
	if (id == ST_PLAN)
		for (int i = 0; i < prog->n_buffers; i++)
			fprintf(f, "buffer %d: %s kind %d, %lld bytes at %lld\n", i, prog->buffers[i].name,
				(int)prog->buffers[i].kind, (long long)prog->buffers[i].nbytes,
				(long long)prog->buffers[i].offset);
	fflush(f);
}

/* ---- the stages of a round ---------------------------------------------------------
 * Each returns 0 (go on), 1 (a refusal was applied: the round runs again)
 * or an error with P->err set; `r` is the round's refusal record. */

/* micro-graphs: one unit per partition group, extracted as tasks. */
static int stage_mgraphs(pipe *P, refusal *r)
{
	(void)r;
	P->units = calloc((size_t)P->part->n_groups + 1, sizeof(unit));
	if (!P->units)
		return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
	P->n_units = P->part->n_groups;
	/* each micro-graph's share of the tuning budget: Layer II only
	 * merges units, so a round searches at most budget_evals */
	P->tune_share = P->opt->tune ? ap_tune_share(P->opt->tune, P->n_units) : 0;
	run_tasks(P, P->n_units, extract_task, P);
	for (int i = 0; i < P->n_units; i++)
		if (P->units[i].rc) {
			*P->err = P->units[i].err;
			return P->units[i].rc;
		}
	return 0;
}

/* layer I: window micro-graphs scheduled with isl; one that Layer I
 * wanted and refused (or the cost model turned down) is cut at its
 * pooling, with the reason in the explain report. */
static int stage_layer1(pipe *P, refusal *r)
{
	double t = ap_now_ms();
	unsigned n1 = 0;
	int rc;

	if (P->part->level != AP_FUSE_APOLLO || P->opt->no_layer1)
		return 0;
	run_tasks(P, P->n_units, layer1_task, P);
	for (int i = 0; i < P->n_units; i++) {
		unit *u = &P->units[i];

		if (u->rc) {
			*P->err = u->err;
			return u->rc;
		}
		if (l1_of(u)) {
			char *d = NULL;

			n1++;
			u->m->layers |= AP_LAYER_I;
			if (asprintf(&d, "Layer I: the pooled tensor is staged in shared memory per tile "
				     "(%.2f evaluations per element)", ap_fuse_layer1_recompute(l1_of(u))) < 0)
				return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
			free(u->m->detail);
			u->m->detail = d;
			continue;
		}
		if (!u->l1_why[0])
			continue;
		r->who = "layer I";
		snprintf(r->why, sizeof(r->why), "layer I: %s", u->l1_why);
		snprintf(r->node, sizeof(r->node), "%s", ap_fuse_layer1_window_name(u->m));
		r->unit = i;
		rc = apply_refusal(P, r, NULL);
		return rc ? rc : 1;
	}
	P->prog->layer_count[0] = n1;
	P->prog->layer1_ms += ap_now_ms() - t;
	return 0;
}

/* layer II: memory stitching (server/fuse/stitch.c) over the units;
 * Layer I's plans follow the micro-graphs it left alone. */
static int stage_layer2(pipe *P, refusal *r)
{
	unsigned n2 = 0;
	ap_mgraph **ms;
	unit *old;
	int n = P->n_units, rc;

	(void)r;
	if (P->part->level != AP_FUSE_APOLLO)
		return 0;
	ms = malloc(((size_t)P->n_units + 1) * sizeof(*ms));
	old = malloc(((size_t)P->n_units + 1) * sizeof(*old));
	if (!ms || !old) {
		free(ms);
		free(old);
		return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	for (int i = 0; i < n; i++)
		ms[i] = P->units[i].m;
	memcpy(old, P->units, (size_t)n * sizeof(*old));
	rc = ap_fuse_stitch(P->part, &ms, &n, P->no_stitch, &P->ti, &n2, P->err);
	/* the array now owns the micro-graphs (stitched parts were freed); a
	 * unit (Layer I's binding, plan and tile with it) follows its
	 * micro-graph where Layer II left it alone, a stitched one starts
	 * afresh */
	for (int i = 0; i < n; i++) {
		int j = 0;

		while (j < P->n_units && old[j].m != ms[i])
			j++;
		if (j < P->n_units) {
			P->units[i] = old[j];
			old[j].m = NULL;
		} else {
			memset(&P->units[i], 0, sizeof(P->units[i]));
			P->units[i].m = ms[i];
		}
	}
	for (int j = 0; j < P->n_units; j++)
		if (old[j].m)   /* stitched into another: its binding goes */
			ap_unbind(&old[j].b);
	for (int i = n; i < P->n_units; i++)
		memset(&P->units[i], 0, sizeof(P->units[i]));
	P->n_units = n;
	free(ms);
	free(old);
	if (rc)
		return rc;
	P->prog->layer_count[1] = n2;
	return 0;
}

/* The program's tuning counts: the sum of its units'. */
static void sum_tuning(pipe *P)
{
	P->prog->tune_hits = P->prog->tune_measured = P->prog->tune_searched = 0;
	P->prog->tune_tried = P->prog->tune_capped = 0;
	for (int i = 0; i < P->n_units; i++) {
		const unit *u = &P->units[i];

		P->prog->layer1_ms += u->l1_ms;
		P->prog->tune_hits += u->tuned == AP_TUNE_RECORD || u->tuned == AP_TUNE_MEASURED;
		P->prog->tune_measured += u->tuned == AP_TUNE_MEASURED;
		P->prog->tune_searched += u->tuned == AP_TUNE_SEARCHED;
		P->prog->tune_tried += u->tune_tried;
		P->prog->tune_capped += u->tune_capped;
		P->prog->tune_ms += u->tune_ms;
	}
}

/* emit: each unit lowered by its emitter (tasks), after the test hooks'
 * verdict; a unit its emitter refuses (AP_EUNSUPPORTED, AP_EINTERNAL) is
 * taken apart by the upper layers. */
static int stage_emit(pipe *P, refusal *r)
{
	int rc;

	for (int i = 0; i < P->n_units; i++) {
		char buf[200];
		const char *op, *why = hook_refuses(P, &P->units[i], buf, sizeof(buf), &op);

		if (why) {
			r->who = "lowering";
			snprintf(r->why, sizeof(r->why), "%s", why);
			r->unit = i;
			r->op = op;
			r->by_size = !op;
			rc = apply_refusal(P, r, NULL);
			return rc ? rc : 1;
		}
	}
	run_tasks(P, P->n_units, emit_task, P);
	sum_tuning(P);
	for (int i = 0; i < P->n_units; i++) {
		unit *u = &P->units[i];

		if (!u->rc)
			continue;
		if (u->rc != AP_EUNSUPPORTED && u->rc != AP_EINTERNAL) {
			*P->err = u->err;
			return u->rc;
		}
		r->who = "lowering";
		snprintf(r->why, sizeof(r->why), "%s", u->err.msg);
		snprintf(r->node, sizeof(r->node), "%s", u->err.node);
		r->unit = i;
		rc = apply_refusal(P, r, &u->err);
		return rc ? rc : 1;
	}
	return 0;
}

/* layer III: parallelism stitching (server/fuse/horizontal.c), the units'
 * kernels grouped into launches. */
static int stage_layer3(pipe *P, refusal *r)
{
	ap_kir_kernel **ks = malloc(((size_t)P->n_units + 1) * sizeof(*ks));
	ap_traffic *tr = malloc(((size_t)P->n_units + 1) * sizeof(*tr));
	const ap_mgraph **ms = malloc(((size_t)P->n_units + 1) * sizeof(*ms));
	unsigned n3 = 0;
	int rc;

	(void)r;
	if (!ks || !tr || !ms) {
		free(ks);
		free(tr);
		free(ms);
		return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	for (int i = 0; i < P->n_units; i++) {
		ks[i] = P->units[i].k;
		tr[i] = P->units[i].traffic;
		ms[i] = P->units[i].m;
		/* a build of candidates to time: each tuned kernel alone */
		if (P->opt->tune && P->opt->tune->variant && P->units[i].k &&
		    P->units[i].tuned != AP_TUNE_DEFAULT)
			for (int q = 0; q < ms[i]->n_groups; q++)
				P->no_merge[ms[i]->groups[q]] = true;
	}
	rc = ap_fuse_horizontal(P->part, ms, ks, tr, P->n_units, P->part->level == AP_FUSE_APOLLO,
				P->no_merge, &P->ti, &P->launches, &P->n_launches, &n3, P->err);
	free(ks);
	free(tr);
	free(ms);
	if (rc)
		return rc;
	P->prog->layer_count[2] = n3;
	return 0;
}

/* print: each launch's kernel printed once for the target and offered to
 * the backend hook; a refused one is taken apart. */
static int stage_print(pipe *P, refusal *r)
{
	int rc;

	P->launch_of_unit = malloc(((size_t)P->n_units + 1) * sizeof(int));
	if (!P->launch_of_unit)
		return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (int i = 0; i < P->n_units; i++)
		P->launch_of_unit[i] = -1;
	for (int li = 0; li < P->n_launches; li++) {
		int ki = print_launch(P, li, r);

		if (ki == REFUSED) {
			rc = apply_refusal(P, r, NULL);
			return rc ? rc : 1;
		}
		if (ki < 0)
			return ki;
		if (add_launch(P, li, ki) < 0)
			return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
		for (int j = 0; j < P->launches[li].n; j++)
			P->launch_of_unit[P->launches[li].units[j]] = P->prog->n_launches - 1;
	}
	return 0;
}

/* The stages of a round, in order (the file comment). */
static const struct {
	int id;                      /* ST_*: its stage_ms slot and name */
	int (*run)(pipe *P, refusal *r);
} round_stages[] = {
	{ ST_MGRAPHS, stage_mgraphs }, { ST_LAYER1, stage_layer1 }, { ST_LAYER2, stage_layer2 },
	{ ST_EMIT, stage_emit },       { ST_LAYER3, stage_layer3 }, { ST_PRINT, stage_print },
};

/* One round, from the partition to printed launches: the stages in order,
 * each timed, the round's state dumped after the stage opt->dump_after
 * names.  0 (done), 1 (a refusal was applied: run again), or an error. */
static int round_once(pipe *P)
{
	refusal r;

	memset(&r, 0, sizeof(r));
	r.launch = -1;
	units_clear(P);
	program_reset(P->prog);
	kernel_names_free(P);
	for (size_t i = 0; i < sizeof(round_stages) / sizeof(round_stages[0]); i++) {
		double t;
		int rc;

		stage_begin(P->opt, round_stages[i].id);
		t = ap_now_ms();
		rc = round_stages[i].run(P, &r);

		P->prog->stage_ms[round_stages[i].id] += ap_now_ms() - t;
		if (rc)
			return rc;
		dump_stage(P, round_stages[i].id);
	}
	return 0;
}

static int plan(pipe *P)
{
	int *launch_of = malloc(((size_t)P->part->n_groups + 1) * sizeof(int));
	int rc;

	if (!launch_of)
		return ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (int gi = 0; gi < P->part->n_groups; gi++)
		launch_of[gi] = -1;
	for (int i = 0; i < P->n_units; i++)
		for (int q = 0; q < P->units[i].m->n_groups; q++)
			launch_of[P->units[i].m->groups[q]] = P->launch_of_unit[i];
	rc = ap__plan_buffers(P->prog, P->part->g, P->g, P->err);
	if (!rc && ap__plan_explain(P->prog, P->part, P->g, &P->choices, launch_of) < 0)
		rc = ap_error_set(P->err, AP_ENOMEM, NULL, NULL, "out of memory");
	free(launch_of);
	return rc;
}

/* Sets up a build of g under opt: the target's figures (limits, TF32,
 * test hooks), the printer, and the options of the expand and partition
 * stages (xopt, popt; popt->target points into P).  0, or AP_EUNSUPPORTED
 * (unknown target) / AP_EINVAL (dump_after names no stage) with `err`. */
static int pipe_init(pipe *P, const ap_graph *g, const ap_build_options *opt,
		     ap_expand_options *xopt, ap_partition_options *popt, ap_error *err)
{
	memset(P, 0, sizeof(*P));
	P->g = g;
	P->opt = opt ? opt : &P->dflt;
	P->err = err;
	if (ap_cost_target(P->opt->target, &P->ti) < 0)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL, "unknown target '%.64s'",
				    P->opt->target);
	if (P->opt->dump_after && !stage_known(P->opt->dump_after))
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "dump after '%.64s': no such stage (%s)",
				    P->opt->dump_after, STAGE_LIST);
	P->ti.max_threads_per_block = P->opt->max_block_threads ? P->opt->max_block_threads : 256;
	/* the default cap bounds the threads that compute: a warp-specialised
	 * kernel's producer warpgroup may come on top (two compute warpgroups
	 * and a producer: 384); a request's own cap is the whole block's */
	P->ti.ws_threads = P->opt->max_block_threads ? 0 : 128;
	P->ti.allow_tf32 = P->opt->allow_tf32;
	P->ti.tma = P->opt->tma || P->opt->unvalidated;
	P->ti.unvalidated = P->opt->unvalidated;
	if (P->opt->hooks && P->opt->hooks->direct_gflops > 0)
		P->ti.direct_gflops = P->opt->hooks->direct_gflops;
	/* a GPU target prints CUDA C, unless emulated on the host ("host:") */
	P->print_target = P->ti.gpu && strncmp(P->opt->target, "host:", 5) ? AP_KIR_CUDA
			: P->opt->host_check ? AP_KIR_HOST_CHECK : AP_KIR_HOST;
	/* an emulated GPU target's kernels run on the host to be checked, not
	 * for speed: one baseline build each (no x86-64-v3 clone, half the cc
	 * time; emulated.sh's sm_90a families 100 s -> 53 s) */
	P->print_flags = P->ti.gpu && P->print_target != AP_KIR_CUDA ? AP_KIR_PRINT_BASELINE : 0;
	xopt->n_keep_whole = P->opt->n_keep_whole;
	xopt->keep_whole = P->opt->keep_whole;
	xopt->open_all = P->opt->hooks && P->opt->hooks->open_all;
	popt->level = P->opt->fusion;
	popt->max_group_nodes = P->opt->max_group_nodes;
	popt->max_recompute = P->opt->max_recompute;
	popt->n_barriers = P->opt->n_fusion_barriers;
	popt->barriers = P->opt->fusion_barriers;
	popt->target = &P->ti;
	popt->no_layer1 = P->opt->no_layer1;
	return 0;
}

__ap_give ap_program *ap_program_build(__ap_keep const ap_graph *g, const ap_build_options *opt,
				       ap_error *err)
{
	pipe P;
	ap_expand_options xopt = {0};
	ap_partition_options popt = {0};
	double t0 = ap_now_ms(), t;
	int rc = 0, rounds = 0;

	if (pipe_init(&P, g, opt, &xopt, &popt, err))
		return NULL;
	P.prog = calloc(1, sizeof(*P.prog));
	if (!P.prog) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory building the program");
		return NULL;
	}
	P.prog->target = P.print_target;
	stage_begin(P.opt, ST_EXPAND);
	t = ap_now_ms();
	P.eg = ap_partition_expand(g, &xopt, &P.choices, err);
	P.prog->stage_ms[ST_EXPAND] = ap_now_ms() - t;
	if (!P.eg)
		goto fail;
	dump_stage(&P, ST_EXPAND);
	stage_begin(P.opt, ST_PARTITION);
	t = ap_now_ms();
	P.part = ap_partition_build(P.eg, &popt, err);
	P.prog->stage_ms[ST_PARTITION] = ap_now_ms() - t;
	if (!P.part)
		goto fail;
	dump_stage(&P, ST_PARTITION);
	P.prog->partition_ms = ap_now_ms() - t0;
	P.no_stitch = calloc((size_t)P.part->n_groups + 1, sizeof(bool));
	P.no_merge = calloc((size_t)P.part->n_groups + 1, sizeof(bool));
	if (!P.no_stitch || !P.no_merge) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory building the program");
		goto fail;
	}
	/* a fusion barrier (a user's hint) starts a new kernel at every layer:
	 * its group is neither stitched nor launched with others */
	for (int i = 0; i < P.part->n_boundaries; i++) {
		const ap_boundary *bd = &P.part->boundaries[i];
		int gc = P.part->group_of[bd->consumer];

		if (bd->reason == AP_WHY_HINT && gc >= 0)
			P.no_stitch[gc] = P.no_merge[gc] = true;
	}
	t = ap_now_ms();
	while ((rc = round_once(&P)) == 1) {
		if (++rounds > MAX_ROUNDS) {
			ap_error_set(err, AP_EINTERNAL, NULL, NULL, "refusals did not converge");
			goto fail;
		}
	}
	if (rc < 0)
		goto fail;
	stage_begin(P.opt, ST_PLAN);
	t = ap_now_ms();
	if (plan(&P) < 0)
		goto fail;
	P.prog->stage_ms[ST_PLAN] = ap_now_ms() - t;
	dump_stage(&P, ST_PLAN);
	P.prog->codegen_ms = ap_now_ms() - t0 - P.prog->partition_ms - P.hook_ms;
	units_clear(&P);
	kernel_names_free(&P);
	free(P.no_stitch);
	free(P.no_merge);
	ap_expand_choices_clear(&P.choices);
	ap_partition_free(P.part);
	ap_graph_free(P.eg);
	return P.prog;
fail:
	if (err && !err->code)
		ap_error_set(err, AP_EINTERNAL, NULL, NULL, "building the program failed");
	units_clear(&P);
	kernel_names_free(&P);
	free(P.no_stitch);
	free(P.no_merge);
	ap_expand_choices_clear(&P.choices);
	ap_partition_free(P.part);
	ap_graph_free(P.eg);
	return ap_program_free(P.prog);
}
