/* recompute.c -- duplicating cheap producers into their consumers, step
 * 5 of partition.c, at level apollo: a refinement of APOLLO's partition
 * phase (MLSys 2022, section 3), not one of its aggregation rules, that
 * recomputes an intermediate inside each micro-graph that reads it instead
 * of writing it to memory and reading it back.
 *
 * In: a grouping (ap_pctx) of a graph.  Out: a rewritten copy of the graph
 * in which the chosen producers are cloned, or nothing to do.
 * A cheap group P (elementwise, broadcast, injective, transpose; at most
 * MAX_CLONE_NODES members) whose results are read by groups it may not
 * join is duplicated into those consumers C whose rules allow it
 * (clone_check: the rules table, barriers, the size cap, the recompute
 * cap) when the modelled global-memory bytes go down: each C then computes
 * the slice of P it needs from P's inputs (choose_dups).  The rewrite
 * (rewrite) clones each slice, and the read-through views after it, right
 * after its originals, and points C's members at the clones; the driver
 * then groups the new graph again.  A group is a producer or a consumer
 * of one duplication per round, never both.
 */
#include "partition_internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_CLONE_NODES 16

/* ---- which producers, into which consumers ----------------------------------------- */

typedef struct dup {
	int P, C;            /* roots */
	int n_nodes;
	int *nodes;          /* members of P that C needs, ascending */
} dup;

static bool cheap(ap_pctx *c, int p)
{
	int k = c->kind[p];

	return (is_ewbc(k) || is_inj(k)) && c->size[p] <= MAX_CLONE_NODES;
}

/* Members of P on which the tensors of P that group C reads depend, into
 * out (ascending); returns the count. */
static int slice_for(ap_pctx *c, int P, int C, int *out)
{
	const ap_graph *g = c->g;
	int n = ap__partition_members(c, P, -1), k = 0;

	c->mark_stamp++;
	/* seeds: members with an output C reads */
	for (int i = 0; i < n; i++) {
		const ap_node *node = &g->nodes[c->list[i]];

		for (int o = 0; o < node->n_outputs; o++) {
			int t = node->outputs[o];

			if (t < 0)
				continue;
			for (int r = c->rd_off[t]; r < c->rd_off[t + 1]; r++)
				if (find(c, c->rd[r]) == C)
					c->mark[c->list[i]] = c->mark_stamp;
		}
	}
	/* backwards through P */
	for (int i = n - 1; i >= 0; i--) {
		const ap_node *node = &g->nodes[c->list[i]];

		if (c->mark[c->list[i]] != c->mark_stamp)
			continue;
		for (int in = 0; in < node->n_inputs; in++) {
			int t = node->inputs[in], u;

			if (t < 0)
				continue;
			u = g->tensors[source_of(g, c->through, t)].producer;
			if (u >= 0 && find(c, u) == P)
				c->mark[u] = c->mark_stamp;
		}
	}
	for (int i = 0; i < n; i++)
		if (c->mark[c->list[i]] == c->mark_stamp)
			out[k++] = c->list[i];
	return k;
}

/* Marks in c->tmark, under a fresh c->tmark_stamp, every tensor group
 * `grp` reads: its members' inputs and the tensors read-through views of
 * them read (t is marked exactly when a member is among t's readers). */
static void reads_mark(ap_pctx *c, int grp)
{
	const ap_graph *g = c->g;

	c->tmark_stamp++;
	for (int m = c->head[grp]; m >= 0; m = c->next[m]) {
		const ap_node *node = &g->nodes[m];

		for (int i = 0; i < node->n_inputs; i++)
			for (int t = node->inputs[i]; t >= 0; t = view_source_of(g, c->through, t))
				c->tmark[t] = c->tmark_stamp;
	}
}

typedef enum clone_status { CLONE_OK, CLONE_RULE, CLONE_COST, CLONE_SIZE } clone_status;

/* May group C compute the slice `nodes` of cheap group P itself?  *gain
 * gets the bytes C saves (reads of P's results minus new reads of P's
 * inputs), *cost the recompute cost. */
static clone_status clone_check(ap_pctx *c, int P, int C, const int *nodes, int n, int64_t *gain,
				double *cost)
{
	const ap_graph *g = c->g;

	*gain = 0;
	*cost = 0;
	if (c->level != AP_FUSE_APOLLO || !cheap(c, P))
		return CLONE_RULE;
	if (c->kind[C] == AP_GROUP_OPAQUE || c->kind[C] == AP_GROUP_WHOLE ||
	    (c->kind[C] == AP_GROUP_WINDOW && c->no_layer1))
		return CLONE_RULE;
	if (ap__partition_merged_kind(c->kind[P], c->kind[C], c->level, NULL, 0) < 0)
		return CLONE_RULE;
	if (ap__partition_barrier_hit(c, P, C, NULL, 0))
		return CLONE_RULE;
	if ((unsigned)(c->size[C] + n) > c->max_nodes)
		return CLONE_SIZE;
	*cost = ap__partition_recompute_cost(c, P, C, nodes, n);
	if (*cost > c->max_recompute)
		return CLONE_COST;
	/* bytes: P's results C stops reading, P's inputs it starts reading */
	reads_mark(c, C);
	c->mark_stamp++;
	for (int i = 0; i < n; i++)
		c->mark[nodes[i]] = c->mark_stamp;
	for (int i = 0; i < n; i++) {
		const ap_node *node = &g->nodes[nodes[i]];

		for (int o = 0; o < node->n_outputs; o++)
			if (node->outputs[o] >= 0 && c->tmark[node->outputs[o]] == c->tmark_stamp)
				*gain += (int64_t)tensor_bytes(g, node->outputs[o]);
	}
	c->t_stamp++;      /* inputs counted once */
	for (int i = 0; i < n; i++) {
		const ap_node *node = &g->nodes[nodes[i]];

		for (int in = 0; in < node->n_inputs; in++) {
			int t, u;

			if (node->inputs[in] < 0)
				continue;
			t = source_of(g, c->through, node->inputs[in]);
			u = g->tensors[t].producer;
			if (g->tensors[t].kind == AP_TENSOR_CONST || (u >= 0 && c->mark[u] == c->mark_stamp))
				continue;
			if (c->t_mark[t] == c->t_stamp || c->tmark[t] == c->tmark_stamp)
				continue;
			c->t_mark[t] = c->t_stamp;
			*gain -= (int64_t)tensor_bytes(g, t);
		}
	}
	return CLONE_OK;
}

/* Bytes group P reads (distinct, from memory). */
static int64_t group_read_bytes(ap_pctx *c, int P)
{
	const ap_graph *g = c->g;
	int64_t b = 0;

	c->t_stamp++;
	for (int m = c->head[P]; m >= 0; m = c->next[m]) {
		const ap_node *node = &g->nodes[m];

		for (int in = 0; in < node->n_inputs; in++) {
			int t, u;

			if (node->inputs[in] < 0)
				continue;
			t = source_of(g, c->through, node->inputs[in]);
			u = g->tensors[t].producer;
			if (g->tensors[t].kind == AP_TENSOR_CONST || (u >= 0 && find(c, u) == P) ||
			    c->t_mark[t] == c->t_stamp)
				continue;
			c->t_mark[t] = c->t_stamp;
			b += (int64_t)tensor_bytes(g, t);
		}
	}
	return b;
}

/* Chooses the duplications of this round; returns how many (in *out). */
static int choose_dups(ap_pctx *c, dup **out, ap_error *err)
{
	const ap_graph *g = c->g;
	int n_dup = 0, cap = 0;
	dup *d = NULL;
	int *flag = calloc((size_t)c->N + 1, sizeof(int));   /* 1 producer, 2 consumer */
	int *cons = malloc(((size_t)c->N + 1) * sizeof(int));
	int *slice = malloc(((size_t)c->N + 1) * sizeof(int));
	int64_t *gain = malloc(((size_t)c->N + 1) * sizeof(int64_t));
	bool *ok = malloc(((size_t)c->N + 1) * sizeof(bool));

	*out = NULL;
	if (!flag || !cons || !slice || !gain || !ok)
		goto nomem;
	for (int P = 0; P < c->N; P++) {
		int n_cons = 0;
		int64_t saved = 0;
		bool remains = false, any = false;

		if (c->head[P] < 0 || find(c, P) != P || flag[P] || !cheap(c, P))
			continue;
		/* consumer groups of P's written tensors */
		c->cur_stamp++;
		for (int m = c->head[P]; m >= 0; m = c->next[m]) {
			const ap_node *node = &g->nodes[m];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o];

				if (t < 0)
					continue;
				if (g->tensors[t].is_output)
					remains = true;
				for (int r = c->rd_off[t]; r < c->rd_off[t + 1]; r++) {
					int h = find(c, c->rd[r]);

					if (h != P && c->stamp[h] != c->cur_stamp) {
						c->stamp[h] = c->cur_stamp;
						cons[n_cons++] = h;
					}
				}
			}
		}
		if (n_cons == 0)
			continue;
		for (int i = 0; i < n_cons; i++) {
			double cost;
			int n = slice_for(c, P, cons[i], slice);

			ok[i] = flag[cons[i]] != 1 &&
				clone_check(c, P, cons[i], slice, n, &gain[i], &cost) == CLONE_OK;
		}
		/* drop consumers that lose bytes, unless that keeps P alive */
		for (int round = 0; round < 2; round++) {
			bool all = !remains;
			int64_t s = 0;

			for (int i = 0; i < n_cons; i++) {
				if (!ok[i])
					all = false;
				else
					s += gain[i];
			}
			/* tensors no longer written: those only the absorbing consumers read */
			for (int m = c->head[P]; m >= 0; m = c->next[m]) {
				const ap_node *node = &g->nodes[m];

				for (int o = 0; o < node->n_outputs; o++) {
					int t = node->outputs[o];
					bool keep = false, read = false;

					if (t < 0)
						continue;
					if (g->tensors[t].is_output)
						keep = true;
					for (int r = c->rd_off[t]; r < c->rd_off[t + 1]; r++) {
						int h = find(c, c->rd[r]);

						if (h == P)
							continue;
						read = true;
						for (int i = 0; i < n_cons; i++)
							if (cons[i] == h && !ok[i])
								keep = true;
					}
					if (read && !keep)
						s += (int64_t)tensor_bytes(g, t);
				}
			}
			if (all)
				s += group_read_bytes(c, P);
			saved = s;
			if (saved > 0 || round == 1)
				break;
			for (int i = 0; i < n_cons; i++)
				if (ok[i] && gain[i] <= 0)
					ok[i] = false;
		}
		for (int i = 0; i < n_cons; i++)
			if (ok[i])
				any = true;
		if (saved <= 0 || !any)
			continue;
		flag[P] = 1;
		for (int i = 0; i < n_cons; i++) {
			int n;

			if (!ok[i])
				continue;
			if (n_dup == cap) {
				int ncap = cap ? 2 * cap : 8;
				dup *nd = realloc(d, (size_t)ncap * sizeof(*nd));

				if (!nd)
					goto nomem;
				d = nd;
				cap = ncap;
			}
			n = slice_for(c, P, cons[i], slice);
			d[n_dup].P = P;
			d[n_dup].C = cons[i];
			d[n_dup].n_nodes = n;
			d[n_dup].nodes = malloc(((size_t)n + 1) * sizeof(int));
			if (!d[n_dup].nodes)
				goto nomem;
			memcpy(d[n_dup].nodes, slice, (size_t)n * sizeof(int));
			n_dup++;
			flag[cons[i]] = 2;
		}
	}
	free(flag);
	free(cons);
	free(slice);
	free(gain);
	free(ok);
	*out = d;
	return n_dup;
nomem:
	for (int i = 0; i < n_dup; i++)
		free(d[i].nodes);
	free(d);
	free(flag);
	free(cons);
	free(slice);
	free(gain);
	free(ok);
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory choosing producers to recompute");
	return AP_ENOMEM;
}

/* ---- the rewrite ---------------------------------------------------------------------- */

/* What one rewrite clones: per node, the duplications that clone it
 * (ascending) as "slots", and per slot the tensors the clone writes. */
typedef struct clones {
	int *off;            /* per node, + 1: its slots (CSR) */
	int *dup_of;         /* per slot: the duplication */
	int *out_off;        /* per slot: where its tensors start in `outs` */
	int *outs;           /* per slot and output of the node: the clone's tensor
				(in the new graph), -1 for an absent output */
} clones;

/* The tensor duplication k's clone of t's producer writes in t's place, or
 * -1 when k does not clone that producer. */
static int clone_tensor(const ap_graph *g, const clones *cl, int k, int t)
{
	int p = g->tensors[t].producer;

	if (p < 0)
		return -1;
	for (int s = cl->off[p]; s < cl->off[p + 1]; s++) {
		if (cl->dup_of[s] != k)
			continue;
		for (int o = 0; o < g->nodes[p].n_outputs; o++)
			if (g->nodes[p].outputs[o] == t)
				return cl->outs[cl->out_off[s] + o];
	}
	return -1;
}

/* Appends v to a list that grows by doubling. */
static int push_int(int **arr, int *n, int *cap, int v)
{
	if (*n == *cap) {
		int ncap = *cap ? 2 * *cap : 64;
		int *na = realloc(*arr, (size_t)ncap * sizeof(int));

		if (!na)
			return AP_ENOMEM;
		*arr = na;
		*cap = ncap;
	}
	(*arr)[(*n)++] = v;
	return 0;
}

/* A copy of c->g in which each duplication's nodes (and the read-through
 * views after them) are cloned right after their originals and the
 * consumer group's members read the clones.  Sets *n_cloned.  Linear in
 * the graph plus the clones. */
static ap_graph *rewrite(ap_pctx *c, const dup *d, int n_dup, int base, int *n_cloned, ap_error *err)
{
	const ap_graph *g = c->g;
	ap_graph *ng = ap_graph_new(g->name);
	clones cl = {0};
	int N = c->N, T = c->T, n_set = 0, cap_set = 0, n_slots, n_outs = 0;
	int *vr_off = calloc((size_t)T + 2, sizeof(int));     /* per tensor: through readers, CSR */
	int *vr = malloc(((size_t)N + 1) * sizeof(int));
	int *set = NULL;                                      /* clone sets, one after another */
	int *set_off = malloc(((size_t)n_dup + 1) * sizeof(int));
	int *slot_of = NULL;                                  /* per entry of `set`: its slot */
	int *fill = calloc((size_t)(N > T ? N : T) + 1, sizeof(int));   /* CSR fill, per tensor or node */
	int *ins = malloc(((size_t)T + 1) * sizeof(int));
	int *outs = malloc(((size_t)T + 1) * sizeof(int));
	char name[400];

	*n_cloned = 0;
	cl.off = calloc((size_t)N + 2, sizeof(int));
	if (!ng || !vr_off || !vr || !set_off || !fill || !ins || !outs || !cl.off)
		goto nomem;
	for (int t = 0; t < g->n_tensors; t++) {
		const ap_tensor *x = &g->tensors[t];
		int idx = ap_graph_add_tensor(ng, x->name, x->dtype, x->rank, x->dims, x->kind,
					      x->kind == AP_TENSOR_CONST ? x->data : NULL,
					      x->kind == AP_TENSOR_CONST ? x->nbytes : 0);

		if (idx < 0)
			goto nomem;
		ng->tensors[idx].is_output = x->is_output;
	}
	ng->inputs = malloc(((size_t)g->n_inputs + 1) * sizeof(int));
	ng->outputs = malloc(((size_t)g->n_outputs + 1) * sizeof(int));
	if (!ng->inputs || !ng->outputs)
		goto nomem;
	memcpy(ng->inputs, g->inputs, (size_t)g->n_inputs * sizeof(int));
	memcpy(ng->outputs, g->outputs, (size_t)g->n_outputs * sizeof(int));
	ng->n_inputs = g->n_inputs;
	ng->n_outputs = g->n_outputs;
	ng->eager_kernels = g->eager_kernels;
	/* read-through nodes by the tensor they read */
	for (int n = 0; n < N; n++)
		if (c->through[n])
			vr_off[g->nodes[n].inputs[0] + 1]++;
	for (int t = 0; t < T; t++)
		vr_off[t + 1] += vr_off[t];
	for (int n = 0; n < N; n++)
		if (c->through[n])
			vr[vr_off[g->nodes[n].inputs[0]] + fill[g->nodes[n].inputs[0]]++] = n;
	/* clone sets: the slice, then read-through nodes reading a clone */
	for (int k = 0; k < n_dup; k++) {
		set_off[k] = n_set;
		c->mark_stamp++;
		for (int i = 0; i < d[k].n_nodes; i++) {
			c->mark[d[k].nodes[i]] = c->mark_stamp;
			if (push_int(&set, &n_set, &cap_set, d[k].nodes[i]) < 0)
				goto nomem;
		}
		for (int i = set_off[k]; i < n_set; i++) {
			const ap_node *node = &g->nodes[set[i]];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o];

				if (t < 0)
					continue;
				for (int r = vr_off[t]; r < vr_off[t + 1]; r++) {
					if (c->mark[vr[r]] == c->mark_stamp)
						continue;
					c->mark[vr[r]] = c->mark_stamp;
					if (push_int(&set, &n_set, &cap_set, vr[r]) < 0)
						goto nomem;
				}
			}
		}
		qsort(set + set_off[k], (size_t)(n_set - set_off[k]), sizeof(int), cmp_int);
	}
	set_off[n_dup] = n_set;
	/* slots: per node, its duplications in ascending order */
	n_slots = n_set;
	cl.dup_of = malloc(((size_t)n_slots + 1) * sizeof(int));
	cl.out_off = malloc(((size_t)n_slots + 1) * sizeof(int));
	slot_of = malloc(((size_t)n_slots + 1) * sizeof(int));
	if (!cl.dup_of || !cl.out_off || !slot_of)
		goto nomem;
	for (int i = 0; i < n_set; i++)
		cl.off[set[i] + 1]++;
	for (int n = 0; n < N; n++)
		cl.off[n + 1] += cl.off[n];
	memset(fill, 0, ((size_t)N + 1) * sizeof(int));
	for (int k = 0; k < n_dup; k++) {
		for (int i = set_off[k]; i < set_off[k + 1]; i++) {
			int s = cl.off[set[i]] + fill[set[i]]++;

			cl.dup_of[s] = k;
			slot_of[i] = s;
		}
	}
	for (int n = 0; n < N; n++) {
		for (int s = cl.off[n]; s < cl.off[n + 1]; s++) {
			cl.out_off[s] = n_outs;
			n_outs += g->nodes[n].n_outputs;
		}
	}
	cl.outs = malloc(((size_t)n_outs + 1) * sizeof(int));
	if (!cl.outs)
		goto nomem;
	/* the clones' tensors, duplication by duplication, in node order */
	for (int k = 0; k < n_dup; k++) {
		for (int i = set_off[k]; i < set_off[k + 1]; i++) {
			const ap_node *node = &g->nodes[set[i]];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o], nt = -1;

				if (t >= 0) {
					const ap_tensor *x = &g->tensors[t];

					snprintf(name, sizeof(name), "%s~%d", x->name, base + k);
					nt = ap_graph_add_tensor(ng, name, x->dtype, x->rank, x->dims,
								 AP_TENSOR_VALUE, NULL, 0);
					if (nt < 0)
						goto nomem;
				}
				cl.outs[cl.out_off[slot_of[i]] + o] = nt;
			}
		}
	}
	for (int n = 0; n < N; n++) {
		const ap_node *node = &g->nodes[n];
		int r = find(c, n);

		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i], p = t >= 0 ? g->tensors[t].producer : -1;

			ins[i] = t;
			if (p < 0 || c->through[n] || c->head[r] < 0)
				continue;
			/* the first duplication into n's group that clones t's producer */
			for (int s = cl.off[p]; s < cl.off[p + 1]; s++) {
				if (d[cl.dup_of[s]].C == r) {
					ins[i] = clone_tensor(g, &cl, cl.dup_of[s], t);
					break;
				}
			}
		}
		if (ap__partition_copy_node(ng, node, ins, node->outputs) < 0)
			goto nomem;
		for (int s = cl.off[n]; s < cl.off[n + 1]; s++) {
			int k = cl.dup_of[s];

			for (int i = 0; i < node->n_inputs; i++) {
				int t = node->inputs[i], ct = t >= 0 ? clone_tensor(g, &cl, k, t) : -1;

				ins[i] = ct >= 0 ? ct : t;
			}
			for (int o = 0; o < node->n_outputs; o++)
				outs[o] = node->outputs[o] >= 0 ? cl.outs[cl.out_off[s] + o] : -1;
			if (ap__partition_copy_node(ng, node, ins, outs) < 0)
				goto nomem;
			if (!c->through[n])
				(*n_cloned)++;
		}
	}
	goto out;
nomem:
	ap_graph_free(ng);
	ng = NULL;
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory duplicating producers");
out:
	free(vr_off);
	free(vr);
	free(set);
	free(set_off);
	free(slot_of);
	free(fill);
	free(ins);
	free(outs);
	free(cl.off);
	free(cl.dup_of);
	free(cl.out_off);
	free(cl.outs);
	return ng;
}

/* ---- the entries -------------------------------------------------------------------------- */

int ap__partition_recompute(ap_pctx *c, int base, ap_graph **out, int *n_cloned, ap_error *err)
{
	dup *d = NULL;
	int n_dup = choose_dups(c, &d, err);

	*out = NULL;
	*n_cloned = 0;
	if (n_dup <= 0)
		return n_dup;
	*out = rewrite(c, d, n_dup, base, n_cloned, err);
	for (int i = 0; i < n_dup; i++)
		free(d[i].nodes);
	free(d);
	return *out ? n_dup : AP_ENOMEM;
}

bool ap__partition_recompute_why(ap_pctx *c, int p, int q, char *why, size_t cap)
{
	int64_t gain;
	double cost;
	int n;
	clone_status s;

	if (c->level != AP_FUSE_APOLLO || !cheap(c, p))
		return false;
	n = slice_for(c, p, q, c->slice);
	s = clone_check(c, p, q, c->slice, n, &gain, &cost);
	if (s == CLONE_COST)
		say(why, cap, "recompute: its producers are read elsewhere too, and "
			      "recomputing them here would evaluate them %.0f times per "
			      "element (cap %u)", cost, c->max_recompute);
	else if (s == CLONE_OK)
		say(why, cap, "recompute: its producers are read elsewhere too, and "
			      "recomputing them here would not save global-memory bytes");
	return s == CLONE_COST || s == CLONE_OK;
}
