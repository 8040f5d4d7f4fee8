/* autotune.c -- the daemon's background tuner (see autotune.h). */
#include "autotune.h"
#include "../tune/records.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../../common/graph.h"
#include "../backend/backend.h"
#include "../config.h"
#include "../plan/program.h"
#include "../tune/tune.h"
#include "compile.h"
#include "proto/apollo.pb-c.h"

/* A refined candidate replaces the record's choice only when at least this
 * much faster (the search's default min_gain, tune.h). */
#define MIN_GAIN 0.03

struct job {
	uint8_t *req;            /* a packed apollo.CompileRequest */
	size_t len;
};

struct ap_autotune {
	ap_compiler *c;
	ap_autotune_options o;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t work;     /* a job queued, or stop */
	pthread_cond_t idle;     /* the queue empty and no job running */
	struct job *q;           /* ring of o.queue_max */
	unsigned head, n;
	bool stop, busy;
	atomic_bool cancel;      /* the job running is abandoned (ap_autotune_free):
				    read without the lock, between candidates,
				    kernels and backend compiles */
	bool measure_off;        /* no driver or device: measuring given up */
	atomic_uint_fast64_t jobs, dropped, failed, compiled, refined, moved, timed, measured;
};

/* What a job learned of one candidate of one kernel. */
typedef struct cand {
	uint8_t sig[32];
	char *schedule;          /* owned */
	bool compiled;           /* ptxas's figures below are set */
	ap_ptxas_stats ps;
	double refined_us;       /* ap_tune_refined_us */
	double time_us;          /* median on this host's GPU; 0: not timed */
	unsigned runs;
} cand;

typedef struct cands {
	cand *v;
	int n, cap;
} cands;

static void cands_clear(cands *t)
{
	for (int i = 0; i < t->n; i++)
		free(t->v[i].schedule);
	free(t->v);
	memset(t, 0, sizeof(*t));
}

static cand *cand_find(const cands *t, const uint8_t sig[32], const char *schedule)
{
	for (int i = 0; i < t->n; i++)
		if (!memcmp(t->v[i].sig, sig, 32) && !strcmp(t->v[i].schedule, schedule))
			return &t->v[i];
	return NULL;
}

/* The candidate (sig, schedule), added when new; NULL when out of memory. */
static cand *cand_get(cands *t, const uint8_t sig[32], const char *schedule)
{
	cand *c = cand_find(t, sig, schedule);

	if (c)
		return c;
	if (t->n == t->cap) {
		int cap = t->cap ? 2 * t->cap : 16;
		cand *nv = realloc(t->v, (size_t)cap * sizeof(*nv));

		if (!nv)
			return NULL;
		t->v = nv;
		t->cap = cap;
	}
	c = &t->v[t->n];
	memset(c, 0, sizeof(*c));
	if (!(c->schedule = strdup(schedule)))
		return NULL;
	memcpy(c->sig, sig, 32);
	t->n++;
	return c;
}

static bool stopping(ap_autotune *a)
{
	return atomic_load(&a->cancel);
}

/* The error of a job abandoned because the tuner stops. */
static int abandoned(ap_error *err)
{
	return ap_error_set(err, AP_EBUSY, NULL, NULL, "cancelled: apollod is stopping");
}

/* ---- refine: ptxas -v per candidate ---------------------------------------------- */

/* The real architecture ptxas compiles a target for: sm_XX[a] as it is,
 * compute_XX as sm_XX.  False for anything else. */
static bool ptxas_arch(const char *target, char *out, size_t cap)
{
	if (!strncmp(target, "sm_", 3))
		return (size_t)snprintf(out, cap, "%s", target) < cap;
	if (!strncmp(target, "compute_", 8))
		return (size_t)snprintf(out, cap, "sm_%s", target + 8) < cap;
	return false;
}

/* Whether the model's record of `sig` was refined already (by an earlier
 * job: a request compiled again with no_cache searches again). */
static bool refined_before(ap_autotune *a, const char *target, const uint8_t sig[32])
{
	ap_tune_record rec;

	return ap_tune_records_local(ap_compiler_tiers(a->c), sig, target, "", &rec) == 1 &&
	       !strcmp(rec.method, "ptxas");
}

/* Builds variant `req` and compiles each tuned kernel that runs alone in
 * its launch with ptxas -v, once per (signature, schedule). */
static int refine_variant(ap_autotune *a, const Apollo__CompileRequest *req, const char *arch,
			  const ap_target_info *ti, cands *t, ap_error *err)
{
	ap_graph *g = NULL;
	ap_program *p = NULL;
	int rc = ap_compiler_build_program(a->c, req, &g, &p, err);

	/* one ptxas compile per candidate: the stop is seen between two */
	for (int l = 0; !rc && p && l < p->n_launches; l++) {
		const ap_launch *ln = &p->launches[l];
		const ap_launch_part *pt = ln->n_parts == 1 ? &ln->parts[0] : NULL;
		const ap_kernel_src *k;
		cand *cd;
		ap_error why;

		if (stopping(a)) {
			rc = abandoned(err);
			break;
		}
		if (!pt || !pt->tuned || !pt->schedule || refined_before(a, req->target, pt->tune_sig))
			continue;
		if (!(cd = cand_get(t, pt->tune_sig, pt->schedule))) {
			rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
			break;
		}
		if (cd->compiled)
			continue;
		k = &p->kernels[ln->kernel];
		if (ap_nvrtc_ptxas_stats(k->src, k->name, arch, &cd->ps, &why) < 0) {
			/* its kernel keeps the record it has (all candidates or none) */
			ap_log(AP_LOG_DEBUG, "background tuner: %s (%s) did not compile: %s", k->name,
			       pt->schedule, why.msg);
			continue;
		}
		cd->compiled = true;
		cd->refined_us = ap_tune_refined_us(&pt->traffic, &cd->ps, ti);
		atomic_fetch_add(&a->compiled, 1);
		ap_log(AP_LOG_DEBUG,
		       "background tuner: %s %s: ptxas %d registers (modelled %u), %d+%d spill bytes, "
		       "%d shared bytes: %.3f us (modelled %.3f)",
		       k->name, pt->schedule, cd->ps.registers, pt->traffic.regs, cd->ps.spill_store_bytes,
		       cd->ps.spill_load_bytes, cd->ps.shared_bytes, cd->refined_us,
		       ap_cost_schedule_us(&pt->traffic, ti));
	}
	ap_program_free(p);
	ap_graph_free(g);
	return rc;
}

/* Candidates of one record, refined order: no spill before spill, then by
 * the refined time. */
static int cmp_refined(const void *x, const void *y)
{
	const cand *a = *(const cand *const *)x, *b = *(const cand *const *)y;
	bool sa = a->ps.spill_store_bytes + a->ps.spill_load_bytes > 0;
	bool sb = b->ps.spill_store_bytes + b->ps.spill_load_bytes > 0;

	if (sa != sb)
		return sa ? 1 : -1;
	return (a->refined_us > b->refined_us) - (a->refined_us < b->refined_us);
}

/* The model's record of `sig` re-ranked by the refined times into *out:
 * true when every candidate (and the choice) compiled. */
static bool refine_record(const cands *t, const uint8_t sig[32], const ap_tune_record *rec,
			  ap_tune_record *out, bool *moved)
{
	const cand *list[AP_TUNE_TOP + 1], *cur, *best;
	char buf[sizeof(rec->candidates)], *save = NULL, *tok;
	int n = 0;
	bool spills_cur, spills_best;
	size_t used = 0;

	snprintf(buf, sizeof(buf), "%s", rec->candidates);
	for (tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
		const cand *c = cand_find(t, sig, tok);

		if (!c || !c->compiled || n == AP_TUNE_TOP)
			return false;
		list[n++] = c;
	}
	if (!(cur = cand_find(t, sig, rec->config)) || !cur->compiled || n == 0)
		return false;
	qsort(list, (size_t)n, sizeof(list[0]), cmp_refined);
	best = list[0];
	spills_cur = cur->ps.spill_store_bytes + cur->ps.spill_load_bytes > 0;
	spills_best = best->ps.spill_store_bytes + best->ps.spill_load_bytes > 0;
	*moved = best != cur && ((spills_cur && !spills_best) ||
				 (spills_best == spills_cur &&
				  best->refined_us < cur->refined_us * (1 - MIN_GAIN)));
	*out = *rec;
	snprintf(out->method, sizeof(out->method), "ptxas");
	if (*moved)
		snprintf(out->config, sizeof(out->config), "%s", best->schedule);
	out->modelled_us = *moved ? best->refined_us : cur->refined_us;
	out->candidates[0] = '\0';
	for (int i = 0; i < n; i++)
		used += (size_t)snprintf(out->candidates + used, sizeof(out->candidates) - used, "%s%s",
					 i ? ";" : "", list[i]->schedule);
	return used < sizeof(out->candidates);
}

/* Stores the refined records of every kernel the job compiled. */
static void store_refined(ap_autotune *a, const char *target, const cands *t)
{
	ap_tiers *tiers = ap_compiler_tiers(a->c);
	uint8_t (*sigs)[32] = calloc((size_t)t->n + 1, 32);
	ap_tune_record *recs = calloc((size_t)t->n + 1, sizeof(*recs));
	int n = 0, moved = 0;

	for (int i = 0; sigs && recs && i < t->n; i++) {
		ap_tune_record rec;
		bool first = true, mv = false;

		for (int j = 0; j < i && first; j++)
			first = memcmp(t->v[j].sig, t->v[i].sig, 32) != 0;
		if (!first || ap_tune_records_local(tiers, t->v[i].sig, target, "", &rec) != 1 ||
		    !refine_record(t, t->v[i].sig, &rec, &recs[n], &mv))
			continue;
		memcpy(sigs[n++], t->v[i].sig, 32);
		moved += mv;
	}
	if (n > 0 && ap_tune_records_put_many(tiers, (const uint8_t (*)[32])sigs, target, recs, n,
					      moved > 0) == 0) {
		atomic_fetch_add(&a->refined, (uint64_t)n);
		atomic_fetch_add(&a->moved, (uint64_t)moved);
		ap_log(AP_LOG_INFO, "background tuner: %d %s kernels refined with ptxas, %d choices moved",
		       n, target, moved);
	}
	free(sigs);
	free(recs);
}

/* ---- measure: the variant bundles on this host's GPU ------------------------------ */

struct timing {
	ap_autotune *a;
	cands *t;
};

static int on_timed(void *user, const uint8_t *tune_signature, const char *schedule, double us,
		    unsigned runs)
{
	struct timing *tm = user;
	cand *c;

	if (stopping(tm->a))
		return AP_EBUSY;
	if (!(c = cand_get(tm->t, tune_signature, schedule)))
		return AP_ENOMEM;
	if (c->time_us == 0 || us < c->time_us) {
		c->time_us = us;
		c->runs = runs;
	}
	atomic_fetch_add(&tm->a->timed, 1);
	return 0;
}

static int time_variant(ap_autotune *a, const Apollo__CompileRequest *req, cands *t, char *device,
			size_t cap, unsigned *sms, ap_error *err)
{
	struct Apollo__Bundle *pb = NULL;
	struct timing tm = { a, t };
	int rc = ap_compiler_compile_bundle(a->c, req, &a->cancel, &pb, err);

	if (rc)
		return rc;
	rc = a->o.timer->time_tuned(pb, a->o.device, a->o.warmup, a->o.runs, device[0] ? NULL : device,
				    cap, sms, on_timed, &tm, err);
	if (stopping(a))
		return abandoned(err);
	if (rc == AP_EUNSUPPORTED || rc == AP_ECOMPILE || rc == AP_EIO) {
		/* no driver, no device, or a device that cannot load or run
		 * this target: measuring stops here for the tuner's life */
		ap_log(AP_LOG_WARN, "background tuner: not measuring on this host: %s", err->msg);
		a->measure_off = true;
		device[0] = '\0';
		return 0;
	}
	return rc;
}

/* Sends the job's timings through the tune-report path: checked and
 * stored as a client's measurements would be. */
static int report(ap_autotune *a, const char *target, const char *device, unsigned sms,
		  const cands *t, ap_error *err)
{
	Apollo__TuneReport rep = APOLLO__TUNE_REPORT__INIT;
	Apollo__TuneMeasurement *ms = calloc((size_t)t->n + 1, sizeof(*ms));
	Apollo__TuneMeasurement **pms = calloc((size_t)t->n + 1, sizeof(*pms));
	unsigned records = 0, pending = 0;
	uint64_t gen = 0;
	char id[160] = "";
	int rc = 0;

	ap_compile_device_id(device, sms, id, sizeof(id), err);   /* "" when malformed */
	if (!ms || !pms) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto out;
	}
	for (int i = 0; i < t->n; i++) {
		ap_tune_record had;

		/* a kernel measured on this device before keeps its record: no
		 * new generation (every bundle retired) for the same numbers */
		if (t->v[i].time_us <= 0 ||
		    ap_tune_records_local(ap_compiler_tiers(a->c), t->v[i].sig, target, id, &had) == 1)
			continue;
		apollo__tune_measurement__init(&ms[rep.n_measurements]);
		ms[rep.n_measurements].signature.data = t->v[i].sig;
		ms[rep.n_measurements].signature.len = 32;
		ms[rep.n_measurements].schedule = t->v[i].schedule;
		ms[rep.n_measurements].time_us = t->v[i].time_us;
		ms[rep.n_measurements].runs = t->v[i].runs;
		pms[rep.n_measurements] = &ms[rep.n_measurements];
		rep.n_measurements++;
	}
	if (rep.n_measurements == 0)
		goto out;
	rep.target = (char *)target;
	rep.device = (char *)device;
	rep.sm_count = sms;
	rep.measurements = pms;
	if ((rc = ap_compiler_tune_report(a->c, "apollod", &rep, &records, &pending, &gen,
					  err)) == 0) {
		atomic_fetch_add(&a->measured, records);
		ap_log(AP_LOG_INFO, "background tuner: %zu candidates timed on %s: %u measured records",
		       rep.n_measurements, device, records);
	}
out:
	free(ms);
	free(pms);
	return rc;
}

/* ---- the job ------------------------------------------------------------------- */

static int run_job(ap_autotune *a, const uint8_t *buf, size_t len, ap_error *err)
{
	Apollo__CompileRequest *req = apollo__compile_request__unpack(NULL, len, buf);
	Apollo__CompileOptions opts = APOLLO__COMPILE_OPTIONS__INIT, *saved;
	ap_target_info ti;
	char arch[40], device[128] = "";
	unsigned sms = 0;
	cands t = {0};
	int rc = 0;

	if (!req)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "the queued request did not decode");
	saved = req->options;
	if (saved)
		opts = *saved;
	opts.no_cache = false;   /* the records live in the cache */
	req->options = &opts;
	if (!req->target || ap_cost_target(req->target, &ti) < 0 ||
	    !ptxas_arch(req->target, arch, sizeof(arch))) {
		rc = ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL, "no GPU target to tune for");
		goto out;
	}
	/* Stopping abandons the job between any two steps: nothing of it is
	 * stored but kernels its bundles compiled (each a finished entry);
	 * its records are written only at the end, each set in one
	 * transaction. */
	for (unsigned v = 1; !rc && v <= AP_TUNE_TOP; v++) {
		opts.tune_variant = v;
		if (stopping(a))
			rc = abandoned(err);
		if (!rc && a->o.refine)
			rc = refine_variant(a, req, arch, &ti, &t, err);
		if (!rc && a->o.measure && !a->measure_off && !stopping(a))
			rc = time_variant(a, req, &t, device, sizeof(device), &sms, err);
	}
	if (!rc && stopping(a))
		rc = abandoned(err);
	if (!rc && a->o.refine)
		store_refined(a, req->target, &t);
	if (!rc && device[0])
		rc = stopping(a) ? abandoned(err) : report(a, req->target, device, sms, &t, err);
out:
	req->options = saved;
	apollo__compile_request__free_unpacked(req, NULL);
	cands_clear(&t);
	return rc;
}

static void *tuner_main(void *arg)
{
	ap_autotune *a = arg;

	/* background work: below every request's threads unless told
	 * otherwise (Linux sets a thread's nice value through its thread id;
	 * a nice value at or above the daemon's own needs no privilege) */
	if (a->o.nice > 0)
		setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), a->o.nice);
	pthread_mutex_lock(&a->mu);
	for (;;) {
		struct job j;
		ap_error err;
		int rc;

		while (!a->stop && a->n == 0) {
			a->busy = false;
			pthread_cond_broadcast(&a->idle);
			pthread_cond_wait(&a->work, &a->mu);
		}
		if (a->stop)
			break;
		j = a->q[a->head];
		a->head = (a->head + 1) % a->o.queue_max;
		a->n--;
		a->busy = true;
		pthread_mutex_unlock(&a->mu);
		ap_error_clear(&err);
		rc = run_job(a, j.req, j.len, &err);
		if (rc < 0 && stopping(a)) {
			/* neither finished nor failed */
			ap_log(AP_LOG_INFO, "background tuner: job abandoned: apollod is stopping");
		} else {
			if (rc < 0) {
				atomic_fetch_add(&a->failed, 1);
				ap_log(AP_LOG_WARN, "background tuner: job failed (%s): %s",
				       ap_error_name(err.code), err.msg);
			}
			atomic_fetch_add(&a->jobs, 1);
		}
		free(j.req);
		pthread_mutex_lock(&a->mu);
	}
	a->busy = false;
	pthread_cond_broadcast(&a->idle);
	pthread_mutex_unlock(&a->mu);
	return NULL;
}

/* ---- interface ------------------------------------------------------------------ */

ap_autotune *ap_autotune_new(ap_compiler *c, const ap_autotune_options *o)
{
	ap_autotune *a = calloc(1, sizeof(*a));

	if (!a)
		return NULL;
	a->c = c;
	a->o = *o;
	if (!a->o.queue_max)
		a->o.queue_max = 8;
	if (a->o.runs < 1)
		a->o.runs = 20;
	if (a->o.warmup <= 0)
		a->o.warmup = 3;
	if (!(a->q = calloc(a->o.queue_max, sizeof(*a->q)))) {
		free(a);
		return NULL;
	}
	if (a->o.measure) {
		char why[256] = "";

		if (!a->o.timer)
			snprintf(why, sizeof(why), "no kernel timer wired in");
		a->measure_off = !a->o.timer || !a->o.timer->available(why, sizeof(why));
		if (a->measure_off)
			ap_log(AP_LOG_INFO, "background tuner: not timing on this host: %s", why);
	}
	pthread_mutex_init(&a->mu, NULL);
	pthread_cond_init(&a->work, NULL);
	pthread_cond_init(&a->idle, NULL);
	if (pthread_create(&a->thread, NULL, tuner_main, a)) {
		ap_log(AP_LOG_WARN, "background tuner: no thread");
		pthread_cond_destroy(&a->idle);
		pthread_cond_destroy(&a->work);
		pthread_mutex_destroy(&a->mu);
		free(a->q);
		free(a);
		return NULL;
	}
	return a;
}

ap_autotune *ap_autotune_free(ap_autotune *a)
{
	if (!a)
		return NULL;
	atomic_store(&a->cancel, true);
	pthread_mutex_lock(&a->mu);
	a->stop = true;
	pthread_cond_broadcast(&a->work);
	pthread_mutex_unlock(&a->mu);
	pthread_join(a->thread, NULL);
	for (unsigned i = 0; i < a->n; i++)
		free(a->q[(a->head + i) % a->o.queue_max].req);
	free(a->q);
	pthread_cond_destroy(&a->idle);
	pthread_cond_destroy(&a->work);
	pthread_mutex_destroy(&a->mu);
	free(a);
	return NULL;
}

bool ap_autotune_submit(ap_autotune *a, const Apollo__CompileRequest *req)
{
	size_t len = apollo__compile_request__get_packed_size(req);
	uint8_t *buf = malloc(len + 1);
	bool queued = false;

	if (!buf)
		return false;
	apollo__compile_request__pack(req, buf);
	pthread_mutex_lock(&a->mu);
	if (!a->stop && a->n < a->o.queue_max) {
		a->q[(a->head + a->n) % a->o.queue_max] = (struct job){ buf, len };
		a->n++;
		a->busy = true;
		queued = true;
		pthread_cond_signal(&a->work);
	}
	pthread_mutex_unlock(&a->mu);
	if (!queued) {
		free(buf);
		atomic_fetch_add(&a->dropped, 1);
	}
	return queued;
}

bool ap_autotune_wait_idle(ap_autotune *a, unsigned timeout_ms)
{
	struct timespec until;
	bool idle;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&a->mu);
	while ((a->n || a->busy) && pthread_cond_timedwait(&a->idle, &a->mu, &until) == 0)
		;
	idle = !a->n && !a->busy;
	pthread_mutex_unlock(&a->mu);
	return idle;
}

void ap_autotune_get_counters(const ap_autotune *a, ap_autotune_counters *out)
{
	ap_autotune *m = (ap_autotune *)a;

	memset(out, 0, sizeof(*out));
	if (!a)
		return;
	out->jobs = atomic_load(&m->jobs);
	out->dropped = atomic_load(&m->dropped);
	out->failed = atomic_load(&m->failed);
	out->compiled = atomic_load(&m->compiled);
	out->refined = atomic_load(&m->refined);
	out->moved = atomic_load(&m->moved);
	out->timed = atomic_load(&m->timed);
	out->measured = atomic_load(&m->measured);
}
