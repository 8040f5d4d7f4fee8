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

/* ---- which producers, into which consumers ------------------------------------ */

typedef struct dup {
	int P, C;            /* roots */
	int n_nodes;
	int *nodes;          /* members of P that C needs, ascending */
} dup;

/* May group p be duplicated: elementwise, broadcast, injective or
 * transpose, of at most MAX_CLONE_NODES members? */
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

/* What choose_dups works with: per root and per consumer of the producer
 * at hand, and the duplications chosen so far. */
typedef struct choice {
	int *flag;           /* per root: 1 a duplicated producer, 2 a consumer
				that takes a duplicate (each in one per round) */
	int *cons;           /* the consumer groups of the producer at hand */
	int n_cons;
	int *slice;          /* scratch for slice_for */
	int64_t *gain;       /* per consumer: the bytes it saves (clone_check),
				meaningful where ok */
	bool *ok;            /* per consumer: it takes a duplicate */
	dup *d;              /* the duplications chosen, n_dup of cap */
	int n_dup, cap;
} choice;

/* The consumer groups of group P's written tensors, each once, into cons;
 * returns their count.  *remains gets whether one of those tensors is a
 * graph output (then P's writes stay whatever its consumers do). */
static int consumers(ap_pctx *c, int P, int *cons, bool *remains)
{
	const ap_graph *g = c->g;
	int n_cons = 0;

	*remains = false;
	c->cur_stamp++;
	for (int m = c->head[P]; m >= 0; m = c->next[m]) {
		const ap_node *node = &g->nodes[m];

		for (int o = 0; o < node->n_outputs; o++) {
			int t = node->outputs[o];

			if (t < 0)
				continue;
			if (g->tensors[t].is_output)
				*remains = true;
			for (int r = c->rd_off[t]; r < c->rd_off[t + 1]; r++) {
				int h = find(c, c->rd[r]);

				if (h != P && c->stamp[h] != c->cur_stamp) {
					c->stamp[h] = c->cur_stamp;
					cons[n_cons++] = h;
				}
			}
		}
	}
	return n_cons;
}

/* Bytes of P's written tensors that P stops writing when the consumers
 * marked ok take duplicates: those read outside P, only by them, and not
 * graph outputs. */
static int64_t unwritten_bytes(ap_pctx *c, const choice *s, int P)
{
	const ap_graph *g = c->g;
	int64_t b = 0;

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
				for (int i = 0; i < s->n_cons; i++)
					if (s->cons[i] == h && !s->ok[i])
						keep = true;
			}
			if (read && !keep)
				b += (int64_t)tensor_bytes(g, t);
		}
	}
	return b;
}

/* The bytes duplicating P into the consumers marked ok saves: their gains,
 * P's writes that go away, and P's reads when every consumer takes a
 * duplicate and P writes no graph output (`remains` false).  Consumers
 * that lose bytes stay when the total is positive (they may be what lets
 * P's writes and reads go away); otherwise they are dropped (s->ok
 * cleared) and the bytes counted again. */
static int64_t savings(ap_pctx *c, choice *s, int P, bool remains)
{
	int64_t saved = 0;

	/* drop consumers that lose bytes, unless that keeps P alive */
	for (int round = 0; round < 2; round++) {
		bool all = !remains;
		int64_t sum = 0;

		for (int i = 0; i < s->n_cons; i++) {
			if (!s->ok[i])
				all = false;
			else
				sum += s->gain[i];
		}
		/* tensors no longer written: those only the absorbing consumers read */
		sum += unwritten_bytes(c, s, P);
		if (all)
			sum += group_read_bytes(c, P);
		saved = sum;
		if (saved > 0 || round == 1)
			break;
		for (int i = 0; i < s->n_cons; i++)
			if (s->ok[i] && s->gain[i] <= 0)
				s->ok[i] = false;
	}
	return saved;
}

/* Records a duplication of P (its slice each needs) into every consumer
 * marked ok, and flags them.  0 or AP_ENOMEM. */
static int record(ap_pctx *c, choice *s, int P)
{
	s->flag[P] = 1;
	for (int i = 0; i < s->n_cons; i++) {
		int n;

		if (!s->ok[i])
			continue;
		if (s->n_dup == s->cap) {
			int ncap = s->cap ? 2 * s->cap : 8;
			dup *nd = realloc(s->d, (size_t)ncap * sizeof(*nd));

			if (!nd)
				return AP_ENOMEM;
			s->d = nd;
			s->cap = ncap;
		}
		n = slice_for(c, P, s->cons[i], s->slice);
		s->d[s->n_dup].P = P;
		s->d[s->n_dup].C = s->cons[i];
		s->d[s->n_dup].n_nodes = n;
		s->d[s->n_dup].nodes = malloc(((size_t)n + 1) * sizeof(int));
		if (!s->d[s->n_dup].nodes)
			return AP_ENOMEM;
		memcpy(s->d[s->n_dup].nodes, s->slice, (size_t)n * sizeof(int));
		s->n_dup++;
		s->flag[s->cons[i]] = 2;
	}
	return 0;
}

/* Chooses the duplications of this round: for every cheap producer group
 * P not yet a consumer of one, the consumers that may compute its slice
 * themselves (clone_check), kept when the bytes saved are positive.
 * Returns how many, with the array (n entries, each owning its nodes) in
 * *out; AP_ENOMEM with `err` set. */
static int choose_dups(ap_pctx *c, dup **out, ap_error *err)
{
	choice s = {0};

	s.flag = calloc((size_t)c->N + 1, sizeof(int));
	s.cons = malloc(((size_t)c->N + 1) * sizeof(int));
	s.slice = malloc(((size_t)c->N + 1) * sizeof(int));
	s.gain = malloc(((size_t)c->N + 1) * sizeof(int64_t));
	s.ok = malloc(((size_t)c->N + 1) * sizeof(bool));
	*out = NULL;
	if (!s.flag || !s.cons || !s.slice || !s.gain || !s.ok)
		goto nomem;
	for (int P = 0; P < c->N; P++) {
		bool remains, any = false;

		if (c->head[P] < 0 || find(c, P) != P || s.flag[P] || !cheap(c, P))
			continue;
		s.n_cons = consumers(c, P, s.cons, &remains);
		if (s.n_cons == 0)
			continue;
		for (int i = 0; i < s.n_cons; i++) {
			double cost;
			int n = slice_for(c, P, s.cons[i], s.slice);

			s.ok[i] = s.flag[s.cons[i]] != 1 &&
				  clone_check(c, P, s.cons[i], s.slice, n, &s.gain[i], &cost) == CLONE_OK;
		}
		if (savings(c, &s, P, remains) <= 0)
			continue;
		for (int i = 0; i < s.n_cons; i++)
			if (s.ok[i])
				any = true;
		if (!any)
			continue;
		if (record(c, &s, P) < 0)
			goto nomem;
	}
	free(s.flag);
	free(s.cons);
	free(s.slice);
	free(s.gain);
	free(s.ok);
	*out = s.d;
	return s.n_dup;
nomem:
	for (int i = 0; i < s.n_dup; i++)
		free(s.d[i].nodes);
	free(s.d);
	free(s.flag);
	free(s.cons);
	free(s.slice);
	free(s.gain);
	free(s.ok);
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory choosing producers to recompute");
	return AP_ENOMEM;
}

/* ---- the rewrite -------------------------------------------------------------- */

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

/* What rewrite works with besides the clones. */
typedef struct rewriting {
	int *vr_off, *vr;    /* per tensor: the read-through nodes reading it, CSR */
	int *set;            /* clone sets (slice, then read-through nodes after
				it), one per duplication, one after another */
	int n_set, cap_set;
	int *set_off;        /* per duplication, + 1: where its set starts */
	int *slot_of;        /* per entry of `set`: its slot */
	int *fill;           /* CSR fill, per tensor or node */
	int *ins, *outs;     /* a node's inputs and outputs in the new graph */
	clones cl;
} rewriting;

/* Copies g's tensors (CONST data too), inputs, outputs and eager_kernels
 * into the empty graph ng: tensor indices agree.  0 or AP_ENOMEM. */
static int copy_tensors(const ap_graph *g, ap_graph *ng)
{
	for (int t = 0; t < g->n_tensors; t++) {
		const ap_tensor *x = &g->tensors[t];
		int idx = ap_graph_add_tensor(ng, x->name, x->dtype, x->rank, x->dims, x->kind,
					      x->kind == AP_TENSOR_CONST ? x->data : NULL,
					      x->kind == AP_TENSOR_CONST ? x->nbytes : 0);

		if (idx < 0)
			return AP_ENOMEM;
		ng->tensors[idx].is_output = x->is_output;
	}
	ng->inputs = malloc(((size_t)g->n_inputs + 1) * sizeof(int));
	ng->outputs = malloc(((size_t)g->n_outputs + 1) * sizeof(int));
	if (!ng->inputs || !ng->outputs)
		return AP_ENOMEM;
	memcpy(ng->inputs, g->inputs, (size_t)g->n_inputs * sizeof(int));
	memcpy(ng->outputs, g->outputs, (size_t)g->n_outputs * sizeof(int));
	ng->n_inputs = g->n_inputs;
	ng->n_outputs = g->n_outputs;
	ng->eager_kernels = g->eager_kernels;
	return 0;
}

/* The read-through nodes by the tensor they read (w->vr_off, w->vr),
 * counted then placed with w->fill (zeroed, per tensor). */
static void through_readers(ap_pctx *c, rewriting *w)
{
	const ap_graph *g = c->g;

	for (int n = 0; n < c->N; n++)
		if (c->through[n])
			w->vr_off[g->nodes[n].inputs[0] + 1]++;
	for (int t = 0; t < c->T; t++)
		w->vr_off[t + 1] += w->vr_off[t];
	for (int n = 0; n < c->N; n++)
		if (c->through[n])
			w->vr[w->vr_off[g->nodes[n].inputs[0]] + w->fill[g->nodes[n].inputs[0]]++] = n;
}

/* The clone set of each duplication k, ascending, at
 * w->set[set_off[k] .. set_off[k + 1]): its slice, then the read-through
 * nodes reading a member of the set (transitively).  0 or AP_ENOMEM. */
static int clone_sets(ap_pctx *c, rewriting *w, const dup *d, int n_dup)
{
	const ap_graph *g = c->g;

	for (int k = 0; k < n_dup; k++) {
		w->set_off[k] = w->n_set;
		c->mark_stamp++;
		for (int i = 0; i < d[k].n_nodes; i++) {
			c->mark[d[k].nodes[i]] = c->mark_stamp;
			if (push_int(&w->set, &w->n_set, &w->cap_set, d[k].nodes[i]) < 0)
				return AP_ENOMEM;
		}
		for (int i = w->set_off[k]; i < w->n_set; i++) {
			const ap_node *node = &g->nodes[w->set[i]];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o];

				if (t < 0)
					continue;
				for (int r = w->vr_off[t]; r < w->vr_off[t + 1]; r++) {
					if (c->mark[w->vr[r]] == c->mark_stamp)
						continue;
					c->mark[w->vr[r]] = c->mark_stamp;
					if (push_int(&w->set, &w->n_set, &w->cap_set, w->vr[r]) < 0)
						return AP_ENOMEM;
				}
			}
		}
		qsort(w->set + w->set_off[k], (size_t)(w->n_set - w->set_off[k]), sizeof(int), cmp_int);
	}
	w->set_off[n_dup] = w->n_set;
	return 0;
}

/* The slots (w->cl.off, dup_of; w->slot_of): per node, the duplications
 * that clone it in ascending order; and where each slot's output tensors
 * go in w->cl.outs (out_off; cl.outs allocated, not filled).  0 or
 * AP_ENOMEM. */
static int clone_slots(ap_pctx *c, rewriting *w, int n_dup)
{
	clones *cl = &w->cl;
	int n_slots = w->n_set, n_outs = 0;

	cl->dup_of = malloc(((size_t)n_slots + 1) * sizeof(int));
	cl->out_off = malloc(((size_t)n_slots + 1) * sizeof(int));
	w->slot_of = malloc(((size_t)n_slots + 1) * sizeof(int));
	if (!cl->dup_of || !cl->out_off || !w->slot_of)
		return AP_ENOMEM;
	for (int i = 0; i < w->n_set; i++)
		cl->off[w->set[i] + 1]++;
	for (int n = 0; n < c->N; n++)
		cl->off[n + 1] += cl->off[n];
	memset(w->fill, 0, ((size_t)c->N + 1) * sizeof(int));
	for (int k = 0; k < n_dup; k++) {
		for (int i = w->set_off[k]; i < w->set_off[k + 1]; i++) {
			int s = cl->off[w->set[i]] + w->fill[w->set[i]]++;

			cl->dup_of[s] = k;
			w->slot_of[i] = s;
		}
	}
	for (int n = 0; n < c->N; n++) {
		for (int s = cl->off[n]; s < cl->off[n + 1]; s++) {
			cl->out_off[s] = n_outs;
			n_outs += c->g->nodes[n].n_outputs;
		}
	}
	cl->outs = malloc(((size_t)n_outs + 1) * sizeof(int));
	return cl->outs ? 0 : AP_ENOMEM;
}

/* The clones' tensors in ng, duplication by duplication, in node order:
 * "NAME~(base + k)" for duplication k, of the original's dtype and shape;
 * their indices into w->cl.outs (-1 for an absent output).  0 or
 * AP_ENOMEM. */
static int clone_tensors(ap_pctx *c, rewriting *w, ap_graph *ng, int n_dup, int base)
{
	const ap_graph *g = c->g;
	char name[400];

	for (int k = 0; k < n_dup; k++) {
		for (int i = w->set_off[k]; i < w->set_off[k + 1]; i++) {
			const ap_node *node = &g->nodes[w->set[i]];

			for (int o = 0; o < node->n_outputs; o++) {
				int t = node->outputs[o], nt = -1;

				if (t >= 0) {
					const ap_tensor *x = &g->tensors[t];

					snprintf(name, sizeof(name), "%s~%d", x->name, base + k);
					nt = ap_graph_add_tensor(ng, name, x->dtype, x->rank, x->dims,
								 AP_TENSOR_VALUE, NULL, 0);
					if (nt < 0)
						return AP_ENOMEM;
				}
				w->cl.outs[w->cl.out_off[w->slot_of[i]] + o] = nt;
			}
		}
	}
	return 0;
}

/* Every node of c->g into ng, in order, each followed by its clones: a
 * member of a consumer group reads, for each input, the clone of the
 * first duplication into its group that clones the input's producer; a
 * clone reads its own duplication's clones where there are some.  Counts
 * the clones of nodes not read through in *n_cloned.  0 or AP_ENOMEM. */
static int copy_nodes(ap_pctx *c, rewriting *w, ap_graph *ng, const dup *d, int *n_cloned)
{
	const ap_graph *g = c->g;
	const clones *cl = &w->cl;

	for (int n = 0; n < c->N; n++) {
		const ap_node *node = &g->nodes[n];
		int r = find(c, n);

		for (int i = 0; i < node->n_inputs; i++) {
			int t = node->inputs[i], p = t >= 0 ? g->tensors[t].producer : -1;

			w->ins[i] = t;
			if (p < 0 || c->through[n] || c->head[r] < 0)
				continue;
			/* the first duplication into n's group that clones t's producer */
			for (int s = cl->off[p]; s < cl->off[p + 1]; s++) {
				if (d[cl->dup_of[s]].C == r) {
					w->ins[i] = clone_tensor(g, cl, cl->dup_of[s], t);
					break;
				}
			}
		}
		if (ap__partition_copy_node(ng, node, w->ins, node->outputs) < 0)
			return AP_ENOMEM;
		for (int s = cl->off[n]; s < cl->off[n + 1]; s++) {
			int k = cl->dup_of[s];

			for (int i = 0; i < node->n_inputs; i++) {
				int t = node->inputs[i], ct = t >= 0 ? clone_tensor(g, cl, k, t) : -1;

				w->ins[i] = ct >= 0 ? ct : t;
			}
			for (int o = 0; o < node->n_outputs; o++)
				w->outs[o] = node->outputs[o] >= 0 ? cl->outs[cl->out_off[s] + o] : -1;
			if (ap__partition_copy_node(ng, node, w->ins, w->outs) < 0)
				return AP_ENOMEM;
			if (!c->through[n])
				(*n_cloned)++;
		}
	}
	return 0;
}

/* Frees w's arrays (NULL ones too). */
static void rewriting_free(rewriting *w)
{
	free(w->vr_off);
	free(w->vr);
	free(w->set);
	free(w->set_off);
	free(w->slot_of);
	free(w->fill);
	free(w->ins);
	free(w->outs);
	free(w->cl.off);
	free(w->cl.dup_of);
	free(w->cl.out_off);
	free(w->cl.outs);
}

/* A copy of c->g in which each duplication's nodes (and the read-through
 * views after them) are cloned right after their originals and the
 * consumer group's members read the clones.  Sets *n_cloned.  Linear in
 * the graph plus the clones.  NULL with `err` set: AP_ENOMEM. */
static ap_graph *rewrite(ap_pctx *c, const dup *d, int n_dup, int base, int *n_cloned,
			 ap_error *err)
{
	const ap_graph *g = c->g;
	ap_graph *ng = ap_graph_new(g->name);
	int N = c->N, T = c->T;
	rewriting w = {0};

	w.vr_off = calloc((size_t)T + 2, sizeof(int));
	w.vr = malloc(((size_t)N + 1) * sizeof(int));
	w.set_off = malloc(((size_t)n_dup + 1) * sizeof(int));
	w.fill = calloc((size_t)(N > T ? N : T) + 1, sizeof(int));
	w.ins = malloc(((size_t)T + 1) * sizeof(int));
	w.outs = malloc(((size_t)T + 1) * sizeof(int));
	*n_cloned = 0;
	w.cl.off = calloc((size_t)N + 2, sizeof(int));
	if (!ng || !w.vr_off || !w.vr || !w.set_off || !w.fill || !w.ins || !w.outs || !w.cl.off ||
	    copy_tensors(g, ng) < 0)
		goto nomem;
	through_readers(c, &w);
	if (clone_sets(c, &w, d, n_dup) < 0 || clone_slots(c, &w, n_dup) < 0 ||
	    clone_tensors(c, &w, ng, n_dup, base) < 0 || copy_nodes(c, &w, ng, d, n_cloned) < 0)
		goto nomem;
	rewriting_free(&w);
	return ng;
nomem:
	ap_graph_free(ng);
	ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory duplicating producers");
	rewriting_free(&w);
	return NULL;
}

/* ---- the entries -------------------------------------------------------------- */

/* One round of recompute: choose_dups, then rewrite when there is
 * something to duplicate (partition_internal.h). */
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

/* Why the cheap producer group p, read elsewhere too, was not recomputed
 * in q: clone_check's answer as a sentence (partition_internal.h). */
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
