/* tune.c -- the tuner's search (see tune.h).
 */
#include "tune.h"
#include "../lower/value.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double ap_tune_model_us(const ap_bound *b, const ap_sched *s, void *user)
{
	ap_traffic tr;
	ap_plan p;
	int rc;

	(void)user;
	if ((rc = ap_resolve(b, s, &p)) <= 0)
		return rc < 0 ? rc : INFINITY;
	memset(&tr, 0, sizeof(tr));
	if (b->em->traffic(b, &p, &tr) < 0)
		return AP_ENOMEM;
	return ap_cost_schedule_us(&tr, b->t);
}

double ap_tune_refined_us(const ap_traffic *t, const ap_ptxas_stats *ps, const ap_target_info *ti)
{
	ap_traffic tr = *t;
	double spill = (double)ps->spill_store_bytes + (double)ps->spill_load_bytes;

	if (t->library)   /* the library runs, not the kernel ptxas compiled */
		return ap_cost_schedule_us(t, ti);
	if (ps->registers > 0)
		tr.regs = (unsigned)ps->registers;
	if (ps->shared_bytes > 0 && (unsigned)ps->shared_bytes > tr.shared_bytes)
		tr.shared_bytes = (unsigned)ps->shared_bytes;
	/* local memory: every thread of every block moves its spill bytes at
	 * least once, through L1 and L2 */
	tr.tile_bytes += spill * (double)tr.threads * (double)tr.blocks;
	return ap_cost_schedule_us(&tr, ti);
}

/* ---- points of the space ---------------------------------------------------------- */

/* A point as knob value indices; its code is the mixed-radix number. */
typedef struct point {
	int ix[AP_SPACE_MAX_KNOBS];
} point;

static uint64_t code_of(const ap_space *sp, const point *p)
{
	uint64_t c = 0;

	for (int i = 0; i < sp->n; i++)
		c = c * (uint64_t)sp->knobs[i].n + (uint64_t)p->ix[i];
	return c;
}

static void sched_of(const ap_emitter *em, const ap_space *sp, const point *p, ap_sched *s)
{
	memset(s, 0, sizeof(*s));
	s->em = em;
	s->n = sp->n;
	for (int i = 0; i < sp->n; i++)
		s->v[i] = sp->knobs[i].values[p->ix[i]];
}

/* The point of configuration s; false when a value is not in the space. */
static bool point_of(const ap_space *sp, const ap_sched *s, point *p)
{
	for (int i = 0; i < sp->n; i++) {
		p->ix[i] = -1;
		for (int j = 0; j < sp->knobs[i].n; j++)
			if (sp->knobs[i].values[j] == s->v[i])
				p->ix[i] = j;
		if (p->ix[i] < 0)
			return false;
	}
	return true;
}

/* Codes already evaluated and their costs (open addressing; code + 1
 * stored, 0 empty). */
typedef struct seen {
	uint64_t *slot;
	double *cost;
	size_t cap;
} seen;

/* The slot of `code`: *fresh when it was not there (now added). */
static size_t seen_slot(seen *S, uint64_t code, bool *fresh)
{
	size_t h = (size_t)((code + 1) * 0x9e3779b97f4a7c15ull) & (S->cap - 1);

	*fresh = false;
	while (S->slot[h]) {
		if (S->slot[h] == code + 1)
			return h;
		h = (h + 1) & (S->cap - 1);
	}
	S->slot[h] = code + 1;
	*fresh = true;
	return h;
}

static int oom(ap_error *err)
{
	return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory tuning a kernel");
}

/* ---- the search --------------------------------------------------------------------- */

typedef struct search {
	const ap_bound *b;           /* the micro-graph, bound once for every point */
	const ap_space *sp;
	ap_tune_cost_fn cost;
	void *user;
	ap_tune_result *r;
	seen S;
	unsigned max_points;
	double deadline;             /* ap_now_ms() limit, 0 = none */
	unsigned max_regs;           /* > 0: points modelled to keep more values
					live are left out (see ap_tune_search) */
	int rc;                      /* a cost function's error */
} search;

/* Whether the search ends here: its evaluations spent (the deterministic
 * budget), a cost function's error, or the wall-time safety limit passed
 * (r->capped: what was found so far depends on the machine's load). */
static bool out_of_budget(search *q)
{
	if (q->r->tried >= q->max_points || q->rc || q->r->capped)
		return true;
	if (q->deadline > 0 && (q->r->tried & 15) == 0 && ap_now_ms() > q->deadline)
		q->r->capped = true;
	return q->r->capped;
}

/* Knobs on which s takes the default rule's value. */
static int agree(const ap_sched *s, const ap_sched *dflt)
{
	int n = 0;

	for (int i = 0; i < s->n && i < dflt->n; i++)
		n += s->v[i] == dflt->v[i];
	return n;
}

/* Whether a point of time us agreeing with the default on `ag` knobs
 * ranks before top[i]: faster, or as fast and closer to the default rule
 * (a tie means the model does not see what tells them apart -- the
 * attention's overlap, a TMA form -- and the rule chose for a reason). */
static bool ranks_before(const ap_tune_result *r, int i, double us, int ag)
{
	return us < r->top_us[i] || (us == r->top_us[i] && ag > agree(&r->top[i], &r->dflt));
}

/* Keeps s among the best AP_TUNE_TOP, sorted (ranks_before). */
static void keep_top(ap_tune_result *r, const ap_sched *s, double us)
{
	int i, ag = agree(s, &r->dflt);

	if (r->n_top == AP_TUNE_TOP && !ranks_before(r, AP_TUNE_TOP - 1, us, ag))
		return;
	i = r->n_top < AP_TUNE_TOP ? r->n_top++ : AP_TUNE_TOP - 1;
	while (i > 0 && ranks_before(r, i - 1, us, ag)) {
		r->top[i] = r->top[i - 1];
		r->top_us[i] = r->top_us[i - 1];
		i--;
	}
	r->top[i] = *s;
	r->top_us[i] = us;
}

/* A space with a library knob "lib" (the GEMM's, issue 25): the
 * default's other side -- the library where the default is Apollo's
 * kernel, or the kernel where it is the library -- is a candidate too, so
 * that a measurement (apollo-client tune, --tune-measure) compares the two
 * whatever the model ranked.  A full list drops its last candidate that
 * is not the default to make room; the candidate goes in at its modelled
 * time's place (keep_top; the search's best stays r->best). */
static void lib_candidate(search *q, const ap_space *sp, double us0)
{
	ap_tune_result *r = q->r;

	for (int k = 0; k < sp->n && isfinite(us0); k++) {
		ap_sched alt = r->dflt;
		bool in = false;
		double us;
		int i;

		if (strcmp(sp->knobs[k].name, "lib") || sp->knobs[k].n != 2)
			continue;
		alt.v[k] = !alt.v[k];
		for (i = 0; i < r->n_top; i++)
			in = in || !memcmp(r->top[i].v, alt.v, sizeof(alt.v));
		if (in || ap_sched_valid(q->b, &alt) != 1)
			return;
		us = q->cost(q->b, &alt, q->user);
		if (!(us >= 0) || !isfinite(us))
			return;
		if (r->n_top == AP_TUNE_TOP) {
			/* make room: drop the last candidate that is not the default */
			i = AP_TUNE_TOP - 1;
			if (i > 0 && !memcmp(r->top[i].v, r->dflt.v, sizeof(r->dflt.v)))
				i--;
			for (; i < r->n_top - 1; i++) {
				r->top[i] = r->top[i + 1];
				r->top_us[i] = r->top_us[i + 1];
			}
			r->n_top--;
		}
		keep_top(r, &alt, us);
		return;
	}
}

/* The cost of configuration s, counted and kept among the best; a cost
 * function's error ends the search (q->rc) and reads as INFINITY. */
static double evaluate(search *q, const ap_sched *s)
{
	double us;

	if (q->max_regs) {
		ap_traffic tr;

		memset(&tr, 0, sizeof(tr));
		/* a library call (issue 25) is no register tile NVRTC compiles */
		if (ap_traffic_of(q->b, s, &tr) == 0 && tr.regs > q->max_regs && !tr.library) {
			q->r->tried++;
			return INFINITY;
		}
	}
	us = q->cost(q->b, s, q->user);
	q->r->tried++;
	if (us < 0) {
		q->rc = us <= -1 ? (int)us : AP_EINTERNAL;
		return INFINITY;
	}
	if (isfinite(us))
		keep_top(q->r, s, us);
	return us;
}

/* The cost of point p: evaluated the first time, remembered after (*fresh
 * says which). */
static double visit(search *q, const point *p, bool *fresh)
{
	size_t sl = seen_slot(&q->S, code_of(q->sp, p), fresh);
	ap_sched s;

	if (*fresh) {
		sched_of(q->b->em, q->sp, p, &s);
		q->S.cost[sl] = evaluate(q, &s);
	}
	return q->S.cost[sl];
}

static void exhaustive(search *q, double total)
{
	point p;

	for (uint64_t c = 0; c < (uint64_t)total && !out_of_budget(q); c++) {
		uint64_t x = c;

		bool fresh;

		for (int i = q->sp->n - 1; i >= 0; i--) {
			p.ix[i] = (int)(x % (uint64_t)q->sp->knobs[i].n);
			x /= (uint64_t)q->sp->knobs[i].n;
		}
		visit(q, &p, &fresh);
	}
}

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static double rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

static void annealing(search *q, const point *start, double start_us, uint64_t seed)
{
	point cur = *start, best = *start;
	double cur_us = start_us, best_us = start_us, temp = 0.1;
	uint64_t rs = seed ? seed : 0x2545f4914f6cdd1dull;
	unsigned moves = 0, stuck = 0;

	while (!out_of_budget(q) && stuck < 4 * q->max_points) {
		point nx = cur;
		int k = (int)(rng_next(&rs) % (uint64_t)q->sp->n);
		const ap_knob *kb = &q->sp->knobs[k];
		double us;
		bool fresh;

		if (kb->n < 2) {
			stuck++;
			continue;
		}
		if (rng_unit(&rs) < 0.2)           /* a jump: any value of the knob */
			nx.ix[k] = (int)(rng_next(&rs) % (uint64_t)kb->n);
		else                               /* a step to a neighbour */
			nx.ix[k] += rng_next(&rs) & 1 ? 1 : -1;
		if (nx.ix[k] < 0 || nx.ix[k] >= kb->n || nx.ix[k] == cur.ix[k]) {
			stuck++;
			continue;
		}
		/* a point seen before costs what it cost: moving there
		 * evaluates nothing */
		us = visit(q, &nx, &fresh);
		if (!fresh)
			stuck++;
		moves++;
		if (isfinite(us) &&
		    (!isfinite(cur_us) || us < cur_us ||
		     rng_unit(&rs) < exp(-(us - cur_us) / cur_us / temp))) {
			cur = nx;
			cur_us = us;
		}
		if (us < best_us) {
			best = nx;
			best_us = us;
		}
		temp *= 0.99;                      /* geometric cooling */
		if (moves % 64 == 0) {             /* restart from the best point */
			cur = best;
			cur_us = best_us;
		}
	}
}

#define AP_TUNE_REG_GROWTH 1

int ap_tune_search(const ap_bound *b, const ap_tune_options *o, ap_tune_result *r, ap_error *err)
{
	const ap_mgraph *m = b->m;
	const ap_target_info *t = b->t;
	ap_tune_options dflt = {0};
	ap_space sp;
	search q;
	point p0;
	double t0 = ap_now_ms(), total = 1, min_gain, us0;
	unsigned exhaustive_max;
	int rc;

	if (!o)
		o = &dflt;
	memset(r, 0, sizeof(*r));
	if ((rc = ap_emitter_default(b, &sp, &r->dflt, err)) < 0)
		return rc;
	for (int i = 0; i < sp.n; i++)
		total *= sp.knobs[i].n;
	r->space = total;
	exhaustive_max = o->exhaustive_max ? o->exhaustive_max : 1024;
	memset(&q, 0, sizeof(q));
	q.b = b;
	q.sp = &sp;
	q.cost = o->cost ? o->cost : ap_tune_model_us;
	q.user = o->user;
	q.r = r;
	q.max_points = o->max_points ? o->max_points : AP_TUNE_MAX_POINTS;
	q.deadline = o->budget_ms > 0 ? t0 + o->budget_ms : 0;
	if (!o->cost && t->gpu) {
		/* Under the real model on a GPU, a point may keep no more
		 * values live than the default does (AP_TUNE_REG_GROWTH = 1):
		 * the register tile is the unrolled body NVRTC compiles, and a
		 * bigger one costs backend time the model does not see.
		 * Measured cold (bert_like_2l, squeezenet1_1 at sm_90, tuned
		 * / untuned): growth unbounded 1.76x / 1.64x, 2x 1.40-1.62x /
		 * 1.38x, 1x 1.11x / 1.00x; issue 9 asks for 1.5x at most. */
		ap_traffic tr;

		memset(&tr, 0, sizeof(tr));
		if (ap_traffic_of(b, &r->dflt, &tr) < 0)
			return oom(err);
		/* a default that is a library call (issue 25): the growth is
		 * measured from the kernel beside it (the same tile, lib=0) */
		for (int k = 0; tr.library && k < sp.n; k++)
			if (!strcmp(sp.knobs[k].name, "lib")) {
				ap_sched own = r->dflt;

				own.v[k] = 0;
				memset(&tr, 0, sizeof(tr));
				if (ap_traffic_of(b, &own, &tr) < 0)
					return oom(err);
			}
		q.max_regs = tr.regs ? (unsigned)(tr.regs * AP_TUNE_REG_GROWTH) : 0;
	}
	q.S.cap = 64;
	while (q.S.cap < 2 * (size_t)q.max_points + 2 || (total <= exhaustive_max && q.S.cap < 2 * (size_t)total + 2))
		q.S.cap *= 2;
	q.S.slot = calloc(q.S.cap, sizeof(uint64_t));
	q.S.cost = calloc(q.S.cap, sizeof(double));
	if (!q.S.slot || !q.S.cost) {
		free(q.S.slot);
		free(q.S.cost);
		return oom(err);
	}
	/* the default first: it is the answer unless a point beats it */
	r->best = r->dflt;
	r->method = total <= exhaustive_max ? "exhaustive" : "annealing";
	if (point_of(&sp, &r->dflt, &p0)) {
		bool fresh;

		us0 = visit(&q, &p0, &fresh);
	} else {
		/* a default outside its own space (a rule that shrank past the
		 * knob's values): evaluated, kept, never searched from */
		us0 = evaluate(&q, &r->dflt);
		p0.ix[0] = -1;
	}
	r->default_us = us0;
	r->best_us = us0;
	if (total > 1 && !q.rc) {
		if (total <= exhaustive_max)
			exhaustive(&q, total);
		else if (p0.ix[0] >= 0)
			annealing(&q, &p0, us0, o->seed);
	}
	free(q.S.slot);
	free(q.S.cost);
	if (q.rc)
		return ap_error_set(err, q.rc, m->g->n_nodes ? m->g->nodes[m->root].name : NULL, NULL,
				    "the tuner's cost function failed (%s)", ap_error_name(q.rc));
	min_gain = o->min_gain == 0 ? 0.03 : o->min_gain < 0 ? 0 : o->min_gain;
	if (r->n_top > 0 && r->top_us[0] < (isfinite(us0) ? us0 * (1 - min_gain) : INFINITY)) {
		r->best = r->top[0];
		r->best_us = r->top_us[0];
	}
	/* the default is always a candidate: a measurement compares with it */
	if (isfinite(us0)) {
		bool in = false;

		for (int i = 0; i < r->n_top; i++)
			in = in || !memcmp(r->top[i].v, r->dflt.v, sizeof(r->dflt.v));
		if (!in) {
			int i = r->n_top < AP_TUNE_TOP ? r->n_top++ : AP_TUNE_TOP - 1;

			r->top[i] = r->dflt;
			r->top_us[i] = us0;
		}
	}
	lib_candidate(&q, &sp, us0);
	r->ms = ap_now_ms() - t0;
	return 0;
}

int ap_tune_signature(const ap_emitter *em, const ap_mgraph *m, const char *target,
		      const ap_target_info *t, unsigned max_block_threads, uint8_t sig[32])
{
	uint8_t gh[32];
	char head[96];
	ap_sha256_ctx *c;
	int n;

	if (ap_graph_hash_kernel(m->g, AP_CONST_BAKE_MAX, gh) < 0 || !(c = ap_sha256_new()))
		return AP_ENOMEM;
	/* "|tma", "|unvalidated" only when asked for: earlier signatures stay
	 * what they were */
	n = snprintf(head, sizeof(head), "apollo tune v1|%d|%d|%u|%d|%s%s", (int)m->kind, m->n_members,
		     max_block_threads, t->allow_tf32 ? 1 : 0, t->tma ? "tma|" : "",
		     t->unvalidated ? "unvalidated|" : "");
	ap_sha256_update(c, head, (size_t)n);
	ap_sha256_update(c, em->name, strlen(em->name) + 1);
	ap_sha256_update(c, target ? target : "cpu", strlen(target ? target : "cpu") + 1);
	ap_sha256_update(c, gh, sizeof(gh));
	ap_sha256_final(c, sig);
	return 0;
}

/* "a;b;c": the candidates' descriptions, as many as fit. */
static int describe_candidates(const ap_bound *b, const ap_tune_result *r, char *buf, size_t cap)
{
	size_t len = 0;

	buf[0] = 0;
	for (int i = 0; i < r->n_top; i++) {
		char *d = ap_sched_describe(b, &r->top[i]);

		if (!d)
			return AP_ENOMEM;
		if (len + strlen(d) + 2 < cap)
			len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ";" : "", d);
		free(d);
	}
	return 0;
}

/* Copies the i-th (from 0) of the ';'-separated configurations of `list`
 * into out; false when the list has fewer or it does not fit. */
static bool nth_candidate(const char *list, unsigned i, char *out, size_t cap)
{
	const char *p = list, *end;

	for (; i > 0 && p; i--) {
		p = strchr(p, ';');
		p = p ? p + 1 : NULL;
	}
	if (!p || !*p)
		return false;
	end = strchr(p, ';');
	if (!end)
		end = p + strlen(p);
	if ((size_t)(end - p) >= cap)
		return false;
	memcpy(out, p, (size_t)(end - p));
	out[end - p] = 0;
	return true;
}

bool ap_tune_is_candidate(const ap_tune_record *rec, const char *config)
{
	char c[sizeof(rec->config)];

	for (unsigned i = 0; nth_candidate(rec->candidates, i, c, sizeof(c)); i++)
		if (!strcmp(c, config))
			return true;
	return !strcmp(rec->config, config);
}

unsigned ap_tune_share(const ap_tune_hooks *h, int n_units)
{
	unsigned cap = h->search.max_points ? h->search.max_points : AP_TUNE_MAX_POINTS;
	unsigned share;

	if (!h->budget_evals || n_units < 1)
		return 0;
	share = h->budget_evals / (unsigned)n_units;
	return share < cap ? share : cap;
}

int ap_tune_unit(const ap_tune_hooks *h, const ap_bound *b, unsigned max_block_threads,
		 unsigned max_evals, double left_ms, ap_sched *s, ap_tune_outcome *out, ap_error *err)
{
	const ap_emitter *em = b->em;
	const ap_mgraph *m = b->m;
	const ap_target_info *t = b->t;
	ap_tune_record rec;
	ap_space sp;
	int rc;

	memset(out, 0, sizeof(*out));
	if (ap_tune_signature(em, m, h->target, t, max_block_threads, out->sig) < 0)
		return oom(err);
	if (h->lookup && h->lookup(h->user, out->sig, &rec) == 1 && !strcmp(rec.emitter, em->name)) {
		char cand[sizeof(rec.config)];

		/* a variant: the record's candidate of that rank, when it has one
		 * this build can use; else its choice */
		if (h->variant && nth_candidate(rec.candidates, h->variant - 1, cand, sizeof(cand)) &&
		    (rc = ap_sched_parse(b, cand, s)) != 0) {
			if (rc < 0)
				return oom(err);
			out->kind = AP_TUNE_RECORD;
			return 0;
		}
		rc = ap_sched_parse(b, rec.config, s);
		if (rc < 0)
			return oom(err);
		if (rc == 1) {
			out->kind = rec.measured_us >= 0 ? AP_TUNE_MEASURED : AP_TUNE_RECORD;
			return 0;
		}
		/* a record this build cannot use (another space): searched again */
	}
	/* a search needs the default and one more point */
	if (max_evals >= 2 && (t->gpu || !em->host_rule_only)) {
		ap_tune_options o = h->search;
		char *d;

		if (left_ms < 0) {
			/* the build's safety limit is spent: the default rule,
			 * counted, so that the bundle says it is not the idle
			 * machine's */
			out->capped = true;
			return ap_emitter_default(b, &sp, s, err);
		}
		o.max_points = max_evals;
		o.budget_ms = left_ms;
		if ((rc = ap_tune_search(b, &o, &out->result, err)) < 0)
			return rc;
		*s = out->result.best;
		if (h->variant && (int)h->variant <= out->result.n_top)
			*s = out->result.top[h->variant - 1];
		out->kind = AP_TUNE_SEARCHED;
		out->tried = out->result.tried;
		out->ms = out->result.ms;
		out->capped = out->result.capped;
		/* a search the wall-time limit cut short is not a record: a
		 * later request on a quieter machine searches it whole */
		if (!h->store || out->capped)
			return 0;
		memset(&rec, 0, sizeof(rec));
		if (!(d = ap_sched_describe(b, s)))
			return oom(err);
		snprintf(rec.emitter, sizeof(rec.emitter), "%s", em->name);
		snprintf(rec.config, sizeof(rec.config), "%s", d);
		free(d);
		snprintf(rec.method, sizeof(rec.method), "%s", out->result.method);
		rec.modelled_us = out->result.best_us;
		rec.measured_us = -1;
		rec.tried = out->result.tried;
		if (describe_candidates(b, &out->result, rec.candidates, sizeof(rec.candidates)) < 0)
			return oom(err);
		h->store(h->user, out->sig, &rec);
		return 0;
	}
	return ap_emitter_default(b, &sp, s, err);
}
